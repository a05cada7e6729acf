//! Work in flight on the real GPU: a kernel keeps reading an allocation for about
//! 0.7 s while the caller frees it outside a retention scope. The pool's release
//! synchronizes before it unmaps, so the kernel finishes with the right sum and the
//! context stays healthy. Ignored by default (CI has no GPU); fails loudly without
//! one.

use crate::common;
use crate::one_at_a_time::one_at_a_time;

use common::kernels::{SumRun, PTX};
use common::MIB;
use flare_package::driver::cuda::CudaDriver;
use flare_package::{Driver, Pool, PoolConfig};
use std::sync::Arc;
use std::time::Instant;

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_free_outside_a_scope_waits_for_the_kernel_reading_it() {
    let _serial = one_at_a_time();
    let d =
        Arc::new(CudaDriver::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}")));
    let pool = Pool::with_driver(PoolConfig::cuda(0), d.clone()).unwrap();
    let kernel = d.load_test_kernel(PTX, "sum_repeat").unwrap();
    let bytes = 512 * MIB;
    let n = bytes / 4;
    let data = pool.allocate_raw(bytes).unwrap();
    let out = pool.allocate_raw(4).unwrap();
    // SAFETY: `data` is a live allocation of `bytes` bytes, owned by this test.
    unsafe { d.memset_d8(data, 3, bytes) }.unwrap(); // every u32 is 0x03030303
    let run = SumRun {
        driver: &d,
        device: 0,
        kernel: &kernel,
        data,
        n,
        out,
        fill: 3,
    };
    // SAFETY: `data` and `out` are live allocations of this test.
    let (one, iters) = unsafe { run.calibrate() };

    // The kernel reads `data` for ~0.7 s; free it now, outside a scope (release
    // threshold 0: released at once: synchronize, unmap, release, free the VA).
    let t = Instant::now();
    // SAFETY: as above; `data` is freed while the kernel runs: the pool's free
    // synchronizes before it unmaps (what this test checks).
    unsafe { run.launch(iters) };
    pool.free_raw(data).unwrap();
    let free_took = t.elapsed();
    let s = pool.snapshot();
    assert_eq!(
        (s.mappings_released, s.sync_failures, s.unmap_failures),
        (1, 0, 0)
    );
    // The context is healthy and the kernel read the right data to the end.
    d.synchronize(0)
        .unwrap_or_else(|e| panic!("the kernel faulted: the range was unmapped under it: {e}"));
    assert_eq!(
        run.read_out(),
        run.expected(iters),
        "kernel result after the free"
    );
    assert!(
        free_took >= one.mul_f64(iters as f64 / 4.0),
        "the free returned in {free_took:?}, before the kernel (~{:?}) could have finished",
        one.mul_f64(iters as f64)
    );
    // Still usable: a fresh allocation, written and read back.
    let again = pool.allocate_raw(2 * MIB).unwrap();
    // SAFETY: `again` is a live 2 MiB allocation, owned by this test.
    unsafe { d.memset_d8(again, 7, 2 * MIB) }.unwrap();
    let mut back = vec![0u8; 16];
    d.copy_dtoh(again, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 7));
    pool.free_raw(again).unwrap();
    pool.free_raw(out).unwrap();
    d.unload_test_kernel(kernel).unwrap();
    assert_eq!(pool.snapshot().physical_bytes, 0);
}
