//! Eight threads hammering one pool on the real CUDA driver (device 0), the same mix
//! as `tests/stress.rs` with smaller sizes and fewer operations (a few seconds on an
//! H200). None of the worker threads ever makes a CUDA context current: the pool
//! pushes and pops its own context around every driver call, so plain threads work.
//!
//! Ignored by default; run on a GPU machine with `--include-ignored` (fails loudly
//! without a GPU). `FLARE_STRESS_OPS` sets the operations per thread (default 2 000).
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::hammer::{hammer, ops_per_thread, Params};
use common::*;

#[test]
#[ignore = "needs a CUDA GPU"]
fn eight_threads_on_the_real_driver() {
    let pool = Arc::new(pool(On::Cuda, flare_package::ReusePolicy::BestFit));
    let r = hammer(
        pool.clone(),
        Params {
            threads: 8,
            scope_threads: 2,
            ops: ops_per_thread(2_000),
            max_live: 4,
            max_bytes: 256 * MIB,
            limit: Duration::from_secs(60),
            captures: false,
            small_sizes: false,
        },
    );
    println!("real driver: {r:?}");
    let s = check(&pool);
    assert_eq!(s.physical_bytes, 0);
}
