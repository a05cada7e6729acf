//! Loom models of the thread caches (issue 13), on by default; the models of the
//! books run with them off (`books_config`). Loom 0.7.3 misses one kind of
//! race: an atomic load of one thread followed, in the first execution, by a load
//! and a read-modify-write of the same atomic by another (tokio-rs/loom#392); see
//! `tc_remote_free_races_owner_drain` for the one outcome that hides.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::books::{drop_and_check_empty, invariants, model, no_failures, MIB};
use crate::segments::all_seen;
use flare_package::driver::sim::SimState;
use flare_package::{CuResult, DriverCall, Pool, PoolConfig, SimDriver, Snapshot};
use loom::sync::Arc;
use loom::thread;

// Thread caches (issue 13): a thread's free inside a scope (or with no release
// threshold) goes to its own cache, under the cache's mutex, and a free of memory
// another thread's cache handed out goes to that cache's lock-free remote list.
// Every release point (finish, trim, out-of-memory, destroy) first closes or
// settles the caches: it drains every cache into the books, so nothing cached
// escapes it, and nothing is released twice (the simulated driver refuses a second
// release, which the snapshot would count as a failure). Loom runs at most four
// caches per pool (`MAX_CACHES` under `cfg(flare_loom)`); these models use three at
// most.

/// A pool with the default thread caches (32 entries, 64 MiB per thread), release
/// threshold `threshold` bytes.
fn tc_pool(threshold: u64) -> (Arc<Pool>, std::sync::Arc<SimDriver>) {
    let pool = Pool::new(PoolConfig {
        release_threshold_bytes: threshold,
        ..PoolConfig::default()
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap().clone();
    (Arc::new(pool), sim)
}

/// Every mapping created was released exactly once (one unmap, one handle release,
/// one reservation free each) and nothing is left: no idle memory in the books or
/// any cache, no physical bytes, nothing held by the driver.
#[track_caller]
fn released_once(s: &Snapshot, sim: &SimDriver) {
    invariants(s);
    no_failures(s);
    assert_eq!(s.mappings_released, s.mappings_created, "{s:#?}");
    assert_eq!(
        (s.physical_bytes, s.idle_count, s.live_count),
        (0, 0, 0),
        "{s:#?}"
    );
    assert_eq!(
        (s.thread_cache_count, s.thread_cache_bytes),
        (0, 0),
        "{s:#?}"
    );
    for call in [
        DriverCall::Unmap,
        DriverCall::Release,
        DriverCall::FreeReservation,
    ] {
        assert_eq!(sim.call_count(call), s.mappings_created, "{call:?}");
    }
    assert_eq!(sim.state(), SimState::default());
}

/// A thread that allocates and frees 2 MiB twice.
fn two_pairs(pool: &Arc<Pool>) -> thread::JoinHandle<()> {
    let pool = pool.clone();
    thread::spawn(move || {
        for _ in 0..2 {
            let p = pool.allocate_raw(2 * MIB).unwrap();
            pool.free_raw(p).unwrap();
        }
    })
}

/// (tc-a) A cache drain racing `finish`: inside a scope (threshold 0), one thread
/// allocates and frees 2 MiB twice (the first free goes to its cache, the second
/// allocation pops it) while another finishes the scope. The finish closes the
/// caches and then drains them, so whatever the order nothing idle is left in any
/// cache or in the books afterwards, the physical bytes are exactly the live ones
/// (none), and each mapping was released once: by the finish if it was cached
/// before, by its own free after. Three outcomes: the second allocation hit the
/// cache (before the finish); it came after the close and its miss gave its cache
/// to the books first, reusing from them; or the finish released the first mapping
/// before it, and it made another.
#[test]
fn tc_cache_drain_races_finish() {
    static SEEN: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];
    model("tc_cache_drain_races_finish", Some(4), || {
        let (pool, sim) = tc_pool(0);
        pool.retention_begin().unwrap();
        let t1 = two_pairs(&pool);
        let t2 = {
            let pool = pool.clone();
            thread::spawn(move || pool.retention_finish().unwrap())
        };
        invariants(&pool.snapshot());
        t1.join().unwrap();
        t2.join().unwrap();
        let s = pool.snapshot();
        assert!(!s.scope_open);
        assert_eq!((s.allocations, s.frees, s.scopes_finished), (2, 2, 1));
        assert_eq!(s.reuse_hits + s.mappings_created, 2, "{s:#?}");
        released_once(&s, &sim);
        let outcome = match (s.thread_cache_hits, s.reuse_hits) {
            (0, 0) => 0,
            (0, 1) => 1,
            (1, 1) => 2,
            _ => panic!("{s:#?}"),
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "tc_cache_drain_races_finish",
        &SEEN,
        &[
            "released by the finish, then a new mapping",
            "reused from the books after the close",
            "a cache hit before the finish",
        ],
    );
}

/// (tc-b) A cache drain racing `trim`: no release threshold (`u64::MAX`: the caches
/// hold memory outside scopes), one thread allocates and frees 2 MiB twice while
/// another trims. Whatever the order, what is idle afterwards is in that thread's
/// cache (the trim drained and released everything before it, once), and a last trim
/// releases it.
#[test]
fn tc_cache_drain_races_trim() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    model("tc_cache_drain_races_trim", Some(4), || {
        let (pool, sim) = tc_pool(u64::MAX);
        let t1 = two_pairs(&pool);
        let t2 = {
            let pool = pool.clone();
            thread::spawn(move || pool.trim().unwrap())
        };
        invariants(&pool.snapshot());
        t1.join().unwrap();
        t2.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.allocations, s.frees, s.live_count), (2, 2, 0));
        assert_eq!(s.reuse_hits + s.mappings_created, 2, "{s:#?}");
        assert_eq!(
            (s.idle_count, s.idle_bytes),
            (s.thread_cache_count, s.thread_cache_bytes),
            "idle only in the cache\n{s:#?}"
        );
        assert!(s.thread_cache_count <= 1, "{s:#?}");
        assert_eq!(s.physical_bytes, s.idle_bytes);
        assert_eq!(s.mappings_created - s.mappings_released, s.idle_count);
        SEEN[s.thread_cache_count as usize].fetch_add(1, Ordering::Relaxed);
        pool.trim().unwrap();
        released_once(&pool.snapshot(), &sim);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "tc_cache_drain_races_trim",
        &SEEN,
        &["the trim came last", "cached after the trim"],
    );
}

/// (tc-c) A cache drain racing `retention_begin`: inside a scope (threshold 0), one
/// thread allocates and frees 2 MiB twice while another finishes the scope (closing
/// and draining the caches), begins the next one and captures. The capture stays
/// valid (no release, and so no synchronize, runs inside the new scope: a free
/// between the two scopes releases before `begin` returns, one after is cached);
/// whatever was retained or cached in the new scope is released once by its finish.
#[test]
fn tc_cache_drain_races_begin() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    model("tc_cache_drain_races_begin", Some(4), || {
        let (pool, sim) = tc_pool(0);
        pool.retention_begin().unwrap();
        let t1 = two_pairs(&pool);
        let t2 = {
            let (pool, sim) = (pool.clone(), sim.clone());
            thread::spawn(move || {
                pool.retention_finish().unwrap();
                pool.retention_begin().unwrap();
                assert_eq!(sim.begin_capture(), CuResult::SUCCESS);
                let valid = sim.end_capture();
                assert_eq!(valid, CuResult::SUCCESS, "a release ran inside the scope");
            })
        };
        t1.join().unwrap();
        t2.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert!(s.scope_open);
        assert_eq!((s.allocations, s.frees, s.live_count), (2, 2, 0));
        assert_eq!(s.reuse_hits + s.mappings_created, 2, "{s:#?}");
        // Held now: idle, retained in the new scope (in the thread's cache, or in the
        // books when its own miss drained it); the rest was released once.
        assert!(s.idle_count <= 1, "{s:#?}");
        assert_eq!(s.physical_bytes, s.idle_bytes);
        assert_eq!(s.mappings_created - s.mappings_released, s.idle_count);
        SEEN[s.idle_count as usize].fetch_add(1, Ordering::Relaxed);
        pool.retention_finish().unwrap();
        released_once(&pool.snapshot(), &sim);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "tc_cache_drain_races_begin",
        &SEEN,
        &[
            "all released by the first finish",
            "retained in the new scope",
        ],
    );
}

/// (tc-d) A remote free racing the owner's drain: inside a scope, the main thread's
/// cache holds an 8 MiB mapping `x` and has handed out `p` (2 MiB: freed into it,
/// allocated again). Another thread frees `p`: it goes to the main thread's remote
/// list (`remote_frees` 1). Meanwhile the main thread asks for 2 MiB: its cache has
/// no fit (`x` is more than 30 % larger), so it takes its remote list if `p` is
/// there already (a cache hit), else its miss drains its cache, remote list
/// included, to the books and retakes from them: `p` if the free landed before the
/// drain, else a new mapping (`p` then waits on the remote list). `p` is never
/// handed out while live; the finish releases everything once.
///
/// Loom (0.7.3) does not reorder an atomic load of one thread before a load and a
/// read-modify-write of the same atomic by another (it keeps one last access per
/// atomic, and the second thread's load replaces the first's: tokio-rs/loom#392),
/// so the remote-list check of the allocation (a load) is never explored after the
/// free's push (a load, then a compare-and-swap): the cache-hit outcome is counted
/// but not required. The drain's take of the list is a swap, which loom reorders
/// with the push both ways.
#[test]
fn tc_remote_free_races_owner_drain() {
    static SEEN: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];
    model("tc_remote_free_races_owner_drain", Some(4), || {
        let (pool, sim) = tc_pool(0);
        pool.retention_begin().unwrap();
        let x = pool.allocate_raw(8 * MIB).unwrap();
        let a = pool.allocate_raw(2 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        pool.free_raw(x).unwrap();
        let p = pool.allocate_raw(2 * MIB).unwrap();
        assert_eq!(p, a, "handed out by this thread's cache");
        let tb = {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(p).unwrap())
        };
        let q = pool.allocate_raw(2 * MIB).unwrap();
        tb.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.allocations, s.frees, s.live_count), (4, 3, 1));
        assert_eq!(s.remote_frees, 1, "{s:#?}");
        let outcome = if q == p {
            assert_eq!((s.mappings_created, s.reuse_hits), (2, 2), "{s:#?}");
            match s.thread_cache_hits {
                2 => {
                    // From the remote list: x is still cached.
                    assert_eq!((s.thread_cache_count, s.idle_count), (1, 1), "{s:#?}");
                    2
                }
                1 => {
                    // Drained: x is idle in the books.
                    assert_eq!((s.thread_cache_count, s.idle_count), (0, 1), "{s:#?}");
                    0
                }
                _ => panic!("{s:#?}"),
            }
        } else {
            assert_eq!((s.mappings_created, s.thread_cache_hits), (3, 1), "{s:#?}");
            // x in the books, p on the remote list.
            assert_eq!((s.idle_count, s.thread_cache_count), (2, 1), "{s:#?}");
            1
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        pool.free_raw(q).unwrap();
        pool.retention_finish().unwrap();
        released_once(&pool.snapshot(), &sim);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "tc_remote_free_races_owner_drain",
        &SEEN[..2],
        &[
            "drained by the miss, reused from the books",
            "a new mapping; p left on the remote list",
        ],
    );
    println!(
        "loom model tc_remote_free_races_owner_drain: taken from the remote list: {}",
        SEEN[2].load(Ordering::Relaxed)
    );
}

