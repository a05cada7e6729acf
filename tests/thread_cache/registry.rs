//! Review of the thread caches (issue 13): bad inputs and races against the
//! contract of `docs/ARCHITECTURE.md` ("Thread caches", "Operations and their
//! contracts") and the doc comments of `Pool`, on the simulated driver.
//!
//! Every test ends with the books against the driver (`common::check`) and, where
//! everything was freed, an empty driver after the release point.

#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use common::{assert_driver_empty, check, simulated_pool, stream, GIB, MIB};
use flare_package::{Error, Pool, PoolConfig, ReusePolicy, Snapshot};

/// A pool with `policy` on a device of `capacity` bytes, default thread caches.
fn pool(capacity: u64, policy: ReusePolicy) -> (Pool, Arc<flare_package::SimDriver>) {
    simulated_pool(capacity, PoolConfig::default().with_policy(policy))
}

/// A pool whose caches hold memory outside scopes too (`release_threshold_bytes`
/// is `u64::MAX`: nothing would be released anyway).
fn open_pool(capacity: u64, policy: ReusePolicy) -> (Pool, Arc<flare_package::SimDriver>) {
    simulated_pool(
        capacity,
        PoolConfig {
            reuse_policy: policy,
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default()
        },
    )
}

#[track_caller]
fn unknown(r: flare_package::Result<()>, ptr: u64) {
    match r {
        Err(Error::UnknownPointer { ptr: p }) => assert_eq!(p, ptr),
        other => panic!("expected an unknown-pointer error for {ptr:#x}, got {other:?}"),
    }
}

/// The snapshot invariants only (other threads may be changing the driver).
#[track_caller]
fn invariants(pool: &Pool) -> Snapshot {
    let s = pool.snapshot();
    if let Err(e) = s.check_invariants() {
        panic!("snapshot invariant broken: {e}\n{s:#?}");
    }
    s
}

/// An allocation the calling thread's cache hands out: allocate and free `bytes`
/// once (the free goes to the cache: a scope is open), then allocate again.
fn cache_handed(pool: &Pool, bytes: u64) -> u64 {
    let p = pool.allocate_raw(bytes).unwrap();
    pool.free_raw(p).unwrap();
    let hits = pool.snapshot().thread_cache_hits;
    let q = pool.allocate_raw(bytes).unwrap();
    assert_eq!(q, p, "the cache gives the same memory back");
    assert_eq!(
        pool.snapshot().thread_cache_hits,
        hits + 1,
        "served by the cache"
    );
    q
}

/// "free(ptr): an interior pointer ... is an unknown-pointer error that changes
/// nothing": also for memory a thread cache handed out, whatever its offset (the
/// pointer table's unit is 512 bytes, so an offset below 512 finds the
/// allocation's own entry).
#[test]
fn interior_pointers_of_cache_handed_memory_are_unknown() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, _sim) = pool(GIB, policy);
        pool.retention_begin().unwrap();
        let bytes = if policy.is_segments() { 4096 } else { 2 * MIB };
        let p = cache_handed(&pool, bytes);
        let before = check(&pool);
        for off in [1, 8, 256, 511, 512, 4095] {
            unknown(pool.free_raw(p + off), p + off);
            let s = check(&pool);
            assert_eq!(
                s.live_count, before.live_count,
                "offset {off}: nothing freed"
            );
            assert_eq!(s.frees, before.frees, "offset {off}");
            assert_eq!(s.thread_cache_count, before.thread_cache_count);
        }
        // From a thread with a cache of its own (a remote free), too.
        thread::scope(|t| {
            t.spawn(|| unknown(pool.free_raw(p + 1), p + 1));
        });
        assert_eq!(check(&pool).live_count, before.live_count);
        // The allocation is intact: freed once at its address, and the cache hands
        // that address (not an interior one) out again.
        pool.free_raw(p).unwrap();
        let q = pool.allocate_raw(bytes).unwrap();
        assert_eq!(q, p);
        pool.free_raw(q).unwrap();
        pool.retention_finish().unwrap();
        check(&pool);
        assert_eq!(pool.snapshot().live_count, 0);
        assert_driver_empty(&pool);
    }
}

/// "A second free of the same pointer is an unknown-pointer error that changes
/// nothing", for memory a cache handed out and memory the books handed out.
#[test]
fn double_free_on_one_thread() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, _sim) = pool(GIB, policy);
        pool.retention_begin().unwrap();
        let bytes = if policy.is_segments() {
            64 << 10
        } else {
            2 * MIB
        };
        // Books-handed (the first allocation), freed into the cache.
        let p = pool.allocate_raw(bytes).unwrap();
        pool.free_raw(p).unwrap();
        let s = check(&pool);
        assert_eq!(s.thread_cache_count, 1);
        unknown(pool.free_raw(p), p);
        assert_eq!(check(&pool), s, "the second free changed nothing");
        // Cache-handed, freed back into the cache.
        let q = pool.allocate_raw(bytes).unwrap();
        assert_eq!(q, p);
        pool.free_raw(q).unwrap();
        let s = check(&pool);
        unknown(pool.free_raw(q), q);
        assert_eq!(check(&pool), s);
        pool.retention_finish().unwrap();
        let s = check(&pool);
        assert_eq!((s.live_count, s.allocations, s.frees), (0, 2, 2));
        assert_driver_empty(&pool);
    }
}

