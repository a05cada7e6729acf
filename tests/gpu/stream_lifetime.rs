//! A stream's end on the real GPU (issue 34, item 6): a stream is forgotten
//! (`Pool::forget_stream`) and destroyed while a kernel on it still reads memory
//! freed on it; the next stream created (which the driver may give the same handle
//! value) gets none of that memory while the kernel runs, and the pool releases it
//! afterwards with no device-wide synchronize.
//!
//! Ignored by default (CI has no GPU); run on the GPU machine with
//! `cargo test --release --test gpu -- --include-ignored stream_lifetime::`. Fails loudly
//! without a GPU. The pool runs on a [`Counting`] driver, so the test checks that the
//! pool made no `cuCtxSynchronize`.

use crate::common;
use crate::one_at_a_time::one_at_a_time;

use std::sync::Arc;
use std::time::Instant;

use common::counting::Counting;
use common::kernels::{SumRun, PTX};
use common::{check, MIB};
use flare_package::driver::cuda::CudaDriver;
use flare_package::driver::DriverCall;
use flare_package::{CrossStreamReuse, Driver, Pool, PoolConfig};

/// The buffer the kernel reads: 64 MiB, a multiple of the 2 MiB granularity of an
/// H100 or H200, so the mapping behind it is exactly this size.
const SIZE: u64 = 64 * MIB;

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_forgotten_and_destroyed_stream_leaves_the_next_stream_a_clean_pool() {
    let _serial = one_at_a_time();
    let d =
        Arc::new(CudaDriver::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}")));
    let counted = Arc::new(Counting::new(d.clone()));
    let pool = Pool::with_driver(
        PoolConfig {
            cross_stream_reuse: CrossStreamReuse::WhenComplete,
            // Everything freed stays cached: what the new stream gets is a question
            // of reuse alone.
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::cuda(0)
        },
        counted.clone(),
    )
    .unwrap();
    let kernel = d.load_test_kernel(PTX, "sum_repeat").unwrap();
    let s = d.stream_create_non_blocking().unwrap();
    let data = pool.allocate_async_raw(SIZE, s).unwrap();
    let out_a = pool.allocate_async_raw(4, s).unwrap();
    // SAFETY: `data` is a live allocation of SIZE bytes, used by nothing else yet.
    unsafe { d.memset_d8_async(data, 3, SIZE, s) }.unwrap();
    let a = SumRun {
        driver: &d,
        device: 0,
        kernel: &kernel,
        data,
        n: SIZE / 4,
        out: out_a,
        fill: 3,
    };
    // SAFETY: `data` and `out_a` stay mapped until the kernels are done (what the
    // pool must guarantee once they are freed).
    let (one, iters) = unsafe { a.calibrate_on(s) };
    let kernel_time = one.mul_f64(iters as f64);

    let started = Instant::now();
    // SAFETY: as above.
    unsafe { a.launch_on(iters, s) };
    pool.free_async_raw(data, s).unwrap();
    pool.forget_stream(s).unwrap();
    Driver::stream_destroy(&*d, s).unwrap(); // the kernel runs on
    let t = d.stream_create_non_blocking().unwrap();
    eprintln!(
        "the new stream's handle {:#x} {} the destroyed one's",
        t.0,
        if t == s { "is" } else { "is not" }
    );
    let fresh = pool.allocate_async_raw(SIZE, t).unwrap();
    let took = started.elapsed();
    assert!(
        took < kernel_time / 2,
        "launch to allocation took {took:?} of the kernel's ~{kernel_time:?}: the check \
         below shows nothing (calibration too short?)"
    );
    assert_ne!(
        fresh, data,
        "the old stream's kernel is still reading `data`"
    );
    let snap = check(&pool);
    assert_eq!(
        (snap.idle_bytes, snap.event_wait_bytes),
        (SIZE, SIZE),
        "`data` waits on the forget's fence: {snap:#?}"
    );

    // The new stream's own work on its memory, queued while the old kernel runs.
    let out_b = pool.allocate_async_raw(4, t).unwrap();
    // SAFETY: `fresh` is a live allocation of SIZE bytes, only used on `t`.
    unsafe { d.memset_d8_async(fresh, 5, SIZE, t) }.unwrap();
    let b = SumRun {
        driver: &d,
        device: 0,
        kernel: &kernel,
        data: fresh,
        n: SIZE / 4,
        out: out_b,
        fill: 5,
    };
    // SAFETY: `fresh` and `out_b` are live allocations of this test.
    unsafe { b.launch_on(2, t) };
    assert_eq!(b.read_out_on(t), b.expected(2));
    // The old kernel (its stream destroyed: the test waits for the whole device)
    // read 3s to its end: nothing overwrote or released `data` under it.
    d.synchronize(0).unwrap();
    assert_eq!(a.read_out(), a.expected(iters));

    // Trim waits on the forget's fence (an event), releases `data`, and nothing else.
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.idle_bytes, 0, "{snap:#?}");
    assert_eq!(
        snap.live_count, 3,
        "fresh, out_a (made on the old stream), out_b"
    );
    // Freed on the new stream with the old one's handle or not, `out_a` is just
    // memory of a new stream's.
    for p in [fresh, out_a, out_b] {
        pool.free_async_raw(p, t).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    assert_eq!(
        counted.count(DriverCall::Synchronize),
        0,
        "a cuCtxSynchronize by the pool"
    );
    drop(pool);
    d.stream_synchronize(t).unwrap();
    Driver::stream_destroy(&*d, t).unwrap();
    d.unload_test_kernel(kernel).unwrap();
}
