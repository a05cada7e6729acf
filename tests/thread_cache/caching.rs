//! Thread caches (issue 13) on the simulated driver. Every expectation comes from the
//! contract of `src/pool/cache/` and `PoolConfig::thread_cache_*`:
//!
//! - a thread's cache holds idle memory only while nothing would be released anyway
//!   (a retention scope is open, or the release threshold is `u64::MAX`), at most
//!   `thread_cache_entries` allocations and `thread_cache_bytes` bytes; it serves
//!   only the synchronous `allocate` / `free`, whole mappings and blocks of at most
//!   1 MiB of the synchronous heap;
//! - an allocation pops from the caller's cache first (a `thread_cache_hits` and a
//!   `reuse_hits`, no driver call); a miss gives the caller's cache (and those of
//!   exited threads) back to the books before any new memory is made;
//! - a free of memory another thread's cache handed out goes to that cache's remote
//!   list (`remote_frees`), which its owner takes on its next miss;
//! - cached memory is idle in the snapshot (`idle_*`, or free block bytes), and
//!   every release point (finish, trim, out-of-memory, destroy) drains the caches
//!   first: nothing stays in a cache past it, nothing is released twice (the
//!   simulated driver refuses a second release, and every test compares its driver
//!   calls with the mappings created).
//!
//! The simulated driver's granularity is 2 MiB; best-fit takes a mapping up to 30 %
//! above the rounded request (`DEFAULT_BEST_FIT_MAX_WASTE_PERCENT`).
//!
//! Here: when a free is cached and a hit served, and the bounds; and the pools the
//! thread cache tests share. Remote frees, exited threads, the registry, release
//! points, cache-handed pointers, picks and bounds, segment blocks, scopes racing,
//! concurrent snapshots and a dropped pool's caches on the heap have modules of
//! their own.

use crate::common;

use std::sync::Arc;
use std::thread;

use common::{assert_driver_empty, check, no_faults, simulated_pool, MIB};
use flare_package::{
    DevicePtr, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SimDriver, Snapshot,
};

pub(crate) const KIB: u64 = 1 << 10;

pub(crate) const G: u64 = 2 * MIB;

/// A thread that allocates 2 MiB and 4 MiB, frees both (into its cache) and exits
/// with them there. Returns the two addresses.
pub(crate) fn exit_with_a_full_cache(pool: &Pool) -> (DevicePtr, DevicePtr) {
    thread::scope(|t| {
        t.spawn(|| {
            let a = pool.allocate_raw(2 * MIB).unwrap();
            let b = pool.allocate_raw(4 * MIB).unwrap();
            pool.free_raw(a).unwrap();
            pool.free_raw(b).unwrap();
            (a, b)
        })
        .join()
        .unwrap()
    })
}

/// Opens a scope, allocates 2 MiB (from the books, adopted by this thread's
/// cache), frees it (into the cache) and allocates it again: a cache hit. Returns
/// the first address and the cache-handed one (the same mapping).
pub(crate) fn cache_handed(pool: &Pool) -> (DevicePtr, DevicePtr) {
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(p, a, "the cached mapping");
    assert_eq!(check(pool).thread_cache_hits, 1);
    (a, p)
}

/// A pool on a simulated H200 (140 GiB) with `config`'s settings.
pub(crate) fn pool_with(config: PoolConfig) -> (Pool, Arc<SimDriver>) {
    simulated_pool(140 << 30, config)
}

/// A best-fit pool, release threshold 0, default thread caches (32 entries, 1 GiB).
pub(crate) fn default_pool() -> (Pool, Arc<SimDriver>) {
    pool_with(PoolConfig::default())
}

/// A segment-mode pool, release threshold 0, default thread caches.
pub(crate) fn seg_pool() -> (Pool, Arc<SimDriver>) {
    pool_with(PoolConfig {
        reuse_policy: ReusePolicy::Segments,
        ..PoolConfig::default()
    })
}

