//! Out of memory (`Pool::allocate_raw`, the miss path): idle memory taken or released
//! and the request retried once, what the error reports, a failed or refused retry
//! leaving the books consistent, and a stream-ordered miss that releases only fenced
//! memory without synchronizing.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use common::{assert_driver_empty, check, no_faults, simulated_pool, MIB};
use flare_package::{CuResult, DriverCall, DriverError, Error, Pool, PoolConfig, SimDriver};
use std::sync::Arc;

/// A code no memory call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

/// A pool on a 16 MiB simulated device that caches every free (threshold
/// `u64::MAX`) with thread caches `cache_entries`.
pub(crate) fn small_pool(cache_entries: u32) -> (Pool, Arc<SimDriver>) {
    simulated_pool(
        16 * MIB,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            thread_cache_entries: cache_entries,
            ..PoolConfig::default()
        },
    )
}

/// `Pool::allocate_raw`: "[`Error::OutOfMemory`] when the device is full (outside a
/// scope, after releasing idle mappings and retrying once)"; `Snapshot::oom_retries`
/// counts the retry. Two idle 6 MiB mappings (too small for 8 MiB under best-fit)
/// leave no room for 8 MiB on a 16 MiB device; released, they do.
#[test]
fn oom_with_idle_memory_releases_it_and_the_retry_succeeds() {
    for cache_entries in [0, 32] {
        let (pool, sim) = small_pool(cache_entries);
        let a = pool.allocate_raw(6 * MIB).unwrap();
        let b = pool.allocate_raw(6 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        pool.free_raw(b).unwrap();
        let s = check(&pool);
        assert_eq!((s.idle_count, s.idle_bytes), (2, 12 * MIB));
        let syncs = sim.call_count(DriverCall::Synchronize);
        let c = pool.allocate_raw(8 * MIB).unwrap();
        let s = check(&pool);
        let ctx = format!("cache entries {cache_entries}: {s:#?}");
        assert_eq!(s.physical_bytes, 8 * MIB, "{ctx}");
        assert_eq!(sim.state().physical_bytes, 8 * MIB);
        assert_eq!((s.live_count, s.live_mapped_bytes), (1, 8 * MIB), "{ctx}");
        assert_eq!((s.idle_count, s.idle_bytes), (0, 0), "{ctx}");
        assert_eq!(s.oom_retries, 1, "{ctx}");
        assert_eq!(s.create_failures, 1, "{ctx}: the first try");
        assert_eq!((s.mappings_created, s.mappings_released), (3, 2), "{ctx}");
        assert_eq!((s.reuse_hits, s.reuse_forced_hits), (0, 0), "{ctx}");
        assert_eq!(s.peak_physical_bytes, 12 * MIB, "{ctx}: never both");
        // Four creates: a, b, the refused one, the retry.
        assert_eq!(sim.call_count(DriverCall::Create), 4);
        // The synchronous allocate releases after one device synchronize.
        assert_eq!(sim.call_count(DriverCall::Synchronize), syncs + 1);
        pool.free_raw(c).unwrap();
        pool.trim().unwrap();
        assert_driver_empty(&pool);
    }
}

/// `Snapshot::reuse_forced_hits` / `Pool::after_oom`: before releasing anything, an
/// out-of-memory takes the smallest idle mapping that fits, whatever the waste
/// bound: a 12 MiB idle mapping serves 6 MiB (100% over, beyond best-fit's 30%),
/// with no release and no retry.
#[test]
fn oom_takes_a_fitting_idle_mapping_before_releasing() {
    let (pool, sim) = small_pool(0);
    let a = pool.allocate_raw(12 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    let b = pool.allocate_raw(6 * MIB).unwrap();
    assert_eq!(b, a);
    let s = check(&pool);
    assert_eq!(
        (s.reuse_hits, s.reuse_forced_hits, s.oom_retries),
        (1, 1, 0)
    );
    assert_eq!((s.create_failures, s.mappings_released), (1, 0));
    assert_eq!(
        (s.physical_bytes, s.live_mapped_bytes),
        (12 * MIB, 12 * MIB)
    );
    assert_eq!(sim.call_count(DriverCall::Create), 2);
    pool.free_raw(b).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// `Error::OutOfMemory`: `requested` is "bytes asked for, rounded up to the
/// granularity", `live` "bytes mapped to live allocations", `idle` "bytes held idle
/// when the request failed" (outside a scope, after the release: what could not be
/// released), `source` "the driver's out-of-memory failure".
#[test]
fn oom_with_nothing_idle_reports_request_live_and_idle() {
    let (pool, sim) = small_pool(0);
    let live = pool.allocate_raw(10 * MIB).unwrap();
    let before = check(&pool);
    let err = pool.allocate_raw(7 * MIB + 1).unwrap_err();
    let oom = Some(DriverError::new(
        DriverCall::Create,
        CuResult::OUT_OF_MEMORY,
    ));
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 8 * MIB,
            live: 10 * MIB,
            idle: 0,
            in_scope: false,
            source: oom,
        }
    );
    let s = check(&pool);
    assert_eq!(s.oom_retries, before.oom_retries + 1);
    assert_eq!(
        s.create_failures,
        before.create_failures + 2,
        "the try and the retry"
    );
    assert_eq!(s.physical_bytes, 10 * MIB);
    assert_eq!(sim.state().physical_bytes, 10 * MIB);

    // Idle memory too small to serve is released before the retry: the error then
    // reports none idle.
    let small = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(small).unwrap();
    assert_eq!(check(&pool).idle_bytes, 4 * MIB);
    let err = pool.allocate_raw(8 * MIB).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 8 * MIB,
            live: 10 * MIB,
            idle: 0,
            in_scope: false,
            source: oom,
        }
    );
    let s = check(&pool);
    assert_eq!((s.idle_bytes, s.physical_bytes), (0, 10 * MIB));
    assert_eq!(s.oom_retries, before.oom_retries + 2);
    assert_eq!(s.mappings_released, 1);

    // Inside a scope nothing retained is released and nothing retried.
    pool.retention_begin().unwrap();
    let small = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(small).unwrap();
    let err = pool.allocate_raw(8 * MIB).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 8 * MIB,
            live: 10 * MIB,
            idle: 4 * MIB,
            in_scope: true,
            source: oom,
        }
    );
    let s = check(&pool);
    assert_eq!(s.oom_retries, before.oom_retries + 2, "no retry in a scope");
    pool.retention_finish().unwrap();
    pool.free_raw(live).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// The retry itself fails with something other than out-of-memory: `Pool::
