//! Issue 16: contracts of tags (sleep and wake, `docs/ARCHITECTURE.md` "Tags") that a
//! mutation run of `src/pool/tags.rs` found unpinned. Each test names the contract it
//! checks; the expected values are reasoned from it and from the simulated driver's
//! documented behaviour, not copied from a run.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use common::{assert_driver_empty, check, no_faults, simulated_pool, GIB, MIB};
use flare_package::driver::sim::{SimDriver, SimStreamCall};
use flare_package::{
    CuResult, DevicePtr, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SleepMode, Stream,
};
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

/// Tag 3's heap of [`a_sleep_releases_lent_handles`]: four 2 MiB blocks `w` and a
/// 4 MiB `n1`, then `w[0]` and `w[2]` freed on a stream with no queued work (back
/// in the heap once their fence completes), and a 4 MiB `n2` whose growth lends
/// those two lone handles to the heap's end. Returns `(w, n1, n2)`.
fn lent_tag_heap(pool: &Pool, sim: &SimDriver) -> (Vec<DevicePtr>, DevicePtr, DevicePtr) {
    let s = common::stream(sim);
    let w: Vec<_> = (0..4)
        .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 3).unwrap())
        .collect();
    let n1 = pool.allocate_tagged_raw(4 * MIB, None, 3).unwrap();
    pool.free_async_raw(w[0], s).unwrap();
    pool.free_async_raw(w[2], s).unwrap();
    let n2 = pool.allocate_tagged_raw(4 * MIB, None, 3).unwrap();
    (w, n1, n2)
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
    let (w, n1, n2) = lent_tag_heap(&pool, &sim);
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

/// A tag's synchronous allocation on a full device (segment mode, 2 MiB: one
/// handle of the tag's heap). Two adjacent 512 KiB blocks the tag freed with the
/// synchronous `free` wait whole in its `TagBlocks` bucket, each too small for a
/// 1 MiB request, and the rest of the handle is a live 1 MiB block: the growth
/// fails out of memory; the release made for the retry synchronizes and puts the
/// two blocks back in the heap, where they coalesce ("back in the heap after a
/// release point's device synchronize"), and the request is carved from them, at
/// the first one's address, with no new handle (`oom_retries` 1).
#[test]
fn a_tags_retry_after_out_of_memory_carves_its_freed_blocks() {
    let (pool, sim) = keeping_segments(2 * MIB);
    let a = pool.allocate_tagged_raw(512 << 10, None, 2).unwrap();
    let b = pool.allocate_tagged_raw(512 << 10, None, 2).unwrap();
    let c = pool.allocate_tagged_raw(MIB, None, 2).unwrap();
    assert_eq!(b, a + (512 << 10), "carved in order");
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    let creates = sim.call_count(DriverCall::Create);
    let q = pool.allocate_tagged_raw(MIB, None, 2).unwrap();
    assert_eq!(q, a);
    assert_eq!(
        sim.call_count(DriverCall::Create),
        creates + 1,
        "one refused"
    );
    let snap = check(&pool);
    assert_eq!(snap.oom_retries, 1);
    assert_eq!((snap.segment_handles, snap.physical_bytes), (1, 2 * MIB));
    let census = pool.tag_census(2);
    assert_eq!((census.live_count, census.live_bytes), (2, 2 * MIB));
    pool.free_raw(q).unwrap();
    pool.free_raw(c).unwrap();
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}

/// The heap of [`a_sleep_releases_lent_handles`] (handles in address order: w1, w3,
/// n1, then the two lent ones, L1 and L2, at the heap's end; unmaps in that order,
/// a lent handle's retired mapping before its own). One unmap refused, every
/// undo mapped back: the sleep fails, the tag awake and usable ("a failed unmap
/// maps what was already unmapped back ... the tag awake"). A lent handle whose
/// retired mapping the sleep already unmapped is no longer lent (that mapping is
/// gone, and is not mapped again): refused at L1's own unmap (the fifth), L1 is
/// no longer lent and L2 still is; at L2's retired mapping (the sixth), L1 no
/// longer is and L2 still is; at L2's own unmap (the seventh), neither is. The
/// handles stay mapped (5), the bytes are kept, and the books match the driver's
/// mappings (`check`).
#[test]
fn a_sleep_undone_after_unmapping_a_retired_mapping() {
    for (nth, lent) in [(5u32, 1u64), (6, 1), (7, 0)] {
        let (pool, sim) = keeping_segments(GIB);
        let (w, n1, n2) = lent_tag_heap(&pool, &sim);
        assert_eq!(check(&pool).segment_handles_lent, 2);
        assert_eq!(sim.write(n2, &[9; 4096]), CuResult::SUCCESS);
        assert_eq!(sim.write(n2 + 2 * MIB, &[8; 4096]), CuResult::SUCCESS);
        sim.inject_failure(DriverCall::Unmap, nth, CuResult::UNKNOWN);
        let maps = sim.call_count(DriverCall::Map);
        match pool.sleep(3, SleepMode::Offload) {
            Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Unmap),
            other => panic!("{nth}: {other:?}"),
        }
        assert_eq!(sim.pending_failures(), 0, "{nth}");
        // Every handle unmapped before the refused one is mapped back.
        let unmapped_before = if nth == 5 { 3 } else { 4 };
        assert_eq!(
            sim.call_count(DriverCall::Map) - maps,
            unmapped_before,
            "{nth}"
        );
        assert!(!pool.tag_census(3).sleeping, "{nth}");
        assert_eq!(sim.host_bytes(), 0, "{nth}: the host buffer is freed");
        let snap = check(&pool);
        assert_eq!(
            (
                snap.segment_handles,
                snap.segment_handles_lent,
                snap.segment_lent_bytes
            ),
            (5, lent, lent * 2 * MIB),
            "{nth}"
        );
        assert_eq!(snap.unmap_failures, 1, "{nth}");
        assert_eq!(sim.state().mappings, 5 + lent, "{nth}");
        assert_eq!(sim.read(n2, 4096).unwrap(), vec![9; 4096], "{nth}");
        pool.sleep(3, SleepMode::Offload).unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{nth}");
        pool.wake(3).unwrap();
        assert_eq!(sim.read(n2, 4096).unwrap(), vec![9; 4096], "{nth}");
        assert_eq!(sim.read(n2 + 2 * MIB, 4096).unwrap(), vec![8; 4096]);
        for p in [w[1], w[3], n1, n2] {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{nth}");
        let d = sim.state();
        assert_eq!((d.handles, d.mappings), (0, 0), "{nth}: {d:?}");
        no_faults(&sim);
    }
}

