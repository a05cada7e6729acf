//! Reuse across streams on the simulated driver (issue 11): memory freed on a stream
//! is handed back to that stream at once, and to another stream as the cross-stream
//! mode says (when its fence completed, never, or at once with a wait), within the
//! best-fit bound. The wait mode keeps the pool's reuse policy, needs no wait after a
//! fence seen complete, and hands nothing out when the wait or its fence is refused.
//! The simulated driver counts every contract fault: every test ends with none.

use crate::common;

use crate::stream_order::{pool_with, small_device, syncs, G};
use common::{assert_driver_empty, check, no_faults, simulated_pool, stream, MIB};
use flare_package::driver::sim::SimStreamCall;
use flare_package::{
    CrossStreamReuse, CuResult, DriverCall, Pool, PoolConfig, ReusePolicy, SimConfig,
};

/// A code no call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

/// Memory freed on S with S's kernel still queued is handed back to S at once (stream
/// order makes it safe), with no driver call but the capture query, no synchronize
/// and no fault.
#[test]
fn same_stream_reuse_is_immediate_while_work_is_queued() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(sim.launch(s.0, p, G), CuResult::SUCCESS);
    pool.free_async_raw(p, s).unwrap();
    let creates = sim.call_count(DriverCall::Create);
    let q = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(q, p, "the same stream gets its own freed memory back");
    assert_eq!(sim.call_count(DriverCall::Create), creates);
    assert_eq!(sim.queued_work().len(), 1, "the kernel is still queued");
    assert_eq!(syncs(&sim), 0);
    let snap = check(&pool);
    assert_eq!((snap.reuse_hits, snap.cross_stream_hits), (1, 0));
    no_faults(&sim);
}

/// `WhenComplete` (the default): another stream does not get memory whose freeing
/// stream's work is still queued, and gets it once that work completes.
#[test]
fn another_stream_waits_for_completion_by_default() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    sim.launch(s.0, p, G);
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_async_raw(G, t).unwrap();
    assert_ne!(q, p, "S's kernel still reads p");
    let snap = check(&pool);
    assert_eq!(snap.events_outstanding, 1, "one fence on S, not complete");
    assert_eq!(snap.event_wait_bytes, G, "p waits on it");
    sim.stream_complete(s.0);
    let r = pool.allocate_async_raw(G, t).unwrap();
    assert_eq!(r, p, "S's work completed: p goes to T");
    let snap = check(&pool);
    assert_eq!((snap.cross_stream_hits, snap.cross_stream_waits), (1, 0));
    assert_eq!((snap.events_outstanding, snap.event_wait_bytes), (0, 0));
    assert_eq!(syncs(&sim), 0);
    no_faults(&sim);
}

/// `Never`: memory freed on S is not handed to T, even after S's work completed, until
/// a release point moved it.
#[test]
fn never_keeps_memory_on_its_stream() {
    let (pool, sim) = pool_with(CrossStreamReuse::Never, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    sim.stream_complete(s.0);
    let q = pool.allocate_async_raw(G, t).unwrap();
    assert_ne!(q, p);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), 0);
    assert_eq!(pool.allocate_async_raw(G, s).unwrap(), p, "S still gets it");
    no_faults(&sim);
}

/// `Wait`: T gets S's memory at once, after `cuStreamWaitEvent` on a fence recorded
/// on S; T's later work is ordered after S's kernel (no hand-off fault).
#[test]
fn wait_orders_the_new_stream_after_the_old() {
    let (pool, sim) = pool_with(CrossStreamReuse::Wait, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    sim.launch(s.0, p, G);
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_async_raw(G, t).unwrap();
    assert_eq!(q, p, "handed over at once");
    assert_eq!(sim.stream_call_count(SimStreamCall::StreamWaitEvent), 1);
    let snap = check(&pool);
    assert_eq!((snap.cross_stream_hits, snap.cross_stream_waits), (1, 1));
    // T's kernel is queued behind S's: completing T completes S's too.
    sim.launch(t.0, q, G);
    sim.stream_complete(t.0);
    assert!(sim.queued_work().is_empty(), "{:?}", sim.queued_work());
    no_faults(&sim);
}

/// Wait mode uses a fence that already covers the memory instead of recording
/// another (only memory freed after that fence would need a new one).
#[test]
fn wait_mode_reuses_a_covering_fence() {
    let (pool, sim) = pool_with(CrossStreamReuse::Wait, u64::MAX);
    let (s, t, u) = (stream(&sim), stream(&sim), stream(&sim));
    let q = pool.allocate_async_raw(4 * MIB, s).unwrap();
    let p = pool.allocate_async_raw(G, s).unwrap();
    let r = pool.allocate_async_raw(8 * MIB, s).unwrap();
    sim.launch(s.0, p, G);
    pool.free_async_raw(q, s).unwrap(); // mark 1
    pool.free_async_raw(p, s).unwrap(); // mark 2
                                        // T takes q after a fence on S covering marks 1 and 2.
    assert_eq!(pool.allocate_async_raw(4 * MIB, t).unwrap(), q);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), 1);
    pool.free_async_raw(r, s).unwrap(); // mark 3, after the fence
                                        // U takes p: the fence covers its free already.
    assert_eq!(pool.allocate_async_raw(G, u).unwrap(), p);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), 1);
    assert_eq!(check(&pool).cross_stream_waits, 2);
    no_faults(&sim);
}

