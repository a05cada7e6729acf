//! Thread caches (issue 13): every release point (trim, out-of-memory, destroy,
//! drop) drains every thread's cache first; nothing stays in a cache past it and
//! nothing is released twice.

use crate::common;

use std::sync::mpsc;
use std::thread;

use crate::caching::{default_pool, pool_with, released_once};
use common::{assert_driver_empty, check, no_faults, simulated_pool, MIB};
use flare_package::{DriverCall, Error, PoolConfig};

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
