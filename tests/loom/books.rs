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
//! The `seg_*` models run segment mode (issue 12): blocks of one handle freed
//! concurrently, growths racing frees, trims, finishes, a failed release and each
//! other, and the stream-order release of a stream's heap. They also check the
//! books against the simulated driver object by object (`books_match_driver`).
//!
//! The `tc_*` models run the thread caches (issue 13), on by default; the others
//! model the books with them off (`books_config`). Loom 0.7.3 misses one kind of
//! race: an atomic load of one thread followed, in the first execution, by a load
//! and a read-modify-write of the same atomic by another (tokio-rs/loom#392); see
//! `tc_remote_free_races_owner_drain` for the one outcome that hides.
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
    CuResult, DevicePtr, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SimDriver, Snapshot,
};
use loom::sync::Arc;
use loom::thread;

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;

/// Runs `f` under loom with preemption bound `bound` (`None`: exhaustive; unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise), counting executions; prints the count and
/// the time.
fn model<F>(name: &str, bound: Option<usize>, f: F)
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
fn books_config() -> PoolConfig {
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
fn invariants(s: &Snapshot) {
    if let Err(e) = s.check_invariants() {
        panic!("snapshot invariant broken: {e}\n{s:#?}");
    }
}

/// No release step failed (a double release would be refused by the driver and
/// counted), and every mapping created was released or is still held.
#[track_caller]
fn no_failures(s: &Snapshot) {
    assert_eq!(s.driver_failures(), 0, "a driver call failed\n{s:#?}");
    assert_eq!(s.pending_count, 0, "{s:#?}");
}

/// Drops the last reference to the pool and checks the simulated driver is empty.
#[track_caller]
fn drop_and_check_empty(pool: Arc<Pool>, sim: std::sync::Arc<SimDriver>) {
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

// Segment mode (issue 12): the same races where blocks of one handle, growths of
// one segment and handle releases meet. Sizes above 1 MiB go to a heap's large
// segment, smaller ones to its small segment; every segment here is the synchronous
// API's. A fresh segment's first growth maps one handle of the rounded need; a later
// growth maps the need less the free block at the segment's end, rounded to the
// granularity (2 MiB), or an eighth of what the segment maps when that is more (never
// here: an eighth of at most 8 MiB rounds to one granule).

/// A segment-mode pool on the simulated driver (an H200's 140 GiB, each segment
/// reserving all of it) with release threshold `threshold` bytes.
fn seg_pool(threshold: u64) -> (Arc<Pool>, std::sync::Arc<SimDriver>) {
    let pool = Pool::new(PoolConfig {
        reuse_policy: ReusePolicy::Segments,
        release_threshold_bytes: threshold,
        ..books_config()
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap().clone();
    (Arc::new(pool), sim)
}

/// Quiet (nothing in flight, nothing pending): the books against the simulated
/// driver, object by object. Each whole mapping holds a handle, a mapping and a
/// reservation; each handle mapped in a segment a handle and a mapping, and a lent
/// one a second (retired) mapping; each segment a reservation.
#[track_caller]
fn books_match_driver(s: &Snapshot, sim: &SimDriver) {
    assert_eq!(s.pending_count, 0, "{s:#?}");
    let whole = s.live_count - s.block_live_count + s.idle_count;
    let d = sim.state();
    assert_eq!(
        (d.handles, d.mappings, d.reservations),
        (
            whole + s.segment_handles,
            whole + s.segment_handles + s.segment_handles_lent,
            whole + s.segment_count
        ),
        "driver objects vs books\n{s:#?}\n{d:#?}"
    );
    assert_eq!(
        (d.physical_bytes, d.reserved_bytes),
        (s.physical_bytes, s.reserved_bytes),
        "{d:#?}"
    );
}

/// Prints how many of a model's executions reached each of its outcomes, and fails
/// unless every one was reached (a model whose interleavings never reach an outcome
/// does not test it).
#[track_caller]
fn all_seen(model: &str, seen: &[AtomicUsize], names: &[&str]) {
    let counts: Vec<usize> = seen.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let line: Vec<String> = names
        .iter()
        .zip(&counts)
        .map(|(n, c)| format!("{n}: {c}"))
        .collect();
    println!("loom model {model}: outcomes {}", line.join(", "));
    assert!(
        counts.iter().all(|&c| c > 0),
        "{model}: an outcome was never reached"
    );
}

/// (a) Segments: two threads free the two blocks of one handle outside a scope
/// (threshold 0: a free that leaves the handle wholly free releases it). The handle
/// is released exactly once (one synchronize, unmap and release: memory freed with
/// the synchronous `free` needs a device synchronize), and only after both frees:
/// each block is still mapped, with access, right before its own free.
#[test]
fn seg_frees_of_one_handle_release_it_once() {
    model("seg_frees_of_one_handle_release_it_once", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let a = pool.allocate_raw(KIB).unwrap();
        let b = pool.allocate_raw(KIB).unwrap();
        assert_eq!(b, a + KIB, "both carved from the one 2 MiB handle");
        let free = |ptr: DevicePtr| {
            let (pool, sim) = (pool.clone(), sim.clone());
            thread::spawn(move || {
                assert_eq!(
                    sim.touch(ptr, KIB, 0),
                    CuResult::SUCCESS,
                    "the handle was released while {ptr:#x} was live"
                );
                pool.free_raw(ptr).unwrap();
            })
        };
        let ta = free(a);
        let tb = free(b);
        invariants(&pool.snapshot());
        ta.join().unwrap();
        tb.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.allocations, s.frees, s.live_count), (2, 2, 0));
        assert_eq!(
            (s.physical_bytes, s.segment_handles, s.block_free_bytes),
            (0, 0, 0),
            "{s:#?}"
        );
        assert_eq!((s.mappings_created, s.mappings_released), (1, 1));
        assert_eq!(s.segment_count, 1, "the reservation is kept");
        for (call, n) in [
            (DriverCall::Synchronize, 1),
            (DriverCall::Unmap, 1),
            (DriverCall::Release, 1),
            (DriverCall::FreeReservation, 0),
        ] {
            assert_eq!(sim.call_count(call), n, "{call:?}");
        }
        books_match_driver(&s, &sim);
        drop_and_check_empty(pool, sim);
    });
}

/// (b) Segments: a growth of the heap races a free that leaves the segment's only
/// handle wholly free (threshold 0: released). The 4 MiB handle holds `x` (3 MiB)
/// and a free 1 MiB block at the segment's end, which a 5 MiB request counts: it
/// maps 4 MiB more after it. The outcomes, by where the free falls:
/// - before the growth claims its range: the handle is released, the segment left
///   empty and reset, and the growth maps 6 MiB at the segment's start (`y == x`);
/// - after the growth is booked: `y` takes the end block and the new handle
///   (`x + 3 MiB`), and the first handle is not wholly free, so nothing is released;
/// - in between (the release in flight, or done, while the growth maps): the growth
///   lies at `x + 4 MiB`, after the released handle's hole, with 6 MiB mapped:
///   one 6 MiB handle (claimed once the end block was gone), or 4 MiB then 2 MiB
///   (the end block was released under it, so it grew again).
///
/// Whatever the order, freeing `y` leaves the segment empty with nothing in flight,
/// so it resets: the next request is carved from its start again.
#[test]
fn seg_growth_races_a_releasing_free() {
    static SEEN: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];
    model("seg_growth_races_a_releasing_free", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let x = pool.allocate_raw(3 * MIB).unwrap();
        let s = pool.snapshot();
        assert_eq!((s.physical_bytes, s.block_free_bytes), (4 * MIB, MIB));
        let tf = {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(x).unwrap())
        };
        let tg = {
            let pool = pool.clone();
            thread::spawn(move || pool.allocate_raw(5 * MIB).unwrap())
        };
        invariants(&pool.snapshot());
        tf.join().unwrap();
        let y = tg.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.live_count, s.block_live_bytes), (1, 5 * MIB));
        let got = (
            s.physical_bytes,
            s.segment_handles,
            s.mappings_created,
            s.mappings_released,
            s.block_free_bytes,
        );
        let outcome = if y == x {
            assert_eq!(got, (6 * MIB, 1, 2, 1, MIB), "{s:#?}");
            0
        } else if y == x + 3 * MIB {
            assert_eq!(got, (8 * MIB, 2, 2, 0, 3 * MIB), "{s:#?}");
            1
        } else {
            assert_eq!(y, x + 4 * MIB, "{s:#?}");
            if got == (6 * MIB, 1, 2, 1, MIB) {
                2
            } else {
                assert_eq!(got, (6 * MIB, 2, 3, 1, MIB), "{s:#?}");
                3
            }
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        assert_eq!(s.segment_count, 1);
        books_match_driver(&s, &sim);
        assert_eq!(sim.touch(y, 5 * MIB, 0), CuResult::SUCCESS);
        pool.free_raw(y).unwrap();
        let s = pool.snapshot();
        assert_eq!((s.physical_bytes, s.segment_handles), (0, 0), "{s:#?}");
        assert_eq!(s.mappings_created, s.mappings_released);
        let z = pool.allocate_raw(3 * MIB).unwrap();
        assert_eq!(
            z, x,
            "an empty segment with nothing in flight regrows at its start"
        );
        pool.free_raw(z).unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        books_match_driver(&s, &sim);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_growth_races_a_releasing_free",
        &SEEN,
        &[
            "reset",
            "no release",
            "after the hole",
            "after the hole, grown twice",
        ],
    );
}

