//! Section 4: frees of memory in flight against `cuMemFreeAsync`, and the
//! synchronous `free_raw` for contrast.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use flare_package::driver::cuda::CudaDriver;
use flare_package::driver::{CuResult, Stream};
use flare_package::{fmt_bytes, DevicePtr, Pool, SimDriver};
use flare_tools::cuda_baseline::{InflightKernels, StreamOrderedPool};

use crate::harness::{ratio, sim_stream, stats, Stats};
use crate::{Bench, BoxResult, MIB};

/// Buffers freed in flight per round, and their size (section 4).
const INFLIGHT_BUFFERS: usize = 1_000;
const INFLIGHT_BYTES: u64 = 2 * MIB;
/// Every this many buffers, one is read by a short kernel queued behind the long one.
const TOUCH_EVERY: usize = 8;
/// How long the kernel queued ahead of the frees runs: far longer than queueing the
/// short kernels and making 1,000 frees (a few milliseconds).
const INFLIGHT_KERNEL: Duration = Duration::from_millis(200);
/// `CUDA_ERROR_NOT_READY`: what a stream query answers while work is queued.
const NOT_READY: CuResult = CuResult(600);

/// One way of freeing buffers in flight, over several rounds.
#[derive(Debug, Serialize)]
pub(crate) struct FreeBatch {
    pub(crate) rounds: usize,
    /// Host time of one round's frees (the sum of the per-free times), ns: median and
    /// least over the rounds.
    pub(crate) total_ns_median: f64,
    pub(crate) total_ns_min: f64,
    /// Every free of every round.
    pub(crate) per_free: Stats,
    /// Whether the stream still had the round's work queued when the round's last
    /// free returned, in every round.
    pub(crate) in_flight_at_last_free: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct InflightFrees {
    pub(crate) buffers: usize,
    pub(crate) buffer_bytes: u64,
    /// Passes of the long kernel, and its calibrated duration (CUDA only).
    pub(crate) kernel_passes: Option<u64>,
    pub(crate) kernel_ms: Option<f64>,
    /// `free_async_raw` (release threshold 0, no scope).
    pub(crate) flare_free_async: FreeBatch,
    /// `cuMemFreeAsync` of the stream-ordered pool's buffers.
    pub(crate) cu_mem_free_async: Option<FreeBatch>,
    /// `free_raw`, the synchronous path (each release synchronizes the device).
    pub(crate) flare_free_sync: FreeBatch,
    /// ours (free_async) / cuMemFreeAsync, median round totals.
    pub(crate) ratio_total_vs_cu_mem_free_async: Option<f64>,
    /// ours (free_raw) / cuMemFreeAsync, median round totals.
    pub(crate) ratio_total_sync_vs_cu_mem_free_async: Option<f64>,
}

/// How a stream-ordered measurement keeps its stream busy: kernels on the GPU, or
/// simulated work on the pool's simulated driver.
enum Work<'a> {
    Cuda {
        driver: &'a CudaDriver,
        kernels: &'a InflightKernels<'a>,
        passes: u64,
    },
    Sim(Arc<SimDriver>),
}

