//! Tags (issue 15) on the simulated driver: sleep is refused in a retention scope and
//! during a capture (the pool's or one it never saw, after an out-of-memory too), and
//! a tag's block freed during a capture stays the tag's.

use crate::common;

use crate::sleep_and_wake::{keeping_pool, pool_with};
use common::{check, no_faults, GIB, MIB};
use flare_package::{CaptureMode, CuResult, DriverCall, Error, ReusePolicy, SleepMode};

/// Inside a retention scope, and while one of the pool's streams is captured, sleep
/// is a scope-state error and changes nothing.
#[test]
fn sleep_is_refused_in_a_scope_and_during_a_capture() {
    let (pool, sim) = pool_with(ReusePolicy::BestFit, 16 * GIB);
    let a = pool.allocate_tagged_raw(MIB, None, 1).unwrap();
    let scope = pool.retention_scope().unwrap();
    assert!(matches!(
        pool.sleep(1, SleepMode::Discard),
        Err(Error::ScopeState(_))
    ));
    scope.finish().unwrap();
    let s = common::stream(&sim);
    let b = pool.allocate_tagged_raw(MIB, Some(s), 1).unwrap();
    assert_eq!(
        sim.stream_begin_capture(s.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    assert!(matches!(
        pool.sleep(1, SleepMode::Discard),
        Err(Error::ScopeState(_))
    ));
    assert!(!pool.tag_census(1).sleeping);
    assert!(sim.stream_end_capture(s.0).is_success());
    no_faults(&sim);
    pool.sleep(1, SleepMode::Discard).unwrap();
    pool.wake(1).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_async_raw(b, s).unwrap();
    check(&pool);
}

/// An out-of-memory's release does not make the pool forget a stream (only a trim,
/// a finish or destroy do): a stream holding a live stream-ordered allocation that
/// is then captured still refuses a sleep, with the capture intact. A review found
/// the retry's release forgetting it, and the sleep's synchronize breaking the
/// capture.
#[test]
fn sleep_after_an_out_of_memory_still_sees_the_streams_capture() {
    for policy in ReusePolicy::ALL {
        let (pool, sim) = pool_with(policy, GIB);
        let a = pool.allocate_tagged_raw(4 * MIB, None, 1).unwrap();
        let s = common::stream(&sim);
        let b = pool.allocate_async_raw(4 * MIB, s).unwrap();
        // More than is left: out of memory, after the retry's release.
        assert!(matches!(
            pool.allocate_raw(1020 * MIB),
            Err(Error::OutOfMemory { .. })
        ));
        assert_eq!(
            sim.stream_begin_capture(s.0, CaptureMode::Global),
            CuResult::SUCCESS
        );
        assert!(
            matches!(pool.sleep(1, SleepMode::Discard), Err(Error::ScopeState(_))),
            "{policy:?}"
        );
        assert!(sim.stream_end_capture(s.0).is_success(), "{policy:?}");
        no_faults(&sim);
        pool.free_raw(a).unwrap();
        pool.free_async_raw(b, s).unwrap();
        check(&pool);
    }
}

/// A capture of a blocking stream the pool has never seen: the device synchronize
/// would break it, so sleep is a scope-state error (the legacy stream's capture
/// query answers `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`) and the capture stays valid.
/// A non-blocking stream's capture cannot be seen that way: the documented limit
/// (the synchronize fails, the tag stays awake, that capture is invalidated).
#[test]
fn sleep_during_a_capture_the_pool_never_saw() {
    let (pool, sim) = pool_with(ReusePolicy::Segments, 16 * GIB);
    let a = pool.allocate_tagged_raw(4096, None, 1).unwrap();
    let blocking = sim
        .stream_create_with_flags(flare_package::driver::sim::CU_STREAM_DEFAULT)
        .unwrap();
    assert_eq!(
        sim.stream_begin_capture(blocking, CaptureMode::Global),
        CuResult::SUCCESS
    );
    let syncs = sim.call_count(DriverCall::Synchronize);
    assert!(matches!(
        pool.sleep(1, SleepMode::Offload),
        Err(Error::ScopeState(_))
    ));
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        syncs,
        "no synchronize"
    );
    assert!(!pool.tag_census(1).sleeping);
    assert!(
        sim.stream_end_capture(blocking).is_success(),
        "capture still valid"
    );
    no_faults(&sim);
    // The limit: a non-blocking stream's capture.
    let other = common::stream(&sim);
    assert_eq!(
        sim.stream_begin_capture(other.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    assert!(matches!(
        pool.sleep(1, SleepMode::Offload),
        Err(Error::Driver { .. })
    ));
    assert!(!pool.tag_census(1).sleeping);
    assert_eq!(
        sim.stream_end_capture(other.0),
        CuResult::STREAM_CAPTURE_INVALIDATED
    );
    // The broken capture is the one fault the driver recorded.
    assert_eq!(sim.faults().len(), 1);
    pool.snapshot().check_invariants().unwrap();
    pool.sleep(1, SleepMode::Discard).unwrap();
    pool.wake(1).unwrap();
    pool.free_raw(a).unwrap();
    pool.snapshot().check_invariants().unwrap();
}

/// Segment mode: a tag's block freed on a stream being captured is kept for the
/// capture's graph, and the capture's own (tag 0) allocations on that stream do not
/// take it; the capture's release (trim) puts it back in the tag's heap, whose handle,
/// wholly free, is then released.
#[test]
fn a_tag_block_freed_during_a_capture_stays_the_tags() {
    let (pool, sim) = keeping_pool(ReusePolicy::Segments, 16 * GIB);
    let s = common::stream(&sim);
    let t = pool.allocate_tagged_raw(1000, Some(s), 6).unwrap();
    assert_eq!(
        sim.stream_begin_capture(s.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    pool.free_async_raw(t, s).unwrap();
    assert_eq!(pool.snapshot().capture_held_bytes, 1024);
    let u = pool.allocate_async_raw(1000, s).unwrap();
    assert!(u.abs_diff(t) >= 2 * MIB, "tag 0 took the tag's block");
    let c = pool.tag_census(6);
    assert_eq!(
        (c.live_count, c.idle_bytes, c.physical_bytes),
        (0, 2 * MIB, 2 * MIB)
    );
    pool.free_async_raw(u, s).unwrap();
    assert!(sim.stream_end_capture(s.0).is_success());
    check(&pool);
    pool.trim().unwrap();
    check(&pool);
    assert_eq!(pool.snapshot().physical_bytes, 0);
    assert_eq!(pool.tag_census(6).physical_bytes, 0);
    no_faults(&sim);
}