/// Of two frees of one pointer racing on two threads, exactly one succeeds and the
/// other is an unknown pointer: memory handed out by the first thread's cache, by
/// the books, and freed by its owner racing another thread (a remote free) or by
/// two threads that own neither.
#[test]
fn double_frees_racing_on_two_threads() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, _sim) = pool(GIB, policy);
        let bytes = if policy.is_segments() {
            64 << 10
        } else {
            2 * MIB
        };
        pool.retention_begin().unwrap();
        let rounds = 300;
        let slot = Mutex::new(0u64);
        let go = Barrier::new(3);
        let done = Barrier::new(3);
        let oks = Mutex::new(Vec::new());
        thread::scope(|t| {
            for who in 0..2 {
                let (pool, slot, go, done, oks) = (&pool, &slot, &go, &done, &oks);
                t.spawn(move || {
                    for round in 0..rounds {
                        go.wait();
                        let p = *slot.lock().unwrap();
                        // Round kinds 0, 1: the main thread owns it and this thread
                        // (who 0) races a thread that does not (who 1).
                        let r = pool.free_raw(p);
                        if let Err(e) = &r {
                            assert!(
                                matches!(e, Error::UnknownPointer { ptr } if *ptr == p),
                                "{e}"
                            );
                        }
                        oks.lock().unwrap().push((round, who, r.is_ok()));
                        done.wait();
                    }
                });
            }
            for round in 0..rounds {
                // Alternately books-handed (the caches emptied by a miss) and
                // cache-handed memory.
                let p = if round % 2 == 0 {
                    cache_handed(&pool, bytes)
                } else {
                    pool.allocate_raw(bytes).unwrap()
                };
                *slot.lock().unwrap() = p;
                go.wait();
                done.wait();
                let s = invariants(&pool);
                assert_eq!(s.live_count, 0, "round {round}: freed once");
            }
        });
        let oks = oks.into_inner().unwrap();
        for round in 0..rounds {
            let won = oks.iter().filter(|&&(r, _, ok)| r == round && ok).count();
            assert_eq!(won, 1, "round {round}: one free wins");
        }
        let s = check(&pool);
        assert_eq!(s.allocations, s.frees);
        // Every allocation after the first few was served by reuse.
        assert!(s.mappings_created + s.reuse_hits >= s.allocations);
        pool.retention_finish().unwrap();
        check(&pool);
        assert_driver_empty(&pool);
    }
}

/// A guard frees only its own allocation (`Allocation::id`): after the pointer was
/// freed behind it and handed out again (by a cache, or by the books), dropping the
/// stale guard frees nothing; a guard of cache-handed memory that a scope's end gave
/// to the books still frees it.
#[test]
fn stale_guards_free_nothing() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, _sim) = pool(GIB, policy);
        let bytes = if policy.is_segments() { 4096 } else { 2 * MIB };
        pool.retention_begin().unwrap();
        // A guard of cache-handed memory; the pointer freed behind it and handed
        // out again by the cache.
        let p = cache_handed(&pool, bytes);
        pool.free_raw(p).unwrap();
        let g = pool.allocate(bytes).unwrap();
        assert_eq!(g.ptr(), p);
        pool.free_raw(p).unwrap();
        let q = pool.allocate_raw(bytes).unwrap();
        assert_eq!(q, p, "the cache hands the same address out again");
        let s = check(&pool);
        drop(g);
        assert_eq!(check(&pool), s, "the stale guard freed nothing");
        pool.free_raw(q).unwrap();

        // A guard of books-handed memory (the cache drained by a finish), the
        // address then handed out by a cache.
        pool.retention_finish().unwrap();
        pool.retention_begin().unwrap();
        let g = pool.allocate(bytes).unwrap();
        let p = g.ptr();
        pool.free_raw(p).unwrap();
        let q = pool.allocate_raw(bytes).unwrap();
        assert_eq!(q, p);
        assert_eq!(
            pool.snapshot().thread_cache_hits,
            4,
            "cache_handed, g, q, and q again"
        );
        let s = check(&pool);
        drop(g);
        assert_eq!(check(&pool), s, "the stale books guard freed nothing");
        pool.free_raw(q).unwrap();

        // A guard of cache-handed memory across a scope's end (now live in the
        // books) still frees its allocation, once.
        let g = pool.allocate(bytes).unwrap();
        assert_eq!(pool.snapshot().thread_cache_hits, 5);
        pool.retention_finish().unwrap();
        assert_eq!(check(&pool).live_count, 1);
        pool.retention_begin().unwrap();
        // ... and a stale copy of its key (freed, reallocated at the address by
        // the cache) is refused: free it behind the guard first.
        let p = g.ptr();
        pool.free_raw(p).unwrap();
        let q = pool.allocate_raw(bytes).unwrap();
        assert_eq!(q, p);
        let s = check(&pool);
        drop(g);
        assert_eq!(check(&pool), s);
        pool.free_raw(q).unwrap();
        let g = pool.allocate(bytes).unwrap();
        pool.retention_finish().unwrap();
        drop(g);
        let s = check(&pool);
        assert_eq!(s.live_count, 0, "the guard freed its allocation");
        assert_eq!(s.allocations, s.frees);
        assert_driver_empty(&pool);
    }
}