/// The same heap. w3's unmap (the second) is refused, and mapping w1 back too: "the
/// undo was refused as well: the segments go to sleep after all". Unmapping again
/// w3 and what comes after it, w3's own unmap is refused again and L1's retired
/// mapping's unmap is refused: each such handle "is left pending, still mapped
/// (released at the next release point or wake)", not released by the sleep (3
/// releases: w1, n1, L2). The sleep returns the first error, the tag asleep with
/// no physical bytes of its own; the two pending handles (4 MiB) are the pool's,
/// held by the driver with their three mappings (w3's, L1's and L1's retired
/// one). The wake releases them first, then maps 5 new handles and restores the
/// bytes; once all is freed and trimmed the driver holds nothing.
#[test]
fn a_sleep_whose_second_unmaps_are_refused_leaves_handles_pending() {
    let (pool, sim) = keeping_segments(GIB);
    let (w, n1, n2) = lent_tag_heap(&pool, &sim);
    assert_eq!(check(&pool).segment_handles_lent, 2);
    assert_eq!(sim.write(w[1], &[1; 4096]), CuResult::SUCCESS);
    assert_eq!(sim.write(n1, &[2; 4096]), CuResult::SUCCESS);
    assert_eq!(sim.write(n2, &[9; 4096]), CuResult::SUCCESS);
    for nth in [2, 3, 5] {
        sim.inject_failure(DriverCall::Unmap, nth, CuResult::UNKNOWN);
    }
    sim.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    let (unmaps, releases) = (
        sim.call_count(DriverCall::Unmap),
        sim.call_count(DriverCall::Release),
    );
    match pool.sleep(3, SleepMode::Offload) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Unmap),
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.pending_failures(), 0);
    assert_eq!(sim.call_count(DriverCall::Unmap) - unmaps, 7);
    assert_eq!(sim.call_count(DriverCall::Release) - releases, 3);
    let c = pool.tag_census(3);
    assert!(c.sleeping);
    assert_eq!(c.physical_bytes, 0);
    // Not `check`: its bound counts at most one mapping per pending leftover, and
    // L1's holds two (its own and its retired one).
    let snap = pool.snapshot();
    snap.check_invariants().unwrap();
    assert_eq!(snap.physical_bytes, sim.state().physical_bytes);
    assert_eq!((snap.pending_count, snap.pending_bytes), (2, 4 * MIB));
    assert_eq!(snap.physical_bytes, 4 * MIB);
    assert_eq!((snap.segment_handles, snap.segment_handles_lent), (0, 0));
    assert_eq!((snap.unmap_failures, snap.map_failures), (3, 1));
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (2, 3), "{d:?}");
    pool.wake(3).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.pending_count, snap.segment_handles), (0, 5));
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (5, 5), "{d:?}");
    assert_eq!(sim.read(w[1], 4096).unwrap(), vec![1; 4096]);
    assert_eq!(sim.read(n1, 4096).unwrap(), vec![2; 4096]);
    assert_eq!(sim.read(n2, 4096).unwrap(), vec![9; 4096]);
    for p in [w[1], w[3], n1, n2] {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (0, 0), "{d:?}");
    no_faults(&sim);
}

/// Two whole mappings of a tag (best-fit), p0 below p1. The sleep's unmap of p1 is
/// refused, so p0 is mapped back; its `cuMemSetAccess` is refused and so is the
/// unmap that would undo that map: the mapping must stay, and access is granted
/// again, "twice at most" (`map_back`, `grant_again`); it is booked awake either
/// way. Granted at the first retry: p0 has the device's access (2 set-access
/// calls); at the second: 3 calls; never: 3 calls and no access. The sleep fails,
/// the tag awake, its bytes kept; the next sleep and wake work (and grant access).
#[test]
fn a_sleep_whose_map_back_must_stay_grants_access_again() {
    for refused in 1..=3u32 {
        let (pool, sim) =
            simulated_pool(GIB, PoolConfig::default().with_policy(ReusePolicy::BestFit));
        let mut ptrs: Vec<_> = (0..2)
            .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap())
            .collect();
        ptrs.sort_unstable();
        let (p0, p1) = (ptrs[0], ptrs[1]);
        assert_eq!(sim.write(p0, &[3; 4096]), CuResult::SUCCESS);
        assert_eq!(sim.write(p1, &[4; 4096]), CuResult::SUCCESS);
        sim.inject_failure(DriverCall::Unmap, 2, CuResult::UNKNOWN);
        sim.inject_failure(DriverCall::Unmap, 3, CuResult::UNKNOWN);
        for nth in 1..=refused {
            sim.inject_failure(DriverCall::SetAccess, nth, CuResult::UNKNOWN);
        }
        let access = sim.call_count(DriverCall::SetAccess);
        match pool.sleep(1, SleepMode::Discard) {
            Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Unmap),
            other => panic!("{refused}: {other:?}"),
        }
        assert_eq!(sim.pending_failures(), 0, "{refused}");
        let calls = if refused == 1 { 2 } else { 3 };
        assert_eq!(
            sim.call_count(DriverCall::SetAccess) - access,
            calls,
            "{refused}"
        );
        let granted = if refused == 3 { vec![] } else { vec![0] };
        assert_eq!(sim.access_of(p0), granted, "{refused}");
        assert_eq!(sim.access_of(p1), vec![0], "{refused}");
        assert!(!pool.tag_census(1).sleeping, "{refused}");
        let snap = check(&pool);
        assert_eq!(
            (snap.unmap_failures, snap.access_failures),
            (2, u64::from(refused)),
            "{refused}"
        );
        assert_eq!(
            (
                snap.live_mapped_bytes,
                snap.physical_bytes,
                snap.sleeping_count
            ),
            (4 * MIB, 4 * MIB, 0),
            "{refused}"
        );
        // A kernel reads only what is mapped with access (the simulated `read`).
        if refused < 3 {
            assert_eq!(sim.read(p0, 4096).unwrap(), vec![3; 4096], "{refused}");
        } else {
            assert_eq!(sim.read(p0, 4096), Err(CuResult::INVALID_VALUE));
        }
        assert_eq!(sim.read(p1, 4096).unwrap(), vec![4; 4096], "{refused}");
        pool.sleep(1, SleepMode::Discard).unwrap();
        pool.wake(1).unwrap();
        assert_eq!(sim.access_of(p0), vec![0], "{refused}");
        for p in ptrs {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{refused}");
    }
}

