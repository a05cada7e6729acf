//! Requests of a tag: tag 0 is the untagged API; a tag's request larger than the
//! device, on a full device or refused for another reason is answered as
//! `Pool::allocate_raw` would; a free of a sleeping tag's memory is refused.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::sleep_and_wake::keeping_segments;
use common::{check, no_faults, simulated_pool, GIB, MIB};
use flare_package::{CuResult, DriverCall, Error, PoolConfig, ReusePolicy, SleepMode};

/// `Pool::allocate_tagged_raw`: "Tag 0 is exactly those functions" (`allocate_raw`,
/// `allocate_async_raw`), and `Pool::allocate_tagged` of tag 0 is `allocate` /
/// `allocate_async`. In segment mode a tag-0 synchronous request is a block of the
/// synchronous API's heap, not of a tag heap of its own: after an untagged 1 MiB
/// block, a 1 MiB tag-0 block fills the same 2 MiB handle (the granularity), no
/// second handle. Every one of them is tag 0's in the census; a guard of tag 5 is
/// tag 5's until dropped.
#[test]
fn tag_zero_allocations_are_the_untagged_ones() {
    let (pool, sim) = keeping_segments(GIB);
    let s = common::stream(&sim);
    let a = pool.allocate_raw(MIB).unwrap();
    let b = pool.allocate_tagged_raw(MIB, None, 0).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.segment_handles, snap.physical_bytes), (1, 2 * MIB));
    let g = pool.allocate_tagged(MIB, None, 0).unwrap();
    let h = pool.allocate_tagged(MIB, Some(s), 0).unwrap();
    let c = pool.tag_census(0);
    assert_eq!((c.live_count, c.live_bytes), (4, 4 * MIB));
    {
        let t5 = pool.allocate_tagged(MIB, None, 5).unwrap();
        let c5 = pool.tag_census(5);
        assert_eq!((c5.live_count, c5.live_bytes), (1, MIB));
        assert_eq!(pool.tag_census(0).live_count, 4);
        assert_ne!(t5.ptr(), 0);
    }
    assert_eq!(pool.tag_census(5).live_count, 0);
    drop((g, h));
    assert_eq!(pool.tag_census(0).live_count, 2);
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    assert_eq!(check(&pool).live_count, 0);
    no_faults(&sim);
}

/// `Error::RequestTooLarge`: a request whose rounded size is more than the device's
/// total memory is "returned at once, with no driver call, nothing released and
/// nothing counted": also a tag's, as a block of its heap (segment mode: the heap
/// grows by whole handles, so 3 MiB needs a 4 MiB one) or as a whole mapping
/// (best-fit: 3 MiB rounds to 4 MiB). On a 2 MiB device a 2 MiB request fits.
#[test]
fn a_tags_request_larger_than_the_device_is_refused_at_once() {
    for policy in [ReusePolicy::Segments, ReusePolicy::BestFit] {
        let (pool, sim) = simulated_pool(2 * MIB, PoolConfig::default().with_policy(policy));
        match pool.allocate_tagged_raw(3 * MIB, None, 1) {
            Err(Error::RequestTooLarge {
                requested,
                device_total,
            }) => assert_eq!((requested, device_total), (4 * MIB, 2 * MIB), "{policy:?}"),
            other => panic!("{policy:?}: {other:?}"),
        }
        assert_eq!(sim.call_count(DriverCall::Create), 0, "{policy:?}");
        assert_eq!(sim.call_count(DriverCall::Reserve), 0, "{policy:?}");
        let snap = check(&pool);
        assert_eq!((snap.oom_retries, snap.driver_failures()), (0, 0));
        assert_eq!(pool.tag_census(1).live_count, 0, "{policy:?}");
        let p = pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap();
        assert_eq!(pool.tag_census(1).live_bytes, 2 * MIB, "{policy:?}");
        pool.free_raw(p).unwrap();
        pool.trim().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{policy:?}");
    }
}

