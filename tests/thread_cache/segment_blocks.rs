//! Thread caches (issue 13) in segment mode: blocks of at most 1 MiB of the
//! synchronous heap are cached, larger ones not; a miss drains the cache and the
//! heap, and cached small blocks coalesce before a growth (and once drained); the
//! peak does not grow with the threads.

use crate::common;

use std::thread;

use crate::caching::{invariants, pool, pool_with, seg_pool, KIB};
use common::{assert_driver_empty, check, no_faults, simulated_pool, GIB, MIB};
use flare_package::{DevicePtr, DriverCall, PoolConfig, ReusePolicy};

/// Segment mode: the drain on a miss is what lets freed blocks coalesce. Two 1 MiB
/// blocks fill one 2 MiB handle; both freed go to the cache (small blocks of the
/// synchronous heap), out of the heap. A 512 KiB request misses the cache (blocks
/// are cached by exact size) and the heap (nothing free in it); the drain gives
/// both blocks back to the heap, where they coalesce, and the request is carved
/// from them: no new handle.
#[test]
fn seg_a_miss_drains_the_cache_and_the_heap_then_fits() {
    let (pool, sim) = seg_pool();
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(MIB).unwrap();
    let b = pool.allocate_raw(MIB).unwrap();
    assert_eq!(b, a + MIB, "one handle holds both");
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.block_free_bytes), (1, 0));
    let hits = s.reuse_hits;
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (2, 2 * MIB));
    assert_eq!((s.block_free_bytes, s.block_live_bytes), (2 * MIB, 0));
    let c = pool.allocate_raw(512 * KIB).unwrap();
    assert_eq!(
        c, a,
        "carved from the coalesced blocks, at the handle's start"
    );
    let s = check(&pool);
    assert_eq!(
        (s.segment_handles, s.mappings_created),
        (1, 1),
        "no new handle"
    );
    assert_eq!((s.thread_cache_count, s.thread_cache_hits), (0, 0));
    assert_eq!(s.reuse_hits, hits + 1, "a carve from free space");
    assert_eq!(
        (s.block_live_bytes, s.block_free_bytes),
        (512 * KIB, 1536 * KIB)
    );
    pool.free_raw(c).unwrap();
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.segment_handles), (0, 0));
    assert_eq!(s.mappings_released, 1);
    assert_eq!(sim.call_count(DriverCall::Release), 1);
    no_faults(&sim);
}

/// Segment mode: blocks of at most 1 MiB of the synchronous heap are cached (free
/// block bytes in the snapshot meanwhile); larger blocks go back to their heap.
#[test]
fn seg_small_blocks_are_cached_larger_not() {
    let (pool, sim) = seg_pool();
    pool.retention_begin().unwrap();
    let small = pool.allocate_raw(MIB).unwrap();
    let large = pool.allocate_raw(MIB + 1).unwrap();
    let tiny = pool.allocate_raw(700).unwrap();
    let base = check(&pool);
    assert_eq!(
        base.block_live_bytes,
        MIB + (MIB + 512) + 1024,
        "rounded to 512 bytes"
    );
    pool.free_raw(small).unwrap();
    pool.free_raw(large).unwrap();
    pool.free_raw(tiny).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.thread_cache_count, s.thread_cache_bytes),
        (2, MIB + 1024)
    );
    assert_eq!(s.block_live_bytes, 0);
    assert_eq!(
        s.block_free_bytes,
        base.block_free_bytes + base.block_live_bytes
    );
    // The same sizes again: the small ones from the cache (same addresses), the
    // large one from its heap.
    assert_eq!(pool.allocate_raw(MIB).unwrap(), small);
    assert_eq!(pool.allocate_raw(1000).unwrap(), tiny);
    let l = pool.allocate_raw(MIB + 1).unwrap();
    let s = check(&pool);
    assert_eq!(s.thread_cache_hits, 2);
    assert_eq!(s.reuse_hits, base.reuse_hits + 3);
    assert_eq!(s.mappings_created, base.mappings_created, "no new handle");
    assert_eq!(l, large);
    assert_eq!(s.thread_cache_count, 0);
    for p in [small, tiny, l] {
        pool.free_raw(p).unwrap();
    }
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.segment_handles), (0, 0));
    assert_eq!(s.mappings_released, s.mappings_created);
    assert_eq!(sim.call_count(DriverCall::Release), s.mappings_created);
    no_faults(&sim);
}

