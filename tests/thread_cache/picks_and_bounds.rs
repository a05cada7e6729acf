//! What a thread's cache takes in and hands out: its pick (the exact size, else the
//! smallest within the policy's bound), the bytes it may hold, the segment blocks it
//! adopts, and a free in a scope before any cache exists.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::caching::pool;
use crate::common;
use common::{assert_driver_empty, check, simulated_pool, GIB, MIB};
use flare_package::pool::SEGMENT_SMALL_MAX_BYTES;
use flare_package::{DriverCall, PoolConfig, ReusePolicy};
use std::sync::Arc;

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// The exact policy through a thread cache: an entry of the request's rounded size
/// serves it (the cache's only match without a waste bound), a larger one does not.
#[test]
fn exact_policy_thread_cache_serves_the_exact_size_only() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Exact,
            release_threshold_bytes: u64::MAX,
            thread_cache_entries: 32,
            ..PoolConfig::default()
        },
    );
    let a = pool.allocate_raw(3 * MIB).unwrap(); // a 4 MiB mapping
    pool.free_raw(a).unwrap();
    let b = pool.allocate_raw(4 * MIB).unwrap();
    assert_eq!(b, a, "the cached 4 MiB mapping");
    let s = check(&pool);
    assert_eq!((s.mappings_created, s.thread_cache_hits), (1, 1));
    pool.free_raw(b).unwrap();
    // 2 MiB: the cached 4 MiB is not its size.
    let c = pool.allocate_raw(2 * MIB).unwrap();
    assert_ne!(c, a);
    let s = check(&pool);
    assert_eq!((s.mappings_created, s.thread_cache_hits), (2, 1));
    assert_eq!(sim.call_count(DriverCall::Create), 2);
    pool.free_raw(c).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// The exact policy, another thread's cache: a miss takes what every cache holds of
/// the request's exact size before creating memory (a thread that freed a 4 MiB
/// mapping and lives on holds it in its cache), and leaves other sizes there.
#[test]
fn exact_policy_miss_takes_another_threads_cached_exact_size() {
    let (pool, _sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Exact,
            release_threshold_bytes: u64::MAX,
            thread_cache_entries: 32,
            ..PoolConfig::default()
        },
    );
    let pool = Arc::new(pool);
    let (freed_tx, freed_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let other = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || {
            let a = pool.allocate_raw(4 * MIB).unwrap();
            let b = pool.allocate_raw(8 * MIB).unwrap();
            pool.free_raw(a).unwrap();
            pool.free_raw(b).unwrap();
            freed_tx.send((a, b)).unwrap();
            // Alive (its cache open) until the main thread is done.
            done_rx.recv().unwrap();
        })
    };
    let (a, b) = freed_rx.recv().unwrap();
    let c = pool.allocate_raw(4 * MIB).unwrap();
    assert_eq!(c, a, "the other thread's cached 4 MiB mapping");
    let s = check(&pool);
    assert_eq!(s.mappings_created, 2);
    assert_ne!(c, b);
    // The 8 MiB mapping is still the other thread's cache's (idle in it).
    assert_eq!(
        (s.thread_cache_count, s.thread_cache_bytes, s.idle_bytes),
        (1, 8 * MIB, 8 * MIB)
    );
    done_tx.send(()).unwrap();
    other.join().unwrap();
    pool.free_raw(c).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// A thread cache's pick ("one of exactly the rounded size, else the smallest within
