//! The simulated backend's controls through the C ABI (`src/ffi/sim.rs`): its
//! streams, launches and captures and each refusal of them, NOT_SUPPORTED without the
//! simulated driver, fault and panic injection.

use std::ffi::c_int;

use crate::driver::{MemInfo, PhysicalHandle, Reservation};
use crate::{DevicePtr, Driver, DriverError, Pool, SimDriver};

use super::*;

#[test]
fn simulated_stream_controls_refuse_misuse_with_its_cuda_error() {
    let pool = create(&config());
    let s = stream_create(pool);
    let t = stream_create(pool);
    assert!(!s.is_null() && !t.is_null() && s != t, "two new streams");
    let p = allocate_on(pool, 2 * MIB as usize, s);
    let bogus = 0xdead_0000 as FlareStream;
    let refused = |st: FlareStatus, cuda: &str| {
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        let msg = last_error();
        assert!(msg.contains(cuda), "{msg} lacks {cuda}");
    };
    let mut valid: std::ffi::c_int = 7;
    // SAFETY: `pool` is live; `valid` is writable.
    unsafe {
        refused(
            flare_sim_launch(pool, bogus, p, 1),
            "flare_sim_launch: invalid argument: cuLaunchKernel on stream 0xdead0000: \
             CUDA_ERROR_INVALID_HANDLE (400)",
        );
        // Past the 2 MiB mapping: not mapped (on a GPU the kernel would fault).
        refused(
            flare_sim_launch(pool, s, p, 2 * MIB as usize + 1),
            "CUDA_ERROR_INVALID_VALUE (1)",
        );
        refused(
            flare_sim_stream_complete(pool, bogus),
            "CUDA_ERROR_INVALID_HANDLE",
        );
        // The legacy stream cannot be captured.
        refused(
            flare_sim_begin_capture(pool, ptr::null_mut()),
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900)",
        );
        refused(
            flare_sim_begin_capture(pool, bogus),
            "CUDA_ERROR_INVALID_HANDLE",
        );
        // End without a capture.
        refused(
            flare_sim_end_capture(pool, t, &mut valid),
            "CUDA_ERROR_ILLEGAL_STATE (401)",
        );
        assert_eq!(valid, 7, "not written");
        ok(flare_sim_begin_capture(pool, s));
        refused(flare_sim_begin_capture(pool, s), "CUDA_ERROR_ILLEGAL_STATE");
    }
    // A global-mode capture is ended by the thread that began it only.
    let (addr, handle) = (pool as usize, s as usize);
    let other = std::thread::spawn(move || {
        let mut valid: std::ffi::c_int = 7;
        // SAFETY: the pool outlives this thread (joined below); `valid` is writable.
        let st = unsafe {
            flare_sim_end_capture(addr as *mut FlarePool, handle as FlareStream, &mut valid)
        };
        (st, valid, last_error())
    })
    .join()
    .unwrap_or_else(|_| panic!("the thread panicked"));
    assert_eq!(other.0, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(other.1, 7);
    assert!(
        other
            .2
            .contains("CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (908)"),
        "{}",
        other.2
    );
    // Launches into the capture are graph nodes: nothing queued, nothing to complete.
    launch(pool, s, p, 2 * MIB);
    assert!(end_capture(pool, s), "nothing broke the capture");
    assert_eq!(snap_sim(pool).queued_work().len(), 0);
    // Outside a capture, launches are queued work until their stream completes.
    launch(pool, s, p, MIB);
    launch(pool, ptr::null_mut(), p, 0);
    assert_eq!(snap_sim(pool).queued_work().len(), 2);
    complete(pool, s);
    complete(pool, ptr::null_mut());
    assert_eq!(snap_sim(pool).queued_work().len(), 0);
    assert_eq!(faults(pool), 0);
    free_on(pool, p, s);
    trim_check_destroy(pool);
}