/// Stream calls on memory a cache handed out: `free_async` frees it on the stream
/// (reused on that stream at once, never by a cache), `record_stream` then a
/// synchronous free keeps it out of every cache ("memory freed on streams, with a
/// stream recorded ... never enters a cache"); a second free of either kind is an
/// unknown pointer.
#[test]
fn stream_calls_on_cache_handed_memory() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, sim) = pool(GIB, policy);
        let bytes = if policy.is_segments() { 4096 } else { 2 * MIB };
        let (s1, s2) = (stream(&sim), stream(&sim));
        pool.retention_begin().unwrap();
        let p = cache_handed(&pool, bytes);
        pool.free_async_raw(p, s1).unwrap();
        let s = check(&pool);
        assert_eq!((s.live_count, s.thread_cache_count), (0, 0));
        unknown(pool.free_raw(p), p);
        unknown(pool.free_async_raw(p, s1), p);
        unknown(pool.record_stream(p, s2), p);
        assert_eq!(check(&pool).frees, s.frees);
        // Stream order: s1 takes it back at once.
        let a = pool.allocate_async_raw(bytes, s1).unwrap();
        assert_eq!(a, p);
        pool.free_async_raw(a, s1).unwrap();
        assert_eq!(
            check(&pool).thread_cache_count,
            0,
            "stream frees skip caches"
        );

        // record_stream on cache-handed memory, then a synchronous free.
        let q = cache_handed(&pool, 3 * bytes);
        pool.record_stream(q, s2).unwrap();
        pool.free_raw(q).unwrap();
        let s = check(&pool);
        assert_eq!(s.thread_cache_count, 0, "recorded memory skips caches");
        assert_eq!(s.live_count, 0);
        unknown(pool.free_raw(q), q);
        unknown(pool.record_stream(q, s2), q);

        // A guard of cache-handed memory, recorded on a stream, frees it on drop.
        let g = pool.allocate(5 * bytes).unwrap();
        drop(g);
        let g = pool.allocate(5 * bytes).unwrap();
        assert!(pool.snapshot().thread_cache_hits >= 3);
        pool.record_stream(g.ptr(), s2).unwrap();
        drop(g);
        let s = check(&pool);
        assert_eq!(s.live_count, 0);
        assert_eq!(s.allocations, s.frees);
        pool.retention_finish().unwrap();
        check(&pool);
        assert_driver_empty(&pool);
    }
}

/// With `release_threshold_bytes = u64::MAX` the caches hold memory outside any
/// scope; `trim` ("releases every idle mapping now"), from another thread, releases
/// what this thread's cache holds, and the caches keep working afterwards.
#[test]
fn trim_with_no_threshold_releases_cached_memory() {
    for policy in [
        ReusePolicy::BestFit,
        ReusePolicy::Exact,
        ReusePolicy::Segments,
    ] {
        let (pool, _sim) = open_pool(GIB, policy);
        let unit = if policy.is_segments() {
            64 << 10
        } else {
            2 * MIB
        };
        let ptrs: Vec<u64> = (1..=4)
            .map(|i| pool.allocate_raw(i * unit).unwrap())
            .collect();
        for &p in &ptrs {
            pool.free_raw(p).unwrap();
        }
        let s = check(&pool);
        assert!(!s.scope_open);
        assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (4, 10 * unit));
        let p = pool.allocate_raw(3 * unit).unwrap();
        assert_eq!(p, ptrs[2]);
        assert_eq!(
            pool.snapshot().thread_cache_hits,
            1,
            "{policy:?}: {:#?}",
            pool.snapshot()
        );
        pool.free_raw(p).unwrap();
        thread::scope(|t| {
            t.spawn(|| pool.trim().unwrap());
        });
        let s = check(&pool);
        assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (0, 0));
        assert_eq!(
            (s.physical_bytes, s.idle_bytes, s.block_free_bytes),
            (0, 0, 0)
        );
        assert_driver_empty(&pool);
        // The caches still work.
        let p = pool.allocate_raw(unit).unwrap();
        pool.free_raw(p).unwrap();
        assert_eq!(pool.allocate_raw(unit).unwrap(), p);
        assert_eq!(pool.snapshot().thread_cache_hits, 2);
        pool.free_raw(p).unwrap();
        pool.trim().unwrap();
        check(&pool);
        assert_driver_empty(&pool);
    }
}

