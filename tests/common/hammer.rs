//! The multi-threaded stress driver shared by `tests/pool/many_threads.rs` (simulated
//! driver) and `tests/gpu/many_threads.rs` (H200): a seeded random mix of allocate,
//! free and scope operations from many threads, invariants checked all along from a
//! checker thread, a watchdog against deadlock, and the totals reconciled at the end.
//! The thread caches' mix is in [`caches`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::{GIB, MIB};
use flare_package::pool::SEGMENT_BLOCK_ROUND_BYTES;
use flare_package::{CuResult, DevicePtr, Error, Pool};

pub mod caches;

/// How hard to hammer.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Worker threads.
    pub threads: u64,
    /// The first this many workers also begin, finish and abort the scope, and trim.
    pub scope_threads: u64,
    /// Operations per worker.
    pub ops: u64,
    /// Allocations a worker holds live at most.
    pub max_live: usize,
    /// Largest allocation, bytes (sizes are skewed to small below it).
    pub max_bytes: u64,
    /// The workers must all finish within this, else the test fails (deadlock).
    pub limit: Duration,
    /// Simulated driver only: one more thread that, all along, opens a retention
    /// scope, begins a capture right after `begin` returns, allocates and frees
    /// inside it, ends the capture (which must still be valid: no release may run
    /// inside the scope, and none that began before it may still be running, issue
    /// 9) and finishes the scope. Use with `scope_threads: 0`, so that no worker
    /// closes its scope or trims.
    pub captures: bool,
    /// Half the requests small: 512 B to 1 MiB, as many of each power of two (a
    /// segment-mode heap's small class); the other half as [`Rng::size`].
    pub small_sizes: bool,
}

/// What the run did, reconciled with the pool's snapshot.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    pub allocations: u64,
    pub frees: u64,
    pub reuse_hits: u64,
    pub mappings_created: u64,
    pub snapshots_checked: u64,
    pub seconds: f64,
}

/// xorshift64*: deterministic per seed, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// 1 B .. `max` (1 GiB at most), skewed to small: 60 % up to 2 MiB, 25 % up to
    /// 64 MiB, 12 % up to 256 MiB, 3 % up to 1 GiB.
    pub fn size(&mut self, max: u64) -> u64 {
        let top = match self.below(100) {
            0..=59 => 2 * MIB,
            60..=84 => 64 * MIB,
            85..=96 => 256 * MIB,
            _ => GIB,
        };
        1 + self.below(top.min(max))
    }
    /// 512 B .. 1 MiB, log-uniform: as many requests in each power-of-two range
    /// from [512 B, 1 KiB) to [512 KiB, 1 MiB).
    pub fn small_size(&mut self) -> u64 {
        let low = 1u64 << (9 + self.below(11));
        low + self.below(low)
    }
}

/// The live allocations of every worker, by address (start -> (end, worker)): an
/// allocation handed out while another overlapping it is live fails the run.
#[derive(Default)]
struct LiveRanges(Mutex<BTreeMap<DevicePtr, (DevicePtr, u64)>>);

impl LiveRanges {
    fn insert(&self, ptr: DevicePtr, bytes: u64, worker: u64) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let end = ptr + bytes;
        if let Some((&s, &(e, w))) = m.range(..end).next_back() {
            assert!(
                e <= ptr,
                "worker {worker:#x}: [{ptr:#x}, {end:#x}) overlaps worker {w:#x}'s live [{s:#x}, {e:#x})"
            );
        }
        m.insert(ptr, (end, worker));
    }
    fn remove(&self, ptr: DevicePtr) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        assert!(m.remove(&ptr).is_some(), "{ptr:#x} was not live");
    }
}

/// What one worker did.
#[derive(Default, Debug, Clone, Copy)]
struct Totals {
    allocations: u64,
    frees: u64,
    scope_begins: u64,
    scope_finishes: u64,
    scope_aborts: u64,
    scope_errors: u64,
    trims: u64,
    /// Allocations passed to another worker to free ([`caches::hammer_caches`]).
    passed: u64,
}

impl std::ops::AddAssign for Totals {
    fn add_assign(&mut self, o: Totals) {
        self.allocations += o.allocations;
        self.frees += o.frees;
        self.scope_begins += o.scope_begins;
        self.scope_finishes += o.scope_finishes;
        self.scope_aborts += o.scope_aborts;
        self.scope_errors += o.scope_errors;
        self.trims += o.trims;
        self.passed += o.passed;
    }
}

fn scope_result(r: flare_package::Result<()>, ok: &mut u64, errors: &mut u64) {
    match r {
        Ok(()) => *ok += 1,
        Err(Error::ScopeState(_)) => *errors += 1,
        Err(e) => panic!("scope operation failed: {e}"),
    }
}