/// `flare_sim_stream_create` makes its stream on the pool's device (the simulated
/// driver creates streams on the calling thread's current device, 0 by default), so
/// that work launched on it may touch the pool's memory, which only the pool's device
/// (and its peers) have access to; the thread's current device is left as it was.
#[test]
fn simulated_streams_are_created_on_the_pool_device() {
    let mut c = config();
    c.sim_device_count = 2;
    c.device = 1;
    let pool = create(&c);
    let sim = snap_sim(pool);
    let s = stream_create(pool);
    assert_eq!(sim.ctx_get_device(), 0, "the thread's device is restored");
    let (st, p) = allocate(pool, 2 * MIB as usize);
    ok(st);
    assert_eq!(sim.access_of(p as usize as u64), vec![1]);
    launch(pool, s, p, 2 * MIB);
    complete(pool, s);
    // SAFETY: `pool` is live, `p` its allocation.
    ok(unsafe { flare_package_free(pool, p) });
    trim_check_destroy(pool);
}

/// A capture broken by a device synchronize ends invalid (`out_valid` 0, still a
/// success) and the fault is counted: the stream-less free outside a scope
/// synchronizes (issue 11 keeps that path as it was), which CUDA refuses during a
/// capture and which invalidates it (`docs/vmm-semantics.md`, "Stream capture").
#[test]
fn a_capture_broken_by_a_synchronize_ends_invalid_and_counts_a_fault() {
    let pool = create(&config());
    let s = stream_create(pool);
    let (st, p) = allocate(pool, 2 * MIB as usize);
    ok(st);
    // SAFETY: `pool` is live.
    ok(unsafe { flare_sim_begin_capture(pool, s) });
    assert_eq!(faults(pool), 0);
    // SAFETY: `pool` is live, `p` its allocation.
    ok(unsafe { flare_package_free(pool, p) });
    assert_eq!(faults(pool), 1, "the synchronize broke the capture");
    assert_eq!(snap(pool).sync_failures, 1);
    assert!(!end_capture(pool, s), "the capture ended invalidated");
    // The capture is over: a second end is refused.
    let mut valid: std::ffi::c_int = 7;
    // SAFETY: `pool` is live; `valid` is writable.
    let st = unsafe { flare_sim_end_capture(pool, s, &mut valid) };
    assert_eq!((st, valid), (FlareStatus::FLARE_STATUS_INVALID_ARGUMENT, 7));
    // SAFETY: `pool` is live.
    ok(unsafe { flare_pool_trim(pool) });
    assert_eq!(snap(pool).physical_bytes, 0);
    assert_eq!(faults(pool), 1, "the count stays");
    destroy(pool);
}

