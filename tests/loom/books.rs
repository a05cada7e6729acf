//! Loom models of the pool's concurrency: every interleaving (up to a preemption
//! bound) of a few threads freeing, allocating, finishing and trimming, on the
//! simulated driver, whose lock is loom's as well.
//!
//! Run (release: loom is slow in debug):
//!
//! ```text
//! RUSTFLAGS="--cfg flare_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom -- --nocapture --test-threads=1
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS=n` overrides each model's preemption bound (4 by default, about
//! four minutes for all twenty-five on 2 cores, the `seg_*` ones about 30 s of it and
//! the `tc_*` ones about a minute; 5 takes about a minute per model). Every model prints how many executions loom explored
//! and how long it took; a model with several possible outcomes also prints how many
//! executions reached each, and fails if one was never reached.
//!
//! The `seg_*` models (segment mode, issue 12) are in `segments`, the `tc_*` models
//! (the thread caches, issue 13) in `thread_caches`; this module has the models of
//! the books, with the thread caches off (`books_config`), and the runner and checks
//! they all share.
//!
//! What every model checks: a snapshot taken concurrently with the other threads
//! satisfies `Snapshot::check_invariants`; after the threads join, the books hold
//! exactly what the interleaving must leave (no mapping lost, duplicated or released
//! twice: the simulated driver refuses a second release, which the snapshot would
//! count as a failure); and after the pool is dropped, the simulated driver holds
//! nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use flare_package::driver::sim::SimState;
use flare_package::{
    CuResult, DevicePtr, DriverCall, Error, Pool, PoolConfig, SimDriver, Snapshot,
};
use loom::sync::Arc;
use loom::thread;

pub(crate) const MIB: u64 = 1 << 20;

pub(crate) const KIB: u64 = 1 << 10;

/// Runs `f` under loom with preemption bound `bound` (`None`: exhaustive; unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise), counting executions; prints the count and
/// the time.
pub(crate) fn model<F>(name: &str, bound: Option<usize>, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    static EXECUTIONS: [AtomicUsize; 32] = [const { AtomicUsize::new(0) }; 32];
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let counter: &'static AtomicUsize = &EXECUTIONS[NEXT.fetch_add(1, Ordering::Relaxed) % 32];
    counter.store(0, Ordering::Relaxed);
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        builder.preemption_bound = bound;
    }
    let bound = builder.preemption_bound;
    let start = Instant::now();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    println!(
        "loom model {name}: {} executions, preemption bound {bound:?}, {:.1} s",
        counter.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );
}

/// The configuration of the models of the books (all but the `tc_*` ones): the
/// defaults with the thread caches off. With them on (the default), a free inside a
/// scope stays in its thread's cache, where another thread does not reuse it until
/// it is drained, which is not what these models are about; and the caches' atomics
/// multiply the interleavings (`failed_releases_retried_concurrently`, where the
/// caches never hold anything: 412 466 executions at preemption bound 3 with them,
/// 26 523 without). The `tc_*` models cover the caches.
pub(crate) fn books_config() -> PoolConfig {
    PoolConfig {
        thread_cache_entries: 0,
        ..PoolConfig::default()
    }
}

fn new_pool() -> (Arc<Pool>, std::sync::Arc<SimDriver>) {
    let pool = Pool::new(books_config()).unwrap();
    let sim = pool.sim_driver().unwrap().clone();
    (Arc::new(pool), sim)
}

#[track_caller]
pub(crate) fn invariants(s: &Snapshot) {
    if let Err(e) = s.check_invariants() {
        panic!("snapshot invariant broken: {e}\n{s:#?}");
    }
}

/// No release step failed (a double release would be refused by the driver and
/// counted), and every mapping created was released or is still held.
#[track_caller]
pub(crate) fn no_failures(s: &Snapshot) {
    assert_eq!(s.driver_failures(), 0, "a driver call failed\n{s:#?}");
    assert_eq!(s.pending_count, 0, "{s:#?}");
}

/// Drops the last reference to the pool and checks the simulated driver is empty.
#[track_caller]
pub(crate) fn drop_and_check_empty(pool: Arc<Pool>, sim: std::sync::Arc<SimDriver>) {
    let pool = Arc::try_unwrap(pool).unwrap_or_else(|_| panic!("pool still shared"));
    drop(pool);
    assert_eq!(
        sim.state(),
        SimState::default(),
        "driver still holds memory"
    );
    assert!(sim.faults().is_empty(), "driver faults: {:?}", sim.faults());
}

/// (a) Two threads free inside a scope while a third finishes it. Whatever the
/// order, each mapping is released exactly once: by the finish if it was retained
/// before, by its own free (outside the scope, threshold 0) if after.
#[test]
fn frees_race_finish() {
    model("frees_race_finish", Some(4), || {
        let (pool, sim) = new_pool();
        pool.retention_begin().unwrap();
        let a = pool.allocate_raw(2 * MIB).unwrap();
        let b = pool.allocate_raw(4 * MIB).unwrap();
        let free = |ptr: DevicePtr| {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(ptr).unwrap())
        };
        let ta = free(a);
        let tb = free(b);
        let tf = {
            let pool = pool.clone();
            thread::spawn(move || pool.retention_finish().unwrap())
        };
        invariants(&pool.snapshot());
        ta.join().unwrap();
        tb.join().unwrap();
        tf.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert!(!s.scope_open);
        assert_eq!((s.allocations, s.frees, s.live_count), (2, 2, 0));
        assert_eq!(
            (s.idle_count, s.physical_bytes, s.reserved_bytes),
            (0, 0, 0)
        );
        assert_eq!((s.mappings_created, s.mappings_released), (2, 2));
        assert_eq!(s.scopes_finished, 1);
        assert_eq!(sim.state(), SimState::default());
        drop_and_check_empty(pool, sim);
    });
}

/// (b) Inside a scope, an allocation that reuses an idle mapping races a free that
/// retains another of the same size. The allocation is served by one of the two
/// mappings (never a new one, never a live one), and both end up idle.
#[test]
fn reuse_races_retaining_free() {
    model("reuse_races_retaining_free", None, || {
        let (pool, sim) = new_pool();
        pool.retention_begin().unwrap();
        let x = pool.allocate_raw(2 * MIB).unwrap();
        let y = pool.allocate_raw(2 * MIB).unwrap();
        pool.free_raw(y).unwrap();
        let t1 = {
            let pool = pool.clone();
            thread::spawn(move || {
                let p = pool.allocate_raw(MIB).unwrap();
                invariants(&pool.snapshot());
                pool.free_raw(p).unwrap();
                p
            })
        };
        let t2 = {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(x).unwrap())
        };
        invariants(&pool.snapshot());
        let p = t1.join().unwrap();
        t2.join().unwrap();
        assert!(p == x || p == y, "allocation {p:#x} is neither mapping");
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.allocations, s.frees, s.live_count), (3, 3, 0));
        assert_eq!((s.mappings_created, s.reuse_hits), (2, 1));
        assert_eq!((s.idle_count, s.idle_bytes), (2, 4 * MIB));
        assert_eq!(s.physical_bytes, 4 * MIB);
        // Both mappings idle and distinct: two allocations now get both.
        let a = pool.allocate_raw(2 * MIB).unwrap();
        let b = pool.allocate_raw(2 * MIB).unwrap();
        assert_ne!(a, b);
        assert!([x, y].contains(&a) && [x, y].contains(&b));
        pool.free_raw(a).unwrap();
        pool.free_raw(b).unwrap();
        pool.retention_finish().unwrap();
        let s = pool.snapshot();
        assert_eq!((s.physical_bytes, s.mappings_released), (0, 2));
        drop_and_check_empty(pool, sim);
    });
}

/// (c) An allocation miss creating a mapping outside the lock races a trim and a
/// finish. The new mapping is booked live whatever the order; the retained idle
/// mapping is released exactly once (by the finish, or by a trim after it); a
/// trim inside the scope is refused.
#[test]
fn miss_races_trim_and_finish() {
    model("miss_races_trim_and_finish", Some(4), || {
        let (pool, sim) = new_pool();
        pool.retention_begin().unwrap();
        let a = pool.allocate_raw(2 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        let t1 = {
            let pool = pool.clone();
            // 6 MiB: best-fit (up to 100 % waste) cannot use the 2 MiB idle one.
            thread::spawn(move || pool.allocate_raw(6 * MIB).unwrap())
        };
        let t2 = {
            let pool = pool.clone();
            thread::spawn(move || match pool.trim() {
                Ok(()) | Err(Error::ScopeState(_)) => {}
                Err(e) => panic!("trim: {e}"),
            })
        };
        let t3 = {
            let pool = pool.clone();
            thread::spawn(move || pool.retention_finish().unwrap())
        };
        invariants(&pool.snapshot());
        let p = t1.join().unwrap();
        t2.join().unwrap();
        t3.join().unwrap();
        assert_ne!(p, 0);
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.live_count, s.live_mapped_bytes), (1, 6 * MIB));
        assert_eq!((s.idle_count, s.mappings_created, s.reuse_hits), (0, 2, 0));
        assert_eq!((s.mappings_released, s.physical_bytes), (1, 6 * MIB));
        let d = sim.state();
        assert_eq!((d.handles, d.mappings, d.physical_bytes), (1, 1, 6 * MIB));
        pool.free_raw(p).unwrap();
        let s = pool.snapshot();
        assert_eq!((s.physical_bytes, s.mappings_released), (0, 2));
        drop_and_check_empty(pool, sim);
    });
}

/// Outside a scope with a release threshold: two frees that both push the idle
/// bytes over it release concurrently (each its own mapping, outside the lock)
/// while a third thread trims. Every mapping is released exactly once.
#[test]
fn releasing_frees_race_trim() {
    model("releasing_frees_race_trim", Some(4), || {
        let config = PoolConfig {
            release_threshold_bytes: 2 * MIB,
            ..books_config()
        };
        let pool = Pool::new(config).unwrap();
        let sim = pool.sim_driver().unwrap().clone();
        let pool = Arc::new(pool);
        let a = pool.allocate_raw(2 * MIB).unwrap();
        let b = pool.allocate_raw(2 * MIB).unwrap();
        let free = |ptr: DevicePtr| {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(ptr).unwrap())
        };
        let ta = free(a);
        let tb = free(b);
        let tt = {
            let pool = pool.clone();
            thread::spawn(move || pool.trim().unwrap())
        };
        invariants(&pool.snapshot());
        ta.join().unwrap();
        tb.join().unwrap();
        tt.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.live_count, s.frees), (0, 2));
        // One may stay cached (the threshold) if the trim ran before both frees.
        assert_eq!(s.mappings_released + s.idle_count, 2, "{s:#?}");
        assert_eq!(s.physical_bytes, s.idle_bytes);
        pool.trim().unwrap();
        let s = pool.snapshot();
        assert_eq!((s.physical_bytes, s.mappings_released), (0, 2));
        drop_and_check_empty(pool, sim);
    });
}

/// Failed release steps retried concurrently: two frees outside a scope each release
/// their own mapping; the first unmap and the first handle release made (by
/// whichever thread) fail, leaving one mapping idle-for-retry or pending; a third
/// thread trims meanwhile. Each leftover is retried by exactly one release point,
/// and a final trim leaves nothing.
#[test]
fn failed_releases_retried_concurrently() {
    model("failed_releases_retried_concurrently", Some(4), || {
        let (pool, sim) = new_pool();
        let a = pool.allocate_raw(2 * MIB).unwrap();
        let b = pool.allocate_raw(4 * MIB).unwrap();
        sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
        sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
        let free = |ptr: DevicePtr| {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(ptr).unwrap())
        };
        let ta = free(a);
        let tb = free(b);
        let tt = {
            let pool = pool.clone();
            thread::spawn(move || {
                // Fails when it makes the call an injection targets; fine.
                let _ = pool.trim();
                invariants(&pool.snapshot());
            })
        };
        invariants(&pool.snapshot());
        ta.join().unwrap();
        tb.join().unwrap();
        tt.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        assert_eq!((s.live_count, s.frees), (0, 2));
        assert_eq!(s.unmap_failures, 1, "{s:#?}");
        // Retry until the injections are spent (at most two more release points).
        for _ in 0..3 {
            let _ = pool.trim();
        }
        let s = pool.snapshot();
        invariants(&s);
        assert_eq!(sim.pending_failures(), 0);
        assert_eq!((s.unmap_failures, s.release_failures), (1, 1), "{s:#?}");
        assert_eq!((s.physical_bytes, s.reserved_bytes), (0, 0), "{s:#?}");
        assert_eq!((s.idle_count, s.pending_count), (0, 0), "{s:#?}");
        assert_eq!((s.mappings_created, s.mappings_released), (2, 2));
        assert_eq!(sim.state(), SimState::default());
        drop_and_check_empty(pool, sim);
    });
}

/// The scope is a barrier (issue 9): a free outside a scope (threshold 0, so it
/// releases: synchronize, unmap, ...) races a `retention_begin` whose thread then
/// begins a capture. Whatever the interleaving, the release's synchronize never runs
/// while the capture is open (it would invalidate it): either the release ran first
/// (begin waited for it), or the free came after begin and was retained.
#[test]
fn begin_races_a_releasing_free() {
    model("begin_races_a_releasing_free", Some(4), || {
        let (pool, sim) = new_pool();
        let a = pool.allocate_raw(2 * MIB).unwrap();
        let tf = {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(a).unwrap())
        };
        let tb = {
            let pool = pool.clone();
            let sim = sim.clone();
            thread::spawn(move || {
                pool.retention_begin().unwrap();
                assert_eq!(sim.begin_capture(), CuResult::SUCCESS);
                let valid = sim.end_capture();
                assert_eq!(valid, CuResult::SUCCESS, "a release ran inside the scope");
            })
        };
        tf.join().unwrap();
        tb.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert!(s.scope_open);
        // Released before the scope, or retained in it: exactly one of the two.
        assert_eq!(s.mappings_released + s.idle_count, 1, "{s:#?}");
        pool.retention_finish().unwrap();
        drop_and_check_empty(pool, sim);
    });
}

/// The scope is a barrier against `finish` too: one thread finishes a scope that
/// retains an idle mapping while another begins the next scope and captures. A
/// begin that finds the old scope still open fails (scopes do not nest); one that
/// succeeds returns only after the finish's release is done, so the capture stays
/// valid.
#[test]
fn begin_races_finish() {
    model("begin_races_finish", Some(4), || {
        let (pool, sim) = new_pool();
        pool.retention_begin().unwrap();
        let a = pool.allocate_raw(2 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        let tf = {
            let pool = pool.clone();
            thread::spawn(move || pool.retention_finish().unwrap())
        };
        let tb = {
            let pool = pool.clone();
            let sim = sim.clone();
            thread::spawn(move || match pool.retention_begin() {
                Ok(()) => {
                    let s = pool.snapshot();
                    assert_eq!(s.mappings_released, 1, "begin returned before the release");
                    assert_eq!(sim.begin_capture(), CuResult::SUCCESS);
                    assert_eq!(sim.end_capture(), CuResult::SUCCESS);
                    pool.retention_finish().unwrap();
                }
                Err(Error::ScopeState(_)) => {}
                Err(e) => panic!("begin failed: {e}"),
            })
        };
        tf.join().unwrap();
        tb.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert!(!s.scope_open);
        assert_eq!((s.mappings_created, s.mappings_released), (1, 1));
        drop_and_check_empty(pool, sim);
    });
}

/// (h) Stream order: a stream-ordered free (threshold 0, so it polls the fence of its
/// stream and releases what completed) races a trim (which records fences, waits on
/// them and releases) while the device completes the stream's kernel and another
/// free follows. In every interleaving no memory is unmapped while the kernel may
/// still touch it (the simulated driver would record a fault), nothing is released
/// twice, the books balance, and a final trim leaves nothing.
#[test]
fn stream_free_races_polling_release() {
    model("stream_free_races_polling_release", Some(4), || {
        let (pool, sim) = new_pool();
        let s = flare_package::Stream(sim.stream_create().unwrap());
        let p = pool.allocate_async_raw(2 * MIB, s).unwrap();
        let q = pool.allocate_async_raw(4 * MIB, s).unwrap();
        assert_eq!(sim.launch(s.0, p, 2 * MIB), CuResult::SUCCESS);
        let t1 = {
            let pool = pool.clone();
            thread::spawn(move || pool.free_async_raw(p, s).unwrap())
        };
        let t2 = {
            let pool = pool.clone();
            thread::spawn(move || pool.trim().unwrap())
        };
        let t3 = {
            let (pool, sim) = (pool.clone(), sim.clone());
            thread::spawn(move || {
                assert_eq!(sim.stream_complete(s.0), CuResult::SUCCESS);
                pool.free_async_raw(q, s).unwrap();
            })
        };
        invariants(&pool.snapshot());
        t1.join().unwrap();
        t2.join().unwrap();
        t3.join().unwrap();
        let s1 = pool.snapshot();
        invariants(&s1);
        no_failures(&s1);
        assert_eq!((s1.live_count, s1.frees), (0, 2));
        pool.trim().unwrap();
        let s2 = pool.snapshot();
        invariants(&s2);
        assert_eq!(
            (
                s2.physical_bytes,
                s2.mappings_released,
                s2.events_outstanding
            ),
            (0, 2, 0),
            "{s2:#?}"
        );
        assert_eq!(sim.call_count(DriverCall::Synchronize), 0);
        assert!(sim.faults().is_empty(), "driver faults: {:?}", sim.faults());
        drop_and_check_empty(pool, sim);
    });
}
