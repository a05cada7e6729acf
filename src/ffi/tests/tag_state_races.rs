//! Sleep and wake of a tag racing the tag's own allocations and frees on other
//! threads, through the C ABI (issue 34): every race is looped for a fraction of a
//! second in whole-mapping and segment mode, and after each round the books are
//! checked exactly against what the round's statuses say happened and against what
//! the simulated driver holds; at the end the destroy report must name nothing.
//!
//! The ordering rule under test (`docs/ARCHITECTURE.md`, "Tags: sleep and wake",
//! Concurrency): every call on a tag's memory runs wholly before or wholly after a
//! sleep or wake of that tag. So of a sleep and a free of the tag's only allocation,
//! either the free came first (the sleep then finds nothing live) or the free is
//! refused with `FLARE_STATUS_TAG_STATE` (the allocation sleeps, and is freed after
//! the wake); a sleep is never refused because a call of its tag is in flight (it
//! waits for it), and two state changes of one tag never overlap (the second is
//! refused). Each round also counts which of these outcomes it reached; the counts
//! are printed (the loom models, `tests/loom/tag_state.rs`, assert that every one
//! is reached).

use std::ffi::c_void;
use std::mem::size_of;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{config, destroy_report, last_error};
use crate::ffi::*;

const MIB: u64 = 1 << 20;
const TAG: u32 = 7;
const OK: FlareStatus = FlareStatus::FLARE_STATUS_SUCCESS;
const TAG_STATE: FlareStatus = FlareStatus::FLARE_STATUS_TAG_STATE;
/// How long each race is looped, per mode.
const BUDGET: Duration = Duration::from_millis(220);

/// A pool created through the C ABI, with its simulated driver (read to compare the
/// books with what the driver holds) and the size of the tag's allocations.
struct Rig {
    pool: *mut FlarePool,
    sim: std::sync::Arc<crate::SimDriver>,
    /// Bytes of each tagged allocation: a whole mapping (3 MiB: 4 MiB mapped) or, in
    /// segment mode, a block of the tag's heap.
    size: usize,
    segments: bool,
}

/// `pool` as an integer, to hand to the racing threads (every function but destroy is
/// thread-safe).
fn addr(pool: *mut FlarePool) -> usize {
    pool as usize
}

fn pool_at(a: usize) -> *mut FlarePool {
    a as *mut FlarePool
}

fn alloc_tagged(pool: usize, size: usize, tag: u32) -> (FlareStatus, u64) {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `pool` is live for the whole test; `p` is writable; NULL is the legacy
    // stream.
    let st = unsafe {
        flare_package_allocate_tagged(pool_at(pool), size, std::ptr::null_mut(), tag, &mut p)
    };
    (st, p as usize as u64)
}

fn alloc(pool: usize, size: usize) -> (FlareStatus, u64) {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `pool` is live; `p` is writable.
    let st = unsafe { flare_package_allocate(pool_at(pool), size, &mut p) };
    (st, p as usize as u64)
}

fn free(pool: usize, p: u64) -> FlareStatus {
    // SAFETY: `pool` is live; `p` is only compared.
    unsafe { flare_package_free(pool_at(pool), p as usize as *mut c_void) }
}

fn free_async(pool: usize, p: u64) -> FlareStatus {
    // SAFETY: `pool` is live; `p` is only compared; NULL is the legacy stream.
    unsafe {
        flare_package_free_async(
            pool_at(pool),
            p as usize as *mut c_void,
            std::ptr::null_mut(),
        )
    }
}

fn sleep(pool: usize, tag: u32, offload: bool) -> FlareStatus {
    // SAFETY: `pool` is live.
    unsafe { flare_pool_sleep(pool_at(pool), tag, RawSleepMode(u32::from(offload))) }
}

fn wake(pool: usize, tag: u32) -> FlareStatus {
    // SAFETY: `pool` is live.
    unsafe { flare_pool_wake(pool_at(pool), tag) }
}

