//! Issue 16: contracts of the pool that a mutation run found unpinned. Each test
//! names the contract it checks (a doc comment of `Pool`, `PoolConfig`, `Snapshot`,
//! `Error`, or `docs/ARCHITECTURE.md`); the expected values are reasoned from there
//! and from the simulated driver's documented behaviour, not copied from a run.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use common::{assert_driver_empty, check, check_with_devices, simulated_pool, MIB};
use flare_package::driver::sim::{CaptureMode, SimStreamCall};
use flare_package::pool::SEGMENT_SMALL_MAX_BYTES;
use flare_package::{
    CuResult, DriverCall, DriverError, Error, Pool, PoolConfig, ReusePolicy, SimConfig, SimDriver,
    Snapshot,
};
use std::sync::Arc;

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A code no memory call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

// ---------------------------------------------------------------- configuration

/// `Pool::new` / `Pool::with_driver`: "[`Error::InvalidArgument`] for a negative
/// device or peer ordinal": device 0 is not negative, so it is a valid peer (of a
/// pool on device 1), and naming the pool's own device 0 as a peer is harmless.
#[test]
fn peer_device_zero_is_accepted() {
    let two = SimConfig {
        device_count: 2,
        ..SimConfig::default()
    };
    let pool = Pool::new(PoolConfig {
        device: 1,
        peer_devices: vec![0],
        ..PoolConfig::simulated(two)
    })
    .expect("peer device 0 of a pool on device 1");
    let sim = pool.sim_driver().unwrap();
    let a = pool.allocate_raw(3 * MIB).unwrap();
    // `PoolConfig::peer_devices`: "other device ordinals that get read/write access
    // to every mapping".
    assert_eq!(sim.access_of(a), vec![0, 1]);
    check_with_devices(&pool, 2);
    pool.free_raw(a).unwrap();
    assert_driver_empty(&pool);

    // Through `with_driver` (no simulated-machine check, only the ordinal rule).
    let driver = Arc::new(SimDriver::new(two));
    let pool = Pool::with_driver(
        PoolConfig {
            device: 1,
            peer_devices: vec![0],
            ..PoolConfig::default()
        },
        driver.clone(),
    )
    .expect("peer device 0 through with_driver");
    let a = pool.allocate_raw(G).unwrap();
    assert_eq!(driver.access_of(a), vec![0, 1]);
    pool.free_raw(a).unwrap();

    // The pool's own device named as a peer: one grant, device 0's.
    let pool = Pool::with_driver(
        PoolConfig {
            peer_devices: vec![0],
            ..PoolConfig::default()
        },
        Arc::new(SimDriver::new(SimConfig::default())),
    )
    .expect("device 0 named as its own peer");
    let a = pool.allocate_raw(G).unwrap();
    assert_eq!(pool.sim_driver().unwrap().access_of(a), vec![0]);
    check_with_devices(&pool, 1);
    pool.free_raw(a).unwrap();

    // -1 is negative: refused, by both constructors.
    for peers in [vec![-1], vec![0, -1]] {
        let config = PoolConfig {
            peer_devices: peers.clone(),
            ..PoolConfig::simulated(two)
        };
        assert!(
            matches!(Pool::new(config.clone()), Err(Error::InvalidArgument(_))),
            "{peers:?}"
        );
        assert!(
            matches!(
                Pool::with_driver(config, Arc::new(SimDriver::new(two))),
                Err(Error::InvalidArgument(_))
            ),
            "{peers:?}"
        );
    }
}

/// `Pool::allocate_raw`: "[`Error::RequestTooLarge`] when the rounded size is
/// *above* the device's total memory". A request of exactly the total is a valid
/// request: on an empty device whose capacity is the total, it succeeds; beside a
/// live allocation it is an out-of-memory, not too large.
#[test]
fn a_request_of_exactly_the_device_total_is_not_too_large() {
    let total = 64 * MIB;
    let (pool, sim) = simulated_pool(total, PoolConfig::default());
    assert_eq!(sim.mem_get_info().unwrap().total, total);
    let all = pool.allocate_raw(total).expect("the whole empty device");
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.live_mapped_bytes), (total, total));
    assert_eq!(sim.state().physical_bytes, total);
    pool.free_raw(all).unwrap();
    assert_driver_empty(&pool);

    // One byte less, rounded up: the same total.
    let all = pool
        .allocate_raw(total - 1)
        .expect("rounds up to the total");
    pool.free_raw(all).unwrap();

    // Beside a live allocation: out of memory (after the release and retry),
    // never too large.
    let small = pool.allocate_raw(G).unwrap();
    let err = pool.allocate_raw(total).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: total,
            live: G,
            idle: 0,
            in_scope: false,
            source: Some(DriverError::new(
                DriverCall::Create,
                CuResult::OUT_OF_MEMORY
            )),
        }
    );
    // One byte more rounds to a granule more: too large, at once.
    let before = check(&pool);
    let creates = sim.call_count(DriverCall::Create);
    let err = pool.allocate_raw(total + 1).unwrap_err();
    assert_eq!(
        err,
        Error::RequestTooLarge {
            requested: total + G,
            device_total: total,
        }
    );
    assert_eq!(check(&pool), before, "nothing counted");
    assert_eq!(
        sim.call_count(DriverCall::Create),
        creates,
        "no driver call"
    );
    pool.free_raw(small).unwrap();
    assert_driver_empty(&pool);
}

/// `ReusePolicy::BestFit`: "the smallest idle mapping *at least as large as* the
/// rounded request whose excess over it is *at most* the waste bound". With a bound
/// of 0% an idle mapping of exactly the rounded size has no excess and is reused;
/// a larger one is not. Checked in the books (thread caches off) and through a
/// thread cache (which holds memory while the threshold is `u64::MAX`).
#[test]
fn best_fit_with_zero_waste_still_reuses_an_exact_size() {
    for cache_entries in [0, 32] {
        let (pool, sim) = simulated_pool(
            1 << 30,
            PoolConfig {
                reuse_policy: ReusePolicy::BestFit,
                best_fit_max_waste_percent: 0,
                release_threshold_bytes: u64::MAX,
                thread_cache_entries: cache_entries,
                ..PoolConfig::default()
            },
        );
        let a = pool.allocate_raw(3 * MIB).unwrap(); // a 4 MiB mapping
        pool.free_raw(a).unwrap();
        let b = pool.allocate_raw(4 * MIB).unwrap();
        assert_eq!(
            b, a,
            "cache entries {cache_entries}: the idle 4 MiB mapping"
        );
        let s = check(&pool);
        assert_eq!(
            (s.mappings_created, s.reuse_hits, s.reuse_exact_hits),
            (1, 1, 1),
            "cache entries {cache_entries}"
        );
        assert_eq!(sim.call_count(DriverCall::Create), 1);
        // A larger idle mapping has an excess above 0%: not taken.
        pool.free_raw(b).unwrap();
        let c = pool.allocate_raw(G).unwrap();
        assert_ne!(
            c, a,
            "cache entries {cache_entries}: 4 MiB is 100% over 2 MiB"
        );
        let s = check(&pool);
        assert_eq!((s.mappings_created, s.reuse_hits), (2, 1));
        // ... and the exact size is still found afterwards.
        let d = pool.allocate_raw(4 * MIB).unwrap();
        assert_eq!(d, a);
        pool.free_raw(c).unwrap();
        pool.free_raw(d).unwrap();
        pool.trim().unwrap();
        assert_driver_empty(&pool);
    }
}

/// The best-fit bound is the rounded size plus `percent` of it, rounded down: for a
/// 2 MiB request (2,097,152 bytes) at 99% that is 2,097,152 + 2,076,180 bytes, below
/// 4 MiB (4,194,304), so an idle 4 MiB mapping is not taken; at 100% the bound is
/// 4 MiB exactly and it is. (2 MiB is not a multiple of 100: the bound's remainder
/// term, floor(52 * 99 / 100) = 51 bytes, is what a wrong remainder would inflate.)
#[test]
fn best_fit_bound_is_the_rounded_size_plus_its_percent_rounded_down() {
    for cache_entries in [0, 32] {
        for (percent, reused) in [(99, false), (100, true)] {
            let (pool, _sim) = simulated_pool(
                1 << 30,
                PoolConfig {
                    reuse_policy: ReusePolicy::BestFit,
                    best_fit_max_waste_percent: percent,
                    release_threshold_bytes: u64::MAX,
                    thread_cache_entries: cache_entries,
                    ..PoolConfig::default()
                },
            );
            let a = pool.allocate_raw(3 * MIB).unwrap(); // a 4 MiB mapping
            pool.free_raw(a).unwrap();
            let b = pool.allocate_raw(G).unwrap();
            assert_eq!(
                b == a,
                reused,
                "cache entries {cache_entries}, {percent}%: the idle 4 MiB mapping"
            );
            let s = check(&pool);
            assert_eq!(
                (s.mappings_created, s.reuse_hits),
                if reused { (1, 1) } else { (2, 0) },
                "cache entries {cache_entries}, {percent}%"
            );
        }
    }
}

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

/// A thread cache's pick ("one of exactly the rounded size, else the smallest within
/// the policy's bound", `src/pool/cache.rs` `Inner::find`, as best-fit in the
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

