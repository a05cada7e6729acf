//! The simulated driver's stream model (issue 11): stream handles, work queued on a
//! stream until the device finishes it, access for the stream's device, a context
//! synchronize of its device's streams only, events covering the work up to their
//! record, destroyed and unknown stream handles, the legacy stream ordering blocking
//! streams on every device, stream waits, the CUDA names of stream calls; and its
//! plumbing (stream calls injected to fail, `Send + Sync`, determinism).

use crate::common;

use common::mapped_for;

use std::thread;

use crate::capture_queries::{mapped, queued_streams, sim, sim_devices, G, LEGACY, OK};
use flare_package::driver::sim::{
    CaptureMode, SimConfig, SimDriver, SimStreamCall, SimWork, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_NOT_READY, CU_STREAM_DEFAULT,
};
use flare_package::driver::{CuResult, DriverCall};

// ====================================================================== streams and work

/// Streams: created handles are non-zero and distinct, the legacy stream is handle 0
/// (CUDA's NULL stream) and needs no creation; a handle that is not a live stream
/// (never created, an event's, destroyed) is INVALID_HANDLE (`cuStream*` on a bad
/// handle).
#[test]
fn stream_handles() {
    let d = sim();
    let s1 = d.stream_create().unwrap();
    let s2 = d.stream_create_with_flags(CU_STREAM_DEFAULT).unwrap();
    assert!(s1 != 0 && s2 != 0 && s1 != s2);
    let e = d.event_create().unwrap();
    assert!(e != s1 && e != s2);
    assert_eq!(d.stream_query(LEGACY), OK);
    assert_eq!(d.stream_synchronize(LEGACY), OK);
    assert_eq!(d.stream_query(s1), OK);
    assert_eq!(d.stream_query(0x1234), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.stream_query(e), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.stream_destroy(LEGACY), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.stream_destroy(s1), OK);
    assert_eq!(d.stream_query(s1), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.stream_destroy(s1), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.launch(s1, 0, 0), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(
        d.stream_create_with_flags(2),
        Err(CuResult::INVALID_VALUE),
        "an unknown flag bit"
    );
    assert_eq!(d.stream_call_count(SimStreamCall::StreamCreate), 3);
}

/// Queued work: a launch touches its range until the stream's work completes
/// (`stream_complete`), and `cuStreamQuery` says NOT_READY until then; completing one
/// stream leaves another's work queued.
#[test]
fn launched_work_stays_queued_until_its_stream_completes() {
    let d = sim();
    let buf = mapped(&d, 2 * G);
    let (s, t) = (d.stream_create().unwrap(), d.stream_create().unwrap());
    assert_eq!(d.launch(s, buf, G), OK);
    assert_eq!(d.launch(t, buf + G, G), OK);
    assert_eq!(d.stream_query(s), CUDA_ERROR_NOT_READY);
    assert_eq!(
        d.queued_work(),
        vec![
            SimWork {
                stream: s,
                device: 0,
                ptr: buf,
                bytes: G
            },
            SimWork {
                stream: t,
                device: 0,
                ptr: buf + G,
                bytes: G
            }
        ]
    );
    assert_eq!(d.stream_complete(s), OK);
    assert_eq!(d.stream_query(s), OK);
    assert_eq!(d.stream_query(t), CUDA_ERROR_NOT_READY);
    assert_eq!(queued_streams(&d), vec![t]);
    assert_eq!(d.stream_synchronize(t), OK);
    assert!(d.queued_work().is_empty());
    assert_eq!(d.stream_complete(0x1234), CUDA_ERROR_INVALID_HANDLE);
}

/// A launch needs its bytes mapped with access for the stream's device (row "any
/// access before cuMemSetAccess on a new mapping: INVALID_VALUE"); a refused launch
/// queues nothing.
#[test]
fn launch_needs_access_for_the_streams_device() {
    let d = sim_devices(2);
    let buf = mapped(&d, G);
    let s0 = d.stream_create().unwrap();
    assert_eq!(d.ctx_set_current(1), OK);
    let s1 = d.stream_create().unwrap();
    assert_eq!(d.launch(s1, buf, G), CuResult::INVALID_VALUE);
    assert_eq!(d.launch(s0, buf, 2 * G), CuResult::INVALID_VALUE);
    assert!(d.queued_work().is_empty());
    assert_eq!(d.ctx_set_current(2), CuResult::INVALID_DEVICE);
    assert_eq!(d.ctx_get_device(), 1);
}

/// `cuCtxSynchronize` of a device waits for all its streams' work (created and
/// legacy), and only its own: a stream of another device keeps its work queued
/// (row "cuCtxSynchronize waits only for its own context's work", the basis of the
/// per-device release synchronize).
#[test]
fn ctx_synchronize_completes_its_devices_streams_only() {
    let d = sim_devices(2);
    let buf = mapped_for(&d, 2 * G, &[0, 1]);
    let s0 = d.stream_create().unwrap();
    assert_eq!(d.launch(s0, buf, G), OK);
    assert_eq!(d.launch(LEGACY, buf, G), OK);
    let s1 = thread::scope(|sc| {
        sc.spawn(|| {
            assert_eq!(d.ctx_set_current(1), OK);
            let s1 = d.stream_create().unwrap();
            assert_eq!(d.launch(s1, buf + G, G), OK);
            assert_eq!(d.launch(LEGACY, buf + G, G), OK); // device 1's legacy stream
            s1
        })
        .join()
        .unwrap()
    });
    let devices: Vec<i32> = d.queued_work().iter().map(|w| w.device).collect();
    assert_eq!(devices, vec![0, 1, 0, 1]);
    assert_eq!(d.ctx_synchronize(0), OK);
    assert_eq!(d.stream_query(s0), OK);
    assert_eq!(d.stream_query(s1), CUDA_ERROR_NOT_READY);
    let devices: Vec<i32> = d.queued_work().iter().map(|w| w.device).collect();
    assert_eq!(devices, vec![1, 1]);
    assert_eq!(d.ctx_synchronize(1), OK);
    assert!(d.queued_work().is_empty());
}

/// An event covers the work queued on its stream up to its record: NOT_READY while
/// that work runs, SUCCESS once it completed; `cuEventSynchronize` completes exactly
/// that work, not what was queued after; re-recording moves it. An event never
/// recorded is complete (NVIDIA: query and synchronize return SUCCESS), and waiting on
/// it orders nothing.
#[test]
fn events_cover_the_work_up_to_their_record() {
    let d = sim();
    let buf = mapped(&d, 2 * G);
    let s = d.stream_create().unwrap();
    let e = d.event_create().unwrap();
    assert_eq!(d.event_query(e), OK);
    assert_eq!(d.event_synchronize(e), OK);
    assert_eq!(d.launch(s, buf, G), OK);
    assert_eq!(d.event_record(e, s), OK);
    assert_eq!(d.launch(s, buf + G, G), OK);
    assert_eq!(d.event_query(e), CUDA_ERROR_NOT_READY);
    assert_eq!(d.event_synchronize(e), OK);
    assert_eq!(d.event_query(e), OK);
    assert_eq!(
        d.queued_work().iter().map(|w| w.ptr).collect::<Vec<_>>(),
        vec![buf + G]
    );
    assert_eq!(d.stream_query(s), CUDA_ERROR_NOT_READY);
    assert_eq!(d.event_record(e, s), OK);
    assert_eq!(d.event_query(e), CUDA_ERROR_NOT_READY);
    assert_eq!(d.stream_complete(s), OK);
    assert_eq!(d.event_query(e), OK);
    assert_eq!(d.stream_call_count(SimStreamCall::EventQuery), 5);
    assert_eq!(d.stream_call_count(SimStreamCall::EventRecord), 2);
}

/// Destroying an event or a stream refuses its handle from then on; work queued
/// before still runs (NVIDIA: resources are released once the device completes it):
/// a destroyed stream's work stays queued until a device synchronize.
#[test]
fn destroy_refuses_the_handle_but_work_runs_on() {
    let d = sim();
    let buf = mapped(&d, G);
    let s = d.stream_create().unwrap();
    let e = d.event_create().unwrap();
    assert_eq!(d.launch(s, buf, G), OK);
    assert_eq!(d.event_record(e, s), OK);
    assert_eq!(d.event_destroy(e), OK);
    assert_eq!(d.event_query(e), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.event_destroy(e), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.stream_destroy(s), OK);
    assert_eq!(queued_streams(&d), vec![s]);
    assert_eq!(d.ctx_synchronize(0), OK);
    assert!(d.queued_work().is_empty());
    // The test can still finish a destroyed stream's work by its old handle.
    let t = d.stream_create().unwrap();
    assert_eq!(d.launch(t, buf, G), OK);
    assert_eq!(d.stream_destroy(t), OK);
    assert_eq!(d.stream_complete(t), OK);
    assert!(d.queued_work().is_empty());
    assert_eq!(d.stream_complete(t), OK);
}

/// `cuStreamWaitEvent`: S's later work runs after the work the event covers, so the
/// device finishing S's work has finished that work too; work queued on T after the
/// record is not covered.
#[test]
fn completing_a_stream_completes_what_it_waited_on() {
    let d = sim();
    let buf = mapped(&d, 3 * G);
    let (s, t) = (d.stream_create().unwrap(), d.stream_create().unwrap());
    let e = d.event_create().unwrap();
    assert_eq!(d.launch(t, buf, G), OK);
    assert_eq!(d.event_record(e, t), OK);
    assert_eq!(d.launch(t, buf + G, G), OK);
    assert_eq!(d.stream_wait_event(s, e), OK);
    assert_eq!(d.launch(s, buf + 2 * G, G), OK);
    assert_eq!(d.stream_complete(s), OK);
    assert_eq!(d.event_query(e), OK);
    assert_eq!(
        d.queued_work().iter().map(|w| w.ptr).collect::<Vec<_>>(),
        vec![buf + G]
    );
    // A wait with no work after it still holds the stream back.
    let (u, f) = (d.stream_create().unwrap(), d.event_create().unwrap());
    assert_eq!(d.event_record(f, t), OK);
    assert_eq!(d.stream_wait_event(u, f), OK);
    assert_eq!(d.stream_query(u), CUDA_ERROR_NOT_READY);
    assert_eq!(d.stream_synchronize(u), OK);
    assert!(d.queued_work().is_empty());
}

// ====================================================================== driver plumbing

/// Stream calls are counted and can be made to fail, one call at a time, with the
/// code given, changing nothing (as [`SimDriver::inject_failure`] for VMM calls);
/// `cuThreadExchangeStreamCaptureMode` never fails.
#[test]
fn stream_calls_can_be_injected_to_fail() {
    let d = sim();
    let buf = mapped(&d, G);
    let s = d.stream_create().unwrap();
    let e = d.event_create().unwrap();
    assert_eq!(d.launch(s, buf, G), OK);
    d.inject_stream_failure(SimStreamCall::EventRecord, 1, CuResult::UNKNOWN);
    assert_eq!(d.event_record(e, s), CuResult::UNKNOWN);
    assert_eq!(d.event_query(e), OK, "the failed record recorded nothing");
    assert_eq!(d.event_record(e, s), OK);
    d.inject_stream_failure(SimStreamCall::EventSynchronize, 1, CuResult::LAUNCH_FAILED);
    assert_eq!(d.event_synchronize(e), CuResult::LAUNCH_FAILED);
    assert_eq!(
        d.queued_work().len(),
        1,
        "the failed synchronize waited for nothing"
    );
    d.inject_stream_failure(SimStreamCall::StreamCreate, 2, CuResult::OUT_OF_MEMORY);
    assert!(d.stream_create().is_ok());
    assert_eq!(d.stream_create(), Err(CuResult::OUT_OF_MEMORY));
    d.inject_stream_failure(
        SimStreamCall::ThreadExchangeCaptureMode,
        1,
        CuResult::UNKNOWN,
    );
    assert_eq!(
        d.thread_exchange_capture_mode(CaptureMode::Global),
        CaptureMode::Global
    );
    assert_eq!(d.stream_call_count(SimStreamCall::EventRecord), 2);
    assert_eq!(d.stream_call_count(SimStreamCall::EventSynchronize), 1);
    assert_eq!(d.stream_call_count(SimStreamCall::StreamCreate), 3);
    // None of this is a VMM driver call.
    assert_eq!(d.call_count(DriverCall::Synchronize), 0);
}

/// The simulated driver with streams stays `Send + Sync` (the pool shares it across
/// threads) and deterministic: the same calls give the same handles.
#[test]
fn send_sync_and_deterministic() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SimDriver>();
    let run = || {
        let d = sim();
        let s = d.stream_create().unwrap();
        let e = d.event_create().unwrap();
        assert_eq!(d.stream_begin_capture(s, CaptureMode::Global), OK);
        let id = d.stream_get_capture_info(s).unwrap().id;
        (s, e, id)
    };
    assert_eq!(run(), run());
}

