//! The C ABI of tags (issue 15): tagged allocation, sleep, wake and the census.

use std::ffi::c_void;
use std::mem::MaybeUninit;

use super::boundary::{out_arg, pool_boundary};
use super::pool::FlarePool;
use super::stream::{allocate_on_stream, stream_of};
use super::types::{
    FlareSleepMode, FlareStatus, FlareStream, FlareTagCensus, RawSleepMode, VersionedOut,
};
use crate::{Error, SleepMode};

/// Allocates `size` bytes for tag `tag`, stream-ordered on `stream` (as
/// `flare_package_allocate_async`; NULL is the legacy stream), and writes its device
/// address to `*out_ptr`. Tag 0 is exactly `flare_package_allocate_async`. A tag
/// other than 0 holds memory of its own, so that its handles hold no other tag's
/// memory: a whole mapping (the size rounded up to the granularity), or in
/// `FLARE_REUSE_SEGMENTS` (up to `segment_whole_threshold_bytes`) a block (the size
/// rounded up to 512 bytes) of the tag's own heap. Its memory is counted by
/// `flare_pool_tag_census` and put to sleep by `flare_pool_sleep`. Free it with
/// `flare_package_free` or `flare_package_free_async` (a whole mapping freed on a
/// stream becomes the pool's shared idle memory, tag 0's; a block stays the tag's).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` as `flare_package_allocate_async` (checked
/// first); `FLARE_STATUS_TAG_STATE` while the tag sleeps or a `flare_pool_sleep` /
/// `flare_pool_wake` of it runs on another thread (nothing changes); otherwise as
/// `flare_package_allocate_async`. Nothing is written on failure. Thread-safe: the
/// allocation runs wholly before (and then sleeps with the tag) or wholly after each
/// sleep and wake of its tag. A whole mapping of a tag other than 0 passes through
/// tag 0's books, so it waits for a sleep or wake of tag 0 that runs to end.
///
/// # Safety
/// `pool` is NULL or a live pool; `out_ptr` is NULL or writable; `stream` as for
/// `flare_package_allocate_async`.
#[no_mangle]
pub unsafe extern "C" fn flare_package_allocate_tagged(
    pool: *mut FlarePool,
    size: usize,
    stream: FlareStream,
    tag: u32,
    out_ptr: *mut *mut c_void,
) -> FlareStatus {
    flare_package_allocate_tagged_inner(
        // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
        unsafe { pool.as_ref() },
        size,
        stream,
        tag,
        // SAFETY: `out_ptr` is NULL or writable, by the caller's contract.
        unsafe { out_arg(out_ptr, "out_ptr") },
    )
}

/// `flare_package_allocate_tagged` on the caller's pool and output; `stream` is only
/// passed to the driver.
fn flare_package_allocate_tagged_inner(
    pool: Option<&FlarePool>,
    size: usize,
    stream: FlareStream,
    tag: u32,
    out_ptr: Result<&mut MaybeUninit<*mut c_void>, Error>,
) -> FlareStatus {
    pool_boundary("flare_package_allocate_tagged", pool, |pool| {
        allocate_on_stream(pool, stream, out_ptr, |p, s| {
            p.allocate_tagged_raw(size as u64, Some(s), tag)
        })
    })
}

