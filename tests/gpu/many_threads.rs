//! Eight threads hammering one pool on the real CUDA driver (device 0), the same
//! mixes as `tests/pool/many_threads.rs` (the plain one, and the thread caches' with frees
//! passed between threads) with smaller sizes and fewer operations (a few seconds on
//! an H200). None of the worker threads ever makes a CUDA context current: the pool
//! pushes and pops its own context around every driver call, so plain threads work.
//!
//! Ignored by default; run on a GPU machine with `--include-ignored` (fails loudly
//! without a GPU). `FLARE_STRESS_OPS` sets the operations per thread (default 2 000).

use crate::common;
use crate::one_at_a_time::one_at_a_time;

use std::sync::Arc;
use std::time::Duration;

use common::hammer::caches::{hammer_caches, CacheParams, Memory};
use common::hammer::{hammer, ops_per_thread, Params};
use common::*;
use flare_package::driver::cuda::CudaDriver;
use flare_package::{DevicePtr, Driver, Pool, PoolConfig};

#[test]
#[ignore = "needs a CUDA GPU"]
fn eight_threads_on_the_real_driver() {
    let _serial = one_at_a_time();
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

/// [`Memory`] on the GPU: each allocation gets its own byte pattern (from its tag)
/// in its first and last 4 KiB, written with a synchronous copy when it is handed
/// out and read back right before it is freed, by whichever thread frees it: two
/// live allocations that shared memory, or memory unmapped while live, would fail.
struct GpuMemory(Arc<CudaDriver>);

/// How many bytes of each end of an allocation carry its pattern.
const PATTERN_BYTES: u64 = 4096;

fn pattern(tag: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ tag.wrapping_mul(0x9E37_79B9)) as u8)
        .collect()
}

/// The ranges of an allocation of `bytes` that carry a pattern, with their tags:
/// its head, and its tail when the two do not overlap.
fn pattern_ranges(ptr: DevicePtr, bytes: u64, tag: u64) -> Vec<(DevicePtr, u64, u64)> {
    let n = bytes.min(PATTERN_BYTES);
    let mut v = vec![(ptr, n, tag)];
    if bytes >= 2 * PATTERN_BYTES {
        v.push((ptr + bytes - PATTERN_BYTES, PATTERN_BYTES, !tag));
    }
    v
}

impl Memory for GpuMemory {
    fn fill(&self, ptr: DevicePtr, bytes: u64, tag: u64) {
        for (p, n, t) in pattern_ranges(ptr, bytes, tag) {
            // SAFETY: `[p, p + n)` lies in a live allocation of the test's pool (with
            // access granted to device 0) that only the calling thread uses until it
            // frees it or passes it on, after this synchronous copy returns.
            unsafe { self.0.copy_htod(p, &pattern(t, n)) }.unwrap();
        }
    }

    fn check(&self, ptr: DevicePtr, bytes: u64, tag: u64) {
        for (p, n, t) in pattern_ranges(ptr, bytes, tag) {
            let mut back = vec![0u8; n as usize];
            self.0.copy_dtoh(p, &mut back).unwrap();
            assert!(
                back == pattern(t, n),
                "allocation {ptr:#x} ({bytes} B, tag {tag:#x}) lost its data at {p:#x}"
            );
        }
    }
}

/// Eight threads through the thread caches (issue 13) on the real driver: each
/// allocates from its own few sizes (up to 8 MiB; most allocations are cache hits),
/// writes its pattern, and a quarter of the frees are passed to another thread,
/// which checks the pattern and frees it (remote frees); a controller begins and
/// finishes scopes and trims meanwhile. At the end the counts are exact, nothing is
/// held, and the device's free memory is back where it was.
#[test]
#[ignore = "needs a CUDA GPU"]
fn eight_threads_through_the_thread_caches_on_the_real_driver() {
    let _serial = one_at_a_time();
    let d =
        Arc::new(CudaDriver::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}")));
    let base = d.mem_info().unwrap().free;
    for threshold in [0, u64::MAX] {
        let config = PoolConfig {
            release_threshold_bytes: threshold,
            ..PoolConfig::cuda(0)
        };
        let pool = Arc::new(Pool::with_driver(config, d.clone()).unwrap());
        let r = hammer_caches(
            pool.clone(),
            CacheParams {
                threads: 8,
                ops: ops_per_thread(2_000),
                max_live: 4,
                sizes: 4,
                max_bytes: 8 * MIB,
                small_sizes: false,
                cross_percent: 25,
                inbox: 32,
                limit: Duration::from_secs(120),
            },
            Arc::new(GpuMemory(d.clone())),
        );
        println!("real driver, release threshold {threshold}: {r:?}");
        let e = r.end;
        assert_eq!(e.allocations, e.reuse_hits + e.mappings_created, "{e:#?}");
        if threshold == u64::MAX {
            assert!(e.remote_frees > 0, "{e:#?}");
        }
        let s = check(&pool);
        assert_eq!((s.physical_bytes, s.reserved_bytes), (0, 0));
    }
    // Other processes may use the device: allow them 64 MiB of drift.
    let after = d.mem_info().unwrap().free;
    assert!(
        after + 64 * MIB >= base,
        "free memory {after} after, {base} before"
    );
}
