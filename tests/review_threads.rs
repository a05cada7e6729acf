//! Review of the thread caches (issue 13): bad inputs and races against the
//! contract of `docs/ARCHITECTURE.md` ("Thread caches", "Operations and their
//! contracts") and the doc comments of `Pool`, on the simulated driver.
//!
//! Every test ends with the books against the driver (`common::check`) and, where
//! everything was freed, an empty driver after the release point.

mod common;

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
    let hits = pool.snapshot().thread_cache_hits;
    let p = pool.allocate_raw(bytes).unwrap();
    pool.free_raw(p).unwrap();
    let q = pool.allocate_raw(bytes).unwrap();
    assert_eq!(q, p, "the cache gives the same memory back");
    assert_eq!(pool.snapshot().thread_cache_hits, hits + 1, "served by the cache");
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
            assert_eq!(s.live_count, before.live_count, "offset {off}: nothing freed");
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
