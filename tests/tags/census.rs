//! Tags (issue 15) on the simulated driver: the census counts each tag from the sizes
//! allocated, on streams too; a tagged allocation on a stream that does not exist is
//! refused. A pending release is in no tag's census, a census reads the same after a
//! sleep and a wake, and tag 0's counts what the other tags do not hold.

use crate::common;

use crate::sleep_and_wake::{keeping_pool, keeping_segments, pool_with};
use common::{check, no_faults, simulated_pool, GIB, MIB};
use flare_package::{CuResult, DriverCall, PoolConfig, ReusePolicy, SleepMode, TagCensus};

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

/// "Pending releases are the pool's, in no tag" (`TagCensus::physical_bytes`). A
/// trim whose `cuMemRelease` the driver refuses leaves the idle 2 MiB mapping pending
/// (unmapped, its handle live): the pool still holds the 2 MiB on the device
/// (`Snapshot::physical_bytes`, `pending_bytes`), but tag 0, which holds every
/// mapping no other tag holds, has nothing live or idle, so its census holds 0 bytes.
#[test]
fn a_pending_release_is_in_no_tags_census() {
    let (pool, sim) = simulated_pool(
        16 * GIB,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default()
        },
    );
    let p = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(p).unwrap();
    assert_eq!(pool.tag_census(0).physical_bytes, 2 * MIB, "idle: tag 0's");
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    let _ = pool.trim();
    let snap = check(&pool);
    assert_eq!(
        (snap.physical_bytes, snap.pending_bytes),
        (2 * MIB, 2 * MIB)
    );
    let c = pool.tag_census(0);
    assert_eq!((c.live_bytes, c.idle_bytes, c.physical_bytes), (0, 0, 0));
}

/// A tag's census reads the same after a sleep and a wake in segment mode: its 2 MiB
/// handle holds one live 1024-byte block (1000 bytes asked, 512-byte steps), the
/// rest idle (`idle_bytes` 2 MiB - 1024), and the wake books the block live again.
#[test]
fn a_tags_census_reads_the_same_after_a_sleep_and_a_wake() {
    let (pool, _sim) = keeping_segments(16 * GIB);
    let _p = pool.allocate_tagged_raw(1000, None, 7).unwrap();
    let c = pool.tag_census(7);
    assert_eq!((c.idle_bytes, c.physical_bytes), (2 * MIB - 1024, 2 * MIB));
    pool.sleep(7, SleepMode::Offload).unwrap();
    assert_eq!(pool.tag_census(7).physical_bytes, 0);
    pool.wake(7).unwrap();
    let c = pool.tag_census(7);
    assert_eq!((c.idle_bytes, c.physical_bytes), (2 * MIB - 1024, 2 * MIB));
    assert!(!c.sleeping);
    check(&pool);
}

/// Tag 0's census counts what the pool holds less the other tags': with one
/// untagged live 2 MiB mapping, and tag 7's 2 MiB mapping asleep (discarded: its
/// bytes are the pool's `sleeping_bytes`, none held), tag 0's live bytes are its
/// own 2 MiB (4 MiB live in the pool, less tag 7's 2 MiB), as are its physical
/// bytes (tag 7 holds none).
#[test]
fn tag_zeros_census_counts_its_live_mapping() {
    let (pool, _sim) = simulated_pool(GIB, PoolConfig::default());
    let _p = pool.allocate_raw(2 * MIB).unwrap();
    let _q = pool.allocate_tagged_raw(2 * MIB, None, 7).unwrap();
    pool.sleep(7, SleepMode::Discard).unwrap();
    let s = check(&pool);
    assert_eq!((s.sleeping_bytes, s.sleeping_held_bytes), (2 * MIB, 0));
    let c = pool.tag_census(0);
    assert_eq!(
        (c.live_count, c.live_bytes, c.physical_bytes),
        (1, 2 * MIB, 2 * MIB)
    );
}