/// `Allocation` (`Pool::allocate`'s guard) frees its allocation when dropped, also
/// one a thread cache handed out (a hit: its guard's id is the cache's allocation
/// key): after the drop nothing is live and the mapping is cached again.
#[test]
fn a_guard_of_a_thread_cache_hit_frees_it_when_dropped() {
    let (pool, _sim) = small_pool(32);
    let a = pool.allocate(2 * MIB).unwrap();
    let p = a.ptr();
    drop(a);
    let b = pool.allocate(2 * MIB).unwrap();
    assert_eq!(b.ptr(), p);
    assert_eq!(check(&pool).thread_cache_hits, 1);
    drop(b);
    let s = check(&pool);
    assert_eq!(
        (s.live_count, s.idle_count, s.thread_cache_count),
        (0, 1, 1)
    );
    let c = pool.allocate(2 * MIB).unwrap();
    assert_eq!(c.ptr(), p, "cached again: a second hit");
    assert_eq!(check(&pool).thread_cache_hits, 2);
    drop(c);
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// An exited thread's cache whose own entries are empty but whose remote list is
/// not is adopted with its remote list given back to the books first
/// (`Caches::register`: "an orphan adopted (what its exited thread left goes back
/// to the books first"; `Snapshot::thread_cache_count` counts remote lists).
///
/// This thread registers its cache first (a live 4 MiB allocation), so it is not
/// the one that adopts. Thread A allocates 2 MiB: a miss, a new mapping, live
/// through A's cache (the books' hand-out is adopted by the allocating thread); A
/// exits with nothing in its cache. This thread frees it: memory another thread's
/// cache handed out goes on that cache's remote list (`remote_frees` 1, counted in
/// `thread_cache_count` and `idle_count`). Thread C, with no cache, asks for 2 MiB:
/// it adopts A's cache, whose remote entry goes to the books first, so its own
/// cache is empty and the request is served by the books' idle mapping: a reuse hit
/// (the same address, no new mapping), not a thread-cache hit. Were the remote
/// list left in the adopted cache, C's pop would take it and count a cache hit.
#[test]
fn an_adopted_caches_remote_list_goes_back_to_the_books() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            thread_cache_entries: 32,
            ..PoolConfig::default()
        },
    );
    let keep = pool.allocate_raw(4 * MIB).unwrap();
    let a = std::thread::scope(|t| t.spawn(|| pool.allocate_raw(2 * MIB).unwrap()).join()).unwrap();
    pool.free_raw(a).unwrap();
    let s = check(&pool);
    assert_eq!((s.remote_frees, s.frees), (1, 1));
    assert_eq!(
        (s.thread_cache_count, s.thread_cache_bytes, s.idle_count),
        (1, 2 * MIB, 1)
    );
    let c = std::thread::scope(|t| t.spawn(|| pool.allocate_raw(2 * MIB).unwrap()).join()).unwrap();
    assert_eq!(c, a, "the idle mapping the adoption gave back to the books");
    let s = check(&pool);
    assert_eq!(
        (s.reuse_hits, s.thread_cache_hits, s.mappings_created),
        (1, 0, 2),
        "served by the books, not by the adopted cache"
    );
    assert_eq!(sim.call_count(DriverCall::Create), 2);
    assert_eq!(
        (s.live_count, s.idle_count, s.thread_cache_count),
        (2, 0, 0)
    );
    pool.free_raw(c).unwrap();
    pool.free_raw(keep).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

// ---------------------------------------------------------------- Snapshot invariants

/// A snapshot that satisfies every invariant of `Snapshot`'s documentation, with
/// each inequality at its boundary (equal), so that breaking any one by a little
/// breaks only that one.
fn valid() -> Snapshot {
    Snapshot {
        granularity_bytes: G,
        // Two whole mappings and one block live.
        live_count: 3,
        live_mapped_bytes: 2 * G,
        block_live_count: 1,
        block_live_bytes: 1024,
        // = live mapped + live blocks (+ sleeping, none).
        live_requested_bytes: 2 * G + 1024,
        idle_count: 1,
        idle_bytes: G,
        pending_count: 1,
        pending_bytes: G,
        segment_count: 1,
        segment_handles: 1,
        segment_mapped_bytes: G,
        block_free_bytes: G - 1024,
        segment_handles_lent: 1,
        // = segment mapped + idle.
        segment_lent_bytes: 2 * G,
        // = live mapped + idle + pending + segment mapped.
        physical_bytes: 5 * G,
        peak_physical_bytes: 5 * G,
        peak_live_mapped_bytes: 2 * G,
        reserved_bytes: 8 * G,
        allocations: 10,
        frees: 7,
        reuse_hits: 4,
        reuse_exact_hits: 4,
        reuse_forced_hits: 4,
        thread_cache_hits: 4,
        cross_stream_hits: 4,
        cross_stream_waits: 4,
        thread_cache_count: 2,
        // = idle + free blocks.
        thread_cache_bytes: 2 * G - 1024,
        event_wait_bytes: G,
        capture_held_bytes: G - 1024,
        ..Snapshot::default()
    }
}

/// [`valid`] with a tag asleep: three sleeping allocations (all blocks, all held),
/// again at every boundary.
fn valid_sleeping() -> Snapshot {
    let s = valid();
    Snapshot {
        tags_sleeping: 1,
        sleeping_count: 3,
        sleeping_held_count: 3,
        sleeping_bytes: 1024,
        sleeping_held_bytes: G,
        sleeping_block_count: 3,
        sleeping_block_bytes: 1024,
        offloaded_bytes: 1024,
        physical_bytes: s.physical_bytes + G,
        peak_physical_bytes: s.physical_bytes + G,
        live_requested_bytes: s.live_requested_bytes + 1024 + G,
        ..s
    }
}

