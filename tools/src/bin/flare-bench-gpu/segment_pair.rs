//! Section 7: the segment-mode pairs (synchronous and on a stream) against the
//! stream-ordered pool's warm pair.

use serde::Serialize;

use flare_package::{fmt_bytes, DevicePtr, Pool, PoolConfig, ReusePolicy};
use flare_tools::cuda_baseline::StreamOrderedPool;

use crate::harness::{ratio, sim_stream, time_batched, time_each, Stats};
use crate::{Bench, BoxResult, BATCH_PAIRS, GIB, KIB, MIB};

/// Section 7's sizes: small tensors (the heaps' small class, up to 1 MiB), then the
/// whole-mapping sizes.
const SEGMENT_PAIR_SIZES: [u64; 6] = [4 * KIB, 64 * KIB, MIB, 2 * MIB, 64 * MIB, GIB];

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

#[derive(Debug, Serialize)]
pub(crate) struct SegmentPair {
    pub(crate) size_bytes: u64,
    /// `allocate_raw` + `free_raw` in segment mode, inside a retention scope.
    pub(crate) flare_sync: Stats,
    /// `allocate_async_raw` + `free_async_raw` in segment mode, on one stream.
    pub(crate) flare_stream: Stats,
    /// `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` on the same stream (own pool,
    /// warm).
    pub(crate) stream_ordered: Option<Stats>,
    /// The same three, timed in batches of `BATCH_PAIRS` pairs: statistics of each
    /// batch's mean pair.
    pub(crate) flare_sync_batched: Stats,
    pub(crate) flare_stream_batched: Stats,
    pub(crate) stream_ordered_batched: Option<Stats>,
    /// ours (synchronous pair) / stream-ordered pool's pair: medians, p99s, batch
    /// medians.
    pub(crate) ratio_median_sync_vs_stream_ordered: Option<f64>,
    pub(crate) ratio_p99_sync_vs_stream_ordered: Option<f64>,
    pub(crate) ratio_batched_sync_vs_stream_ordered: Option<f64>,
    /// ours (stream pair) / stream-ordered pool's pair: medians, p99s, batch medians.
    pub(crate) ratio_median_stream_vs_stream_ordered: Option<f64>,
    pub(crate) ratio_p99_stream_vs_stream_ordered: Option<f64>,
    pub(crate) ratio_batched_stream_vs_stream_ordered: Option<f64>,
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

impl Bench {
    /// Section 7: the segment-mode pairs against the stream-ordered pool's pair.
    pub(crate) fn segment_pairs(&self) -> BoxResult<Vec<SegmentPair>> {
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
}