/// One worker: `p.ops` random operations, at most `p.max_live` allocations live; the
/// scope threads also begin, finish and abort the scope (and trim); frees what it
/// still holds at the end.
fn worker(pool: &Pool, seed: u64, p: Params, scope_thread: bool, ranges: &LiveRanges) -> Totals {
    let mut rng = Rng::new(seed);
    let sim = pool.sim_driver();
    // Segment mode hands out blocks aligned to 512 bytes; whole mappings are aligned
    // to the granularity.
    let align = if pool.policy().is_segments() {
        SEGMENT_BLOCK_ROUND_BYTES
    } else {
        pool.granularity()
    };
    let mut t = Totals::default();
    let mut live: Vec<(DevicePtr, u64)> = Vec::new();
    for _ in 0..p.ops {
        let r = rng.below(100);
        if scope_thread && r >= 94 {
            match r {
                94 | 95 => scope_result(
                    pool.retention_begin(),
                    &mut t.scope_begins,
                    &mut t.scope_errors,
                ),
                96 | 97 => scope_result(
                    pool.retention_finish(),
                    &mut t.scope_finishes,
                    &mut t.scope_errors,
                ),
                98 => scope_result(
                    pool.retention_abort(),
                    &mut t.scope_aborts,
                    &mut t.scope_errors,
                ),
                _ => scope_result(pool.trim(), &mut t.trims, &mut t.scope_errors),
            }
        } else if (r < 50 && live.len() < p.max_live) || live.is_empty() {
            let bytes = if p.small_sizes && rng.below(2) == 0 {
                rng.small_size()
            } else {
                rng.size(p.max_bytes)
            };
            let ptr = pool
                .allocate_raw(bytes)
                .unwrap_or_else(|e| panic!("allocate {bytes}: {e}"));
            assert_eq!(ptr % align, 0, "{ptr:#x} for {bytes} bytes");
            ranges.insert(ptr, bytes, seed);
            if let Some(sim) = &sim {
                // Mapped, with access, for all its bytes.
                assert_eq!(sim.touch(ptr, bytes, 0), CuResult::SUCCESS, "{ptr:#x}");
            }
            live.push((ptr, bytes));
            t.allocations += 1;
        } else {
            let i = rng.below(live.len() as u64) as usize;
            let (ptr, _) = live.swap_remove(i);
            ranges.remove(ptr);
            pool.free_raw(ptr)
                .unwrap_or_else(|e| panic!("free {ptr:#x}: {e}"));
            t.frees += 1;
        }
    }
    for (ptr, _) in live {
        ranges.remove(ptr);
        pool.free_raw(ptr).unwrap();
        t.frees += 1;
    }
    t
}