/// Three whole mappings of a tag (best-fit, 2 MiB each, in address order), asleep.
/// A wake whose step on the second one is refused (its bytes' copy back in offload
/// mode, its `cuMemSetAccess` in discard mode) and whose undo of that mapping (the
/// unmap) is refused too: "a mapping whose undo the driver refuses stays mapped
/// (awake, counted), and the next wake skips it"; the mapping that must stay gets
/// access again, and its bytes copied back (`grant_again`), so it holds its
/// contents in offload mode. The first one is undone (no access, its new handle
/// released), the third never touched. The wake fails, the tag asleep with two
/// allocations, its host copy kept; the next wake maps only those two.
#[test]
fn a_wake_whose_undo_unmap_is_refused_keeps_that_mapping_awake() {
    for mode in [SleepMode::Offload, SleepMode::Discard] {
        let (pool, sim) =
            simulated_pool(GIB, PoolConfig::default().with_policy(ReusePolicy::BestFit));
        let mut ptrs: Vec<_> = (0..3)
            .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap())
            .collect();
        ptrs.sort_unstable();
        for (i, &p) in ptrs.iter().enumerate() {
            assert_eq!(sim.write(p, &[i as u8 + 1; 4096]), CuResult::SUCCESS);
        }
        pool.sleep(1, mode).unwrap();
        let step = match mode {
            SleepMode::Offload => DriverCall::MemcpyHtoD,
            SleepMode::Discard => DriverCall::SetAccess,
        };
        sim.inject_failure(step, 2, CuResult::UNKNOWN);
        sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
        let (steps, creates, releases) = (
            sim.call_count(step),
            sim.call_count(DriverCall::Create),
            sim.call_count(DriverCall::Release),
        );
        match pool.wake(1) {
            Err(Error::Driver { source, .. }) => assert_eq!(source.call, step, "{mode:?}"),
            other => panic!("{mode:?}: {other:?}"),
        }
        assert_eq!(sim.pending_failures(), 0, "{mode:?}");
        // The first two, the second refused and done again.
        assert_eq!(sim.call_count(step) - steps, 3, "{mode:?}");
        assert_eq!(sim.call_count(DriverCall::Create) - creates, 2, "{mode:?}");
        assert_eq!(
            sim.call_count(DriverCall::Release) - releases,
            1,
            "{mode:?}"
        );
        assert!(pool.tag_census(1).sleeping, "{mode:?}");
        let snap = check(&pool);
        assert_eq!(
            (snap.sleeping_count, snap.sleeping_bytes),
            (2, 4 * MIB),
            "{mode:?}"
        );
        assert_eq!(
            (snap.live_mapped_bytes, snap.physical_bytes),
            (2 * MIB, 2 * MIB),
            "{mode:?}"
        );
        assert_eq!(pool.tag_census(1).physical_bytes, 2 * MIB, "{mode:?}");
        assert_eq!(snap.unmap_failures, 1, "{mode:?}");
        assert_eq!(sim.access_of(ptrs[0]), Vec::<i32>::new(), "{mode:?}");
        assert_eq!(sim.access_of(ptrs[1]), vec![0], "{mode:?}");
        let offload = mode == SleepMode::Offload;
        assert_eq!(sim.host_bytes(), if offload { 6 * MIB } else { 0 });
        if offload {
            assert_eq!(sim.read(ptrs[1], 4096).unwrap(), vec![2; 4096]);
        }
        let creates = sim.call_count(DriverCall::Create);
        pool.wake(1).unwrap();
        assert_eq!(sim.call_count(DriverCall::Create) - creates, 2, "{mode:?}");
        let snap = check(&pool);
        assert_eq!((snap.sleeping_count, snap.physical_bytes), (0, 6 * MIB));
        if offload {
            for (i, &p) in ptrs.iter().enumerate() {
                assert_eq!(sim.read(p, 4096).unwrap(), vec![i as u8 + 1; 4096]);
            }
        }
        for p in ptrs {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{mode:?}");
    }
}

/// A sleep whose release of the first whole mapping's handle is refused succeeds,
/// keeping that handle ("mapped again at wake": `sleeping_held_count` 1). A wake
/// whose `cuMemMap` of that kept handle is refused undoes nothing else and
/// releases nothing (the handle is the sleeping allocation's, not one this wake
/// created): the tag asleep, the handle still held and booked. The next wake maps
/// it again and creates handles for the other two only.
#[test]
fn a_wake_whose_map_of_a_kept_handle_is_refused() {
    let (pool, sim) = simulated_pool(GIB, PoolConfig::default().with_policy(ReusePolicy::BestFit));
    let mut ptrs: Vec<_> = (0..3)
        .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap())
        .collect();
    ptrs.sort_unstable();
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.write(p, &[i as u8 + 1; 4096]), CuResult::SUCCESS);
    }
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    pool.sleep(1, SleepMode::Offload).unwrap();
    assert_eq!(check(&pool).sleeping_held_count, 1);
    sim.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    let (creates, releases) = (
        sim.call_count(DriverCall::Create),
        sim.call_count(DriverCall::Release),
    );
    match pool.wake(1) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Map),
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.call_count(DriverCall::Create), creates);
    assert_eq!(sim.call_count(DriverCall::Release), releases);
    assert!(pool.tag_census(1).sleeping);
    let snap = check(&pool);
    assert_eq!(
        (
            snap.sleeping_count,
            snap.sleeping_held_count,
            snap.sleeping_held_bytes
        ),
        (3, 1, 2 * MIB)
    );
    assert_eq!((snap.physical_bytes, snap.map_failures), (2 * MIB, 1));
    assert_eq!(sim.state().handles, 1);
    pool.wake(1).unwrap();
    assert_eq!(sim.call_count(DriverCall::Create) - creates, 2);
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.read(p, 4096).unwrap(), vec![i as u8 + 1; 4096]);
    }
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}