/// Out of memory while another thread's cache holds idle memory. Whole mappings:
/// a request that the cached memory fits is served without creating memory ("a
/// cache never makes the pool create memory that one holds idle"); one it does not
/// fit fails inside a scope with the cached bytes reported idle and nothing
/// released, and succeeds outside one (threshold `u64::MAX`) after the release.
#[test]
fn out_of_memory_with_memory_in_another_threads_cache() {
    for in_scope in [true, false] {
        let (pool, _sim) = open_pool(8 * MIB, ReusePolicy::BestFit);
        let pool = if in_scope {
            pool.retention_begin().unwrap();
            pool
        } else {
            pool
        };
        let fill = |pool: &Pool| {
            thread::scope(|t| {
                t.spawn(|| {
                    let ptrs: Vec<u64> = (0..4)
                        .map(|_| pool.allocate_raw(2 * MIB).unwrap())
                        .collect();
                    for p in ptrs {
                        pool.free_raw(p).unwrap();
                    }
                });
            });
        };
        fill(&pool);
        let s = check(&pool);
        assert_eq!((s.thread_cache_count, s.physical_bytes), (4, 8 * MIB));
        let created = s.mappings_created;
        // Fits what the other cache holds: no new mapping.
        let p = pool.allocate_raw(2 * MIB).unwrap();
        let s = check(&pool);
        assert_eq!(s.mappings_created, created);
        assert_eq!(s.live_mapped_bytes, 2 * MIB);
        pool.free_raw(p).unwrap();
        let s = check(&pool);
        assert_eq!(s.idle_bytes, 8 * MIB);
        // Fits nothing idle.
        let r = pool.allocate_raw(4 * MIB);
        if in_scope {
            match r {
                Err(Error::OutOfMemory {
                    requested,
                    live,
                    idle,
                    in_scope,
                    ..
                }) => {
                    assert_eq!(
                        (requested, live, idle, in_scope),
                        (4 * MIB, 0, 8 * MIB, true)
                    );
                }
                other => panic!("expected out of memory in the scope, got {other:?}"),
            }
            let s = check(&pool);
            assert_eq!(s.physical_bytes, 8 * MIB, "nothing released in the scope");
            pool.retention_finish().unwrap();
        } else {
            let p = r.unwrap();
            let s = check(&pool);
            assert_eq!(s.live_mapped_bytes, 4 * MIB);
            assert_eq!(s.oom_retries, 1);
            assert!(s.physical_bytes <= 8 * MIB);
            pool.free_raw(p).unwrap();
            pool.trim().unwrap();
        }
        check(&pool);
        assert_driver_empty(&pool);
    }
}

/// "allocate pops the thread's entry of exactly the rounded size (else the smallest
/// within the policy's bound)": under `exact` and for segment blocks (no bound), an
/// entry of the exact size is a hit wherever it sits in the cache, also behind
/// larger entries freed after it.
#[test]
fn exact_entry_behind_larger_ones_is_a_hit() {
    for policy in [
        ReusePolicy::Exact,
        ReusePolicy::Segments,
        ReusePolicy::BestFit,
    ] {
        let (pool, _sim) = pool(GIB, policy);
        let unit = if policy.is_segments() { 4096 } else { 2 * MIB };
        pool.retention_begin().unwrap();
        let ptrs: Vec<u64> = (1..=3)
            .map(|i| pool.allocate_raw(i * unit).unwrap())
            .collect();
        // Freed smallest first: the larger entries are the most recent.
        for &p in &ptrs {
            pool.free_raw(p).unwrap();
        }
        let s = check(&pool);
        assert_eq!(s.thread_cache_count, 3);
        let p = pool.allocate_raw(unit).unwrap();
        assert_eq!(p, ptrs[0]);
        let s = check(&pool);
        assert_eq!(s.thread_cache_hits, 1, "{policy:?}: served by the cache");
        assert_eq!(
            s.thread_cache_count, 2,
            "{policy:?}: the other entries stay cached"
        );
        pool.free_raw(p).unwrap();
        pool.retention_finish().unwrap();
        check(&pool);
        assert_driver_empty(&pool);
    }
}

