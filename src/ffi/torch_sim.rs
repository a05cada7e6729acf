//! The simulated backend's controls for the PyTorch allocator's tests (streams, work,
//! captures, contract faults), as `flare_sim_*` are for a pool.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::Arc;

use super::boundary::{boundary, out_arg};
use super::sim::{create_stream_on, end_capture_on, handle, refused};
use super::torch::allocator;
use super::types::{FlareStatus, FlareStream};
use crate::driver::CaptureMode;
use crate::{Error, SimDriver};

/// The simulated driver of `device`.
pub(super) fn sim(device: c_int) -> Result<Arc<SimDriver>, Error> {
    allocator()?.sim_driver(device)
}

/// Simulated backend only: creates a non-blocking stream on `device` and writes its
/// handle to `*out_stream` (as `flare_sim_stream_create` does for a pool).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL `out_stream` or a bad device;
/// `FLARE_STATUS_NOT_SUPPORTED` on the CUDA backend. Thread-safe.
///
/// # Safety
/// `out_stream` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_sim_stream_create(
    device: c_int,
    out_stream: *mut FlareStream,
) -> FlareStatus {
    // SAFETY: `out_stream` is NULL or writable, by the caller's contract.
    flare_torch_sim_stream_create_inner(device, unsafe { out_arg(out_stream, "out_stream") })
}

/// `flare_torch_sim_stream_create` into the caller's output.
fn flare_torch_sim_stream_create_inner(
    device: c_int,
    out_stream: Result<&mut MaybeUninit<FlareStream>, Error>,
) -> FlareStatus {
    boundary("flare_torch_sim_stream_create", || {
        let out_stream = out_stream?;
        let stream = create_stream_on(&*sim(device)?, device, || ())?;
        out_stream.write(stream);
        Ok(())
    })
}

/// Simulated backend only: destroys `stream` of `device` (see
/// `flare_sim_stream_destroy`): the next `flare_torch_sim_stream_create` on the
/// device gets its handle again.
///
/// Errors: as `flare_torch_sim_launch` (a handle that is not a live stream, a stream
/// in an open capture). Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_sim_stream_destroy(
    device: c_int,
    stream: FlareStream,
) -> FlareStatus {
    boundary("flare_torch_sim_stream_destroy", || {
        let code = sim(device)?.stream_destroy(handle(stream));
        refused("cuStreamDestroy", stream, code)
    })
}

/// Simulated backend only: queues work on `stream` of `device` that touches
/// `[ptr, ptr + bytes)` until the stream completes (see `flare_sim_launch`).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` when the simulated driver refuses (a
/// range not mapped, a stream not of this device); `FLARE_STATUS_NOT_SUPPORTED` on
/// the CUDA backend. Thread-safe.
///
/// # Safety
/// `ptr` is a device address, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_sim_launch(
    device: c_int,
    stream: FlareStream,
    ptr: *const c_void,
    bytes: usize,
) -> FlareStatus {
    // No pointer is read: `ptr` is a device address, never dereferenced.
    flare_torch_sim_launch_inner(device, stream, ptr, bytes)
}

/// `flare_torch_sim_launch`; `ptr` is never dereferenced.
fn flare_torch_sim_launch_inner(
    device: c_int,
    stream: FlareStream,
    ptr: *const c_void,
    bytes: usize,
) -> FlareStatus {
    boundary("flare_torch_sim_launch", || {
        let code = sim(device)?.launch(handle(stream), ptr as usize as u64, bytes as u64);
        refused("cuLaunchKernel", stream, code)
    })
}

/// Simulated backend only: the device completes the work queued on `stream` (see
/// `flare_sim_stream_complete`).
///
/// Errors: as `flare_torch_sim_launch`. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_sim_stream_complete(
    device: c_int,
    stream: FlareStream,
) -> FlareStatus {
    boundary("flare_torch_sim_stream_complete", || {
        let code = sim(device)?.stream_complete(handle(stream));
        refused("stream completion", stream, code)
    })
}

/// Simulated backend only: begins capturing `stream` on the calling thread, global
/// mode (see `flare_sim_begin_capture`).
///
/// Errors: as `flare_torch_sim_launch`. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_sim_begin_capture(device: c_int, stream: FlareStream) -> FlareStatus {
    boundary("flare_torch_sim_begin_capture", || {
        let code = sim(device)?.stream_begin_capture(handle(stream), CaptureMode::Global);
        refused("cuStreamBeginCapture", stream, code)
    })
}

/// Simulated backend only: ends the capture of `stream` and writes 1 to
/// `*out_valid` when it ended valid, 0 when something invalidated it (see
/// `flare_sim_end_capture`).
///
/// Errors: as `flare_torch_sim_launch`, and a NULL `out_valid`. Thread-safe.
///
/// # Safety
/// `out_valid` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_sim_end_capture(
    device: c_int,
    stream: FlareStream,
    out_valid: *mut c_int,
) -> FlareStatus {
    // SAFETY: `out_valid` is NULL or writable, by the caller's contract.
    flare_torch_sim_end_capture_inner(device, stream, unsafe { out_arg(out_valid, "out_valid") })
}

/// `flare_torch_sim_end_capture` into the caller's output.
fn flare_torch_sim_end_capture_inner(
    device: c_int,
    stream: FlareStream,
    out_valid: Result<&mut MaybeUninit<c_int>, Error>,
) -> FlareStatus {
    boundary("flare_torch_sim_end_capture", || {
        let out_valid = out_valid?;
        let valid = end_capture_on(&*sim(device)?, stream, || ())?;
        out_valid.write(valid);
        Ok(())
    })
}

/// Simulated backend only: writes to `*out_faults` the contract faults `device`'s
/// simulated driver has seen (unmapping memory queued work touches, handing memory
/// to a stream while another's work still touches it, breaking a capture); a
/// correct allocator keeps it at 0.
///
/// Errors: as `flare_torch_sim_launch`, and a NULL `out_faults`. Thread-safe.
///
/// # Safety
/// `out_faults` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_sim_faults(
    device: c_int,
    out_faults: *mut u64,
) -> FlareStatus {
    // SAFETY: `out_faults` is NULL or writable, by the caller's contract.
    flare_torch_sim_faults_inner(device, unsafe { out_arg(out_faults, "out_faults") })
}

/// `flare_torch_sim_faults` into the caller's output.
fn flare_torch_sim_faults_inner(
    device: c_int,
    out_faults: Result<&mut MaybeUninit<u64>, Error>,
) -> FlareStatus {
    boundary("flare_torch_sim_faults", || {
        let out_faults = out_faults?;
        let faults = sim(device)?.contract_faults();
        out_faults.write(faults);
        Ok(())
    })
}
