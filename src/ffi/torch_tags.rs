//! Sleep and wake of a device's tensor pool for the Python package (issues 15 and 34:
//! `sleep()`, `wake(zero=...)`, `census()`), over `TorchAllocator::sleep`,
//! `TorchAllocator::wake` and `TorchAllocator::census_json`; and, for its tests on the
//! simulated backend, writing and reading device bytes as a kernel would. Every call
//! runs inside the panic boundary: a failure is a status and the thread's last error.

use std::ffi::{c_char, c_int, c_void};
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::boundary::{boundary, c_buffer, copy_c_string};
use super::stream::stream_of;
use super::torch::allocator;
use super::torch_sim::sim;
use super::types::{FlareSleepMode, FlareStatus, FlareStream, RawSleepMode};
use crate::driver::CuResult;
use crate::{Error, SleepMode};

/// The error for a simulated kernel's access to `[ptr, ptr + len)` that the driver
/// refused with `code` (only `CUDA_ERROR_INVALID_VALUE`: a byte not mapped with
/// access).
fn unmapped(ptr: *const c_void, len: usize, code: CuResult) -> Error {
    Error::InvalidArgument(format!(
        "[{:#x}, +{len} bytes): {code}: a byte of the range is not mapped with access",
        ptr as usize
    ))
}

/// Puts `device`'s tensor pool to sleep (`sleep()` in Python): the memory of every
/// tensor of the per-tensor allocator (`flare_torch_alloc`) on that device, graph
/// pools and the mempool pool aside. A device synchronize, then (`FLARE_SLEEP_OFFLOAD`)
/// the tensors' bytes copied to pinned host memory, then the physical memory released;
/// every tensor keeps its address. Until `flare_torch_wake`, allocating or freeing a
/// tensor of that pool fails.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a bad device, mode or `FLARE_TORCH_*`
/// variable; `FLARE_STATUS_TAG_STATE` when it already sleeps or the device was never
/// used; `FLARE_STATUS_SCOPE_STATE` inside a retention scope or during a capture;
/// `FLARE_STATUS_DRIVER_ERROR` when a step is refused (the pool awake, as
/// `flare_pool_sleep`). Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_sleep(device: c_int, mode: RawSleepMode) -> FlareStatus {
    boundary("flare_torch_sleep", || {
        let mode = match FlareSleepMode::parse(mode.0, "mode")? {
            FlareSleepMode::FLARE_SLEEP_DISCARD => SleepMode::Discard,
            FlareSleepMode::FLARE_SLEEP_OFFLOAD => SleepMode::Offload,
        };
        allocator()?.sleep(device, mode)
    })
}

/// Wakes `device`'s tensor pool (`wake()` in Python): every tensor's address is
/// mapped again, its bytes restored after an offload sleep. With `zero` non-zero, a
/// zeroing wake (`flare_pool_wake_zeroed`): after a discard sleep every tensor's
/// requested bytes are set to zero by memsets queued on `stream` (NULL: the legacy
/// stream), which later work on `stream` sees; `stream` is ignored when `zero` is 0.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a bad device or variable;
/// `FLARE_STATUS_TAG_STATE` when it does not sleep; otherwise as `flare_pool_wake` and
/// `flare_pool_wake_zeroed` (a refused memset: `FLARE_STATUS_DRIVER_ERROR` with the
/// pool awake). Thread-safe.
///
/// # Safety
/// `stream` is only passed to the driver, never dereferenced; on CUDA it must be a
/// live stream of the device (or NULL).
#[no_mangle]
pub unsafe extern "C" fn flare_torch_wake(
    device: c_int,
    zero: c_int,
    stream: FlareStream,
) -> FlareStatus {
    // No pointer is read: `stream` is only passed to the driver.
    flare_torch_wake_inner(device, zero, stream)
}

/// `flare_torch_wake`; `stream` is only passed to the driver.
fn flare_torch_wake_inner(device: c_int, zero: c_int, stream: FlareStream) -> FlareStatus {
    boundary("flare_torch_wake", || {
        let zero = (zero != 0).then(|| stream_of(stream));
        allocator()?.wake(device, zero)
    })
}