/// The same three whole mappings, the first one's handle kept at sleep. A wake
/// whose third `cuMemCreate` is refused (the third mapping's: the first reuses its
/// kept handle) undoes the first two, latest first: the second's new handle, whose
/// release is refused, "the driver keeps it" and it becomes that sleeping
/// allocation's kept handle; the first's kept handle is unmapped, not released
/// (the wake did not create it). The tag asleep with two kept handles
/// (`sleeping_held_count` 2, 4 MiB, counted in its census's physical bytes) and
/// one released (`sleeping_bytes` 2 MiB). The next wake creates one handle.
#[test]
fn a_wake_undone_keeps_the_handles_the_driver_keeps() {
    let (pool, sim) = simulated_pool(GIB, PoolConfig::default().with_policy(ReusePolicy::BestFit));
    let mut ptrs: Vec<_> = (0..3)
        .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap())
        .collect();
    ptrs.sort_unstable();
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.write(p, &[i as u8 + 1; 4096]), CuResult::SUCCESS);
    }
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    pool.sleep(1, SleepMode::Offload).unwrap();
    sim.inject_failure(DriverCall::Create, 2, CuResult::UNKNOWN);
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    let (releases, unmaps) = (
        sim.call_count(DriverCall::Release),
        sim.call_count(DriverCall::Unmap),
    );
    match pool.wake(1) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Create),
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.pending_failures(), 0);
    assert_eq!(sim.call_count(DriverCall::Unmap) - unmaps, 2);
    assert_eq!(sim.call_count(DriverCall::Release) - releases, 1);
    let c = pool.tag_census(1);
    assert!(c.sleeping);
    assert_eq!(c.physical_bytes, 4 * MIB);
    let snap = check(&pool);
    assert_eq!(
        (
            snap.sleeping_count,
            snap.sleeping_held_count,
            snap.sleeping_held_bytes,
            snap.sleeping_bytes
        ),
        (3, 2, 4 * MIB, 2 * MIB)
    );
    assert_eq!((snap.physical_bytes, snap.live_mapped_bytes), (4 * MIB, 0));
    assert_eq!((snap.create_failures, snap.release_failures), (1, 2));
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (2, 0), "{d:?}");
    let creates = sim.call_count(DriverCall::Create);
    pool.wake(1).unwrap();
    assert_eq!(sim.call_count(DriverCall::Create) - creates, 1);
    let snap = check(&pool);
    assert_eq!(
        (snap.sleeping_held_count, snap.physical_bytes),
        (0, 6 * MIB)
    );
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.read(p, 4096).unwrap(), vec![i as u8 + 1; 4096]);
    }
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}

/// A tag's heap of three 2 MiB handles (segment mode), asleep. A wake whose second
/// `cuMemCreate` is refused undoes the first handle it mapped: unmapped, and its
/// release refused, so "what the driver refuses to undo is left pending" (the
/// pool's, in no tag: `pending_bytes` 2 MiB, the tag's census 0). The tag asleep;
/// the next wake releases the pending handle first, then maps three new ones and
/// restores the bytes.
#[test]
fn a_segment_wake_whose_undo_release_is_refused_leaves_it_pending() {
    let (pool, sim) = keeping_segments(GIB);
    let ptrs: Vec<_> = (0..3)
        .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap())
        .collect();
    assert_eq!(check(&pool).segment_handles, 3);
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.write(p, &[i as u8 + 1; 4096]), CuResult::SUCCESS);
    }
    pool.sleep(1, SleepMode::Offload).unwrap();
    sim.inject_failure(DriverCall::Create, 2, CuResult::UNKNOWN);
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    match pool.wake(1) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Create),
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.pending_failures(), 0);
    let c = pool.tag_census(1);
    assert!(c.sleeping);
    assert_eq!(c.physical_bytes, 0);
    let snap = check(&pool);
    assert_eq!((snap.pending_count, snap.pending_bytes), (1, 2 * MIB));
    assert_eq!((snap.physical_bytes, snap.segment_handles), (2 * MIB, 0));
    assert_eq!((snap.create_failures, snap.release_failures), (1, 1));
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (1, 0), "{d:?}");
    pool.wake(1).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.pending_count, snap.segment_handles), (0, 3));
    assert_eq!(snap.physical_bytes, 6 * MIB);
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.read(p, 4096).unwrap(), vec![i as u8 + 1; 4096]);
    }
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}

/// Blocks of a tag's heap freed during a capture wait "in a capture bucket of its
/// own that nobody takes from" (the capture's graph may replay into them), released
/// with the capture's memory (`capture_held_bytes` while they wait). Two blocks (the
/// tag's one 2 MiB handle) freed in one capture both wait there: the tag's next
/// block on the captured stream takes neither (a second handle); when the scope
/// finishes both are released back to the tag's heap (nothing held for the
/// capture), and a trim then releases their wholly free handle.
#[test]
fn two_tag_blocks_freed_in_one_capture_wait_for_it() {
    use flare_package::driver::sim::CaptureMode;
    let (pool, sim) = keeping_segments(GIB);
    let s = common::stream(&sim);
    let a = pool.allocate_tagged_raw(MIB, None, 2).unwrap();
    let b = pool.allocate_tagged_raw(MIB, None, 2).unwrap();
    assert_eq!(check(&pool).segment_handles, 1);
    pool.retention_begin().unwrap();
    assert_eq!(
        sim.stream_begin_capture(s.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    pool.free_async_raw(a, s).unwrap();
    pool.free_async_raw(b, s).unwrap();
    assert_eq!(check(&pool).capture_held_bytes, 2 * MIB);
    let c = pool.allocate_tagged_raw(MIB, Some(s), 2).unwrap();
    assert!(c != a && c != b, "a block freed in the capture was taken");
    assert_eq!(check(&pool).segment_handles, 2);
    assert!(sim.stream_end_capture(s.0).is_success());
    pool.retention_finish().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.capture_held_bytes, 0);
    pool.free_raw(c).unwrap();
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.physical_bytes, snap.segment_handles), (0, 0));
    no_faults(&sim);
}

