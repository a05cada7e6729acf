//! The simulated driver's fault injection: the nth call of a kind fails, counted from
//! the calls already made, changing nothing; injections queue, are cleared, and pass
//! through the trait wrapped with the call; a stream or event kind of `DriverCall`
//! is counted and failed as the stream call of the same name.

use crate::vmm_rows::{mapped, sim, G, INVALID, OK};
use flare_package::driver::sim::{SimState, SimStreamCall};
use flare_package::driver::{CuResult, Driver, DriverCall, DriverError};

// ---------------------------------------------------------------- fault injection

#[test]
fn injection_fails_exactly_the_nth_call() {
    let d = sim();
    d.inject_failure(DriverCall::Create, 3, CuResult::OUT_OF_MEMORY);
    assert!(d.mem_create(G).is_ok());
    assert!(d.mem_create(G).is_ok());
    assert_eq!(d.mem_create(G), Err(CuResult::OUT_OF_MEMORY));
    assert!(d.mem_create(G).is_ok());
    assert_eq!(d.call_count(DriverCall::Create), 4);
    assert_eq!(d.state().handles, 3);
    assert_eq!(d.pending_failures(), 0);
}

#[test]
fn injection_counts_from_the_calls_already_made() {
    let d = sim();
    for _ in 0..5 {
        let _ = d.mem_address_reserve(G, 0).unwrap();
    }
    d.inject_failure(DriverCall::Reserve, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_address_reserve(G, 0), Err(CuResult::UNKNOWN));
    assert!(d.mem_address_reserve(G, 0).is_ok());
}

#[test]
fn injected_failure_changes_nothing() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    let before = d.state();

    d.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    assert_eq!(d.mem_create(2 * G), Err(CuResult::OUT_OF_MEMORY));
    d.inject_failure(DriverCall::Reserve, 1, CuResult::OUT_OF_MEMORY);
    assert_eq!(
        d.mem_address_reserve(2 * G, 0),
        Err(CuResult::OUT_OF_MEMORY)
    );
    d.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_map(va, 2 * G, 0, h), CuResult::UNKNOWN);
    assert_eq!(d.state(), before);

    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    let before = d.state();
    d.inject_failure(DriverCall::SetAccess, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), CuResult::UNKNOWN);
    assert_eq!(d.touch(va, G, 0), INVALID);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), OK);
    let before_unmap = d.state();
    assert_ne!(before, before_unmap);
    d.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_unmap(va, 2 * G), CuResult::UNKNOWN);
    assert_eq!(d.state(), before_unmap);
    assert_eq!(d.touch(va, G, 0), OK);
    assert_eq!(d.mem_unmap(va, 2 * G), OK);

    d.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_release(h), CuResult::UNKNOWN);
    assert_eq!(d.state().handles, 1);
    assert_eq!(d.mem_release(h), OK);
    d.inject_failure(DriverCall::FreeReservation, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_address_free(va, 4 * G), CuResult::UNKNOWN);
    assert_eq!(d.state().reservations, 1);
    assert_eq!(d.mem_address_free(va, 4 * G), OK);
    assert_eq!(d.state(), SimState::default());
}

#[test]
fn injected_synchronize_failure_keeps_busy_marks_and_capture() {
    let d = sim();
    d.mark_busy(0x10_0000, G);
    d.inject_failure(DriverCall::Synchronize, 1, CuResult::LAUNCH_FAILED);
    assert_eq!(d.ctx_synchronize(0), CuResult::LAUNCH_FAILED);
    assert_eq!(d.busy_ranges().len(), 1);
    assert_eq!(d.begin_capture(), OK);
    d.inject_failure(DriverCall::Synchronize, 1, CuResult::UNKNOWN);
    assert_eq!(d.ctx_synchronize(0), CuResult::UNKNOWN);
    // The injected failure did not invalidate the capture.
    assert_eq!(d.end_capture(), OK);
    assert_eq!(d.ctx_synchronize(0), OK);
    assert!(d.busy_ranges().is_empty());
}

