//! Tags (issue 15) in segment mode on the simulated driver: segments keep tags apart,
//! the census and reuse stay in the tag, tag 0 sleeps, a wake on a full device fails
//! cleanly, a failed sleep leaves the heap usable, and a pool dropped asleep leaves
//! nothing.

use crate::common;

use crate::sleep_and_wake::{fill, keeping_pool, pool_with, same};
use common::{check, check_with_devices, no_faults, GIB, MIB};
use flare_package::{CuResult, DriverCall, Error, ReusePolicy, SleepMode, TagCensus};

/// Segment mode: a tag's synchronous requests are blocks of its own heap, so its
/// handles hold none of tag 0's blocks (nor tag 0's any of its); each tag sleeps
/// (tag 0 included) without touching the other's bytes, and wakes at the same
/// addresses with its bytes back.
#[test]
fn segments_keep_tags_apart() {
    let (pool, sim) = pool_with(ReusePolicy::Segments, 16 * GIB);
    let blocks: Vec<_> = (0..8).map(|_| pool.allocate_raw(4096).unwrap()).collect();
    for (i, &b) in blocks.iter().enumerate() {
        fill(&sim, b, 50 + i as u64, 4096);
    }
    let t: Vec<_> = (0..8)
        .map(|_| pool.allocate_tagged_raw(4096, None, 1).unwrap())
        .collect();
    for (i, &p) in t.iter().enumerate() {
        fill(&sim, p, 70 + i as u64, 4096);
    }
    let s = check(&pool);
    // 16 blocks of 4 KiB: two heaps of one 2 MiB handle each (a growth maps the need,
    // 4 KiB, rounded to the 2 MiB granularity).
    assert_eq!((s.block_live_count, s.block_live_bytes), (16, 16 * 4096));
    assert_eq!((s.segment_handles, s.physical_bytes), (2, 4 * MIB));
    let c1 = pool.tag_census(1);
    assert_eq!(
        (
            c1.live_count,
            c1.live_bytes,
            c1.physical_bytes,
            c1.idle_bytes
        ),
        (8, 8 * 4096, 2 * MIB, 2 * MIB - 8 * 4096)
    );
    let c0 = pool.tag_census(0);
    assert_eq!(
        (
            c0.live_count,
            c0.live_bytes,
            c0.physical_bytes,
            c0.idle_bytes
        ),
        (8, 8 * 4096, 2 * MIB, 2 * MIB - 8 * 4096)
    );
    // Apart: no tag-1 block lies within 2 MiB of a tag-0 block (each heap is its own
    // reservation).
    for &p in &t {
        assert!(blocks.iter().all(|&b| p.abs_diff(b) >= 2 * MIB));
    }
    for (tag, mine, theirs, seed, other_seed) in
        [(1u32, &t, &blocks, 70u64, 50u64), (0, &blocks, &t, 50, 70)]
    {
        for mode in [SleepMode::Offload, SleepMode::Discard] {
            pool.sleep(tag, mode).unwrap();
            let s = check(&pool);
            assert_eq!(s.physical_bytes, 2 * MIB, "tag {tag} {mode:?}");
            assert_eq!(sim.state().physical_bytes, 2 * MIB);
            assert_eq!((s.sleeping_count, s.sleeping_block_count), (8, 8));
            assert_eq!(
                (s.sleeping_bytes, s.sleeping_block_bytes),
                (8 * 4096, 8 * 4096)
            );
            let c = pool.tag_census(tag);
            assert!(c.sleeping);
            assert_eq!((c.physical_bytes, c.idle_bytes, c.live_count), (0, 0, 8));
            // Offload copies the live blocks' bytes only, not the free space.
            let want = if mode == SleepMode::Offload {
                8 * 4096
            } else {
                0
            };
            assert_eq!(c.offloaded_bytes, want);
            // Host memory: the offload's buffer, or in discard the one the offload's
            // wake kept (every offload here is of 8 x 4 KiB).
            assert_eq!(sim.host_bytes(), 8 * 4096);
            for &p in mine.iter() {
                assert_eq!(sim.touch(p, 1, 0), CuResult::INVALID_VALUE);
            }
            for (i, &b) in theirs.iter().enumerate() {
                same(&sim, b, other_seed + i as u64, 4096);
            }
            pool.wake(tag).unwrap();
            let s = check_with_devices(&pool, 1);
            assert_eq!(
                (s.physical_bytes, s.sleeping_count, s.tags_sleeping),
                (4 * MIB, 0, 0)
            );
            // Kept for the next offload of its size.
            assert_eq!(sim.host_bytes(), 8 * 4096);
            for (i, &p) in mine.iter().enumerate() {
                if mode == SleepMode::Offload {
                    same(&sim, p, seed + i as u64, 4096);
                } else {
                    // Contents unspecified: written again for the next round.
                    assert_eq!(sim.touch(p, 4096, 0), CuResult::SUCCESS);
                    fill(&sim, p, seed + i as u64, 4096);
                }
            }
        }
    }
    // Two offloads of the same size (tag 1's, then tag 0's): one buffer pinned.
    assert_eq!(sim.call_count(DriverCall::HostAlloc), 1);
    for p in blocks.into_iter().chain(t) {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(sim.host_bytes(), 0, "trim frees the kept buffer");
    check(&pool);
    assert_eq!(pool.snapshot().physical_bytes, 0);
    no_faults(&sim);
}

/// Segment mode: the census of a tag counts its blocks' sizes (rounded to 512) as
/// live and the rest of its heap's handles as idle. A block the tag frees, with the
/// synchronous free or on a stream, stays the tag's: tag 0's allocations (on that
/// stream too) never take it; after a release point it is back in the tag's heap,
/// and the tag's next allocation of its size takes it.
#[test]
fn segment_census_and_reuse_stay_in_the_tag() {
    let (pool, sim) = keeping_pool(ReusePolicy::Segments, 16 * GIB);
    let s = common::stream(&sim);
    let a: Vec<_> = (0..4)
        .map(|i| {
            let stream = (i == 3).then_some(s);
            pool.allocate_tagged_raw(1000, stream, 4).unwrap()
        })
        .collect();
    let c = pool.tag_census(4);
    assert_eq!(
        c,
        TagCensus {
            sleeping: false,
            live_count: 4,
            live_bytes: 4 * 1024,
            peak_live_bytes: 4 * 1024,
            idle_bytes: 2 * MIB - 4 * 1024,
            physical_bytes: 2 * MIB,
            offloaded_bytes: 0,
            zeroed_bytes: 0,
            zero_memsets: 0,
        }
    );
    // One block of one handle: the stream-ordered one is in the tag's heap too.
    assert_eq!(a[3], a[2] + 1024);
    pool.free_raw(a[1]).unwrap();
    pool.free_async_raw(a[3], s).unwrap();
    let c = pool.tag_census(4);
    assert_eq!(
        (c.live_count, c.live_bytes, c.idle_bytes, c.physical_bytes),
        (2, 2048, 2 * MIB - 2048, 2 * MIB)
    );
    check(&pool);
    // Tag 0 takes none of it, synchronous or on the stream: its blocks grow heaps of
    // its own.
    let u = pool.allocate_raw(1000).unwrap();
    let v = pool.allocate_async_raw(1000, s).unwrap();
    for p in [u, v] {
        assert!(a.iter().all(|&q| p.abs_diff(q) >= 2 * MIB), "{p:#x}");
    }
    assert_eq!(pool.tag_census(0).physical_bytes, 4 * MIB);
    let total: u64 = [0, 4]
        .iter()
        .map(|&t| pool.tag_census(t).physical_bytes)
        .sum();
    assert_eq!(total, pool.snapshot().physical_bytes);
    pool.free_raw(u).unwrap();
    pool.free_async_raw(v, s).unwrap();
    // A release point: both blocks back in the tag's heap (its handle kept: two
    // blocks live); tag 0's handles, wholly free, released.
    pool.trim().unwrap();
    check(&pool);
    assert_eq!(pool.tag_census(4).physical_bytes, 2 * MIB);
    assert_eq!(pool.tag_census(0).physical_bytes, 0);
    // The smallest fit of 1024 bytes is the hole a[1] left.
    let again = pool.allocate_tagged_raw(1000, None, 4).unwrap();
    assert_eq!(again, a[1]);
    for p in [a[0], again, a[2]] {
        pool.free_raw(p).unwrap();
    }
    assert_eq!(pool.tag_census(4).idle_bytes, 2 * MIB);
    pool.trim().unwrap();
    check(&pool);
    assert_eq!(pool.tag_census(4).physical_bytes, 0);
    assert_eq!(pool.snapshot().physical_bytes, 0);
    no_faults(&sim);
}

/// Segment mode, tag 0 asleep with thread caches and a stream's heap holding its
/// memory: the sleep settles the caches, releases what is idle, and releases every
/// handle of tag 0's heaps (the synchronous API's and the stream's); wake maps new
/// ones at the same addresses with the bytes back; tag 5's heap is untouched.
#[test]
fn tag_zero_sleeps_in_segment_mode() {
    let (pool, sim) = keeping_pool(ReusePolicy::Segments, 16 * GIB);
    let s = common::stream(&sim);
    let sync_live = pool.allocate_raw(3 * MIB).unwrap();
    fill(&sim, sync_live, 1, 3 * MIB as usize);
    let cached = pool.allocate_raw(4096).unwrap();
    pool.free_raw(cached).unwrap();
    assert_eq!(pool.snapshot().thread_cache_count, 1);
    let on_stream = pool.allocate_async_raw(5000, s).unwrap();
    fill(&sim, on_stream, 2, 5000);
    let tagged = pool.allocate_tagged_raw(6000, None, 5).unwrap();
    fill(&sim, tagged, 3, 6000);
    let tag5 = pool.tag_census(5).physical_bytes;
    assert_eq!(tag5, 2 * MIB);
    pool.sleep(0, SleepMode::Offload).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.thread_cache_count, 0);
    assert_eq!(snap.physical_bytes, tag5, "only tag 5's heap is held");
    assert_eq!(pool.tag_census(0).offloaded_bytes, 3 * MIB + 5000);
    assert_eq!(pool.tag_census(0).physical_bytes, 0);
    assert!(matches!(
        pool.allocate_raw(4096),
        Err(Error::TagState { tag: 0, .. })
    ));
    assert!(matches!(
        pool.allocate_async_raw(4096, s),
        Err(Error::TagState { tag: 0, .. })
    ));
    // Tag 5 works on.
    let t2 = pool.allocate_tagged_raw(4096, None, 5).unwrap();
    pool.free_raw(t2).unwrap();
    pool.wake(0).unwrap();
    check_with_devices(&pool, 1);
    same(&sim, sync_live, 1, 3 * MIB as usize);
    same(&sim, on_stream, 2, 5000);
    same(&sim, tagged, 3, 6000);
    pool.free_raw(sync_live).unwrap();
    pool.free_async_raw(on_stream, s).unwrap();
    pool.free_raw(tagged).unwrap();
    pool.trim().unwrap();
    check(&pool);
    assert_eq!(pool.snapshot().physical_bytes, 0);
    no_faults(&sim);
}