/// A simulated driver wrapped: a one-shot hook run at the next `cuMemCreate` or
/// `cuCtxSynchronize` armed (what another thread does while the pool is inside that
/// call, outside its lock), and
/// a switch that makes the legacy stream's capture query report a capture (what
/// `cuStreamGetCaptureInfo(CU_STREAM_LEGACY)` answers while it is captured).
mod hooked {
    use flare_package::driver::{
        CaptureMode, Event, HostBuffer, MemInfo, PhysicalHandle, Reservation,
    };
    use flare_package::{DevicePtr, Driver, DriverCall, DriverError, SimDriver, Stream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    type Hook = Box<dyn FnOnce() + Send>;

    pub struct Hooked {
        pub sim: Arc<SimDriver>,
        armed: Mutex<Option<(DriverCall, Hook)>>,
        pub legacy_captured: AtomicBool,
    }

    impl Hooked {
        pub fn new(sim: Arc<SimDriver>) -> Arc<Hooked> {
            Arc::new(Hooked {
                sim,
                armed: Mutex::new(None),
                legacy_captured: AtomicBool::new(false),
            })
        }

        /// Runs `hook` at the start of the next call of kind `call` (`Create` or
        /// `Synchronize`).
        pub fn arm(&self, call: DriverCall, hook: impl FnOnce() + Send + 'static) {
            *self.armed.lock().unwrap() = Some((call, Box::new(hook)));
        }

        fn at(&self, call: DriverCall) {
            let hook = {
                let mut g = self.armed.lock().unwrap();
                match g.as_ref() {
                    Some((c, _)) if *c == call => g.take().map(|(_, h)| h),
                    _ => None,
                }
            };
            if let Some(hook) = hook {
                hook();
            }
        }
    }

    impl Driver for Hooked {
        fn granularity(&self) -> Result<u64, DriverError> {
            self.sim.granularity()
        }
        fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
            self.at(DriverCall::Create);
            self.sim.create(size)
        }
        fn release(&self, h: PhysicalHandle) -> Result<(), DriverError> {
            self.sim.release(h)
        }
        fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
            self.sim.reserve(size)
        }
        fn free_reservation(&self, r: Reservation) -> Result<(), DriverError> {
            self.sim.free_reservation(r)
        }
        fn map(&self, ptr: DevicePtr, h: PhysicalHandle) -> Result<(), DriverError> {
            self.sim.map(ptr, h)
        }
        fn set_access(&self, ptr: DevicePtr, size: u64, d: &[i32]) -> Result<(), DriverError> {
            self.sim.set_access(ptr, size, d)
        }
        fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> {
            self.sim.unmap(ptr, size)
        }
        fn synchronize(&self, device: i32) -> Result<(), DriverError> {
            self.at(DriverCall::Synchronize);
            self.sim.synchronize(device)
        }
        fn mem_info(&self) -> Result<MemInfo, DriverError> {
            self.sim.mem_info()
        }
        fn event_create(&self) -> Result<Event, DriverError> {
            Driver::event_create(&*self.sim)
        }
        fn event_destroy(&self, e: Event) -> Result<(), DriverError> {
            Driver::event_destroy(&*self.sim, e)
        }
        fn event_record(&self, e: Event, s: Stream) -> Result<(), DriverError> {
            Driver::event_record(&*self.sim, e, s)
        }
        fn event_query(&self, e: Event) -> Result<bool, DriverError> {
            Driver::event_query(&*self.sim, e)
        }
        fn event_synchronize(&self, e: Event) -> Result<(), DriverError> {
            Driver::event_synchronize(&*self.sim, e)
        }
        fn stream_wait_event(&self, s: Stream, e: Event) -> Result<(), DriverError> {
            Driver::stream_wait_event(&*self.sim, s, e)
        }
        fn stream_capture(&self, s: Stream) -> Result<Option<u64>, DriverError> {
            if s == Stream::LEGACY && self.legacy_captured.load(Ordering::SeqCst) {
                return Ok(Some(1));
            }
            Driver::stream_capture(&*self.sim, s)
        }
        fn exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode, DriverError> {
            Driver::exchange_capture_mode(&*self.sim, mode)
        }
        fn stream_create_blocking(&self) -> Result<Stream, DriverError> {
            Driver::stream_create_blocking(&*self.sim)
        }
        fn stream_destroy(&self, s: Stream) -> Result<(), DriverError> {
            Driver::stream_destroy(&*self.sim, s)
        }
        fn host_alloc(&self, size: u64) -> Result<HostBuffer, DriverError> {
            Driver::host_alloc(&*self.sim, size)
        }
        fn host_free(&self, b: HostBuffer) -> Result<(), DriverError> {
            Driver::host_free(&*self.sim, b)
        }
        fn copy_to_host(
            &self,
            b: HostBuffer,
            off: u64,
            src: DevicePtr,
            n: u64,
        ) -> Result<(), DriverError> {
            Driver::copy_to_host(&*self.sim, b, off, src, n)
        }
        fn copy_to_device(
            &self,
            dst: DevicePtr,
            b: HostBuffer,
            off: u64,
            n: u64,
        ) -> Result<(), DriverError> {
            Driver::copy_to_device(&*self.sim, dst, b, off, n)
        }
        fn note_handoff(&self, stream: Stream, ptr: DevicePtr, size: u64) {
            Driver::note_handoff(&*self.sim, stream, ptr, size);
        }
    }
}