fn snap(pool: usize) -> FlareSnapshot {
    let mut s = FlareSnapshot {
        struct_size: size_of::<FlareSnapshot>() as u32,
        ..FlareSnapshot::default()
    };
    // SAFETY: `pool` is live; `s` is a whole FlareSnapshot.
    ok(
        unsafe { flare_pool_snapshot(pool_at(pool), &mut s) },
        "snapshot",
    );
    s
}

fn census(pool: usize, tag: u32) -> FlareTagCensus {
    let mut c = FlareTagCensus {
        struct_size: size_of::<FlareTagCensus>() as u32,
        ..FlareTagCensus::default()
    };
    // SAFETY: `pool` is live; `c` is a whole FlareTagCensus.
    ok(
        unsafe { flare_pool_tag_census(pool_at(pool), tag, &mut c) },
        "census",
    );
    c
}

#[track_caller]
fn ok(status: FlareStatus, what: &str) {
    assert_eq!(status, OK, "{what}: {}", last_error());
}

/// Runs `a` and `b` on two threads released together (each yields until both are
/// there), `b` after a short busy wait of `jitter % 32` steps (so that over many
/// rounds `b` falls at every point of `a`), and returns their results.
fn race<RA: Send, RB: Send>(
    jitter: u64,
    a: impl FnOnce() -> RA + Send,
    b: impl FnOnce() -> RB + Send,
) -> (RA, RB) {
    let ready = AtomicUsize::new(0);
    let go = |ready: &AtomicUsize| {
        ready.fetch_add(1, Ordering::AcqRel);
        while ready.load(Ordering::Acquire) < 2 {
            std::thread::yield_now();
        }
    };
    std::thread::scope(|s| {
        let ta = s.spawn(|| {
            go(&ready);
            a()
        });
        let tb = s.spawn(|| {
            go(&ready);
            for _ in 0..(jitter % 32) * 64 {
                std::hint::spin_loop();
            }
            b()
        });
        let ra = ta
            .join()
            .unwrap_or_else(|_| panic!("racing thread a panicked"));
        let rb = tb
            .join()
            .unwrap_or_else(|_| panic!("racing thread b panicked"));
        (ra, rb)
    })
}

impl Rig {
    fn new(segments: bool, threshold: u64) -> Rig {
        let mut c = config();
        if segments {
            c.reuse_policy = FlareReusePolicy::FLARE_REUSE_SEGMENTS as u32;
        }
        c.release_threshold_bytes = threshold;
        let mut pool = std::ptr::null_mut();
        // SAFETY: `c` is a whole config; `pool` is writable.
        ok(unsafe { flare_pool_create(&c, &mut pool) }, "create");
        // SAFETY: `pool` was just created and is live until `finish`.
        let sim = match unsafe { pool.as_ref() }.and_then(|p| p.pool.sim_driver()) {
            Some(sim) => sim,
            None => panic!("not a simulated pool"),
        };
        let size = if segments { 4096 } else { 3 * MIB as usize };
        Rig {
            pool,
            sim,
            size,
            segments,
        }
    }

    fn p(&self) -> usize {
        addr(self.pool)
    }

    /// The books, exactly: `live` allocations (of any tag), `sleeping` of them
    /// asleep, `tags_asleep` tags asleep, the snapshot's invariants, and the physical and reserved bytes the
    /// simulated driver holds; no contract fault.
    #[track_caller]
    fn check(&self, live: u64, sleeping: u64, tags_asleep: u64, what: &str) {
        let s = snap(self.p());
        let d = self.sim.state();
        assert_eq!(
            (s.live_count, s.sleeping_count, s.tags_sleeping),
            (live, sleeping, tags_asleep),
            "{what}: live and sleeping allocations, tags asleep\n{s:#?}"
        );
        assert_eq!(
            (s.physical_bytes, s.reserved_bytes),
            (d.physical_bytes, d.reserved_bytes),
            "{what}: the books against the driver\n{s:#?}\n{d:#?}"
        );
        // SAFETY: `pool` is live.
        let rust = unsafe { &*self.pool }.pool.snapshot();
        if let Err(e) = rust.check_invariants() {
            panic!("{what}: snapshot invariant broken: {e}\n{rust:#?}");
        }
        assert!(
            self.sim.faults().is_empty(),
            "{what}: {:?}",
            self.sim.faults()
        );
    }