/// Puts tag `tag` to sleep: waits for the device's work (a synchronize of every
/// device with access), copies each live allocation's bytes to pinned host memory
/// (`FLARE_SLEEP_OFFLOAD`), then unmaps and releases every physical handle the tag
/// holds, live and idle, keeping every address reservation: the tag's pointers stay
/// reserved and become valid again at `flare_pool_wake`. The driver's free memory
/// rises by the tag's physical bytes. Any tag may sleep, tag 0 (the untagged
/// functions') included; in `FLARE_REUSE_SEGMENTS` each tag's blocks live in handles
/// of its own, and offload copies its live blocks only. Allocating or freeing with
/// the tag is refused until then; other tags are untouched.
///
/// Threads: the sleep first waits for the calls on the tag's memory in flight on
/// other threads (refusing new ones with `FLARE_STATUS_TAG_STATE` from then on), so
/// each of them runs wholly before or wholly after it: a free of the tag's pointer
/// racing the sleep either ran first or is refused (the allocation then sleeps; free
/// it after the wake).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool or a mode that is not a
/// `FlareSleepMode`; `FLARE_STATUS_SCOPE_STATE` inside a retention scope or while one
/// of the pool's streams is captured, or any blocking stream of the context (a
/// non-blocking stream the pool has never seen cannot be detected: do not sleep while
/// capturing); `FLARE_STATUS_TAG_STATE` when the tag already sleeps or a sleep or
/// wake of it runs on another thread (or, in `FLARE_REUSE_SEGMENTS`, while a trim or
/// an out-of-memory retry on another thread releases its segments' memory, or their
/// blocks wait on stream work: trim, then sleep again); nothing changes then; `FLARE_STATUS_DRIVER_ERROR` when a step is refused: the tag is then awake
/// and usable, its contents intact (see the Rust `Pool::sleep` for the exceptions:
/// an undo refused as well).
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_sleep(
    pool: *mut FlarePool,
    tag: u32,
    mode: RawSleepMode,
) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_pool_sleep_inner(unsafe { pool.as_ref() }, tag, mode)
}

/// `flare_pool_sleep` on the caller's pool.
fn flare_pool_sleep_inner(pool: Option<&FlarePool>, tag: u32, mode: RawSleepMode) -> FlareStatus {
    pool_boundary("flare_pool_sleep", pool, |pool| {
        let mode = match FlareSleepMode::parse(mode.0, "mode")? {
            FlareSleepMode::FLARE_SLEEP_DISCARD => SleepMode::Discard,
            FlareSleepMode::FLARE_SLEEP_OFFLOAD => SleepMode::Offload,
        };
        let result = pool.pool.sleep(tag, mode);
        pool.injected_panic_point();
        result
    })
}

/// Wakes tag `tag`: new handles mapped at the same addresses with the same access,
/// offloaded bytes copied back (the pinned host buffer kept for the next offload sleep
/// of the same size, which then pins nothing; `flare_pool_trim` frees it). Every
/// pointer of the tag
/// is valid again: same bytes (`FLARE_SLEEP_OFFLOAD`) or unspecified contents
/// (`FLARE_SLEEP_DISCARD`).
///
/// Threads: as `flare_pool_sleep`, the wake refuses the tag's calls until it returns,
/// so a free or allocation of the tag racing it is refused or runs after it.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for NULL; `FLARE_STATUS_TAG_STATE` when the
/// tag does not sleep, or a sleep or wake of it runs on another thread (nothing
/// changes); `FLARE_STATUS_OUT_OF_MEMORY` when the device is full and
/// `FLARE_STATUS_DRIVER_ERROR` for another refused step: what this wake mapped is
/// undone, the tag stays asleep with nothing lost, and a later wake can succeed.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_wake(pool: *mut FlarePool, tag: u32) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_pool_wake_inner(unsafe { pool.as_ref() }, tag)
}

/// `flare_pool_wake` on the caller's pool.
fn flare_pool_wake_inner(pool: Option<&FlarePool>, tag: u32) -> FlareStatus {
    pool_boundary("flare_pool_wake", pool, |pool| {
        let result = pool.pool.wake(tag);
        pool.injected_panic_point();
        result
    })
}

