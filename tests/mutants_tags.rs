//! Issue 16: contracts of tags (sleep and wake, `docs/ARCHITECTURE.md` "Tags") that a
//! mutation run of `src/pool/tags.rs` found unpinned. Each test names the contract it
//! checks; the expected values are reasoned from it and from the simulated driver's
//! documented behaviour, not copied from a run.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use common::{check, no_faults, simulated_pool, GIB, MIB};
use flare_package::driver::sim::{SimDriver, SimStreamCall};
use flare_package::{CuResult, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SleepMode};
use std::sync::Arc;

/// A segment-mode pool that keeps what is freed (release threshold `u64::MAX`).
fn keeping_segments(capacity: u64) -> (Pool, Arc<SimDriver>) {
    simulated_pool(
        capacity,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default().with_policy(ReusePolicy::Segments)
        },
    )
}

/// A tag's block freed on a stream whose work is still queued waits, out of every
/// index, for the freeing stream's fence (`Snapshot::event_wait_bytes`). A sleep
/// synchronizes the device first, so that block is idle whatever the fence query
/// then says: with the query refused, the sleep still takes the block back into its
/// heap and nothing is left waiting (`event_wait_bytes` 0), and the tag sleeps and
/// wakes with its other block's bytes.
#[test]
fn a_sleep_takes_back_a_block_whose_fence_query_failed() {
    let (pool, sim) = keeping_segments(16 * GIB);
    let s = common::stream(&sim);
    let kept = pool.allocate_tagged_raw(1000, None, 7).unwrap();
    assert_eq!(sim.write(kept, &[5; 1000]), CuResult::SUCCESS);
    let freed = pool.allocate_tagged_raw(1000, Some(s), 7).unwrap();
    assert_eq!(sim.launch(s.0, freed, 1000), CuResult::SUCCESS);
    pool.free_async_raw(freed, s).unwrap();
    // Blocks are 512-byte aligned (ARCHITECTURE.md "Segments"): 1000 -> 1024.
    assert_eq!(pool.snapshot().event_wait_bytes, 1024);
    sim.inject_stream_failure(SimStreamCall::EventQuery, 1, CuResult::UNKNOWN);
    pool.sleep(7, SleepMode::Offload).unwrap();
    let snap = check(&pool);
    assert_eq!(
        snap.event_wait_bytes, 0,
        "nothing waits once the tag sleeps"
    );
    assert_eq!(pool.tag_census(7).physical_bytes, 0);
    pool.wake(7).unwrap();
    assert_eq!(sim.read(kept, 1000).unwrap(), vec![5; 1000]);
    pool.free_raw(kept).unwrap();
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.physical_bytes, snap.event_wait_bytes), (0, 0));
    no_faults(&sim);
}

/// A tag's heap whose growth borrowed two lone free handles sleeps. The two 2 MiB
/// blocks freed on a stream with no queued work go back to the tag's heap once
/// their fence completes (a tag's block never waits in a stream's bucket); the next
/// 4 MiB request of the tag lends both handles, alone in their free blocks (their
/// neighbours live), to the heap's end and creates none (stitching, as an untagged
/// heap does). The sleep releases every handle of the heap, so none is left lent
/// (`segment_handles_lent` and `segment_lent_bytes` 0, as with nothing mapped), and
/// the wake maps the live blocks' bytes back.
#[test]
fn a_sleep_releases_lent_handles() {
    let (pool, sim) = keeping_segments(GIB);
    let s = common::stream(&sim);
    let w: Vec<_> = (0..4)
        .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 3).unwrap())
        .collect();
    let n1 = pool.allocate_tagged_raw(4 * MIB, None, 3).unwrap();
    pool.free_async_raw(w[0], s).unwrap();
    pool.free_async_raw(w[2], s).unwrap();
    let created = sim.call_count(DriverCall::Create);
    let n2 = pool.allocate_tagged_raw(4 * MIB, None, 3).unwrap();
    assert_eq!(sim.call_count(DriverCall::Create), created, "no new handle");
    let s = check(&pool);
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (2, 4 * MIB));
    assert_eq!(sim.write(n2, &[9; 4096]), CuResult::SUCCESS);
    pool.sleep(3, SleepMode::Offload).unwrap();
    let s = check(&pool);
    assert_eq!(
        (
            s.segment_handles,
            s.segment_handles_lent,
            s.segment_lent_bytes
        ),
        (0, 0, 0)
    );
    assert_eq!(s.physical_bytes, 0);
    pool.wake(3).unwrap();
    check(&pool);
    assert_eq!(sim.read(n2, 4096).unwrap(), vec![9; 4096]);
    for p in [w[1], w[3], n1, n2] {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}

