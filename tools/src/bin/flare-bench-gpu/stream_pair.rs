//! Section 3: the stream pair against `cuMemAllocAsync` + `cuMemFreeAsync` and the
//! stream-ordered pool's warm pair on the same stream.

use serde::Serialize;

use flare_package::fmt_bytes;
use flare_tools::cuda_baseline::StreamOrderedPool;

use crate::harness::{ratio, sim_stream, time_each, Stats};
use crate::{Bench, BoxResult, SIZES};

#[derive(Debug, Serialize)]
pub(crate) struct StreamPair {
    pub(crate) size_bytes: u64,
    /// `allocate_async_raw` + `free_async_raw` on one stream.
    pub(crate) flare: Stats,
    /// `cuMemAllocAsync` + `cuMemFreeAsync` on the same stream (device's pool).
    pub(crate) cu_mem_alloc_async: Option<Stats>,
    /// `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` on the same stream (own pool).
    pub(crate) stream_ordered: Option<Stats>,
    /// ours / cuMemAllocAsync pair.
    pub(crate) ratio_median_vs_cu_mem_alloc_async: Option<f64>,
    pub(crate) ratio_p99_vs_cu_mem_alloc_async: Option<f64>,
    /// ours / own stream-ordered pool's pair.
    pub(crate) ratio_median_vs_stream_ordered: Option<f64>,
}

impl Bench {
    pub(crate) fn stream_pairs(&self) -> BoxResult<Vec<StreamPair>> {
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
}