/// Runs the workers against `pool`, with a checker thread taking snapshots all
/// along; fails if they do not all finish within `p.limit`. Then closes a scope left
/// open, trims, and checks that the pool holds nothing and that the threads' totals
/// match the snapshot's counters.
pub fn hammer(pool: Arc<Pool>, p: Params) -> Report {
    let Params {
        threads,
        scope_threads,
        ops,
        limit,
        ..
    } = p;
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let (pool, stop) = (pool.clone(), stop.clone());
        thread::spawn(move || {
            let mut checks = 0u64;
            let mut last = pool.snapshot();
            while !stop.load(Ordering::Relaxed) {
                let s = pool.snapshot();
                if let Err(e) = s.check_invariants() {
                    panic!("snapshot invariant broken mid-run: {e}\n{s:#?}");
                }
                assert!(s.allocations >= last.allocations && s.frees >= last.frees);
                assert!(s.mappings_created >= last.mappings_created);
                assert!(s.peak_physical_bytes >= last.peak_physical_bytes);
                last = s;
                checks += 1;
                thread::yield_now();
            }
            checks
        })
    };
    let ranges = Arc::new(LiveRanges::default());
    let capturer = p.captures.then(|| {
        let (pool, stop, ranges) = (pool.clone(), stop.clone(), ranges.clone());
        thread::spawn(move || capture_loop(&pool, &stop, p.small_sizes, &ranges))
    });
    let (tx, rx) = mpsc::channel();
    for i in 0..threads {
        let (pool, tx, ranges) = (pool.clone(), tx.clone(), ranges.clone());
        thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                worker(&pool, 0x5EED_0000 + i, p, i < scope_threads, &ranges)
            }));
            // The pool is given back before the result: the caller may unwrap its
            // `Arc` as soon as every result has come (the workers are not joined).
            drop(pool);
            let _ = tx.send((i, r.map_err(|p| panic_message(&*p))));
        });
    }
    drop(tx);
    let deadline = start + limit;
    let mut total = Totals::default();
    for _ in 0..threads {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((_, Ok(t))) => total += t,
            Ok((i, Err(msg))) => panic!("worker {i} panicked: {msg}"),
            Err(e) => panic!(
                "workers did not finish within {limit:?} ({e}): deadlock or livelock?\n{:#?}",
                pool.snapshot()
            ),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let checks = match checker.join() {
        Ok(c) => c,
        Err(p) => panic!("checker: {}", panic_message(&*p)),
    };
    let mut captures = 0;
    if let Some(c) = capturer {
        match c.join() {
            Ok((n, t)) => {
                captures = n;
                total += t;
            }
            Err(p) => panic!("capture thread: {}", panic_message(&*p)),
        }
        assert!(captures > 0, "the capture thread never captured");
    }
    let s = pool.snapshot();
    assert_eq!(
        s.allocations, total.allocations,
        "allocations: books vs threads"
    );
    assert_eq!(s.frees, total.frees, "frees: books vs threads");
    assert_eq!(s.live_count, 0);
    assert_eq!(s.scopes_finished, total.scope_finishes);
    assert_eq!(s.scopes_aborted, total.scope_aborts);
    assert_eq!(s.driver_failures(), 0, "driver calls failed\n{s:#?}");
    // Close a scope left open, then release everything cached.
    match pool.retention_finish() {
        Ok(()) | Err(Error::ScopeState(_)) => {}
        Err(e) => panic!("final finish: {e}"),
    }
    pool.trim().unwrap();
    let s = pool.snapshot();
    if let Err(e) = s.check_invariants() {
        panic!("{e}\n{s:#?}");
    }
    assert_eq!(s.physical_bytes, 0, "{s:#?}");
    if pool.policy().is_segments() {
        // Handles all released; the segments keep their reservations until the pool
        // is dropped.
        assert_eq!((s.segment_handles, s.block_free_bytes), (0, 0), "{s:#?}");
        assert_eq!(s.segment_handles_lent, 0, "{s:#?}");
    } else {
        assert_eq!(s.reserved_bytes, 0, "{s:#?}");
    }
    assert_eq!((s.idle_count, s.pending_count), (0, 0), "{s:#?}");
    assert_eq!(s.mappings_created, s.mappings_released, "{s:#?}");
    println!(
        "{threads} threads x {ops} ops in {:.2} s: {} allocations ({} reuse hits, {} \
         mappings created and released), {} frees, scopes {} begun / {} finished / {} \
         aborted / {} refused, {} trims, {captures} captures, peak physical {}, {checks} \
         snapshots checked",
        start.elapsed().as_secs_f64(),
        s.allocations,
        s.reuse_hits,
        s.mappings_created,
        s.frees,
        total.scope_begins,
        total.scope_finishes,
        total.scope_aborts,
        total.scope_errors,
        total.trims,
        flare_package::fmt_bytes(s.peak_physical_bytes),
    );
    Report {
        allocations: s.allocations,
        frees: s.frees,
        reuse_hits: s.reuse_hits,
        mappings_created: s.mappings_created,
        snapshots_checked: checks,
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// The capture thread of [`Params::captures`]: scopes with a capture inside, until
/// `stop`; returns how many captures it made and what it did.
fn capture_loop(pool: &Pool, stop: &AtomicBool, small: bool, ranges: &LiveRanges) -> (u64, Totals) {
    let sim = pool
        .sim_driver()
        .expect("captures need the simulated driver")
        .clone();
    let mut t = Totals::default();
    let mut captures = 0;
    let mut rng = Rng::new(0xCA97);
    while !stop.load(Ordering::Relaxed) {
        pool.retention_begin()
            .expect("only the capture thread opens scopes");
        t.scope_begins += 1;
        assert_eq!(sim.begin_capture(), flare_package::CuResult::SUCCESS);
        // Keep the capture open a while, so that a release still running from
        // before `begin` would reach its synchronize inside it.
        for _ in 0..64 {
            let bytes = if small && rng.below(2) == 0 {
                rng.small_size()
            } else {
                rng.size(256 * MIB)
            };
            let ptr = pool.allocate_raw(bytes).unwrap();
            ranges.insert(ptr, bytes, u64::MAX);
            assert_eq!(sim.touch(ptr, bytes, 0), flare_package::CuResult::SUCCESS);
            ranges.remove(ptr);
            pool.free_raw(ptr).unwrap();
            t.allocations += 1;
            t.frees += 1;
        }
        let end = sim.end_capture();
        assert_eq!(
            end,
            flare_package::CuResult::SUCCESS,
            "a release ran during a capture begun inside a retention scope"
        );
        captures += 1;
        pool.retention_finish().unwrap();
        t.scope_finishes += 1;
        // Out of the scope a while, so that the workers' frees release again.
        thread::sleep(Duration::from_micros(200));
    }
    (captures, t)
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(non-string panic)".into())
}

pub fn ops_per_thread(default: u64) -> u64 {
    std::env::var("FLARE_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
