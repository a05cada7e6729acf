//! Tags (issue 15) on the simulated driver: every driver call of sleep and wake
//! failing, whole mappings and segments: a failed sleep leaves the tag awake, a failed
//! wake leaves it asleep, and nothing is lost.

use crate::common;

use crate::sleep_and_wake::{fill, pool_with, same};
use common::{check, check_with_devices, GIB, MIB};
use flare_package::{CuResult, DriverCall, ReusePolicy, SleepMode};

/// Segment mode, three handles of the tag's heap (one 2 MiB block each): every
/// call a sleep makes, failing once, leaves the books and the driver agreeing and
/// the tag awake and usable with its bytes, except a refused release (that handle
/// is left pending, the sleep succeeds) and a refused unmap whose undo is refused
/// too (the sleep goes on: the tag asleep, the error returned).
#[test]
fn every_segment_sleep_call_failing() {
    for (fail, awake) in [
        (vec![(DriverCall::Synchronize, 1)], true),
        (vec![(DriverCall::HostAlloc, 1)], true),
        (vec![(DriverCall::MemcpyDtoH, 2)], true),
        (vec![(DriverCall::Unmap, 1)], true),
        (vec![(DriverCall::Unmap, 3)], true),
        (vec![(DriverCall::Release, 2)], false),
        // The third unmap refused, then mapping the second back.
        (vec![(DriverCall::Unmap, 3), (DriverCall::Map, 1)], false),
    ] {
        let (pool, sim) = pool_with(ReusePolicy::Segments, 16 * GIB);
        let ptrs: Vec<_> = (0..3)
            .map(|i| {
                let p = pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap();
                fill(&sim, p, i, 2 * MIB as usize);
                p
            })
            .collect();
        assert_eq!(pool.snapshot().segment_handles, 3);
        for &(call, nth) in &fail {
            sim.inject_failure(call, nth, CuResult::UNKNOWN);
        }
        let r = pool.sleep(1, SleepMode::Offload);
        sim.clear_failures();
        let s = check_with_devices(&pool, 1);
        let c = pool.tag_census(1);
        if awake {
            assert!(r.is_err(), "{fail:?}");
            assert!(!c.sleeping, "{fail:?}");
            assert_eq!(sim.host_bytes(), 0, "{fail:?}");
            assert_eq!(s.physical_bytes, 6 * MIB, "{fail:?}");
        } else {
            assert!(c.sleeping, "{fail:?}");
            assert_eq!(c.physical_bytes, 0, "{fail:?}");
            if fail[0].0 == DriverCall::Release {
                r.unwrap();
                assert_eq!((s.pending_count, s.pending_bytes), (1, 2 * MIB));
            } else {
                assert!(r.is_err(), "{fail:?}");
            }
            pool.wake(1).unwrap();
        }
        check_with_devices(&pool, 1);
        for (i, &p) in ptrs.iter().enumerate() {
            same(&sim, p, i as u64, 2 * MIB as usize);
        }
        // Usable: a new allocation and a free of the tag, another sleep and wake.
        let q = pool.allocate_tagged_raw(MIB, None, 1).unwrap();
        pool.free_raw(q).unwrap();
        pool.sleep(1, SleepMode::Offload).unwrap();
        pool.wake(1).unwrap();
        for (i, &p) in ptrs.iter().enumerate() {
            same(&sim, p, i as u64, 2 * MIB as usize);
        }
        for p in ptrs {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        check(&pool);
        assert_eq!(pool.snapshot().physical_bytes, 0, "{fail:?}");
    }
}

/// Segment mode: every call a wake makes, failing once: the tag stays asleep, the
/// books agree with the driver, the host copy is kept; the next wake (which first
/// releases what an undo left pending) restores every byte.
#[test]
fn every_segment_wake_call_failing() {
    for fail in [
        vec![(DriverCall::Create, 1)],
        vec![(DriverCall::Create, 3)],
        vec![(DriverCall::Map, 2)],
        vec![(DriverCall::SetAccess, 2)],
        vec![(DriverCall::MemcpyHtoD, 3)],
        // The third copy refused, then the undo's second unmap (of the second
        // handle): that handle is left pending, still mapped.
        vec![(DriverCall::MemcpyHtoD, 3), (DriverCall::Unmap, 2)],
        // The second map refused, then releasing that handle again.
        vec![(DriverCall::Map, 2), (DriverCall::Release, 1)],
    ] {
        let (pool, sim) = pool_with(ReusePolicy::Segments, 16 * GIB);
        let ptrs: Vec<_> = (0..3)
            .map(|i| {
                let p = pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap();
                fill(&sim, p, i, 2 * MIB as usize);
                p
            })
            .collect();
        pool.sleep(1, SleepMode::Offload).unwrap();
        for &(call, nth) in &fail {
            sim.inject_failure(call, nth, CuResult::UNKNOWN);
        }
        assert!(pool.wake(1).is_err(), "{fail:?}");
        sim.clear_failures();
        let s = check_with_devices(&pool, 1);
        assert!(pool.tag_census(1).sleeping, "{fail:?}");
        assert_eq!(s.tags_sleeping, 1);
        assert_eq!(
            sim.host_bytes(),
            3 * 2 * MIB,
            "{fail:?}: the host copy is kept"
        );
        assert_eq!(
            (s.sleeping_count, s.sleeping_block_count),
            (3, 3),
            "{fail:?}"
        );
        // Only what an undo could not give back stays (pending, the pool's).
        assert_eq!(s.physical_bytes, s.pending_bytes, "{fail:?}");
        assert_eq!(pool.tag_census(1).physical_bytes, 0, "{fail:?}");
        // The wake first releases what an undo left pending (a handle still mapped
        // at one of the tag's addresses), then maps the tag again.
        pool.wake(1).unwrap();
        assert_eq!(pool.snapshot().pending_count, 0, "{fail:?}");
        check_with_devices(&pool, 1);
        for (i, &p) in ptrs.iter().enumerate() {
            same(&sim, p, i as u64, 2 * MIB as usize);
        }
        for p in ptrs {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        check(&pool);
        assert_eq!(pool.snapshot().physical_bytes, 0, "{fail:?}");
    }
}

/// Every call a sleep makes, failing: the books agree with the driver, and the tag
/// is awake and usable (the bytes intact), except a refused release, which keeps
/// the handle and sleeps.
#[test]
fn every_sleep_call_failing_leaves_the_tag_awake() {
    for (call, nth) in [
        (DriverCall::Synchronize, 1),
        (DriverCall::HostAlloc, 1),
        (DriverCall::MemcpyDtoH, 2),
        (DriverCall::Unmap, 1),
        (DriverCall::Unmap, 3),
        (DriverCall::Release, 2),
    ] {
        let (pool, sim) = pool_with(ReusePolicy::BestFit, 16 * GIB);
        let ptrs: Vec<_> = (0..3)
            .map(|i| {
                let p = pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap();
                fill(&sim, p, i, 2 * MIB as usize);
                p
            })
            .collect();
        sim.inject_failure(call, nth, CuResult::UNKNOWN);
        let r = pool.sleep(1, SleepMode::Offload);
        sim.clear_failures();
        let s = check_with_devices(&pool, 1);
        if call == DriverCall::Release {
            r.unwrap();
            assert_eq!((s.sleeping_held_count, s.sleeping_held_bytes), (1, 2 * MIB));
            assert_eq!(pool.tag_census(1).physical_bytes, 2 * MIB);
            pool.wake(1).unwrap();
        } else {
            assert!(r.is_err(), "{call:?}");
            assert!(!pool.tag_census(1).sleeping, "{call:?}");
            assert_eq!(sim.host_bytes(), 0, "{call:?}");
        }
        check_with_devices(&pool, 1);
        for (i, &p) in ptrs.iter().enumerate() {
            same(&sim, p, i as u64, 2 * MIB as usize);
        }
        // Usable: a new allocation and a free of the tag.
        let q = pool.allocate_tagged_raw(MIB, None, 1).unwrap();
        pool.free_raw(q).unwrap();
        pool.sleep(1, SleepMode::Offload).unwrap();
        pool.wake(1).unwrap();
        for (i, &p) in ptrs.iter().enumerate() {
            same(&sim, p, i as u64, 2 * MIB as usize);
        }
        for p in ptrs {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        check(&pool);
        assert_eq!(pool.snapshot().physical_bytes, 0, "{call:?}");
    }
}

/// Every call a wake makes, failing: the tag stays asleep, nothing half-awake, the
/// books agree with the driver; the next wake restores every byte.
#[test]
fn every_wake_call_failing_leaves_the_tag_asleep() {
    for (call, nth) in [
        (DriverCall::Create, 1),
        (DriverCall::Create, 3),
        (DriverCall::Map, 2),
        (DriverCall::SetAccess, 2),
        (DriverCall::MemcpyHtoD, 3),
        // Undo failing too: a refused unmap keeps a mapping already woken (its
        // bytes copied back) awake.
        (DriverCall::Unmap, 2),
    ] {
        let (pool, sim) = pool_with(ReusePolicy::BestFit, 16 * GIB);
        let ptrs: Vec<_> = (0..3)
            .map(|i| {
                let p = pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap();
                fill(&sim, p, i, 2 * MIB as usize);
                p
            })
            .collect();
        pool.sleep(1, SleepMode::Offload).unwrap();
        if call == DriverCall::Unmap {
            // The wake's third copy fails; the undo unmaps the third mapping, then
            // fails to unmap the second.
            sim.inject_failure(DriverCall::MemcpyHtoD, 3, CuResult::UNKNOWN);
        }
        sim.inject_failure(call, nth, CuResult::UNKNOWN);
        assert!(pool.wake(1).is_err(), "{call:?}");
        sim.clear_failures();
        let s = check_with_devices(&pool, 1);
        assert!(pool.tag_census(1).sleeping, "{call:?}");
        assert_eq!(s.tags_sleeping, 1);
        assert_eq!(
            sim.host_bytes(),
            3 * 2 * MIB,
            "{call:?}: the host copy is kept"
        );
        if call == DriverCall::Unmap {
            assert_eq!(
                s.sleeping_count, 2,
                "the mapping whose undo failed is awake"
            );
        } else {
            assert_eq!(s.sleeping_count, 3, "{call:?}");
            assert_eq!(s.physical_bytes, 0, "{call:?}");
        }
        pool.wake(1).unwrap();
        check_with_devices(&pool, 1);
        for (i, &p) in ptrs.iter().enumerate() {
            same(&sim, p, i as u64, 2 * MIB as usize);
        }
        for p in ptrs {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        check(&pool);
        assert_eq!(pool.snapshot().physical_bytes, 0, "{call:?}");
    }
}
