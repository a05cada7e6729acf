//! Stream order (issue 11): allocate and free on a stream, and mark an allocation as
//! used by another stream, with the semantics of CUDA's stream-ordered allocator
//! (`cuMemAllocAsync` / `cuMemFreeAsync`) and PyTorch's caching allocator
//! (`recordStream`). No call here ever synchronizes the host with the device.

use std::ffi::c_void;
use std::mem::MaybeUninit;

use super::boundary::{out_arg, pool_boundary};
use super::pool::FlarePool;
use super::types::{FlareStatus, FlareStream};
use crate::driver::Stream;
use crate::Error;

/// The stream a C caller passed: the handle's value (NULL, 0, is the legacy stream).
pub(crate) fn stream_of(stream: FlareStream) -> Stream {
    Stream::from_raw(stream as usize)
}

/// The body of the stream-ordered allocations (`flare_package_allocate_async`,
/// `flare_package_allocate_tagged`): checks `out_ptr` (the caller's output or its
/// error, [`out_arg`]), allocates with `alloc` on `stream`, passes the injected-panic
/// point, and writes the address to `*out_ptr` (an address wider than a pointer,
/// impossible on CUDA's targets, is freed again and refused).
pub(crate) fn allocate_on_stream(
    pool: &FlarePool,
    stream: FlareStream,
    out_ptr: Result<&mut MaybeUninit<*mut c_void>, Error>,
    alloc: impl FnOnce(&crate::Pool, Stream) -> crate::Result<u64>,
) -> crate::Result<()> {
    let out_ptr = out_ptr?;
    let stream = stream_of(stream);
    let result = alloc(&pool.pool, stream);
    pool.injected_panic_point();
    let ptr = result?;
    let addr = match usize::try_from(ptr) {
        Ok(addr) => addr,
        Err(_) => {
            // Cannot happen on the 64-bit targets CUDA supports; give it back.
            let _ = pool.pool.free_async_raw(ptr, stream);
            return Err(Error::NotSupported("device address wider than a pointer"));
        }
    };
    out_ptr.write(addr as *mut c_void);
    Ok(())
}

/// Allocates `size` bytes of device memory for use on `stream`, stream-ordered (as
/// `cuMemAllocAsync`), and writes its device address (a `CUdeviceptr`, aligned to the
/// granularity; in `FLARE_REUSE_SEGMENTS`, a block's address, aligned to 512 bytes) to
/// `*out_ptr`. Work queued on `stream` from now on may use it; work on
/// another stream must be ordered after this point on `stream` (an event), or the
/// allocation marked with `flare_package_record_stream`.
///
/// The size is rounded up to the granularity (2 MiB on an H200); in
/// `FLARE_REUSE_SEGMENTS` (up to `segment_whole_threshold_bytes`), to 512 bytes, and
/// carved from `stream`'s own heap first (a heap per stream: blocks freed on `stream`
/// return to it at once), the rules below applying to blocks freed elsewhere. Which
/// idle memory it may take:
/// - memory whose last free (`flare_package_free_async`) was on `stream` is handed out
///   at once, even with work still queued on it: stream order runs that work before
///   anything queued after this call;
/// - memory freed on another stream T, under the pool's `cross_stream_reuse`:
///   `FLARE_CROSS_STREAM_WHEN_COMPLETE` (default) only once T's work up to that free
///   has completed (a fence event recorded on T, polled with `cuEventQuery`);
///   `FLARE_CROSS_STREAM_WAIT` at once, after making `stream` wait on that fence
///   (`cuStreamWaitEvent`); `FLARE_CROSS_STREAM_NEVER` not until a release point has
///   seen T's work complete;
/// - memory freed during a stream capture, only by allocations in the same capture
///   (after it, the memory is kept for the graph's replays: see
///   `flare_package_free_async`).
///
/// Otherwise a new mapping is created (create, reserve, map, set access; in segment
/// mode, the heap grows by a whole handle), which is
/// legal during a capture (VMM calls do not break one, measured on an H200,
/// `docs/vmm-semantics.md`). The reuse policy and the release threshold apply as for
/// `flare_package_allocate`. `stream` may be captured (`cuStreamGetCaptureInfo`); no
/// call made here breaks a capture, on this stream or any other: every event query
/// runs with the calling thread in relaxed capture mode
/// (`cuThreadExchangeStreamCaptureMode`, restored after), the rule measured on an H200
/// ("Events and stream queries while another stream is captured").
///
/// `stream` NULL: the legacy default stream.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool or `out_ptr`, or a size of
/// 0 (or one whose rounding overflows); `FLARE_STATUS_REQUEST_TOO_LARGE` when the
/// rounded size is more than the device's total memory; `FLARE_STATUS_OUT_OF_MEMORY`
/// when the device is full now (after waiting on the fences of memory freed on streams,
/// `cuEventSynchronize` on those events alone, and releasing it, outside a retention
/// scope); `FLARE_STATUS_DRIVER_ERROR` for another failed driver call (nothing leaked);
/// `FLARE_STATUS_TAG_STATE` while tag 0 sleeps or a sleep or wake of it runs (as
/// `flare_package_allocate`); `FLARE_STATUS_INTERNAL` on a poisoned pool. Nothing is
/// written on failure.
///
/// Ownership: the memory belongs to the pool; free it with `flare_package_free_async`
/// (or `flare_package_free`) on the same pool, or it is released by
/// `flare_pool_destroy`. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool; `out_ptr` is NULL or writable. `stream` is only
/// passed to the driver, never dereferenced; on a CUDA pool it must be a live stream
/// of the pool's device's context (or NULL), as for any CUDA call.
#[no_mangle]
pub unsafe extern "C" fn flare_package_allocate_async(
    pool: *mut FlarePool,
    size: usize,
    stream: FlareStream,
    out_ptr: *mut *mut c_void,
) -> FlareStatus {
    flare_package_allocate_async_inner(
        // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
        unsafe { pool.as_ref() },
        size,
        stream,
        // SAFETY: `out_ptr` is NULL or writable, by the caller's contract.
        unsafe { out_arg(out_ptr, "out_ptr") },
    )
}

