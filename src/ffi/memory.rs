//! The calls on a live pool: allocate and free, the retention scope (begin, finish,
//! abort), trim, and the snapshot of its counters.

use std::ffi::c_void;
use std::mem::MaybeUninit;

use super::boundary::{out_arg, pool_boundary};
use super::pool::FlarePool;
use super::types::{FlareSnapshot, FlareStatus, VersionedOut};
use crate::pool::Pool;
use crate::Error;

/// A call on `pool` with no output: `op`, then the panic `flare_sim_inject_panic` may
/// have asked for, in [`pool_boundary`].
fn pool_call(
    name: &'static str,
    pool: Option<&FlarePool>,
    op: impl FnOnce(&Pool) -> Result<(), Error>,
) -> FlareStatus {
    pool_boundary(name, pool, |pool| {
        let result = op(&pool.pool);
        pool.injected_panic_point();
        result
    })
}

/// Allocates `size` bytes of device memory and writes its device address
/// (a `CUdeviceptr`, aligned to the granularity; in `FLARE_REUSE_SEGMENTS`, a block's
/// address, aligned to 512 bytes) to `*out_ptr`.
///
/// The size is rounded up to the granularity (2 MiB on an H200). An idle mapping that
/// fits under the reuse policy is taken with no driver call; otherwise a new mapping is
/// created (create, reserve, map, set access). In `FLARE_REUSE_SEGMENTS` (up to
/// `segment_whole_threshold_bytes`) the size is rounded up to 512 bytes instead and
/// carved from the free space of the synchronous API's heap (requests up to 1 MiB and
/// larger ones in segments of their own) with no driver call; otherwise the heap
/// grows by whole handles mapped at the end of its segment (create, map, set access;
/// a reserve only for a new segment).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL argument or a size of 0 (or one
/// whose rounding overflows); `FLARE_STATUS_REQUEST_TOO_LARGE` when the rounded size
/// is more than the device's total memory (refused at once, nothing counted);
/// `FLARE_STATUS_OUT_OF_MEMORY` when the device is full now;
/// `FLARE_STATUS_DRIVER_ERROR` for another failed driver call (nothing leaked; the
/// pool stays usable); `FLARE_STATUS_TAG_STATE` while tag 0 (the untagged functions'
/// tag) sleeps or a `flare_pool_sleep` / `flare_pool_wake` of it runs on another
/// thread (nothing done); `FLARE_STATUS_INTERNAL` on a poisoned pool.
///
/// Ownership: the memory belongs to the pool; free it with `flare_package_free` on
/// the same pool, or it is released by `flare_pool_destroy`. Thread-safe: an
/// allocation runs wholly before or wholly after each sleep and wake of its tag.
///
/// # Safety
/// `pool` is NULL or a live pool; `out_ptr` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn flare_package_allocate(
    pool: *mut FlarePool,
    size: usize,
    out_ptr: *mut *mut c_void,
) -> FlareStatus {
    flare_package_allocate_inner(
        // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
        unsafe { pool.as_ref() },
        size,
        // SAFETY: `out_ptr` is NULL or writable, by the caller's contract.
        unsafe { out_arg(out_ptr, "out_ptr") },
    )
}

/// `flare_package_allocate` on the caller's pool and output (checked in the pool's
/// boundary).
fn flare_package_allocate_inner(
    pool: Option<&FlarePool>,
    size: usize,
    out_ptr: Result<&mut MaybeUninit<*mut c_void>, Error>,
) -> FlareStatus {
    pool_boundary("flare_package_allocate", pool, |pool| {
        let out_ptr = out_ptr?;
        let result = pool.pool.allocate_raw(size as u64);
        pool.injected_panic_point();
        let ptr = result?;
        let addr = match usize::try_from(ptr) {
            Ok(addr) => addr,
            Err(_) => {
                // Cannot happen on the 64-bit targets CUDA supports; give it back.
                let _ = pool.pool.free_raw(ptr);
                return Err(Error::NotSupported("device address wider than a pointer"));
            }
        };
        out_ptr.write(addr as *mut c_void);
        Ok(())
    })
}