/// allocate_raw` "[`Error::Driver`] for any other failed driver call", with `bytes`
/// the rounded request; the idle memory released before it stays released and the
/// books equal the driver (each step of a failed creation undone).
#[test]
fn a_failure_of_the_retry_is_reported_and_the_books_stay_consistent() {
    // (the call failed during the retry, its nth call counted from the start of
    // the allocation: the first create is the refused one)
    for (call, nth) in [
        (DriverCall::Create, 2),
        (DriverCall::Reserve, 1),
        (DriverCall::Map, 1),
        (DriverCall::SetAccess, 1),
    ] {
        let (pool, sim) = small_pool(0);
        let a = pool.allocate_raw(6 * MIB).unwrap();
        let b = pool.allocate_raw(6 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        pool.free_raw(b).unwrap();
        let before = check(&pool);
        sim.inject_failure(call, nth, FAIL);
        let err = pool.allocate_raw(8 * MIB).unwrap_err();
        assert_eq!(
            err,
            Error::Driver {
                source: DriverError::new(call, FAIL),
                bytes: 8 * MIB,
            },
            "{call:?}"
        );
        assert_eq!(sim.pending_failures(), 0, "{call:?}: the injection fired");
        let s = check(&pool);
        assert_eq!(s.check_invariants(), Ok(()));
        assert_eq!(s.physical_bytes, sim.state().physical_bytes, "{call:?}");
        assert_eq!(
            s.physical_bytes, 0,
            "{call:?}: idle released, creation undone"
        );
        assert_eq!((s.idle_count, s.live_count, s.pending_count), (0, 0, 0));
        assert_eq!(s.oom_retries, before.oom_retries + 1, "{call:?}");
        assert_eq!(s.mappings_released, 2, "{call:?}: the two idle ones");
        assert_eq!(s.mappings_created, 2, "{call:?}");
        assert_eq!(
            s.driver_failures(),
            before.driver_failures() + 2,
            "{call:?}"
        );
        assert_driver_empty(&pool);
        // The device is usable again.
        let c = pool.allocate_raw(16 * MIB).unwrap();
        pool.free_raw(c).unwrap();
        pool.trim().unwrap();
        assert_driver_empty(&pool);
    }
}

/// The retry's creation fails and its undo is refused too: the leftover is pending
/// (booked in `physical_bytes` and `pending_bytes`, equal to what the driver holds)
/// and released at the next release point.
#[test]
fn a_failed_retry_with_a_refused_undo_leaves_consistent_pending_books() {
    let (pool, sim) = small_pool(0);
    let a = pool.allocate_raw(6 * MIB).unwrap();
    let b = pool.allocate_raw(6 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    sim.inject_failure(DriverCall::SetAccess, 1, FAIL);
    // The two idle mappings' unmaps succeed (the OOM release), the undo's fails.
    sim.inject_failure(DriverCall::Unmap, 3, FAIL);
    let err = pool.allocate_raw(8 * MIB).unwrap_err();
    assert_eq!(
        err.driver_error(),
        Some(DriverError::new(DriverCall::SetAccess, FAIL))
    );
    let s = check(&pool);
    assert_eq!(
        (s.pending_count, s.pending_bytes, s.physical_bytes),
        (1, 8 * MIB, 8 * MIB)
    );
    assert_eq!(sim.state().physical_bytes, 8 * MIB);
    assert_eq!((s.access_failures, s.unmap_failures), (1, 1));
    assert_eq!((s.mappings_created, s.mappings_released), (2, 2));
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.pending_count, s.physical_bytes), (0, 0));
    assert_eq!(
        s.mappings_released, 2,
        "a leftover is not a mapping released"
    );
    assert_driver_empty(&pool);
}

