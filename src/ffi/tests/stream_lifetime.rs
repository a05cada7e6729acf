//! A stream's end through the C ABI (issue 34, item 6): `flare_pool_forget_stream`
//! before `flare_sim_stream_destroy`, and each documented status of both. Expected
//! values come from the functions' contracts (the header's comments) and the
//! simulated driver's defaults (2 MiB granularity).

use std::ffi::c_void;
use std::mem::size_of;
use std::ptr;

use super::{config, destroy_report, last_error};
use crate::ffi::*;

/// The simulated driver's default granularity.
const G: usize = 2 << 20;

#[track_caller]
fn status_is(status: FlareStatus, want: FlareStatus, detail: &str) {
    assert_eq!(status, want, "{}", last_error());
    if want != FlareStatus::FLARE_STATUS_SUCCESS {
        let message = last_error();
        assert!(message.contains(detail), "{message:?} lacks {detail:?}");
    }
}

#[track_caller]
fn ok(status: FlareStatus) {
    status_is(status, FlareStatus::FLARE_STATUS_SUCCESS, "");
}

fn create() -> *mut FlarePool {
    let mut pool = ptr::null_mut();
    // SAFETY: the config is whole, `pool` writable.
    ok(unsafe { flare_pool_create(&config(), &mut pool) });
    pool
}

fn snap(pool: *const FlarePool) -> FlareSnapshot {
    let mut s = FlareSnapshot {
        struct_size: size_of::<FlareSnapshot>() as u32,
        ..FlareSnapshot::default()
    };
    // SAFETY: `pool` is live; `s` is a whole FlareSnapshot.
    ok(unsafe { flare_pool_snapshot(pool, &mut s) });
    s
}

fn new_stream(pool: *mut FlarePool) -> FlareStream {
    let mut s = ptr::null_mut();
    // SAFETY: `pool` is live; `s` is writable.
    ok(unsafe { flare_sim_stream_create(pool, &mut s) });
    s
}

fn alloc_on(pool: *mut FlarePool, stream: FlareStream) -> *mut c_void {
    let mut p = ptr::null_mut();
    // SAFETY: `pool` is live; `p` is writable.
    ok(unsafe { flare_package_allocate_async(pool, G, stream, &mut p) });
    p
}

/// The whole sequence in C: memory freed on S while a kernel on S still uses it; S
/// forgotten, destroyed; the next stream gets S's handle and does not get that
/// memory (a new mapping); the simulated driver saw no fault; once the old work is
/// done (a device synchronize through trim) everything is released and the destroy
/// report is clean.
#[test]
fn forget_then_destroy_gives_the_reused_handle_a_clean_start() {
    let pool = create();
    let s = new_stream(pool);
    let p = alloc_on(pool, s);
    // SAFETY: `pool` is live; the pointers are the pool's or the stream's.
    unsafe {
        ok(flare_sim_launch(pool, s, p, G));
        ok(flare_package_free_async(pool, p, s));
        ok(flare_pool_forget_stream(pool, s));
        ok(flare_sim_stream_destroy(pool, s));
    }
    let t = new_stream(pool);
    assert_eq!(
        t, s,
        "the simulated driver hands out the destroyed handle again"
    );
    let q = alloc_on(pool, t);
    assert_ne!(q, p, "the old stream's kernel still uses p");
    let sn = snap(pool);
    // p idle waiting on the forget's fence, q live: two mappings.
    assert_eq!(
        (sn.physical_bytes, sn.idle_bytes, sn.event_wait_bytes),
        (2 * G as u64, G as u64, G as u64)
    );
    // SAFETY: as above.
    unsafe {
        ok(flare_package_free_async(pool, q, t));
        ok(flare_pool_trim(pool));
    }
    let mut faults = u64::MAX;
    // SAFETY: `pool` is live; `faults` writable.
    ok(unsafe { flare_sim_faults(pool, &mut faults) });
    assert_eq!(faults, 0);
    assert_eq!(snap(pool).physical_bytes, 0);
    let (st, report) = destroy_report(pool);
    ok(st);
    assert_eq!((report.live_count, report.physical_bytes), (0, 0));
}

/// Each documented status: NULL pool, the default streams (NULL, 1, 2), a capturing
/// stream (nothing changes: the stream's memory still serves it at once), an unknown
/// stream and a second forget (success, nothing happens); `flare_sim_stream_destroy`
/// of NULL, of a stream already destroyed, of a capturing stream.
#[test]
fn forget_stream_statuses() {
    let invalid = FlareStatus::FLARE_STATUS_INVALID_ARGUMENT;
    // SAFETY: a NULL pool is refused before anything is read.
    status_is(
        unsafe { flare_pool_forget_stream(ptr::null_mut(), 0x1234 as FlareStream) },
        invalid,
        "flare_pool_forget_stream: invalid argument: pool is NULL",
    );
    let pool = create();
    for default in [0usize, 1, 2] {
        // SAFETY: `pool` is live.
        status_is(
            unsafe { flare_pool_forget_stream(pool, default as FlareStream) },
            invalid,
            "a default stream, never destroyed",
        );
    }
    // A handle the pool never saw (not even a stream): nothing to forget.
    // SAFETY: `pool` is live.
    ok(unsafe { flare_pool_forget_stream(pool, 0xdead as FlareStream) });
    let s = new_stream(pool);
    let p = alloc_on(pool, s);
    // SAFETY: `pool` is live; `p` is its allocation.
    unsafe {
        ok(flare_package_free_async(pool, p, s));
        ok(flare_sim_begin_capture(pool, s));
        status_is(
            flare_pool_forget_stream(pool, s),
            FlareStatus::FLARE_STATUS_STREAM_STATE,
            "being captured",
        );
        status_is(
            flare_sim_stream_destroy(pool, s),
            invalid,
            "cuStreamDestroy on stream",
        );
        let mut valid = -1;
        ok(flare_sim_end_capture(pool, s, &mut valid));
        assert_eq!(valid, 1, "the refused forget broke nothing");
    }
    // Nothing changed: S still takes p back at once.
    assert_eq!(alloc_on(pool, s), p);
    // SAFETY: `pool` is live; `p` is its allocation.
    unsafe {
        ok(flare_package_free_async(pool, p, s));
        ok(flare_pool_forget_stream(pool, s));
        ok(flare_pool_forget_stream(pool, s));
        ok(flare_sim_stream_destroy(pool, s));
        status_is(
            flare_sim_stream_destroy(pool, s),
            invalid,
            "CUDA_ERROR_INVALID_HANDLE (400): not a live stream",
        );
        status_is(
            flare_sim_stream_destroy(pool, ptr::null_mut()),
            invalid,
            "CUDA_ERROR_INVALID_HANDLE",
        );
        status_is(
            flare_sim_stream_destroy(ptr::null_mut(), s),
            invalid,
            "pool is NULL",
        );
    }
    let (st, report) = destroy_report(pool);
    ok(st);
    assert_eq!(report.live_count, 0);
}