/// `SimStreamCall::cuda_name`: "the CUDA driver function this call stands for", one
/// per call and all distinct: the driver API's own names.
#[test]
fn stream_calls_name_their_cuda_functions() {
    use flare_package::driver::sim::SimStreamCall as C;
    let want = [
        (C::StreamCreate, "cuStreamCreate"),
        (C::StreamDestroy, "cuStreamDestroy"),
        (C::StreamQuery, "cuStreamQuery"),
        (C::StreamSynchronize, "cuStreamSynchronize"),
        (C::StreamWaitEvent, "cuStreamWaitEvent"),
        (C::StreamBeginCapture, "cuStreamBeginCapture"),
        (C::StreamEndCapture, "cuStreamEndCapture"),
        (C::StreamGetCaptureInfo, "cuStreamGetCaptureInfo"),
        (C::EventCreate, "cuEventCreate"),
        (C::EventDestroy, "cuEventDestroy"),
        (C::EventRecord, "cuEventRecord"),
        (C::EventQuery, "cuEventQuery"),
        (C::EventSynchronize, "cuEventSynchronize"),
        (
            C::ThreadExchangeCaptureMode,
            "cuThreadExchangeStreamCaptureMode",
        ),
    ];
    assert_eq!(C::ALL.len(), want.len());
    for (call, name) in want {
        assert!(C::ALL.contains(&call));
        assert_eq!(call.cuda_name(), name);
    }
}