/// Copies the census of `device`'s tensor pool as a JSON object (`census()` in
/// Python; see `TorchAllocator::census_json`: `sleeping`, live, idle, physical and
/// offloaded bytes, `zeroed_bytes` and `zero_memsets`) into `buf`, NUL-terminated and
/// truncated to `len - 1` bytes, and returns its full length (as `flare_torch_stats`).
/// A device never used: `{"device":N,"created":false}`; a bad device or variable:
/// `{"error": "..."}`. Thread-safe.
///
/// # Safety
/// `buf` is NULL or points to at least `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_census(device: c_int, buf: *mut c_char, len: usize) -> usize {
    // SAFETY: `buf` is NULL or has `len` writable bytes, by the caller's contract.
    flare_torch_census_inner(device, unsafe { c_buffer(buf, len) })
}

/// `flare_torch_census` into the caller's buffer.
fn flare_torch_census_inner(device: c_int, buf: Option<&mut [MaybeUninit<c_char>]>) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        let json = match allocator() {
            Ok(a) => a.census_json(device),
            Err(e) => format!("{{\"error\":{:?}}}", e.to_string()),
        };
        copy_c_string(json.as_bytes(), buf)
    }))
    .unwrap_or(0)
}

/// Simulated backend only: writes the `len` bytes at host address `src` to device
/// address `ptr` of `device`, as a kernel would (not a driver call).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL `src` with `len` above 0 or a
/// range not mapped with access (nothing written); `FLARE_STATUS_NOT_SUPPORTED` on
/// the CUDA backend. Thread-safe.
///
/// # Safety
/// `src` is NULL or points to `len` readable bytes; `ptr` is a device address, never
/// dereferenced.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_sim_write(
    device: c_int,
    ptr: *const c_void,
    src: *const c_void,
    len: usize,
) -> FlareStatus {
    let bytes = match (src.is_null(), len) {
        (_, 0) => Some(&[][..]),
        (true, _) => None,
        // SAFETY: `src` is non-NULL and points to `len` readable bytes, by the
        // caller's contract; `u8` has alignment 1.
        (false, _) => Some(unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) }),
    };
    flare_torch_sim_write_inner(device, ptr, bytes)
}

/// `flare_torch_sim_write` of the caller's bytes (`None`: a NULL `src`).
fn flare_torch_sim_write_inner(
    device: c_int,
    ptr: *const c_void,
    bytes: Option<&[u8]>,
) -> FlareStatus {
    boundary("flare_torch_sim_write", || {
        let bytes = bytes.ok_or_else(|| Error::InvalidArgument("src is NULL".into()))?;
        match sim(device)?.write(ptr as usize as u64, bytes) {
            CuResult::SUCCESS => Ok(()),
            code => Err(unmapped(ptr, bytes.len(), code)),
        }
    })
}

/// Simulated backend only: reads `len` bytes at device address `ptr` of `device` into
/// host address `dst`, as a kernel would (not a driver call). New physical memory
/// reads as stale bytes (0xFF), not zeros: what a GPU may hand out.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL `dst` with `len` above 0 or a
/// range not mapped with access (nothing written to `dst`);
/// `FLARE_STATUS_NOT_SUPPORTED` on the CUDA backend. Thread-safe.
///
/// # Safety
/// `dst` is NULL or points to `len` writable bytes; `ptr` is a device address, never
/// dereferenced.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_sim_read(
    device: c_int,
    ptr: *const c_void,
    dst: *mut c_void,
    len: usize,
) -> FlareStatus {
    let out = match (dst.is_null(), len) {
        (_, 0) => Some(&mut [][..]),
        (true, _) => None,
        (false, _) => {
            let dst = dst.cast::<MaybeUninit<u8>>();
            // SAFETY: `dst` is non-NULL and points to `len` writable bytes, not
            // accessed otherwise during the call, by the caller's contract;
            // `MaybeUninit<u8>` has alignment 1 and no validity requirement.
            Some(unsafe { std::slice::from_raw_parts_mut(dst, len) })
        }
    };
    flare_torch_sim_read_inner(device, ptr, out)
}

/// `flare_torch_sim_read` into the caller's bytes (`None`: a NULL `dst`).
fn flare_torch_sim_read_inner(
    device: c_int,
    ptr: *const c_void,
    out: Option<&mut [MaybeUninit<u8>]>,
) -> FlareStatus {
    boundary("flare_torch_sim_read", || {
        let out = out.ok_or_else(|| Error::InvalidArgument("dst is NULL".into()))?;
        let bytes = match sim(device)?.read(ptr as usize as u64, out.len() as u64) {
            Ok(b) => b,
            Err(code) => return Err(unmapped(ptr, out.len(), code)),
        };
        for (to, from) in out.iter_mut().zip(bytes) {
            to.write(from);
        }
        Ok(())
    })
}