/// Frees an allocation of this pool, given the exact address `flare_package_allocate`
/// returned. Inside a retention scope the mapping is retained idle; outside, it is
/// cached up to the release threshold, else released. A release step the driver
/// refuses is kept, counted in the snapshot and retried later: it does not fail the
/// free. In `FLARE_REUSE_SEGMENTS` a block returns to its heap, coalesced with its
/// free neighbours; outside a scope, a handle whose whole range is then free is
/// released under the same threshold (unmapped and released; its segment's address
/// reservation is kept until `flare_pool_destroy`, for the heap to regrow into).
///
/// `ptr` NULL: `FLARE_STATUS_SUCCESS`, nothing happens (with a valid pool).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool;
/// `FLARE_STATUS_UNKNOWN_POINTER` for a pointer this pool did not hand out, an interior
/// pointer or a second free (nothing changes); `FLARE_STATUS_TAG_STATE` while the
/// allocation's tag (0 for `flare_package_allocate`'s memory) sleeps, or a
/// `flare_pool_sleep` / `flare_pool_wake` of it runs on another thread (nothing
/// changes: free it after the wake). Thread-safe: the free runs wholly before or
/// wholly after each sleep and wake of its tag (so a free racing the sleep of its
/// tag either ran first or is refused, and the allocation sleeps).
///
/// # Safety
/// `pool` is NULL or a live pool. `ptr` is only compared, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn flare_package_free(pool: *mut FlarePool, ptr: *mut c_void) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract; `ptr` is only
    // compared.
    flare_package_free_inner(unsafe { pool.as_ref() }, ptr)
}

/// `flare_package_free` on the caller's pool; `ptr` is never dereferenced.
fn flare_package_free_inner(pool: Option<&FlarePool>, ptr: *mut c_void) -> FlareStatus {
    pool_boundary("flare_package_free", pool, |pool| {
        if ptr.is_null() {
            return Ok(());
        }
        let result = pool.pool.free_raw(ptr as usize as u64);
        pool.injected_panic_point();
        result
    })
}

/// Opens the pool's retention scope: until it closes, freed mappings are retained
/// idle (reusable) and nothing is released, so no unmap races queued or captured
/// work. Open it around warmup and CUDA-graph capture. Scopes do not nest.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for NULL; `FLARE_STATUS_SCOPE_STATE` when
/// a scope is already open. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_retention_begin(pool: *mut FlarePool) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_retention_begin_inner(unsafe { pool.as_ref() })
}

/// `flare_retention_begin` on the caller's pool.
fn flare_retention_begin_inner(pool: Option<&FlarePool>) -> FlareStatus {
    pool_call("flare_retention_begin", pool, Pool::retention_begin)
}

/// Closes the retention scope and releases every idle mapping (one synchronize, then
/// unmap, release and free each), and in `FLARE_REUSE_SEGMENTS` every handle whose
/// whole range is free (the segments' reservations are kept until destroy). Live
/// allocations stay live.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for NULL; `FLARE_STATUS_SCOPE_STATE` with no
/// scope open; `FLARE_STATUS_DRIVER_ERROR` with the first release step the driver
/// refused (the scope is closed all the same; what was refused is kept and retried at
/// the next release point). Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_retention_finish(pool: *mut FlarePool) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_retention_finish_inner(unsafe { pool.as_ref() })
}

/// `flare_retention_finish` on the caller's pool.
fn flare_retention_finish_inner(pool: Option<&FlarePool>) -> FlareStatus {
    pool_call("flare_retention_finish", pool, Pool::retention_finish)
}

/// Closes the retention scope as failed (a warmup or capture that went wrong): the
/// same release as `flare_retention_finish`, counted in `scopes_aborted`.
///
/// Errors: as `flare_retention_finish`. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_retention_abort(pool: *mut FlarePool) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_retention_abort_inner(unsafe { pool.as_ref() })
}

/// `flare_retention_abort` on the caller's pool.
fn flare_retention_abort_inner(pool: Option<&FlarePool>) -> FlareStatus {
    pool_call("flare_retention_abort", pool, Pool::retention_abort)
}