/// Memory that went to "any stream" after its own stream's fence completed goes
/// back to that stream without counting as a cross-stream hit; only the other
/// stream's take counts.
#[test]
fn a_stream_taking_back_its_own_completed_memory_is_no_cross_stream_hit() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    let q = pool.allocate_async_raw(4 * MIB, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    pool.free_async_raw(q, s).unwrap();
    // T's miss fences S and finds it complete: p and q move to "any"; T takes q.
    assert_eq!(pool.allocate_async_raw(4 * MIB, t).unwrap(), q);
    assert_eq!(pool.allocate_async_raw(G, s).unwrap(), p);
    let snap = check(&pool);
    assert_eq!((snap.reuse_hits, snap.cross_stream_hits), (2, 1));
    no_faults(&sim);
}

/// A trim whose fence wait fails for one recorded stream releases the memory that
/// waited on it after a device synchronize (counted, not an error); the memory that
/// waited on another recorded stream is released after that stream's fence wait.
#[test]
fn a_failed_wait_releases_what_waited_on_it_and_only_that() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t1, t2) = (stream(&sim), stream(&sim), stream(&sim));
    let a = pool.allocate_async_raw(G, s).unwrap();
    let b = pool.allocate_async_raw(4 * MIB, s).unwrap();
    pool.record_stream(a, t1).unwrap();
    pool.record_stream(b, t2).unwrap();
    sim.launch(t2.0, b, 4 * MIB);
    // Deferred in this order: b (waits on T2), then a (waits on T1).
    pool.free_async_raw(b, s).unwrap();
    pool.free_async_raw(a, s).unwrap();
    assert_eq!(check(&pool).event_wait_bytes, 6 * MIB);
    // The fences waited on at trim, in bucket order: S's own, T1's, T2's. The second
    // wait (T1's) fails.
    sim.inject_stream_failure(SimStreamCall::EventSynchronize, 2, CuResult::UNKNOWN);
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1, "{snap:#?}");
    assert_eq!(
        snap.physical_bytes, 0,
        "T2's wait completed its work; all released"
    );
    assert_eq!(syncs(&sim), 1, "the fallback synchronize for a");
    no_faults(&sim);
}

/// Cross-stream reuse follows best fit's waste bound: an 8 MiB request on T takes a
/// 10 MiB mapping freed on S (within 30%) once S's work completed.
#[test]
fn cross_stream_reuse_uses_the_best_fit_bound() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(10 * MIB, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(pool.allocate_async_raw(8 * MIB, t).unwrap(), p);
    assert_eq!(check(&pool).cross_stream_hits, 1);
    no_faults(&sim);
}

/// A stream allocation that finds the device full takes the smallest idle mapping of
/// its own stream that fits, whatever the waste bound, before failing (a forced
/// reuse, counted).
#[test]
fn a_stream_allocation_forces_reuse_before_out_of_memory() {
    let (pool, sim) = small_device(8 * MIB);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(8 * MIB, s).unwrap();
    sim.launch(s.0, p, 8 * MIB);
    pool.free_async_raw(p, s).unwrap();
    // 2 MiB: 8 MiB is beyond the 30% bound, and the device is full.
    assert_eq!(pool.allocate_async_raw(G, s).unwrap(), p);
    let snap = check(&pool);
    assert_eq!((snap.reuse_forced_hits, snap.mappings_created), (1, 1));
    no_faults(&sim);
}