/// The release before the retry is refused in part: what the driver refused stays
/// idle (booked, equal to the driver), the retry then reports out of memory with
/// those idle bytes, and the next release point releases them.
#[test]
fn a_refused_release_before_the_retry_keeps_memory_and_reports_it() {
    // A refused unmap: one of the two 8 MiB idle mappings stays.
    let (pool, sim) = small_pool(0);
    let a = pool.allocate_raw(8 * MIB).unwrap();
    let b = pool.allocate_raw(8 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    // 10 MiB: too large for 8 MiB idle, too large beside 16 MiB or 8 MiB held.
    let err = pool.allocate_raw(10 * MIB).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 10 * MIB,
            live: 0,
            idle: 8 * MIB,
            in_scope: false,
            source: Some(DriverError::new(
                DriverCall::Create,
                CuResult::OUT_OF_MEMORY
            )),
        }
    );
    let s = check(&pool);
    assert_eq!(
        (s.idle_count, s.idle_bytes, s.physical_bytes),
        (1, 8 * MIB, 8 * MIB)
    );
    assert_eq!(sim.state().physical_bytes, 8 * MIB);
    assert_eq!(
        (s.unmap_failures, s.oom_retries, s.mappings_released),
        (1, 1, 1)
    );
    pool.trim().unwrap();
    assert_driver_empty(&pool);

    // A refused synchronize: nothing is released, both stay idle.
    let (pool, sim) = small_pool(0);
    let a = pool.allocate_raw(8 * MIB).unwrap();
    let b = pool.allocate_raw(8 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    sim.inject_failure(DriverCall::Synchronize, 1, FAIL);
    let err = pool.allocate_raw(10 * MIB).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { requested, live: 0, idle, in_scope: false, .. }
            if requested == 10 * MIB && idle == 16 * MIB),
        "{err:?}"
    );
    let s = check(&pool);
    assert_eq!((s.idle_count, s.physical_bytes), (2, 16 * MIB));
    assert_eq!((s.sync_failures, s.mappings_released), (1, 0));
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// The out-of-memory itself is injected (the driver refuses although it has room):
/// the pool releases what is idle and retries once, and the retry succeeds.
#[test]
fn an_injected_oom_with_idle_memory_is_retried() {
    let (pool, sim) = small_pool(0);
    let a = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    let b = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.oom_retries, s.create_failures), (1, 1));
    assert_eq!((s.idle_bytes, s.physical_bytes), (0, 4 * MIB));
    assert_eq!(
        s.mappings_released, 1,
        "the idle one released before the retry"
    );
    pool.free_raw(b).unwrap();
    // Two injected in a row: the retry fails too, with the out-of-memory.
    let (pool, sim) = small_pool(0);
    sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    let err = pool.allocate_raw(4 * MIB).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { requested, live: 0, idle: 0, in_scope: false, source: Some(_) } if requested == 4 * MIB),
        "{err:?}"
    );
    let s = check(&pool);
    assert_eq!(
        (s.oom_retries, s.create_failures, s.physical_bytes),
        (1, 2, 0)
    );
}