/// Segment blocks too small one by one still serve a larger request once they
/// coalesce: 512 blocks of 4 KiB fill one 2 MiB handle; another thread frees them,
/// every 16th first (they go on the allocating thread's remote list, 32 entries, and
/// split the heap's free space into runs of 60 KiB), then the rest. A third thread's
/// 1 MiB request must not grow the heap: its miss takes every cached block back to
/// the heap, where the 2 MiB coalesce. (Before, only entries of at least 1 MiB were
/// taken, and the heap grew by a handle.)
#[test]
fn seg_cached_small_blocks_coalesce_before_a_growth() {
    let (pool, sim) = seg_pool();
    pool.retention_begin().unwrap();
    let ptrs: Vec<DevicePtr> = (0..512).map(|_| pool.allocate_raw(4096).unwrap()).collect();
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (1, 2 * MIB));
    thread::scope(|t| {
        t.spawn(|| {
            let (every16, rest): (Vec<_>, Vec<_>) =
                ptrs.iter().enumerate().partition(|(i, _)| i % 16 == 0);
            for (_, &p) in every16.into_iter().chain(rest) {
                pool.free_raw(p).unwrap();
            }
        })
        .join()
        .unwrap();
    });
    let s = check(&pool);
    assert_eq!(
        s.remote_frees, 32,
        "the remote list holds 32 (the entry bound)"
    );
    let big = thread::scope(|t| t.spawn(|| pool.allocate_raw(MIB).unwrap()).join().unwrap());
    let s = check(&pool);
    assert_eq!(
        (s.segment_handles, s.physical_bytes),
        (1, 2 * MIB),
        "no growth: {s:#?}"
    );
    assert_eq!(s.block_live_bytes, MIB);
    pool.free_raw(big).unwrap();
    pool.retention_finish().unwrap();
    // Segment mode keeps its reservation; every handle is released once.
    let s = check(&pool);
    assert_eq!(
        (s.physical_bytes, s.segment_handles, s.thread_cache_count),
        (0, 0, 0)
    );
    assert_eq!(s.mappings_released, s.mappings_created);
    assert_eq!(sim.call_count(DriverCall::Release), s.mappings_created);
}

/// A block the books handed out (allocated outside a scope, the caches closed) and
/// freed with the synchronous `free` inside one is cached when it may be held there
/// ("a block of at most 1 MiB of the synchronous API's heap"): the next allocation
/// of its size hits it.
#[test]
fn a_books_handed_small_block_freed_in_a_scope_is_cached() {
    let (pool, sim) = seg_pool();
    let b = pool.allocate_raw(4096).unwrap();
    pool.retention_begin().unwrap();
    pool.free_raw(b).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (1, 4096));
    assert_eq!(pool.allocate_raw(4096).unwrap(), b);
    assert_eq!(check(&pool).thread_cache_hits, 1);
    pool.free_raw(b).unwrap();
    pool.retention_finish().unwrap();
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}

/// A small block's miss takes back into the heaps only what can serve it: the blocks
/// the caches hold (they coalesce there), not another thread's whole mapping, which
/// stays in that thread's cache ("the other entries stay where they are").
#[test]
fn a_small_blocks_miss_leaves_other_threads_whole_mappings_cached() {
    let (pool, _sim) = pool_with(PoolConfig {
        reuse_policy: ReusePolicy::Segments,
        segment_whole_threshold_bytes: 2 * MIB,
        ..PoolConfig::default()
    });
    pool.retention_begin().unwrap();
    let (freed, done) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
    // Snapshots taken while the other thread holds its cache, checked after it is
    // let go (a failed check must not leave it waiting).
    let (before, after) = thread::scope(|t| {
        let other = t.spawn(|| {
            let r = pool.allocate_raw(4 * MIB).and_then(|w| pool.free_raw(w));
            freed.wait();
            done.wait();
            r
        });
        freed.wait();
        let before = pool.snapshot();
        let b = pool.allocate_raw(4096);
        let after = pool.snapshot();
        if let Ok(b) = b {
            let _ = pool.free_raw(b);
        }
        done.wait();
        other.join().unwrap().unwrap();
        (before, after)
    });
    assert_eq!(
        (before.thread_cache_bytes, before.live_mapped_bytes),
        (4 * MIB, 0)
    );
    assert_eq!(
        after.thread_cache_bytes,
        4 * MIB,
        "the whole mapping stays cached"
    );
    assert_eq!(
        (after.block_live_bytes, after.segment_mapped_bytes),
        (4096, 2 * MIB)
    );
    pool.retention_finish().unwrap();
    assert_eq!(check(&pool).live_count, 0);
}