/// Releases every idle (cached) mapping now, in `FLARE_REUSE_SEGMENTS` every handle
/// whose whole range is free too (the segments' reservations are kept until destroy),
/// and retries pending releases; frees the pinned host buffer a wake kept for the
/// next offload sleep (`flare_pool_wake`).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for NULL; `FLARE_STATUS_SCOPE_STATE` inside
/// a retention scope; `FLARE_STATUS_DRIVER_ERROR` with the first step the driver
/// refused (kept and retried at the next release point). Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_trim(pool: *mut FlarePool) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_pool_trim_inner(unsafe { pool.as_ref() })
}

/// `flare_pool_trim` on the caller's pool.
fn flare_pool_trim_inner(pool: Option<&FlarePool>) -> FlareStatus {
    pool_call("flare_pool_trim", pool, Pool::trim)
}

/// Writes what this pool recorded so far (`FlarePoolConfig::record_path`) to its file
/// and waits for the write; destroy does it too. Does nothing for a pool that does
/// not record. A write error is kept (`flare_pool_record_error`), never returned.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for NULL. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_record_flush(pool: *const FlarePool) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_pool_record_flush_inner(unsafe { pool.as_ref() })
}

/// `flare_pool_record_flush` on the caller's pool.
fn flare_pool_record_flush_inner(pool: Option<&FlarePool>) -> FlareStatus {
    pool_call("flare_pool_record_flush", pool, |p| {
        p.record_flush();
        Ok(())
    })
}

/// Copies the first error of this pool's recording (the file could not be created,
/// or a write failed, e.g. a full disk; UTF-8) into `buf` as a NUL-terminated string
/// truncated to `len - 1` bytes, and returns its full length in bytes without the
/// NUL (a return `>= len`: call again with a larger buffer). Returns 0, and writes
/// the empty string (a NUL in `buf[0]`), while the recording works, for a pool that
/// does not record, and for a NULL pool. After an error the recording has stopped
/// (the file holds what was written before it); no pool call ever failed for it.
/// `buf` NULL or `len` 0: only the length, nothing written.
/// Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool; `buf` is NULL or points to at least `len` writable
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_record_error(
    pool: *const FlarePool,
    buf: *mut std::ffi::c_char,
    len: usize,
) -> usize {
    // SAFETY: `pool` is NULL or a live pool; `buf` is NULL or has `len` writable
    // bytes, by the caller's contract.
    flare_pool_record_error_inner(unsafe { pool.as_ref() }, unsafe {
        super::boundary::c_buffer(buf, len)
    })
}

/// `flare_pool_record_error` on the caller's pool and buffer.
fn flare_pool_record_error_inner(
    pool: Option<&FlarePool>,
    buf: Option<&mut [MaybeUninit<std::ffi::c_char>]>,
) -> usize {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // No error: the empty string (`buf` is a C string after every call).
        let error = pool.and_then(|p| p.pool.record_error()).unwrap_or_default();
        super::boundary::copy_c_string(error.as_bytes(), buf)
    }))
    .unwrap_or(0)
}

/// Writes a consistent copy of the pool's counters to `*out`. The caller sets
/// `out->struct_size` first (`sizeof(FlareSnapshot)`); only fields lying wholly
/// inside it are written.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL argument or a bad
/// `struct_size` (nothing written). Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool; `out` is NULL or points to at least
/// `out->struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_snapshot(
    pool: *const FlarePool,
    out: *mut FlareSnapshot,
) -> FlareStatus {
    flare_pool_snapshot_inner(
        // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
        unsafe { pool.as_ref() },
        // SAFETY: `out` is NULL or a caller's snapshot of at least `struct_size`
        // writable bytes, by the caller's contract.
        unsafe { VersionedOut::new(out) },
    )
}

/// `flare_pool_snapshot` on the caller's pool and snapshot.
fn flare_pool_snapshot_inner(
    pool: Option<&FlarePool>,
    out: VersionedOut<'_, FlareSnapshot>,
) -> FlareStatus {
    pool_boundary("flare_pool_snapshot", pool, |pool| {
        let out = out.check("out", "snapshot")?;
        let snap = FlareSnapshot::from_snapshot(&pool.pool.snapshot());
        pool.injected_panic_point();
        out.write(&snap);
        Ok(())
    })
}
