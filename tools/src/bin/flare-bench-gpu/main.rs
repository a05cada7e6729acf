//! `flare-bench-gpu`: flare-package against the allocators an engine would otherwise
//! use, measured side by side in one process on one GPU. One concern in one folder:
//! the comparison benchmark, one file per section below (`reuse_pair.rs`,
//! `fresh_mapping.rs`, `stream_pair.rs`, `inflight_frees.rs`, `replay.rs`,
//! `threads.rs`, `segment_pair.rs`, `sleep_wake.rs`), the measuring harness
//! (`harness.rs`), the report and its targets (`report.rs`) and its tables
//! (`tables.rs`); the baselines are in `tools/src/cuda_baseline/`.
//!
//! 1. Reuse pair (allocate + free served from an idle mapping, inside a retention
//!    scope) against the stream-ordered pool's warm pair (`cuMemAllocFromPoolAsync` +
//!    `cuMemFreeAsync` on a pool of its own with release threshold `u64::MAX`) and
//!    against `cuMemAlloc_v2` + `cuMemFree_v2`, at 2 MiB, 64 MiB and 1 GiB. Each pair
//!    is timed on its own with `Instant`; the alternatives run with the context
//!    already current (as on an engine's host thread); the async pool's pair is the
//!    host time of the two calls. Ours and the stream-ordered pool's are also timed
//!    in batches of [`BATCH_PAIRS`] pairs (the mean pair of each batch: the timer's
//!    overhead spread over the batch), as in section 7.
//! 2. Fresh mapping (a miss outside a scope, created and released) against the raw
//!    driver sequence it wraps (create, reserve, map, set access, synchronize, unmap,
//!    release, free the reservation) on the same driver; the two alternate, pair by
//!    pair.
//! 3. Stream pair (issue 11): `allocate_async_raw` + `free_async_raw` on one created
//!    stream (no scope, release threshold `u64::MAX`: every pair after the first is a
//!    same-stream reuse) against `cuMemAllocAsync` + `cuMemFreeAsync` on the same
//!    stream (the device's current pool, warm: no synchronize between pairs) and
//!    against the stream-ordered pool's warm pair on it, at 2 MiB, 64 MiB and 1 GiB.
//! 4. Frees of memory in flight (issue 11): the host time of 1,000 `free_async_raw`
//!    of 2 MiB buffers (release threshold 0, no scope) while a long kernel queued
//!    ahead of the frees keeps the stream busy and short kernels behind it read the
//!    buffers, against 1,000 `cuMemFreeAsync` of buffers in flight the same way, and
//!    the old synchronous `free_raw` of buffers in flight for contrast (each release
//!    synchronizes the device, so the first free waits for the kernel).
//! 5. Replay of every shipped trace through the pool (`trace::replay`, once with
//!    best-fit whole mappings and once in segment mode, issue 12) and through the
//!    stream-ordered pool (alloc / free by id on one stream, synchronize at the end):
//!    wall time, peak physical memory (ours: the snapshot's peak; the stream-ordered
//!    pool: `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`) and their ratio, the trace's lower
//!    bound (peak live bytes rounded to the granularity) and each peak over it, and
//!    the physical handles each of our replays created.
//! 6. Reuse throughput with 1, 2, 4, 8 and 16 threads (issue 13), pairs per second
//!    of all threads together, three ways, each thread count measured for
//!    [`Bench::run_for`] after a warm-up:
//!    - own sizes: one pool, inside a scope, thread `i` allocating and freeing
//!      `(i + 1) * 2 MiB`; pre-warmed by a helper thread (each size allocated, all
//!      held, then freed, so that none is served from another size's mapping), and
//!      each thread's warm-up is one pair (its size into its own thread cache when
//!      the pool has them); per row the mappings created (misses), the thread-cache
//!      hits and the remote frees while measuring (snapshot deltas);
//!    - shared sizes, cross-thread frees: one pool, inside a scope; thread `t`
//!      allocates 2, 4, 6, 8 MiB in turn ([`SHARED_SIZES`]) and hands each pointer
//!      to thread `(t + 1) % n` through a bounded lock-free queue
//!      ([`SHARED_QUEUE`] entries), and frees what thread `t - 1` handed it: every
//!      free is made by another thread than the allocation. With one thread its
//!      queue leads back to itself: it frees its own allocations, through the
//!      queue (the queue's cost, no cross-thread free; `cross_thread: false`). A
//!      pair is a free done while measuring. Pre-warmed, so that the steady state is
//!      reuse: a helper thread allocates and frees as many of each size as can be
//!      live at once ([`SHARED_LIVE_PER_SIZE`] per thread), then the threads run the
//!      workload unmeasured for a warm-up time; the row reports the mappings created
//!      while measuring (misses), thread-cache hits and remote frees;
//!    - the stream-ordered pool, one stream per thread: the own-sizes loop with
//!      `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` on one CUDA memory pool (release
//!      threshold `u64::MAX`, warm), each thread on a stream of its own (CUDA only).
//!
//!    Then the ratios of issue 13: own-sizes pairs per second over the
//!    stream-ordered pool's, per thread count, and one thread's reuse pair at 2 MiB
//!    over the stream-ordered pool's warm pair, both from section 1 (per-pair
//!    medians, the timer included, and batch medians).
//! 7. Segment pair (issue 12): an allocate + free pair in segment mode at sizes
//!    typical of tensors (4 KiB, 64 KiB, 1 MiB) and larger ones (2 MiB, 64 MiB, 1 GiB),
//!    each served from a free block lying between two live blocks of its heap (no
//!    driver call): the synchronous pair (`allocate_raw` + `free_raw`) inside a
//!    retention scope, and the stream pair (`allocate_async_raw` + `free_async_raw`)
//!    on one stream (no scope, release threshold `u64::MAX`: checked, no handle
//!    created and nothing served across streams), against the stream-ordered pool's
//!    warm pair (`cuMemAllocFromPoolAsync` + `cuMemFreeAsync` on a pool of its own,
//!    release threshold `u64::MAX`, on the same stream), as in section 1. Each pair is
//!    timed on its own (median, p99: the timer's overhead included) and, apart, in
//!    batches of [`BATCH_PAIRS`] pairs timed together (the mean pair of each batch:
//!    the timer's overhead spread over the batch).
//! 8. Sleep and wake (issue 15): a tag of 10 GiB (2 GiB with `--quick`) in 2 MiB
//!    allocations and in 1 GiB allocations (whole mappings), and in 2 MiB blocks of
//!    the tag's own heap (segment mode), put to sleep and woken, in offload mode
//!    (contents to pinned host memory and back) and in discard mode: the time of each
//!    `sleep` and `wake` (median of 3 rounds, 1 with `--quick`), the driver's free
//!    memory before and after the sleep, and for offload the bandwidth it reached
//!    (bytes copied over the call's time, pinned-memory allocation included) against
//!    the host copy bandwidth measured on the same driver (`cuMemcpyDtoH` /
//!    `cuMemcpyHtoD` of 1 GiB between a pool allocation and pinned memory): the
//!    bound for offload.
//!
//! Prints tables and writes every figure, with the ratios ours / alternative, to
//! `--json PATH`. `--backend sim` runs flare-package's side only, on the simulated
//! driver (a dry run for machines without a GPU; the stream sections then queue
//! simulated work, `SimDriver::launch`, instead of kernels; the stream-ordered pool's
//! thread section is not measured). `--thread-cache-entries` and
//! `--thread-cache-bytes` set every pool's thread caches (issue 13; default: the
//! pool's defaults, 0 entries turns them off). Exit status: 0 on success, 1 when a
//! measurement failed, 2 when CUDA is not available or the arguments are wrong
//! (`--traces` not a readable directory with `*.trace` files, checked first).
//!
//! [`SHARED_SIZES`]: threads::SHARED_SIZES
//! [`SHARED_QUEUE`]: threads::SHARED_QUEUE
//! [`SHARED_LIVE_PER_SIZE`]: threads::SHARED_LIVE_PER_SIZE