/// FINDING 5. `CrossStreamReuse::Wait` ignores `ReusePolicy::Exact`: T takes a 24
/// MiB mapping freed on S for a 20 MiB request (`take_with_wait` uses best fit
/// whatever the policy). README: "`exact` | the mapping has exactly the request's
/// size, rounded up to the granularity". With `WhenComplete` the same request is
/// (correctly) not served from it.
#[test]
fn wait_mode_respects_the_exact_policy() {
    let pool = Pool::new(PoolConfig {
        cross_stream_reuse: CrossStreamReuse::Wait,
        reuse_policy: ReusePolicy::Exact,
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::simulated(SimConfig::default())
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap();
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(12 * G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_async_raw(10 * G, t).unwrap();
    let snap = check(&pool);
    assert_ne!(
        q, p,
        "exact policy: a {} MiB mapping served a {} MiB request (reuse hits {}, exact {})",
        24, 20, snap.reuse_hits, snap.reuse_exact_hits
    );
}

/// `CrossStreamReuse::Wait` takes a mapping freed on another stream "after
/// `cuStreamWaitEvent` on its fence"; a fence the pool has already seen complete
/// orders nothing (`Snapshot::events_outstanding` no longer counts it): the mapping
/// is handed out with no wait (`cross_stream_hits`, not `cross_stream_waits`).
/// Here s1's fence is recorded for memory freed on s3 that was used on s1
/// (`record_stream`), and seen complete by an allocation on s2 that waited for
/// nothing of s1 (it fit nothing there); s1's own freed mapping is then taken by s2
/// without a `cuStreamWaitEvent`.
#[test]
fn a_cross_stream_take_after_a_completed_fence_does_not_wait() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            cross_stream_reuse: CrossStreamReuse::Wait,
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let (s1, s2, s3) = (
        common::stream(&sim),
        common::stream(&sim),
        common::stream(&sim),
    );
    let p = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    pool.free_async_raw(p, s1).unwrap();
    let d = pool.allocate_async_raw(7 * MIB, s3).unwrap();
    pool.record_stream(d, s1).unwrap();
    pool.free_async_raw(d, s3).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.events_outstanding, 1, "s1's fence, for d");
    // Fits neither p nor d: polls d's fence (complete: no work was queued).
    let big = pool.allocate_async_raw(20 * MIB, s2).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.events_outstanding, 0, "s1's fence seen complete");
    let waits = sim.stream_call_count(SimStreamCall::StreamWaitEvent);
    let r = pool.allocate_async_raw(3 * MIB, s2).unwrap();
    assert_eq!(r, p);
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamWaitEvent),
        waits,
        "no wait"
    );
    let snap = check(&pool);
    assert_eq!((snap.cross_stream_waits, snap.cross_stream_hits), (0, 1));
    for (q, s) in [(r, s2), (big, s2)] {
        pool.free_async_raw(q, s).unwrap();
    }
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// `CrossStreamReuse::Wait`: memory freed on one stream serves another stream after
/// `cuStreamWaitEvent` on its fence (`Snapshot::cross_stream_waits`). When the wait
/// is refused, the mapping is not handed out (no order is established): the
/// allocation takes new memory, the failure is counted in `stream_call_failures`,
/// and no wait is counted.
#[test]
fn a_refused_cross_stream_wait_hands_nothing_out() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            cross_stream_reuse: CrossStreamReuse::Wait,
            ..PoolConfig::default()
        },
    );
    let (s1, s2) = (common::stream(&sim), common::stream(&sim));
    let p = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    // Work queued on s1 that the free orders before reuse: the fence stays pending.
    assert_eq!(sim.launch(s1.0, p, 3 * MIB), CuResult::SUCCESS);
    pool.free_async_raw(p, s1).unwrap();
    sim.inject_stream_failure(SimStreamCall::StreamWaitEvent, 1, FAIL);
    let waits = sim.stream_call_count(SimStreamCall::StreamWaitEvent);
    let q = pool.allocate_async_raw(3 * MIB, s2).unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamWaitEvent),
        waits + 1
    );
    assert_ne!(q, p, "the refused wait hands nothing out");
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1);
    assert_eq!((snap.cross_stream_waits, snap.cross_stream_hits), (0, 0));
    assert_eq!(snap.mappings_created, 2);
    // Without a failure the next one waits and takes it.
    let r = pool.allocate_async_raw(3 * MIB, s2).unwrap();
    assert_eq!(r, p);
    let snap = check(&pool);
    assert_eq!(snap.cross_stream_waits, 1);
    assert_eq!(snap.mappings_created, 2);
    no_faults(&sim);
}

/// `CrossStreamReuse::Wait`: a mapping freed on another stream is taken after
/// `cuStreamWaitEvent` on a fence covering its free, recorded then if none does
/// yet. When that fence cannot be recorded (`cuEventRecord` refused), nothing can
/// order the new stream after the free: the mapping is not handed out (its work is
/// still queued), the allocation takes new memory, and the failure is counted in
/// `stream_call_failures`. The next allocation waits on a fence and takes it.
#[test]
fn a_cross_stream_wait_without_a_fence_hands_nothing_out() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            cross_stream_reuse: CrossStreamReuse::Wait,
            // No release at a free, so no free's poll records a fence first.
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let (s1, s2) = (common::stream(&sim), common::stream(&sim));
    let p = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    // Queued work the free orders before reuse (so no poll finds it complete).
    assert_eq!(sim.launch(s1.0, p, 3 * MIB), CuResult::SUCCESS);
    pool.free_async_raw(p, s1).unwrap();
    assert_eq!(pool.snapshot().events_outstanding, 0, "no fence yet");
    let records = sim.stream_call_count(SimStreamCall::EventRecord);
    sim.inject_stream_failure(SimStreamCall::EventRecord, 1, FAIL);
    let q = pool.allocate_async_raw(3 * MIB, s2).unwrap();
    assert!(sim.stream_call_count(SimStreamCall::EventRecord) > records);
    assert_ne!(q, p, "not handed out without a fence");
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1);
    assert_eq!((snap.cross_stream_waits, snap.cross_stream_hits), (0, 0));
    assert_eq!(snap.mappings_created, 2);
    let r = pool.allocate_async_raw(3 * MIB, s2).unwrap();
    assert_eq!(r, p);
    let snap = check(&pool);
    assert_eq!((snap.cross_stream_waits, snap.mappings_created), (1, 2));
    no_faults(&sim);
}