/// (tc-d) The owner takes its remote list while a third party finishes: `p` (handed
/// out by the main thread's cache) was freed by another thread, onto the main
/// thread's remote list; then the main thread allocates 2 MiB while a third thread
/// finishes the scope. The allocation takes the list (a cache hit) if the finish's
/// drain has not emptied it first; else it is served after the close, from the
/// books (its miss drains its cache) or by a new mapping. Whatever the order, `p` is
/// handed out at most once and released exactly once.
#[test]
fn tc_owner_takes_its_remote_list_while_finish_drains_it() {
    static SEEN: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];
    model(
        "tc_owner_takes_its_remote_list_while_finish_drains_it",
        Some(4),
        || {
            let (pool, sim) = tc_pool(0);
            pool.retention_begin().unwrap();
            let a = pool.allocate_raw(2 * MIB).unwrap();
            pool.free_raw(a).unwrap();
            let p = pool.allocate_raw(2 * MIB).unwrap();
            {
                let pool = pool.clone();
                thread::spawn(move || pool.free_raw(p).unwrap())
            }
            .join()
            .unwrap();
            assert_eq!(pool.snapshot().remote_frees, 1);
            let tf = {
                let pool = pool.clone();
                thread::spawn(move || pool.retention_finish().unwrap())
            };
            let q = pool.allocate_raw(2 * MIB).unwrap();
            tf.join().unwrap();
            let s = pool.snapshot();
            invariants(&s);
            no_failures(&s);
            assert!(!s.scope_open);
            assert_eq!((s.allocations, s.frees, s.live_count), (3, 2, 1));
            let outcome = match (s.thread_cache_hits, s.reuse_hits, s.mappings_created) {
                (2, 2, 1) => 0,
                (1, 2, 1) => 1,
                (1, 1, 2) => 2,
                _ => panic!("{s:#?}"),
            };
            if outcome < 2 {
                assert_eq!(q, p);
            } else {
                assert_ne!(q, p);
            }
            // Nothing idle survives the finish (a scope's end): p is live or released.
            assert_eq!((s.idle_count, s.thread_cache_count), (0, 0), "{s:#?}");
            assert_eq!(s.physical_bytes, s.live_mapped_bytes);
            SEEN[outcome].fetch_add(1, Ordering::Relaxed);
            pool.free_raw(q).unwrap();
            released_once(&pool.snapshot(), &sim);
            drop_and_check_empty(pool, sim);
        },
    );
    all_seen(
        "tc_owner_takes_its_remote_list_while_finish_drains_it",
        &SEEN,
        &[
            "taken from the remote list before the finish",
            "reused from the books after the close",
            "the finish released p first: a new mapping",
        ],
    );
}