#[test]
fn multiple_injections_queue_for_same_and_different_kinds() {
    let d = sim();
    d.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    d.inject_failure(DriverCall::Create, 3, CuResult::UNKNOWN);
    d.inject_failure(DriverCall::Reserve, 2, CuResult::INVALID_VALUE);
    d.inject_failure(DriverCall::Granularity, 1, CuResult::NOT_INITIALIZED);
    d.inject_failure(DriverCall::MemGetInfo, 1, CuResult::INVALID_CONTEXT);
    assert_eq!(d.pending_failures(), 5);

    assert_eq!(d.mem_create(G), Err(CuResult::OUT_OF_MEMORY));
    assert!(d.mem_create(G).is_ok());
    assert_eq!(d.mem_create(G), Err(CuResult::UNKNOWN));
    assert!(d.mem_create(G).is_ok());

    assert!(d.mem_address_reserve(G, 0).is_ok());
    assert_eq!(d.mem_address_reserve(G, 0), Err(INVALID));
    assert!(d.mem_address_reserve(G, 0).is_ok());

    assert_eq!(
        d.granularity().unwrap_err(),
        DriverError::new(DriverCall::Granularity, CuResult::NOT_INITIALIZED)
    );
    assert_eq!(d.granularity().unwrap(), G);
    assert_eq!(
        d.mem_info().unwrap_err(),
        DriverError::new(DriverCall::MemGetInfo, CuResult::INVALID_CONTEXT)
    );
    assert!(d.mem_info().is_ok());
    assert_eq!(d.pending_failures(), 0);
}

#[test]
fn two_injections_for_the_same_call_fail_consecutive_calls() {
    let d = sim();
    d.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    d.inject_failure(DriverCall::Create, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_create(G), Err(CuResult::OUT_OF_MEMORY));
    assert_eq!(d.mem_create(G), Err(CuResult::UNKNOWN));
    assert!(d.mem_create(G).is_ok());
}

#[test]
fn clear_failures_drops_pending_injections() {
    let d = sim();
    d.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    d.inject_failure(DriverCall::Map, 2, CuResult::UNKNOWN);
    d.clear_failures();
    assert_eq!(d.pending_failures(), 0);
    assert!(d.mem_create(G).is_ok());
    let (va, _) = mapped(&d, G, 2 * G);
    let h = d.mem_create(G).unwrap();
    assert_eq!(d.mem_map(va + G, G, 0, h), OK);
}

#[test]
fn injection_through_the_trait_is_wrapped_with_the_call() {
    let d = sim();
    d.inject_failure(DriverCall::Map, 1, CuResult::NOT_SUPPORTED);
    let r = d.reserve(G).unwrap();
    let h = d.create(G).unwrap();
    assert_eq!(
        d.map(r.ptr, h).unwrap_err(),
        DriverError::new(DriverCall::Map, CuResult::NOT_SUPPORTED)
    );
    assert_eq!(d.state().mappings, 0);
    d.map(r.ptr, h).unwrap();
}

/// `inject_failure` and `call_count` take every [`DriverCall`]: a stream or event
/// kind is the stream call of the same name (`SimStreamCall::of_driver_call`: ten
/// of them, `cuEventCreate` through `cuStreamDestroy`), counted and failed there. An
/// injected `cuEventRecord` failure through `inject_failure` fails the next record
/// (a test author's trap before: it was queued among the memory calls, which never
/// count a record, and never fired); the memory kinds have no stream call.
#[test]
fn stream_kinds_of_driver_call_are_counted_and_failed_as_stream_calls() {
    use flare_package::driver::sim::CU_STREAM_NON_BLOCKING;
    const CUDA_ERROR_INVALID_VALUE: CuResult = CuResult::INVALID_VALUE;
    let stream_kinds = DriverCall::ALL
        .iter()
        .filter(|&&c| SimStreamCall::of_driver_call(c).is_some())
        .count();
    assert_eq!(stream_kinds, 10);
    for c in [
        DriverCall::Create,
        DriverCall::Map,
        DriverCall::Synchronize,
        DriverCall::HostAlloc,
        DriverCall::MemcpyHtoD,
        DriverCall::MemGetInfo,
    ] {
        assert_eq!(SimStreamCall::of_driver_call(c), None, "{c:?}");
    }
    assert_eq!(
        SimStreamCall::of_driver_call(DriverCall::EventRecord),
        Some(SimStreamCall::EventRecord)
    );
    let d = sim();
    let s = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    let e = Driver::event_create(&d).unwrap();
    assert_eq!(d.event_record(e, s), OK);
    assert_eq!(d.call_count(DriverCall::EventRecord), 1);
    assert_eq!(d.call_count(DriverCall::EventCreate), 1);
    assert_eq!(d.call_count(DriverCall::StreamCreate), 1);
    d.inject_failure(DriverCall::EventRecord, 1, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(d.event_record(e, s), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(d.event_record(e, s), OK, "one call failed");
    assert_eq!(d.call_count(DriverCall::EventRecord), 3);
    assert_eq!(d.stream_call_count(SimStreamCall::EventRecord), 3);
}
