//! A tag's heaps in segment mode: where its freed blocks wait and who takes them back,
//! what a sleep releases (its own heaps, lent handles, no other heap), and destroy
//! with a tag asleep (`docs/ARCHITECTURE.md`, "Tags").
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::sleep_and_wake::keeping_segments;
use common::{check, no_faults, simulated_pool, GIB, MIB};
use flare_package::driver::sim::SimStreamCall;
use flare_package::{CuResult, DriverCall, PoolConfig, ReusePolicy, SleepMode};

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