/// Every refusal of the simulated stream controls the C ABI can provoke names the
/// call, the stream and what the code means there (`refused` in sim.rs; the codes
/// are the simulated driver's, rows of docs/vmm-semantics.md): a handle that is no
/// stream, a launch on memory not mapped, an end of a capture never begun, a capture
/// of the legacy stream, a launch into a capture a device synchronize invalidated, an
/// end of a global-mode capture from another thread. (The two codes only events or
/// blocking streams produce, `STREAM_CAPTURE_UNMATCHED` and `_IMPLICIT`, cannot
/// reach it through the C ABI: it makes neither.)
#[test]
fn each_refusal_of_the_simulated_stream_controls_says_what_it_means() {
    let pool = create(&config());
    let mut s = ptr::null_mut();
    // SAFETY: `pool` is live; `s` is writable.
    ok(unsafe { flare_sim_stream_create(pool, &mut s) });
    let bogus = 0xdead as FlareStream;
    let invalid = FlareStatus::FLARE_STATUS_INVALID_ARGUMENT;
    let mut valid: c_int = -1;
    // SAFETY: `pool` is live throughout; outputs are writable; pointers given to the
    // simulated launch are only compared with its mappings.
    unsafe {
        refused(
            flare_sim_launch(pool, bogus, ptr::null(), 0),
            invalid,
            "flare_sim_launch",
            "cuLaunchKernel on stream 0xdead: CUDA_ERROR_INVALID_HANDLE (400): not a live \
             stream of this pool's simulated driver",
        );
        refused(
            flare_sim_launch(pool, s, 0x1000 as *const c_void, 4096),
            invalid,
            "flare_sim_launch",
            "a byte of the range is not mapped with access for the stream's device",
        );
        refused(
            flare_sim_end_capture(pool, s, &mut valid),
            invalid,
            "flare_sim_end_capture",
            "the stream is not in a capture state that allows it",
        );
        refused(
            flare_sim_begin_capture(pool, ptr::null_mut()),
            invalid,
            "flare_sim_begin_capture",
            "the legacy stream cannot be captured",
        );
        assert_eq!(valid, -1, "nothing written on a refusal");
        // A tag sleeping while `s` (a stream the pool never saw) is captured: the
        // pool's device synchronize breaks the capture (and fails the sleep).
        let (st, _p) = allocate_tagged(pool, 1, 9);
        ok(st);
        ok(flare_sim_begin_capture(pool, s));
        assert_eq!(
            flare_pool_sleep(pool, 9, RawSleepMode(0)),
            FlareStatus::FLARE_STATUS_DRIVER_ERROR,
            "{}",
            last_error()
        );
        refused(
            flare_sim_launch(pool, s, ptr::null(), 0),
            invalid,
            "flare_sim_launch",
            "the stream's capture was invalidated: end it",
        );
        ok(flare_sim_end_capture(pool, s, &mut valid));
        assert_eq!(valid, 0, "the capture ended invalidated");
        // A global-mode capture (the mode flare_sim_begin_capture uses) ended from
        // another thread.
        ok(flare_sim_begin_capture(pool, s));
    }
    let (p, st) = (pool as usize, s as usize);
    let other = std::thread::spawn(move || {
        let mut valid: c_int = -1;
        // SAFETY: the pool and stream are live; `valid` is writable.
        let status =
            unsafe { flare_sim_end_capture(p as *mut FlarePool, st as FlareStream, &mut valid) };
        refused(
            status,
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_sim_end_capture",
            "the capture was begun on another thread",
        );
    });
    if let Err(panic) = other.join() {
        std::panic::resume_unwind(panic);
    }
    // SAFETY: `pool` is live; `valid` is writable.
    ok(unsafe { flare_sim_end_capture(pool, s, &mut valid) });
    assert_eq!(valid, 1);
    destroy(pool);
}

/// A driver that is not the simulated one to the pool (it wraps one): what a CUDA
/// pool looks like to the `flare_sim_*` functions, without a GPU.
struct NotSimulated(SimDriver);

impl Driver for NotSimulated {
    fn granularity(&self) -> Result<u64, DriverError> {
        <SimDriver as Driver>::granularity(&self.0)
    }
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
        <SimDriver as Driver>::create(&self.0, size)
    }
    fn release(&self, handle: PhysicalHandle) -> Result<(), DriverError> {
        <SimDriver as Driver>::release(&self.0, handle)
    }
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
        <SimDriver as Driver>::reserve(&self.0, size)
    }
    fn free_reservation(&self, reservation: Reservation) -> Result<(), DriverError> {
        <SimDriver as Driver>::free_reservation(&self.0, reservation)
    }
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DriverError> {
        <SimDriver as Driver>::map(&self.0, ptr, handle)
    }
    fn set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> Result<(), DriverError> {
        <SimDriver as Driver>::set_access(&self.0, ptr, size, devices)
    }
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> {
        <SimDriver as Driver>::unmap(&self.0, ptr, size)
    }
    fn synchronize(&self, device: i32) -> Result<(), DriverError> {
        <SimDriver as Driver>::synchronize(&self.0, device)
    }
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        <SimDriver as Driver>::mem_info(&self.0)
    }
}