/// (b) Segments, stitching: a growth that lends a wholly free handle to the
/// segment's end races a trim that would release that handle (threshold: keep
/// everything cached). Handles H0 (free, where `x` was) and H1 (`y`, live) hold
/// 2 MiB each; a 4 MiB request either lends H0 (mapped again after H1, its old
/// mapping kept, plus a new 2 MiB handle) and the trim finds nothing wholly free, or
/// the trim releases H0 first and the growth maps one new 4 MiB handle. Either way
/// the request lies right after H1, 6 MiB are held, and the handle is taken by
/// exactly one of the two.
#[test]
fn seg_lending_growth_races_trim() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    model("seg_lending_growth_races_trim", Some(4), || {
        let (pool, sim) = seg_pool(u64::MAX);
        let x = pool.allocate_raw(2 * MIB).unwrap();
        let y = pool.allocate_raw(2 * MIB).unwrap();
        assert_eq!(y, x + 2 * MIB);
        pool.free_raw(x).unwrap();
        let tg = {
            let pool = pool.clone();
            thread::spawn(move || pool.allocate_raw(4 * MIB).unwrap())
        };
        let tt = {
            let pool = pool.clone();
            thread::spawn(move || pool.trim().unwrap())
        };
        invariants(&pool.snapshot());
        let z = tg.join().unwrap();
        tt.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!(z, x + 4 * MIB, "after H1, the segment's end");
        assert_eq!(
            (s.physical_bytes, s.block_live_bytes, s.mappings_created),
            (6 * MIB, 6 * MIB, 3)
        );
        let lent = s.segment_handles_lent;
        SEEN[lent.min(1) as usize].fetch_add(1, Ordering::Relaxed);
        if lent == 1 {
            // H0 lent: H1, H0 again, and a new 2 MiB handle; nothing released, no
            // synchronize (the trim's batch was empty).
            assert_eq!((s.segment_handles, s.segment_lent_bytes), (3, 2 * MIB));
            assert_eq!(s.mappings_released, 0, "{s:#?}");
            assert_eq!(sim.call_count(DriverCall::Synchronize), 0);
        } else {
            assert_eq!((lent, s.segment_handles), (0, 2), "{s:#?}");
            assert_eq!(s.mappings_released, 1, "{s:#?}");
            assert_eq!(sim.call_count(DriverCall::Synchronize), 1);
        }
        books_match_driver(&s, &sim);
        assert_eq!(sim.touch(z, 4 * MIB, 0), CuResult::SUCCESS);
        pool.free_raw(y).unwrap();
        pool.free_raw(z).unwrap();
        pool.trim().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.physical_bytes, s.segment_handles), (0, 0), "{s:#?}");
        assert_eq!((s.segment_handles_lent, s.mappings_released), (0, 3));
        // Every mapping unmapped once: the lent handle's retired one too.
        assert_eq!(sim.call_count(DriverCall::Unmap), 3 + lent);
        assert_eq!(sim.call_count(DriverCall::Release), 3);
        books_match_driver(&s, &sim);
        assert_eq!(
            pool.allocate_raw(2 * MIB).unwrap(),
            x,
            "reset: regrown at its start"
        );
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_lending_growth_races_trim",
        &SEEN,
        &["trim released H0", "H0 lent"],
    );
}