/// `Snapshot::check_invariants`: "checks the accounting invariants; returns a
/// description of the first one broken". Every invariant the `Snapshot`
/// documentation lists (and each further one the check states) is broken alone,
/// from a snapshot that holds them all at their boundaries.
#[test]
fn check_invariants_catches_each_broken_invariant() {
    let g = G;
    // Valid ones first: at every boundary, with and without sleeping tags, empty.
    let fresh = Pool::new(PoolConfig::default()).unwrap().snapshot();
    for (name, s) in [
        ("valid", valid()),
        ("valid sleeping", valid_sleeping()),
        ("fresh pool", fresh),
        (
            "one live",
            Snapshot {
                granularity_bytes: g,
                live_count: 1,
                live_mapped_bytes: g,
                physical_bytes: g,
                peak_physical_bytes: g,
                peak_live_mapped_bytes: g,
                allocations: 1,
                ..Snapshot::default()
            },
        ),
    ] {
        assert_eq!(s.check_invariants(), Ok(()), "{name}: {s:#?}");
    }

    let v = valid();
    let z = valid_sleeping();
    let one_live = Snapshot {
        granularity_bytes: g,
        live_count: 1,
        live_mapped_bytes: g,
        physical_bytes: g,
        peak_physical_bytes: g,
        peak_live_mapped_bytes: g,
        allocations: 1,
        ..Snapshot::default()
    };
    // (what is broken, a word of the description, the snapshot)
    let broken: Vec<(&str, &str, Snapshot)> = vec![
        (
            "physical above the sum of its parts",
            "physical",
            Snapshot {
                physical_bytes: 6 * g,
                peak_physical_bytes: 6 * g,
                ..v
            },
        ),
        (
            "physical below the sum of its parts",
            "physical",
            Snapshot {
                physical_bytes: 4 * g,
                ..v
            },
        ),
        (
            "sleeping held bytes left out of physical",
            "physical",
            Snapshot {
                physical_bytes: v.physical_bytes,
                ..z
            },
        ),
        (
            "sleeping bytes with no tag asleep",
            "asleep",
            Snapshot {
                tags_sleeping: 0,
                ..z
            },
        ),
        (
            // Sleeping bytes not held (offloaded or discarded blocks) alone: their
            // sum with the held and offloaded bytes is not 0, though neither of those
            // is.
            "unheld sleeping bytes with no tag asleep",
            "asleep",
            Snapshot {
                sleeping_count: 1,
                sleeping_bytes: 1024,
                sleeping_block_count: 1,
                sleeping_block_bytes: 1024,
                live_requested_bytes: v.live_requested_bytes + 1024,
                ..v
            },
        ),
        (
            "offloaded bytes with no tag asleep",
            "asleep",
            Snapshot {
                offloaded_bytes: 1024,
                ..v
            },
        ),
        (
            "more held sleeping than sleeping",
            "sleeping counts",
            Snapshot {
                sleeping_held_count: 4,
                ..z
            },
        ),
        (
            "more sleeping than live",
            "sleeping counts",
            Snapshot {
                sleeping_count: 4,
                ..z
            },
        ),
        (
            "sleeping allocations with no sleeping bytes",
            "sleeping counts",
            Snapshot {
                tags_sleeping: 1,
                sleeping_count: 1,
                ..v
            },
        ),
        (
            "sleeping bytes with no sleeping allocation",
            "sleeping counts",
            Snapshot {
                tags_sleeping: 1,
                sleeping_bytes: 1024,
                live_requested_bytes: v.live_requested_bytes + 1024,
                ..v
            },
        ),
        (
            "held sleeping count without held bytes",
            "sleeping counts",
            Snapshot {
                sleeping_held_bytes: 0,
                physical_bytes: z.physical_bytes - g,
                live_requested_bytes: z.live_requested_bytes - g,
                ..z
            },
        ),
        (
            "held sleeping bytes without a held count",
            "sleeping counts",
            Snapshot {
                sleeping_held_count: 0,
                ..z
            },
        ),
        (
            "more sleeping blocks than sleeping allocations",
            "sleeping block",
            Snapshot {
                sleeping_block_count: 4,
                ..z
            },
        ),
        (
            "sleeping block bytes above sleeping bytes",
            "sleeping block",
            Snapshot {
                sleeping_block_bytes: 1536,
                ..z
            },
        ),
        (
            "sleeping blocks without bytes",
            "sleeping block",
            Snapshot {
                sleeping_block_bytes: 0,
                ..z
            },
        ),
        (
            "sleeping block bytes without blocks",
            "sleeping block",
            Snapshot {
                sleeping_block_count: 0,
                ..z
            },
        ),
        (
            "segment mapped below live + free blocks",
            "segment mapped",
            Snapshot {
                block_free_bytes: v.block_free_bytes + 512,
                ..v
            },
        ),
        (
            "more live blocks than live allocations",
            "live blocks",
            Snapshot {
                block_live_count: 4,
                ..v
            },
        ),
        (
            "live block bytes without live blocks",
            "live block count",
            Snapshot {
                block_live_count: 0,
                ..v
            },
        ),
        (
            "live blocks without live block bytes",
            "live block count",
            Snapshot {
                block_live_bytes: 0,
                block_free_bytes: g,
                live_requested_bytes: 2 * g,
                ..v
            },
        ),
        (
            "segment mapped bytes without segment handles",
            "segment handles",
            Snapshot {
                segment_handles: 0,
                ..v
            },
        ),
        (
            "lent bytes without lent handles",
            "lent handles",
            Snapshot {
                segment_handles_lent: 0,
                ..v
            },
        ),
        (
            "lent handles without lent bytes",
            "lent handles",
            Snapshot {
                segment_lent_bytes: 0,
                ..v
            },
        ),
        (
            "lent bytes above segment mapped + idle",
            "lent bytes above",
            Snapshot {
                segment_lent_bytes: 3 * g,
                ..v
            },
        ),
        (
            "live block bytes not a multiple of 512",
            "512",
            Snapshot {
                block_live_bytes: 1280,
                block_free_bytes: g - 1280,
                live_requested_bytes: v.live_requested_bytes + 256,
                thread_cache_bytes: v.thread_cache_bytes - 256,
                capture_held_bytes: v.capture_held_bytes - 256,
                ..v
            },
        ),
        (
            // Free block bytes alone off the 512-byte step (the live ones on it): the
            // segment's mapped bytes, their sum, then off the granularity too, which
            // is checked later and must not be what reports it.
            "free block bytes not a multiple of 512",
            "512",
            Snapshot {
                block_free_bytes: v.block_free_bytes + 256,
                segment_mapped_bytes: v.segment_mapped_bytes + 256,
                physical_bytes: v.physical_bytes + 256,
                peak_physical_bytes: v.peak_physical_bytes + 256,
                ..v
            },
        ),
        (
            "physical above its peak",
            "peak",
            Snapshot {
                peak_physical_bytes: 5 * g - 1,
                ..v
            },
        ),
        (
            "live mapped above its peak",
            "peak",
            Snapshot {
                peak_live_mapped_bytes: 2 * g - 1,
                ..v
            },
        ),
        (
            "live requested above live bytes",
            "live requested",
            Snapshot {
                live_requested_bytes: v.live_requested_bytes + 1,
                ..v
            },
        ),
        (
            "live requested above live bytes (sleeping)",
            "live requested",
            Snapshot {
                live_requested_bytes: z.live_requested_bytes + 1,
                ..z
            },
        ),
        (
            "more thread-cache hits than reuse hits",
            "thread-cache hits",
            Snapshot {
                thread_cache_hits: 5,
                ..v
            },
        ),
        (
            "thread-cache bytes without entries",
            "thread-cache count",
            Snapshot {
                thread_cache_count: 0,
                ..v
            },
        ),
        (
            "thread-cache entries without bytes",
            "thread-cache count",
            Snapshot {
                thread_cache_bytes: 0,
                ..v
            },
        ),
        (
            "thread-cache bytes above idle + free blocks",
            "thread-cache bytes",
            Snapshot {
                thread_cache_bytes: v.thread_cache_bytes + 512,
                ..v
            },
        ),
        (
            "more exact hits than hits",
            "exact",
            Snapshot {
                reuse_exact_hits: 5,
                ..v
            },
        ),
        (
            "more forced hits than hits",
            "forced",
            Snapshot {
                reuse_forced_hits: 5,
                ..v
            },
        ),
        (
            "event-wait + capture-held above idle + free blocks (capture)",
            "event-wait",
            Snapshot {
                capture_held_bytes: v.capture_held_bytes + 512,
                ..v
            },
        ),
        (
            "event-wait + capture-held above idle + free blocks (event)",
            "event-wait",
            Snapshot {
                event_wait_bytes: v.event_wait_bytes + 512,
                ..v
            },
        ),
        (
            "more cross-stream hits than hits",
            "cross-stream hits",
            Snapshot {
                cross_stream_hits: 5,
                ..v
            },
        ),
        (
            "more cross-stream waits than cross-stream hits",
            "cross-stream waits",
            Snapshot {
                cross_stream_waits: 5,
                ..v
            },
        ),
        (
            "allocations above frees + live",
            "allocations",
            Snapshot {
                allocations: 11,
                ..v
            },
        ),
        (
            "allocations below frees + live",
            "allocations",
            Snapshot { frees: 8, ..v },
        ),
        (
            "live mapped not a multiple of the granularity",
            "live mapped bytes",
            Snapshot {
                live_mapped_bytes: v.live_mapped_bytes + 4096,
                peak_live_mapped_bytes: v.live_mapped_bytes + 4096,
                physical_bytes: v.physical_bytes + 4096,
                peak_physical_bytes: v.physical_bytes + 4096,
                ..v
            },
        ),
        (
            "idle not a multiple of the granularity",
            "idle bytes",
            Snapshot {
                idle_bytes: v.idle_bytes + 4096,
                physical_bytes: v.physical_bytes + 4096,
                peak_physical_bytes: v.physical_bytes + 4096,
                ..v
            },
        ),
        (
            "pending not a multiple of the granularity",
            "pending bytes",
            Snapshot {
                pending_bytes: v.pending_bytes + 4096,
                physical_bytes: v.physical_bytes + 4096,
                peak_physical_bytes: v.physical_bytes + 4096,
                ..v
            },
        ),
        (
            "reserved not a multiple of the granularity",
            "reserved bytes",
            Snapshot {
                reserved_bytes: v.reserved_bytes + 4096,
                ..v
            },
        ),
        (
            "segment mapped not a multiple of the granularity",
            "segment mapped bytes",
            Snapshot {
                segment_mapped_bytes: v.segment_mapped_bytes + 4096,
                block_free_bytes: v.block_free_bytes + 4096,
                physical_bytes: v.physical_bytes + 4096,
                peak_physical_bytes: v.physical_bytes + 4096,
                ..v
            },
        ),
        (
            "live bytes with no live allocation",
            "live count",
            Snapshot {
                live_count: 0,
                allocations: 0,
                ..one_live
            },
        ),
        (
            "a live allocation with no live bytes",
            "live count",
            Snapshot {
                live_mapped_bytes: 0,
                physical_bytes: 0,
                ..one_live
            },
        ),
        (
            "idle bytes with no idle mapping",
            "idle count",
            Snapshot { idle_count: 0, ..v },
        ),
        (
            "an idle mapping with no idle bytes",
            "idle count",
            Snapshot {
                granularity_bytes: g,
                idle_count: 1,
                ..Snapshot::default()
            },
        ),
    ];
    for (what, word, s) in broken {
        match s.check_invariants() {
            Ok(()) => panic!("{what}: accepted\n{s:#?}"),
            Err(e) => assert!(e.contains(word), "{what}: reported as {e:?}"),
        }
    }
}

// ---------------------------------------------------------------- scope guard

/// `RetentionScope::abort`: "Errors: as [`Pool::retention_abort`]", that is
/// "[`Error::Driver`] with the first release step the driver refused (the scope is
/// closed all the same, and what was refused is kept and retried at the next release
/// point)".
#[test]
fn retention_scope_abort_returns_the_errors_of_its_release() {
    // A refused unmap: the mapping stays whole and idle, retried by trim.
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let scope = pool.retention_scope().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    assert_eq!(check(&pool).idle_bytes, 4 * MIB, "retained in the scope");
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    let err = scope.abort().unwrap_err();
    assert_eq!(
        err.driver_error(),
        Some(DriverError::new(DriverCall::Unmap, FAIL)),
        "{err:?}"
    );
    assert!(
        matches!(err, Error::Driver { bytes, .. } if bytes == 4 * MIB),
        "{err:?}"
    );
    let s = check(&pool);
    assert!(!s.scope_open, "closed all the same");
    assert_eq!(
        (s.scopes_aborted, s.scopes_finished, s.unmap_failures),
        (1, 0, 1)
    );
    assert_eq!(
        (s.idle_count, s.idle_bytes, s.physical_bytes),
        (1, 4 * MIB, 4 * MIB)
    );
    pool.trim().unwrap();
    assert_eq!(check(&pool).mappings_released, 1);
    assert_driver_empty(&pool);

    // A refused handle release: unmapped, the handle pending, retried by trim.
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let scope = pool.retention_scope().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    sim.inject_failure(DriverCall::Release, 1, FAIL);
    let err = scope.abort().unwrap_err();
    assert_eq!(
        err.driver_error(),
        Some(DriverError::new(DriverCall::Release, FAIL))
    );
    let s = check(&pool);
    assert_eq!(
        (
            s.scopes_aborted,
            s.release_failures,
            s.pending_count,
            s.pending_bytes
        ),
        (1, 1, 1, 4 * MIB)
    );
    assert_eq!((s.idle_count, s.physical_bytes), (0, 4 * MIB));
    pool.trim().unwrap();
    assert_driver_empty(&pool);

    // Nothing refused: Ok, and the idle mapping released.
    let (pool, _sim) = simulated_pool(1 << 30, PoolConfig::default());
    let scope = pool.retention_scope().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    scope.abort().unwrap();
    let s = check(&pool);
    assert_eq!((s.scopes_aborted, s.mappings_released), (1, 1));
    assert_driver_empty(&pool);
}

// ---------------------------------------------------------------- mappings_released

