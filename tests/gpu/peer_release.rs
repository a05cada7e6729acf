//! Two GPUs: a release waits for the peer's work too (issue 9). A kernel on device 1
//! keeps reading, over the peer link, a buffer of a device-0 pool that grants
//! device 1 access; the buffer is freed outside a retention scope while the kernel
//! runs. `cuCtxSynchronize` waits only for its own context's work, so a release that
//! synchronized device 0 alone would unmap under the kernel (an illegal address on
//! device 1, sticky). The pool synchronizes every device with access: the kernel ends
//! with the right sum and both contexts stay healthy.
//!
//! Ignored by default; needs two CUDA GPUs (kind `nvidia-h200-x2`) and fails loudly
//! with fewer.

use crate::common;
use crate::one_at_a_time::one_at_a_time;

use common::kernels::{SumRun, PTX};
use common::MIB;
use flare_package::driver::cuda::CudaDriver;
use flare_package::{Backend, Driver, Pool, PoolConfig};
use std::sync::Arc;
use std::time::Instant;

#[test]
#[ignore = "needs two CUDA GPUs"]
fn gpu_free_waits_for_a_peer_kernel_reading_it() {
    let _serial = one_at_a_time();
    let need = |e| panic!("this test needs two CUDA GPUs: {e}");
    let d0 = Arc::new(CudaDriver::with_peers(0, &[1]).unwrap_or_else(need));
    let d1 = Arc::new(CudaDriver::new(1).unwrap_or_else(need));
    let pool0 = Pool::with_driver(
        PoolConfig {
            backend: Backend::Cuda,
            device: 0,
            peer_devices: vec![1],
            ..PoolConfig::default()
        },
        d0.clone(),
    )
    .unwrap();
    let pool1 = Pool::with_driver(PoolConfig::cuda(1), d1.clone()).unwrap();
    let kernel = d1.load_test_kernel(PTX, "sum_repeat").unwrap();
    let bytes = 256 * MIB;
    let n = bytes / 4;
    let data = pool0.allocate_raw(bytes).unwrap();
    let out = pool1.allocate_raw(4).unwrap();
    // SAFETY: `data` is a live allocation of `bytes` bytes of this test.
    unsafe { d0.memset_d8(data, 5, bytes) }.unwrap(); // every u32 is 0x05050505
    d0.synchronize(0).unwrap();
    let run = SumRun {
        driver: &d1,
        device: 1,
        kernel: &kernel,
        data,
        n,
        out,
        fill: 5,
    };
    // Calibrate on device 1: one pass over the device-0 buffer through the peer link.
    // SAFETY: `data` (device 0, access granted to device 1) and `out` (device 1) are
    // live allocations of this test.
    let (one, iters) = unsafe { run.calibrate() };
    let t = Instant::now();
    // SAFETY: as above; `data` is freed while the kernel runs: the pool's release
    // synchronizes devices 0 and 1 before it unmaps (what this test checks).
    unsafe { run.launch(iters) };
    // Outside a scope, threshold 0: released at once, after synchronizing devices 0
    // and 1.
    pool0.free_raw(data).unwrap();
    let free_took = t.elapsed();
    let s = pool0.snapshot();
    assert_eq!(
        (s.mappings_released, s.sync_failures, s.unmap_failures),
        (1, 0, 0)
    );
    d1.synchronize(1).unwrap_or_else(|e| {
        panic!("the peer kernel faulted: the range was unmapped under it: {e}")
    });
    let sum = run.read_out();
    println!(
        "peer kernel: {iters} passes over {} MiB of device-0 memory from device 1, ~{:?}; \
         free returned after {free_took:?}; sum {sum:#x} (expected {:#x})",
        bytes / MIB,
        one.mul_f64(iters as f64),
        run.expected(iters)
    );
    assert_eq!(
        sum,
        run.expected(iters),
        "peer kernel result after the free"
    );
    assert!(
        free_took >= one.mul_f64(iters as f64 / 4.0),
        "the free returned in {free_took:?}, before the peer kernel (~{:?}) could have \
         finished",
        one.mul_f64(iters as f64)
    );
    // Device 0 is healthy too: a fresh allocation there, written and read back.
    let again = pool0.allocate_raw(2 * MIB).unwrap();
    // SAFETY: `again` is a live 2 MiB allocation of this test.
    unsafe { d0.memset_d8(again, 9, 2 * MIB) }.unwrap();
    let mut back = vec![0u8; 16];
    d0.copy_dtoh(again, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 9));
    pool0.free_raw(again).unwrap();
    pool1.free_raw(out).unwrap();
    d1.unload_test_kernel(kernel).unwrap();
    assert_eq!(pool0.snapshot().physical_bytes, 0);
}
