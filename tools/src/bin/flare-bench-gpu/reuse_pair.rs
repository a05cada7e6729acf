//! Section 1: the reuse pair against the stream-ordered pool's warm pair and
//! `cuMemAlloc_v2` + `cuMemFree_v2`.

use serde::Serialize;

use flare_package::{fmt_bytes, Pool};
use flare_tools::cuda_baseline::{make_current, StreamOrderedPool};

use crate::harness::{ratio, time_batched, time_each, Stats};
use crate::{Bench, BoxResult, BATCH_PAIRS, GIB, SIZES};

#[derive(Debug, Serialize)]
pub(crate) struct ReusePair {
    pub(crate) size_bytes: u64,
    pub(crate) flare: Stats,
    pub(crate) stream_ordered: Option<Stats>,
    pub(crate) cu_mem_alloc: Option<Stats>,
    /// Ours and the stream-ordered pool's, timed in batches of `BATCH_PAIRS` pairs:
    /// statistics of each batch's mean pair.
    pub(crate) flare_batched: Stats,
    pub(crate) stream_ordered_batched: Option<Stats>,
    /// ours / stream-ordered pool, medians.
    pub(crate) ratio_median_vs_stream_ordered: Option<f64>,
    pub(crate) ratio_p99_vs_stream_ordered: Option<f64>,
    /// ours / stream-ordered pool, batch medians.
    pub(crate) ratio_batched_vs_stream_ordered: Option<f64>,
    /// ours / cuMemAlloc + cuMemFree, medians.
    pub(crate) ratio_median_vs_cu_mem_alloc: Option<f64>,
    pub(crate) ratio_p99_vs_cu_mem_alloc: Option<f64>,
}

impl Bench {
    pub(crate) fn reuse_pairs(&self) -> BoxResult<Vec<ReusePair>> {
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
}