/// `Snapshot::mappings_released`: "Mappings fully released", of those counted in
/// `mappings_created` ("create, reserve, map, set access all succeeded"). What a
/// failed creation leaves to the driver (kept pending, released at the next release
/// point) was never a created mapping: its release does not count.
#[test]
fn mappings_released_does_not_count_leftovers_of_a_failed_creation() {
    // (the step that fails, the undo step that fails too)
    let cases = [
        (DriverCall::Map, DriverCall::Release),
        (DriverCall::Map, DriverCall::FreeReservation),
        (DriverCall::SetAccess, DriverCall::Unmap),
        (DriverCall::SetAccess, DriverCall::Release),
        (DriverCall::Reserve, DriverCall::Release),
    ];
    for (step, undo) in cases {
        let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
        // One real mapping, created and released (threshold 0).
        let a = pool.allocate_raw(4 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        let s = check(&pool);
        assert_eq!((s.mappings_created, s.mappings_released), (1, 1));
        // A creation that fails at `step`, whose undo fails at `undo`.
        sim.inject_failure(step, 1, FAIL);
        sim.inject_failure(undo, 1, FAIL);
        let err = pool.allocate_raw(4 * MIB).unwrap_err();
        assert_eq!(
            err.driver_error(),
            Some(DriverError::new(step, FAIL)),
            "{step:?}/{undo:?}"
        );
        let s = check(&pool);
        assert_eq!(
            s.pending_count, 1,
            "{step:?}/{undo:?}: the leftover is kept"
        );
        assert_eq!(
            (s.mappings_created, s.mappings_released),
            (1, 1),
            "{step:?}/{undo:?}"
        );
        // The next release point releases the leftover: not a created mapping. Only
        // a leftover still mapped (its undo's unmap failed) is unmapped there; one
        // that was never mapped (the map or the reservation failed) or was unmapped
        // by the undo needs no unmap: the retry is the undo's remaining steps.
        let unmaps = sim.call_count(DriverCall::Unmap);
        pool.trim().unwrap();
        let still_mapped = undo == DriverCall::Unmap;
        assert_eq!(
            sim.call_count(DriverCall::Unmap) - unmaps,
            u64::from(still_mapped),
            "{step:?}/{undo:?}: unmaps of the leftover's release"
        );
        let s = check(&pool);
        assert_eq!(s.pending_count, 0, "{step:?}/{undo:?}");
        assert_eq!(
            (s.mappings_created, s.mappings_released),
            (1, 1),
            "{step:?}/{undo:?}: the leftover's release is not a mapping released"
        );
        assert_driver_empty(&pool);
        // A real mapping still counts.
        let b = pool.allocate_raw(4 * MIB).unwrap();
        pool.free_raw(b).unwrap();
        let s = check(&pool);
        assert_eq!((s.mappings_created, s.mappings_released), (2, 2));
    }
}

// ---------------------------------------------------------------- out-of-memory retry

/// A pool on a 16 MiB simulated device that caches every free (threshold
/// `u64::MAX`) with thread caches `cache_entries`.
fn small_pool(cache_entries: u32) -> (Pool, Arc<SimDriver>) {
    simulated_pool(
        16 * MIB,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            thread_cache_entries: cache_entries,
            ..PoolConfig::default()
        },
    )
}

/// `Pool::allocate_raw`: "[`Error::OutOfMemory`] when the device is full (outside a
/// scope, after releasing idle mappings and retrying once)"; `Snapshot::oom_retries`
/// counts the retry. Two idle 6 MiB mappings (too small for 8 MiB under best-fit)
/// leave no room for 8 MiB on a 16 MiB device; released, they do.
#[test]
fn oom_with_idle_memory_releases_it_and_the_retry_succeeds() {
    for cache_entries in [0, 32] {
        let (pool, sim) = small_pool(cache_entries);
        let a = pool.allocate_raw(6 * MIB).unwrap();
        let b = pool.allocate_raw(6 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        pool.free_raw(b).unwrap();
        let s = check(&pool);
        assert_eq!((s.idle_count, s.idle_bytes), (2, 12 * MIB));
        let syncs = sim.call_count(DriverCall::Synchronize);
        let c = pool.allocate_raw(8 * MIB).unwrap();
        let s = check(&pool);
        let ctx = format!("cache entries {cache_entries}: {s:#?}");
        assert_eq!(s.physical_bytes, 8 * MIB, "{ctx}");
        assert_eq!(sim.state().physical_bytes, 8 * MIB);
        assert_eq!((s.live_count, s.live_mapped_bytes), (1, 8 * MIB), "{ctx}");
        assert_eq!((s.idle_count, s.idle_bytes), (0, 0), "{ctx}");
        assert_eq!(s.oom_retries, 1, "{ctx}");
        assert_eq!(s.create_failures, 1, "{ctx}: the first try");
        assert_eq!((s.mappings_created, s.mappings_released), (3, 2), "{ctx}");
        assert_eq!((s.reuse_hits, s.reuse_forced_hits), (0, 0), "{ctx}");
        assert_eq!(s.peak_physical_bytes, 12 * MIB, "{ctx}: never both");
        // Four creates: a, b, the refused one, the retry.
        assert_eq!(sim.call_count(DriverCall::Create), 4);
        // The synchronous allocate releases after one device synchronize.
        assert_eq!(sim.call_count(DriverCall::Synchronize), syncs + 1);
        pool.free_raw(c).unwrap();
        pool.trim().unwrap();
        assert_driver_empty(&pool);
    }
}

/// `Snapshot::reuse_forced_hits` / `Pool::after_oom`: before releasing anything, an
/// out-of-memory takes the smallest idle mapping that fits, whatever the waste
/// bound: a 12 MiB idle mapping serves 6 MiB (100% over, beyond best-fit's 30%),
/// with no release and no retry.
#[test]
fn oom_takes_a_fitting_idle_mapping_before_releasing() {
    let (pool, sim) = small_pool(0);
    let a = pool.allocate_raw(12 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    let b = pool.allocate_raw(6 * MIB).unwrap();
    assert_eq!(b, a);
    let s = check(&pool);
    assert_eq!(
        (s.reuse_hits, s.reuse_forced_hits, s.oom_retries),
        (1, 1, 0)
    );
    assert_eq!((s.create_failures, s.mappings_released), (1, 0));
    assert_eq!(
        (s.physical_bytes, s.live_mapped_bytes),
        (12 * MIB, 12 * MIB)
    );
    assert_eq!(sim.call_count(DriverCall::Create), 2);
    pool.free_raw(b).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// `Error::OutOfMemory`: `requested` is "bytes asked for, rounded up to the
/// granularity", `live` "bytes mapped to live allocations", `idle` "bytes held idle
/// when the request failed" (outside a scope, after the release: what could not be
/// released), `source` "the driver's out-of-memory failure".
#[test]
fn oom_with_nothing_idle_reports_request_live_and_idle() {
    let (pool, sim) = small_pool(0);
    let live = pool.allocate_raw(10 * MIB).unwrap();
    let before = check(&pool);
    let err = pool.allocate_raw(7 * MIB + 1).unwrap_err();
    let oom = Some(DriverError::new(
        DriverCall::Create,
        CuResult::OUT_OF_MEMORY,
    ));
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 8 * MIB,
            live: 10 * MIB,
            idle: 0,
            in_scope: false,
            source: oom,
        }
    );
    let s = check(&pool);
    assert_eq!(s.oom_retries, before.oom_retries + 1);
    assert_eq!(
        s.create_failures,
        before.create_failures + 2,
        "the try and the retry"
    );
    assert_eq!(s.physical_bytes, 10 * MIB);
    assert_eq!(sim.state().physical_bytes, 10 * MIB);

    // Idle memory too small to serve is released before the retry: the error then
    // reports none idle.
    let small = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(small).unwrap();
    assert_eq!(check(&pool).idle_bytes, 4 * MIB);
    let err = pool.allocate_raw(8 * MIB).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 8 * MIB,
            live: 10 * MIB,
            idle: 0,
            in_scope: false,
            source: oom,
        }
    );
    let s = check(&pool);
    assert_eq!((s.idle_bytes, s.physical_bytes), (0, 10 * MIB));
    assert_eq!(s.oom_retries, before.oom_retries + 2);
    assert_eq!(s.mappings_released, 1);

    // Inside a scope nothing retained is released and nothing retried.
    pool.retention_begin().unwrap();
    let small = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(small).unwrap();
    let err = pool.allocate_raw(8 * MIB).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 8 * MIB,
            live: 10 * MIB,
            idle: 4 * MIB,
            in_scope: true,
            source: oom,
        }
    );
    let s = check(&pool);
    assert_eq!(s.oom_retries, before.oom_retries + 2, "no retry in a scope");
    pool.retention_finish().unwrap();
    pool.free_raw(live).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// The retry itself fails with something other than out-of-memory: `Pool::
/// allocate_raw` "[`Error::Driver`] for any other failed driver call", with `bytes`
/// the rounded request; the idle memory released before it stays released and the
/// books equal the driver (each step of a failed creation undone).
#[test]
fn a_failure_of_the_retry_is_reported_and_the_books_stay_consistent() {
    // (the call failed during the retry, its nth call counted from the start of
    // the allocation: the first create is the refused one)
    for (call, nth) in [
        (DriverCall::Create, 2),
        (DriverCall::Reserve, 1),
        (DriverCall::Map, 1),
        (DriverCall::SetAccess, 1),
    ] {
        let (pool, sim) = small_pool(0);
        let a = pool.allocate_raw(6 * MIB).unwrap();
        let b = pool.allocate_raw(6 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        pool.free_raw(b).unwrap();
        let before = check(&pool);
        sim.inject_failure(call, nth, FAIL);
        let err = pool.allocate_raw(8 * MIB).unwrap_err();
        assert_eq!(
            err,
            Error::Driver {
                source: DriverError::new(call, FAIL),
                bytes: 8 * MIB,
            },
            "{call:?}"
        );
        assert_eq!(sim.pending_failures(), 0, "{call:?}: the injection fired");
        let s = check(&pool);
        assert_eq!(s.check_invariants(), Ok(()));
        assert_eq!(s.physical_bytes, sim.state().physical_bytes, "{call:?}");
        assert_eq!(
            s.physical_bytes, 0,
            "{call:?}: idle released, creation undone"
        );
        assert_eq!((s.idle_count, s.live_count, s.pending_count), (0, 0, 0));
        assert_eq!(s.oom_retries, before.oom_retries + 1, "{call:?}");
        assert_eq!(s.mappings_released, 2, "{call:?}: the two idle ones");
        assert_eq!(s.mappings_created, 2, "{call:?}");
        assert_eq!(
            s.driver_failures(),
            before.driver_failures() + 2,
            "{call:?}"
        );
        assert_driver_empty(&pool);
        // The device is usable again.
        let c = pool.allocate_raw(16 * MIB).unwrap();
        pool.free_raw(c).unwrap();
        pool.trim().unwrap();
        assert_driver_empty(&pool);
    }
}

/// The retry's creation fails and its undo is refused too: the leftover is pending
/// (booked in `physical_bytes` and `pending_bytes`, equal to what the driver holds)
/// and released at the next release point.
#[test]
fn a_failed_retry_with_a_refused_undo_leaves_consistent_pending_books() {
    let (pool, sim) = small_pool(0);
    let a = pool.allocate_raw(6 * MIB).unwrap();
    let b = pool.allocate_raw(6 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    sim.inject_failure(DriverCall::SetAccess, 1, FAIL);
    // The two idle mappings' unmaps succeed (the OOM release), the undo's fails.
    sim.inject_failure(DriverCall::Unmap, 3, FAIL);
    let err = pool.allocate_raw(8 * MIB).unwrap_err();
    assert_eq!(
        err.driver_error(),
        Some(DriverError::new(DriverCall::SetAccess, FAIL))
    );
    let s = check(&pool);
    assert_eq!(
        (s.pending_count, s.pending_bytes, s.physical_bytes),
        (1, 8 * MIB, 8 * MIB)
    );
    assert_eq!(sim.state().physical_bytes, 8 * MIB);
    assert_eq!((s.access_failures, s.unmap_failures), (1, 1));
    assert_eq!((s.mappings_created, s.mappings_released), (2, 2));
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.pending_count, s.physical_bytes), (0, 0));
    assert_eq!(
        s.mappings_released, 2,
        "a leftover is not a mapping released"
    );
    assert_driver_empty(&pool);
}

