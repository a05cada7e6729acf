//! Section 2: a fresh mapping against the raw driver sequence it wraps.

use std::time::Instant;

use serde::Serialize;

use flare_package::{fmt_bytes, Pool};
use flare_tools::cuda_baseline::raw_mapping_cycle;

use crate::harness::{ratio, stats, Stats};
use crate::{Bench, BoxResult, GIB, SIZES};

#[derive(Debug, Serialize)]
pub(crate) struct FreshMapping {
    pub(crate) size_bytes: u64,
    pub(crate) flare: Stats,
    pub(crate) raw_driver: Stats,
    /// ours / raw sequence, medians.
    pub(crate) ratio_median: Option<f64>,
    pub(crate) ratio_p99: Option<f64>,
}

impl Bench {
    pub(crate) fn fresh_mappings(&self) -> BoxResult<Vec<FreshMapping>> {
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
}