pub(crate) fn is_unknown(r: flare_package::Result<()>) -> bool {
    matches!(r, Err(Error::UnknownPointer { .. }))
}

/// Every mapping created was released exactly once: one unmap, one handle release
/// and one reservation free each (a second release of anything would be refused by
/// the simulated driver and show as a failure), and the driver holds nothing.
#[track_caller]
pub(crate) fn released_once(pool: &Pool, sim: &SimDriver) {
    let s = check(pool);
    assert_eq!(s.driver_failures(), 0, "{s:#?}");
    assert_eq!(s.mappings_released, s.mappings_created, "{s:#?}");
    assert_eq!(
        (s.physical_bytes, s.idle_count, s.thread_cache_count),
        (0, 0, 0)
    );
    for call in [
        DriverCall::Unmap,
        DriverCall::Release,
        DriverCall::FreeReservation,
    ] {
        assert_eq!(sim.call_count(call), s.mappings_created, "{call:?}");
    }
    assert_driver_empty(pool);
    no_faults(sim);
}

/// A free inside a scope goes to the thread's cache (idle in the books, counted in
/// `thread_cache_*`); the next allocation of that size on the thread pops it: a
/// cache hit and a reuse hit, exact, with the same address, no new mapping and no
/// driver call.
#[test]
fn a_free_in_a_scope_is_cached_and_the_next_allocation_hits() {
    let (pool, sim) = default_pool();
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(3 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (1, 4 * MIB));
    assert_eq!((s.idle_count, s.idle_bytes, s.live_count), (1, 4 * MIB, 0));
    assert_eq!(
        (s.mappings_created, s.reuse_hits, s.thread_cache_hits),
        (1, 0, 0)
    );
    let calls: u64 = DriverCall::ALL.iter().map(|&c| sim.call_count(c)).sum();

    // 3.5 MiB rounds to the same 4 MiB.
    let b = pool.allocate_raw(3 * MIB + 512 * KIB).unwrap();
    assert_eq!(b, a, "the cached mapping is handed out again");
    let s = check(&pool);
    assert_eq!(
        (s.thread_cache_hits, s.reuse_hits, s.reuse_exact_hits),
        (1, 1, 1)
    );
    assert_eq!((s.mappings_created, s.allocations, s.frees), (1, 2, 1));
    assert_eq!(
        (s.live_count, s.live_mapped_bytes, s.live_requested_bytes),
        (1, 4 * MIB, 3 * MIB + 512 * KIB)
    );
    assert_eq!(
        (s.idle_count, s.thread_cache_count, s.thread_cache_bytes),
        (0, 0, 0)
    );
    assert_eq!(s.physical_bytes, 4 * MIB);
    let after: u64 = DriverCall::ALL.iter().map(|&c| sim.call_count(c)).sum();
    assert_eq!(after, calls, "a cache hit makes no driver call");

    // Round and round: every further pair is a hit.
    for i in 0..10 {
        pool.free_raw(b).unwrap();
        assert_eq!(pool.allocate_raw(4 * MIB).unwrap(), a);
        let s = pool.snapshot();
        assert_eq!(s.thread_cache_hits, 2 + i);
    }
    pool.free_raw(a).unwrap();
    let s = check(&pool);
    assert_eq!((s.allocations, s.frees, s.reuse_hits), (12, 12, 11));
    assert_eq!(s.reuse_exact_hits, 11, "every hit had the rounded size");
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!(s.thread_cache_hits, 11, "counters survive the drain");
    assert_eq!((s.mappings_created, s.mappings_released), (1, 1));
    released_once(&pool, &sim);
}