/// The release before the retry is refused in part: what the driver refused stays
/// idle (booked, equal to the driver), the retry then reports out of memory with
/// those idle bytes, and the next release point releases them.
#[test]
fn a_refused_release_before_the_retry_keeps_memory_and_reports_it() {
    // A refused unmap: one of the two 8 MiB idle mappings stays.
    let (pool, sim) = small_pool(0);
    let a = pool.allocate_raw(8 * MIB).unwrap();
    let b = pool.allocate_raw(8 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    // 10 MiB: too large for 8 MiB idle, too large beside 16 MiB or 8 MiB held.
    let err = pool.allocate_raw(10 * MIB).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 10 * MIB,
            live: 0,
            idle: 8 * MIB,
            in_scope: false,
            source: Some(DriverError::new(
                DriverCall::Create,
                CuResult::OUT_OF_MEMORY
            )),
        }
    );
    let s = check(&pool);
    assert_eq!(
        (s.idle_count, s.idle_bytes, s.physical_bytes),
        (1, 8 * MIB, 8 * MIB)
    );
    assert_eq!(sim.state().physical_bytes, 8 * MIB);
    assert_eq!(
        (s.unmap_failures, s.oom_retries, s.mappings_released),
        (1, 1, 1)
    );
    pool.trim().unwrap();
    assert_driver_empty(&pool);

    // A refused synchronize: nothing is released, both stay idle.
    let (pool, sim) = small_pool(0);
    let a = pool.allocate_raw(8 * MIB).unwrap();
    let b = pool.allocate_raw(8 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    sim.inject_failure(DriverCall::Synchronize, 1, FAIL);
    let err = pool.allocate_raw(10 * MIB).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { requested, live: 0, idle, in_scope: false, .. }
            if requested == 10 * MIB && idle == 16 * MIB),
        "{err:?}"
    );
    let s = check(&pool);
    assert_eq!((s.idle_count, s.physical_bytes), (2, 16 * MIB));
    assert_eq!((s.sync_failures, s.mappings_released), (1, 0));
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// The out-of-memory itself is injected (the driver refuses although it has room):
/// the pool releases what is idle and retries once, and the retry succeeds.
#[test]
fn an_injected_oom_with_idle_memory_is_retried() {
    let (pool, sim) = small_pool(0);
    let a = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    let b = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.oom_retries, s.create_failures), (1, 1));
    assert_eq!((s.idle_bytes, s.physical_bytes), (0, 4 * MIB));
    assert_eq!(
        s.mappings_released, 1,
        "the idle one released before the retry"
    );
    pool.free_raw(b).unwrap();
    // Two injected in a row: the retry fails too, with the out-of-memory.
    let (pool, sim) = small_pool(0);
    sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    let err = pool.allocate_raw(4 * MIB).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { requested, live: 0, idle: 0, in_scope: false, source: Some(_) } if requested == 4 * MIB),
        "{err:?}"
    );
    let s = check(&pool);
    assert_eq!(
        (s.oom_retries, s.create_failures, s.physical_bytes),
        (1, 2, 0)
    );
}

/// `Pool::miss`: "A stream-ordered allocation never synchronizes the device (a
/// capture may be open on any stream): it releases only memory whose fences
/// completed; the synchronous `allocate` releases everything idle, after a device
/// synchronize." Memory freed on the stream (no work queued: its fence is complete)
/// is released for the retry with no device synchronize; memory freed with the
/// synchronous `free` is not, and the retry reports it idle.
#[test]
fn a_stream_ordered_oom_releases_only_fenced_memory_without_synchronizing() {
    // Freed on the stream: released, the retry succeeds.
    let (pool, sim) = small_pool(0);
    let s = common::stream(&sim);
    let a = pool.allocate_async_raw(6 * MIB, s).unwrap();
    let b = pool.allocate_async_raw(6 * MIB, s).unwrap();
    pool.free_async_raw(a, s).unwrap();
    pool.free_async_raw(b, s).unwrap();
    assert_eq!(check(&pool).idle_bytes, 12 * MIB);
    let syncs = sim.call_count(DriverCall::Synchronize);
    let c = pool.allocate_async_raw(8 * MIB, s).unwrap();
    let st = check(&pool);
    assert_eq!((st.oom_retries, st.create_failures), (1, 1));
    assert_eq!((st.idle_bytes, st.physical_bytes), (0, 8 * MIB));
    assert_eq!(sim.state().physical_bytes, 8 * MIB);
    assert_eq!(st.mappings_released, 2);
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        syncs,
        "no device sync"
    );
    common::no_faults(&sim);
    pool.free_async_raw(c, s).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);

    // Freed with the synchronous free: its release needs a device synchronize,
    // which a stream-ordered allocation never makes: kept, reported idle.
    let (pool, sim) = small_pool(0);
    let s = common::stream(&sim);
    let a = pool.allocate_raw(6 * MIB).unwrap();
    let b = pool.allocate_raw(6 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    let syncs = sim.call_count(DriverCall::Synchronize);
    let err = pool.allocate_async_raw(8 * MIB, s).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 8 * MIB,
            live: 0,
            idle: 12 * MIB,
            in_scope: false,
            source: Some(DriverError::new(
                DriverCall::Create,
                CuResult::OUT_OF_MEMORY
            )),
        }
    );
    let st = check(&pool);
    assert_eq!((st.oom_retries, st.create_failures), (1, 2));
    assert_eq!((st.idle_count, st.physical_bytes), (2, 12 * MIB));
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        syncs,
        "no device sync"
    );
    // The synchronous allocate does synchronize, releases them, and succeeds.
    let c = pool.allocate_raw(8 * MIB).unwrap();
    let st = check(&pool);
    assert_eq!(
        (st.oom_retries, st.physical_bytes, st.mappings_released),
        (2, 8 * MIB, 2)
    );
    assert_eq!(sim.call_count(DriverCall::Synchronize), syncs + 1);
    pool.free_raw(c).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// The simulated granularity has a least, one page: below it mappings would share
/// the 512-byte units of the thread caches' pointer table (a review saw a live
/// pointer refused as unknown at a granularity of 1). At the least, small requests
/// through a thread cache in a scope work.
#[test]
fn simulated_granularity_below_a_page_is_refused() {
    let config = |g: u64| PoolConfig {
        backend: flare_package::Backend::Simulated(SimConfig {
            granularity_bytes: g,
            ..SimConfig::default()
        }),
        ..PoolConfig::default()
    };
    for g in [1u64, 256, 2048] {
        match Pool::new(config(g)) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("below the least"), "{m}"),
            other => panic!("granularity {g}: {:?}", other.map(|_| ())),
        }
    }
    let pool = Pool::new(config(4096)).unwrap();
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(1000).unwrap();
    let b = pool.allocate_raw(3000).unwrap();
    assert_eq!((a % 4096, b % 4096), (0, 0));
    pool.free_raw(a).unwrap();
    let c = pool.allocate_raw(900).unwrap();
    assert_eq!(c, a, "the idle 4 KiB mapping");
    pool.free_raw(c).unwrap();
    pool.free_raw(b).unwrap();
    assert_eq!(check(&pool).live_count, 0);
    pool.retention_finish().unwrap();
}

/// `Pool`'s `Debug` (what a failing test prints) names its policy, its granularity in
/// bytes and whether it runs on the simulated driver: a best-fit pool on the default
/// simulator shows `BestFit`, 2 MiB (2097152) and `simulated: true`.
#[test]
fn debug_names_the_policy_granularity_and_backend() {
    let (pool, _sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::BestFit,
            ..PoolConfig::default()
        },
    );
    let text = format!("{pool:?}");
    assert!(text.starts_with("Pool { policy: BestFit"), "{text}");
    assert!(
        text.contains("granularity: 2097152, simulated: true, .. }"),
        "{text}"
    );
}

/// Segment mode: a growth whose `cuMemSetAccess` fails and whose undoing unmap fails
/// too leaves its range mapped with no access (`map_fresh`: "the claimed range now
/// holds a mapping that cannot be removed"). That range must stay claimed: the next
/// growth maps its new handle past it, not over it (the driver refuses to map over
/// a mapped range), so the next allocation succeeds on memory it may touch.
#[test]
fn a_growth_range_left_mapped_stays_claimed() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            ..PoolConfig::default()
        },
    );
    sim.inject_failure(DriverCall::SetAccess, 1, FAIL);
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    assert!(pool.allocate_raw(4096).is_err());
    let p = pool
        .allocate_raw(4096)
        .expect("the next growth maps past the lost range");
    assert_eq!(sim.touch(p, 4096, 0), CuResult::SUCCESS);
    assert!(sim.faults().is_empty(), "{:?}", sim.faults());
    pool.free_raw(p).unwrap();
    // The trim releases both handles: the failed growth's (kept pending, never
    // created: its set-access failed) is counted in neither `mappings_created` nor
    // `mappings_released`, the second growth's in both.
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.mappings_created, s.mappings_released), (1, 1));
    assert_eq!((s.physical_bytes, s.pending_count), (0, 0));
}

