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
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use common::kernels::{PTX, THREADS};
use common::MIB;
use flare_package::driver::cuda::CudaDriver;
use flare_package::{Backend, Driver, Pool, PoolConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
#[ignore = "needs two CUDA GPUs"]
fn gpu_free_waits_for_a_peer_kernel_reading_it() {
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
    let expected = |iters: u64| {
        0x0505_0505u32
            .wrapping_mul(n as u32)
            .wrapping_mul(iters as u32)
    };
    let read_out = || {
        let mut word = [0u8; 4];
        d1.copy_dtoh(out, &mut word).unwrap();
        u32::from_le_bytes(word)
    };

    // Calibrate on device 1: one pass over the device-0 buffer through the peer link.
    // SAFETY: `out` is a live 4-byte allocation of this test (device 1).
    unsafe { d1.memset_d8(out, 0, 4) }.unwrap();
    d1.synchronize(1).unwrap();
    let t = Instant::now();
    // SAFETY: `sum_repeat` takes four 64-bit parameters (data, count, passes, out);
    // it reads `n` u32 of `data` (device 0, access granted to device 1) and adds to
    // the u32 at `out`; both stay live until the synchronize below.
    unsafe { d1.launch_test_kernel(&kernel, 1, THREADS, &[data, n, 1, out]) }.unwrap();
    d1.synchronize(1).unwrap();
    let one = t.elapsed().max(Duration::from_micros(50));
    assert_eq!(read_out(), expected(1), "one peer pass sums right");
    let iters = (Duration::from_millis(700).as_secs_f64() / one.as_secs_f64()).ceil() as u64;
    let iters = iters.clamp(1, 1 << 20);

    // SAFETY: as above.
    unsafe { d1.memset_d8(out, 0, 4) }.unwrap();
    d1.synchronize(1).unwrap();
    let t = Instant::now();
    // SAFETY: the same parameters as above. `data` is freed while the kernel runs:
    // the pool's release synchronizes devices 0 and 1 before it unmaps (what this
    // test checks); `out` stays live to the end.
    unsafe { d1.launch_test_kernel(&kernel, 1, THREADS, &[data, n, iters, out]) }.unwrap();
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
    let sum = read_out();
    println!(
        "peer kernel: {iters} passes over {} MiB of device-0 memory from device 1, ~{:?}; \
         free returned after {free_took:?}; sum {sum:#x} (expected {:#x})",
        bytes / MIB,
        one.mul_f64(iters as f64),
        expected(iters)
    );
    assert_eq!(sum, expected(iters), "peer kernel result after the free");
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