mod fresh_mapping;
mod harness;
mod inflight_frees;
mod replay;
mod report;
mod reuse_pair;
mod segment_pair;
mod sleep_wake;
mod stream_pair;
mod tables;
mod threads;

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use serde::Serialize;

use flare_package::driver::cuda::CudaDriver;
use flare_package::driver::MemInfo;
use flare_package::{Driver, Pool, PoolConfig, SimConfig};

use crate::harness::timer_overhead;
use crate::report::{targets, thread_ratios, write_json, Report, ThreadRatios};
use crate::tables::print;

type BoxResult<T> = Result<T, Box<dyn Error>>;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const SIZES: [u64; 3] = [2 * MIB, 64 * MIB, GIB];

/// Pairs per batch timed together (section 7).
const BATCH_PAIRS: usize = 1_000;

#[derive(Debug, Parser)]
#[command(
    name = "flare-bench-gpu",
    version,
    about = "Compare flare-package with the stream-ordered pool and cuMemAlloc on one GPU"
)]
struct Args {
    /// Where to write the JSON report.
    #[arg(long, default_value = "flare-bench-gpu.json")]
    json: PathBuf,

    /// A short run (a tenth of the iterations): a smoke test, not for the figures.
    #[arg(long)]
    quick: bool,

    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: i32,