/// A segment-mode pool on the default simulator (1 GiB), in a retention scope.
fn seg_pool_in_scope() -> (Pool, Arc<SimDriver>) {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            ..PoolConfig::default()
        },
    );
    pool.retention_begin().unwrap();
    (pool, sim)
}

/// Stitching (`lend_handles`: "largest first while they fit in need"): a 4 MiB
/// growth whose segment has two free 2 MiB handles, each alone in its free block
/// (its neighbours live), lends both and creates no handle: the peak stays at the
/// 12 MiB the four 2 MiB and one 4 MiB allocations made.
#[test]
fn a_growth_lends_every_lone_free_handle_it_needs() {
    let (pool, sim) = seg_pool_in_scope();
    let w: Vec<_> = (0..4)
        .map(|_| pool.allocate_raw(2 * MIB).unwrap())
        .collect();
    let n1 = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(w[0]).unwrap();
    pool.free_raw(w[2]).unwrap();
    let created = sim.call_count(DriverCall::Create);
    let n2 = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!(sim.call_count(DriverCall::Create), created, "no new handle");
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (2, 4 * MIB));
    assert_eq!(s.peak_physical_bytes, 12 * MIB);
    for p in [w[1], w[3], n1, n2] {
        pool.free_raw(p).unwrap();
    }
    pool.retention_finish().unwrap();
}

/// A lend whose new mapping cannot be undone (`cuMemSetAccess` refused, then the
/// unmap too) keeps that mapping, retired, as the handle's alias (`lend_failed`):
/// the handle counts as lent, its 2 MiB in `segment_lent_bytes`, and the growth
/// fails with the set-access error.
#[test]
fn a_lend_left_mapped_counts_as_lent() {
    let (pool, sim) = seg_pool_in_scope();
    let w1 = pool.allocate_raw(2 * MIB).unwrap();
    let w2 = pool.allocate_raw(2 * MIB).unwrap();
    let n1 = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(w1).unwrap();
    sim.inject_failure(DriverCall::SetAccess, 1, FAIL);
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    match pool.allocate_raw(4 * MIB) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::SetAccess),
        other => panic!("{other:?}"),
    }
    let s = check(&pool);
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (1, 2 * MIB));
    for p in [w2, n1] {
        pool.free_raw(p).unwrap();
    }
    pool.retention_finish().unwrap();
}

/// `Pool::destroy` with a segment handle the driver will not unmap (refused, and
/// again at the retry): the error names the unmap, and that handle's memory is left
/// to the driver, its segment's reservation with it ("a reservation is never freed
/// while a mapping in it is live"); the rest is released.
#[test]
fn destroy_keeps_the_reservation_of_a_segment_left_mapped() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            ..PoolConfig::default()
        },
    );
    let _p = pool.allocate_raw(4096).unwrap();
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    sim.inject_failure(DriverCall::Unmap, 2, FAIL);
    match pool.destroy() {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Unmap),
        other => panic!("{other:?}"),
    }
    let d = sim.state();
    assert_eq!((d.handles, d.mappings, d.reservations), (1, 1, 1), "{d:?}");
    // Not even tried: the segment's is the only reservation.
    assert_eq!(sim.call_count(DriverCall::FreeReservation), 0);
    assert!(sim.faults().is_empty(), "{:?}", sim.faults());
}

/// Segment mode, "Growth" (`docs/ARCHITECTURE.md`): "a miss maps one new whole handle
/// at the segment's end, counting the free block already there", and a lend takes
/// only handles "not the block at the segment's end, which the growth extends anyway"
/// (`lend_handles`). A growth whose lend the driver refused leaves the lent range
/// claimed above the segment's highest handle; the next release brings the growing
/// end back down to that handle ("Release": "the segment's growing end comes back
/// down to its highest mapping left"). After it, the block at the end (live then,
/// freed later) is still the one a growth extends: a 4 MiB request over a free
/// 2 MiB end block maps one 2 MiB handle after it and takes the block's address,
/// lending nothing.
#[test]
fn after_a_refused_lend_the_next_growth_still_extends_the_end_block() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            // Nothing released by a free (and no thread cache: the threshold is not
            // u64::MAX); trim releases.
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    // Three 2 MiB growths, one 2 MiB handle each (a growth maps the need, or an
    // eighth of what is mapped rounded up to the granularity when that is more: here
    // never more than 2 MiB): handles A, B, C in address order, each wholly one live
    // block.
    let a = pool.allocate_raw(G).unwrap();
    let b = pool.allocate_raw(G).unwrap();
    let c = pool.allocate_raw(G).unwrap();
    assert_eq!((b - a, c - b), (G, G), "mapped back to back");
    // A is free and alone in its free block (B live after it): lendable.
    pool.free_raw(a).unwrap();
    // 4 MiB fits no free block: the growth lends A to the end (2 MiB) and claims a
    // new 2 MiB handle after it; mapping A again is refused, so the growth fails
    // and A goes back to its place.
    sim.inject_failure(DriverCall::Map, 1, FAIL);
    match pool.allocate_raw(4 * MIB) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Map),
        other => panic!("{other:?}"),
    }
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.segment_handles_lent), (3, 0));
    assert_eq!(s.physical_bytes, 6 * MIB);
    // Trim releases A (wholly free); B and C stay.
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (2, 4 * MIB));
    // C's block is the segment's end block; freed, it is a free 2 MiB block there.
    pool.free_raw(c).unwrap();
    let created = sim.call_count(DriverCall::Create);
    let d = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!(d, c, "the growth extends the free block at the end");
    assert_eq!(sim.call_count(DriverCall::Create), created + 1);
    assert_eq!(
        (
            s.segment_handles,
            s.segment_handles_lent,
            s.segment_lent_bytes
        ),
        (3, 0, 0),
        "nothing lent: the end block is extended, not moved"
    );
    assert_eq!(s.physical_bytes, 6 * MIB, "B, C and one new 2 MiB handle");
    pool.free_raw(b).unwrap();
    pool.free_raw(d).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// `Pool::trim` forgets the streams whose memory is all gone ("Streams whose memory is
/// all gone are done with, until used again (a stream may be destroyed after a
/// trim)"), and only "one of the pool's streams (used since the last trim or finish,
/// or holding memory in the pool)" is asked whether it is being captured: a stream
/// the pool is done with is not asked, at a release point nor at a scope's begin. So
/// a capture begun on such a stream before a scope, whose first allocation in the
/// pool comes inside the scope, is first seen in that scope, and its memory is
/// released when the scope finishes (`docs/ARCHITECTURE.md`: "Capture-held memory
/// is released when the retention scope open when the capture was first seen
/// closes").
#[test]
fn a_stream_forgotten_at_a_trim_is_not_asked_about_captures() {
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let s = common::stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    // Done with `s`: neither a trim nor a scope's begin asks about it.
    let asked = sim.stream_call_count(SimStreamCall::StreamGetCaptureInfo);
    pool.trim().unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamGetCaptureInfo),
        asked,
        "a trim asks no forgotten stream"
    );
    assert_eq!(
        sim.stream_begin_capture(s.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    pool.retention_begin().unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamGetCaptureInfo),
        asked,
        "a scope's begin asks no forgotten stream"
    );
    // The capture's first allocation and free in the pool, inside the scope.
    let q = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(q, s).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.captures_seen, snap.capture_held_bytes), (1, G));
    assert!(sim.stream_end_capture(s.0).is_success());
    pool.retention_finish().unwrap();
    let snap = check(&pool);
    assert_eq!(
        (snap.capture_held_bytes, snap.physical_bytes),
        (0, 0),
        "first seen in the scope: released at its finish"
    );
    common::no_faults(&sim);
}

/// The event calls (`cuEventRecord`, `cuEventQuery`) the pool has made so far.
fn event_calls(sim: &SimDriver) -> u64 {
    sim.stream_call_count(SimStreamCall::EventRecord)
        + sim.stream_call_count(SimStreamCall::EventQuery)
}

/// Segment mode, a stream's growth (`Pool::release_other_homes`): before it, "other
/// streams' heaps' wholly free handles whose stream work is known complete (their
/// fences polled now)" are released. The growing stream's own heap is not another
/// stream's: its fences are not polled there. With S's freed block waiting on S's
/// unfinished kernel and a live block in T's heap, S's 4 MiB growth polls T (nothing
/// to record or query: T freed nothing) and records no fence on S.
#[test]
fn a_streams_growth_polls_only_the_other_streams_heaps() {
    let (pool, sim) = common::segment_pool(1 << 30, 0);
    let (s, t) = (common::stream(&sim), common::stream(&sim));
    // T's heap holds a handle (wholly live).
    let on_t = pool.allocate_async_raw(G, t).unwrap();
    // S's block, used by a kernel still running, freed on S: back in S's heap at
    // once (its own stream), not releasable before a fence on S completes.
    let on_s = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(sim.launch(s.0, on_s, G), CuResult::SUCCESS);
    pool.free_async_raw(on_s, s).unwrap();
    let before = event_calls(&sim);
    let snap = check(&pool);
    assert_eq!((snap.events_outstanding, snap.physical_bytes), (0, 2 * G));
    // 4 MiB fits no free block of S's heap: S's heap grows.
    let big = pool.allocate_async_raw(4 * MIB, s).unwrap();
    let snap = check(&pool);
    assert_eq!(event_calls(&sim), before, "no fence recorded or queried");
    assert_eq!(snap.events_outstanding, 0);
    sim.stream_complete(s.0);
    pool.free_async_raw(big, s).unwrap();
    pool.free_async_raw(on_t, t).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    common::no_faults(&sim);
}