/// (tc-d) A remote free racing a third party's `finish`: inside a scope the main
/// thread's cache hands out `p`; one thread frees it while another finishes the
/// scope. The free goes to the main thread's remote list if the caches were still
/// open (and the finish drains it from there), else to the books (released by the
/// free or the finish, whichever holds it idle first): released exactly once.
#[test]
fn tc_remote_free_races_finish() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    model("tc_remote_free_races_finish", Some(4), || {
        let (pool, sim) = tc_pool(0);
        pool.retention_begin().unwrap();
        let a = pool.allocate_raw(2 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        let p = pool.allocate_raw(2 * MIB).unwrap();
        assert_eq!(p, a);
        let tb = {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(p).unwrap())
        };
        let tf = {
            let pool = pool.clone();
            thread::spawn(move || pool.retention_finish().unwrap())
        };
        tb.join().unwrap();
        tf.join().unwrap();
        let s = pool.snapshot();
        assert_eq!((s.allocations, s.frees, s.mappings_created), (2, 2, 1));
        released_once(&s, &sim);
        SEEN[s.remote_frees as usize].fetch_add(1, Ordering::Relaxed);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "tc_remote_free_races_finish",
        &SEEN,
        &[
            "freed after the close",
            "a remote free, drained by the finish",
        ],
    );
}

