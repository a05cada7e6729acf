//! Thread caches (issue 13): a pointer a cache handed out is an allocation like any
//! other: a double free is refused (also two racing on two threads), an interior
//! pointer is unknown, a stale guard frees nothing (however many hand-outs came
//! between), and `record_stream` and `free_async` take it.

use crate::common;

use std::thread;

use crate::caching::{
    cache_handed, cache_handed_of, default_pool, invariants, is_unknown, pool, released_once,
    unknown,
};
use common::{assert_driver_empty, check, stream, GIB, MIB};
use flare_package::{Error, ReusePolicy};
use std::sync::{Barrier, Mutex};

/// A second free of a cache-handed pointer (still in the cache, from another
/// thread, after the cache was drained to the books) is `UnknownPointer` and
/// changes nothing; so is a free of an address inside it.
#[test]
fn double_free_of_a_cache_handed_pointer_is_refused() {
    let (pool, sim) = default_pool();
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(p, a);
    assert!(is_unknown(pool.free_raw(p + 512)), "an interior address");
    pool.free_raw(p).unwrap();
    let before = check(&pool);
    assert_eq!(before.thread_cache_count, 1);
    assert!(is_unknown(pool.free_raw(p)), "in the cache");
    thread::scope(|t| {
        t.spawn(|| assert!(is_unknown(pool.free_raw(p)), "from another thread"));
    });
    assert_eq!(check(&pool), before);
    // Handed out again and freed by another thread (to this thread's remote list):
    // a second free there is refused too.
    let q = pool.allocate_raw(2 * MIB).unwrap();
    thread::scope(|t| {
        t.spawn(|| {
            pool.free_raw(q).unwrap();
            assert!(is_unknown(pool.free_raw(q)), "on the remote list");
        });
    });
    let s = check(&pool);
    assert!(
        is_unknown(pool.free_raw(q)),
        "on the remote list, from the owner"
    );
    assert_eq!(check(&pool), s);
    assert_eq!((s.remote_frees, s.frees, s.live_count), (1, 3, 0));
    // Drained to the books by a miss (8 MiB): refused there too.
    let big = pool.allocate_raw(8 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.idle_count), (0, 1));
    assert!(is_unknown(pool.free_raw(a)));
    assert_eq!(check(&pool), s);
    pool.free_raw(big).unwrap();
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// A stale guard: its memory freed with `free_raw`, then handed out again through
/// the cache (same address, a new allocation). Dropping the old guard frees
/// nothing: the new allocation stays live. Both for a guard the books handed out
/// and for one a cache handed out.
#[test]
fn a_stale_guard_does_not_free_the_cache_handed_allocation() {
    let (pool, sim) = default_pool();
    pool.retention_begin().unwrap();
    // From the books.
    let g = pool.allocate(2 * MIB).unwrap();
    let a = g.ptr();
    pool.free_raw(a).unwrap();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(p, a);
    assert_eq!(check(&pool).thread_cache_hits, 1);
    let before = check(&pool);
    drop(g);
    let s = check(&pool);
    assert_eq!(s, before, "the stale guard changed something");
    assert_eq!(s.live_count, 1);
    // From the cache: the guard holds the cache's key.
    pool.free_raw(p).unwrap();
    let g = pool.allocate(2 * MIB).unwrap();
    assert_eq!((g.ptr(), check(&pool).thread_cache_hits), (a, 2));
    pool.free_raw(g.ptr()).unwrap();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!((p, check(&pool).thread_cache_hits), (a, 3));
    let before = check(&pool);
    drop(g);
    assert_eq!(check(&pool), before);
    // A live guard from the cache frees its allocation.
    pool.free_raw(p).unwrap();
    let g = pool.allocate(2 * MIB).unwrap();
    drop(g);
    let s = check(&pool);
    assert_eq!(
        (s.live_count, s.thread_cache_count, s.thread_cache_hits),
        (0, 1, 4)
    );
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// `record_stream` on a cache-handed pointer settles the caches first (the
/// allocation is then live in the books); its later free keeps it in the books
/// (a recorded stream: never cached).
#[test]
fn record_stream_on_a_cache_handed_pointer() {
    let (pool, sim) = default_pool();
    let s1 = stream(&sim);
    let (a, p) = cache_handed(&pool);
    pool.record_stream(p, s1).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.live_count, s.thread_cache_count, s.thread_cache_hits),
        (1, 0, 1)
    );
    pool.free_raw(p).unwrap();
    let s = check(&pool);
    assert_eq!((s.idle_count, s.thread_cache_count, s.frees), (1, 0, 2));
    // From the books now.
    let q = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(q, a);
    let s = check(&pool);
    assert_eq!(
        (s.reuse_hits, s.thread_cache_hits, s.mappings_created),
        (2, 1, 1)
    );
    pool.free_raw(q).unwrap();
    // The stream of a freed pointer cannot be recorded.
    assert!(matches!(
        pool.record_stream(q, s1),
        Err(Error::UnknownPointer { .. })
    ));
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// `free_async` of a cache-handed pointer settles the caches first and frees it on
/// the stream: the stream reuses it at once (stream order), and the finish releases
/// it once.
#[test]
fn free_async_of_a_cache_handed_pointer() {
    let (pool, sim) = default_pool();
    let s1 = stream(&sim);
    let (a, p) = cache_handed(&pool);
    pool.free_async_raw(p, s1).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.live_count, s.idle_count, s.thread_cache_count),
        (0, 1, 0)
    );
    assert_eq!(s.frees, 2);
    assert!(matches!(
        pool.free_async_raw(p, s1),
        Err(Error::UnknownPointer { .. })
    ));
    let q = pool.allocate_async_raw(2 * MIB, s1).unwrap();
    assert_eq!(q, a, "the stream reuses what was freed on it");
    let s = check(&pool);
    assert_eq!((s.reuse_hits, s.mappings_created), (2, 1));
    pool.free_async_raw(q, s1).unwrap();
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
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
        let p = cache_handed_of(&pool, bytes);
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
                    cache_handed_of(&pool, bytes)
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
        let p = cache_handed_of(&pool, bytes);
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
    let p = cache_handed_of(&pool, 2 * MIB);
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
        let p = cache_handed_of(&pool, bytes);
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
        let q = cache_handed_of(&pool, 3 * bytes);
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