/// Segment mode: blocks idle in another thread's cache are free memory of the heap.
/// Inside a scope a request of another size, on a full device, is carved from them
/// once the caches are drained: without caches the blocks would be free in the heap
/// and the carve would need no driver call, so caches must not turn it into an
/// out-of-memory error. Outside a scope (threshold `u64::MAX`) likewise.
#[test]
fn segment_out_of_memory_with_blocks_in_another_threads_cache() {
    for in_scope in [true, false] {
        let (pool, _sim) = open_pool(2 * MIB, ReusePolicy::Segments);
        if in_scope {
            pool.retention_begin().unwrap();
        }
        // The filling thread stays alive while the main thread allocates (an
        // exited thread's cache would be adopted, and drained, by the main thread).
        let filled = Barrier::new(2);
        let checked = Barrier::new(2);
        thread::scope(|t| {
            t.spawn(|| {
                let ptrs: Vec<u64> = (0..8)
                    .map(|_| pool.allocate_raw(256 << 10).unwrap())
                    .collect();
                for p in ptrs {
                    pool.free_raw(p).unwrap();
                }
                filled.wait();
                checked.wait();
            });
            filled.wait();
            let s = check(&pool);
            assert_eq!((s.thread_cache_count, s.physical_bytes), (8, 2 * MIB));
            let r = pool.allocate_raw(512 << 10);
            checked.wait();
            let p = r.expect("carved from the drained blocks");
            let s = check(&pool);
            assert_eq!(s.physical_bytes, 2 * MIB);
            assert_eq!(s.block_live_bytes, 512 << 10);
            assert_eq!(s.thread_cache_count, 0);
            pool.free_raw(p).unwrap();
        });
        if in_scope {
            pool.retention_finish().unwrap();
        } else {
            pool.trim().unwrap();
        }
        check(&pool);
        assert_driver_empty(&pool);
    }
}

/// A small deterministic generator (xorshift), one per thread.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Worker threads allocate and free (raw and through guards, up to `hold` live
/// each) while another thread begins, finishes and aborts scopes and another takes
/// snapshots, each checked against the invariants. At the end everything was freed
/// once: the books match the driver, and a trim leaves the driver empty.
fn scopes_racing(policy: ReusePolicy, threshold: u64) {
    let (pool, _sim) = simulated_pool(
        4 * GIB,
        PoolConfig {
            reuse_policy: policy,
            release_threshold_bytes: threshold,
            thread_cache_entries: 8,
            ..PoolConfig::default()
        },
    );
    let unit = if policy.is_segments() {
        16 << 10
    } else {
        2 * MIB
    };
    let workers = 4;
    let ops = 3000;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (mut finished, mut aborted) = (0u64, 0u64);
    thread::scope(|t| {
        let mut handles = Vec::new();
        for w in 0..workers {
            let pool = &pool;
            handles.push(t.spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (w + 1));
                let mut raw: Vec<u64> = Vec::new();
                let mut guards = Vec::new();
                for _ in 0..ops {
                    let bytes = unit * (1 + rng.below(4));
                    match rng.below(4) {
                        0 | 1 if raw.len() < 4 => raw.push(pool.allocate_raw(bytes).unwrap()),
                        2 if guards.len() < 4 => guards.push(pool.allocate(bytes).unwrap()),
                        0 | 1 if !raw.is_empty() => {
                            let p = raw.swap_remove(rng.below(raw.len() as u64) as usize);
                            pool.free_raw(p).unwrap();
                        }
                        _ if !guards.is_empty() => {
                            guards.swap_remove(rng.below(guards.len() as u64) as usize);
                        }
                        _ => {}
                    }
                }
                for p in raw {
                    pool.free_raw(p).unwrap();
                }
            }));
        }
        let scopes = {
            let (pool, stop) = (&pool, &stop);
            t.spawn(move || {
                let (mut f, mut a) = (0u64, 0u64);
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    match i % 3 {
                        0 => {
                            let s = pool.retention_scope().unwrap();
                            thread::yield_now();
                            drop(s); // aborted
                            a += 1;
                        }
                        1 => {
                            pool.retention_begin().unwrap();
                            thread::yield_now();
                            pool.retention_finish().unwrap();
                            f += 1;
                        }
                        _ => {
                            pool.retention_begin().unwrap();
                            pool.retention_abort().unwrap();
                            a += 1;
                        }
                    }
                    invariants(pool);
                }
                (f, a)
            })
        };
        {
            let (pool, stop) = (&pool, &stop);
            t.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    invariants(pool);
                }
            });
        }
        for h in handles {
            h.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (finished, aborted) = scopes.join().unwrap();
    });
    let s = check(&pool);
    assert!(!s.scope_open);
    assert_eq!((s.scopes_finished, s.scopes_aborted), (finished, aborted));
    assert_eq!(s.live_count, 0, "every allocation freed once");
    assert_eq!(s.allocations, s.frees);
    assert!(s.thread_cache_hits <= s.reuse_hits);
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (0, 0));
    assert_eq!(
        (s.physical_bytes, s.idle_bytes, s.block_free_bytes),
        (0, 0, 0)
    );
    assert_driver_empty(&pool);
}

#[test]
fn scopes_racing_allocations_whole_mappings() {
    scopes_racing(ReusePolicy::BestFit, 0);
    scopes_racing(ReusePolicy::Exact, u64::MAX);
}