/// `Pool::allocate_tagged_raw` errors "as `Pool::allocate_raw`": on a device full
/// of live memory (4 MiB, one live allocation of the tag), a request of the tag is
/// `Error::OutOfMemory` after one release of idle memory and one retry
/// (`oom_retries` 1), the error naming the request rounded to the granularity and
/// the live bytes (`live_mapped_bytes + block_live_bytes`), nothing idle; nothing
/// else changes. Segment mode (a block of the tag's heap) and best-fit (a whole
/// mapping).
#[test]
fn a_tags_request_on_a_full_device_is_out_of_memory() {
    for policy in [ReusePolicy::Segments, ReusePolicy::BestFit] {
        let (pool, sim) = simulated_pool(4 * MIB, PoolConfig::default().with_policy(policy));
        let p = pool.allocate_tagged_raw(4 * MIB, None, 1).unwrap();
        match pool.allocate_tagged_raw(MIB, None, 1) {
            Err(Error::OutOfMemory {
                requested,
                live,
                idle,
                in_scope,
                source,
            }) => {
                assert_eq!((requested, live, idle), (2 * MIB, 4 * MIB, 0), "{policy:?}");
                assert!(!in_scope);
                assert_eq!(source.map(|e| e.call), Some(DriverCall::Create));
            }
            other => panic!("{policy:?}: {other:?}"),
        }
        let snap = check(&pool);
        assert_eq!(snap.oom_retries, 1, "{policy:?}");
        assert_eq!((snap.physical_bytes, snap.live_count), (4 * MIB, 1));
        let c = pool.tag_census(1);
        assert_eq!((c.live_count, c.physical_bytes), (1, 4 * MIB), "{policy:?}");
        pool.free_raw(p).unwrap();
        pool.trim().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{policy:?}");
        no_faults(&sim);
    }
}

/// A tag's request the driver refuses for another reason than memory (`cuMemCreate`
/// answering CUDA_ERROR_UNKNOWN) is `Error::Driver` with that answer and the
/// request rounded to the granularity, at once: only out-of-memory earns a release
/// point and a retry (`oom_retries` stays 0), and the same request then succeeds.
/// Segment mode (the growth of the tag's heap) and best-fit (a whole mapping). A
/// retry's creation refused so is `Error::Driver` too, not `OutOfMemory`: the first
/// creation out of memory (one release point, `oom_retries` 1), the retry's refused.
#[test]
fn a_tags_request_refused_for_another_reason_is_a_driver_error() {
    for policy in [ReusePolicy::Segments, ReusePolicy::BestFit] {
        let (pool, sim) = simulated_pool(GIB, PoolConfig::default().with_policy(policy));
        sim.inject_failure(DriverCall::Create, 1, CuResult::UNKNOWN);
        match pool.allocate_tagged_raw(1000, None, 7) {
            Err(Error::Driver { source, bytes }) => {
                assert_eq!(
                    (source.call, source.code),
                    (DriverCall::Create, CuResult::UNKNOWN),
                    "{policy:?}"
                );
                assert_eq!(bytes, 2 * MIB, "{policy:?}");
            }
            other => panic!("{policy:?}: {other:?}"),
        }
        assert_eq!(check(&pool).oom_retries, 0, "{policy:?}");
        {
            sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
            sim.inject_failure(DriverCall::Create, 2, CuResult::UNKNOWN);
            match pool.allocate_tagged_raw(1000, None, 7) {
                Err(Error::Driver { source, .. }) => {
                    assert_eq!(
                        (source.call, source.code),
                        (DriverCall::Create, CuResult::UNKNOWN)
                    );
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(check(&pool).oom_retries, 1);
        }
        let p = pool.allocate_tagged_raw(1000, None, 7).unwrap();
        pool.free_raw(p).unwrap();
        pool.trim().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{policy:?}");
        no_faults(&sim);
    }
}

/// `Pool::free_raw` / `Pool::free_async_raw` refuse a pointer of a sleeping tag
/// (`Error::TagState`, the memory stays live): also when that tag is the only one
/// the pool has ever seen (no tag awake beside it), in both policies.
#[test]
fn a_free_of_the_only_tag_asleep_is_refused() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, sim) = simulated_pool(GIB, PoolConfig::default().with_policy(policy));
        let s = common::stream(&sim);
        let p = pool.allocate_tagged_raw(3 * MIB, None, 9).unwrap();
        pool.sleep(9, SleepMode::Offload).unwrap();
        assert!(
            matches!(pool.free_raw(p), Err(Error::TagState { tag: 9, .. })),
            "{policy:?}"
        );
        assert!(
            matches!(
                pool.free_async_raw(p, s),
                Err(Error::TagState { tag: 9, .. })
            ),
            "{policy:?}"
        );
        assert_eq!(pool.tag_census(9).live_count, 1, "{policy:?}");
        pool.wake(9).unwrap();
        pool.free_raw(p).unwrap();
        assert_eq!(check(&pool).live_count, 0, "{policy:?}");
    }
}