    /// Directory of the traces to replay (every `*.trace` in it). A relative path,
    /// the default included, is taken from the current directory: the default names
    /// the shipped traces when run from the repository root. Checked before anything
    /// is measured.
    #[arg(long, value_name = "DIR", default_value = "tests/data")]
    traces: PathBuf,

    /// `cuda`: the real comparison. `sim`: flare-package's side only, on the
    /// simulated driver (no alternative is measured).
    #[arg(long, value_enum, default_value_t = BackendArg::Cuda)]
    backend: BackendArg,

    /// Entries of each thread's cache in every pool measured
    /// (`PoolConfig::thread_cache_entries`; 0 turns the caches off). Default: the
    /// pool's default.
    #[arg(long, value_name = "N")]
    thread_cache_entries: Option<u32>,

    /// Bytes each thread's cache may hold in every pool measured
    /// (`PoolConfig::thread_cache_bytes`). Default: the pool's default.
    #[arg(long, value_name = "BYTES")]
    thread_cache_bytes: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum BackendArg {
    Cuda,
    Sim,
}

struct Bench {
    args: Args,
    /// The `*.trace` files of `--traces`, sorted (checked before any measurement).
    trace_files: Vec<PathBuf>,
    /// The real driver for the alternatives (`None` on the simulated backend).
    cuda: Option<CudaDriver>,
}

impl Bench {
    fn config(&self) -> PoolConfig {
        let mut config = match self.args.backend {
            BackendArg::Cuda => PoolConfig::cuda(self.args.device),
            BackendArg::Sim => PoolConfig::simulated(SimConfig::default()),
        };
        if let Some(entries) = self.args.thread_cache_entries {
            config.thread_cache_entries = entries;
        }
        if let Some(bytes) = self.args.thread_cache_bytes {
            config.thread_cache_bytes = bytes;
        }
        config
    }

    /// How long each thread count of section 6 is measured: 0.5 s, 0.1 s with
    /// `--quick`.
    fn run_for(&self) -> Duration {
        Duration::from_millis(if self.args.quick { 100 } else { 500 })
    }

    fn scaled(&self, n: usize) -> usize {
        if self.args.quick {
            (n / 10).max(10)
        } else {
            n
        }
    }