/// Segment mode: blocks cached by a thread coalesce once drained. 128 blocks of
/// 16 KiB fill the first 2 MiB handle; freed, 32 stay in the cache (its entry
/// bound) and 96 go back to the heap. Two 1 MiB blocks then fill the handle with no
/// growth only if every freed block, cached ones included, coalesced into one free
/// range.
#[test]
fn segment_cached_blocks_coalesce() {
    let (pool, _sim) = pool(GIB, ReusePolicy::Segments);
    pool.retention_begin().unwrap();
    let ptrs: Vec<u64> = (0..128)
        .map(|_| pool.allocate_raw(16 << 10).unwrap())
        .collect();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.block_live_bytes), (2 * MIB, 2 * MIB));
    let handles = s.segment_handles;
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    let s = check(&pool);
    assert_eq!(
        (s.thread_cache_count, s.thread_cache_bytes),
        (32, 32 * (16 << 10)),
        "bounded by 32 entries"
    );
    let big = pool.allocate_raw(MIB).unwrap();
    let s = check(&pool);
    assert_eq!(s.physical_bytes, 2 * MIB, "no growth");
    assert_eq!(s.segment_handles, handles);
    assert_eq!(s.block_live_bytes, MIB);
    // And the rest once more: a second 1 MiB block fills the handle exactly.
    let big2 = pool.allocate_raw(MIB).unwrap();
    assert_eq!(check(&pool).physical_bytes, 2 * MIB);
    pool.free_raw(big).unwrap();
    pool.free_raw(big2).unwrap();
    pool.retention_finish().unwrap();
    check(&pool);
    assert_driver_empty(&pool);
}

/// Segment mode, four threads cycling blocks of one size (8 of 64 KiB live per
/// thread, 2 MiB at most at once): the peak stays bounded however long they run.
/// Idle blocks of the size asked are taken from any cache before a heap grows, so
/// a growth happens only when every mapped byte but less than one block is live:
/// the heap never holds more than the 2 MiB live plus one growth (at most 2 MiB at
/// this size).
#[test]
fn segment_peaks_do_not_grow_with_threads() {
    for threshold in [0, u64::MAX] {
        let (pool, _sim) = simulated_pool(
            GIB,
            PoolConfig {
                reuse_policy: ReusePolicy::Segments,
                release_threshold_bytes: threshold,
                ..PoolConfig::default()
            },
        );
        let scope = pool.retention_scope().unwrap();
        thread::scope(|t| {
            for _ in 0..4 {
                t.spawn(|| {
                    for _ in 0..500 {
                        let ptrs: Vec<u64> = (0..8)
                            .map(|_| pool.allocate_raw(64 << 10).unwrap())
                            .collect();
                        for p in ptrs {
                            pool.free_raw(p).unwrap();
                        }
                    }
                });
            }
            t.spawn(|| {
                for _ in 0..200 {
                    invariants(&pool);
                    thread::yield_now();
                }
            });
        });
        let s = check(&pool);
        assert!(
            s.peak_physical_bytes <= 4 * MIB,
            "peak {} MiB",
            s.peak_physical_bytes >> 20
        );
        assert_eq!(s.live_count, 0);
        assert!(s.thread_cache_hits > 0);
        scope.finish().unwrap();
        let s = check(&pool);
        if threshold == 0 {
            assert_eq!(s.physical_bytes, 0);
            assert_driver_empty(&pool);
        } else {
            pool.trim().unwrap();
            assert_driver_empty(&pool);
        }
    }
}