/// the policy's bound", `src/pool/cache/` `Inner::find`, as best-fit in the
/// books): 22 and 24 MiB mappings cached (24 freed last, so seen first), a 20 MiB
/// request (bound 30%: up to 26 MiB) takes the 22 MiB one.
#[test]
fn a_thread_cache_hit_takes_the_smallest_fit_within_the_bound() {
    let (pool, _sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            thread_cache_entries: 32,
            ..PoolConfig::default()
        },
    );
    let a = pool.allocate_raw(22 * MIB).unwrap();
    let b = pool.allocate_raw(24 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    let c = pool.allocate_raw(20 * MIB).unwrap();
    assert_eq!(c, a, "the 22 MiB mapping");
    let s = check(&pool);
    assert_eq!((s.thread_cache_hits, s.mappings_created), (1, 2));
    pool.free_raw(c).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
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

/// `PoolConfig::thread_cache_bytes` bounds the bytes one thread's cache holds, as
/// entries come and go: with a 5 MiB bound, two 2 MiB mappings go in (4 MiB); a hit
/// takes one out (2 MiB held), so a 4 MiB free would pass the bound (6 MiB) and goes
/// to the books (idle, not in the cache), while the 2 MiB one's free goes back in
/// (4 MiB).
#[test]
fn a_thread_cache_holds_no_more_than_its_bytes_after_a_hit() {
    let (pool, _sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            thread_cache_entries: 32,
            thread_cache_bytes: 5 * MIB,
            ..PoolConfig::default()
        },
    );
    let [a, b] = [0; 2].map(|_| pool.allocate_raw(2 * MIB).unwrap());
    let x = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (2, 4 * MIB));
    let d = pool.allocate_raw(2 * MIB).unwrap();
    assert!(d == a || d == b, "a cache hit");
    let s = check(&pool);
    assert_eq!(s.thread_cache_hits, 1);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (1, 2 * MIB));
    pool.free_raw(x).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (1, 2 * MIB));
    assert_eq!((s.idle_count, s.idle_bytes), (2, 6 * MIB));
    pool.free_raw(d).unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (2, 4 * MIB));
    assert_eq!((s.idle_count, s.idle_bytes), (3, 8 * MIB));
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// The thread caches adopt segment blocks of the synchronous heap up to
/// SEGMENT_SMALL_MAX_BYTES (1 MiB) inclusive ("a block of at most 1 MiB"): a block of
/// exactly 1 MiB that the books hand out to a thread is adopted by that thread's
/// cache (the memory a thread allocates stays its own), so its free by another
/// thread goes on the allocating thread's remote list (`remote_frees` 1). A block
/// one 512-byte step larger is of the large class: not adopted, so its free by
/// another thread is an ordinary one (`remote_frees` 0).
#[test]
fn a_segment_block_of_exactly_the_small_limit_is_adopted_by_its_thread() {
    for (bytes, adopted) in [
        (SEGMENT_SMALL_MAX_BYTES, true),
        (SEGMENT_SMALL_MAX_BYTES + 512, false),
    ] {
        let (pool, _sim) = simulated_pool(
            1 << 30,
            PoolConfig {
                reuse_policy: ReusePolicy::Segments,
                release_threshold_bytes: u64::MAX,
                thread_cache_entries: 32,
                ..PoolConfig::default()
            },
        );
        // This thread's own cache first, so it is not the allocating one's.
        let keep = pool.allocate_raw(4 * MIB).unwrap();
        let p =
            std::thread::scope(|t| t.spawn(|| pool.allocate_raw(bytes).unwrap()).join()).unwrap();
        pool.free_raw(p).unwrap();
        let s = check(&pool);
        assert_eq!(
            (s.frees, s.remote_frees),
            (1, u64::from(adopted)),
            "{bytes}"
        );
        pool.free_raw(keep).unwrap();
        check(&pool);
    }
}

/// `Caches::free` (`src/pool/cache/`): "memory the books handed out goes to the
/// caller's cache when the caches are open, it fits and it may be held there (a
/// whole mapping ... with no stream recorded)"; `PoolConfig::thread_cache_entries`
/// and the module doc: caches hold memory while a retention scope is open. A
/// stream-ordered allocation never goes through the thread caches, so a pool used
/// only that way has no thread cache registered when a scope opens. A synchronous
/// free of that mapping inside the scope is the thread's first use of the caches:
/// its cache is made then and holds the mapping (one entry of 2 MiB), which stays
/// idle (`idle_bytes`) and is reused by the thread's next synchronous allocation of
/// the size, a thread-cache hit.
#[test]
fn a_free_in_a_scope_before_any_cache_exists_goes_to_the_new_cache() {
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let s = common::stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.retention_begin().unwrap();
    pool.free_raw(p).unwrap();
    let snap = pool.snapshot();
    assert_eq!(
        (
            snap.thread_cache_count,
            snap.thread_cache_bytes,
            snap.idle_bytes
        ),
        (1, G, G),
        "held by the calling thread's new cache"
    );
    let q = pool.allocate_raw(G).unwrap();
    assert_eq!(q, p, "the cached mapping is reused");
    let snap = pool.snapshot();
    assert_eq!(
        (
            snap.thread_cache_hits,
            snap.thread_cache_count,
            snap.live_count
        ),
        (1, 0, 1)
    );
    pool.free_raw(q).unwrap();
    pool.retention_finish().unwrap();
    check(&pool);
    common::no_faults(&sim);
}