#[test]
fn simulated_controls_are_not_supported_without_the_simulated_driver() {
    let driver = std::sync::Arc::new(NotSimulated(SimDriver::default()));
    let pool =
        Pool::with_driver(crate::PoolConfig::default(), driver).unwrap_or_else(|e| panic!("{e}"));
    assert!(pool.sim_driver().is_none());
    let pool = Box::into_raw(Box::new(FlarePool::new(pool, 0)));
    let (st, p) = allocate(pool, MIB as usize);
    ok(st);
    let sentinel = 0x5e5e as *mut c_void;
    let mut stream_out = sentinel;
    let mut valid: std::ffi::c_int = 7;
    let mut n = 77_u64;
    let s = 0x1000 as FlareStream;
    // SAFETY: `pool` is live; the outputs are writable locals.
    unsafe {
        let statuses = [
            flare_sim_stream_create(pool, &mut stream_out),
            flare_sim_launch(pool, s, p, 1),
            flare_sim_stream_complete(pool, s),
            flare_sim_begin_capture(pool, s),
            flare_sim_end_capture(pool, s, &mut valid),
            flare_sim_faults(pool, &mut n),
            flare_sim_inject_failure(pool, RawDriverCall(0), 1, 2),
            flare_sim_inject_panic(pool),
        ];
        for (i, st) in statuses.into_iter().enumerate() {
            assert_eq!(st, FlareStatus::FLARE_STATUS_NOT_SUPPORTED, "call {i}");
        }
        assert!(last_error().contains("not supported"), "{}", last_error());
        // A NULL output is an invalid argument before anything else.
        let st = flare_sim_faults(pool, ptr::null_mut());
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        ok(flare_package_free(pool, p));
    }
    assert_eq!((stream_out, valid, n), (sentinel, 7, 77), "nothing written");
    destroy(pool);
}

#[test]
fn panic_injection_needs_a_pool() {
    // SAFETY: NULL is allowed.
    let st = unsafe { flare_sim_inject_panic(ptr::null_mut()) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
}

#[test]
fn injected_driver_failures_are_driver_errors_that_leak_nothing() {
    let pool = create(&config());
    // SAFETY: `pool` is live throughout.
    unsafe {
        // What the injection refuses.
        refused(
            flare_sim_inject_failure(pool, RawDriverCall(999), 1, 999),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_sim_inject_failure",
            "call",
        );
        refused(
            flare_sim_inject_failure(pool, RawDriverCall(0), 0, 999),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_sim_inject_failure",
            "nth is 0",
        );
        for bad in [0, -1, i32::MIN] {
            refused(
                flare_sim_inject_failure(pool, RawDriverCall(0), 1, bad),
                FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
                "flare_sim_inject_failure",
                &format!("cuda_error {bad} is not a failure CUresult"),
            );
        }
        // The next cuMemCreate fails with CUDA_ERROR_UNKNOWN (999).
        ok(flare_sim_inject_failure(pool, RawDriverCall(0), 1, 999));
        let (st, p) = allocate(pool, 1);
        refused(
            st,
            FlareStatus::FLARE_STATUS_DRIVER_ERROR,
            "flare_package_allocate",
            "cuMemCreate",
        );
        assert_eq!(p, SENTINEL);
        let s = snap(pool);
        assert_eq!(
            (
                s.create_failures,
                s.live_count,
                s.physical_bytes,
                s.reserved_bytes
            ),
            (1, 0, 0, 0)
        );
        // The second cuMemMap from now fails: the first allocation maps, the second
        // is refused and gives back its handle and reservation.
        ok(flare_sim_inject_failure(pool, RawDriverCall(4), 2, 999));
        let (st, p) = allocate(pool, 1);
        ok(st);
        let (st, q) = allocate(pool, 1);
        refused(
            st,
            FlareStatus::FLARE_STATUS_DRIVER_ERROR,
            "flare_package_allocate",
            "cuMemMap",
        );
        assert_eq!(q, SENTINEL);
        let s = snap(pool);
        assert_eq!(
            (
                s.map_failures,
                s.live_count,
                s.physical_bytes,
                s.reserved_bytes
            ),
            (1, 1, GRANULARITY, GRANULARITY)
        );
        // The injection is spent: the pool stays usable.
        let (st, q) = allocate(pool, 1);
        ok(st);
        ok(free(pool, p));
        ok(free(pool, q));
    }
    destroy(pool);
}