/// (tc-e) A thread exits with a full cache (its 2 MiB mapping cached in a scope)
/// while another thread allocates 2 MiB: the other adopts the exited thread's cache
/// (what it holds goes back to the books first) or drains it on a miss, and reuses
/// the mapping; or, when it came first, makes its own. Nothing is released inside
/// the scope; the main thread's finish then releases everything once.
#[test]
fn tc_thread_exits_with_a_full_cache_then_finish() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    model(
        "tc_thread_exits_with_a_full_cache_then_finish",
        Some(4),
        || {
            let (pool, sim) = tc_pool(0);
            pool.retention_begin().unwrap();
            let pair = || {
                let pool = pool.clone();
                thread::spawn(move || {
                    let p = pool.allocate_raw(2 * MIB).unwrap();
                    pool.free_raw(p).unwrap();
                })
            };
            let t1 = pair();
            let t2 = pair();
            t1.join().unwrap();
            t2.join().unwrap();
            let s = pool.snapshot();
            invariants(&s);
            no_failures(&s);
            assert_eq!((s.allocations, s.frees, s.live_count), (2, 2, 0));
            assert_eq!(s.reuse_hits + s.mappings_created, 2, "{s:#?}");
            assert_eq!((s.mappings_released, s.thread_cache_hits), (0, 0), "{s:#?}");
            assert_eq!(s.idle_count, s.mappings_created, "all idle, none released");
            SEEN[s.reuse_hits as usize].fetch_add(1, Ordering::Relaxed);
            pool.retention_finish().unwrap();
            released_once(&pool.snapshot(), &sim);
            drop_and_check_empty(pool, sim);
        },
    );
    all_seen(
        "tc_thread_exits_with_a_full_cache_then_finish",
        &SEEN,
        &["each its own mapping", "the exited thread's mapping reused"],
    );
}

