//! Thread caches (issue 13): the cache of a thread that exited is adopted and reused,
//! drained by a miss, and released at finish.

use crate::common;

use std::thread;

use crate::caching::{default_pool, exit_with_a_full_cache, released_once};
use common::{check, MIB};

/// A thread that exits with a full cache: the next thread to need a cache adopts
/// its cache, giving what it held to the books first, so the memory is reused (from
/// the books), and released at finish.
#[test]
fn an_exited_threads_cache_is_adopted_and_reused() {
    let (pool, sim) = default_pool();
    pool.retention_begin().unwrap();
    let held = exit_with_a_full_cache(&pool);
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (2, 6 * MIB));
    // This thread has no cache in this pool yet.
    let p = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(p, held.0);
    let s = check(&pool);
    assert_eq!(
        (s.mappings_created, s.reuse_hits, s.thread_cache_hits),
        (2, 1, 0)
    );
    assert_eq!(
        (s.thread_cache_count, s.idle_count, s.idle_bytes),
        (0, 1, 4 * MIB)
    );
    // The adopted cache is this thread's now.
    pool.free_raw(p).unwrap();
    assert_eq!(pool.allocate_raw(2 * MIB).unwrap(), p);
    assert_eq!(check(&pool).thread_cache_hits, 1);
    pool.free_raw(p).unwrap();
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// A thread that exits with a full cache while this thread already has its own: a
/// miss here drains this thread's cache, finds no fit, then takes what fits from
/// the exited thread's cache and reuses it; the entry that does not fit stays
/// there.
#[test]
fn an_exited_threads_cache_is_drained_by_a_miss() {
    let (pool, sim) = default_pool();
    pool.retention_begin().unwrap();
    let big = pool.allocate_raw(8 * MIB).unwrap();
    pool.free_raw(big).unwrap();
    let held = exit_with_a_full_cache(&pool);
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (3, 14 * MIB));
    // 4 MiB: this thread's 8 MiB is more than 30 % above it.
    let p = pool.allocate_raw(4 * MIB).unwrap();
    assert_eq!(p, held.1);
    let s = check(&pool);
    assert_eq!(
        (s.mappings_created, s.reuse_hits, s.thread_cache_hits),
        (3, 1, 0)
    );
    // Idle: this thread's 8 MiB (drained to the books) and the exited thread's
    // 2 MiB, still in its cache (a 2 MiB entry cannot serve 4 MiB).
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (1, 2 * MIB));
    assert_eq!((s.idle_count, s.idle_bytes), (2, 10 * MIB));
    pool.free_raw(p).unwrap();
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// A thread that exits with a full cache and nobody allocates after it: the finish
/// drains the orphaned cache and releases its memory, once.
#[test]
fn an_exited_threads_cache_is_released_at_finish() {
    let (pool, sim) = default_pool();
    pool.retention_begin().unwrap();
    thread::scope(|t| {
        for _ in 0..3 {
            t.spawn(|| {
                let a = pool.allocate_raw(2 * MIB).unwrap();
                pool.free_raw(a).unwrap();
            });
        }
    });
    // Each allocation made a mapping or reused one an exited thread's cache gave
    // back to the books; every mapping is idle, cached or in the books.
    let s = check(&pool);
    assert_eq!(s.mappings_created + s.reuse_hits, 3, "{s:#?}");
    assert_eq!((s.idle_count, s.live_count), (s.mappings_created, 0));
    assert!(s.thread_cache_count >= 1, "{s:#?}");
    assert_eq!(s.physical_bytes, s.mappings_created * 2 * MIB);
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}
