//! `flare-bench-gpu`: flare-package against the allocators an engine would otherwise
//! use, measured side by side in one process on one GPU. One concern in one file: the
//! comparison benchmark (each section a measurement; the baselines are in
//! `cuda_baseline.rs`).
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

use std::error::Error;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use comfy_table::Table;
use crossbeam_queue::ArrayQueue;
use serde::Serialize;

use flare_package::driver::cuda::{CudaDriver, TransferError};
use flare_package::driver::{CuResult, MemInfo, Stream};
use flare_package::trace::{self, Event, Trace};
use flare_package::{
    fmt_bytes, DevicePtr, Driver, Pool, PoolConfig, ReusePolicy, SimConfig, SimDriver,
};
use flare_tools::cuda_baseline::{
    make_current, raw_mapping_cycle, InflightKernels, StreamOrderedPool,
};

type BoxResult<T> = Result<T, Box<dyn Error>>;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const SIZES: [u64; 3] = [2 * MIB, 64 * MIB, GIB];
/// Section 7's sizes: small tensors (the heaps' small class, up to 1 MiB), then the
/// whole-mapping sizes.
const SEGMENT_PAIR_SIZES: [u64; 6] = [4 * KIB, 64 * KIB, MIB, 2 * MIB, 64 * MIB, GIB];
/// Pairs per batch timed together (section 7).
const BATCH_PAIRS: usize = 1_000;
const THREADS: [usize; 5] = [1, 2, 4, 8, 16];
/// The sizes every thread of the shared-sizes section cycles through (section 6):
/// all multiples of the 2 MiB granularity, none within the best-fit waste bound (30%)
/// of another, so each is served from idle mappings of its own size.
const SHARED_SIZES: [u64; 4] = [2 * MIB, 4 * MIB, 6 * MIB, 8 * MIB];
/// Entries of each thread's outgoing queue in the shared-sizes section.
const SHARED_QUEUE: usize = 16;
/// The most allocations of one size of [`SHARED_SIZES`] that one thread's
/// allocations can have live at once in the shared-sizes section: its queue holds
/// [`SHARED_QUEUE`] consecutive allocations of the cycle (at most
/// `ceil(SHARED_QUEUE / 4)` of one size), plus one between its allocation and the
/// push, and one between the next thread's pop and its free.
const SHARED_LIVE_PER_SIZE: usize = SHARED_QUEUE.div_ceil(SHARED_SIZES.len()) + 2;
/// Pairs between two looks at the stop flag in the thread sections.
const THREAD_BATCH: u64 = 256;
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

/// Own-sizes thread `i`'s size (section 6): `(i + 1) * 2 MiB`.
fn own_size(i: usize) -> u64 {
    (i as u64 + 1) * 2 * MIB
}

/// A live block's size in segment mode around the measured block: the smallest
/// block (512 bytes) in the small class, just over 1 MiB in the large class, so that
/// it lands in the measured size's heap.
fn live_neighbour_bytes(size: u64) -> u64 {
    if size <= MIB {
        512
    } else {
        MIB + 512
    }
}

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

/// Per-pair times, nanoseconds.
#[derive(Clone, Copy, Debug, Serialize)]
struct Stats {
    iterations: usize,
    median_ns: f64,
    p99_ns: f64,
    mean_ns: f64,
    min_ns: f64,
}