/// (c) Segments: two threads free the two blocks of one handle inside a scope while
/// a third finishes it. A block freed inside is retained; one freed after the finish
/// is freed outside (threshold 0). Whatever the order, the handle is released
/// exactly once, when its last block is free outside the scope (by the finish, or
/// by the later free), never while a block is live.
#[test]
fn seg_frees_race_finish() {
    model("seg_frees_race_finish", Some(4), || {
        let (pool, sim) = seg_pool(0);
        pool.retention_begin().unwrap();
        let a = pool.allocate_raw(KIB).unwrap();
        let b = pool.allocate_raw(4 * KIB).unwrap();
        assert_eq!(b, a + KIB);
        let free = |ptr: DevicePtr, bytes: u64| {
            let (pool, sim) = (pool.clone(), sim.clone());
            thread::spawn(move || {
                assert_eq!(sim.touch(ptr, bytes, 0), CuResult::SUCCESS);
                pool.free_raw(ptr).unwrap();
            })
        };
        let ta = free(a, KIB);
        let tb = free(b, 4 * KIB);
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
            (s.physical_bytes, s.segment_handles, s.block_free_bytes),
            (0, 0, 0),
            "{s:#?}"
        );
        assert_eq!((s.mappings_created, s.mappings_released), (1, 1));
        assert_eq!(sim.call_count(DriverCall::Release), 1);
        assert_eq!(s.scopes_finished, 1);
        books_match_driver(&s, &sim);
        drop_and_check_empty(pool, sim);
    });
}