/// A block a tag frees with the synchronous `free` waits whole in the tag's
/// `TagBlocks` bucket, "taken back only by the tag's synchronous allocations"
/// (`docs/ARCHITECTURE.md`, "Tags"): work queued before the free may still touch
/// it. With the tag's only handle (2 MiB, the granularity) full of two 1 MiB
/// blocks and one of them freed so, the tag's stream-ordered 1 MiB allocation grows
/// the heap by a new 2 MiB handle instead (the simulated driver records no hand-off
/// of memory another stream's work touches); the tag's synchronous allocations
/// then carve the new handle's other half, and next take that block back.
#[test]
fn a_tags_stream_allocation_never_takes_its_sync_freed_block() {
    let (pool, sim) = keeping_segments(GIB);
    let (s1, s2) = (common::stream(&sim), common::stream(&sim));
    let a = pool.allocate_tagged_raw(MIB, None, 4).unwrap();
    let _neighbour = pool.allocate_tagged_raw(MIB, None, 4).unwrap();
    assert_eq!(pool.snapshot().segment_handles, 1);
    assert_eq!(sim.launch(s2.0, a, MIB), CuResult::SUCCESS);
    pool.free_raw(a).unwrap();
    let b = pool.allocate_tagged_raw(MIB, Some(s1), 4).unwrap();
    assert_ne!(b, a, "the stream allocation took the sync-freed block");
    assert_eq!(pool.snapshot().segment_handles, 2);
    no_faults(&sim);
    let c = pool.allocate_tagged_raw(MIB, None, 4).unwrap();
    assert_eq!(c, b + MIB, "carved from the new handle");
    let d = pool.allocate_tagged_raw(MIB, None, 4).unwrap();
    assert_eq!(
        d, a,
        "the tag's synchronous allocation takes its block back"
    );
    assert_eq!(sim.stream_complete(s2.0), CuResult::SUCCESS);
    check(&pool);
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

/// A sleep of tag T releases T's memory and no other's: in a pool that keeps what
/// is freed, a stream heap's wholly free handle (a block freed on its stream, back
/// in the heap's free space) and other tags' heaps, wholly free too (their blocks
/// freed on a stream go back to their heap once the fence completes), stay mapped,
/// whatever the number of tags made before T (which decides where the pool books
/// T's heaps).
#[test]
fn a_sleep_releases_no_other_heap() {
    for before in 0..16u32 {
        let (pool, sim) = keeping_segments(GIB);
        let s = common::stream(&sim);
        let p = pool.allocate_async_raw(4096, s).unwrap();
        pool.free_async_raw(p, s).unwrap();
        for i in 0..before {
            let q = pool.allocate_tagged_raw(4096, None, 100 + i).unwrap();
            pool.free_async_raw(q, s).unwrap();
        }
        let t = pool.allocate_tagged_raw(4096, None, 7).unwrap();
        let snap = check(&pool);
        // One 2 MiB handle (the granularity) per heap: the stream's, each tag's; all
        // free but tag 7's block.
        assert_eq!(
            snap.physical_bytes,
            u64::from(before + 2) * 2 * MIB,
            "{before}"
        );
        assert_eq!(
            snap.block_free_bytes,
            snap.physical_bytes - 4096,
            "{before}"
        );
        pool.sleep(7, SleepMode::Discard).unwrap();
        let after = check(&pool);
        assert_eq!(
            after.physical_bytes,
            snap.physical_bytes - 2 * MIB,
            "{before}"
        );
        assert_eq!(pool.tag_census(0).physical_bytes, 2 * MIB, "{before}");
        pool.wake(7).unwrap();
        pool.free_raw(t).unwrap();
        no_faults(&sim);
    }
}

/// The heap of [`a_sleep_releases_lent_handles`] (handles in address order: w1, w3,
/// n1, then the two lent ones at the heap's end). The sleep unmaps each handle, a
/// lent one's retired mapping first; the first lent handle's own unmap is refused
/// (the fifth unmap) after its retired mapping is gone, and mapping n1 back is
/// refused too: the sleep goes on ("the undo was refused as well"), the error
/// returned and the tag asleep. The refused unmap is tried again, of the handle's
/// own mapping only (the retired one is gone: unmapping it again would be a wasted
/// call), and succeeds: 8 unmaps in all (the 7 mappings once each, the refused one
/// twice); every handle is released, none pending, nothing mapped, and the wake
/// restores the bytes.
#[test]
fn a_sleep_whose_lent_handle_unmap_and_undo_fail() {
    let (pool, sim) = keeping_segments(GIB);
    let s = common::stream(&sim);
    let w: Vec<_> = (0..4)
        .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 3).unwrap())
        .collect();
    let n1 = pool.allocate_tagged_raw(4 * MIB, None, 3).unwrap();
    pool.free_async_raw(w[0], s).unwrap();
    pool.free_async_raw(w[2], s).unwrap();
    let n2 = pool.allocate_tagged_raw(4 * MIB, None, 3).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.segment_handles, snap.segment_handles_lent), (5, 2));
    assert_eq!(sim.write(n2, &[9; 4096]), CuResult::SUCCESS);
    sim.inject_failure(DriverCall::Unmap, 5, CuResult::UNKNOWN);
    sim.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    let unmaps = sim.call_count(DriverCall::Unmap);
    match pool.sleep(3, SleepMode::Offload) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Unmap),
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.call_count(DriverCall::Unmap) - unmaps, 8);
    sim.clear_failures();
    assert!(pool.tag_census(3).sleeping);
    let snap = check(&pool);
    assert_eq!((snap.pending_count, snap.physical_bytes), (0, 0));
    assert_eq!((snap.segment_handles, snap.segment_handles_lent), (0, 0));
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (0, 0), "{d:?}");
    pool.wake(3).unwrap();
    assert_eq!(sim.read(n2, 4096).unwrap(), vec![9; 4096]);
    for p in [w[1], w[3], n1, n2] {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}