/// Segment mode: a wake that cannot fit fails with out-of-memory, undoes the
/// handles it mapped, keeps the host copy; it succeeds once memory is freed.
#[test]
fn segment_wake_on_a_full_device_fails_cleanly_then_succeeds() {
    let (pool, sim) = pool_with(ReusePolicy::Segments, 64 * MIB);
    // Four blocks of 8 MiB: four handles of 8 MiB (a growth maps the need when an
    // eighth of what is mapped is less).
    let ptrs: Vec<_> = (0..4)
        .map(|i| {
            let p = pool.allocate_tagged_raw(8 * MIB, None, 1).unwrap();
            fill(&sim, p, i, 8 * MIB as usize);
            p
        })
        .collect();
    assert_eq!(pool.snapshot().segment_handles, 4);
    pool.sleep(1, SleepMode::Offload).unwrap();
    // Another tag takes 48 of the 64 MiB: 16 left, 32 needed.
    let filler = pool.allocate_tagged_raw(48 * MIB, None, 2).unwrap();
    let creates = sim.call_count(DriverCall::Create);
    let err = pool.wake(1).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    // Two handles fitted before the third failed; both were released again.
    assert_eq!(sim.call_count(DriverCall::Create), creates + 3);
    let s = check(&pool);
    assert_eq!(s.physical_bytes, 48 * MIB);
    assert!(pool.tag_census(1).sleeping);
    assert_eq!(pool.tag_census(1).offloaded_bytes, 32 * MIB);
    pool.free_raw(filler).unwrap();
    pool.trim().unwrap();
    pool.wake(1).unwrap();
    check(&pool);
    for (i, &p) in ptrs.iter().enumerate() {
        same(&sim, p, i as u64, 8 * MIB as usize);
    }
}