#[test]
fn scopes_racing_allocations_segments() {
    scopes_racing(ReusePolicy::Segments, 0);
    scopes_racing(ReusePolicy::Segments, u64::MAX);
}

/// Threads that exit holding cached memory: their entries stay counted (idle, in
/// the caches) until a thread adopts the orphaned cache, a miss or a release point
/// drains it; a free of memory an exited thread's cache handed out goes to that
/// cache's remote list. Nothing is lost or created twice: the next thread that
/// needs the sizes reuses them, and the scope's end releases everything.
#[test]
fn threads_exit_holding_cached_memory() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, _sim) = pool(GIB, policy);
        let unit = if policy.is_segments() { 8192 } else { 2 * MIB };
        pool.retention_begin().unwrap();
        // The main thread gets a cache of its own first (one entry of 7 units):
        // it never adopts an exited thread's.
        let m = pool.allocate_raw(7 * unit).unwrap();
        pool.free_raw(m).unwrap();
        // Four threads each cache four entries and leave one allocation live that
        // their cache handed out. Every thread allocates before any frees (no miss
        // drains another thread's cache).
        let allocated = Barrier::new(4);
        let live: Vec<u64> = thread::scope(|t| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    t.spawn(|| {
                        let ptrs: Vec<u64> = (1..=5)
                            .map(|i| pool.allocate_raw(i * unit).unwrap())
                            .collect();
                        allocated.wait();
                        for &p in &ptrs {
                            pool.free_raw(p).unwrap();
                        }
                        pool.allocate_raw(5 * unit).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let s = check(&pool);
        // 4 entries per exited thread, and the main thread's: with whole mappings it
        // stays cached (7 units is more than 30% above any request); in segment mode
        // the threads' first misses take every cached small block (the main thread's
        // included) back to its heap before a growth, where it coalesces.
        let main_cached = u64::from(!policy.is_segments());
        assert_eq!(s.thread_cache_count, 16 + main_cached, "{policy:?}");
        assert_eq!(s.thread_cache_hits, 4);
        assert_eq!(s.live_count, 4);
        let created = s.mappings_created;
        // The main thread frees what the exited threads' caches handed out.
        for p in live {
            pool.free_raw(p).unwrap();
        }
        let s = check(&pool);
        assert_eq!(
            s.thread_cache_count,
            20 + main_cached,
            "remote frees to the exited threads' caches"
        );
        assert_eq!(s.remote_frees, 4);
        assert_eq!(s.live_count, 0);
        // New threads need the same sizes: nothing new is created.
        thread::scope(|t| {
            for _ in 0..4 {
                t.spawn(|| {
                    let ptrs: Vec<u64> = (1..=5)
                        .map(|i| pool.allocate_raw(i * unit).unwrap())
                        .collect();
                    for p in ptrs {
                        pool.free_raw(p).unwrap();
                    }
                });
            }
        });
        let s = check(&pool);
        assert_eq!(
            s.mappings_created, created,
            "{policy:?}: the cached memory served"
        );
        assert_eq!(s.live_count, 0);
        pool.retention_finish().unwrap();
        let s = check(&pool);
        assert_eq!((s.thread_cache_count, s.physical_bytes), (0, 0));
        assert_driver_empty(&pool);
    }
}

/// A pool dropped while other threads still hold its caches in their
/// thread-locals (cached entries and cache-handed memory included): the drop
/// releases everything, and those threads go on with other pools.
#[test]
fn pool_dropped_while_threads_hold_its_caches() {
    let go = Arc::new(Barrier::new(2));
    let dropped = Arc::new(Barrier::new(2));
    let (pool, sim) = pool(GIB, ReusePolicy::BestFit);
    let pool = Arc::new(pool);
    {
        let p2 = Arc::clone(&pool);
        let (go2, dropped2) = (Arc::clone(&go), Arc::clone(&dropped));
        let h = thread::spawn(move || {
            p2.retention_begin().unwrap();
            let a = p2.allocate_raw(2 * MIB).unwrap();
            p2.free_raw(a).unwrap();
            let live = p2.allocate_raw(2 * MIB).unwrap(); // cache-handed, never freed
            let b = p2.allocate_raw(4 * MIB).unwrap();
            p2.free_raw(b).unwrap(); // cached
            assert_eq!(p2.snapshot().thread_cache_hits, 1);
            let _ = live;
            drop(p2);
            go2.wait();
            dropped2.wait();
            // This thread's locals still name the dropped pool's cache; other pools
            // work, on this thread, many at once.
            let pools: Vec<Pool> = (0..20)
                .map(|_| Pool::new(PoolConfig::default()).unwrap())
                .collect();
            for p in &pools {
                p.retention_begin().unwrap();
            }
            for round in 0..3 {
                for p in &pools {
                    let x = p.allocate_raw(2 * MIB).unwrap();
                    p.free_raw(x).unwrap();
                    assert_eq!(p.snapshot().thread_cache_hits, round);
                }
            }
            for p in &pools {
                p.retention_finish().unwrap();
                let s = check(p);
                assert_eq!((s.physical_bytes, s.thread_cache_hits), (0, 2));
                assert_driver_empty(p);
            }
        });
        go.wait();
        // The last reference: the pool is dropped here, on another thread than the
        // one whose locals hold its cache.
        let pool = Arc::try_unwrap(pool).expect("the other thread let go");
        drop(pool);
        dropped.wait();
        h.join().unwrap();
    }
    let d = sim.state();
    assert_eq!(
        (d.physical_bytes, d.handles, d.mappings, d.reservations),
        (0, 0, 0, 0)
    );
}

/// More threads at once than the registry holds (256 caches per pool): the threads
/// beyond it use the books ("further threads use the books"); frees across threads
/// with and without caches, of memory the caches and the books handed out, keep
/// the snapshot exact, and the scope's end releases everything.
#[test]
fn more_threads_than_caches() {
    let threads = 300usize;
    let (pool, _sim) = pool(4 * GIB, ReusePolicy::BestFit);
    pool.retention_begin().unwrap();
    let phase = Barrier::new(threads);
    let ptrs: Vec<Mutex<u64>> = (0..threads).map(|_| Mutex::new(0)).collect();
    thread::scope(|t| {
        for i in 0..threads {
            let (pool, phase, ptrs) = (&pool, &phase, &ptrs);
            t.spawn(move || {
                let p = pool.allocate_raw(2 * MIB).unwrap();
                phase.wait();
                pool.free_raw(p).unwrap();
                phase.wait();
                *ptrs[i].lock().unwrap() = pool.allocate_raw(2 * MIB).unwrap();
                phase.wait();
                let q = *ptrs[(i + 1) % threads].lock().unwrap();
                pool.free_raw(q).unwrap();
            });
        }
    });
    let s = check(&pool);
    assert_eq!(
        s.mappings_created, threads as u64,
        "every second allocation reused"
    );
    assert_eq!(s.allocations, 2 * threads as u64);
    assert_eq!(s.reuse_hits, threads as u64);
    assert_eq!(s.thread_cache_hits, 256, "one hit per registered cache");
    assert_eq!(s.live_count, 0);
    assert_eq!(
        (s.idle_count, s.idle_bytes),
        (threads as u64, 2 * MIB * threads as u64)
    );
    assert!(s.thread_cache_count <= 256 * 2);
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.thread_cache_count), (0, 0));
    assert_driver_empty(&pool);
}