/// (c) Segments: the scope barrier. A free that leaves a handle wholly free outside
/// a scope (threshold 0: a release, with a synchronize) races a `retention_begin`
/// whose thread then captures. The capture stays valid: the release ran before
/// `begin` returned, or the block was freed inside the scope and its handle retained.
#[test]
fn seg_begin_races_a_releasing_free() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    model("seg_begin_races_a_releasing_free", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let a = pool.allocate_raw(KIB).unwrap();
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
        assert_eq!(s.mappings_released + s.segment_handles, 1, "{s:#?}");
        assert_eq!(s.physical_bytes, s.segment_handles * 2 * MIB);
        SEEN[s.segment_handles as usize].fetch_add(1, Ordering::Relaxed);
        books_match_driver(&s, &sim);
        pool.retention_finish().unwrap();
        let s = pool.snapshot();
        assert_eq!((s.physical_bytes, s.mappings_released), (0, 1));
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_begin_races_a_releasing_free",
        &SEEN,
        &["released before the scope", "retained in it"],
    );
}

/// (d) Segments: two allocations that both miss grow the same segment at once, each
/// claiming its own range under the lock and mapping it outside. Both succeed, each
/// with a new 2 MiB handle right after `x`'s, in either order; the blocks do not
/// overlap and the books match the driver. The three handles are one mapped run:
/// once all three blocks are freed (inside the scope: nothing released), a 6 MiB
/// request takes their coalesced range at `x` with no new handle, whichever growth
/// was booked first.
#[test]
fn seg_concurrent_growths_of_one_segment() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    model("seg_concurrent_growths_of_one_segment", Some(4), || {
        let (pool, sim) = seg_pool(0);
        pool.retention_begin().unwrap();
        let x = pool.allocate_raw(2 * MIB).unwrap();
        let grow = || {
            let pool = pool.clone();
            thread::spawn(move || pool.allocate_raw(2 * MIB).unwrap())
        };
        let t1 = grow();
        let t2 = grow();
        invariants(&pool.snapshot());
        let p1 = t1.join().unwrap();
        let p2 = t2.join().unwrap();
        let mut got = [p1, p2];
        got.sort_unstable();
        assert_eq!(got, [x + 2 * MIB, x + 4 * MIB], "x {x:#x}");
        SEEN[usize::from(p2 < p1)].fetch_add(1, Ordering::Relaxed);
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!(
            (s.segment_count, s.segment_handles, s.mappings_created),
            (1, 3, 3)
        );
        assert_eq!(
            (s.physical_bytes, s.block_live_bytes, s.block_free_bytes),
            (6 * MIB, 6 * MIB, 0)
        );
        assert_eq!(s.reuse_hits, 0);
        books_match_driver(&s, &sim);
        for p in [x, p1, p2] {
            assert_eq!(sim.touch(p, 2 * MIB, 0), CuResult::SUCCESS);
        }
        for p in [p1, x, p2] {
            pool.free_raw(p).unwrap();
        }
        let w = pool.allocate_raw(6 * MIB).unwrap();
        let s = pool.snapshot();
        assert_eq!(w, x, "the three free blocks coalesce\n{s:#?}");
        assert_eq!((s.mappings_created, s.physical_bytes), (3, 6 * MIB));
        assert_eq!(s.reuse_hits, 1);
        pool.free_raw(w).unwrap();
        pool.retention_finish().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.physical_bytes, s.mappings_released), (0, 3));
        books_match_driver(&s, &sim);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_concurrent_growths_of_one_segment",
        &SEEN,
        &["first thread grew first", "second thread grew first"],
    );
}

