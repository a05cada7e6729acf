//! Thread caches (issue 13): every release point (trim, out-of-memory, destroy,
//! drop) drains every thread's cache first; nothing stays in a cache past it and
//! nothing is released twice. A miss drains every cache (other threads' too) before
//! it creates memory, for whole mappings and blocks alike.

use crate::common;

use std::sync::{mpsc, Barrier};
use std::thread;

use crate::caching::{default_pool, open_pool, pool, pool_with, released_once};
use common::{assert_driver_empty, check, no_faults, simulated_pool, GIB, MIB};
use flare_package::{DriverCall, Error, Pool, PoolConfig, ReusePolicy};

/// Trim drains every thread's cache (threshold `u64::MAX`, caches open outside
/// scopes): two threads each keep one mapping cached; a trim from a third releases
/// both, once.
#[test]
fn trim_drains_every_threads_cache() {
    let (pool, sim) = pool_with(PoolConfig {
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::default()
    });
    // Channels, not barriers: if an assertion here fails, the senders are dropped
    // and the threads stop waiting.
    let (cached_tx, cached_rx) = mpsc::channel();
    thread::scope(|t| {
        let mut go = Vec::new();
        for size in [2 * MIB, 4 * MIB] {
            let (pool, cached_tx) = (&pool, cached_tx.clone());
            let (go_tx, go_rx) = mpsc::channel::<()>();
            go.push(go_tx);
            t.spawn(move || {
                let a = pool.allocate_raw(size).unwrap();
                pool.free_raw(a).unwrap();
                cached_tx.send(()).unwrap();
                if go_rx.recv().is_err() {
                    return;
                }
                // The trim emptied this thread's cache: a new mapping.
                let b = pool.allocate_raw(size).unwrap();
                pool.free_raw(b).unwrap();
            });
        }
        for _ in 0..2 {
            cached_rx.recv().unwrap();
        }
        let s = check(&pool);
        assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (2, 6 * MIB));
        pool.trim().unwrap();
        let s = check(&pool);
        assert_eq!((s.thread_cache_count, s.physical_bytes), (0, 0));
        assert_eq!((s.mappings_created, s.mappings_released), (2, 2));
        for g in go {
            g.send(()).unwrap();
        }
    });
    // Each thread's cache holds its new mapping, unless the other thread's miss
    // drained it after it exited (the sizes never fit each other).
    let s = check(&pool);
    assert_eq!(
        (s.mappings_created, s.idle_count, s.thread_cache_hits),
        (4, 2, 0)
    );
    pool.trim().unwrap();
    released_once(&pool, &sim);
}

/// Out of memory inside a scope: one thread holds 6 MiB in its cache (and is still
/// running); another asks for 4 MiB on a device of 8 MiB. Creating it fails, and the
/// forced reuse, after draining every cache, takes the other thread's 6 MiB mapping
/// (whatever the best-fit bound says) instead of failing.
#[test]
fn out_of_memory_in_a_scope_reuses_another_threads_cached_memory() {
    let (pool, sim) = simulated_pool(8 * MIB, PoolConfig::default());
    pool.retention_begin().unwrap();
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    thread::scope(|t| {
        // Owned here: dropped if an assertion below fails, releasing the thread.
        let done_tx = done_tx;
        let pool = &pool;
        t.spawn(move || {
            let a = pool.allocate_raw(6 * MIB).unwrap();
            pool.free_raw(a).unwrap();
            tx.send(a).unwrap();
            // Alive (its cache not orphaned) until the other thread is done (or
            // failed: then the sender is gone).
            let _ = done_rx.recv();
        });
        let a = rx.recv().unwrap();
        let s = check(pool);
        assert_eq!((s.thread_cache_count, s.physical_bytes), (1, 6 * MIB));
        let p = pool.allocate_raw(4 * MIB).unwrap();
        assert_eq!(p, a, "the other thread's cached mapping");
        let s = check(pool);
        assert_eq!(
            (s.reuse_forced_hits, s.reuse_hits, s.thread_cache_hits),
            (1, 1, 0)
        );
        assert_eq!((s.create_failures, s.mappings_created), (1, 1));
        assert_eq!(
            (s.live_count, s.live_mapped_bytes, s.live_requested_bytes),
            (1, 6 * MIB, 4 * MIB)
        );
        assert_eq!((s.thread_cache_count, s.idle_count), (0, 0));
        // A second one cannot be served: nothing idle left, still in the scope.
        let e = pool.allocate_raw(4 * MIB).unwrap_err();
        assert!(
            matches!(e, Error::OutOfMemory { in_scope: true, .. }),
            "{e}"
        );
        pool.free_raw(p).unwrap();
        done_tx.send(()).unwrap();
    });
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!(s.create_failures, 2);
    assert_eq!((s.mappings_created, s.mappings_released), (1, 1));
    assert_eq!(sim.call_count(DriverCall::Release), 1);
    assert_driver_empty(&pool);
}

/// Destroy drains the caches (an exited thread's, this thread's, one live
/// allocation handed out by a cache) and releases everything once.
#[test]
fn destroy_drains_the_caches_and_releases_once() {
    let (pool, sim) = default_pool();
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(2 * MIB).unwrap();
    let b = pool.allocate_raw(8 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    let live = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(live, a);
    // Another thread's cache (this thread's is registered: it is not adopted).
    thread::scope(|t| {
        t.spawn(|| {
            let c = pool.allocate_raw(4 * MIB).unwrap();
            pool.free_raw(c).unwrap();
        })
        .join()
        .unwrap();
    });
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (2, 12 * MIB));
    assert_eq!(
        (s.live_count, s.thread_cache_hits, s.mappings_created),
        (1, 1, 3)
    );
    pool.destroy().unwrap();
    assert_eq!(sim.state(), flare_package::driver::sim::SimState::default());
    for call in [
        DriverCall::Unmap,
        DriverCall::Release,
        DriverCall::FreeReservation,
    ] {
        assert_eq!(sim.call_count(call), 3, "{call:?}");
    }
    no_faults(&sim);
}

/// Dropping the pool (no destroy) with memory in the caches releases it all once.
#[test]
fn drop_drains_the_caches() {
    let (pool, sim) = pool_with(PoolConfig {
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::default()
    });
    let a = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    let _live = pool.allocate_raw(2 * MIB).unwrap();
    std::mem::forget(pool.allocate(4 * MIB).unwrap());
    let s = check(&pool);
    assert_eq!((s.thread_cache_hits, s.live_count), (1, 2));
    drop(pool);
    assert_eq!(sim.state(), flare_package::driver::sim::SimState::default());
    assert_eq!(sim.call_count(DriverCall::Release), 2);
    no_faults(&sim);
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
