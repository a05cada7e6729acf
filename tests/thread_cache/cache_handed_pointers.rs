//! Thread caches (issue 13): a pointer a cache handed out is an allocation like any
//! other: a double free is refused, a stale guard frees nothing, and `record_stream`
//! and `free_async` take it.

use crate::common;

use std::thread;

use crate::caching::{cache_handed, default_pool, is_unknown, released_once};
use common::{check, stream, MIB};
use flare_package::Error;

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