/// A size the cache cannot serve (best-fit: a 6 MiB mapping is more than 30 %
/// above a 2 MiB request) misses it; the miss gives the thread's cache to the books
/// first (the 6 MiB mapping is then idle in the books, no longer cached), and makes
/// a new mapping only because the books have no fit either. The 6 MiB mapping is
/// then reused from the books (a reuse hit, not a cache hit).
#[test]
fn a_miss_gives_the_thread_cache_back_to_the_books() {
    let (pool, sim) = default_pool();
    pool.retention_begin().unwrap();
    let big = pool.allocate_raw(6 * MIB).unwrap();
    pool.free_raw(big).unwrap();
    assert_eq!(check(&pool).thread_cache_count, 1);
    let small = pool.allocate_raw(2 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (0, 0));
    assert_eq!(
        (s.idle_count, s.idle_bytes),
        (1, 6 * MIB),
        "drained, not released"
    );
    assert_eq!(
        (s.mappings_created, s.reuse_hits, s.thread_cache_hits),
        (2, 0, 0)
    );
    let again = pool.allocate_raw(6 * MIB).unwrap();
    assert_eq!(again, big);
    let s = check(&pool);
    assert_eq!(
        (s.mappings_created, s.reuse_hits, s.thread_cache_hits),
        (2, 1, 0)
    );
    assert_eq!((s.idle_count, s.live_count), (0, 2));
    pool.free_raw(small).unwrap();
    pool.free_raw(again).unwrap();
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// `thread_cache_entries = 2`: the third free finds the cache full and goes to the
/// books (idle there). The next three allocations: two cache hits, then one reuse
/// from the books.
#[test]
fn the_entries_bound_sends_the_third_free_to_the_books() {
    let (pool, sim) = pool_with(PoolConfig {
        thread_cache_entries: 2,
        ..PoolConfig::default()
    });
    pool.retention_begin().unwrap();
    let ptrs: Vec<DevicePtr> = (0..3).map(|_| pool.allocate_raw(G).unwrap()).collect();
    for (i, &p) in ptrs.iter().enumerate() {
        pool.free_raw(p).unwrap();
        let s = check(&pool);
        assert_eq!(
            s.thread_cache_count,
            (i as u64 + 1).min(2),
            "after free {i}"
        );
        assert_eq!(s.idle_count, i as u64 + 1);
    }
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (2, 2 * G));
    assert_eq!((s.idle_count, s.idle_bytes), (3, 3 * G));
    let again: Vec<DevicePtr> = (0..3).map(|_| pool.allocate_raw(G).unwrap()).collect();
    let s = check(&pool);
    assert_eq!(
        (s.thread_cache_hits, s.reuse_hits, s.mappings_created),
        (2, 3, 3)
    );
    let (mut x, mut y) = (ptrs.clone(), again.clone());
    x.sort_unstable();
    y.sort_unstable();
    assert_eq!(x, y, "the same three mappings");
    assert_eq!(again[2], ptrs[2], "the one the books held comes last");
    for p in again {
        pool.free_raw(p).unwrap();
    }
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// `thread_cache_bytes = 4 MiB`: a 2 MiB free is cached; a 4 MiB one would make
/// 6 MiB and goes to the books; another 2 MiB one makes exactly 4 MiB and is
/// cached.
#[test]
fn the_bytes_bound_sends_a_free_over_it_to_the_books() {
    let (pool, sim) = pool_with(PoolConfig {
        thread_cache_bytes: 4 * MIB,
        ..PoolConfig::default()
    });
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(2 * MIB).unwrap();
    let b = pool.allocate_raw(4 * MIB).unwrap();
    let c = pool.allocate_raw(2 * MIB).unwrap();
    // (Allocated now: a miss later would drain the cache.)
    let d = pool.allocate_raw(6 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (1, 2 * MIB));
    pool.free_raw(c).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (2, 4 * MIB));
    assert_eq!((s.idle_count, s.idle_bytes), (3, 8 * MIB));
    // A mapping larger than the whole bound is never cached.
    pool.free_raw(d).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (2, 4 * MIB));
    assert_eq!((s.idle_count, s.idle_bytes), (4, 14 * MIB));
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// The same script with the caches off (`thread_cache_entries = 0`) and on: the
/// same reuse (hits, mappings created, the same addresses), only where it came
/// from differs (no cache hit with them off).
#[test]
fn caches_off_reuse_as_before() {
    let script = |entries: u32| {
        let (pool, sim) = pool_with(PoolConfig {
            thread_cache_entries: entries,
            ..PoolConfig::default()
        });
        pool.retention_begin().unwrap();
        let a = pool.allocate_raw(2 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        let b = pool.allocate_raw(2 * MIB).unwrap();
        pool.free_raw(b).unwrap();
        let c = pool.allocate_raw(6 * MIB).unwrap();
        let d = pool.allocate_raw(2 * MIB).unwrap();
        pool.free_raw(c).unwrap();
        pool.free_raw(d).unwrap();
        let s = check(&pool);
        pool.retention_finish().unwrap();
        released_once(&pool, &sim);
        (s, [a, b, d])
    };
    let (off, off_ptrs) = script(0);
    let (on, on_ptrs) = script(32);
    // b and d reuse a; c is the only other mapping.
    assert_eq!((off.reuse_hits, off.mappings_created), (2, 2));
    assert_eq!((on.reuse_hits, on.mappings_created), (2, 2));
    assert_eq!((off.thread_cache_hits, off.thread_cache_count), (0, 0));
    assert_eq!(off.remote_frees, 0);
    // On: b is a cache hit; c's miss drained the cache, so d came from the books;
    // after the last two frees both mappings sit in the cache.
    assert_eq!((on.thread_cache_hits, on.thread_cache_count), (1, 2));
    assert_eq!(
        (off.idle_count, off.idle_bytes),
        (on.idle_count, on.idle_bytes)
    );
    assert_eq!(off_ptrs[0], off_ptrs[1]);
    assert_eq!(off_ptrs[0], off_ptrs[2]);
    assert_eq!(on_ptrs[0], on_ptrs[1]);
    assert_eq!(on_ptrs[0], on_ptrs[2]);
}

/// Outside a scope with release threshold 0, nothing is cached: each free releases
/// its mapping at once, as before the caches, and the next allocation makes a new
/// one.
#[test]
fn outside_a_scope_with_threshold_zero_nothing_is_cached() {
    let (pool, sim) = default_pool();
    for i in 1..=3 {
        let p = pool.allocate_raw(2 * MIB).unwrap();
        pool.free_raw(p).unwrap();
        let s = check(&pool);
        assert_eq!((s.thread_cache_count, s.thread_cache_hits), (0, 0));
        assert_eq!((s.physical_bytes, s.idle_count), (0, 0));
        assert_eq!((s.mappings_created, s.mappings_released), (i, i));
        assert_eq!(s.reuse_hits, 0);
        assert_eq!(sim.call_count(DriverCall::Release), i);
    }
    // A guard too.
    drop(pool.allocate(G).unwrap());
    let s = check(&pool);
    assert_eq!(
        (
            s.mappings_created,
            s.mappings_released,
            s.thread_cache_count
        ),
        (4, 4, 0)
    );
    released_once(&pool, &sim);
}

/// Release threshold `u64::MAX`: nothing would be released outside a scope, so the
/// caches hold memory there too; a trim drains and releases it.
#[test]
fn threshold_max_caches_outside_scopes() {
    let (pool, sim) = pool_with(PoolConfig {
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::default()
    });
    let a = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    let s = check(&pool);
    assert!(!s.scope_open);
    assert_eq!(
        (s.thread_cache_count, s.idle_count, s.physical_bytes),
        (1, 1, 2 * MIB)
    );
    let b = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(b, a);
    let s = check(&pool);
    assert_eq!(
        (s.thread_cache_hits, s.reuse_hits, s.mappings_created),
        (1, 1, 1)
    );
    pool.free_raw(b).unwrap();
    assert_eq!(check(&pool).thread_cache_count, 1);
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.mappings_released, s.thread_cache_count), (1, 0));
    released_once(&pool, &sim);
}