/// A pool in segment mode dropped with a tag (and tag 0) asleep releases
/// everything: segments' reservations, the handles left, the host copies.
#[test]
fn a_segment_pool_dropped_asleep_leaves_nothing() {
    let (pool, sim) = pool_with(ReusePolicy::Segments, 16 * GIB);
    let _a = pool.allocate_tagged_raw(6000, None, 1).unwrap();
    let _b = pool.allocate_raw(7000).unwrap();
    pool.sleep(1, SleepMode::Offload).unwrap();
    pool.sleep(0, SleepMode::Offload).unwrap();
    drop(pool);
    let d = sim.state();
    assert_eq!((d.handles, d.reservations, d.mappings), (0, 0, 0));
    assert_eq!(sim.host_bytes(), 0);
}

/// Segment mode: a sleep that fails after planning (the host allocation refused)
/// leaves the tag's heap as it was: its free space serves the tag's next block with
/// no driver call, and a trim releases the handle once it is wholly free.
#[test]
fn a_failed_segment_sleep_leaves_the_heap_usable() {
    let (pool, sim) = keeping_pool(ReusePolicy::Segments, 16 * GIB);
    let a: Vec<_> = (0..3)
        .map(|_| pool.allocate_tagged_raw(1000, None, 2).unwrap())
        .collect();
    sim.inject_failure(DriverCall::HostAlloc, 1, CuResult::OUT_OF_MEMORY);
    assert!(matches!(
        pool.sleep(2, SleepMode::Offload),
        Err(Error::Driver { .. })
    ));
    sim.clear_failures();
    assert!(!pool.tag_census(2).sleeping);
    check(&pool);
    let creates = sim.call_count(DriverCall::Create);
    let b = pool.allocate_tagged_raw(1000, None, 2).unwrap();
    assert_eq!(
        sim.call_count(DriverCall::Create),
        creates,
        "carved, not grown"
    );
    assert_eq!(b, a[2] + 1024, "the next 1024 bytes of the handle");
    for p in a.into_iter().chain([b]) {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    check(&pool);
    assert_eq!(pool.snapshot().physical_bytes, 0);
}