/// Segments: a handle release that fails (its unmap refused) races a growth of the
/// same segment. H1 (`y`'s, at the segment's end) is wholly free once `y` is freed
/// outside a scope (threshold 0), so it is released, but the unmap fails: it goes
/// back to its segment, free, between `x`'s handle and anything grown after it.
/// Meanwhile a 2 MiB request either takes H1's range once it is back (a reuse) or
/// grows the segment after H1 (H1's hole, or H1 itself, below it), and is carved
/// from a free 2 MiB block then (H1's, if back by then). Either way the
/// handle is unmapped once more by the next release point, and every block links
/// to its neighbours: after all are freed, everything is released and the empty
/// segment regrows at its start.
#[test]
fn seg_failed_release_races_growth() {
    static SEEN: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];
    model("seg_failed_release_races_growth", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let x = pool.allocate_raw(2 * MIB).unwrap();
        let y = pool.allocate_raw(2 * MIB).unwrap();
        assert_eq!(y, x + 2 * MIB);
        sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
        let tf = {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(y).unwrap())
        };
        let tg = {
            let pool = pool.clone();
            thread::spawn(move || pool.allocate_raw(2 * MIB).unwrap())
        };
        invariants(&pool.snapshot());
        tf.join().unwrap();
        let z = tg.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        assert_eq!((s.unmap_failures, s.driver_failures()), (1, 1), "{s:#?}");
        assert_eq!((s.pending_count, s.mappings_released), (0, 0));
        let got = (s.physical_bytes, s.segment_handles, s.mappings_created);
        let grown = (6 * MIB, 3, 3);
        let outcome = if got == grown {
            // Grown after H1; the carve takes a free 2 MiB block: H1's range (if
            // back by then) or the new one.
            assert!(z == y || z == x + 4 * MIB, "{s:#?}");
            assert_eq!((s.block_live_bytes, s.block_free_bytes), (4 * MIB, 2 * MIB));
            if z == y {
                1
            } else {
                2
            }
        } else {
            // H1 back, then reused.
            assert_eq!((z, got), (y, (4 * MIB, 2, 2)), "{s:#?}");
            assert_eq!((s.block_live_bytes, s.block_free_bytes), (4 * MIB, 0));
            0
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        books_match_driver(&s, &sim);
        assert_eq!(sim.touch(z, 2 * MIB, 0), CuResult::SUCCESS);
        pool.free_raw(z).unwrap();
        pool.free_raw(x).unwrap();
        let s = pool.snapshot();
        invariants(&s);
        assert_eq!((s.physical_bytes, s.segment_handles), (0, 0), "{s:#?}");
        assert_eq!(s.mappings_released, s.mappings_created);
        assert_eq!(sim.call_count(DriverCall::Unmap), s.mappings_created + 1);
        books_match_driver(&s, &sim);
        let w = pool.allocate_raw(6 * MIB).unwrap();
        assert_eq!(
            w, x,
            "an empty segment with nothing in flight regrows at its start"
        );
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_failed_release_races_growth",
        &SEEN,
        &[
            "H1 back, reused",
            "grown, H1 back and carved",
            "grown, carved",
        ],
    );
}