/// (tc-e) Two threads exit with full caches inside a scope, one of them also
/// leaving a live allocation its cache handed out (allocated, freed, allocated
/// again, never freed); the main thread then destroys the pool: the caches are
/// drained, the live allocation released with the rest, each mapping once.
#[test]
fn tc_threads_exit_with_full_caches_then_destroy() {
    model(
        "tc_threads_exit_with_full_caches_then_destroy",
        Some(4),
        || {
            let (pool, sim) = tc_pool(0);
            pool.retention_begin().unwrap();
            let t1 = {
                let pool = pool.clone();
                thread::spawn(move || {
                    let p = pool.allocate_raw(2 * MIB).unwrap();
                    pool.free_raw(p).unwrap();
                    // A cache hit, left live.
                    assert_eq!(pool.allocate_raw(2 * MIB).unwrap(), p);
                    let q = pool.allocate_raw(4 * MIB).unwrap();
                    pool.free_raw(q).unwrap();
                })
            };
            let t2 = {
                let pool = pool.clone();
                thread::spawn(move || {
                    let p = pool.allocate_raw(6 * MIB).unwrap();
                    pool.free_raw(p).unwrap();
                })
            };
            t1.join().unwrap();
            t2.join().unwrap();
            let s = pool.snapshot();
            invariants(&s);
            no_failures(&s);
            assert_eq!((s.allocations, s.frees, s.live_count), (4, 3, 1));
            assert_eq!(s.thread_cache_hits, 1);
            // 2, 4 and 6 MiB: no size fits another under best-fit's 30 %.
            assert_eq!((s.mappings_created, s.mappings_released), (3, 0), "{s:#?}");
            assert_eq!((s.idle_count, s.physical_bytes), (2, 12 * MIB), "{s:#?}");
            let pool = Arc::try_unwrap(pool).unwrap_or_else(|_| panic!("pool still shared"));
            pool.destroy().unwrap();
            for call in [
                DriverCall::Unmap,
                DriverCall::Release,
                DriverCall::FreeReservation,
            ] {
                assert_eq!(sim.call_count(call), 3, "{call:?}");
            }
            assert_eq!(sim.state(), SimState::default());
            assert!(sim.faults().is_empty(), "driver faults: {:?}", sim.faults());
        },
    );
}