/// A segment-mode pool that keeps what is freed, on a [`hooked::Hooked`] default
/// simulated driver, shared (a hook acts on it).
fn hooked_pool() -> (Arc<Pool>, Arc<hooked::Hooked>, Arc<SimDriver>) {
    let sim = Arc::new(SimDriver::new(flare_package::SimConfig::default()));
    let driver = hooked::Hooked::new(sim.clone());
    let config = PoolConfig {
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::default().with_policy(ReusePolicy::Segments)
    };
    let pool = Pool::with_driver(config, driver.clone()).expect("a pool on the hooked driver");
    (Arc::new(pool), driver, sim)
}

/// `Pool::sleep`: "Error::ScopeState ... while a blocking stream of the context is
/// being captured" ("Before anything: a device synchronize during a capture would
/// break it"): also when the legacy stream's capture query reports a capture
/// itself. Nothing changes: no synchronize, the tag awake and usable; once the
/// capture is over the sleep succeeds.
#[test]
fn a_sleep_while_the_legacy_stream_reports_a_capture_is_refused() {
    use std::sync::atomic::Ordering;
    let (pool, driver, sim) = hooked_pool();
    let p = pool.allocate_tagged_raw(MIB, None, 1).unwrap();
    driver.legacy_captured.store(true, Ordering::SeqCst);
    let syncs = sim.call_count(DriverCall::Synchronize);
    assert!(matches!(
        pool.sleep(1, SleepMode::Discard),
        Err(Error::ScopeState(_))
    ));
    assert_eq!(sim.call_count(DriverCall::Synchronize), syncs);
    assert!(!pool.tag_census(1).sleeping);
    let snap = pool.snapshot();
    assert_eq!((snap.tags_sleeping, snap.physical_bytes), (0, 2 * MIB));
    let q = pool.allocate_tagged_raw(MIB, None, 1).unwrap();
    pool.free_raw(q).unwrap();
    driver.legacy_captured.store(false, Ordering::SeqCst);
    pool.sleep(1, SleepMode::Discard).unwrap();
    assert_eq!(pool.snapshot().physical_bytes, 0);
    pool.wake(1).unwrap();
    pool.free_raw(p).unwrap();
}

/// Starts, from the hook of a driver call made inside an allocation of tag 1 (on
/// the allocating thread, the pool holding no lock across driver calls), a sleep of
/// tag 1 on another thread, and returns once that sleep has closed the tag: once
/// `record_stream` of the tag's live `probe` is refused (`Error::TagState`: the sleep
/// runs), or it returned. The sleep cannot go on while the allocation is in flight (issue 34:
/// `src/pool/tag_gate.rs`); it is joined after the allocation returned.
fn sleep_from_hook(
    pool: &Arc<Pool>,
    driver: &hooked::Hooked,
    call: DriverCall,
    probe: DevicePtr,
) -> Arc<std::sync::Mutex<Option<std::thread::JoinHandle<flare_package::Result<()>>>>> {
    let sleeper = Arc::new(std::sync::Mutex::new(None));
    let (weak, slot) = (Arc::downgrade(pool), sleeper.clone());
    driver.arm(call, move || {
        let pool = weak.upgrade().expect("the pool");
        let p = pool.clone();
        let t = std::thread::spawn(move || p.sleep(1, SleepMode::Discard));
        // (Or until the sleep returned: before issue 34 it was refused at once.)
        while !t.is_finished() && pool.record_stream(probe, Stream::LEGACY).is_ok() {
            std::thread::yield_now();
        }
        *slot.lock().unwrap() = Some(t);
    });
    sleeper
}

/// Issue 34: a sleep of tag 1 begun while the tag's heap grows for an allocation of
/// it (inside the growth's `cuMemCreate`) waits for the allocation, instead of being
/// refused (as it was, `Error::TagState`, with the growth in flight) or taking the
/// heap half-grown: the allocation completes (two handles, both blocks live), then
/// the tag sleeps with both blocks; a wake maps them again.
#[test]
fn a_sleep_during_a_growth_of_the_tags_heap_waits_for_it() {
    let (pool, driver, sim) = hooked_pool();
    let a = pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap();
    assert_eq!(pool.snapshot().segment_handles, 1);
    let sleeper = sleep_from_hook(&pool, &driver, DriverCall::Create, a);
    let b = pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap();
    let t = sleeper.lock().unwrap().take().expect("the hook ran");
    t.join().unwrap().unwrap();
    let snap = pool.snapshot();
    snap.check_invariants().unwrap();
    assert_eq!(
        (snap.live_count, snap.sleeping_count, snap.tags_sleeping),
        (2, 2, 1),
        "both blocks sleep"
    );
    assert_eq!((snap.physical_bytes, sim.state().physical_bytes), (0, 0));
    let c = pool.tag_census(1);
    assert_eq!((c.live_count, c.live_bytes, c.sleeping), (2, 4 * MIB, true));
    pool.wake(1).unwrap();
    assert_eq!(pool.snapshot().segment_handles, 2);
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    pool.trim().unwrap();
    assert_eq!(sim.state().physical_bytes, 0);
}

/// As [`a_sleep_during_a_growth_of_the_tags_heap_waits_for_it`], for the heap's
/// first growth (a helper's finding: a segment with no handle booked yet was skipped
/// before its growth was seen, so the sleep succeeded and the tag slept with the
/// growth's block live and mapped). The probe is a whole mapping of the tag (above
/// the whole-mapping threshold), outside its heap. The sleep waits; the block is
/// booked live, then sleeps with the tag.
#[test]
fn a_sleep_during_the_first_growth_of_the_tags_heap_waits_for_it() {
    let sim = Arc::new(SimDriver::new(flare_package::SimConfig::default()));
    let driver = hooked::Hooked::new(sim.clone());
    let config = PoolConfig {
        release_threshold_bytes: u64::MAX,
        segment_whole_threshold_bytes: 8 * MIB,
        ..PoolConfig::default().with_policy(ReusePolicy::Segments)
    };
    let pool = Arc::new(Pool::with_driver(config, driver.clone()).unwrap());
    let whole = pool.allocate_tagged_raw(16 * MIB, None, 1).unwrap();
    assert_eq!(pool.snapshot().segment_handles, 0, "no heap yet");
    let sleeper = sleep_from_hook(&pool, &driver, DriverCall::Create, whole);
    let a = pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap();
    let t = sleeper.lock().unwrap().take().expect("the hook ran");
    t.join().unwrap().unwrap();
    let snap = pool.snapshot();
    snap.check_invariants().unwrap();
    assert_eq!(
        (
            snap.live_count,
            snap.sleeping_count,
            snap.sleeping_block_count
        ),
        (2, 2, 1),
        "the whole mapping and the block sleep"
    );
    assert_eq!((snap.physical_bytes, sim.state().physical_bytes), (0, 0));
    pool.wake(1).unwrap();
    let c = pool.tag_census(1);
    assert_eq!(
        (c.live_count, c.live_bytes, c.sleeping),
        (2, 18 * MIB, false)
    );
    pool.free_raw(a).unwrap();
    pool.free_raw(whole).unwrap();
    pool.trim().unwrap();
    assert_eq!(sim.state().physical_bytes, 0);
}