/// With all 256 registry slots taken by live threads, a further thread has no
/// cache (its pair goes through the books); once one of those threads exits, the
/// further thread's next call adopts its orphaned cache (after draining it) and
/// then hits. The registry is not searched while it is full with no orphan, so
/// this checks that an exit is still seen.
#[test]
fn a_full_registry_hands_an_exited_threads_cache_to_a_waiting_thread() {
    let holders = 256usize;
    let (pool, sim) = pool(4 * GIB, ReusePolicy::BestFit);
    pool.retention_begin().unwrap();
    // Every holder allocates before any frees (a miss takes what fits from other
    // caches: a later holder would take an earlier one's idle 2 MiB).
    let allocated = Barrier::new(holders);
    let registered = Barrier::new(holders + 1);
    // Set on the way out of the scope, a panic included (a barrier would hang).
    let finished = AtomicBool::new(false);
    let (leave_tx, leave_rx) = std::sync::mpsc::channel::<()>();
    let mut leave_rx = Some(leave_rx);
    thread::scope(|t| {
        let _finish = SetOnDrop(&finished);
        let mut leaver = None;
        for i in 0..holders {
            let (pool, allocated, registered, finished) =
                (&pool, &allocated, &registered, &finished);
            let rx = if i == 0 { leave_rx.take() } else { None };
            let h = t.spawn(move || {
                let a = pool.allocate_raw(2 * MIB).unwrap();
                allocated.wait();
                pool.free_raw(a).unwrap();
                registered.wait();
                match rx {
                    Some(rx) => {
                        let _ = rx.recv();
                    }
                    None => {
                        while !finished.load(Ordering::SeqCst) {
                            thread::sleep(std::time::Duration::from_millis(1));
                        }
                    }
                }
            });
            if i == 0 {
                leaver = Some(h);
            }
        }
        registered.wait();
        // Every slot is a live thread's, each holding its own 2 MiB.
        let s = check(&pool);
        assert_eq!((s.thread_cache_count, s.thread_cache_hits), (256, 0));
        assert_eq!(s.mappings_created, 256);
        // No cache for this thread: 4 MiB is created (no 2 MiB entry fits it),
        // freed to the books and reused from them.
        let p = pool.allocate_raw(4 * MIB).unwrap();
        pool.free_raw(p).unwrap();
        assert_eq!(
            check(&pool).thread_cache_count,
            256,
            "the free went to the books"
        );
        assert_eq!(pool.allocate_raw(4 * MIB).unwrap(), p);
        let s = check(&pool);
        assert_eq!((s.reuse_hits, s.thread_cache_hits), (1, 0));
        leave_tx.send(()).unwrap();
        leaver.take().unwrap().join().unwrap();
        // The leaver's cache is orphaned: this free registers, adopts it (its 2 MiB
        // goes to the books) and caches `p`; the next allocation hits.
        pool.free_raw(p).unwrap();
        let s = check(&pool);
        assert_eq!(
            (s.thread_cache_count, s.thread_cache_bytes),
            (256, 255 * 2 * MIB + 4 * MIB)
        );
        assert_eq!(pool.allocate_raw(4 * MIB).unwrap(), p);
        assert_eq!(check(&pool).thread_cache_hits, 1);
        pool.free_raw(p).unwrap();
    });
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.mappings_created), (0, 257));
    assert_driver_empty(&pool);
    drop(sim);
}

