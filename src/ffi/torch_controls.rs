//! The calls the Python package makes on the process's PyTorch allocator besides the
//! allocator hooks: stats, trim, retention scopes, a stream's end.

use std::ffi::{c_char, c_int};
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::boundary::{boundary, c_buffer, copy_c_string};
use super::stream::stream_of;
use super::torch::allocator;
use super::types::{FlareStatus, FlareStream};

/// Copies the stats of `device` as a JSON object (UTF-8; see
/// `TorchAllocator::stats_json`: the tensor and mempool pools' snapshot counters by
/// name, each graph pool's, and `physical_bytes` over them all) into `buf`,
/// NUL-terminated and truncated to `len - 1` bytes, and returns its full length
/// (a return `>= len`: call again with a larger buffer). `buf` NULL or `len` 0:
/// only the length. A device never used: `{"device":N,...,"created":false}`. When the
/// allocator cannot be made (a bad `FLARE_TORCH_*` variable), the JSON is
/// `{"error": "..."}`. Thread-safe.
///
/// # Safety
/// `buf` is NULL or points to at least `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_stats(device: c_int, buf: *mut c_char, len: usize) -> usize {
    // SAFETY: `buf` is NULL or has `len` writable bytes, by the caller's contract.
    flare_torch_stats_inner(device, unsafe { c_buffer(buf, len) })
}

/// `flare_torch_stats` into the caller's buffer.
fn flare_torch_stats_inner(device: c_int, buf: Option<&mut [MaybeUninit<c_char>]>) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        let json = match allocator() {
            Ok(a) => a.stats_json(device),
            Err(e) => format!("{{\"error\":{:?}}}", e.to_string()),
        };
        copy_c_string(json.as_bytes(), buf)
    }))
    .unwrap_or(0)
}

/// Releases what `device`'s tensor and mempool pools hold idle now (`trim()` in
/// Python; `flare_torch_reset` does it for every device).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a device outside `0..64` or a bad
/// `FLARE_TORCH_*` variable; `FLARE_STATUS_SCOPE_STATE` while a retention scope is
/// open on the device; `FLARE_STATUS_DRIVER_ERROR` when a release step failed (kept
/// and retried later). Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_trim(device: c_int) -> FlareStatus {
    boundary("flare_torch_trim", || allocator()?.trim(device))
}

/// Opens a retention scope on `device`'s tensor pool (`retention()` in Python):
/// nothing freed is released until `flare_torch_retention_finish`.
///
/// Errors: `FLARE_STATUS_SCOPE_STATE` when one is open; `FLARE_STATUS_INVALID_ARGUMENT`
/// for a bad device or variable; `FLARE_STATUS_NO_DRIVER` without a driver.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_retention_begin(device: c_int) -> FlareStatus {
    boundary("flare_torch_retention_begin", || {
        allocator()?.retention_begin(device)
    })
}

/// Closes `device`'s retention scope (`abort` non-zero: counted as aborted) and
/// releases what is idle (one synchronize).
///
/// Errors: `FLARE_STATUS_SCOPE_STATE` with none open; `FLARE_STATUS_DRIVER_ERROR`
/// when a release step failed. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_retention_finish(device: c_int, abort: c_int) -> FlareStatus {
    boundary("flare_torch_retention_finish", || {
        allocator()?.retention_finish(device, abort != 0)
    })
}

/// Forgets everything the pools of every device keep under `stream`'s handle
/// (`forget_stream()` in Python): call it before destroying a stream that PyTorch
/// did not create (one wrapped by `torch.cuda.ExternalStream`), so that a stream
/// created later with the same handle value starts with no history (see
/// `flare_pool_forget_stream`). PyTorch's own streams come from per-device pools that
/// are never destroyed, and PyTorch has no allocator hook for a stream's end.
///
/// Errors (nothing changes): `FLARE_STATUS_INVALID_ARGUMENT` for NULL, 1 or 2 (the
/// default streams, never destroyed) or a bad `FLARE_TORCH_*` variable;
/// `FLARE_STATUS_STREAM_STATE` while `stream` is being captured. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_forget_stream(stream: FlareStream) -> FlareStatus {
    boundary("flare_torch_forget_stream", || {
        allocator()?.forget_stream(stream_of(stream))
    })
}