fn stats(mut v: Vec<u64>) -> Stats {
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
fn time_batched(
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
fn time_each(n: usize, warmup: usize, mut f: impl FnMut() -> BoxResult<()>) -> BoxResult<Stats> {
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

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

#[derive(Debug, Serialize)]
struct ReusePair {
    size_bytes: u64,
    flare: Stats,
    stream_ordered: Option<Stats>,
    cu_mem_alloc: Option<Stats>,
    /// Ours and the stream-ordered pool's, timed in batches of `BATCH_PAIRS` pairs:
    /// statistics of each batch's mean pair.
    flare_batched: Stats,
    stream_ordered_batched: Option<Stats>,
    /// ours / stream-ordered pool, medians.
    ratio_median_vs_stream_ordered: Option<f64>,
    ratio_p99_vs_stream_ordered: Option<f64>,
    /// ours / stream-ordered pool, batch medians.
    ratio_batched_vs_stream_ordered: Option<f64>,
    /// ours / cuMemAlloc + cuMemFree, medians.
    ratio_median_vs_cu_mem_alloc: Option<f64>,
    ratio_p99_vs_cu_mem_alloc: Option<f64>,
}

#[derive(Debug, Serialize)]
struct StreamPair {
    size_bytes: u64,
    /// `allocate_async_raw` + `free_async_raw` on one stream.
    flare: Stats,
    /// `cuMemAllocAsync` + `cuMemFreeAsync` on the same stream (device's pool).
    cu_mem_alloc_async: Option<Stats>,
    /// `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` on the same stream (own pool).
    stream_ordered: Option<Stats>,
    /// ours / cuMemAllocAsync pair.
    ratio_median_vs_cu_mem_alloc_async: Option<f64>,
    ratio_p99_vs_cu_mem_alloc_async: Option<f64>,
    /// ours / own stream-ordered pool's pair.
    ratio_median_vs_stream_ordered: Option<f64>,
}

/// One way of freeing buffers in flight, over several rounds.
#[derive(Debug, Serialize)]
struct FreeBatch {
    rounds: usize,
    /// Host time of one round's frees (the sum of the per-free times), ns: median and
    /// least over the rounds.
    total_ns_median: f64,
    total_ns_min: f64,
    /// Every free of every round.
    per_free: Stats,
    /// Whether the stream still had the round's work queued when the round's last
    /// free returned, in every round.
    in_flight_at_last_free: bool,
}

#[derive(Debug, Serialize)]
struct InflightFrees {
    buffers: usize,
    buffer_bytes: u64,
    /// Passes of the long kernel, and its calibrated duration (CUDA only).
    kernel_passes: Option<u64>,
    kernel_ms: Option<f64>,
    /// `free_async_raw` (release threshold 0, no scope).
    flare_free_async: FreeBatch,
    /// `cuMemFreeAsync` of the stream-ordered pool's buffers.
    cu_mem_free_async: Option<FreeBatch>,
    /// `free_raw`, the synchronous path (each release synchronizes the device).
    flare_free_sync: FreeBatch,
    /// ours (free_async) / cuMemFreeAsync, median round totals.
    ratio_total_vs_cu_mem_free_async: Option<f64>,
    /// ours (free_raw) / cuMemFreeAsync, median round totals.
    ratio_total_sync_vs_cu_mem_free_async: Option<f64>,
}

#[derive(Debug, Serialize)]
struct FreshMapping {
    size_bytes: u64,
    flare: Stats,
    raw_driver: Stats,
    /// ours / raw sequence, medians.
    ratio_median: Option<f64>,
    ratio_p99: Option<f64>,
}

#[derive(Debug, Serialize)]
struct FlareReplay {
    /// The reuse policy: `best-fit` or `segments`.
    policy: &'static str,
    seconds: f64,
    events_per_second: f64,
    peak_physical_bytes: u64,
    /// Peak physical bytes / the trace's lower bound.
    ratio_peak_vs_lower_bound: Option<f64>,
    final_physical_bytes: u64,
    /// Physical handles created (`cuMemCreate`): one per mapping with whole
    /// mappings, one per growth of a segment in segment mode.
    mappings_created: u64,
    /// Segments (reserved ranges) held at the end of the replay (0 with whole
    /// mappings).
    segments: u64,
    reuse_hits: u64,
    out_of_memory_at_line: Option<usize>,
    mem_free_before: Option<u64>,
    mem_free_after: Option<u64>,
}

#[derive(Debug, Serialize)]
struct StreamReplay {
    seconds: f64,
    events_per_second: f64,
    reserved_high_bytes: u64,
    used_high_bytes: u64,
    mem_free_before: Option<u64>,
    /// After the replay, before the pool is destroyed (it keeps what it reserved).
    mem_free_after: Option<u64>,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Replay {
    trace: String,
    events: usize,
    allocations: usize,
    /// Peak of the bytes live at once, each allocation rounded up to the
    /// granularity (`Trace::lower_bound_bytes`, as `flare-replay` reports it).
    lower_bound_bytes: u64,
    /// Best-fit, whole mappings (the default policy).
    flare: FlareReplay,
    /// Segment mode.
    flare_segments: FlareReplay,
    stream_ordered: Option<StreamReplay>,
    /// ours (best-fit) / stream-ordered pool: time, peak physical / reserved high.
    ratio_seconds: Option<f64>,
    ratio_peak_bytes: Option<f64>,
    /// ours (segments) / stream-ordered pool: time, peak physical / reserved high.
    ratio_seconds_segments: Option<f64>,
    ratio_peak_bytes_segments: Option<f64>,
}

#[derive(Debug, Serialize)]
struct SegmentPair {
    size_bytes: u64,
    /// `allocate_raw` + `free_raw` in segment mode, inside a retention scope.
    flare_sync: Stats,
    /// `allocate_async_raw` + `free_async_raw` in segment mode, on one stream.
    flare_stream: Stats,
    /// `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` on the same stream (own pool,
    /// warm).
    stream_ordered: Option<Stats>,
    /// The same three, timed in batches of `BATCH_PAIRS` pairs: statistics of each
    /// batch's mean pair.
    flare_sync_batched: Stats,
    flare_stream_batched: Stats,
    stream_ordered_batched: Option<Stats>,
    /// ours (synchronous pair) / stream-ordered pool's pair: medians, p99s, batch
    /// medians.
    ratio_median_sync_vs_stream_ordered: Option<f64>,
    ratio_p99_sync_vs_stream_ordered: Option<f64>,
    ratio_batched_sync_vs_stream_ordered: Option<f64>,
    /// ours (stream pair) / stream-ordered pool's pair: medians, p99s, batch medians.
    ratio_median_stream_vs_stream_ordered: Option<f64>,
    ratio_p99_stream_vs_stream_ordered: Option<f64>,
    ratio_batched_stream_vs_stream_ordered: Option<f64>,
}

/// A row of section 6's own-sizes part: each thread its own size.
#[derive(Debug, Serialize)]
struct Threads {
    threads: usize,
    pairs: u64,
    seconds: f64,
    pairs_per_second: f64,
    /// Mappings created while measuring (0: every pair was a reuse hit).
    misses: u64,
    /// Snapshot deltas while measuring: allocations served from a thread cache, and
    /// frees passed back to another thread's cache through its remote list.
    thread_cache_hits: u64,
    remote_frees: u64,
}

/// A row of section 6's shared-sizes part: every free by another thread than the
/// allocation (`cross_thread`; with one thread, by the same thread through its
/// queue). `pairs`: the frees done while measuring.
#[derive(Debug, Serialize)]
struct SharedThreads {
    threads: usize,
    cross_thread: bool,
    pairs: u64,
    seconds: f64,
    pairs_per_second: f64,
    /// Mappings created while measuring (after the pre-warm and the warm-up).
    misses: u64,
    /// Snapshot deltas while measuring, as in [`Threads`].
    thread_cache_hits: u64,
    remote_frees: u64,
}

/// A row of section 6's stream-ordered part: one CUDA memory pool, one stream per
/// thread, each thread its own size.
#[derive(Debug, Serialize)]
struct StreamOrderedThreads {
    threads: usize,
    pairs: u64,
    seconds: f64,
    pairs_per_second: f64,
}

/// Own-sizes pairs per second, ours and the stream-ordered pool's, at one thread
/// count.
#[derive(Debug, Serialize)]
struct ThreadRatio {
    threads: usize,
    flare_pairs_per_second: f64,
    stream_ordered_pairs_per_second: Option<f64>,
    /// ours / the stream-ordered pool's pairs per second.
    ratio: Option<f64>,
}

/// Issue 13's ratios, from figures of this run.
#[derive(Debug, Default, Serialize)]
struct ThreadRatios {
    /// Section 6, own sizes against the stream-ordered pool, per thread count.
    own_sizes_vs_stream_ordered: Vec<ThreadRatio>,
    /// One thread's reuse pair: section 1 at this size (2 MiB).
    reuse_pair_bytes: u64,
    /// Section 1's per-pair medians (the timer's overhead included in both) and
    /// their ratio ours / stream-ordered warm pair.
    reuse_pair_median_ns: Option<f64>,
    stream_ordered_pair_median_ns: Option<f64>,
    ratio_reuse_pair_vs_stream_ordered: Option<f64>,
    /// Section 1's batch medians (the timer's overhead spread over a batch) and
    /// their ratio.
    reuse_pair_batched_ns: Option<f64>,
    stream_ordered_pair_batched_ns: Option<f64>,
    ratio_reuse_pair_batched_vs_stream_ordered: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Target {
    what: String,
    limit: f64,
    measured: Option<f64>,
    met: Option<bool>,
    /// Whether the target is a floor (`measured >= limit`, a throughput) rather
    /// than a ceiling (`measured <= limit`).
    at_least: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    backend: BackendArg,
    device: i32,
    quick: bool,
    /// Median cost of one `Instant::now()` + `elapsed()`, included in every per-pair
    /// time.
    timer_overhead_ns: f64,
    mem_total_bytes: Option<u64>,
    reuse_pair: Vec<ReusePair>,
    fresh_mapping: Vec<FreshMapping>,
    stream_pair: Vec<StreamPair>,
    inflight_frees: InflightFrees,
    replay: Vec<Replay>,
    /// Every pool's thread-cache bounds (`PoolConfig`): entries (0: off) and bytes.
    thread_cache_entries: u32,
    thread_cache_bytes: u64,
    /// Section 6: own sizes.
    threads: Vec<Threads>,
    /// Section 6: shared sizes, cross-thread frees.
    threads_shared: Vec<SharedThreads>,
    /// Section 6: the stream-ordered pool, one stream per thread (null on the
    /// simulated backend).
    threads_stream_ordered: Option<Vec<StreamOrderedThreads>>,
    /// Section 6: issue 13's ratios.
    thread_ratios: ThreadRatios,
    segment_pair: Vec<SegmentPair>,
    /// Section 8: sleep and wake.
    sleep_wake: SleepWake,
    targets: Vec<Target>,
    total_seconds: f64,
}

/// Section 8: the host copy bandwidth, then one row per allocation size and mode.
#[derive(Debug, Serialize)]
struct SleepWake {
    /// `cuMemcpyDtoH` of 1 GiB from a pool allocation into pinned memory, bytes per
    /// second (median of 3).
    copy_to_host_bytes_per_second: Option<f64>,
    /// `cuMemcpyHtoD` of the same, bytes per second.
    copy_to_device_bytes_per_second: Option<f64>,
    /// What an offload's host memory costs apart from the copy, for the tag's size
    /// (`host_bytes`): `cuMemHostAlloc` and `cuMemFreeHost` of one pinned buffer of
    /// that size (what sleep and wake do today), seconds; and the host side of a
    /// staging route through a bounded pinned buffer into ordinary pageable memory:
    /// a copy of that many bytes from a 64 MiB buffer into freshly allocated pageable
    /// memory (first touch: page faults and zeroing), and the same copy into it again
    /// (warm), seconds, one thread.
    host_bytes: u64,
    pinned_alloc_seconds: Option<f64>,
    pinned_free_seconds: Option<f64>,
    pageable_first_touch_seconds: f64,
    pageable_warm_copy_seconds: f64,
    rows: Vec<SleepWakeRow>,
}

#[derive(Debug, Serialize)]
struct SleepWakeRow {
    /// `best-fit` (whole mappings) or `segments` (blocks of the tag's own heap).
    policy: &'static str,
    allocation_bytes: u64,
    allocations: u64,
    /// `offload` or `discard`.
    mode: &'static str,
    /// The first round's sleep and wake, seconds: the sleep pins the host buffer
    /// (`cuMemHostAlloc`), which the wake keeps.
    first_sleep_seconds: f64,
    first_wake_seconds: f64,
    /// Medians over the later rounds (the kept buffer serves: no pinning), seconds.
    sleep_seconds: f64,
    wake_seconds: f64,
    /// The driver's free memory rise across the (last) sleep, bytes.
    free_rise_bytes: Option<u64>,
    /// Offload: requested bytes copied over the later rounds' sleep (wake) time,
    /// bytes per second, and its ratio to the host copy bandwidth of the same
    /// direction.
    sleep_bytes_per_second: Option<f64>,
    wake_bytes_per_second: Option<f64>,
    sleep_vs_copy: Option<f64>,
    wake_vs_copy: Option<f64>,
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

    fn reuse_pairs(&self) -> BoxResult<Vec<ReusePair>> {
        let pool = Pool::new(self.config())?;
        let scope = pool.retention_scope()?;
        let mut out = Vec::new();
        for size in SIZES {
            let n = self.scaled(20_000);
            let n_plain = self.scaled(if size >= GIB { 1_000 } else { 5_000 });
            let batches = self.scaled(20);
            eprintln!(
                "reuse pair {}: {n} pairs, {batches} x {BATCH_PAIRS} batched",
                fmt_bytes(size)
            );
            let p = pool.allocate_raw(size)?;
            pool.free_raw(p)?;
            let created = pool.snapshot().mappings_created;
            let pair = || {
                let p = pool.allocate_raw(size)?;
                pool.free_raw(p)?;
                Ok(())
            };
            let flare = time_each(n, 1_000, pair)?;
            let flare_batched = time_batched(batches, BATCH_PAIRS, 0, pair)?;
            if pool.snapshot().mappings_created != created {
                return Err("a reuse pair missed the pool".into());
            }
            let (mut stream_ordered, mut stream_ordered_batched, mut cu_mem_alloc) =
                (None, None, None);
            if let Some(driver) = &self.cuda {
                let sop = StreamOrderedPool::new(self.args.device)?;
                {
                    let cur = sop.make_current()?;
                    let pair = || {
                        let p = cur.pool_alloc(&sop, size)?;
                        cur.pool_free(&sop, p)?;
                        Ok(())
                    };
                    stream_ordered = Some(time_each(n, 1_000, pair)?);
                    stream_ordered_batched = Some(time_batched(batches, BATCH_PAIRS, 0, pair)?);
                    sop.synchronize()?;
                }
                drop(sop);
                let cur = make_current(driver)?;
                cu_mem_alloc = Some(time_each(n_plain, 20, || {
                    let p = cur.plain_alloc(size)?;
                    cur.plain_free(p)?;
                    Ok(())
                })?);
            }
            let vs = |alt: &Option<Stats>, p99: bool| {
                alt.as_ref().and_then(|a| {
                    if p99 {
                        ratio(flare.p99_ns, a.p99_ns)
                    } else {
                        ratio(flare.median_ns, a.median_ns)
                    }
                })
            };
            out.push(ReusePair {
                size_bytes: size,
                flare,
                ratio_median_vs_stream_ordered: vs(&stream_ordered, false),
                ratio_p99_vs_stream_ordered: vs(&stream_ordered, true),
                ratio_median_vs_cu_mem_alloc: vs(&cu_mem_alloc, false),
                ratio_p99_vs_cu_mem_alloc: vs(&cu_mem_alloc, true),
                ratio_batched_vs_stream_ordered: stream_ordered_batched
                    .as_ref()
                    .and_then(|a| ratio(flare_batched.median_ns, a.median_ns)),
                stream_ordered,
                cu_mem_alloc,
                flare_batched,
                stream_ordered_batched,
            });
        }
        scope.finish()?;
        Ok(out)
    }

    fn fresh_mappings(&self) -> BoxResult<Vec<FreshMapping>> {
        // Outside a scope, release threshold 0: every free releases the mapping.
        let pool = Pool::new(self.config())?;
        let driver = pool.driver().clone();
        let devices = [self.args.device];
        let mut out = Vec::new();
        for size in SIZES {
            let n = self.scaled(if size >= GIB { 400 } else { 2_000 });
            eprintln!("fresh mapping {}: {n} pairs each", fmt_bytes(size));
            for _ in 0..5 {
                let p = pool.allocate_raw(size)?;
                pool.free_raw(p)?;
                raw_mapping_cycle(driver.as_ref(), size, &devices)?;
            }
            let (mut ours, mut raw) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for _ in 0..n {
                let t = Instant::now();
                let p = pool.allocate_raw(size)?;
                pool.free_raw(p)?;
                ours.push(t.elapsed().as_nanos() as u64);
                let t = Instant::now();
                raw_mapping_cycle(driver.as_ref(), size, &devices)?;
                raw.push(t.elapsed().as_nanos() as u64);
            }
            let s = pool.snapshot();
            if s.reuse_hits != 0 || s.mappings_created != s.mappings_released {
                return Err("a fresh-mapping pair was not a create-and-release".into());
            }
            let (flare, raw_driver) = (stats(ours), stats(raw));
            out.push(FreshMapping {
                size_bytes: size,
                ratio_median: ratio(flare.median_ns, raw_driver.median_ns),
                ratio_p99: ratio(flare.p99_ns, raw_driver.p99_ns),
                flare,
                raw_driver,
            });
        }
        Ok(out)
    }

    /// Section 8: the host copy bandwidth, then sleep and wake of one tag.
    fn sleep_wake(&self) -> BoxResult<SleepWake> {
        use flare_package::SleepMode;
        let total = if self.args.quick { 2 * GIB } else { 10 * GIB };
        // The first round, then the later ones (medians): the first sleep pins the
        // offload's host buffer, which its wake keeps for the later ones.
        let rounds = if self.args.quick { 2 } else { 4 };
        // Host copy bandwidth, both ways, 1 GiB through pinned memory.
        let pool = Pool::new(self.config())?;
        let d = pool.driver().clone();
        let a = pool.allocate_raw(GIB)?;
        let host = d.host_alloc(GIB)?;
        let (mut down, mut up) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let t = Instant::now();
            d.copy_to_host(host, 0, a, GIB)?;
            down.push(t.elapsed().as_nanos() as u64);
            let t = Instant::now();
            d.copy_to_device(a, host, 0, GIB)?;
            up.push(t.elapsed().as_nanos() as u64);
        }
        d.host_free(host)?;
        pool.free_raw(a)?;
        drop(pool);
        let per_second = |bytes: u64, ns: f64| (ns > 0.0).then(|| bytes as f64 / (ns * 1e-9));
        let copy_down = per_second(GIB, stats(down).median_ns);
        let copy_up = per_second(GIB, stats(up).median_ns);
        // The host memory's own cost, apart from the copy: pinning the tag's size
        // (what offload does now), and first-touching as much pageable memory (what
        // a staging route would do instead), then copying into it warm.
        eprintln!("sleep and wake: host memory of {}", fmt_bytes(total));
        let d = Pool::new(self.config())?.driver().clone();
        let t = Instant::now();
        let pinned = d.host_alloc(total);
        let pinned_alloc_seconds = pinned.as_ref().ok().map(|_| t.elapsed().as_secs_f64());
        let pinned_free_seconds = match pinned {
            Ok(h) => {
                let t = Instant::now();
                d.host_free(h)?;
                Some(t.elapsed().as_secs_f64())
            }
            Err(_) => None,
        };
        let chunk = vec![0x5au8; (64 * MIB) as usize];
        let t = Instant::now();
        let mut pageable: Vec<u8> = Vec::with_capacity(total as usize);
        while pageable.len() < total as usize {
            let n = chunk.len().min(total as usize - pageable.len());
            pageable.extend_from_slice(&chunk[..n]);
        }
        let pageable_first_touch_seconds = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for c in pageable.chunks_mut(chunk.len()) {
            c.copy_from_slice(&chunk[..c.len()]);
        }
        let pageable_warm_copy_seconds = t.elapsed().as_secs_f64();
        std::hint::black_box(&pageable);
        drop(pageable);
        let mut rows = Vec::new();
        let cases = [
            (ReusePolicy::BestFit, 2 * MIB),
            (ReusePolicy::BestFit, GIB),
            (ReusePolicy::Segments, 2 * MIB),
        ];
        for (policy, size) in cases {
            for mode in [SleepMode::Offload, SleepMode::Discard] {
                let n = total / size;
                let policy_name = if policy == ReusePolicy::Segments {
                    "segments"
                } else {
                    "best-fit"
                };
                eprintln!(
                    "sleep and wake: {n} x {} ({mode:?}, {policy_name})",
                    fmt_bytes(size)
                );
                let pool = Pool::new(self.config().with_policy(policy))?;
                let ptrs = (0..n)
                    .map(|_| pool.allocate_tagged_raw(size, None, 1))
                    .collect::<Result<Vec<_>, _>>()?;
                let (mut sleeps, mut wakes, mut rise) = (Vec::new(), Vec::new(), None);
                for _ in 0..rounds {
                    let before = self.mem_info(Some(&pool));
                    let t = Instant::now();
                    pool.sleep(1, mode)?;
                    sleeps.push(t.elapsed().as_nanos() as u64);
                    let after = self.mem_info(Some(&pool));
                    rise = before
                        .zip(after)
                        .map(|(b, a)| a.free.saturating_sub(b.free));
                    if pool.tag_census(1).physical_bytes != 0 {
                        return Err("a sleeping tag still holds physical memory".into());
                    }
                    let t = Instant::now();
                    pool.wake(1)?;
                    wakes.push(t.elapsed().as_nanos() as u64);
                }
                for p in ptrs {
                    pool.free_raw(p)?;
                }
                let (first_sleep_ns, first_wake_ns) = (sleeps[0], wakes[0]);
                let (sleep_ns, wake_ns) = (
                    stats(sleeps[1..].to_vec()).median_ns,
                    stats(wakes[1..].to_vec()).median_ns,
                );
                let offload = mode == SleepMode::Offload;
                let sleep_bw = per_second(total, sleep_ns).filter(|_| offload);
                let wake_bw = per_second(total, wake_ns).filter(|_| offload);
                rows.push(SleepWakeRow {
                    policy: policy_name,
                    allocation_bytes: size,
                    allocations: n,
                    mode: if offload { "offload" } else { "discard" },
                    first_sleep_seconds: first_sleep_ns as f64 * 1e-9,
                    first_wake_seconds: first_wake_ns as f64 * 1e-9,
                    sleep_seconds: sleep_ns * 1e-9,
                    wake_seconds: wake_ns * 1e-9,
                    free_rise_bytes: rise,
                    sleep_bytes_per_second: sleep_bw,
                    wake_bytes_per_second: wake_bw,
                    sleep_vs_copy: sleep_bw.zip(copy_down).and_then(|(a, b)| ratio(a, b)),
                    wake_vs_copy: wake_bw.zip(copy_up).and_then(|(a, b)| ratio(a, b)),
                });
            }
        }
        Ok(SleepWake {
            copy_to_host_bytes_per_second: copy_down,
            copy_to_device_bytes_per_second: copy_up,
            host_bytes: total,
            pinned_alloc_seconds,
            pinned_free_seconds,
            pageable_first_touch_seconds,
            pageable_warm_copy_seconds,
            rows,
        })
    }

    /// Replays `t` on a fresh pool of the benchmark's backend with `policy`.
    fn flare_replay(&self, t: &Trace, policy: ReusePolicy, lower: u64) -> BoxResult<FlareReplay> {
        let pool = Pool::new(self.config().with_policy(policy))?;
        let before = self.mem_info(Some(&pool));
        let r = trace::replay(&pool, t, None)?;
        let after = self.mem_info(Some(&pool));
        let segments = pool.snapshot().segment_count;
        drop(pool);
        Ok(FlareReplay {
            policy: policy.name(),
            seconds: r.seconds,
            events_per_second: t.len() as f64 / r.seconds.max(1e-12),
            peak_physical_bytes: r.peak_physical_bytes,
            ratio_peak_vs_lower_bound: ratio(r.peak_physical_bytes as f64, lower as f64),
            final_physical_bytes: r.final_physical_bytes,
            mappings_created: r.mappings_created,
            segments,
            reuse_hits: r.reuse_hits,
            out_of_memory_at_line: r.out_of_memory_at_line,
            mem_free_before: before.map(|m| m.free),
            mem_free_after: after.map(|m| m.free),
        })
    }

    fn replays(&self) -> BoxResult<Vec<Replay>> {
        let mut out = Vec::new();
        let granularity = Pool::new(self.config())?.granularity();
        for file in &self.trace_files {
            let t = trace::parse(file)?;
            eprintln!("replay {} ({} events)", t.name(), t.len());
            let lower = t.lower_bound_bytes(granularity);
            let flare = self.flare_replay(&t, ReusePolicy::BestFit, lower)?;
            let flare_segments = self.flare_replay(&t, ReusePolicy::Segments, lower)?;
            let stream_ordered = match self.cuda {
                Some(_) => Some(self.stream_replay(&t)?),
                None => None,
            };
            let so = stream_ordered.as_ref().filter(|s| s.error.is_none());
            let vs_time = |f: &FlareReplay| so.and_then(|s| ratio(f.seconds, s.seconds));
            let vs_peak = |f: &FlareReplay| {
                so.and_then(|s| ratio(f.peak_physical_bytes as f64, s.reserved_high_bytes as f64))
            };
            out.push(Replay {
                trace: t.name().to_string(),
                events: t.len(),
                allocations: t.allocations(),
                lower_bound_bytes: lower,
                ratio_seconds: vs_time(&flare),
                ratio_peak_bytes: vs_peak(&flare),
                ratio_seconds_segments: vs_time(&flare_segments),
                ratio_peak_bytes_segments: vs_peak(&flare_segments),
                flare,
                flare_segments,
                stream_ordered,
            });
        }
        Ok(out)
    }

    fn stream_replay(&self, t: &Trace) -> BoxResult<StreamReplay> {
        let before = self.mem_info(None);
        let sop = StreamOrderedPool::new(self.args.device)?;
        let mut ptrs: Vec<Option<u64>> = vec![None; t.id_count()];
        let mut error = None;
        let started = Instant::now();
        {
            let cur = sop.make_current()?;
            for &event in t.events() {
                let r = match event {
                    // The baseline has no tags: a tagged line is an allocation (and
                    // a recorded stream-ordered one, on the baseline's stream).
                    Event::Alloc { id, bytes }
                    | Event::AllocTagged { id, bytes, .. }
                    | Event::AllocAsync { id, bytes, .. } => cur.pool_alloc(&sop, bytes).map(|p| {
                        if let Some(slot) = ptrs.get_mut(id as usize) {
                            *slot = Some(p);
                        }
                    }),
                    Event::Free { id } | Event::FreeAsync { id, .. } => {
                        match ptrs.get_mut(id as usize).and_then(Option::take) {
                            Some(p) => cur.pool_free(&sop, p),
                            None => Ok(()),
                        }
                    }
                    Event::Trim => sop.trim_to(0),
                    Event::Begin
                    | Event::Finish
                    | Event::Abort
                    | Event::RecordStream { .. }
                    | Event::Forget { .. }
                    | Event::Done { .. }
                    | Event::Oom { .. }
                    | Event::AllocFailed { .. }
                    | Event::Sleep { .. }
                    | Event::Wake { .. } => Ok(()),
                };
                if let Err(e) = r {
                    error = Some(e.to_string());
                    break;
                }
            }
            for p in ptrs.iter_mut().filter_map(Option::take) {
                cur.pool_free(&sop, p)?;
            }
            sop.synchronize()?;
        }
        let seconds = started.elapsed().as_secs_f64();
        let after = self.mem_info(None);
        Ok(StreamReplay {
            seconds,
            events_per_second: t.len() as f64 / seconds.max(1e-12),
            reserved_high_bytes: sop.reserved_high_bytes()?,
            used_high_bytes: sop.used_high_bytes()?,
            mem_free_before: before.map(|m| m.free),
            mem_free_after: after.map(|m| m.free),
            error,
        })
    }

    /// Section 6, own sizes: thread `i` allocates and frees [`own_size`]`(i)` on one
    /// pool inside a scope, after one warm-up pair of its own.
    fn threads(&self) -> BoxResult<Vec<Threads>> {
        let pool = Pool::new(self.config())?;
        let scope = pool.retention_scope()?;
        let mut out = Vec::new();
        for n in THREADS {
            eprintln!("reuse throughput, own sizes, {n} thread(s)");
            let sizes: Vec<u64> = (0..n).map(own_size).collect();
            prewarm(&pool, &sizes)?;
            let mut before = None;
            let (pairs, seconds) = measure_threads(
                n,
                Duration::ZERO,
                self.run_for(),
                || before = Some(pool.snapshot()),
                |i, lane| {
                    let size = own_size(i);
                    let pair = || -> Result<(), String> {
                        let p = pool.allocate_raw(size).map_err(|e| e.to_string())?;
                        pool.free_raw(p).map_err(|e| e.to_string())
                    };
                    // Warm-up: the pre-warmed mapping of this thread's size (into this
                    // thread's cache, when the pool has them).
                    pair()?;
                    lane.start();
                    let mut pairs = 0u64;
                    while lane.running() {
                        for _ in 0..THREAD_BATCH {
                            pair()?;
                        }
                        pairs += THREAD_BATCH;
                    }
                    Ok(pairs)
                },
            )?;
            let before = before.ok_or("no snapshot before measuring")?;
            let (misses, thread_cache_hits, remote_frees) = cache_counts(&before, &pool.snapshot());
            out.push(Threads {
                threads: n,
                pairs,
                seconds,
                pairs_per_second: pairs as f64 / seconds,
                misses,
                thread_cache_hits,
                remote_frees,
            });
        }
        scope.finish()?;
        Ok(out)
    }

    /// Section 6, shared sizes: thread `t` allocates [`SHARED_SIZES`] in turn and
    /// hands each pointer to thread `(t + 1) % n`, which frees it (see the module
    /// documentation).
    fn threads_shared(&self) -> BoxResult<Vec<SharedThreads>> {
        let pool = Pool::new(self.config())?;
        let scope = pool.retention_scope()?;
        let warm = Duration::from_millis(if self.args.quick { 20 } else { 100 });
        let mut out = Vec::new();
        for n in THREADS {
            eprintln!("reuse throughput, shared sizes, cross-thread frees, {n} thread(s)");
            let sizes: Vec<u64> = SHARED_SIZES
                .iter()
                .flat_map(|&size| std::iter::repeat_n(size, n * SHARED_LIVE_PER_SIZE))
                .collect();
            prewarm(&pool, &sizes)?;
            // `queues[t]`: what thread t frees, pushed by thread t - 1.
            let queues: Vec<ArrayQueue<DevicePtr>> =
                (0..n).map(|_| ArrayQueue::new(SHARED_QUEUE)).collect();
            let mut before = None;
            let measured = measure_threads(
                n,
                warm,
                self.run_for(),
                || before = Some(pool.snapshot()),
                |t, lane| {
                    let (inbox, outbox) = (&queues[t], &queues[(t + 1) % n]);
                    let mut next = t;
                    // Frees one pointer from the inbox if there is one, and allocates
                    // one for the outbox if it has room: the frees done (0 or 1).
                    let mut step = || -> Result<u64, String> {
                        let mut freed = 0;
                        if let Some(p) = inbox.pop() {
                            pool.free_raw(p).map_err(|e| e.to_string())?;
                            freed = 1;
                        }
                        if !outbox.is_full() {
                            let size = SHARED_SIZES[next % SHARED_SIZES.len()];
                            next += 1;
                            let p = pool.allocate_raw(size).map_err(|e| e.to_string())?;
                            // Only this thread pushes to its outbox, and it had room.
                            if let Err(p) = outbox.push(p) {
                                pool.free_raw(p).map_err(|e| e.to_string())?;
                                return Err("a shared-sizes queue was full".to_string());
                            }
                        } else if freed == 0 {
                            // Nothing to do until the next thread frees: let it run
                            // (threads may outnumber cores).
                            std::thread::yield_now();
                        }
                        Ok(freed)
                    };
                    while lane.warming() {
                        step()?;
                    }
                    lane.start();
                    let mut pairs = 0u64;
                    while lane.running() {
                        for _ in 0..THREAD_BATCH {
                            pairs += step()?;
                        }
                    }
                    lane.stop();
                    // Every thread is out of its loop: nothing more is pushed. Free
                    // what the previous thread left (not counted).
                    while let Some(p) = inbox.pop() {
                        pool.free_raw(p).map_err(|e| e.to_string())?;
                    }
                    Ok(pairs)
                },
            );
            // What a failed thread left in the queues.
            for q in &queues {
                while let Some(p) = q.pop() {
                    let _ = pool.free_raw(p);
                }
            }
            let (pairs, seconds) = measured?;
            let before = before.ok_or("no snapshot before measuring")?;
            let (misses, thread_cache_hits, remote_frees) = cache_counts(&before, &pool.snapshot());
            out.push(SharedThreads {
                threads: n,
                cross_thread: n > 1,
                pairs,
                seconds,
                pairs_per_second: pairs as f64 / seconds,
                misses,
                thread_cache_hits,
                remote_frees,
            });
        }
        scope.finish()?;
        Ok(out)
    }

    /// Section 6, the stream-ordered pool: the own-sizes loop with
    /// `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` on one CUDA memory pool, each
    /// thread on a stream of its own. `None` on the simulated backend.
    fn threads_stream_ordered(&self) -> BoxResult<Option<Vec<StreamOrderedThreads>>> {
        if self.cuda.is_none() {
            return Ok(None);
        }
        let sop = StreamOrderedPool::new(self.args.device)?;
        let mut out = Vec::new();
        for n in THREADS {
            eprintln!("reuse throughput, stream-ordered pool, {n} thread(s), a stream each");
            let (pairs, seconds) = measure_threads(
                n,
                Duration::ZERO,
                self.run_for(),
                || {},
                |i, lane| {
                    let err = |e: TransferError| e.to_string();
                    let cur = sop.make_current().map_err(err)?;
                    let stream = sop.new_stream().map_err(err)?;
                    let size = own_size(i);
                    let pair = || -> Result<(), String> {
                        let p = cur.stream_alloc(&stream, size).map_err(err)?;
                        cur.stream_free(&stream, p).map_err(err)
                    };
                    // Warm-up: the pool holds this thread's size (release threshold
                    // u64::MAX keeps it).
                    pair()?;
                    lane.start();
                    let mut pairs = 0u64;
                    while lane.running() {
                        for _ in 0..THREAD_BATCH {
                            pair()?;
                        }
                        pairs += THREAD_BATCH;
                    }
                    lane.stop();
                    stream.synchronize().map_err(err)?;
                    Ok(pairs)
                },
            )?;
            out.push(StreamOrderedThreads {
                threads: n,
                pairs,
                seconds,
                pairs_per_second: pairs as f64 / seconds,
            });
        }
        drop(sop);
        Ok(Some(out))
    }
}

/// Section 6's pre-warm: on a helper thread (joined, so that whatever it cached
/// goes back to the pool when it exits), allocates every size of `sizes` (in
/// order, each held until all are allocated, so none is served from another's
/// mapping), then frees them all: inside the scope, they stay idle for the
/// measuring threads.
fn prewarm(pool: &Pool, sizes: &[u64]) -> BoxResult<()> {
    let joined = std::thread::scope(|s| {
        s.spawn(|| -> Result<(), String> {
            let mut held = Vec::with_capacity(sizes.len());
            let mut result = Ok(());
            for &size in sizes {
                match pool.allocate_raw(size) {
                    Ok(p) => held.push(p),
                    Err(e) => {
                        result = Err(format!("pre-warm, {}: {e}", fmt_bytes(size)));
                        break;
                    }
                }
            }
            for p in held {
                if let Err(e) = pool.free_raw(p) {
                    result = result.and(Err(format!("pre-warm, free: {e}")));
                }
            }
            result
        })
        .join()
    });
    match joined {
        Ok(r) => Ok(r?),
        Err(_) => Err("the pre-warm thread panicked".into()),
    }
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
struct Lane<'a> {
    gate: &'a Gate,
    waits: u8,
}

impl Lane<'_> {
    /// Whether the warm-up goes on.
    fn warming(&self) -> bool {
        !self.gate.warm_over.load(Ordering::Relaxed)
    }

    /// Whether the measurement goes on.
    fn running(&self) -> bool {
        !self.gate.stop.load(Ordering::Relaxed)
    }

    /// Warmed up: waits for every thread and the main thread's snapshot.
    fn start(&mut self) {
        self.wait_until(STARTED);
    }

    /// Out of the measured loop: waits for every thread (the clock stops).
    fn stop(&mut self) {
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
fn measure_threads<W>(
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

/// On a fresh segment-mode pool: allocates a live block, a block of `size` bytes and
/// another live block (of [`live_neighbour_bytes`]), checks that they lie back to
/// back (the measured block between two live blocks of its heap: its free neither
/// coalesces nor leaves a handle wholly free), frees the middle one and returns the
/// two live ones.
fn surround(
    size: u64,
    mut alloc: impl FnMut(u64) -> BoxResult<DevicePtr>,
    mut free: impl FnMut(DevicePtr) -> BoxResult<()>,
) -> BoxResult<[DevicePtr; 2]> {
    let live = live_neighbour_bytes(size);
    let first = alloc(live)?;
    let p = alloc(size)?;
    let last = alloc(live)?;
    // Blocks are rounded to 512 bytes (both sizes here already are).
    if p != first + live || last != p + size {
        return Err(format!(
            "segment pair {}: blocks not laid out back to back \
             ({first:#x}, {p:#x}, {last:#x})",
            fmt_bytes(size)
        )
        .into());
    }
    free(p)?;
    Ok([first, last])
}

/// A simulated stream on `pool`'s simulated driver, and that driver.
fn sim_stream(pool: &Pool) -> BoxResult<(Arc<SimDriver>, Stream)> {
    let sim = pool
        .sim_driver()
        .ok_or("the pool is not on the simulated driver")?;
    let s = sim
        .stream_create()
        .map_err(|c| format!("simulated stream create: {c}"))?;
    Ok((sim, Stream(s)))
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
    /// A pool on the benchmark's backend with release threshold `threshold`.
    fn pool_with_threshold(&self, threshold: u64) -> BoxResult<Pool> {
        Ok(Pool::new(PoolConfig {
            release_threshold_bytes: threshold,
            ..self.config()
        })?)
    }

    fn stream_pairs(&self) -> BoxResult<Vec<StreamPair>> {
        // Release threshold u64::MAX, no scope: a freed mapping stays cached, as the
        // alternatives' warm pools keep theirs.
        let pool = self.pool_with_threshold(u64::MAX)?;
        let sop = match &self.cuda {
            Some(_) => Some(StreamOrderedPool::new(self.args.device)?),
            None => None,
        };
        let stream = match &sop {
            Some(sop) => sop.stream(),
            None => sim_stream(&pool)?.1,
        };
        let mut out = Vec::new();
        for size in SIZES {
            let n = self.scaled(20_000);
            eprintln!("stream pair {}: {n} pairs", fmt_bytes(size));
            let p = pool.allocate_async_raw(size, stream)?;
            pool.free_async_raw(p, stream)?;
            let before = pool.snapshot();
            let flare = time_each(n, 1_000, || {
                let p = pool.allocate_async_raw(size, stream)?;
                pool.free_async_raw(p, stream)?;
                Ok(())
            })?;
            let after = pool.snapshot();
            if after.mappings_created != before.mappings_created {
                return Err("a stream pair missed the pool".into());
            }
            if after.cross_stream_hits != before.cross_stream_hits {
                return Err("a stream pair was served across streams".into());
            }
            let (mut cu_mem_alloc_async, mut stream_ordered) = (None, None);
            if let Some(sop) = &sop {
                let cur = sop.make_current()?;
                cu_mem_alloc_async = Some(time_each(n, 1_000, || {
                    let p = cur.default_pool_alloc(sop, size)?;
                    cur.pool_free(sop, p)?;
                    Ok(())
                })?);
                stream_ordered = Some(time_each(n, 1_000, || {
                    let p = cur.pool_alloc(sop, size)?;
                    cur.pool_free(sop, p)?;
                    Ok(())
                })?);
                sop.synchronize()?;
            }
            let vs = |alt: &Option<Stats>, p99: bool| {
                alt.as_ref().and_then(|a| {
                    if p99 {
                        ratio(flare.p99_ns, a.p99_ns)
                    } else {
                        ratio(flare.median_ns, a.median_ns)
                    }
                })
            };
            out.push(StreamPair {
                size_bytes: size,
                flare,
                ratio_median_vs_cu_mem_alloc_async: vs(&cu_mem_alloc_async, false),
                ratio_p99_vs_cu_mem_alloc_async: vs(&cu_mem_alloc_async, true),
                ratio_median_vs_stream_ordered: vs(&stream_ordered, false),
                cu_mem_alloc_async,
                stream_ordered,
            });
        }
        // The pool first: it may record fence events on the stream until dropped.
        drop(pool);
        drop(sop);
        Ok(out)
    }

    /// Section 7: the segment-mode pairs against the stream-ordered pool's pair.
    fn segment_pairs(&self) -> BoxResult<Vec<SegmentPair>> {
        let segments = |threshold: u64| -> BoxResult<Pool> {
            Ok(Pool::new(PoolConfig {
                release_threshold_bytes: threshold,
                ..self.config().with_policy(ReusePolicy::Segments)
            })?)
        };
        let sop = match &self.cuda {
            Some(_) => Some(StreamOrderedPool::new(self.args.device)?),
            None => None,
        };
        let n = self.scaled(20_000);
        let batches = self.scaled(20);
        let mut out = Vec::new();
        for size in SEGMENT_PAIR_SIZES {
            eprintln!(
                "segment pair {}: {n} pairs, {batches} x {BATCH_PAIRS} batched, each",
                fmt_bytes(size)
            );
            // Fresh pools per size, so that the measured block is laid out between
            // two live blocks of its heap: the synchronous pair inside a scope; the
            // stream pair with no scope and release threshold u64::MAX (freed memory
            // stays cached, as the stream-ordered pool's does).
            let sync_pool = segments(0)?;
            let scope = sync_pool.retention_scope()?;
            let live = surround(
                size,
                |b| Ok(sync_pool.allocate_raw(b)?),
                |p| Ok(sync_pool.free_raw(p)?),
            )?;
            let before = sync_pool.snapshot();
            let pair = || {
                let p = sync_pool.allocate_raw(size)?;
                sync_pool.free_raw(p)?;
                Ok(())
            };
            let flare_sync = time_each(n, 1_000, pair)?;
            let flare_sync_batched = time_batched(batches, BATCH_PAIRS, 0, pair)?;
            let after = sync_pool.snapshot();
            let pairs = (n + 1_000 + batches * BATCH_PAIRS) as u64;
            if after.mappings_created != before.mappings_created
                || after.reuse_exact_hits - before.reuse_exact_hits != pairs
            {
                return Err("a segment pair (scope) was not an exact hit in its heap".into());
            }
            for p in live {
                sync_pool.free_raw(p)?;
            }
            scope.finish()?;
            drop(sync_pool);

            let stream_pool = segments(u64::MAX)?;
            let stream = match &sop {
                Some(sop) => sop.stream(),
                None => sim_stream(&stream_pool)?.1,
            };
            let live = surround(
                size,
                |b| Ok(stream_pool.allocate_async_raw(b, stream)?),
                |p| Ok(stream_pool.free_async_raw(p, stream)?),
            )?;
            let before = stream_pool.snapshot();
            let pair = || {
                let p = stream_pool.allocate_async_raw(size, stream)?;
                stream_pool.free_async_raw(p, stream)?;
                Ok(())
            };
            let flare_stream = time_each(n, 1_000, pair)?;
            let flare_stream_batched = time_batched(batches, BATCH_PAIRS, 0, pair)?;
            let after = stream_pool.snapshot();
            if after.mappings_created != before.mappings_created
                || after.reuse_exact_hits - before.reuse_exact_hits != pairs
            {
                return Err("a segment stream pair was not an exact hit in its heap".into());
            }
            if after.cross_stream_hits != before.cross_stream_hits {
                return Err("a segment stream pair was served across streams".into());
            }
            for p in live {
                stream_pool.free_async_raw(p, stream)?;
            }
            // Before the stream-ordered pool's stream goes: it may record fence
            // events on it until dropped.
            drop(stream_pool);

            let (mut stream_ordered, mut stream_ordered_batched) = (None, None);
            if let Some(sop) = &sop {
                let cur = sop.make_current()?;
                let pair = || {
                    let p = cur.pool_alloc(sop, size)?;
                    cur.pool_free(sop, p)?;
                    Ok(())
                };
                stream_ordered = Some(time_each(n, 1_000, pair)?);
                stream_ordered_batched = Some(time_batched(batches, BATCH_PAIRS, 0, pair)?);
                sop.synchronize()?;
            }
            let vs = |ours: &Stats, alt: &Option<Stats>, p99: bool| {
                alt.as_ref().and_then(|a| {
                    if p99 {
                        ratio(ours.p99_ns, a.p99_ns)
                    } else {
                        ratio(ours.median_ns, a.median_ns)
                    }
                })
            };
            out.push(SegmentPair {
                size_bytes: size,
                ratio_median_sync_vs_stream_ordered: vs(&flare_sync, &stream_ordered, false),
                ratio_p99_sync_vs_stream_ordered: vs(&flare_sync, &stream_ordered, true),
                ratio_batched_sync_vs_stream_ordered: vs(
                    &flare_sync_batched,
                    &stream_ordered_batched,
                    false,
                ),
                ratio_median_stream_vs_stream_ordered: vs(&flare_stream, &stream_ordered, false),
                ratio_p99_stream_vs_stream_ordered: vs(&flare_stream, &stream_ordered, true),
                ratio_batched_stream_vs_stream_ordered: vs(
                    &flare_stream_batched,
                    &stream_ordered_batched,
                    false,
                ),
                flare_sync,
                flare_stream,
                stream_ordered,
                flare_sync_batched,
                flare_stream_batched,
                stream_ordered_batched,
            });
        }
        drop(sop);
        Ok(out)
    }

    fn inflight_frees(&self) -> BoxResult<InflightFrees> {
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

fn timer_overhead() -> f64 {
    stats(
        (0..10_000)
            .map(|_| Instant::now().elapsed().as_nanos() as u64)
            .collect(),
    )
    .median_ns
}

fn targets(r: &Report) -> Vec<Target> {
    let mut out = Vec::new();
    let check = |what: String, limit: f64, measured: Option<f64>| Target {
        met: measured.map(|m| m <= limit),
        what,
        limit,
        measured,
        at_least: false,
    };
    let at_least = |what: String, limit: f64, measured: Option<f64>| Target {
        met: measured.map(|m| m >= limit),
        what,
        limit,
        measured,
        at_least: true,
    };
    for p in &r.reuse_pair {
        out.push(check(
            format!(
                "reuse pair {} / stream-ordered warm pair (median) <= 0.25",
                fmt_bytes(p.size_bytes)
            ),
            0.25,
            p.ratio_median_vs_stream_ordered,
        ));
    }
    for f in &r.fresh_mapping {
        out.push(check(
            format!(
                "fresh mapping {} / raw driver sequence (median) <= 1.05",
                fmt_bytes(f.size_bytes)
            ),
            1.05,
            f.ratio_median,
        ));
    }
    for p in &r.stream_pair {
        out.push(check(
            format!(
                "stream pair {} / cuMemAllocAsync + cuMemFreeAsync pair (median) <= 0.25",
                fmt_bytes(p.size_bytes)
            ),
            0.25,
            p.ratio_median_vs_cu_mem_alloc_async,
        ));
    }
    let f = &r.inflight_frees;
    out.push(check(
        format!(
            "{} free_async of {} in flight / as many cuMemFreeAsync (host time) <= 2",
            f.buffers,
            fmt_bytes(f.buffer_bytes)
        ),
        2.0,
        f.ratio_total_vs_cu_mem_free_async,
    ));
    // Issue 12 (segment mode).
    for p in &r.segment_pair {
        let size = fmt_bytes(p.size_bytes);
        out.push(check(
            format!("segment pair {size} (scope) / stream-ordered warm pair (median) <= 0.1"),
            0.1,
            p.ratio_median_sync_vs_stream_ordered,
        ));
        out.push(check(
            format!("segment stream pair {size} / stream-ordered warm pair (median) <= 0.1"),
            0.1,
            p.ratio_median_stream_vs_stream_ordered,
        ));
    }
    for x in &r.replay {
        out.push(check(
            format!(
                "replay {}: segments peak physical / stream-ordered reserved high <= 1",
                x.trace
            ),
            1.0,
            x.ratio_peak_bytes_segments,
        ));
        out.push(check(
            format!("replay {}: segments handles created <= 100", x.trace),
            100.0,
            Some(x.flare_segments.mappings_created as f64),
        ));
    }
    // Issue 13 (thread caches): throughput of all threads together, and one thread's
    // pair against the stream-ordered pool's.
    for (n, limit) in [(1, 10e6), (8, 60e6), (16, 100e6)] {
        out.push(at_least(
            format!(
                "own sizes, {n} thread(s): reuse pairs per second (all threads) >= {} M",
                limit / 1e6
            ),
            limit,
            r.threads
                .iter()
                .find(|x| x.threads == n)
                .map(|x| x.pairs_per_second),
        ));
    }
    out.push(at_least(
        "shared sizes, cross-thread frees, 16 threads: pairs per second (all threads) >= 20 M"
            .to_string(),
        20e6,
        r.threads_shared
            .iter()
            .find(|x| x.threads == 16)
            .map(|x| x.pairs_per_second),
    ));
    let t = &r.thread_ratios;
    let size = fmt_bytes(t.reuse_pair_bytes);
    out.push(check(
        format!("one thread's reuse pair {size} / stream-ordered warm pair (median) <= 0.05"),
        0.05,
        t.ratio_reuse_pair_vs_stream_ordered,
    ));
    out.push(check(
        format!("one thread's reuse pair {size} / stream-ordered warm pair (batched) <= 0.05"),
        0.05,
        t.ratio_reuse_pair_batched_vs_stream_ordered,
    ));
    out
}

/// Issue 13's ratios from this run's figures: section 6's own sizes against the
/// stream-ordered pool per thread count, and section 1's pair at [`own_size`]`(0)`
/// (2 MiB, the one-thread row's size) against the stream-ordered pool's warm pair.
fn thread_ratios(r: &Report) -> ThreadRatios {
    let sop = r.threads_stream_ordered.as_deref();
    let own_sizes_vs_stream_ordered = r
        .threads
        .iter()
        .map(|x| {
            let so = sop
                .and_then(|v| v.iter().find(|s| s.threads == x.threads))
                .map(|s| s.pairs_per_second);
            ThreadRatio {
                threads: x.threads,
                flare_pairs_per_second: x.pairs_per_second,
                stream_ordered_pairs_per_second: so,
                ratio: so.and_then(|b| ratio(x.pairs_per_second, b)),
            }
        })
        .collect();
    let bytes = own_size(0);
    let pair = r.reuse_pair.iter().find(|p| p.size_bytes == bytes);
    let median = pair.map(|p| p.flare.median_ns);
    let so_median = pair.and_then(|p| p.stream_ordered.map(|s| s.median_ns));
    let batched = pair.map(|p| p.flare_batched.median_ns);
    let so_batched = pair.and_then(|p| p.stream_ordered_batched.map(|s| s.median_ns));
    let vs = |a: Option<f64>, b: Option<f64>| a.zip(b).and_then(|(a, b)| ratio(a, b));
    ThreadRatios {
        own_sizes_vs_stream_ordered,
        reuse_pair_bytes: bytes,
        ratio_reuse_pair_vs_stream_ordered: vs(median, so_median),
        ratio_reuse_pair_batched_vs_stream_ordered: vs(batched, so_batched),
        reuse_pair_median_ns: median,
        stream_ordered_pair_median_ns: so_median,
        reuse_pair_batched_ns: batched,
        stream_ordered_pair_batched_ns: so_batched,
    }
}

fn us(ns: f64) -> String {
    format!("{:.2} µs", ns / 1000.0)
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "n/a".to_string(), f)
}

fn print(r: &Report) {
    println!(
        "flare-bench-gpu: backend {:?}, device {}, {}timer overhead {:.0} ns (included in every pair)\n",
        r.backend,
        r.device,
        if r.quick { "QUICK RUN, " } else { "" },
        r.timer_overhead_ns
    );
    let mut t = Table::new();
    t.set_header(vec![
        "reuse pair",
        "flare median",
        "flare p99",
        "stream-ordered median",
        "stream-ordered p99",
        "cuMemAlloc median",
        "cuMemAlloc p99",
        "ours/stream (median)",
        "ours/cuMemAlloc (median)",
        "batched: flare / stream-ordered",
        "ours/stream (batched)",
    ]);
    for p in &r.reuse_pair {
        t.add_row(vec![
            fmt_bytes(p.size_bytes),
            us(p.flare.median_ns),
            us(p.flare.p99_ns),
            opt(p.stream_ordered, |s| us(s.median_ns)),
            opt(p.stream_ordered, |s| us(s.p99_ns)),
            opt(p.cu_mem_alloc, |s| us(s.median_ns)),
            opt(p.cu_mem_alloc, |s| us(s.p99_ns)),
            opt(p.ratio_median_vs_stream_ordered, |x| format!("{x:.3}")),
            opt(p.ratio_median_vs_cu_mem_alloc, |x| format!("{x:.5}")),
            format!(
                "{} / {}",
                us(p.flare_batched.median_ns),
                opt(p.stream_ordered_batched, |s| us(s.median_ns))
            ),
            opt(p.ratio_batched_vs_stream_ordered, |x| format!("{x:.3}")),
        ]);
    }
    println!("{t}\n");

    let mut t = Table::new();
    t.set_header(vec![
        "fresh mapping",
        "flare median",
        "flare p99",
        "raw driver median",
        "raw driver p99",
        "ours/raw (median)",
        "ours/raw (p99)",
    ]);
    for f in &r.fresh_mapping {
        t.add_row(vec![
            fmt_bytes(f.size_bytes),
            us(f.flare.median_ns),
            us(f.flare.p99_ns),
            us(f.raw_driver.median_ns),
            us(f.raw_driver.p99_ns),
            opt(f.ratio_median, |x| format!("{x:.3}")),
            opt(f.ratio_p99, |x| format!("{x:.3}")),
        ]);
    }
    println!("{t}\n");

    let mut t = Table::new();
    t.set_header(vec![
        "stream pair",
        "flare median",
        "flare p99",
        "cuMemAllocAsync median",
        "cuMemAllocAsync p99",
        "own pool median",
        "ours/cuMemAllocAsync (median)",
        "ours/own pool (median)",
    ]);
    for p in &r.stream_pair {
        t.add_row(vec![
            fmt_bytes(p.size_bytes),
            us(p.flare.median_ns),
            us(p.flare.p99_ns),
            opt(p.cu_mem_alloc_async, |s| us(s.median_ns)),
            opt(p.cu_mem_alloc_async, |s| us(s.p99_ns)),
            opt(p.stream_ordered, |s| us(s.median_ns)),
            opt(p.ratio_median_vs_cu_mem_alloc_async, |x| format!("{x:.3}")),
            opt(p.ratio_median_vs_stream_ordered, |x| format!("{x:.3}")),
        ]);
    }
    println!("{t}\n");

    let f = &r.inflight_frees;
    println!(
        "{} frees of {} buffers in flight per round{}",
        f.buffers,
        fmt_bytes(f.buffer_bytes),
        match (f.kernel_passes, f.kernel_ms) {
            (Some(p), Some(ms)) => format!(" (kernel ahead of them: {p} passes, {ms:.1} ms)"),
            _ => String::new(),
        }
    );
    let mut t = Table::new();
    t.set_header(vec![
        "in-flight frees",
        "rounds",
        "host time (median round)",
        "per free median",
        "per free p99",
        "in flight at the last free",
        "/ cuMemFreeAsync (host time)",
    ]);
    let rows = [
        (
            "flare free_async",
            Some(&f.flare_free_async),
            f.ratio_total_vs_cu_mem_free_async,
        ),
        ("cuMemFreeAsync", f.cu_mem_free_async.as_ref(), Some(1.0)),
        (
            "flare free_raw (synchronous)",
            Some(&f.flare_free_sync),
            f.ratio_total_sync_vs_cu_mem_free_async,
        ),
    ];
    for (what, batch, vs) in rows {
        let Some(b) = batch else { continue };
        t.add_row(vec![
            what.to_string(),
            b.rounds.to_string(),
            us(b.total_ns_median),
            us(b.per_free.median_ns),
            us(b.per_free.p99_ns),
            if b.in_flight_at_last_free {
                "yes"
            } else {
                "no"
            }
            .to_string(),
            opt(vs, |x| format!("{x:.3}")),
        ]);
    }
    println!("{t}\n");

    let mut t = Table::new();
    t.set_header(vec![
        "trace",
        "events",
        "policy",
        "flare time",
        "flare peak physical",
        "/ lower bound",
        "handles created",
        "flare free before/after",
        "stream-ordered time",
        "stream-ordered reserved high",
        "ours/stream time",
        "ours/stream peak",
    ]);
    for p in &r.replay {
        let so = p.stream_ordered.as_ref();
        let rows = [
            (&p.flare, p.ratio_seconds, p.ratio_peak_bytes),
            (
                &p.flare_segments,
                p.ratio_seconds_segments,
                p.ratio_peak_bytes_segments,
            ),
        ];
        for (f, vs_time, vs_peak) in rows {
            t.add_row(vec![
                p.trace.clone(),
                p.events.to_string(),
                f.policy.to_string(),
                format!("{:.2} ms", f.seconds * 1e3),
                fmt_bytes(f.peak_physical_bytes),
                opt(f.ratio_peak_vs_lower_bound, |x| format!("{x:.3}")),
                f.mappings_created.to_string(),
                match (f.mem_free_before, f.mem_free_after) {
                    (Some(b), Some(a)) => format!("{} / {}", fmt_bytes(b), fmt_bytes(a)),
                    _ => "n/a".to_string(),
                },
                opt(so, |s| match &s.error {
                    Some(e) => format!("failed: {e}"),
                    None => format!("{:.2} ms", s.seconds * 1e3),
                }),
                opt(so, |s| fmt_bytes(s.reserved_high_bytes)),
                opt(vs_time, |x| format!("{x:.3}")),
                opt(vs_peak, |x| format!("{x:.3}")),
            ]);
        }
    }
    println!("{t}\n");

    print_threads(r);
    print_sleep_wake(&r.sleep_wake);

    let mut t = Table::new();
    t.set_header(vec![
        "segment pair",
        "scope median / p99",
        "stream median / p99",
        "stream-ordered median / p99",
        "batched: scope / stream / stream-ordered",
        "scope/stream-ordered (median)",
        "stream/stream-ordered (median)",
        "batched ratios (scope, stream)",
    ]);
    let pair = |s: &Stats| format!("{} / {}", us(s.median_ns), us(s.p99_ns));
    for p in &r.segment_pair {
        t.add_row(vec![
            fmt_bytes(p.size_bytes),
            pair(&p.flare_sync),
            pair(&p.flare_stream),
            opt(p.stream_ordered.as_ref(), pair),
            format!(
                "{} / {} / {}",
                us(p.flare_sync_batched.median_ns),
                us(p.flare_stream_batched.median_ns),
                opt(p.stream_ordered_batched, |s| us(s.median_ns))
            ),
            opt(p.ratio_median_sync_vs_stream_ordered, |x| format!("{x:.3}")),
            opt(p.ratio_median_stream_vs_stream_ordered, |x| {
                format!("{x:.3}")
            }),
            match (
                p.ratio_batched_sync_vs_stream_ordered,
                p.ratio_batched_stream_vs_stream_ordered,
            ) {
                (Some(a), Some(b)) => format!("{a:.3}, {b:.3}"),
                _ => "n/a".to_string(),
            },
        ]);
    }
    println!("{t}\n");

    let mut t = Table::new();
    t.set_header(vec!["target", "measured", "met"]);
    for x in &r.targets {
        t.add_row(vec![
            x.what.clone(),
            opt(x.measured, |m| {
                if m.abs() >= 1e5 {
                    format!("{m:.3e}")
                } else {
                    format!("{m:.3}")
                }
            }),
            opt(x.met, |m| if m { "yes" } else { "NO" }.to_string()),
        ]);
    }
    println!("{t}");
}

/// Section 8's table.
fn print_sleep_wake(s: &SleepWake) {
    let gbs = |v: Option<f64>| opt(v, |b| format!("{:.1} GB/s", b / 1e9));
    println!(
        "host copy bandwidth (1 GiB, pinned): to host {}, to device {}",
        gbs(s.copy_to_host_bytes_per_second),
        gbs(s.copy_to_device_bytes_per_second)
    );
    let secs = |v: Option<f64>| opt(v, |x| format!("{:.0} ms", x * 1e3));
    let rate = |x: f64| format!("{:.1} GB/s", s.host_bytes as f64 / x / 1e9);
    println!(
        "host memory of {} apart from the copy: cuMemHostAlloc {}, cuMemFreeHost {}; \
         pageable, one thread: first touch (copy into fresh memory) {} ({}), warm copy {} ({})",
        fmt_bytes(s.host_bytes),
        secs(s.pinned_alloc_seconds),
        secs(s.pinned_free_seconds),
        secs(Some(s.pageable_first_touch_seconds)),
        rate(s.pageable_first_touch_seconds),
        secs(Some(s.pageable_warm_copy_seconds)),
        rate(s.pageable_warm_copy_seconds)
    );
    let mut t = Table::new();
    t.set_header(vec![
        "sleep / wake",
        "policy",
        "mode",
        "first sleep / wake",
        "sleep",
        "wake",
        "free memory rose by",
        "sleep bandwidth (of copy)",
        "wake bandwidth (of copy)",
    ]);
    for r in &s.rows {
        let of = |bw: Option<f64>, x: Option<f64>| {
            format!("{} ({})", gbs(bw), opt(x, |v| format!("{:.0}%", v * 100.0)))
        };
        t.add_row(vec![
            format!("{} x {}", r.allocations, fmt_bytes(r.allocation_bytes)),
            r.policy.to_string(),
            r.mode.to_string(),
            format!(
                "{:.1} / {:.1} ms",
                r.first_sleep_seconds * 1e3,
                r.first_wake_seconds * 1e3
            ),
            format!("{:.1} ms", r.sleep_seconds * 1e3),
            format!("{:.1} ms", r.wake_seconds * 1e3),
            opt(r.free_rise_bytes, fmt_bytes),
            of(r.sleep_bytes_per_second, r.sleep_vs_copy),
            of(r.wake_bytes_per_second, r.wake_vs_copy),
        ]);
    }
    println!("{t}\n");
}

/// Section 6's tables and issue 13's ratios.
fn print_threads(r: &Report) {
    println!(
        "thread caches: {} entries, {} per thread{}",
        r.thread_cache_entries,
        fmt_bytes(r.thread_cache_bytes),
        if r.thread_cache_entries == 0 {
            " (off)"
        } else {
            ""
        }
    );
    let counters = ["misses", "thread-cache hits", "remote frees"];
    let mut t = Table::new();
    let mut header = vec!["threads (own sizes)", "pairs", "pairs per second"];
    header.extend(counters);
    t.set_header(header);
    for x in &r.threads {
        t.add_row(vec![
            x.threads.to_string(),
            x.pairs.to_string(),
            format!("{:.3e}", x.pairs_per_second),
            x.misses.to_string(),
            x.thread_cache_hits.to_string(),
            x.remote_frees.to_string(),
        ]);
    }
    println!("{t}\n");

    println!(
        "shared sizes, cross-thread frees: thread t allocates {} in turn and hands each \
         to thread t + 1 (a queue of {SHARED_QUEUE}), which frees it; one thread frees \
         its own, through its queue",
        SHARED_SIZES.map(fmt_bytes).join(", ")
    );
    let mut t = Table::new();
    let mut header = vec!["threads (shared sizes)", "pairs", "pairs per second"];
    header.extend(counters);
    t.set_header(header);
    for x in &r.threads_shared {
        t.add_row(vec![
            format!(
                "{}{}",
                x.threads,
                if x.cross_thread { "" } else { " (same thread)" }
            ),
            x.pairs.to_string(),
            format!("{:.3e}", x.pairs_per_second),
            x.misses.to_string(),
            x.thread_cache_hits.to_string(),
            x.remote_frees.to_string(),
        ]);
    }
    println!("{t}\n");

    match &r.threads_stream_ordered {
        None => println!(
            "stream-ordered pool, one stream per thread: not measured (--backend {:?})\n",
            r.backend
        ),
        Some(rows) => {
            let mut t = Table::new();
            t.set_header(vec![
                "threads (stream-ordered pool, a stream each)",
                "pairs",
                "pairs per second",
            ]);
            for x in rows {
                t.add_row(vec![
                    x.threads.to_string(),
                    x.pairs.to_string(),
                    format!("{:.3e}", x.pairs_per_second),
                ]);
            }
            println!("{t}\n");
        }
    }

    let tr = &r.thread_ratios;
    let per_threads: Vec<String> = tr
        .own_sizes_vs_stream_ordered
        .iter()
        .map(|x| format!("{}: {}", x.threads, opt(x.ratio, |v| format!("{v:.2}"))))
        .collect();
    let ns = |v: Option<f64>| opt(v, |v| format!("{v:.1} ns"));
    println!(
        "ratios (issue 13): own sizes, flare / stream-ordered pairs per second by threads: \
         {}; one thread's reuse pair {} / stream-ordered warm pair: median {} ({} / {}), \
         batched {} ({} / {})\n",
        per_threads.join(", "),
        fmt_bytes(tr.reuse_pair_bytes),
        opt(tr.ratio_reuse_pair_vs_stream_ordered, |v| format!("{v:.3}")),
        ns(tr.reuse_pair_median_ns),
        ns(tr.stream_ordered_pair_median_ns),
        opt(tr.ratio_reuse_pair_batched_vs_stream_ordered, |v| {
            format!("{v:.3}")
        }),
        ns(tr.reuse_pair_batched_ns),
        ns(tr.stream_ordered_pair_batched_ns),
    );
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

fn write_json(path: &Path, report: &Report) -> BoxResult<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
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

/// Mappings created, thread-cache hits and remote frees between two snapshots.
fn cache_counts(
    before: &flare_package::Snapshot,
    after: &flare_package::Snapshot,
) -> (u64, u64, u64) {
    (
        after
            .mappings_created
            .saturating_sub(before.mappings_created),
        after
            .thread_cache_hits
            .saturating_sub(before.thread_cache_hits),
        after.remote_frees.saturating_sub(before.remote_frees),
    )
}