    fn mem_info(&self, pool: Option<&Pool>) -> Option<MemInfo> {
        match (&self.cuda, pool) {
            (_, Some(p)) => p.driver().mem_info().ok(),
            (Some(d), None) => d.mem_info().ok(),
            (None, None) => None,
        }
    }

    /// A pool on the benchmark's backend with release threshold `threshold`.
    fn pool_with_threshold(&self, threshold: u64) -> BoxResult<Pool> {
        Ok(Pool::new(PoolConfig {
            release_threshold_bytes: threshold,
            ..self.config()
        })?)
    }
}

fn run(bench: &Bench) -> BoxResult<Report> {
    let started = Instant::now();
    let config = bench.config();
    let mut report = Report {
        backend: bench.args.backend,
        device: bench.args.device,
        quick: bench.args.quick,
        timer_overhead_ns: timer_overhead(),
        mem_total_bytes: bench.mem_info(None).map(|m| m.total),
        reuse_pair: bench.reuse_pairs()?,
        fresh_mapping: bench.fresh_mappings()?,
        stream_pair: bench.stream_pairs()?,
        inflight_frees: bench.inflight_frees()?,
        replay: bench.replays()?,
        thread_cache_entries: config.thread_cache_entries,
        thread_cache_bytes: config.thread_cache_bytes,
        threads: bench.threads()?,
        threads_shared: bench.threads_shared()?,
        threads_stream_ordered: bench.threads_stream_ordered()?,
        thread_ratios: ThreadRatios::default(),
        segment_pair: bench.segment_pairs()?,
        sleep_wake: bench.sleep_wake()?,
        targets: Vec::new(),
        total_seconds: 0.0,
    };
    report.thread_ratios = thread_ratios(&report);
    report.targets = targets(&report);
    report.total_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The `*.trace` files in `dir`, sorted. Errors: `dir` cannot be read (missing, not
/// a directory) or holds no `*.trace` file; the message names the directory as given
/// and, when it is relative, the current directory it was looked up from.
fn trace_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let shown = || {
        if dir.is_relative() {
            match std::env::current_dir() {
                Ok(cwd) => format!(
                    "{} (relative to the current directory {})",
                    dir.display(),
                    cwd.display()
                ),
                Err(_) => dir.display().to_string(),
            }
        } else {
            dir.display().to_string()
        }
    };
    let entries = std::fs::read_dir(dir).map_err(|e| format!("--traces {}: {e}", shown()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "trace"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("--traces {}: no *.trace file in it", shown()));
    }
    Ok(files)
}

fn main() -> ExitCode {
    let args = Args::parse();
    // The traces are checked before anything else: a wrong directory fails at once,
    // not after minutes of measurements.
    let trace_files = match trace_files(&args.traces) {
        Ok(files) => files,
        Err(e) => {
            eprintln!("flare-bench-gpu: error: {e}");
            return ExitCode::from(2);
        }
    };
    let cuda = match args.backend {
        BackendArg::Sim => None,
        BackendArg::Cuda => match CudaDriver::new(args.device) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!(
                    "flare-bench-gpu: CUDA is not available for device {}: {} failed with {} ({}).\n\
                     This benchmark needs an NVIDIA GPU and its driver (libcuda); \
                     `--backend sim` runs flare-package's side only, on the simulated driver.",
                    args.device,
                    e.call,
                    e.code.name(),
                    e.code.0
                );
                return ExitCode::from(2);
            }
        },
    };
    let bench = Bench {
        args,
        trace_files,
        cuda,
    };
    let report = match run(&bench) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flare-bench-gpu: {e}");
            return ExitCode::from(1);
        }
    };
    print(&report);
    if let Err(e) = write_json(&bench.args.json, &report) {
        eprintln!("flare-bench-gpu: cannot write the JSON report: {e}");
        return ExitCode::from(1);
    }
    eprintln!(
        "wrote {} ({:.1} s)",
        bench.args.json.display(),
        report.total_seconds
    );
    ExitCode::SUCCESS
}