/// Segments: the first two requests of a heap race, both missing. Each is served
/// and they do not overlap, by one of two paths: the second carves the first's
/// new handle (one segment, one handle); or it grows the segment the first made,
/// after the first's claim (one segment, two handles). Both may find no segment
/// and reserve one (the first growth of a heap reserves outside the lock); the one
/// that books second then finds the other's segment and gives its own reservation
/// back (`FreeReservation`), so a heap never holds two segments from such a race.
/// Freed outside a scope (threshold 0), every handle is released, the reservation
/// when the pool is dropped.
#[test]
fn seg_first_growths_race() {
    static SEEN: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];
    model("seg_first_growths_race", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let alloc = || {
            let pool = pool.clone();
            thread::spawn(move || pool.allocate_raw(KIB).unwrap())
        };
        let t1 = alloc();
        let t2 = alloc();
        invariants(&pool.snapshot());
        let p1 = t1.join().unwrap();
        let p2 = t2.join().unwrap();
        assert!(p1.abs_diff(p2) >= KIB, "{p1:#x} {p2:#x} overlap");
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        let got = (s.segment_count, s.segment_handles, s.mappings_created);
        let outcome = match got {
            (1, 1, 1) => {
                // (A reuse hit, or a growth that found the free end block enough
                // and mapped nothing.)
                assert_eq!(p1.abs_diff(p2), KIB, "carved from one handle");
                0
            }
            (1, 2, 2) => 1,
            _ => panic!("{s:#?}"),
        };
        // Every reservation but the segment's was given back.
        assert_eq!(
            sim.call_count(DriverCall::Reserve),
            1 + sim.call_count(DriverCall::FreeReservation)
        );
        if sim.call_count(DriverCall::Reserve) == 2 {
            SEEN[2].fetch_add(1, Ordering::Relaxed);
        }
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        assert_eq!(s.physical_bytes, s.segment_handles * 2 * MIB);
        books_match_driver(&s, &sim);
        for p in [p1, p2] {
            assert_eq!(sim.touch(p, KIB, 0), CuResult::SUCCESS);
            pool.free_raw(p).unwrap();
        }
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.physical_bytes, s.segment_handles), (0, 0), "{s:#?}");
        assert_eq!(s.mappings_released, s.mappings_created);
        books_match_driver(&s, &sim);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_first_growths_race",
        &SEEN,
        &[
            "one handle",
            "one segment, two handles",
            "both reserved, one given back",
        ],
    );
}

/// Segments, stream order: as `stream_free_races_polling_release`, with the two
/// blocks in stream S's heap (a 2 MiB handle for `p`, a 4 MiB one for `q`). A free
/// on S puts its block back in S's heap at once, marked; its handle is released
/// (threshold 0) only once a fence covering that mark completed (the free's poll,
/// or the trim's fence wait), never with a device synchronize, and never while S's
/// kernel on `p` may run (the simulated driver would record a fault).
#[test]
fn seg_stream_free_races_polling_release() {
    model("seg_stream_free_races_polling_release", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let s = flare_package::Stream(sim.stream_create().unwrap());
        let p = pool.allocate_async_raw(2 * MIB, s).unwrap();
        let q = pool.allocate_async_raw(4 * MIB, s).unwrap();
        assert_eq!(q, p + 2 * MIB, "S's heap grows after p");
        assert_eq!(pool.snapshot().segment_handles, 2);
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
        assert_eq!(s1.physical_bytes, s1.block_free_bytes, "{s1:#?}");
        books_match_driver(&s1, &sim);
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
        books_match_driver(&s2, &sim);
        drop_and_check_empty(pool, sim);
    });
}

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
