//! The report: every section's figures, issue 13's ratios, the targets each figure
//! is held to, and the JSON file.

use std::path::Path;

use serde::Serialize;

use flare_package::fmt_bytes;

use crate::fresh_mapping::FreshMapping;
use crate::harness::ratio;
use crate::inflight_frees::InflightFrees;
use crate::replay::Replay;
use crate::reuse_pair::ReusePair;
use crate::segment_pair::SegmentPair;
use crate::sleep_wake::SleepWake;
use crate::stream_pair::StreamPair;
use crate::threads::{own_size, SharedThreads, StreamOrderedThreads, Threads};
use crate::{BackendArg, BoxResult};

/// Own-sizes pairs per second, ours and the stream-ordered pool's, at one thread
/// count.
#[derive(Debug, Serialize)]
pub(crate) struct ThreadRatio {
    pub(crate) threads: usize,
    pub(crate) flare_pairs_per_second: f64,
    pub(crate) stream_ordered_pairs_per_second: Option<f64>,
    /// ours / the stream-ordered pool's pairs per second.
    pub(crate) ratio: Option<f64>,
}

/// Issue 13's ratios, from figures of this run.
#[derive(Debug, Default, Serialize)]
pub(crate) struct ThreadRatios {
    /// Section 6, own sizes against the stream-ordered pool, per thread count.
    pub(crate) own_sizes_vs_stream_ordered: Vec<ThreadRatio>,
    /// One thread's reuse pair: section 1 at this size (2 MiB).
    pub(crate) reuse_pair_bytes: u64,
    /// Section 1's per-pair medians (the timer's overhead included in both) and
    /// their ratio ours / stream-ordered warm pair.
    pub(crate) reuse_pair_median_ns: Option<f64>,
    pub(crate) stream_ordered_pair_median_ns: Option<f64>,
    pub(crate) ratio_reuse_pair_vs_stream_ordered: Option<f64>,
    /// Section 1's batch medians (the timer's overhead spread over a batch) and
    /// their ratio.
    pub(crate) reuse_pair_batched_ns: Option<f64>,
    pub(crate) stream_ordered_pair_batched_ns: Option<f64>,
    pub(crate) ratio_reuse_pair_batched_vs_stream_ordered: Option<f64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Target {
    pub(crate) what: String,
    pub(crate) limit: f64,
    pub(crate) measured: Option<f64>,
    pub(crate) met: Option<bool>,
    /// Whether the target is a floor (`measured >= limit`, a throughput) rather
    /// than a ceiling (`measured <= limit`).
    pub(crate) at_least: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) backend: BackendArg,
    pub(crate) device: i32,
    pub(crate) quick: bool,
    /// Median cost of one `Instant::now()` + `elapsed()`, included in every per-pair
    /// time.
    pub(crate) timer_overhead_ns: f64,
    pub(crate) mem_total_bytes: Option<u64>,
    pub(crate) reuse_pair: Vec<ReusePair>,
    pub(crate) fresh_mapping: Vec<FreshMapping>,
    pub(crate) stream_pair: Vec<StreamPair>,
    pub(crate) inflight_frees: InflightFrees,
    pub(crate) replay: Vec<Replay>,
    /// Every pool's thread-cache bounds (`PoolConfig`): entries (0: off) and bytes.
    pub(crate) thread_cache_entries: u32,
    pub(crate) thread_cache_bytes: u64,
    /// Section 6: own sizes.
    pub(crate) threads: Vec<Threads>,
    /// Section 6: shared sizes, cross-thread frees.
    pub(crate) threads_shared: Vec<SharedThreads>,
    /// Section 6: the stream-ordered pool, one stream per thread (null on the
    /// simulated backend).
    pub(crate) threads_stream_ordered: Option<Vec<StreamOrderedThreads>>,
    /// Section 6: issue 13's ratios.
    pub(crate) thread_ratios: ThreadRatios,
    pub(crate) segment_pair: Vec<SegmentPair>,
    /// Section 8: sleep and wake.
    pub(crate) sleep_wake: SleepWake,
    pub(crate) targets: Vec<Target>,
    pub(crate) total_seconds: f64,
}

pub(crate) fn targets(r: &Report) -> Vec<Target> {
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
pub(crate) fn thread_ratios(r: &Report) -> ThreadRatios {
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

pub(crate) fn write_json(path: &Path, report: &Report) -> BoxResult<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}