    /// Trims, then destroys the pool: nothing live, nothing held, nothing refused;
    /// the driver holds nothing afterwards.
    fn finish(self, what: &str) {
        // SAFETY: `pool` is live.
        ok(unsafe { flare_pool_trim(self.pool) }, "trim");
        self.check(0, 0, 0, what);
        let s = snap(self.p());
        assert_eq!(s.physical_bytes, 0, "{what}: trimmed\n{s:#?}");
        let (st, r) = destroy_report(self.pool);
        assert_eq!(st, OK, "{what}: destroy: {}", last_error());
        assert_eq!(
            (
                r.live_count,
                r.live_mapped_bytes,
                r.physical_bytes,
                r.scope_was_open
            ),
            (0, 0, 0, 0),
            "{what}: destroy report {r:?}"
        );
        assert_eq!(
            self.sim.state(),
            crate::driver::sim::SimState::default(),
            "{what}: the driver still holds memory"
        );
        assert!(
            self.sim.faults().is_empty(),
            "{what}: {:?}",
            self.sim.faults()
        );
    }
}

/// Loops `round` for [`BUDGET`], counting the outcome index each round returns, and
/// prints the counts by `names`.
fn loop_race(what: &str, names: &[&str], mut round: impl FnMut(u64) -> usize) {
    let mut seen = vec![0u64; names.len()];
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < BUDGET {
        seen[round(i)] += 1;
        i += 1;
    }
    let line: Vec<String> = names
        .iter()
        .zip(&seen)
        .map(|(n, c)| format!("{n}: {c}"))
        .collect();
    println!("{what}: {i} rounds; {}", line.join(", "));
}

/// A sleep racing a free of the tag's only allocation (`free_fn`: synchronous or
/// stream-ordered). The sleep always succeeds; the free is wholly before it (the tag
/// sleeps with nothing live) or refused (the allocation sleeps; freed after the
/// wake).
fn sleep_races_free(rig: &Rig, what: &str, free_fn: fn(usize, u64) -> FlareStatus) {
    let (p, size) = (rig.p(), rig.size);
    loop_race(what, &["free first", "free refused"], |i| {
        let (st, x) = alloc_tagged(p, size, TAG);
        ok(st, "allocate");
        let (slept, freed) = race(i, || sleep(p, TAG, i % 2 == 1), || free_fn(p, x));
        ok(slept, "sleep");
        let outcome = match freed {
            OK => {
                rig.check(0, 0, 1, "free, then sleep");
                0
            }
            TAG_STATE => {
                rig.check(1, 1, 1, "sleep, free refused");
                1
            }
            other => panic!("{what}: free: {other:?}: {}", last_error()),
        };
        ok(wake(p, TAG), "wake");
        if outcome == 1 {
            ok(free_fn(p, x), "free after the wake");
        }
        rig.check(0, 0, 0, what);
        outcome
    });
}

/// A sleep racing a tagged allocation: the allocation is wholly before the sleep (it
/// sleeps with the tag) or refused.
fn sleep_races_allocate(rig: &Rig) {
    let (p, size) = (rig.p(), rig.size);
    let what = "sleep vs allocate";
    loop_race(what, &["allocation first", "allocation refused"], |i| {
        let (slept, (st, x)) = race(
            i,
            || sleep(p, TAG, i % 2 == 1),
            || alloc_tagged(p, size, TAG),
        );
        ok(slept, "sleep");
        let outcome = match st {
            OK => {
                rig.check(1, 1, 1, "allocation, then sleep");
                0
            }
            TAG_STATE => {
                rig.check(0, 0, 1, "sleep, allocation refused");
                1
            }
            other => panic!("{what}: allocate: {other:?}: {}", last_error()),
        };
        ok(wake(p, TAG), "wake");
        if outcome == 0 {
            ok(free(p, x), "free");
        }
        rig.check(0, 0, 0, what);
        outcome
    });
}

