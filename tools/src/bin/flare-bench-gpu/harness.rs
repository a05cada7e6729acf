//! The measuring harness: per-pair statistics, timing one run or a batch of runs,
//! the timer's own cost, a simulated stream, and the gate that runs section 6's
//! threads through their phases together.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::Serialize;

use flare_package::driver::Stream;
use flare_package::{Pool, SimDriver};

use crate::BoxResult;

/// Per-pair times, nanoseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct Stats {
    pub(crate) iterations: usize,
    pub(crate) median_ns: f64,
    pub(crate) p99_ns: f64,
    pub(crate) mean_ns: f64,
    pub(crate) min_ns: f64,
}

pub(crate) fn stats(mut v: Vec<u64>) -> Stats {
    v.sort_unstable();
    let n = v.len().max(1);
    let at = |q: usize| v.get((q * (n - 1)) / 100).copied().unwrap_or(0) as f64;
    Stats {
        iterations: v.len(),
        median_ns: at(50),
        p99_ns: at(99),
        mean_ns: v.iter().sum::<u64>() as f64 / n as f64,
        min_ns: v.first().copied().unwrap_or(0) as f64,
    }
}

/// Runs `f` `warmup` times, then `batches` batches of `per_batch` runs, timing each
/// batch: the statistics of the mean run of each batch (`iterations`: the runs).
pub(crate) fn time_batched(
    batches: usize,
    per_batch: usize,
    warmup: usize,
    mut f: impl FnMut() -> BoxResult<()>,
) -> BoxResult<Stats> {
    for _ in 0..warmup {
        f()?;
    }
    let mut v = Vec::with_capacity(batches);
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..per_batch {
            f()?;
        }
        v.push(t.elapsed().as_nanos() as u64);
    }
    let s = stats(v);
    let per = per_batch.max(1) as f64;
    Ok(Stats {
        iterations: batches * per_batch,
        median_ns: s.median_ns / per,
        p99_ns: s.p99_ns / per,
        mean_ns: s.mean_ns / per,
        min_ns: s.min_ns / per,
    })
}

/// Runs `f` `warmup` times, then `n` times timing each run.
pub(crate) fn time_each(
    n: usize,
    warmup: usize,
    mut f: impl FnMut() -> BoxResult<()>,
) -> BoxResult<Stats> {
    for _ in 0..warmup {
        f()?;
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_nanos() as u64);
    }
    Ok(stats(v))
}

pub(crate) fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

pub(crate) fn timer_overhead() -> f64 {
    stats(
        (0..10_000)
            .map(|_| Instant::now().elapsed().as_nanos() as u64)
            .collect(),
    )
    .median_ns
}

/// A simulated stream on `pool`'s simulated driver, and that driver.
pub(crate) fn sim_stream(pool: &Pool) -> BoxResult<(Arc<SimDriver>, Stream)> {
    let sim = pool
        .sim_driver()
        .ok_or("the pool is not on the simulated driver")?;
    let s = sim
        .stream_create()
        .map_err(|c| format!("simulated stream create: {c}"))?;
    Ok((sim, Stream(s)))
}

/// The phases of one thread count of section 6, shared by the `n` measuring threads
/// and the main thread through a barrier of `n + 1`: warm-up (until `warm_over`);
/// start (every thread warmed up: the main thread takes its first snapshot between
/// two waits, then starts the clock); measuring (until `stop`); stopped (every
/// thread out of its measured loop: the clock stops); left (every thread done with
/// its clean-up, so that none exits while another may still free memory it
/// allocated).
struct Gate {
    barrier: Barrier,
    warm_over: AtomicBool,
    stop: AtomicBool,
}

/// The barrier waits of a [`Gate`], in order, that a measuring thread makes.
const STARTED: u8 = 2;
const STOPPED: u8 = 3;
const LEFT: u8 = 4;

/// One measuring thread's side of a [`Gate`]: the waits it made so far.
pub(crate) struct Lane<'a> {
    gate: &'a Gate,
    waits: u8,
}

impl Lane<'_> {
    /// Whether the warm-up goes on.
    pub(crate) fn warming(&self) -> bool {
        !self.gate.warm_over.load(Ordering::Relaxed)
    }

    /// Whether the measurement goes on.
    pub(crate) fn running(&self) -> bool {
        !self.gate.stop.load(Ordering::Relaxed)
    }

    /// Warmed up: waits for every thread and the main thread's snapshot.
    pub(crate) fn start(&mut self) {
        self.wait_until(STARTED);
    }

    /// Out of the measured loop: waits for every thread (the clock stops).
    pub(crate) fn stop(&mut self) {
        self.wait_until(STOPPED);
    }

    fn wait_until(&mut self, waits: u8) {
        while self.waits < waits {
            self.gate.barrier.wait();
            self.waits += 1;
        }
    }
}

/// Runs `work(i, lane)` on `n` threads (`i` from 0), each warming up, then calling
/// `lane.start()`, counting pairs while `lane.running()`, then `lane.stop()`
/// (optional when it has no clean-up) and returning its pairs; the warm-up ends
/// after `warm`, the measurement `run_for` after every thread started. `at_start`
/// runs on this thread while every measuring thread waits at the start. Returns the
/// pairs of all threads and the seconds from the start to the last thread's stop. A
/// thread whose `work` fails, panics or skips a phase still makes every wait, so the
/// others finish; the first error is returned after all are joined.
pub(crate) fn measure_threads<W>(
    n: usize,
    warm: Duration,
    run_for: Duration,
    at_start: impl FnOnce(),
    work: W,
) -> BoxResult<(u64, f64)>
where
    W: Fn(usize, &mut Lane<'_>) -> Result<u64, String> + Sync,
{
    let gate = Gate {
        barrier: Barrier::new(n + 1),
        warm_over: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    };
    let (pairs, seconds, failed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (gate, work) = (&gate, &work);
                s.spawn(move || {
                    let mut lane = Lane { gate, waits: 0 };
                    // A panic (a bug) must not leave the others waiting for it.
                    let r = std::panic::catch_unwind(AssertUnwindSafe(|| work(i, &mut lane)))
                        .unwrap_or_else(|_| Err("a benchmark thread panicked".to_string()));
                    lane.wait_until(LEFT);
                    r
                })
            })
            .collect();
        std::thread::sleep(warm);
        gate.warm_over.store(true, Ordering::Relaxed);
        gate.barrier.wait();
        at_start();
        gate.barrier.wait();
        let t = Instant::now();
        std::thread::sleep(run_for);
        gate.stop.store(true, Ordering::Relaxed);
        gate.barrier.wait();
        let seconds = t.elapsed().as_secs_f64();
        gate.barrier.wait();
        let (mut pairs, mut failed) = (0u64, None);
        for h in handles {
            match h.join() {
                Ok(Ok(p)) => pairs += p,
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(_) => failed = failed.or(Some("a benchmark thread panicked".to_string())),
            }
        }
        (pairs, seconds, failed)
    });
    match failed {
        Some(e) => Err(e.into()),
        None => Ok((pairs, seconds)),
    }
}
