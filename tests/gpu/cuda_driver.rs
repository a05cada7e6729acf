//! The real CUDA driver backend.
//!
//! One test runs everywhere (CI included) and asserts on every machine: `new` for a
//! device that exists nowhere fails with a typed `Init` error instead of panicking,
//! with the not-loaded code exactly when libcuda is absent. The others need a CUDA GPU and are ignored by default; run them with
//! `cargo test --test gpu -- --ignored cuda_driver::`. They fail loudly when no GPU is there.

use crate::one_at_a_time::one_at_a_time;
use flare_package::driver::cuda::CudaDriver;
use flare_package::driver::{CuResult, Driver, DriverCall};

/// 2 MiB: the granularity measured on an H200 (`docs/vmm-semantics.md`).
const H200_GRANULARITY: u64 = 2 << 20;

/// The driver for device 0, or a panic that says why the GPU test cannot run.
fn gpu() -> CudaDriver {
    assert!(
        CudaDriver::is_available(),
        "this test needs a CUDA GPU: libcuda cannot be loaded on this machine"
    );
    match CudaDriver::new(0) {
        Ok(d) => d,
        Err(e) => panic!("this test needs a CUDA GPU: CudaDriver::new(0) failed: {e}"),
    }
}

#[test]
fn new_fails_with_a_typed_init_error_with_or_without_libcuda() {
    // Device ordinal -1 exists on no machine, so `new` fails everywhere, with a
    // typed `Init` error and no panic: without libcuda at the load
    // (`CUDA_ERROR_NOT_INITIALIZED`, 3); with it at `cuInit` (no device, a stub
    // library: the driver's own code) or at `cuDeviceGet`
    // (`CUDA_ERROR_INVALID_DEVICE`, 101). Either way the code is a failure that the
    // error names without calling the driver (which would panic without libcuda).
    let err = CudaDriver::new(-1).expect_err("device -1 exists nowhere");
    assert_eq!(err.call, DriverCall::Init);
    assert!(!err.code.is_success());
    let text = err.to_string();
    assert!(
        text.contains(err.code.name()) && text.contains(&format!("({})", err.code.0)),
        "{text}"
    );
    if CudaDriver::is_available() {
        // Loaded: the failure is the driver's answer, never the "not loaded" code.
        assert_ne!(err.code, CuResult::NOT_INITIALIZED, "{text}");
    } else {
        assert_eq!(err.code, CuResult::NOT_INITIALIZED);
        let err = CudaDriver::new(0).expect_err("no libcuda, yet CudaDriver::new succeeded");
        assert_eq!(
            (err.call, err.code),
            (DriverCall::Init, CuResult::NOT_INITIALIZED)
        );
        assert!(err.to_string().contains("CUDA_ERROR_NOT_INITIALIZED"));
    }
    // A fresh thread has no current context on any machine (and asking does not
    // panic without libcuda), and a failed `new` leaves none behind.
    std::thread::spawn(|| {
        assert!(CudaDriver::current_context_is_null());
        let _ = CudaDriver::new(-1);
        assert!(CudaDriver::current_context_is_null());
    })
    .join()
    .expect("the context checks panicked");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn granularity_is_2_mib_on_h200() {
    let _serial = one_at_a_time();
    let d = gpu();
    assert_eq!(d.granularity().unwrap(), H200_GRANULARITY);
    assert_eq!(d.device(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn full_lifecycle_write_and_read_back() {
    let _serial = one_at_a_time();
    let d = gpu();
    let g = d.granularity().unwrap();
    let size = 2 * g;

    let handle = d.create(size).unwrap();
    assert_eq!(handle.size, size);
    let res = d.reserve(size).unwrap();
    assert_eq!(res.size, size);
    assert_eq!(res.ptr % g, 0, "reservation not aligned to the granularity");
    d.map(res.ptr, handle).unwrap();
    d.set_access(res.ptr, size, &[0]).unwrap();

    // SAFETY: `res` is a reservation of `size` bytes, mapped above with access for
    // device 0, owned by this test and touched by nothing else.
    unsafe { d.memset_d8(res.ptr, 0xAB, size) }.unwrap();
    let mut back = vec![0u8; size as usize];
    d.copy_dtoh(res.ptr, &mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 0xAB),
        "memset value did not read back"
    );

    let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    // SAFETY: the 4 KiB from `res.ptr + g` lie inside the mapping above (`size` is
    // 2 G), owned by this test.
    unsafe { d.copy_htod(res.ptr + g, &pattern) }.unwrap();
    let mut back2 = vec![0u8; pattern.len()];
    d.copy_dtoh(res.ptr + g, &mut back2).unwrap();
    assert_eq!(back2, pattern);

    d.synchronize(0).unwrap();
    d.unmap(res.ptr, size).unwrap();
    d.release(handle).unwrap();
    d.free_reservation(res).unwrap();

    // Second release and second free are refused, as measured.
    let e = d.release(handle).unwrap_err();
    assert_eq!(
        (e.call, e.code),
        (DriverCall::Release, CuResult::INVALID_VALUE)
    );
    let e = d.free_reservation(res).unwrap_err();
    assert_eq!(
        (e.call, e.code),
        (DriverCall::FreeReservation, CuResult::INVALID_VALUE)
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mapping_a_prefix_of_a_handle_is_not_supported() {
    let _serial = one_at_a_time();
    let d = gpu();
    let g = d.granularity().unwrap();
    let handle = d.create(2 * g).unwrap();
    let res = d.reserve(2 * g).unwrap();

    let e = d.map_range_raw(res.ptr, g, 0, handle.raw).unwrap_err();
    assert_eq!(e.call, DriverCall::Map);
    assert_eq!(e.code, CuResult::NOT_SUPPORTED, "prefix map: {e}");
    assert_eq!(e.code.0, 801);

    // The whole handle maps fine at the same address afterwards.
    d.map(res.ptr, handle).unwrap();
    d.unmap(res.ptr, 2 * g).unwrap();
    d.release(handle).unwrap();
    d.free_reservation(res).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn works_from_a_thread_without_context_and_leaves_none() {
    let _serial = one_at_a_time();
    let d = gpu();
    let g = d.granularity().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            assert!(
                CudaDriver::current_context_is_null(),
                "fresh thread already has a context"
            );
            let handle = d.create(g).unwrap();
            let res = d.reserve(g).unwrap();
            d.map(res.ptr, handle).unwrap();
            d.set_access(res.ptr, g, &[0]).unwrap();
            // SAFETY: `res` is `g` bytes mapped just above with access for device
            // 0, owned by this thread.
            unsafe { d.memset_d8(res.ptr, 7, g) }.unwrap();
            let mut back = vec![0u8; 64];
            d.copy_dtoh(res.ptr, &mut back).unwrap();
            assert!(back.iter().all(|&b| b == 7));
            d.synchronize(0).unwrap();
            let _ = d.mem_info().unwrap();
            d.unmap(res.ptr, g).unwrap();
            d.release(handle).unwrap();
            d.free_reservation(res).unwrap();
            assert!(
                CudaDriver::current_context_is_null(),
                "a driver call left a context current on the thread"
            );
            // A failing call leaves none either.
            assert!(d.create(g + 1).is_err());
            assert!(
                CudaDriver::current_context_is_null(),
                "a failed call left a context current"
            );
        })
        .join()
        .unwrap();
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mem_info_tracks_create_and_release() {
    let _serial = one_at_a_time();
    let d = gpu();
    let size = 512 * d.granularity().unwrap(); // 1 GiB on an H200: well above noise
    d.synchronize(0).unwrap();
    let before = d.mem_info().unwrap();
    assert!(before.total > 0 && before.free <= before.total);

    let handle = d.create(size).unwrap();
    let during = d.mem_info().unwrap();
    assert_eq!(during.total, before.total);
    let drop = before.free.saturating_sub(during.free);
    // Other processes may allocate meanwhile: allow 64 MiB of slack above the size.
    assert!(
        drop >= size && drop <= size + (64 << 20),
        "free went from {} to {} after creating {} bytes",
        before.free,
        during.free,
        size
    );

    d.release(handle).unwrap();
    let after = d.mem_info().unwrap();
    assert!(
        after.free + (64 << 20) >= before.free,
        "free did not come back after release: before {}, after {}",
        before.free,
        after.free
    );
}