/// `Pool::sleep`: `Error::TagState` when the tag's segments' memory "waits on
/// stream work or a release" (a release running). A block of the tag freed with the
/// synchronous `free` waits for a release point; a trim takes it (out of every
/// bucket) and synchronizes the device before putting it back in the heap. A sleep
/// made during that synchronize (on the trim's thread, the pool holding no lock
/// across it) is refused, changing nothing; once the trim is done the block is
/// back in the heap, and a sleep and wake work.
#[test]
fn a_sleep_during_a_release_of_the_tags_block_is_refused() {
    let (pool, driver, sim) = hooked_pool();
    let a = pool.allocate_tagged_raw(MIB, None, 1).unwrap();
    let b = pool.allocate_tagged_raw(MIB, None, 1).unwrap();
    pool.free_raw(a).unwrap();
    let during = Arc::new(std::sync::Mutex::new(None));
    let (weak, seen) = (Arc::downgrade(&pool), during.clone());
    driver.arm(DriverCall::Synchronize, move || {
        let pool = weak.upgrade().expect("the pool");
        let r = pool.sleep(1, SleepMode::Discard);
        *seen.lock().unwrap() = Some((r, pool.tag_census(1).sleeping));
    });
    pool.trim().unwrap();
    let (r, sleeping) = during.lock().unwrap().take().expect("the hook ran");
    assert!(matches!(r, Err(Error::TagState { tag: 1, .. })), "{r:?}");
    assert!(!sleeping);
    let snap = pool.snapshot();
    snap.check_invariants().unwrap();
    assert_eq!((snap.live_count, snap.tags_sleeping), (1, 0));
    assert_eq!(snap.physical_bytes, 2 * MIB);
    assert_eq!(sim.state().physical_bytes, 2 * MIB);
    assert_eq!(snap.block_free_bytes, MIB, "a is back in the heap");
    pool.sleep(1, SleepMode::Discard).unwrap();
    assert_eq!(pool.snapshot().physical_bytes, 0);
    pool.wake(1).unwrap();
    pool.free_raw(b).unwrap();
    pool.trim().unwrap();
    assert_eq!(sim.state().physical_bytes, 0);
}

/// `Pool::sleep` puts to sleep the tag's heaps that hold handles; a heap whose
/// handles were all released holds nothing to unmap, so it is no sleeping segment
/// and its books are untouched. `docs/ARCHITECTURE.md` ("Segments", "Release"): a
/// handle's release "needs a device synchronize when its segment merged memory that
/// needs one (the synchronous `free`, ...) since the last synchronize", otherwise
/// only the home stream's fence; and ("Tags") a block a tag frees on a stream
/// merges into its heap once the fence completed (memory any stream may use at
/// once). Tag 3's heap: a 1 MiB block freed on a stream with no queued work, and a
/// trim releases its only handle (no handle left, the segment's reservation kept).
/// The tag sleeps and wakes with nothing; then a new block of it, freed the same
/// way, is released by a trim with no device synchronize (nothing merged into that
/// heap ever needed one), leaving nothing mapped. (A segment that slept and woke
/// synchronizes at its next release, as after the synchronous `free`: only a heap
/// that held handles at the sleep pays that.)
#[test]
fn an_emptied_tag_heap_is_not_put_to_sleep() {
    let (pool, sim) = keeping_segments(GIB);
    let s = common::stream(&sim);
    let p = pool.allocate_tagged_raw(MIB, Some(s), 3).unwrap();
    pool.free_async_raw(p, s).unwrap();
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(
        (
            snap.segment_count,
            snap.segment_handles,
            snap.physical_bytes
        ),
        (1, 0, 0),
        "the heap's segment kept, its handle released"
    );
    pool.sleep(3, SleepMode::Discard).unwrap();
    assert!(pool.tag_census(3).sleeping);
    pool.wake(3).unwrap();
    let q = pool.allocate_tagged_raw(MIB, Some(s), 3).unwrap();
    assert_eq!(check(&pool).segment_handles, 1);
    pool.free_async_raw(q, s).unwrap();
    let syncs = sim.call_count(DriverCall::Synchronize);
    pool.trim().unwrap();
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        syncs,
        "a release of memory known complete needs no device synchronize"
    );
    let snap = check(&pool);
    assert_eq!((snap.segment_handles, snap.physical_bytes), (0, 0));
    no_faults(&sim);
}