/// A wake racing a free of the tag's (sleeping) allocation: the free is refused
/// (before the wake ended) or after it.
fn wake_races_free(rig: &Rig) {
    let (p, size) = (rig.p(), rig.size);
    let what = "wake vs free";
    loop_race(what, &["free refused", "free after the wake"], |i| {
        let (st, x) = alloc_tagged(p, size, TAG);
        ok(st, "allocate");
        ok(sleep(p, TAG, i % 2 == 1), "sleep");
        let (woke, freed) = race(i, || wake(p, TAG), || free(p, x));
        ok(woke, "wake");
        let outcome = match freed {
            TAG_STATE => {
                rig.check(1, 0, 0, "free refused, then wake");
                ok(free(p, x), "free after the wake");
                0
            }
            OK => 1,
            other => panic!("{what}: free: {other:?}: {}", last_error()),
        };
        rig.check(0, 0, 0, what);
        outcome
    });
}

/// A wake racing a tagged allocation (the tag sleeping with one allocation): the
/// allocation is refused or after the wake.
fn wake_races_allocate(rig: &Rig) {
    let (p, size) = (rig.p(), rig.size);
    let what = "wake vs allocate";
    loop_race(what, &["allocation refused", "allocation after"], |i| {
        let (st, x) = alloc_tagged(p, size, TAG);
        ok(st, "allocate");
        ok(sleep(p, TAG, i % 2 == 1), "sleep");
        let (woke, (st, y)) = race(i, || wake(p, TAG), || alloc_tagged(p, size, TAG));
        ok(woke, "wake");
        let outcome = match st {
            TAG_STATE => {
                rig.check(1, 0, 0, "allocation refused, then wake");
                0
            }
            OK => {
                rig.check(2, 0, 0, "wake, then allocation");
                ok(free(p, y), "free");
                1
            }
            other => panic!("{what}: allocate: {other:?}: {}", last_error()),
        };
        ok(free(p, x), "free");
        rig.check(0, 0, 0, what);
        outcome
    });
}

/// Two sleeps of one tag: exactly one succeeds, the other is refused; then a sleep
/// racing a wake (the tag awake, one allocation live): the sleep succeeds, the wake
/// is refused (the tag was awake, or its sleep still ran) or wakes it.
fn state_changes_race(rig: &Rig) {
    let (p, size) = (rig.p(), rig.size);
    let (st, x) = alloc_tagged(p, size, TAG);
    ok(st, "allocate");
    loop_race("sleep vs sleep", &["a first", "b first"], |i| {
        let (a, b) = race(i, || sleep(p, TAG, i % 2 == 1), || sleep(p, TAG, false));
        let outcome = match (a, b) {
            (OK, TAG_STATE) => 0,
            (TAG_STATE, OK) => 1,
            other => panic!("sleep vs sleep: {other:?}: {}", last_error()),
        };
        rig.check(1, 1, 1, "one sleep");
        ok(wake(p, TAG), "wake");
        rig.check(1, 0, 0, "awake");
        outcome
    });
    loop_race("sleep vs wake", &["wake refused", "wake after"], |i| {
        let (slept, woke) = race(i, || sleep(p, TAG, i % 2 == 1), || wake(p, TAG));
        ok(slept, "sleep");
        match woke {
            TAG_STATE => {
                rig.check(1, 1, 1, "asleep");
                ok(wake(p, TAG), "wake");
                rig.check(1, 0, 0, "awake");
                0
            }
            OK => {
                rig.check(1, 0, 0, "slept and woken");
                1
            }
            other => panic!("sleep vs wake: {other:?}: {}", last_error()),
        }
    });
    ok(free(p, x), "free");
    rig.check(0, 0, 0, "state changes");
}