/// A wake (whole mappings, best-fit) whose first map is refused, and whose undo's
/// release of the handle it had just created is refused too: the driver keeps that
/// handle, so the pool books it as the sleeping allocation's kept handle
/// (`sleeping_held_count` 1, `sleeping_held_bytes` and `physical_bytes` 2 MiB, as
/// the driver's one handle), the tag asleep; the next wake maps it and restores the
/// bytes.
#[test]
fn a_wake_whose_undo_release_is_refused_keeps_the_handle() {
    let (pool, sim) = simulated_pool(GIB, PoolConfig::default().with_policy(ReusePolicy::BestFit));
    let p = pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap();
    assert_eq!(sim.write(p, &[7; 4096]), CuResult::SUCCESS);
    pool.sleep(1, SleepMode::Offload).unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    sim.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    assert!(pool.wake(1).is_err());
    sim.clear_failures();
    assert!(pool.tag_census(1).sleeping);
    let s = check(&pool);
    assert_eq!(
        (
            s.sleeping_count,
            s.sleeping_held_count,
            s.sleeping_held_bytes
        ),
        (1, 1, 2 * MIB)
    );
    assert_eq!((s.sleeping_bytes, s.physical_bytes), (0, 2 * MIB));
    assert_eq!(sim.state().handles, 1);
    let creates = sim.call_count(DriverCall::Create);
    pool.wake(1).unwrap();
    assert_eq!(
        sim.call_count(DriverCall::Create),
        creates,
        "the kept handle"
    );
    assert_eq!(sim.read(p, 4096).unwrap(), vec![7; 4096]);
    pool.free_raw(p).unwrap();
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}