/// `Pool::allocate_raw` on out-of-memory (the miss path): a forced reuse of idle
/// memory the caller may take, then "a release of what is idle, `retake` under the
/// lock, and `create` once more". Memory freed on a stream whose work is still
/// queued cannot serve the synchronous caller before the release point's device
/// synchronize; when that release's unmap is refused, the mapping stays idle (its
/// work now complete) and the retake hands it out: the allocation succeeds with it,
/// one out-of-memory retry counted, no second mapping.
#[test]
fn an_oom_retry_takes_what_the_release_could_not_release() {
    let (pool, sim) = simulated_pool(
        6 * MIB,
        PoolConfig {
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let s = common::stream(&sim);
    let p = pool.allocate_async_raw(4 * MIB, s).unwrap();
    assert_eq!(sim.launch(s.0, p, 4 * MIB), CuResult::SUCCESS);
    pool.free_async_raw(p, s).unwrap();
    // 4 + 4 MiB do not fit in 6: the create is out of memory; the release point
    // synchronizes the device, then its unmap of p is refused.
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    let q = pool.allocate_raw(4 * MIB).expect("the retake serves it");
    assert_eq!(q, p);
    let snap = check(&pool);
    assert_eq!(snap.oom_retries, 1);
    assert_eq!((snap.mappings_created, snap.unmap_failures), (1, 1));
    assert_eq!((snap.live_count, snap.idle_count), (1, 0));
    pool.free_raw(q).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// `Pool::miss`: "A stream-ordered allocation never synchronizes the device (a
/// capture may be open on any stream): it releases only memory whose fences
/// completed; the synchronous `allocate` releases everything idle, after a device
/// synchronize." Memory freed on the stream (no work queued: its fence is complete)
/// is released for the retry with no device synchronize; memory freed with the
/// synchronous `free` is not, and the retry reports it idle.
#[test]
fn a_stream_ordered_oom_releases_only_fenced_memory_without_synchronizing() {
    // Freed on the stream: released, the retry succeeds.
    let (pool, sim) = small_pool(0);
    let s = common::stream(&sim);
    let a = pool.allocate_async_raw(6 * MIB, s).unwrap();
    let b = pool.allocate_async_raw(6 * MIB, s).unwrap();
    pool.free_async_raw(a, s).unwrap();
    pool.free_async_raw(b, s).unwrap();
    assert_eq!(check(&pool).idle_bytes, 12 * MIB);
    let syncs = sim.call_count(DriverCall::Synchronize);
    let c = pool.allocate_async_raw(8 * MIB, s).unwrap();
    let st = check(&pool);
    assert_eq!((st.oom_retries, st.create_failures), (1, 1));
    assert_eq!((st.idle_bytes, st.physical_bytes), (0, 8 * MIB));
    assert_eq!(sim.state().physical_bytes, 8 * MIB);
    assert_eq!(st.mappings_released, 2);
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        syncs,
        "no device sync"
    );
    common::no_faults(&sim);
    pool.free_async_raw(c, s).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);

    // Freed with the synchronous free: its release needs a device synchronize,
    // which a stream-ordered allocation never makes: kept, reported idle.
    let (pool, sim) = small_pool(0);
    let s = common::stream(&sim);
    let a = pool.allocate_raw(6 * MIB).unwrap();
    let b = pool.allocate_raw(6 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    let syncs = sim.call_count(DriverCall::Synchronize);
    let err = pool.allocate_async_raw(8 * MIB, s).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 8 * MIB,
            live: 0,
            idle: 12 * MIB,
            in_scope: false,
            source: Some(DriverError::new(
                DriverCall::Create,
                CuResult::OUT_OF_MEMORY
            )),
        }
    );
    let st = check(&pool);
    assert_eq!((st.oom_retries, st.create_failures), (1, 2));
    assert_eq!((st.idle_count, st.physical_bytes), (2, 12 * MIB));
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        syncs,
        "no device sync"
    );
    // The synchronous allocate does synchronize, releases them, and succeeds.
    let c = pool.allocate_raw(8 * MIB).unwrap();
    let st = check(&pool);
    assert_eq!(
        (st.oom_retries, st.physical_bytes, st.mappings_released),
        (2, 8 * MIB, 2)
    );
    assert_eq!(sim.call_count(DriverCall::Synchronize), syncs + 1);
    pool.free_raw(c).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}
