//! The pool's integration suite against the real CUDA driver, plus what only real
//! hardware can answer. Every test is ignored by default (CI has no GPU); run them on
//! the GPU machine with `--include-ignored`. Each fails loudly without a GPU.

use crate::common;
use crate::one_at_a_time::one_at_a_time;

use common::*;
use flare_package::driver::cuda::CudaDriver;
use flare_package::{Driver, Pool, PoolConfig, ReusePolicy};

fn cuda() -> CudaDriver {
    CudaDriver::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_warmup_one_transient_at_a_time() {
    let _serial = one_at_a_time();
    assert_eq!(warmup(On::Cuda, ReusePolicy::Exact, false), GIB);
    assert_eq!(warmup(On::Cuda, ReusePolicy::BestFit, false), GIB);
    assert_eq!(warmup(On::Cuda, ReusePolicy::None, false), 24 * GIB);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_warmup_both_transients_live() {
    let _serial = one_at_a_time();
    assert_eq!(warmup(On::Cuda, ReusePolicy::Exact, true), 2 * GIB);
    assert_eq!(warmup(On::Cuda, ReusePolicy::BestFit, true), 2 * GIB);
    assert_eq!(warmup(On::Cuda, ReusePolicy::None, true), 24 * GIB);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_per_shape_sizes_stay_bounded_outside_a_scope() {
    let _serial = one_at_a_time();
    let sizes = shape_sizes();
    let round = |b: u64| b.div_ceil(2 * MIB) * 2 * MIB;
    let mut sorted: Vec<u64> = sizes.iter().map(|&b| round(b)).collect();
    sorted.sort_unstable();
    let two_largest = sorted[999] + sorted[998];
    let pool = pool(On::Cuda, ReusePolicy::BestFit);
    let mut live = std::collections::VecDeque::new();
    for &b in &sizes {
        live.push_back(pool.allocate_raw(b).unwrap());
        if live.len() > 2 {
            pool.free_raw(live.pop_front().unwrap()).unwrap();
        }
        assert!(check(&pool).physical_bytes <= two_largest);
    }
    for p in live {
        pool.free_raw(p).unwrap();
    }
    assert_eq!(check(&pool).physical_bytes, 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_driver_free_memory_returns_to_baseline_after_finish() {
    let _serial = one_at_a_time();
    let d = cuda();
    let base = d.mem_info().unwrap();
    let pool = pool(On::Cuda, ReusePolicy::BestFit);
    pool.retention_begin().unwrap();
    for _ in 0..4 {
        let a = pool.allocate_raw(GIB).unwrap();
        let b = pool.allocate_raw(512 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        pool.free_raw(b).unwrap();
    }
    let during = d.mem_info().unwrap();
    let held = base.free - during.free;
    println!(
        "free before {} MiB, during {} MiB (held {} MiB)",
        base.free >> 20,
        during.free >> 20,
        held >> 20
    );
    assert!(
        held >= GIB + 512 * MIB,
        "the retained 1.5 GiB is held on the device"
    );
    pool.retention_finish().unwrap();
    let after = d.mem_info().unwrap();
    println!("free after finish {} MiB", after.free >> 20);
    // Exactly the baseline, give or take what another process does meanwhile.
    assert!(
        after.free + 64 * MIB >= base.free,
        "free memory back to its baseline"
    );
    assert_eq!(check(&pool).physical_bytes, 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_reused_memory_reads_back_what_was_written() {
    let _serial = one_at_a_time();
    let d = cuda();
    let pool = pool(On::Cuda, ReusePolicy::BestFit);
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(64 * MIB).unwrap();
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    // SAFETY: `a` is a live 64 MiB allocation of the pool, owned by this test; both
    // ranges lie inside it.
    unsafe { d.copy_htod(a, &pattern) }.unwrap();
    // SAFETY: as above; the memset completes before the synchronous copies below.
    unsafe { d.memset_d8(a + 32 * MIB, 0xA5, MIB) }.unwrap();
    pool.free_raw(a).unwrap();
    let b = pool.allocate_raw(64 * MIB).unwrap();
    assert_eq!(a, b, "the retained mapping is reused");
    let mut back = vec![0u8; 4096];
    d.copy_dtoh(b, &mut back).unwrap();
    assert_eq!(back, pattern);
    let mut mid = vec![0u8; 1024];
    d.copy_dtoh(b + 32 * MIB + 1000, &mut mid).unwrap();
    assert!(mid.iter().all(|&x| x == 0xA5));
    pool.free_raw(b).unwrap();
    pool.retention_finish().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_allocation_from_a_thread_without_a_context() {
    let _serial = one_at_a_time();
    let pool = pool(On::Cuda, ReusePolicy::BestFit);
    std::thread::scope(|s| {
        s.spawn(|| {
            assert!(
                CudaDriver::current_context_is_null(),
                "a fresh thread has no context"
            );
            let p = pool.allocate_raw(3 * MIB).unwrap();
            assert_ne!(p, 0);
            assert!(
                CudaDriver::current_context_is_null(),
                "the pool leaves the thread as it was"
            );
            // SAFETY: `p` is a live allocation of at least 3 MiB, owned by this
            // thread; the free below synchronizes before unmapping it.
            unsafe { cuda().memset_d8(p, 1, 3 * MIB) }.unwrap();
            pool.free_raw(p).unwrap();
            assert!(CudaDriver::current_context_is_null());
        });
    });
    assert_eq!(check(&pool).physical_bytes, 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_out_of_memory_inside_a_scope_is_clean() {
    let _serial = one_at_a_time();
    let d = cuda();
    let total = d.mem_info().unwrap().total;
    let pool = Pool::new(PoolConfig::cuda(0)).unwrap();
    pool.retention_begin().unwrap();
    // Beyond the whole device: refused at once, no driver call, nothing counted.
    let err = pool.allocate_raw(total * 2).unwrap_err();
    println!("{err}");
    assert!(
        matches!(err, flare_package::Error::RequestTooLarge { .. }),
        "{err:?}"
    );
    let s = check(&pool);
    assert_eq!(
        (
            s.physical_bytes,
            s.reserved_bytes,
            s.live_count,
            s.create_failures
        ),
        (0, 0, 0, 0)
    );
    // Full now: three quarters of the device live, then three quarters more. The
    // driver refuses the second create; inside the scope nothing is released.
    let g = pool.granularity();
    let big = total / 4 * 3 / g * g;
    let a = pool.allocate_raw(big).unwrap();
    let err = pool.allocate_raw(big).unwrap_err();
    println!("{err}");
    assert!(
        matches!(
            err,
            flare_package::Error::OutOfMemory {
                in_scope: true,
                source: Some(_),
                ..
            }
        ),
        "{err:?}"
    );
    let s = check(&pool);
    assert_eq!(
        (s.physical_bytes, s.live_count, s.create_failures),
        (big, 1, 1)
    );
    pool.free_raw(a).unwrap();
    pool.retention_finish().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}