/// Tag 0 sleeping (segment mode, no release threshold: the thread caches hold what
/// is freed) while a new thread allocates and frees untagged memory through its
/// cache; the thread exits with its cache full, and the next one adopts (drains) it.
/// Each call is wholly before the sleep or refused.
fn tag0_sleep_races_cached_calls(rig: &Rig) {
    let p = rig.p();
    let what = "tag 0 sleep vs cached calls";
    let mut live: Vec<u64> = Vec::new();
    loop_race(what, &["calls first", "some refused"], |i| {
        let (slept, statuses) = race(
            i,
            || sleep(p, 0, i % 2 == 1),
            || {
                let mut out = Vec::new();
                for k in 0..4 {
                    let (st, x) = alloc(p, 4096 << ((i + k) % 6));
                    out.push((st, x, if st == OK { free(p, x) } else { OK }));
                }
                out
            },
        );
        ok(slept, "sleep");
        let mut refused = false;
        for (st, x, freed) in statuses {
            match (st, freed) {
                (OK, OK) => {}
                (OK, TAG_STATE) => {
                    refused = true;
                    live.push(x);
                }
                (TAG_STATE, _) => refused = true,
                other => panic!("{what}: {other:?}: {}", last_error()),
            }
        }
        let n = live.len() as u64;
        rig.check(n, n, 1, "tag 0 asleep");
        ok(wake(p, 0), "wake");
        rig.check(n, 0, 0, "tag 0 awake");
        for x in live.drain(..) {
            ok(free(p, x), "free after the wake");
        }
        rig.check(0, 0, 0, what);
        usize::from(refused)
    });
}

/// Tag 0 sleeping while a tag allocates: a tagged allocation is the tag's from its
/// hand-out on, never put to sleep with tag 0 (in whole-mapping mode it passes
/// through tag 0's idle memory and new mappings).
fn tag0_sleep_races_tagged_allocate(rig: &Rig) {
    let (p, size) = (rig.p(), rig.size);
    let what = "tag 0 sleep vs a tagged allocation";
    loop_race(what, &["both succeed"], |i| {
        let (slept, (st, x)) = race(i, || sleep(p, 0, i % 2 == 1), || alloc_tagged(p, size, TAG));
        ok(slept, "sleep");
        ok(st, "tagged allocation while tag 0 sleeps");
        rig.check(1, 0, 1, "the tag's allocation is awake");
        let c = census(p, TAG);
        assert_eq!((c.live_count, c.sleeping), (1, 0), "{what}: {c:?}");
        ok(wake(p, 0), "wake");
        ok(free(p, x), "free");
        rig.check(0, 0, 0, what);
        0
    });
}

fn races_in(segments: bool) {
    let mode = if segments { "segments" } else { "whole" };
    let rig = Rig::new(segments, 0);
    assert_eq!(rig.segments, segments);
    sleep_races_free(&rig, "sleep vs free", free);
    sleep_races_free(&rig, "sleep vs free_async", free_async);
    sleep_races_allocate(&rig);
    wake_races_free(&rig);
    wake_races_allocate(&rig);
    state_changes_race(&rig);
    tag0_sleep_races_tagged_allocate(&rig);
    rig.finish(mode);
}

#[test]
fn sleep_and_wake_race_the_tags_calls_in_whole_mapping_mode() {
    races_in(false);
}

#[test]
fn sleep_and_wake_race_the_tags_calls_in_segment_mode() {
    races_in(true);
}

#[test]
fn tag_zero_sleep_races_thread_cache_calls() {
    let rig = Rig::new(true, u64::MAX);
    tag0_sleep_races_cached_calls(&rig);
    rig.finish("tag 0 and the caches");
}