/// Wakes tag `tag` as `flare_pool_wake` does and, when it slept in
/// `FLARE_SLEEP_DISCARD`, sets to zero the requested bytes of each of its live
/// allocations (whole mappings and blocks; not the free space of its heaps), one
/// `cuMemsetD8Async` each, queued on `stream` (NULL: the legacy default stream): the
/// caller's later work on `stream` reads zeros (work on another stream must wait for
/// `stream` first). Returns once they are queued. A wake from `FLARE_SLEEP_OFFLOAD`
/// restores the bytes and zeroes nothing. `flare_pool_tag_census` counts what was
/// zeroed (`zeroed_bytes`, `zero_memsets`). Why: new physical memory holds whatever
/// an earlier owner left there (vLLM PR 45542: a KV cache woken from a discard sleep
/// held stale bytes, and NaNs followed).
///
/// Errors, with nothing done (the tag as it was): `FLARE_STATUS_INVALID_ARGUMENT` for
/// a NULL pool; `FLARE_STATUS_SCOPE_STATE` while `stream` is being captured (the
/// memsets would only run with the graph), or for the legacy stream while a blocking
/// stream is captured; `FLARE_STATUS_DRIVER_ERROR` when the stream's capture query is
/// refused (not a live stream of the device); `FLARE_STATUS_NOT_SUPPORTED` on a
/// backend without streams; then as `flare_pool_wake` (`FLARE_STATUS_TAG_STATE`
/// when the tag does not sleep; out of memory or a refused step: the tag stays
/// asleep). `FLARE_STATUS_DRIVER_ERROR` with the message naming `cuMemsetD8Async`
/// when the driver refuses a memset: the wake itself succeeded, so the tag is
/// **awake** and usable (`flare_pool_tag_census` says `sleeping` 0), but its bytes are
/// not guaranteed zero.
///
/// # Safety
/// `pool` is NULL or a live pool. `stream` is only passed to the driver, never
/// dereferenced; on a CUDA pool it must be a live stream of the pool's device's
/// context (or NULL), as for any CUDA call.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_wake_zeroed(
    pool: *mut FlarePool,
    tag: u32,
    stream: FlareStream,
) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_pool_wake_zeroed_inner(unsafe { pool.as_ref() }, tag, stream)
}

/// `flare_pool_wake_zeroed` on the caller's pool; `stream` is only passed to the
/// driver.
fn flare_pool_wake_zeroed_inner(
    pool: Option<&FlarePool>,
    tag: u32,
    stream: FlareStream,
) -> FlareStatus {
    pool_boundary("flare_pool_wake_zeroed", pool, |pool| {
        let result = pool.pool.wake_zeroed(tag, stream_of(stream));
        pool.injected_panic_point();
        result
    })
}

/// Writes what tag `tag` holds to `*out` (its live allocations, idle, physical and
/// offloaded bytes, whether it sleeps, what its zeroing wakes zeroed): exact, and
/// cheap (no walk over allocations).
/// A tag never used reads all zeros.
///
/// Versioning: the caller sets `out->struct_size` to `sizeof(FlareTagCensus)`; only
/// the fields lying wholly inside it are written.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for NULL or a bad `struct_size`.
///
/// # Safety
/// `pool` is NULL or a live pool; `out` is NULL or points to at least
/// `out->struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_tag_census(
    pool: *const FlarePool,
    tag: u32,
    out: *mut FlareTagCensus,
) -> FlareStatus {
    flare_pool_tag_census_inner(
        // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
        unsafe { pool.as_ref() },
        tag,
        // SAFETY: `out` is NULL or a caller's census of at least `struct_size`
        // writable bytes, by the caller's contract.
        unsafe { VersionedOut::new(out) },
    )
}

/// `flare_pool_tag_census` on the caller's pool and census.
fn flare_pool_tag_census_inner(
    pool: Option<&FlarePool>,
    tag: u32,
    out: VersionedOut<'_, FlareTagCensus>,
) -> FlareStatus {
    pool_boundary("flare_pool_tag_census", pool, |pool| {
        let out = out.check("out", "tag census")?;
        let census = FlareTagCensus::from_census(&pool.pool.tag_census(tag));
        pool.injected_panic_point();
        out.write(&census);
        Ok(())
    })
}