/// The waste bound is inclusive in the thread cache as in the books: best-fit takes
/// a mapping of up to `rounded + floor(rounded * percent / 100)` bytes
/// (`max_fit`, "the largest mapping size best-fit takes"). With a 25 % bound an
/// 8 MiB request's bound is exactly 10 MiB: it takes a cached 10 MiB mapping, a
/// cache hit with no driver call.
#[test]
fn a_cached_mapping_exactly_at_the_waste_bound_is_a_hit() {
    let (pool, sim) = pool_with(PoolConfig {
        best_fit_max_waste_percent: 25,
        ..PoolConfig::default()
    });
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(10 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    assert_eq!(check(&pool).thread_cache_count, 1);
    let calls: u64 = DriverCall::ALL.iter().map(|&c| sim.call_count(c)).sum();
    let b = pool.allocate_raw(8 * MIB).unwrap();
    assert_eq!(b, a, "the 10 MiB mapping is within 25 % of 8 MiB");
    let s = check(&pool);
    assert_eq!(
        (s.thread_cache_hits, s.reuse_hits, s.reuse_exact_hits),
        (1, 1, 0)
    );
    let after: u64 = DriverCall::ALL.iter().map(|&c| sim.call_count(c)).sum();
    assert_eq!(after, calls, "a cache hit makes no driver call");
    pool.free_raw(b).unwrap();
    pool.retention_finish().unwrap();
}

/// The bytes bound counts what the cache holds now: a hit takes its mapping's bytes
/// out of it. `thread_cache_bytes = 6 MiB`: a 4 MiB mapping cached, then handed out
/// again (a hit: 0 bytes held), then freed again with a 2 MiB one: 4 + 2 = 6 MiB,
/// both cached.
#[test]
fn a_hit_takes_its_bytes_out_of_the_bytes_bound() {
    let (pool, sim) = pool_with(PoolConfig {
        thread_cache_bytes: 6 * MIB,
        ..PoolConfig::default()
    });
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    assert_eq!(pool.allocate_raw(4 * MIB).unwrap(), a, "a hit");
    let b = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_hits, s.thread_cache_count), (1, 2));
    assert_eq!(s.thread_cache_bytes, 6 * MIB);
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}