/// Segment mode, a growth with no other stream's heap holding memory
/// (`State::other_homes_hold_memory`, "what a miss asks before polling fences"):
/// nothing of another stream's heap can be released for it, so it polls no fence.
/// S's block, freed on S after `record_stream` on T (T's kernel still running), waits
/// on T's fence (recorded at the free); S's 4 MiB growth then records and queries
/// no event, and the block stays waiting.
#[test]
fn a_growth_with_no_other_streams_heap_polls_no_fence() {
    let (pool, sim) = common::segment_pool(1 << 30, 0);
    let (s, t) = (common::stream(&sim), common::stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.record_stream(p, t).unwrap();
    assert_eq!(sim.launch(t.0, p, G), CuResult::SUCCESS);
    pool.free_async_raw(p, s).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.event_wait_bytes, snap.events_outstanding), (G, 1));
    let before = event_calls(&sim);
    let q = pool.allocate_async_raw(4 * MIB, s).unwrap();
    let snap = check(&pool);
    assert_eq!(event_calls(&sim), before, "no fence recorded or queried");
    assert_eq!((snap.event_wait_bytes, snap.events_outstanding), (G, 1));
    assert_eq!(
        snap.physical_bytes,
        G + 4 * MIB,
        "p's handle and the growth's"
    );
    sim.stream_complete(t.0);
    pool.free_async_raw(q, s).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    common::no_faults(&sim);
}

use common::hooked;

/// A pool of `config` on a [`hooked::Hooked`] default simulated driver, shared (the
/// hooks act on it from another thread).
fn hooked_pool(config: PoolConfig) -> (Arc<Pool>, Arc<hooked::Hooked>, Arc<SimDriver>) {
    let sim = Arc::new(SimDriver::new(SimConfig::default()));
    let driver = hooked::Hooked::new(sim.clone());
    let pool = Pool::with_driver(config, driver.clone()).expect("a pool on the hooked driver");
    (Arc::new(pool), driver, sim)
}

/// `Pool::retention_begin` is the scope barrier (`docs/ARCHITECTURE.md`): "when
/// begin returns, no release that began before it ... is still running, because
/// begin waits for the batches already collected (a count of running batches under
/// the lock, and a condition variable)". A begin made on another thread while a trim
/// is inside its device synchronize waits (it has opened the scope: `scope_open`);
/// the trim's end lets it through at once, not some later release.
#[test]
fn a_scope_begun_during_a_trim_opens_when_the_trim_ends() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};
    let (pool, driver, sim) = hooked_pool(PoolConfig {
        // The free caches its memory, for the trim to release.
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::default()
    });
    let p = pool.allocate_raw(G).unwrap();
    pool.free_raw(p).unwrap();
    assert_eq!(pool.snapshot().idle_bytes, G);
    let (tx, rx) = mpsc::channel();
    // Set by the begin's thread when the begin returns.
    let returned = Arc::new(AtomicBool::new(false));
    // Whether it had returned while the trim was still in its synchronize.
    let early = Arc::new(AtomicBool::new(false));
    let weak = Arc::downgrade(&pool);
    let (ret, ret_seen, seen) = (returned.clone(), returned.clone(), early.clone());
    driver.arm(DriverCall::Synchronize, None, move || {
        let pool = weak.upgrade().expect("the pool");
        let begin = pool.clone();
        std::thread::spawn(move || {
            let r = begin.retention_begin();
            ret.store(true, Ordering::SeqCst);
            let _ = tx.send(r);
        });
        // The begin sets `scope_open` and waits under one hold of the lock: once a
        // snapshot (which takes the lock) shows the scope open, it is waiting.
        let start = Instant::now();
        while !pool.snapshot().scope_open {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the begin never ran"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        seen.store(ret_seen.load(Ordering::SeqCst), Ordering::SeqCst);
    });
    pool.trim().unwrap();
    assert!(
        !early.load(Ordering::SeqCst),
        "the begin returned during the trim"
    );
    let begun = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the begin returns once the trim is done");
    assert!(begun.is_ok(), "{begun:?}");
    assert!(returned.load(Ordering::SeqCst));
    let s = pool.snapshot();
    assert!(s.scope_open);
    assert_eq!(
        (s.physical_bytes, s.idle_bytes),
        (0, 0),
        "the trim released it"
    );
    pool.retention_finish().unwrap();
    assert_eq!(sim.state().physical_bytes, 0);
}

/// [`hooked_pool`] recording into `name` in this process's temporary directory:
/// (the recording's path, the pool, the hooked driver, the simulator).
fn recording_hooked_pool(
    name: &str,
) -> (
    std::path::PathBuf,
    Arc<Pool>,
    Arc<hooked::Hooked>,
    Arc<SimDriver>,
) {
    let dir = std::env::temp_dir().join(format!("flare-mutants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let (pool, driver, sim) = hooked_pool(PoolConfig {
        record_path: Some(path.clone()),
        ..PoolConfig::default()
    });
    (path, pool, driver, sim)
}

/// Recording (`docs/trace-format.md`): "`done STREAM MARK`: the pool saw STREAM's
/// work complete through its MARK-th mark ... a stream's `done` marks increase". Two
/// trims that wait on the same fence (the second runs while the first waits on it,
/// outside the lock) learn the same completion; it is written once, and the recorded
/// trace parses.
#[test]
fn a_completion_two_release_points_learn_is_recorded_once() {
    let (path, pool, driver, sim) = recording_hooked_pool("done-once.trace");
    let s = common::stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    // Idle on S, no fence yet (a free's poll fences only memory idle at the previous
    // poll).
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(pool.snapshot().events_outstanding, 0);
    let weak = Arc::downgrade(&pool);
    driver.arm(DriverCall::EventSynchronize, None, move || {
        let other = weak.upgrade().expect("the pool");
        std::thread::spawn(move || other.trim())
            .join()
            .unwrap()
            .expect("the second trim");
    });
    pool.trim().unwrap();
    let snap = pool.snapshot();
    assert_eq!((snap.physical_bytes, snap.events_outstanding), (0, 0));
    assert_eq!(pool.record_error(), None);
    drop(pool);
    let t = flare_package::trace::parse(&path).expect("the recorded trace parses");
    let done: Vec<_> = t
        .events()
        .iter()
        .filter(|e| matches!(e, flare_package::trace::Event::Done { .. }))
        .collect();
    assert_eq!(done.len(), 1, "{done:?}");
    let _ = std::fs::remove_file(&path);
}

/// A release point whose event wait failed (`Pool::trim`, `docs/ARCHITECTURE.md`
/// "Release points"): "What a failed stream or event call left unconfirmed goes to
/// *held* there ... memory freed after the release point recorded its fences is left
/// for a later one". While a trim waits on T's fence (outside the lock), another
/// thread frees X after `record_stream` on U (U's kernel running) and Y after
/// `record_stream` on T (T's kernel running, after the fence); then the wait fails.
/// Y waits on T, whose order is unknown now: held, released after the trim's device
/// synchronize. X waits on U only, which nothing failed on: left waiting for a later
/// release point. The failed wait guarded memory that was not kept: the trim
/// succeeds.
#[test]
fn a_failed_fence_wait_holds_only_the_memory_waiting_on_its_stream() {
    let (pool, driver, sim) = hooked_pool(PoolConfig::default());
    let (s, t, u) = (
        common::stream(&sim),
        common::stream(&sim),
        common::stream(&sim),
    );
    let x = pool.allocate_async_raw(G, s).unwrap();
    let y = pool.allocate_async_raw(2 * G, s).unwrap();
    // Idle on T, for the trim to fence and wait on.
    let w = pool.allocate_async_raw(3 * G, t).unwrap();
    pool.free_async_raw(w, t).unwrap();
    let weak = Arc::downgrade(&pool);
    let hook_sim = sim.clone();
    driver.arm(DriverCall::EventSynchronize, Some(FAIL), move || {
        let other = weak.upgrade().expect("the pool");
        std::thread::spawn(move || {
            assert_eq!(hook_sim.launch(u.0, x, G), CuResult::SUCCESS);
            other.record_stream(x, u).unwrap();
            other.free_async_raw(x, s).unwrap();
            assert_eq!(hook_sim.launch(t.0, y, 2 * G), CuResult::SUCCESS);
            other.record_stream(y, t).unwrap();
            other.free_async_raw(y, s).unwrap();
            let snap = other.snapshot();
            assert_eq!(snap.event_wait_bytes, 3 * G, "X and Y wait on their fences");
        })
        .join()
        .unwrap();
    });
    pool.trim()
        .expect("the failed wait's memory was released after a synchronize");
    let snap = pool.snapshot();
    assert_eq!(snap.stream_call_failures, 1);
    assert_eq!(snap.event_wait_bytes, G, "X still waits on U");
    assert_eq!(snap.physical_bytes, G, "Y (held) and W released; X kept");
    assert_eq!(sim.state().physical_bytes, G);
    assert_eq!(snap.live_count, 0);
    // U's work done: the next trim releases X.
    sim.stream_complete(u.0);
    pool.trim().unwrap();
    assert_eq!(pool.snapshot().physical_bytes, 0);
    assert_eq!(sim.state().physical_bytes, 0);
}