/// "A handle that is not a live stream" is `CUDA_ERROR_INVALID_HANDLE`: a stream
/// destroyed while its work still runs (`cuStreamDestroy`: "the handle is refused
/// from now on"), and a value the driver never handed out, such as the simulator's
/// internal key of a device's legacy stream (`1 << 63`, created streams count up
/// from `1 << 32`), even once that legacy stream exists.
#[test]
fn destroyed_and_unknown_stream_handles_are_refused() {
    use flare_package::driver::sim::{CUDA_ERROR_INVALID_HANDLE, CU_STREAM_NON_BLOCKING};
    let d = sim();
    let va = mapped_for(&d, G, &[0]);
    let s = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    assert_eq!(d.launch(s, va, G), OK);
    assert_eq!(d.stream_destroy(s), OK);
    assert_eq!(d.stream_query(s), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.launch(s, va, G), CUDA_ERROR_INVALID_HANDLE);
    // The legacy stream of device 0 exists once used.
    assert_eq!(d.launch(0, va, G), OK);
    assert_eq!(d.stream_query(1 << 63), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.launch(1 << 63, va, G), CUDA_ERROR_INVALID_HANDLE);
}

/// The legacy stream synchronizes with the blocking streams of its own device, on
/// every device: on device 1 (the calling thread's current device, `cuCtxSetCurrent`),
/// work on a blocking stream runs after earlier legacy-stream work, so handing the
/// legacy stream's memory to it is ordered (no contract fault), while a
/// non-blocking stream's hand-off is not.
#[test]
fn the_legacy_stream_orders_blocking_streams_on_device_one_too() {
    use flare_package::driver::sim::{CU_STREAM_DEFAULT, CU_STREAM_NON_BLOCKING};
    let d = SimDriver::new(SimConfig {
        device_count: 2,
        ..SimConfig::default()
    });
    assert_eq!(d.ctx_set_current(1), OK);
    let va = d.mem_address_reserve(G, 0).unwrap();
    let h = d.mem_create(G).unwrap();
    assert_eq!(d.mem_map(va, G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, G, &[0, 1]), OK);
    let blocking = d.stream_create_with_flags(CU_STREAM_DEFAULT).unwrap();
    let nb = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    assert_eq!(d.launch(0, va, G), OK);
    assert_eq!(d.note_handoff(blocking, va, G), OK);
    assert_eq!(d.contract_faults(), 0, "blocking after legacy: ordered");
    assert_eq!(d.note_handoff(nb, va, G), OK);
    assert_eq!(d.contract_faults(), 1, "non-blocking vs legacy: unordered");
}
