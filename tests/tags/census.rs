//! Tags (issue 15) on the simulated driver: the census counts each tag from the sizes
//! allocated, on streams too; a tagged allocation on a stream that does not exist is
//! refused.

use crate::common;

use crate::sleep_and_wake::{keeping_pool, pool_with};
use common::{check, no_faults, GIB, MIB};
use flare_package::{ReusePolicy, SleepMode, TagCensus};

/// The census adds up from the sizes: a 3 MiB request maps 4 MiB (2 MiB granules);
/// a free moves its bytes from live to the tag's idle; tag 0 is the rest.
#[test]
fn census_counts_each_tag_from_the_sizes() {
    let (pool, _sim) = keeping_pool(ReusePolicy::BestFit, 16 * GIB);
    let a: Vec<_> = (0..3)
        .map(|_| pool.allocate_tagged_raw(3 * MIB, None, 1).unwrap())
        .collect();
    let b = pool.allocate_tagged_raw(10 * MIB, None, 2).unwrap();
    let u = pool.allocate_raw(MIB).unwrap();
    check(&pool);
    let c1 = pool.tag_census(1);
    assert_eq!(
        c1,
        TagCensus {
            sleeping: false,
            live_count: 3,
            live_bytes: 12 * MIB,
            peak_live_bytes: 12 * MIB,
            idle_bytes: 0,
            physical_bytes: 12 * MIB,
            offloaded_bytes: 0,
            zeroed_bytes: 0,
            zero_memsets: 0,
        }
    );
    assert_eq!(pool.tag_census(2).live_bytes, 10 * MIB);
    let c0 = pool.tag_census(0);
    assert_eq!((c0.live_count, c0.live_bytes), (1, 2 * MIB));
    assert_eq!(c0.physical_bytes, 2 * MIB);
    // A free: tag 1's idle, reused by tag 1 only.
    pool.free_raw(a[0]).unwrap();
    let c1 = pool.tag_census(1);
    assert_eq!(
        (c1.live_bytes, c1.idle_bytes, c1.physical_bytes),
        (8 * MIB, 4 * MIB, 12 * MIB)
    );
    assert_eq!(c1.peak_live_bytes, 12 * MIB);
    let u2 = pool.allocate_raw(3 * MIB).unwrap();
    assert_ne!(u2, a[0], "tag 0 took tag 1's idle mapping");
    let again = pool.allocate_tagged_raw(3 * MIB, None, 1).unwrap();
    assert_eq!(again, a[0], "tag 1 reuses its own idle mapping");
    // A tag never used reads zeros.
    assert_eq!(pool.tag_census(77), TagCensus::default());
    // Physical bytes of the tags add up to the pool's.
    let total: u64 = [0, 1, 2]
        .iter()
        .map(|&t| pool.tag_census(t).physical_bytes)
        .sum();
    assert_eq!(total, pool.snapshot().physical_bytes);
    for p in [a[1], a[2], again, b, u, u2] {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    check(&pool);
    assert_eq!(pool.snapshot().physical_bytes, 0);
}

/// Stream-ordered tagged allocations: on a stream as `allocate_async`, and a tag's
/// stream-ordered free makes the memory the pool's shared idle memory (tag 0's).
#[test]
fn stream_tagged_allocations() {
    let (pool, sim) = pool_with(ReusePolicy::BestFit, 16 * GIB);
    let s = common::stream(&sim);
    let a = pool.allocate_tagged(4 * MIB, Some(s), 4).unwrap();
    assert_eq!(pool.tag_census(4).live_bytes, 4 * MIB);
    sim.launch(s.0, a.ptr(), 4 * MIB);
    drop(a);
    assert_eq!(
        pool.tag_census(4),
        TagCensus {
            peak_live_bytes: 4 * MIB,
            ..TagCensus::default()
        }
    );
    assert_eq!(pool.tag_census(0).idle_bytes, 4 * MIB);
    pool.sleep(4, SleepMode::Discard).unwrap();
    pool.wake(4).unwrap();
    check(&pool);
    no_faults(&sim);
}

/// A stream the simulated driver never made is refused by a tagged stream-ordered
/// allocation as by an untagged one (its capture query fails: `cuStreamGetCaptureInfo`
/// returns `CUDA_ERROR_INVALID_HANDLE` for a handle that is no stream), in every
/// policy, and nothing is allocated.
#[test]
fn a_tagged_allocation_on_a_stream_that_does_not_exist_is_refused() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, _sim) = pool_with(policy, 4 * GIB);
        let bogus = flare_package::Stream(0xdead_0000);
        let untagged = pool.allocate_async_raw(MIB, bogus);
        assert!(untagged.is_err(), "{policy:?}: untagged {untagged:?}");
        for tag in [0, 3] {
            let r = pool.allocate_tagged_raw(MIB, Some(bogus), tag);
            assert!(r.is_err(), "{policy:?}, tag {tag}: {r:?}");
        }
        let s = check(&pool);
        assert_eq!((s.live_count, s.physical_bytes), (0, 0), "{policy:?}");
    }
}
