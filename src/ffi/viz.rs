//! memory_viz snapshots and the history ring's frame from C (issue 38):
//! `flare_pool_dump_snapshot`, `flare_history_set_frame` and, for PyTorch's
//! allocator, `flare_torch_dump_snapshot`.

use std::ffi::{c_char, CStr};
use std::path::PathBuf;

use super::boundary::{boundary, null_error, pool_boundary};
use super::pool::FlarePool;
use super::torch::allocator;
use super::types::FlareStatus;
use crate::Error;

/// The caller's C string (`None`: NULL).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string not written during the call.
unsafe fn c_str<'a>(p: *const c_char) -> Option<&'a CStr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated, not written during the call, by the
    // caller's contract.
    Some(unsafe { CStr::from_ptr(p) })
}

/// A file path from a C string: its bytes (UTF-8 on Windows); NULL or empty is an
/// invalid argument naming `what`.
fn path_of(s: Option<&CStr>, what: &str) -> Result<PathBuf, Error> {
    let bytes = s.ok_or_else(|| null_error(what))?.to_bytes();
    if bytes.is_empty() {
        return Err(Error::InvalidArgument(format!("{what} is empty")));
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Ok(std::ffi::OsStr::from_bytes(bytes).into())
    }
    #[cfg(not(unix))]
    {
        std::str::from_utf8(bytes)
            .map(PathBuf::from)
            .map_err(|_| Error::InvalidArgument(format!("{what} is not UTF-8")))
    }
}

/// Writes the pool's memory_viz snapshot to the file `path` (created or truncated): a
/// pickle that PyTorch's memory_viz opens (`pytorch.org/memory_viz`, or
/// `torch.cuda._memory_viz`): the pool's mapped memory as segments tiled by blocks
/// (allocated or not, with requested sizes and tags) and, when
/// `FlarePoolConfig.history_events` is set, its recent events (`device_traces`:
/// alloc, free_requested, free_completed, segment_map, segment_unmap, oom). Format:
/// docs/c-guide.md, "memory_viz snapshots".
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL or empty argument;
/// `FLARE_STATUS_IO` when the file cannot be written (the message names it and the
/// reason); `FLARE_STATUS_INTERNAL` on a poisoned pool. The pool is unchanged.
/// Thread-safe: the segments are taken under the pool's lock, the events under the
/// ring's.
///
/// # Safety
/// `pool` is NULL or a live pool; `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_dump_snapshot(
    pool: *const FlarePool,
    path: *const c_char,
) -> FlareStatus {
    flare_pool_dump_snapshot_inner(
        // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
        unsafe { pool.as_ref() },
        // SAFETY: `path` is NULL or a NUL-terminated string, by the caller's contract.
        unsafe { c_str(path) },
    )
}

/// `flare_pool_dump_snapshot` on the caller's pool and path.
fn flare_pool_dump_snapshot_inner(pool: Option<&FlarePool>, path: Option<&CStr>) -> FlareStatus {
    pool_boundary("flare_pool_dump_snapshot", pool, |pool| {
        let path = path_of(path, "path")?;
        pool.pool.dump_snapshot(path)
    })
}

/// Sets the calling thread's frame: every history event this thread writes from now
/// on, in any pool (and in PyTorch's allocator), carries `frame` (memory_viz shows it
/// as the event's stack: `flare_package:0:FRAME`) until the next call; NULL clears
/// it. A short label of the caller's choosing (a phase, a layer, a request), copied.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a frame that is not UTF-8 (the frame
/// is left as it was). Thread-safe (the frame is the calling thread's).
///
/// # Safety
/// `frame` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn flare_history_set_frame(frame: *const c_char) -> FlareStatus {
    // SAFETY: `frame` is NULL or a NUL-terminated string, by the caller's contract.
    flare_history_set_frame_inner(unsafe { c_str(frame) })
}

/// `flare_history_set_frame` with the caller's string.
fn flare_history_set_frame_inner(frame: Option<&CStr>) -> FlareStatus {
    boundary("flare_history_set_frame", || {
        let frame = frame
            .map(|f| {
                f.to_str()
                    .map_err(|_| Error::InvalidArgument("frame is not UTF-8".into()))
            })
            .transpose()?;
        crate::pool::set_history_frame(frame);
        Ok(())
    })
}

/// Writes one memory_viz snapshot of PyTorch's allocator to the file `path` (created
/// or truncated; `flare_package.dump_snapshot(path)` in Python): every device made so
/// far, its tensor pool, its mempool pool and every graph pool (which PyTorch's own
/// snapshot does not show for a pluggable allocator), and with `FLARE_TORCH_HISTORY`
/// set, their recent events merged in order.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL or empty path or a bad
/// `FLARE_TORCH_*` variable; `FLARE_STATUS_IO` when the file cannot be written.
/// Thread-safe.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_dump_snapshot(path: *const c_char) -> FlareStatus {
    // SAFETY: `path` is NULL or a NUL-terminated string, by the caller's contract.
    flare_torch_dump_snapshot_inner(unsafe { c_str(path) })
}

/// `flare_torch_dump_snapshot` with the caller's path.
fn flare_torch_dump_snapshot_inner(path: Option<&CStr>) -> FlareStatus {
    boundary("flare_torch_dump_snapshot", || {
        let path = path_of(path, "path")?;
        allocator()?.dump_snapshot(&path)
    })
}
