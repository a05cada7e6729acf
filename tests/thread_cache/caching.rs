//! Thread caches (issue 13) on the simulated driver. Every expectation comes from the
//! contract of `src/pool/cache.rs` and `PoolConfig::thread_cache_*`:
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

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;

use common::{assert_driver_empty, check, no_faults, simulated_pool, stream, MIB};
use flare_package::{
    DevicePtr, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SimDriver, Snapshot,
};

const KIB: u64 = 1 << 10;
const G: u64 = 2 * MIB;

/// Sets its flag when its thread unwinds (so that threads waiting on it stop).
struct PanicFlag<'a>(&'a AtomicBool);

impl Drop for PanicFlag<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// A thread that allocates 2 MiB and 4 MiB, frees both (into its cache) and exits
/// with them there. Returns the two addresses.
fn exit_with_a_full_cache(pool: &Pool) -> (DevicePtr, DevicePtr) {
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
fn cache_handed(pool: &Pool) -> (DevicePtr, DevicePtr) {
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(p, a, "the cached mapping");
    assert_eq!(check(pool).thread_cache_hits, 1);
    (a, p)
}

/// Sets its flag when dropped, on a panic's unwinding too.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A pool on a simulated H200 (140 GiB) with `config`'s settings.
fn pool_with(config: PoolConfig) -> (Pool, Arc<SimDriver>) {
    simulated_pool(140 << 30, config)
}

/// A best-fit pool, release threshold 0, default thread caches (32 entries, 1 GiB).
fn default_pool() -> (Pool, Arc<SimDriver>) {
    pool_with(PoolConfig::default())
}

/// A segment-mode pool, release threshold 0, default thread caches.
fn seg_pool() -> (Pool, Arc<SimDriver>) {
    pool_with(PoolConfig {
        reuse_policy: ReusePolicy::Segments,
        ..PoolConfig::default()
    })
}

fn is_unknown(r: flare_package::Result<()>) -> bool {
    matches!(r, Err(Error::UnknownPointer { .. }))
}

/// Every mapping created was released exactly once: one unmap, one handle release
/// and one reservation free each (a second release of anything would be refused by
/// the simulated driver and show as a failure), and the driver holds nothing.
#[track_caller]
fn released_once(pool: &Pool, sim: &SimDriver) {
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

/// Eight threads each run allocate/free pairs of their own size in a scope while
/// another takes snapshots: every snapshot satisfies the invariants (and the
/// counters only grow); once all stop, the snapshot is exact, every counter: each
/// thread's first allocation made its mapping, every later one was a cache hit.
#[test]
fn snapshots_while_eight_threads_run_pairs() {
    const THREADS: u64 = 8;
    const PAIRS: u64 = 200_000;
    let (pool, sim) = default_pool();
    pool.retention_begin().unwrap();
    // Sizes 2, 4, .. 16 MiB; asked 1000 bytes less (rounded up again).
    let size = |i: u64| (i + 1) * 2 * MIB;
    let stop = AtomicBool::new(false);
    // Every thread makes its first allocation before any frees one: a miss takes
    // what fits from every cache before it creates memory, so a late thread's first
    // 14 MiB would take an early thread's idle 16 MiB (14 % waste) and the early
    // thread would then create another. Nor does a thread exit before every one
    // started (its cache would be adopted). Unless one panicked.
    let started = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let checks = thread::scope(|t| {
        let checker = t.spawn(|| {
            let mut n = 0u64;
            let mut last = pool.snapshot();
            while !stop.load(Ordering::Relaxed) {
                let s = pool.snapshot();
                if let Err(e) = s.check_invariants() {
                    panic!("invariant broken while running: {e}\n{s:#?}");
                }
                assert!(s.allocations >= last.allocations && s.frees >= last.frees);
                assert!(s.thread_cache_hits >= last.thread_cache_hits);
                assert!(s.live_count <= THREADS && s.mappings_created <= THREADS);
                assert_eq!(s.mappings_released, 0);
                last = s;
                n += 1;
            }
            n
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|i| {
                let (pool, started, failed) = (&pool, &started, &failed);
                t.spawn(move || {
                    let _flag = PanicFlag(failed);
                    let first = pool.allocate_raw(size(i) - 1000).unwrap();
                    started.fetch_add(1, Ordering::SeqCst);
                    while started.load(Ordering::SeqCst) < THREADS && !failed.load(Ordering::SeqCst)
                    {
                        thread::yield_now();
                    }
                    pool.free_raw(first).unwrap();
                    for _ in 1..PAIRS {
                        let p = pool.allocate_raw(size(i) - 1000).unwrap();
                        assert_eq!(p, first, "thread {i}: its own mapping every time");
                        pool.free_raw(p).unwrap();
                    }
                    while started.load(Ordering::SeqCst) < THREADS && !failed.load(Ordering::SeqCst)
                    {
                        thread::yield_now();
                    }
                })
            })
            .collect();
        // Stops the checker on the way out, a worker's panic included (else the
        // scope would wait for the checker for ever).
        let stop_checker = StopOnDrop(&stop);
        for w in workers {
            w.join().unwrap();
        }
        drop(stop_checker);
        checker.join().unwrap()
    });
    assert!(checks > 0);
    let s = check(&pool);
    let total: u64 = (0..THREADS).map(size).sum();
    let largest = size(THREADS - 1);
    assert!(
        s.peak_live_mapped_bytes >= largest && s.peak_live_mapped_bytes <= total,
        "{s:#?}"
    );
    let want = Snapshot {
        scope_open: true,
        granularity_bytes: G,
        idle_count: THREADS,
        idle_bytes: total,
        physical_bytes: total,
        reserved_bytes: total,
        peak_physical_bytes: total,
        peak_live_mapped_bytes: s.peak_live_mapped_bytes,
        allocations: THREADS * PAIRS,
        frees: THREADS * PAIRS,
        reuse_hits: THREADS * (PAIRS - 1),
        reuse_exact_hits: THREADS * (PAIRS - 1),
        mappings_created: THREADS,
        thread_cache_count: THREADS,
        thread_cache_bytes: total,
        thread_cache_hits: THREADS * (PAIRS - 1),
        ..Snapshot::default()
    };
    assert_eq!(s, want);
    println!("{checks} snapshots checked while running");
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