/// Releasing a lent handle (stitching's: its retired mapping first, then its own):
/// with the own unmap refused after the retired mapping is gone, the handle is no
/// longer lent (`segment_handles_lent` and `segment_lent_bytes` count handles with
/// a retired mapping still mapped) and goes back to its segment, mapped (a free
/// block, released at the next release point); with the retired mapping's unmap
/// refused, it stays lent, its own unmap not tried (the retired mapping goes
/// first). Either way the other lent handle is released, and a trim then releases
/// the one kept.
#[test]
fn a_lent_handles_refused_release_keeps_it_and_counts_it_lent_only_while_its_alias_lives() {
    // (the unmap refused, unmaps made, handles lent after the release point)
    for (nth, unmapped, lent_after) in [(2, 4, 0), (1, 3, 1)] {
        let (pool, sim) = seg_pool_in_scope();
        let w: Vec<_> = (0..4)
            .map(|_| pool.allocate_raw(2 * MIB).unwrap())
            .collect();
        let n1 = pool.allocate_raw(4 * MIB).unwrap();
        pool.free_raw(w[0]).unwrap();
        pool.free_raw(w[2]).unwrap();
        let n2 = pool.allocate_raw(4 * MIB).unwrap();
        let s = check(&pool);
        assert_eq!((s.segment_handles, s.segment_handles_lent), (5, 2));
        // n2 freed: the two lent handles at the segment's end are wholly free; the
        // scope's finish releases them, each with two unmaps (retired, own).
        pool.free_raw(n2).unwrap();
        sim.inject_failure(DriverCall::Unmap, nth, FAIL);
        let unmaps = sim.call_count(DriverCall::Unmap);
        let _ = pool.retention_finish();
        sim.clear_failures();
        assert_eq!(
            sim.call_count(DriverCall::Unmap) - unmaps,
            unmapped,
            "nth {nth}"
        );
        let s = check(&pool);
        // w1, w3 and n1's handles, and the one kept.
        assert_eq!(s.segment_handles, 4, "nth {nth}");
        assert_eq!(s.physical_bytes, 10 * MIB, "nth {nth}");
        assert_eq!(
            (s.segment_handles_lent, s.segment_lent_bytes),
            (lent_after, lent_after * 2 * MIB),
            "nth {nth}"
        );
        pool.trim().unwrap();
        let s = check(&pool);
        assert_eq!(
            (s.segment_handles, s.segment_handles_lent),
            (3, 0),
            "nth {nth}"
        );
        assert_eq!(s.physical_bytes, 8 * MIB, "nth {nth}");
        for p in [w[1], w[3], n1] {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        assert_driver_empty(&pool);
    }
}

/// `Pool::with_driver`: "[`Error::InvalidArgument`] for ... a granularity that is
/// not a power of two" (the pool rounds with masks); the simulated driver reports
/// whatever granularity it is given, so 3 MiB is refused and 4 MiB is taken.
#[test]
fn a_granularity_that_is_not_a_power_of_two_is_refused() {
    let with = |g: u64| {
        Pool::with_driver(
            PoolConfig::default(),
            Arc::new(SimDriver::new(SimConfig {
                granularity_bytes: g,
                ..SimConfig::default()
            })),
        )
    };
    match with(3 * MIB) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("not a power of two"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let pool = with(4 * MIB).unwrap();
    let a = pool.allocate_raw(1).unwrap();
    assert_eq!(a % (4 * MIB), 0);
    pool.free_raw(a).unwrap();
}

/// The names of policies and cross-stream modes (`ReusePolicy::name`,
/// `CrossStreamReuse::name`, and `FromStr`): every name parses back to its value;
/// `bestfit` and `best_fit` are taken for `best-fit`; an unknown name is refused
/// with a message that lists the names. `ReusePolicy::default()` is best-fit.
#[test]
fn policy_and_mode_names_round_trip() {
    use flare_package::CrossStreamReuse;
    assert_eq!(ReusePolicy::default(), ReusePolicy::BestFit);
    for p in ReusePolicy::ALL {
        assert_eq!(p.name().parse::<ReusePolicy>(), Ok(p));
    }
    for alias in ["bestfit", "best_fit"] {
        assert_eq!(alias.parse::<ReusePolicy>(), Ok(ReusePolicy::BestFit));
    }
    let err = "best fit".parse::<ReusePolicy>().unwrap_err();
    assert!(err.contains("\"best fit\""), "{err}");
    for p in ReusePolicy::ALL {
        assert!(err.contains(p.name()), "{err}");
    }
    for m in CrossStreamReuse::ALL {
        assert_eq!(m.name().parse::<CrossStreamReuse>(), Ok(m));
    }
    let err = "always".parse::<CrossStreamReuse>().unwrap_err();
    assert!(err.contains("\"always\""), "{err}");
    for m in CrossStreamReuse::ALL {
        assert!(err.contains(m.name()), "{err}");
    }
}

/// `PoolConfig::cuda(device)`: "a default configuration on the real CUDA driver,
/// device `device`"; `PoolConfig::simulated(sim)` the default on the simulated
/// driver with `sim`. Built only (no driver opened): the rest is the default.
#[test]
fn config_constructors_name_their_backend_and_device() {
    let c = PoolConfig::cuda(3);
    assert_eq!(c.backend, flare_package::Backend::Cuda);
    assert_eq!(c.device, 3);
    assert_eq!(
        PoolConfig {
            backend: PoolConfig::default().backend,
            device: 0,
            ..c
        },
        PoolConfig::default()
    );
    let sim = SimConfig {
        device_count: 2,
        ..SimConfig::default()
    };
    let s = PoolConfig::simulated(sim);
    assert_eq!(s.backend, flare_package::Backend::Simulated(sim));
    assert_eq!(
        PoolConfig {
            backend: PoolConfig::default().backend,
            ..s
        },
        PoolConfig::default()
    );
}

/// A segment-mode trim ends: its walk over a segment's wholly free handles moves past
/// each handle it takes out (a walk that revisited one would never end). The trim
/// runs on another thread, watched for 10 s, so a hang fails here (the trim of four
/// small free handles takes microseconds) instead of stopping the whole run.
#[test]
fn a_segment_trim_of_free_handles_ends() {
    let (pool, _sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default()
        },
    );
    let ptrs: Vec<_> = [MIB, 3 * MIB, 8 * MIB, 20 * MIB]
        .iter()
        .map(|&n| pool.allocate_raw(n).unwrap())
        .collect();
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    assert!(
        check(&pool).physical_bytes > 0,
        "the threshold keeps the frees"
    );
    let pool = Arc::new(pool);
    let (tx, rx) = std::sync::mpsc::channel();
    let trimmer = Arc::clone(&pool);
    std::thread::spawn(move || {
        let _ = tx.send(trimmer.trim());
    });
    let trimmed = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the trim did not end within 10 s");
    trimmed.unwrap();
    // Every handle was wholly free: all of them are released.
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.pending_count), (0, 0));
    assert_driver_empty(&pool);
}

/// A synchronous free in segment mode over the threshold (0: nothing kept) returns,
/// and releases its heap's handle left wholly free: the freed block goes back to its
/// heap, only a stream heap's block (kept whole) takes the release path of a block.
/// Watched from another thread for 10 s, so a hang fails here.
#[test]
fn a_segment_free_over_the_threshold_returns_and_releases_the_free_handle() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: 0,
            ..PoolConfig::default()
        },
    );
    let pool = Arc::new(pool);
    for bytes in [MIB, 3 * MIB, 8 * MIB] {
        let p = pool.allocate_raw(bytes).unwrap();
        assert!(check(&pool).physical_bytes >= bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        let freer = Arc::clone(&pool);
        std::thread::spawn(move || {
            let _ = tx.send(freer.free_raw(p));
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the free did not return within 10 s")
            .unwrap();
        let s = check(&pool);
        assert_eq!((s.physical_bytes, s.pending_count), (0, 0), "{bytes}");
        assert_eq!(sim.state().physical_bytes, 0, "{bytes}");
    }
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

/// Recording (`docs/trace-format.md`): "`oom N`: during the next `a` (or `x`)
/// line's allocation, the driver answered out-of-memory N times"; the counted
/// answers belong to one allocation call, and a call that ends without a line
/// leaves none behind (`Pool::record_call_start`: "out-of-memory answers counted by
/// an earlier call of this thread that failed are forgotten"). Here the driver
/// answers the first handle creation with out-of-memory (counted) and panics in the
/// retry's creation (a driver of the caller's, through `Pool::with_driver`): the
/// call unwinds with no `a` or `x` line written. The next allocation on the same
/// thread creates its mapping at the first try (the device is empty: no
/// out-of-memory), so its `a` line has no `oom` line before it, and the recording
/// has none at all. Carried over, `oom 1` would make a replay fail that
/// allocation's first creation.
#[test]
fn an_allocation_that_unwinds_leaves_no_oom_for_the_next_one() {
    let (path, pool, driver, _sim) = recording_hooked_pool("unwound-oom.trace");
    let again = Arc::downgrade(&driver);
    // The first creation answers out-of-memory; the retry's creation panics.
    driver.arm(
        DriverCall::Create,
        Some(CuResult::OUT_OF_MEMORY),
        move || {
            again
                .upgrade()
                .expect("the driver")
                .arm(DriverCall::Create, None, || {
                    panic!("a driver that panics in the retry (deliberate)")
                });
        },
    );
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.allocate_raw(G)));
    assert!(unwound.is_err(), "the retry's creation panicked");
    // The first answer was an out-of-memory: the pool released and retried once.
    assert_eq!(pool.snapshot().oom_retries, 1);
    let p = pool.allocate_raw(G).expect("an empty device serves 2 MiB");
    pool.free_raw(p).unwrap();
    assert_eq!(pool.record_error(), None);
    drop(pool);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(&format!("\na {p:#x} {G}\n")),
        "the allocation is recorded: {text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("oom ")),
        "no out-of-memory answer during the recorded allocation: {text}"
    );
    flare_package::trace::parse(&path).expect("the recorded trace parses");
    let _ = std::fs::remove_file(&path);
}

/// `Caches::free` (`src/pool/cache.rs`): "memory the books handed out goes to the
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

/// A release point that may synchronize the device first asks each stream the pool
/// has seen whether it is being captured (a synchronize would invalidate its
/// capture). Only `CUDA_ERROR_INVALID_HANDLE` (a destroyed stream: nothing of it can
/// be captured) is passed over; any other failed query leaves the answer unknown,
/// and the trim reports it (`Error::Driver` with the query's call and code). The next
/// trim, whose query succeeds, releases the stream's memory.
#[test]
fn a_failed_capture_query_at_trim_is_reported() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default()
        },
    );
    let s = common::stream(&sim);
    let p = pool.allocate_async_raw(4 * MIB, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(check(&pool).physical_bytes, 4 * MIB);
    sim.inject_stream_failure(SimStreamCall::StreamGetCaptureInfo, 1, FAIL);
    let err = pool.trim().unwrap_err();
    assert_eq!(
        err.driver_error(),
        Some(DriverError::new(DriverCall::StreamGetCaptureInfo, FAIL))
    );
    check(&pool);
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.pending_count), (0, 0));
    assert_driver_empty(&pool);
}
