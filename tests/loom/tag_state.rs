//! Loom models of a tag's state changes (sleep, wake) racing the calls on its memory
//! (issue 34): every interleaving, up to a preemption bound, of a sleep or wake of a
//! tag and a free, an allocation, or another sleep or wake of the same tag, on the
//! simulated driver, whose lock is loom's as well.
//!
//! Run (release: loom is slow in debug):
//!
//! ```text
//! RUSTFLAGS="--cfg flare_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom -- --nocapture --test-threads=1 tag_state::
//! ```
//!
//! The rule they check (`docs/ARCHITECTURE.md`, "Tags: sleep and wake",
//! Concurrency; `src/pool/tags/tag_gate.rs`): every call on a tag's memory runs wholly
//! before or wholly after each sleep or wake of the tag (a call that meets one is
//! refused with `Error::TagState`, nothing changed), a sleep waits for the calls in
//! flight instead of failing, and two state changes of one tag never overlap (the
//! second is refused). After both threads join, each model checks the books against
//! what the outcome must leave (live and sleeping allocations, tags asleep, the
//! snapshot's invariants, physical and reserved bytes against the simulated driver),
//! wakes the tag (which must succeed: no wedge) and frees what is left, and after the
//! pool is dropped the driver holds nothing. No model panics inside the pool. Each
//! model counts which of its outcomes each execution reached, prints the counts, and
//! fails unless every one was reached.
//!
//! All of them take about 10 s on 2 cores at their preemption bounds (5 or 6; the
//! thread-cache model 4, about 4 s of it: 23 592 executions). Few executions reach
//! the bounds: a call that meets the gate closed is refused at once, and a state
//! change waits, so most interleavings are equivalent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use flare_package::driver::sim::SimState;
use flare_package::{
    DevicePtr, Error, Pool, PoolConfig, ReusePolicy, SimDriver, SleepMode, Stream,
};
use loom::sync::Arc;
use loom::thread;

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;
const TAG: u32 = 5;

/// Runs `f` under loom with preemption bound `bound` (unless `LOOM_MAX_PREEMPTIONS`
/// says otherwise); prints the number of executions and the time.
fn model<F>(name: &str, bound: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    static EXECUTIONS: AtomicUsize = AtomicUsize::new(0);
    EXECUTIONS.store(0, Ordering::Relaxed);
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        builder.preemption_bound = Some(bound);
    }
    let bound = builder.preemption_bound;
    let start = Instant::now();
    builder.check(move || {
        EXECUTIONS.fetch_add(1, Ordering::Relaxed);
        f();
    });
    println!(
        "loom model {name}: {} executions, preemption bound {bound:?}, {:.1} s",
        EXECUTIONS.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );
}

/// Prints how many executions reached each outcome; fails unless every one was.
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

