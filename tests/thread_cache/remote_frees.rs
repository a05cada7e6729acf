//! Thread caches (issue 13): a free of memory another thread's cache handed out goes
//! to that cache's remote list, bounded like the cache (entries and bytes), which its
//! owner takes back; memory moved out of another thread's cache leaves its bound.

use crate::common;

use std::sync::mpsc;
use std::thread;

use crate::caching::{cache_handed, default_pool, pool_with, released_once};
use common::{check, MIB};
use flare_package::{DevicePtr, PoolConfig};

/// A cache-handed allocation freed on another thread goes to the owner's remote
/// list (`remote_frees` 1; idle and counted as cached meanwhile); the owner's next
/// allocation of that size takes the list and reuses it: a cache hit, no new
/// mapping.
#[test]
fn a_free_on_another_thread_goes_to_the_owners_remote_list() {
    let (pool, sim) = default_pool();
    let (a, p) = cache_handed(&pool);
    thread::scope(|t| {
        t.spawn(|| pool.free_raw(p).unwrap()).join().unwrap();
    });
    let s = check(&pool);
    assert_eq!(s.remote_frees, 1);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (1, 2 * MIB));
    assert_eq!((s.live_count, s.idle_count, s.frees), (0, 1, 2));
    let q = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(q, a, "the owner reuses what the other thread freed");
    let s = check(&pool);
    assert_eq!(
        (s.thread_cache_hits, s.reuse_hits, s.mappings_created),
        (2, 2, 1)
    );
    assert_eq!((s.thread_cache_count, s.remote_frees), (0, 1));
    // The other way round: the owner frees what it got back; still its own.
    pool.free_raw(q).unwrap();
    assert_eq!(check(&pool).remote_frees, 1);
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// A books-handed allocation (a miss in a scope) is adopted into the allocating
/// thread's cache at once, so a free of it on another thread is a remote free to
/// the allocating thread, whose next allocation of the size takes its remote list
/// and hits: the memory a thread allocates stays its own (ARCHITECTURE, "Thread
/// caches", ownership).
#[test]
fn a_books_handed_allocation_freed_elsewhere_is_that_threads() {
    let (pool, sim) = default_pool();
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(check(&pool).thread_cache_hits, 0, "served by the books");
    thread::scope(|t| {
        t.spawn(|| pool.free_raw(a).unwrap()).join().unwrap();
    });
    let s = check(&pool);
    // On this thread's remote list: held by its cache, not yet taken.
    assert_eq!((s.remote_frees, s.thread_cache_count), (1, 1));
    assert_eq!(pool.allocate_raw(2 * MIB).unwrap(), a);
    let s = check(&pool);
    assert_eq!(
        (s.reuse_hits, s.thread_cache_hits, s.mappings_created),
        (1, 1, 1)
    );
    assert_eq!(s.thread_cache_count, 0);
    pool.free_raw(a).unwrap();
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// A remote list is bounded like the cache (`thread_cache_entries`,
/// `thread_cache_bytes`): with one entry per cache, of four allocations of this
/// thread freed by another, one goes on this thread's remote list, one into the
/// freeing thread's own cache, and two to the books. (Unbounded, all four sat on the
/// remote list of a thread that did not allocate again.)
#[test]
fn the_remote_list_is_bounded_like_the_cache() {
    let (pool, sim) = pool_with(PoolConfig {
        thread_cache_entries: 1,
        ..PoolConfig::default()
    });
    pool.retention_begin().unwrap();
    let ptrs: Vec<DevicePtr> = (0..4)
        .map(|_| pool.allocate_raw(2 * MIB).unwrap())
        .collect();
    thread::scope(|t| {
        t.spawn(|| {
            for &p in &ptrs {
                pool.free_raw(p).unwrap();
            }
            let s = check(&pool);
            assert_eq!(s.remote_frees, 1);
            assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (2, 4 * MIB));
            assert_eq!((s.idle_count, s.live_count), (4, 0));
        })
        .join()
        .unwrap();
    });
    // The remote entry comes back to this thread first.
    let q = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(
        q, ptrs[0],
        "the first free, pushed on this thread's remote list"
    );
    assert_eq!(check(&pool).thread_cache_hits, 1);
    pool.free_raw(q).unwrap();
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// The same bound in bytes: with 2 MiB per cache, a 2 MiB free fills the remote
/// list and the next goes elsewhere.
#[test]
fn the_remote_list_is_bounded_in_bytes() {
    let (pool, sim) = pool_with(PoolConfig {
        thread_cache_bytes: 2 * MIB,
        ..PoolConfig::default()
    });
    pool.retention_begin().unwrap();
    let ptrs: Vec<DevicePtr> = (0..3)
        .map(|_| pool.allocate_raw(2 * MIB).unwrap())
        .collect();
    thread::scope(|t| {
        t.spawn(|| {
            for &p in &ptrs {
                pool.free_raw(p).unwrap();
            }
        })
        .join()
        .unwrap();
    });
    let s = check(&pool);
    assert_eq!(s.remote_frees, 1);
    // One on the remote list, one in the exited thread's cache, one in the books.
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (2, 4 * MIB));
    assert_eq!(s.idle_count, 3);
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// The same when a miss moves another thread's cached mapping to the books (the
/// pass over every cache before a mapping is created): that cache's bytes go down.
/// `thread_cache_bytes = 6 MiB`; thread B caches a 4 MiB mapping; the main thread's
/// 4 MiB request takes it from B's cache; B then caches a 2 MiB mapping (0 + 2 MiB
/// held, within the bound).
#[test]
fn a_mapping_moved_out_of_another_threads_cache_leaves_its_bytes_bound() {
    let (pool, sim) = pool_with(PoolConfig {
        thread_cache_bytes: 6 * MIB,
        ..PoolConfig::default()
    });
    pool.retention_begin().unwrap();
    let (to_b, b_waits) = mpsc::channel::<()>();
    let (to_main, main_waits) = mpsc::channel::<DevicePtr>();
    thread::scope(|scope| {
        let pool = &pool;
        // Owned here, so that a failed assertion below drops it and B stops waiting.
        let to_b = to_b;
        scope.spawn(move || {
            let x = pool.allocate_raw(4 * MIB).unwrap();
            pool.free_raw(x).unwrap();
            to_main.send(x).unwrap();
            b_waits.recv().unwrap();
            // B's cache is empty now: a new 2 MiB mapping, cached at its free.
            let y = pool.allocate_raw(2 * MIB).unwrap();
            pool.free_raw(y).unwrap();
            to_main.send(y).unwrap();
            // B keeps its cache until the main thread has looked.
            b_waits.recv().unwrap();
        });
        let x = main_waits.recv().unwrap();
        let a = pool.allocate_raw(4 * MIB).unwrap();
        assert_eq!(a, x, "B's cached mapping, moved to the books");
        to_b.send(()).unwrap();
        let _y = main_waits.recv().unwrap();
        let s = check(pool);
        assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (1, 2 * MIB));
        to_b.send(()).unwrap();
        pool.free_raw(a).unwrap();
    });
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// A remote list's bound counts what is on it now: an owner that takes its list
/// gives its bytes back to the bound. With a 4 MiB cache bound, one 2 MiB
/// allocation freed on another thread three times over (the owner taking it back in
/// between) goes to the owner's remote list all three times (`remote_frees` 3), never
/// to the books: at most 2 MiB is ever on the list.
#[test]
fn a_remote_list_taken_back_frees_its_bound() {
    let (pool, sim) = pool_with(PoolConfig {
        thread_cache_bytes: 4 * MIB,
        ..PoolConfig::default()
    });
    let (a, mut p) = cache_handed(&pool);
    for round in 1..=3u64 {
        thread::scope(|t| {
            t.spawn(|| pool.free_raw(p).unwrap()).join().unwrap();
        });
        assert_eq!(check(&pool).remote_frees, round, "round {round}");
        p = pool.allocate_raw(2 * MIB).unwrap();
        assert_eq!(p, a, "round {round}: the owner takes it back");
        assert_eq!(check(&pool).thread_cache_hits, 1 + round);
    }
    pool.free_raw(p).unwrap();
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}