/// `flare_package_allocate_async` on the caller's pool and output; `stream` is only
/// passed to the driver.
fn flare_package_allocate_async_inner(
    pool: Option<&FlarePool>,
    size: usize,
    stream: FlareStream,
    out_ptr: Result<&mut MaybeUninit<*mut c_void>, Error>,
) -> FlareStatus {
    pool_boundary("flare_package_allocate_async", pool, |pool| {
        allocate_on_stream(pool, stream, out_ptr, |p, s| {
            p.allocate_async_raw(size as u64, s)
        })
    })
}

/// Frees an allocation of this pool on `stream`, stream-ordered (as `cuMemFreeAsync`),
/// given the exact address an allocation returned.
///
/// The caller promises that every use of `ptr` is ordered before this point on
/// `stream`, or is on a stream given to `flare_package_record_stream`. No host
/// synchronization, ever, on this path: the call returns at once, work still queued
/// on `stream` included. `ptr` is reusable by allocations on `stream` at once
/// (`flare_package_allocate_async`), by other streams as `cross_stream_reuse` says.
/// It is released (unmap, release, free the reservation) only once a fence event
/// recorded on `stream`, and on each stream given to `flare_package_record_stream`, at
/// or after this free has completed: polled with `cuEventQuery` at release points, and
/// waited on with `cuEventSynchronize` on those events alone when the pool must
/// release now (out-of-memory retry, `flare_pool_trim`, `flare_retention_finish`,
/// `flare_pool_destroy`). Never `cuCtxSynchronize`, and no event on the legacy stream.
/// Inside a retention scope nothing is released; outside, the release threshold
/// applies as for `flare_package_free`. In `FLARE_REUSE_SEGMENTS` the block returns
/// to `stream`'s heap at once when it came from that heap (coalesced, reusable on
/// `stream`); what is released is a handle whose whole range is free, under the same
/// fences, its segment's reservation kept until destroy.
///
/// On a stream being captured: the free never synchronizes, never unmaps and records
/// nothing that breaks the capture. Memory freed during a capture is reused only by
/// later allocations in the same capture, and afterwards is kept (a graph may replay
/// into it) until the retention scope open when the capture began finishes or aborts,
/// or, with none open, until `flare_pool_trim` or `flare_pool_destroy`.
///
/// `ptr` NULL: `FLARE_STATUS_SUCCESS`, nothing happens (with a valid pool), as for
/// `flare_package_free`. `stream` NULL: the legacy default stream.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool;
/// `FLARE_STATUS_UNKNOWN_POINTER` for a pointer this pool did not hand out, an interior
/// pointer or a second free (nothing changes); `FLARE_STATUS_TAG_STATE` while the
/// allocation's tag sleeps or a sleep or wake of it runs (nothing changes, as for
/// `flare_package_free`); `FLARE_STATUS_INTERNAL` on a poisoned
/// pool. A stream or event call that fails is counted (`stream_call_failures`) and
/// its memory kept for a later release point: it does not fail the free. Thread-safe:
/// the free runs wholly before or wholly after each sleep and wake of its tag.
///
/// # Safety
/// `pool` is NULL or a live pool. `ptr` is only compared, never dereferenced;
/// `stream` only passed to the driver (see `flare_package_allocate_async`).
#[no_mangle]
pub unsafe extern "C" fn flare_package_free_async(
    pool: *mut FlarePool,
    ptr: *mut c_void,
    stream: FlareStream,
) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract; `ptr` is only
    // compared, `stream` only passed to the driver.
    flare_package_free_async_inner(unsafe { pool.as_ref() }, ptr, stream)
}

/// `flare_package_free_async` on the caller's pool.
fn flare_package_free_async_inner(
    pool: Option<&FlarePool>,
    ptr: *mut c_void,
    stream: FlareStream,
) -> FlareStatus {
    on_live_ptr("flare_package_free_async", pool, ptr, |pool, p| {
        pool.free_async_raw(p, stream_of(stream))
    })
}