/// A pool of `policy` on the simulated driver; thread caches off unless `caches`
/// (then with no release threshold, so that they hold what is freed); otherwise the
/// release threshold is 0 (a free releases at once).
fn new_pool(policy: ReusePolicy, caches: bool) -> (Arc<Pool>, std::sync::Arc<SimDriver>) {
    let pool = Pool::new(PoolConfig {
        reuse_policy: policy,
        thread_cache_entries: if caches { 4 } else { 0 },
        release_threshold_bytes: if caches { u64::MAX } else { 0 },
        ..PoolConfig::default()
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap().clone();
    (Arc::new(pool), sim)
}

/// The books, exactly: `live` allocations, `sleeping` of them asleep, `tags` tags
/// asleep; the snapshot's invariants; the physical and reserved bytes the driver
/// holds; no driver call failed; no contract fault.
#[track_caller]
fn books(pool: &Pool, sim: &SimDriver, live: u64, sleeping: u64, tags: u64) {
    let s = pool.snapshot();
    if let Err(e) = s.check_invariants() {
        panic!("snapshot invariant broken: {e}\n{s:#?}");
    }
    assert_eq!(
        (s.live_count, s.sleeping_count, s.tags_sleeping),
        (live, sleeping, tags),
        "{s:#?}"
    );
    let d = sim.state();
    assert_eq!(
        (s.physical_bytes, s.reserved_bytes),
        (d.physical_bytes, d.reserved_bytes),
        "{s:#?}\n{d:#?}"
    );
    assert_eq!(s.driver_failures(), 0, "{s:#?}");
    assert!(sim.faults().is_empty(), "driver faults: {:?}", sim.faults());
}

/// `r` is `TagState` of tag `tag`.
#[track_caller]
fn refused<T: std::fmt::Debug>(r: &Result<T, Error>, tag: u32) {
    assert!(
        matches!(r, Err(Error::TagState { tag: t, .. }) if *t == tag),
        "expected TagState of tag {tag}, got {r:?}"
    );
}

/// Trims, then drops the last reference to the pool: the driver holds nothing.
#[track_caller]
fn drop_and_check_empty(pool: Arc<Pool>, sim: std::sync::Arc<SimDriver>) {
    pool.trim().unwrap();
    let pool = Arc::try_unwrap(pool).unwrap_or_else(|_| panic!("pool still shared"));
    drop(pool);
    assert_eq!(
        sim.state(),
        SimState::default(),
        "driver still holds memory"
    );
    assert!(sim.faults().is_empty(), "driver faults: {:?}", sim.faults());
}

fn spawn<T: Send + 'static>(
    pool: &Arc<Pool>,
    f: impl FnOnce(&Pool) -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let pool = pool.clone();
    thread::spawn(move || f(&pool))
}

/// A sleep races a free of the tag's only allocation (a whole mapping, or a block of
/// the tag's own heap in segment mode). The free is wholly before the sleep (the tag
/// then sleeps with nothing live, the mapping released by the free) or refused (the
/// allocation sleeps, and is freed after the wake). The sleep never fails: it waits
/// for the free in flight.
fn sleep_races_free(name: &'static str, policy: ReusePolicy, bound: usize) {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    for c in &SEEN {
        c.store(0, Ordering::Relaxed);
    }
    model(name, bound, move || {
        let (pool, sim) = new_pool(policy, false);
        let x = pool.allocate_tagged_raw(MIB, None, TAG).unwrap();
        let ts = spawn(&pool, |p| p.sleep(TAG, SleepMode::Discard));
        let tf = spawn(&pool, move |p| p.free_raw(x));
        ts.join().unwrap().unwrap();
        let freed = tf.join().unwrap();
        let outcome = match &freed {
            Ok(()) => {
                books(&pool, &sim, 0, 0, 1);
                0
            }
            r => {
                refused(r, TAG);
                books(&pool, &sim, 1, 1, 1);
                assert_eq!(pool.snapshot().physical_bytes, 0, "asleep: nothing mapped");
                1
            }
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        pool.wake(TAG).unwrap();
        if outcome == 1 {
            pool.free_raw(x).unwrap();
        }
        books(&pool, &sim, 0, 0, 0);
        drop_and_check_empty(pool, sim);
    });
    all_seen(name, &SEEN, &["free, then sleep", "sleep, free refused"]);
}

#[test]
fn sleep_races_a_free_of_the_tags_only_allocation() {
    sleep_races_free(
        "sleep_races_a_free_of_the_tags_only_allocation",
        ReusePolicy::BestFit,
        6,
    );
}

#[test]
fn sleep_races_a_free_of_the_tags_only_block() {
    sleep_races_free(
        "sleep_races_a_free_of_the_tags_only_block",
        ReusePolicy::Segments,
        6,
    );
}

/// A sleep races a tagged allocation (a new mapping: create, reserve, map, grant):
/// the allocation is wholly before the sleep (and sleeps with the tag) or refused.
#[test]
fn sleep_races_a_tagged_allocation() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    let name = "sleep_races_a_tagged_allocation";
    model(name, 6, || {
        let (pool, sim) = new_pool(ReusePolicy::BestFit, false);
        let ts = spawn(&pool, |p| p.sleep(TAG, SleepMode::Discard));
        let ta = spawn(&pool, |p| p.allocate_tagged_raw(MIB, None, TAG));
        ts.join().unwrap().unwrap();
        let got = ta.join().unwrap();
        let outcome = match &got {
            Ok(_) => {
                books(&pool, &sim, 1, 1, 1);
                0
            }
            r => {
                refused(r, TAG);
                books(&pool, &sim, 0, 0, 1);
                1
            }
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        pool.wake(TAG).unwrap();
        if let Ok(x) = got {
            pool.free_raw(x).unwrap();
        }
        books(&pool, &sim, 0, 0, 0);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        name,
        &SEEN,
        &["allocation, then sleep", "allocation refused"],
    );
}

/// A wake races a free of the sleeping tag's allocation: the free is refused (the
/// wake not yet over) or wholly after the wake.
#[test]
fn wake_races_a_free() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    let name = "wake_races_a_free";
    model(name, 6, || {
        let (pool, sim) = new_pool(ReusePolicy::BestFit, false);
        let x = pool.allocate_tagged_raw(MIB, None, TAG).unwrap();
        pool.sleep(TAG, SleepMode::Discard).unwrap();
        let tw = spawn(&pool, |p| p.wake(TAG));
        let tf = spawn(&pool, move |p| p.free_raw(x));
        tw.join().unwrap().unwrap();
        let freed = tf.join().unwrap();
        let outcome = match &freed {
            Ok(()) => 1,
            r => {
                refused(r, TAG);
                books(&pool, &sim, 1, 0, 0);
                pool.free_raw(x).unwrap();
                0
            }
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        books(&pool, &sim, 0, 0, 0);
        drop_and_check_empty(pool, sim);
    });
    all_seen(name, &SEEN, &["free refused", "free after the wake"]);
}

/// A wake races a tagged allocation (the tag asleep with nothing live): the
/// allocation is refused or wholly after the wake.
#[test]
fn wake_races_a_tagged_allocation() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    let name = "wake_races_a_tagged_allocation";
    model(name, 6, || {
        let (pool, sim) = new_pool(ReusePolicy::BestFit, false);
        pool.sleep(TAG, SleepMode::Discard).unwrap();
        let tw = spawn(&pool, |p| p.wake(TAG));
        let ta = spawn(&pool, |p| p.allocate_tagged_raw(MIB, None, TAG));
        tw.join().unwrap().unwrap();
        let got = ta.join().unwrap();
        let outcome = match &got {
            Ok(x) => {
                books(&pool, &sim, 1, 0, 0);
                pool.free_raw(*x).unwrap();
                1
            }
            r => {
                refused(r, TAG);
                0
            }
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        books(&pool, &sim, 0, 0, 0);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        name,
        &SEEN,
        &["allocation refused", "allocation after the wake"],
    );
}

/// Two sleeps of one tag (one allocation live): exactly one succeeds, the other is
/// refused (the tag already sleeps, or the first sleep still runs).
#[test]
fn two_sleeps_of_one_tag() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    let name = "two_sleeps_of_one_tag";
    model(name, 5, || {
        let (pool, sim) = new_pool(ReusePolicy::BestFit, false);
        let x = pool.allocate_tagged_raw(MIB, None, TAG).unwrap();
        let ta = spawn(&pool, |p| p.sleep(TAG, SleepMode::Discard));
        let tb = spawn(&pool, |p| p.sleep(TAG, SleepMode::Offload));
        let (a, b) = (ta.join().unwrap(), tb.join().unwrap());
        let outcome = match (&a, &b) {
            (Ok(()), r) => {
                refused(r, TAG);
                0
            }
            (r, Ok(())) => {
                refused(r, TAG);
                1
            }
            other => panic!("neither sleep succeeded: {other:?}"),
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        books(&pool, &sim, 1, 1, 1);
        pool.wake(TAG).unwrap();
        pool.free_raw(x).unwrap();
        books(&pool, &sim, 0, 0, 0);
        drop_and_check_empty(pool, sim);
    });
    all_seen(name, &SEEN, &["the first sleeps", "the second sleeps"]);
}

/// A sleep races a wake of the same tag (awake, one allocation live): the sleep
/// succeeds; the wake is refused (the tag did not sleep yet, or its sleep still ran)
/// or wakes it after the sleep.
#[test]
fn sleep_races_a_wake() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    let name = "sleep_races_a_wake";
    model(name, 6, || {
        let (pool, sim) = new_pool(ReusePolicy::BestFit, false);
        let x = pool.allocate_tagged_raw(MIB, None, TAG).unwrap();
        let ts = spawn(&pool, |p| p.sleep(TAG, SleepMode::Discard));
        let tw = spawn(&pool, |p| p.wake(TAG));
        ts.join().unwrap().unwrap();
        let woke = tw.join().unwrap();
        let outcome = match &woke {
            Ok(()) => {
                books(&pool, &sim, 1, 0, 0);
                1
            }
            r => {
                refused(r, TAG);
                books(&pool, &sim, 1, 1, 1);
                pool.wake(TAG).unwrap();
                0
            }
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        pool.free_raw(x).unwrap();
        books(&pool, &sim, 0, 0, 0);
        drop_and_check_empty(pool, sim);
    });
    all_seen(name, &SEEN, &["wake refused", "wake after the sleep"]);
}

/// Tag 0 sleeps (segment mode, thread caches holding what is freed) while another
/// thread allocates a block and frees it into its cache, then exits (its cache
/// orphaned): the sleep settles (flushes) the caches. Each call is wholly before the
/// sleep or refused: both before (the block idle in a cache, settled and released by
/// the sleep), the free refused (the block sleeps; freed after the wake), or the
/// allocation refused.
#[test]
fn tag0_sleep_races_a_thread_cache() {
    static SEEN: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];
    let name = "tag0_sleep_races_a_thread_cache";
    model(name, 4, || {
        let (pool, sim) = new_pool(ReusePolicy::Segments, true);
        let ts = spawn(&pool, |p| p.sleep(0, SleepMode::Discard));
        let tc = spawn(&pool, |p| {
            let a = p.allocate_raw(KIB);
            let f = a.as_ref().ok().map(|&x| (x, p.free_raw(x)));
            (a, f)
        });
        ts.join().unwrap().unwrap();
        let (a, f) = tc.join().unwrap();
        let s = pool.snapshot();
        assert_eq!(
            s.thread_cache_count, 0,
            "the sleep settled the caches\n{s:#?}"
        );
        let (outcome, left): (usize, Option<DevicePtr>) = match (&a, f) {
            (Ok(_), Some((_, Ok(())))) => {
                books(&pool, &sim, 0, 0, 1);
                (0, None)
            }
            (Ok(_), Some((x, r))) => {
                refused(&r, 0);
                books(&pool, &sim, 1, 1, 1);
                (1, Some(x))
            }
            (r, _) => {
                refused(r, 0);
                books(&pool, &sim, 0, 0, 1);
                (2, None)
            }
        };
        assert_eq!(
            pool.snapshot().physical_bytes,
            0,
            "tag 0 holds nothing asleep"
        );
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        pool.wake(0).unwrap();
        if let Some(x) = left {
            pool.free_raw(x).unwrap();
        }
        books(&pool, &sim, 0, 0, 0);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        name,
        &SEEN,
        &[
            "both before the sleep",
            "the free refused",
            "the allocation refused",
        ],
    );
}

/// Tag 0 sleeps while another tag allocates a whole mapping (stream-ordered, as the
/// C ABI does), which passes through tag 0's books (a new mapping is tag 0's until
/// booked as the tag's): the allocation never sleeps with tag 0, whatever the
/// order; tag 0 sleeps with nothing.
#[test]
fn tag0_sleep_races_a_tagged_whole_mapping() {
    model("tag0_sleep_races_a_tagged_whole_mapping", 5, || {
        let (pool, sim) = new_pool(ReusePolicy::BestFit, false);
        let ts = spawn(&pool, |p| p.sleep(0, SleepMode::Discard));
        let ta = spawn(&pool, |p| {
            p.allocate_tagged_raw(MIB, Some(Stream::LEGACY), TAG)
        });
        ts.join().unwrap().unwrap();
        let x = ta.join().unwrap().unwrap();
        books(&pool, &sim, 1, 0, 1);
        let c = pool.tag_census(TAG);
        assert_eq!((c.live_count, c.sleeping), (1, false), "{c:?}");
        assert_eq!(pool.tag_census(0).live_count, 0);
        pool.wake(0).unwrap();
        pool.free_raw(x).unwrap();
        books(&pool, &sim, 0, 0, 0);
        drop_and_check_empty(pool, sim);
    });
}