/// A pool with `policy` on a device of `capacity` bytes, default thread caches.
pub(crate) fn pool(capacity: u64, policy: ReusePolicy) -> (Pool, Arc<flare_package::SimDriver>) {
    simulated_pool(capacity, PoolConfig::default().with_policy(policy))
}

/// A pool whose caches hold memory outside scopes too (`release_threshold_bytes`
/// is `u64::MAX`: nothing would be released anyway).
pub(crate) fn open_pool(
    capacity: u64,
    policy: ReusePolicy,
) -> (Pool, Arc<flare_package::SimDriver>) {
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
pub(crate) fn unknown(r: flare_package::Result<()>, ptr: u64) {
    match r {
        Err(Error::UnknownPointer { ptr: p }) => assert_eq!(p, ptr),
        other => panic!("expected an unknown-pointer error for {ptr:#x}, got {other:?}"),
    }
}

/// The snapshot invariants only (other threads may be changing the driver).
#[track_caller]
pub(crate) fn invariants(pool: &Pool) -> Snapshot {
    let s = pool.snapshot();
    if let Err(e) = s.check_invariants() {
        panic!("snapshot invariant broken: {e}\n{s:#?}");
    }
    s
}

/// An allocation the calling thread's cache hands out: allocate and free `bytes`
/// once (the free goes to the cache: a scope is open), then allocate again.
pub(crate) fn cache_handed_of(pool: &Pool, bytes: u64) -> u64 {
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