/// Marks a live allocation as used by work on `stream` too, as PyTorch's
/// `Tensor.record_stream` does: its stream-ordered free (`flare_package_free_async`)
/// then also waits for `stream`'s work queued up to the free, before the memory is
/// reused (on any stream) or released. Call it before the free, for each other stream
/// that uses the allocation.
///
/// `ptr` NULL: `FLARE_STATUS_SUCCESS`, nothing happens (an empty tensor's storage has
/// no memory; PyTorch's `recordStream` ignores it too). `stream` NULL: the legacy
/// default stream.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool;
/// `FLARE_STATUS_UNKNOWN_POINTER` for a pointer that is not a live allocation of this
/// pool (interior, freed, another pool's; nothing changes); `FLARE_STATUS_TAG_STATE`
/// while its tag sleeps (its memory is unmapped); `FLARE_STATUS_INTERNAL` on a
/// poisoned pool. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool. `ptr` is only compared, never dereferenced;
/// `stream` only passed to the driver (see `flare_package_allocate_async`).
#[no_mangle]
pub unsafe extern "C" fn flare_package_record_stream(
    pool: *mut FlarePool,
    ptr: *mut c_void,
    stream: FlareStream,
) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract; `ptr` is only
    // compared, `stream` only passed to the driver.
    flare_package_record_stream_inner(unsafe { pool.as_ref() }, ptr, stream)
}

/// `flare_package_record_stream` on the caller's pool.
fn flare_package_record_stream_inner(
    pool: Option<&FlarePool>,
    ptr: *mut c_void,
    stream: FlareStream,
) -> FlareStatus {
    on_live_ptr("flare_package_record_stream", pool, ptr, |pool, p| {
        pool.record_stream(p, stream_of(stream))
    })
}

/// Forgets everything the pool keeps under `stream`'s handle. Call it before
/// destroying a stream (`cuStreamDestroy` / `cudaStreamDestroy`) that the pool has
/// seen: the driver may hand the same handle value to the next stream created, and
/// without this call the pool would take that new stream for the old one (RAPIDS
/// RMM issue 2251): hand it memory freed on the old stream at once while the old
/// stream's queued work may still use it, and make it wait on the old stream's
/// fences.
///
/// What the pool held for `stream` stays safe: one fence event is recorded on
/// `stream` now (`cuEventRecord`, after all its queued work; an event recorded before
/// `cuStreamDestroy` completes when that work has); memory freed on it, its segment
/// heap's free blocks, and memory freed elsewhere with `stream` given to
/// `flare_package_record_stream`, are reused by other streams or released once that
/// fence completes. No host synchronization. Live allocations made on `stream` stay
/// valid; a later free of one on a stream with the same handle acts as a free on a
/// new stream. Memory freed during a capture on `stream` stays with that capture.
///
/// Called after `cuStreamDestroy` instead (a misuse): no fence can be recorded, so
/// memory freed on the stream that no earlier fence covers is kept from every stream
/// and released only after a device synchronize (`flare_pool_trim`,
/// `flare_retention_finish`, `flare_pool_destroy`); and if a new stream got the handle
/// in between, the pool cannot tell it from the old one. Call it before.
///
/// A stream the pool never saw, or already forgot: `FLARE_STATUS_SUCCESS`, nothing
/// happens (no driver call). Otherwise one `cuStreamGetCaptureInfo` and at most one
/// `cuEventRecord`.
///
/// Errors (nothing changes): `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool, or
/// `stream` NULL, `CU_STREAM_LEGACY` (1) or `CU_STREAM_PER_THREAD` (2): the default
/// streams are never destroyed; `FLARE_STATUS_STREAM_STATE` while `stream` is being
/// captured (end the capture first); `FLARE_STATUS_INTERNAL` on a poisoned pool.
/// Thread-safe, but no other call may use `stream` meanwhile (it is being destroyed).
///
/// # Safety
/// `pool` is NULL or a live pool. `stream` is only passed to the driver, never
/// dereferenced; on a CUDA pool it must still be a live stream of the pool's
/// device's context.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_forget_stream(
    pool: *mut FlarePool,
    stream: FlareStream,
) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract; `stream` is
    // only passed to the driver.
    flare_pool_forget_stream_inner(unsafe { pool.as_ref() }, stream)
}

/// `flare_pool_forget_stream` on the caller's pool.
fn flare_pool_forget_stream_inner(pool: Option<&FlarePool>, stream: FlareStream) -> FlareStatus {
    pool_boundary("flare_pool_forget_stream", pool, |pool| {
        let result = pool.pool.forget_stream(stream_of(stream));
        pool.injected_panic_point();
        result
    })
}

/// The body of the functions that take a pool and an allocation's address: `f` on
/// the pool and the address inside the panic boundary; a NULL `ptr` is
/// `FLARE_STATUS_SUCCESS` and nothing happens.
fn on_live_ptr(
    name: &'static str,
    pool: Option<&FlarePool>,
    ptr: *mut c_void,
    f: impl FnOnce(&crate::Pool, u64) -> crate::Result<()>,
) -> FlareStatus {
    pool_boundary(name, pool, |pool| {
        if ptr.is_null() {
            return Ok(());
        }
        let result = f(&pool.pool, ptr as usize as u64);
        pool.injected_panic_point();
        result
    })
}