impl Work<'_> {
    /// Queues work on `stream` that is still running when this returns and touches
    /// `buffers` (every [`TOUCH_EVERY`]-th one).
    ///
    /// # Safety
    ///
    /// As [`InflightKernels::queue`]: every buffer stays mapped until `stream`'s
    /// work reading it has completed (it is freed stream-ordered on `stream`, or by a
    /// free that synchronizes the device first), and `stream` is live.
    unsafe fn queue(&self, stream: Stream, buffers: &[DevicePtr]) -> BoxResult<()> {
        match self {
            Work::Cuda {
                kernels, passes, ..
            } => {
                // SAFETY: the caller's promise, as documented.
                unsafe { kernels.queue(stream, *passes, buffers, TOUCH_EVERY) }?;
            }
            Work::Sim(sim) => {
                for &b in buffers.iter().step_by(TOUCH_EVERY) {
                    let c = sim.launch(stream.raw(), b, INFLIGHT_BYTES);
                    if !c.is_success() {
                        return Err(format!("simulated launch: {c}").into());
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether `stream` still has work queued.
    fn busy(&self, stream: Stream) -> BoxResult<bool> {
        Ok(match self {
            Work::Cuda { driver, .. } => !driver.stream_query(stream)?,
            Work::Sim(sim) => sim.stream_query(stream.raw()) == NOT_READY,
        })
    }

    /// Waits for (or, simulated, completes) the work queued on `stream`. Simulated,
    /// also fails if the driver saw a contract fault (memory unmapped or handed to
    /// another stream under queued work, a capture broken).
    fn drain(&self, stream: Stream) -> BoxResult<()> {
        match self {
            Work::Cuda { driver, .. } => driver.stream_synchronize(stream)?,
            Work::Sim(sim) => {
                let c = sim.stream_complete(stream.raw());
                if !c.is_success() {
                    return Err(format!("simulated stream complete: {c}").into());
                }
                let faults = sim.faults();
                if !faults.is_empty() {
                    return Err(format!("the simulated driver saw faults: {faults:?}").into());
                }
            }
        }
        Ok(())
    }
}

/// Rounds of: allocate [`INFLIGHT_BUFFERS`] buffers with `alloc`, queue `work` on
/// `stream` touching them, free each with `free` (each free timed), note whether the
/// stream was still busy after the last free, then let the work end and call
/// `after_round`.
fn free_rounds(
    rounds: usize,
    work: &Work<'_>,
    stream: Stream,
    mut alloc: impl FnMut() -> BoxResult<DevicePtr>,
    mut free: impl FnMut(DevicePtr) -> BoxResult<()>,
    mut after_round: impl FnMut() -> BoxResult<()>,
) -> BoxResult<FreeBatch> {
    let mut every = Vec::with_capacity(rounds * INFLIGHT_BUFFERS);
    let mut totals = Vec::with_capacity(rounds);
    let mut in_flight = true;
    for _ in 0..rounds {
        let buffers = (0..INFLIGHT_BUFFERS)
            .map(|_| alloc())
            .collect::<BoxResult<Vec<DevicePtr>>>()?;
        // SAFETY: every buffer is a live allocation of INFLIGHT_BYTES (more than the
        // 4 KiB the short kernels read) made just above, freed below only by `free`:
        // stream-ordered on `stream` (`free_async_raw`, `cuMemFreeAsync`) or by the
        // synchronous `free_raw`, which synchronizes the device before it unmaps.
        // `stream` lives until this function's caller is done.
        unsafe { work.queue(stream, &buffers) }?;
        let mut total = 0u64;
        for p in buffers {
            let t = Instant::now();
            free(p)?;
            let ns = t.elapsed().as_nanos() as u64;
            total += ns;
            every.push(ns);
        }
        in_flight &= work.busy(stream)?;
        totals.push(total);
        work.drain(stream)?;
        after_round()?;
    }
    let t = stats(totals);
    Ok(FreeBatch {
        rounds,
        total_ns_median: t.median_ns,
        total_ns_min: t.min_ns,
        per_free: stats(every),
        in_flight_at_last_free: in_flight,
    })
}

impl Bench {
    pub(crate) fn inflight_frees(&self) -> BoxResult<InflightFrees> {
        let rounds = if self.args.quick { 1 } else { 5 };
        eprintln!(
            "in-flight frees: {rounds} round(s) of {INFLIGHT_BUFFERS} x {}",
            fmt_bytes(INFLIGHT_BYTES)
        );
        let sop = match &self.cuda {
            Some(_) => Some(StreamOrderedPool::new(self.args.device)?),
            None => None,
        };
        let kernels = match &self.cuda {
            Some(d) => Some(InflightKernels::new(d)?),
            None => None,
        };
        let (mut passes, mut kernel_ms) = (None, None);
        if let (Some(sop), Some(k)) = (&sop, &kernels) {
            let p = k.passes_for(sop.stream(), INFLIGHT_KERNEL)?;
            let t = Instant::now();
            // SAFETY: no buffer: only the kernels' own 64 MiB buffer is read, and
            // the stream is the stream-ordered pool's, live until `sop` is dropped.
            unsafe { k.queue(sop.stream(), p, &[], TOUCH_EVERY) }?;
            sop.synchronize()?;
            kernel_ms = Some(t.elapsed().as_secs_f64() * 1e3);
            passes = Some(p);
        }
        // A pool, the stream its measurements run on, and the work that keeps it busy.
        let lane = |pool: &Pool| -> BoxResult<(Stream, Option<Arc<SimDriver>>)> {
            match &sop {
                Some(sop) => Ok((sop.stream(), None)),
                None => sim_stream(pool).map(|(sim, s)| (s, Some(sim))),
            }
        };
        let work_for = |sim: Option<Arc<SimDriver>>| match (sim, &self.cuda, &kernels, passes) {
            (Some(sim), _, _, _) => Ok(Work::Sim(sim)),
            (None, Some(driver), Some(kernels), Some(passes)) => Ok(Work::Cuda {
                driver,
                kernels,
                passes,
            }),
            _ => Err("no way to queue work on this backend"),
        };

        // flare-package's stream-ordered free: threshold 0, no scope.
        let pool = self.pool_with_threshold(0)?;
        let (stream, sim) = lane(&pool)?;
        let work = work_for(sim)?;
        let flare_free_async = free_rounds(
            rounds,
            &work,
            stream,
            || Ok(pool.allocate_async_raw(INFLIGHT_BYTES, stream)?),
            |p| Ok(pool.free_async_raw(p, stream)?),
            // The work is done: release what is still held (trim waits on fences).
            || Ok(pool.trim()?),
        )?;
        if pool.snapshot().physical_bytes != 0 {
            return Err("memory freed in flight was still held after trim".into());
        }
        drop(pool);

        // cuMemFreeAsync of the stream-ordered pool's buffers, the same way.
        let cu_mem_free_async = match &sop {
            Some(sop) => {
                let work = work_for(None)?;
                let cur = sop.make_current()?;
                let batch = free_rounds(
                    rounds,
                    &work,
                    sop.stream(),
                    || Ok(cur.pool_alloc(sop, INFLIGHT_BYTES)?),
                    |p| Ok(cur.pool_free(sop, p)?),
                    || Ok(()),
                )?;
                if !batch.in_flight_at_last_free {
                    return Err(format!(
                        "the kernel ahead of the frees ({:.1} ms) ended before the \
                         1,000 cuMemFreeAsync did: the frees were not of memory in flight",
                        kernel_ms.unwrap_or(0.0)
                    )
                    .into());
                }
                Some(batch)
            }
            None => None,
        };

        // The synchronous path, for contrast.
        let pool = self.pool_with_threshold(0)?;
        let (stream, sim) = lane(&pool)?;
        let work = work_for(sim)?;
        let flare_free_sync = free_rounds(
            rounds,
            &work,
            stream,
            || Ok(pool.allocate_raw(INFLIGHT_BYTES)?),
            |p| Ok(pool.free_raw(p)?),
            || Ok(()),
        )?;
        drop(pool);
        drop(kernels);
        drop(sop);

        let vs = |b: &FreeBatch| {
            cu_mem_free_async
                .as_ref()
                .and_then(|c| ratio(b.total_ns_median, c.total_ns_median))
        };
        Ok(InflightFrees {
            buffers: INFLIGHT_BUFFERS,
            buffer_bytes: INFLIGHT_BYTES,
            kernel_passes: passes,
            kernel_ms,
            ratio_total_vs_cu_mem_free_async: vs(&flare_free_async),
            ratio_total_sync_vs_cu_mem_free_async: vs(&flare_free_sync),
            flare_free_async,
            cu_mem_free_async,
            flare_free_sync,
        })
    }
}