/// `Pool::allocate_tagged_raw` above `segment_whole_threshold_bytes` takes a whole
/// mapping: "one freed on a stream whose work is known complete (or, stream-ordered
/// outside segment mode, what `Pool::allocate_async_raw` may take), else a new one".
/// So in segment mode a tag's stream-ordered request on stream S does not take a
/// mapping freed on S whose work is still queued (what `allocate_async_raw` on S
/// may take, in stream order): with an untagged 4 MiB mapping freed on S behind a
/// queued kernel, tag 5's 4 MiB request on S creates a new mapping (one
/// `cuMemCreate`, another address), and the freed one stays idle.
#[test]
fn a_tags_stream_request_in_segment_mode_takes_no_mapping_of_the_streams_queue() {
    let (pool, sim) = simulated_pool(
        GIB,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            segment_whole_threshold_bytes: MIB,
            ..PoolConfig::default().with_policy(ReusePolicy::Segments)
        },
    );
    let s = common::stream(&sim);
    let a = pool.allocate_async_raw(4 * MIB, s).unwrap();
    assert_eq!(sim.launch(s.0, a, 4 * MIB), CuResult::SUCCESS);
    pool.free_async_raw(a, s).unwrap();
    assert_eq!(check(&pool).idle_bytes, 4 * MIB);
    let created = sim.call_count(DriverCall::Create);
    let b = pool.allocate_tagged_raw(4 * MIB, Some(s), 5).unwrap();
    assert_ne!(b, a, "the tag took the mapping of the stream's queue");
    assert_eq!(sim.call_count(DriverCall::Create), created + 1);
    let snap = check(&pool);
    assert_eq!(
        (snap.idle_bytes, snap.live_mapped_bytes),
        (4 * MIB, 4 * MIB)
    );
    assert_eq!(pool.tag_census(5).live_bytes, 4 * MIB);
    assert_eq!(sim.stream_complete(s.0), CuResult::SUCCESS);
    pool.free_async_raw(b, s).unwrap();
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
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

/// Destroying a pool while a tag sleeps in segment mode forgets each sleeping block
/// once: it leaves `live_requested_bytes` with its own requested bytes (1000), so the
/// awake allocation's 5000 come off the 5000 left and the count ends at 0. Taken off
/// any other way (divided, say: 6000 / 1000 = 6), the awake allocation's 5000 would
/// overflow the counter (overflow checks are on in the test profiles) and the
/// destroy would panic instead of releasing everything.
#[test]
fn destroy_forgets_a_sleeping_block_once() {
    // Thread caches off: the books alone count the awake block (a cache would hold
    // its count as a delta until the destroy settles it).
    let (pool, sim) = simulated_pool(
        16 * GIB,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            thread_cache_entries: 0,
            ..PoolConfig::default().with_policy(ReusePolicy::Segments)
        },
    );
    let _asleep = pool.allocate_tagged_raw(1000, None, 7).unwrap();
    let _awake = pool.allocate_raw(5000).unwrap();
    assert_eq!(check(&pool).live_requested_bytes, 6000);
    pool.sleep(7, SleepMode::Offload).unwrap();
    assert_eq!(
        check(&pool).live_requested_bytes,
        6000,
        "a sleeping block stays live"
    );
    pool.destroy().unwrap();
    no_faults(&sim);
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

/// A wake whose mapping step fails undoes the piece: the handle it created is
/// released, and where the driver refuses that too it keeps the handle, which the
/// books take as the sleeping allocation's held handle. It is the tag's physical
/// memory from then on (`TagCensus::physical_bytes`, 2 MiB, as in the pool's
/// `physical_bytes` and `sleeping_held_bytes`), and the next wake maps it (no new
/// handle) and succeeds.
#[test]
fn a_handle_kept_by_a_failed_wake_is_the_tags_physical_memory() {
    let (pool, sim) = simulated_pool(GIB, PoolConfig::default());
    let p = pool.allocate_tagged_raw(2 * MIB, None, 7).unwrap();
    pool.sleep(7, SleepMode::Discard).unwrap();
    assert_eq!(pool.tag_census(7).physical_bytes, 0);
    sim.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    match pool.wake(7) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Map),
        other => panic!("{other:?}"),
    }
    let s = check(&pool);
    assert_eq!(
        (s.physical_bytes, s.sleeping_held_bytes),
        (2 * MIB, 2 * MIB)
    );
    let c = pool.tag_census(7);
    assert!(c.sleeping);
    assert_eq!(c.physical_bytes, 2 * MIB, "the kept handle is the tag's");
    let creates = sim.call_count(DriverCall::Create);
    pool.wake(7).unwrap();
    assert_eq!(
        sim.call_count(DriverCall::Create),
        creates,
        "the kept handle is mapped"
    );
    assert_eq!(pool.tag_census(7).physical_bytes, 2 * MIB);
    pool.free_raw(p).unwrap();
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    assert_driver_empty(&pool);
}

/// `Pool::wake`: "Errors: `Error::TagState` when the tag does not sleep", and the
/// pending retry it makes first is part of a wake: a wake refused so releases
/// nothing. With a release refused part-way (the handle's `cuMemRelease`: the
/// mapping pending, 2 MiB), a wake of a tag that is awake (one live allocation) or
/// unknown is refused and the pending mapping stays pending, with no driver call;
/// the next release point (a trim) releases it.
#[test]
fn a_refused_wake_leaves_what_is_pending() {
    let (pool, sim) = simulated_pool(GIB, PoolConfig::default());
    let kept = pool.allocate_tagged_raw(2 * MIB, None, 7).unwrap();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    let _ = pool.free_raw(p);
    let s = check(&pool);
    assert_eq!((s.pending_count, s.pending_bytes), (1, 2 * MIB));
    let releases = sim.call_count(DriverCall::Release);
    for tag in [7, 8] {
        assert!(
            matches!(pool.wake(tag), Err(Error::TagState { .. })),
            "tag {tag}"
        );
        assert_eq!(check(&pool).pending_count, 1, "tag {tag}");
    }
    assert_eq!(sim.call_count(DriverCall::Release), releases);
    pool.trim().unwrap();
    assert_eq!(check(&pool).pending_count, 0);
    pool.free_raw(kept).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// A tag's block freed with the synchronous `free` waits for that tag's synchronous
/// allocations (its own `TagBlocks` bucket), never another tag's: after tag 7 frees
/// a block, tag 8's request of the same size grows tag 8's own heap (a 2 MiB handle
/// of its own) and gets another address.
#[test]
fn a_tags_freed_block_waits_for_that_tag_only() {
    let (pool, _sim) = keeping_segments(16 * GIB);
    let x = pool.allocate_tagged_raw(1000, None, 7).unwrap();
    let _kept = pool.allocate_tagged_raw(1000, None, 7).unwrap();
    pool.free_raw(x).unwrap();
    let y = pool.allocate_tagged_raw(1000, None, 8).unwrap();
    assert_ne!(y, x, "a tag's freed block is no other tag's");
    assert_eq!(pool.tag_census(8).physical_bytes, 2 * MIB);
    check(&pool);
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
