//! The simulated driver through the `Driver` trait: whole handles mapped, errors that
//! name the call and keep the code, events and stream destroys passed on, the
//! hand-off check, `Send + Sync` and usable as `dyn Driver`.

use crate::common;
use crate::vmm_rows::{sim, G, INVALID, OK};
use common::mapped_for;
use flare_package::driver::sim::{SimDriver, SimState};
use flare_package::driver::{
    CuResult, Driver, DriverCall, DriverError, PhysicalHandle, Reservation,
};

// ---------------------------------------------------------------- the Driver trait

#[test]
fn trait_round_trip_maps_whole_handles() {
    let d = sim();
    let g = d.granularity().unwrap();
    let r: Reservation = d.reserve(4 * g).unwrap();
    assert_eq!(r.size, 4 * g);
    let h: PhysicalHandle = d.create(2 * g).unwrap();
    assert_eq!(h.size, 2 * g);
    d.map(r.ptr, h).unwrap();
    d.map(r.ptr + 2 * g, h).unwrap();
    d.set_access(r.ptr, 4 * g, &[0]).unwrap();
    assert_eq!(d.touch(r.ptr, 4 * g, 0), OK);
    d.synchronize(0).unwrap();
    d.unmap(r.ptr, 4 * g).unwrap();
    d.release(h).unwrap();
    d.free_reservation(r).unwrap();
    assert_eq!(d.state(), SimState::default());
}

#[test]
fn trait_errors_name_the_call_and_keep_the_code() {
    let d = sim();
    let r = d.reserve(4 * G).unwrap();
    let h = d.create(G).unwrap();
    assert_eq!(
        d.reserve(0).unwrap_err(),
        DriverError::new(DriverCall::Reserve, INVALID)
    );
    assert_eq!(
        d.map(r.ptr + 1, h).unwrap_err(),
        DriverError::new(DriverCall::Map, INVALID)
    );
    // A handle value whose size understates the real handle is a partial map.
    let big = d.create(2 * G).unwrap();
    let short = PhysicalHandle {
        raw: big.raw,
        size: G,
    };
    assert_eq!(
        d.map(r.ptr, short).unwrap_err(),
        DriverError::new(DriverCall::Map, CuResult::NOT_SUPPORTED)
    );
    d.release(big).unwrap();
    assert_eq!(
        d.set_access(r.ptr, G, &[0]).unwrap_err(),
        DriverError::new(DriverCall::SetAccess, INVALID)
    );
    assert_eq!(
        d.unmap(r.ptr, 3).unwrap_err(),
        DriverError::new(DriverCall::Unmap, INVALID)
    );
    d.release(h).unwrap();
    assert_eq!(
        d.release(h).unwrap_err(),
        DriverError::new(DriverCall::Release, INVALID)
    );
    d.free_reservation(r).unwrap();
    assert_eq!(
        d.free_reservation(r).unwrap_err(),
        DriverError::new(DriverCall::FreeReservation, INVALID)
    );
}

#[test]
fn sim_driver_is_send_sync_and_usable_as_dyn_driver() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SimDriver>();
    let d: std::sync::Arc<dyn Driver> = std::sync::Arc::new(sim());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let d = d.clone();
            std::thread::spawn(move || {
                for _ in 0..25 {
                    let h = d.create(G).unwrap();
                    let r = d.reserve(G).unwrap();
                    d.map(r.ptr, h).unwrap();
                    d.set_access(r.ptr, G, &[0]).unwrap();
                    d.unmap(r.ptr, G).unwrap();
                    d.release(h).unwrap();
                    d.free_reservation(r).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(d.mem_info().unwrap().free, 140 << 30);
}

/// The `Driver` implementation of events (what the pool calls): `event_query` is
/// `Ok(true)` for `CUDA_SUCCESS`, `Ok(false)` for `CUDA_ERROR_NOT_READY`, and every
/// other code an error naming `cuEventQuery`; `event_destroy` destroys (the handle
/// is refused afterwards) and passes a refusal on as an error naming
/// `cuEventDestroy`.
#[test]
fn the_driver_trait_passes_event_errors_on() {
    use flare_package::driver::sim::{CUDA_ERROR_INVALID_HANDLE, CU_STREAM_NON_BLOCKING};
    let d = sim();
    let va = mapped_for(&d, G, &[0]);
    let s = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    let e = Driver::event_create(&d).unwrap();
    assert_eq!(Driver::event_query(&d, e), Ok(true), "never recorded");
    assert_eq!(d.launch(s, va, G), OK);
    assert_eq!(d.event_record(e, s), OK);
    assert_eq!(Driver::event_query(&d, e), Ok(false), "work queued");
    let bogus = e + 1000;
    let err = Driver::event_query(&d, bogus).unwrap_err();
    assert_eq!(
        (err.call, err.code),
        (DriverCall::EventQuery, CUDA_ERROR_INVALID_HANDLE)
    );
    assert_eq!(Driver::event_destroy(&d, e), Ok(()));
    assert_eq!(d.event_query(e), CUDA_ERROR_INVALID_HANDLE, "destroyed");
    let err = Driver::event_destroy(&d, e).unwrap_err();
    assert_eq!(
        (err.call, err.code),
        (DriverCall::EventDestroy, CUDA_ERROR_INVALID_HANDLE)
    );
}

/// The `Driver` implementation's stream calls: `stream_destroy` destroys (the
/// handle is refused afterwards) and passes a refusal on as an error naming
/// `cuStreamDestroy`; `note_handoff` is the simulated driver's own check: a hand-off
/// of memory another stream's unordered queued work touches is a contract fault.
#[test]
fn the_driver_trait_destroys_streams_and_checks_handoffs() {
    use flare_package::driver::sim::{CUDA_ERROR_INVALID_HANDLE, CU_STREAM_NON_BLOCKING};
    use flare_package::driver::Stream;
    let d = sim();
    let va = mapped_for(&d, G, &[0]);
    let busy = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    let other = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    assert_eq!(d.launch(busy, va, G), OK);
    Driver::note_handoff(&d, Stream(other), va, G);
    assert_eq!(d.contract_faults(), 1, "unordered hand-off");
    let s = Driver::stream_create_blocking(&d).unwrap();
    assert_eq!(Driver::stream_destroy(&d, s), Ok(()));
    assert_eq!(d.stream_query(s.0), CUDA_ERROR_INVALID_HANDLE, "destroyed");
    let err = Driver::stream_destroy(&d, s).unwrap_err();
    assert_eq!(
        (err.call, err.code),
        (DriverCall::StreamDestroy, CUDA_ERROR_INVALID_HANDLE)
    );
}