/// Sets its flag when dropped, on a panic's unwinding too.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
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

/// A guard's key carries the generation of its hand-out, and "a stale guard never
/// frees a later allocation at the same address" holds however many hand-outs came
/// between (table.rs: the generation has 46 bits, bumped at every hand-out, so it
/// comes back only after 2^46 of them): a guard whose memory was freed behind it and
/// handed out 8 more times by the cache frees nothing on drop. (A generation kept
/// in fewer bits, or bumped so that it cycles, would meet an old key again within
/// a few hand-outs: 8 hand-outs meet it for every period that divides 8.)
#[test]
fn a_guard_stale_by_eight_hand_outs_frees_nothing() {
    let (pool, _sim) = pool(GIB, ReusePolicy::BestFit);
    pool.retention_begin().unwrap();
    let p = cache_handed(&pool, 2 * MIB);
    pool.free_raw(p).unwrap();
    let g = pool.allocate(2 * MIB).unwrap();
    assert_eq!(g.ptr(), p);
    let hits = pool.snapshot().thread_cache_hits;
    for _ in 0..8 {
        pool.free_raw(p).unwrap();
        assert_eq!(pool.allocate_raw(2 * MIB).unwrap(), p);
    }
    assert_eq!(
        pool.snapshot().thread_cache_hits,
        hits + 8,
        "every one from the cache"
    );
    let s = check(&pool);
    assert_eq!(s.live_count, 1);
    drop(g);
    assert_eq!(check(&pool), s, "the stale guard freed nothing");
    pool.free_raw(p).unwrap();
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!((s.live_count, s.allocations, s.frees), (0, 11, 11));
}

/// "A miss of the pool drains every cache before it creates memory" (`PoolConfig`'s
/// thread caches): a block request that no heap fits is served from blocks idle in
/// another thread's cache, which go back to their heap, coalesce there and are
/// carved as an ordinary fit (no forced reuse, no new handle: the device, one 2 MiB
/// handle, has no room for one anyway). Here another thread's cache holds two
/// adjacent 512 KiB blocks (its own frees, so this thread's own cache is empty),
/// the rest of the handle is live, and a 1 MiB request is carved from the two, at
/// the first one's address.
#[test]
fn a_block_miss_on_a_full_device_takes_back_other_threads_cached_blocks() {
    let (pool, _sim) = pool(2 * MIB, ReusePolicy::Segments);
    pool.retention_begin().unwrap();
    let live = pool.allocate_raw(MIB).unwrap();
    let (freed, asked) = (Barrier::new(2), Barrier::new(2));
    // Values are checked after both threads are done: a failed check must not
    // leave the other waiting at a barrier.
    let (a, b, cached, got) = thread::scope(|t| {
        let other = t.spawn(|| {
            let a = pool.allocate_raw(512 << 10);
            let b = pool.allocate_raw(512 << 10);
            for p in [&a, &b].into_iter().flatten() {
                let _ = pool.free_raw(*p);
            }
            freed.wait();
            // This thread (and its cache) stays until the request is served.
            asked.wait();
            (a, b)
        });
        freed.wait();
        let cached = pool.snapshot().thread_cache_bytes;
        let got = pool.allocate_raw(MIB);
        asked.wait();
        let (a, b) = other.join().unwrap();
        (a, b, cached, got)
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(b, a + (512 << 10), "adjacent, after the live block");
    assert_eq!(cached, MIB, "both in that thread's cache");
    assert_eq!(
        got.unwrap(),
        a,
        "carved from the two freed blocks, coalesced"
    );
    let s = check(&pool);
    assert_eq!((s.thread_cache_bytes, s.physical_bytes), (0, 2 * MIB));
    assert_eq!(
        s.reuse_forced_hits, 0,
        "an ordinary fit in the heap, not a forced reuse"
    );
    pool.free_raw(a).unwrap();
    pool.free_raw(live).unwrap();
    pool.retention_finish().unwrap();
    assert_eq!(check(&pool).live_count, 0);
}
