//! The simulated driver's stream captures reproduce the rows of
//! `docs/vmm-semantics.md`, section "Stream capture" (measured on an H200): the VMM
//! calls during a capture, what breaks a capture in each mode and thread, the legacy
//! stream, captured launches, the capture errors, a stream joining a capture by an
//! event, a wait inside one capture, and the stream-less capture.
//!
//! Each test names the row or rule it checks; expected values come from the document
//! (or, where a test says so, from NVIDIA's documentation of the call), not from
//! running the simulator.

use std::thread;

use crate::capture_queries::{
    mapped, queued_streams, scene, sim, Caller, CALLERS, G, INVALIDATED, LEGACY, OK, UNSUPPORTED,
};
use flare_package::driver::sim::{
    CaptureMode, CaptureStatus, SimFault, CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_NOT_READY, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_STREAM_CAPTURE_MERGE,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, CU_STREAM_DEFAULT,
    CU_STREAM_NON_BLOCKING,
};

// ====================================================================== stream capture

/// Row "cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess, cuMemUnmap,
/// cuMemRelease, cuMemAddressFree: all succeed; the capture ends fine", for a stream
/// capture in each mode, the calls made by the capturing thread and another one.
#[test]
fn row_vmm_calls_during_a_stream_capture_all_succeed() {
    for mode in [
        CaptureMode::Global,
        CaptureMode::ThreadLocal,
        CaptureMode::Relaxed,
    ] {
        for caller in CALLERS {
            let d = sim();
            let a = d.stream_create().unwrap();
            assert_eq!(d.stream_begin_capture(a, mode), OK);
            let vmm = || {
                let h = d.mem_create(2 * G).unwrap();
                let va = d.mem_address_reserve(2 * G, 0).unwrap();
                assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
                assert_eq!(d.mem_set_access(va, 2 * G, &[0]), OK);
                assert_eq!(d.mem_unmap(va, 2 * G), OK);
                assert_eq!(d.mem_release(h), OK);
                assert_eq!(d.mem_address_free(va, 2 * G), OK);
            };
            match caller {
                Caller::Same => vmm(),
                Caller::Other => thread::scope(|sc| sc.spawn(vmm).join().unwrap()),
            }
            assert_eq!(d.stream_end_capture(a), OK, "{mode:?} {caller:?}");
            assert_eq!(d.contract_faults(), 0);
        }
    }
}

/// Row "cuCtxSynchronize: STREAM_CAPTURE_UNSUPPORTED, and the capture is invalidated",
/// and the paragraph after it: in global, thread-local or relaxed mode, the capture on
/// this thread or another, even after switching this thread to relaxed mode. The
/// synchronize waits for nothing (B's kernel stays queued) and is a contract fault.
#[test]
fn row_ctx_synchronize_breaks_a_capture_in_every_mode_and_thread() {
    for mode in [
        CaptureMode::Global,
        CaptureMode::ThreadLocal,
        CaptureMode::Relaxed,
    ] {
        for caller in CALLERS {
            for switched in [false, true] {
                let at = format!("{mode:?}, {caller:?}, caller relaxed: {switched}");
                let s = scene(mode);
                let sync = || {
                    if switched {
                        s.d.thread_exchange_capture_mode(CaptureMode::Relaxed);
                    }
                    let r = s.d.ctx_synchronize(0);
                    s.d.thread_exchange_capture_mode(CaptureMode::Global);
                    r
                };
                let r = match caller {
                    Caller::Same => sync(),
                    Caller::Other => thread::scope(|sc| sc.spawn(sync).join().unwrap()),
                };
                assert_eq!(r, UNSUPPORTED, "{at}");
                assert_eq!(queued_streams(&s.d).len(), 3, "{at}: nothing completed");
                assert_eq!(
                    s.d.faults(),
                    vec![SimFault::CaptureBroken {
                        call: "cuCtxSynchronize",
                        capture: 1
                    }],
                    "{at}"
                );
                assert_eq!(s.d.stream_end_capture(s.a), INVALIDATED, "{at}");
                // With the capture over, the synchronize works and completes it all.
                assert_eq!(s.d.ctx_synchronize(0), OK, "{at}");
                assert!(s.d.queued_work().is_empty(), "{at}");
            }
        }
    }
}

/// Paragraph of section "Stream capture": "an event recorded on the legacy stream and
/// waited on" fails with STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, in
/// every mode, the capture on this thread or another, even with the caller switched
/// to relaxed mode. (The query of that event likewise.)
#[test]
fn row_legacy_stream_event_wait_breaks_a_capture_even_in_relaxed_mode() {
    for mode in [
        CaptureMode::Global,
        CaptureMode::ThreadLocal,
        CaptureMode::Relaxed,
    ] {
        for caller in CALLERS {
            for query in [false, true] {
                let at = format!("{mode:?}, {caller:?}, query: {query}");
                let d = sim();
                let buf = mapped(&d, G);
                let a = d.stream_create().unwrap();
                let e = d.event_create().unwrap();
                assert_eq!(d.launch(LEGACY, buf, G), OK);
                assert_eq!(d.event_record(e, LEGACY), OK);
                assert_eq!(d.stream_begin_capture(a, mode), OK);
                let wait = || {
                    d.thread_exchange_capture_mode(CaptureMode::Relaxed);
                    let r = if query {
                        d.event_query(e)
                    } else {
                        d.event_synchronize(e)
                    };
                    d.thread_exchange_capture_mode(CaptureMode::Global);
                    r
                };
                let r = match caller {
                    Caller::Same => wait(),
                    Caller::Other => thread::scope(|sc| sc.spawn(wait).join().unwrap()),
                };
                assert_eq!(r, UNSUPPORTED, "{at}");
                assert_eq!(d.queued_work().len(), 1, "{at}: the wait completed nothing");
                assert_eq!(d.stream_end_capture(a), INVALIDATED, "{at}");
                assert_eq!(d.contract_faults(), 1, "{at}");
                // No capture: the same wait is fine.
                assert_eq!(d.event_synchronize(e), OK, "{at}");
                assert!(d.queued_work().is_empty(), "{at}");
            }
        }
    }
}

/// Row "`cuStreamIsCapturing(CU_STREAM_LEGACY)` reports not capturing when the
/// capturing stream is non-blocking; it returns CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
/// only for a blocking one". Asking does not break the capture.
#[test]
fn row_is_capturing_of_the_legacy_stream() {
    let d = sim();
    let nb = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    let blocking = d.stream_create_with_flags(CU_STREAM_DEFAULT).unwrap();
    assert_eq!(d.stream_begin_capture(nb, CaptureMode::Global), OK);
    assert_eq!(d.stream_is_capturing(LEGACY), Ok(CaptureStatus::None));
    assert_eq!(d.stream_end_capture(nb), OK);
    assert_eq!(d.stream_begin_capture(blocking, CaptureMode::Global), OK);
    assert_eq!(
        d.stream_is_capturing(LEGACY),
        Err(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    );
    assert_eq!(
        d.stream_get_capture_info(LEGACY),
        Err(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    );
    assert_eq!(d.stream_end_capture(blocking), OK);
    assert_eq!(d.stream_is_capturing(LEGACY), Ok(CaptureStatus::None));
    assert_eq!(d.contract_faults(), 0);
}

/// Implicit legacy-stream dependency (NVIDIA's `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`):
/// work queued on the legacy stream while a blocking stream is captured would depend
/// on the capture, which breaks it; while only a non-blocking stream is captured, the
/// legacy stream is independent of it.
#[test]
fn legacy_stream_work_breaks_the_capture_of_a_blocking_stream_only() {
    let d = sim();
    let buf = mapped(&d, G);
    let nb = d.stream_create().unwrap();
    assert_eq!(d.stream_begin_capture(nb, CaptureMode::Relaxed), OK);
    assert_eq!(d.launch(LEGACY, buf, G), OK);
    assert_eq!(d.stream_end_capture(nb), OK);
    let blocking = d.stream_create_with_flags(CU_STREAM_DEFAULT).unwrap();
    assert_eq!(d.stream_begin_capture(blocking, CaptureMode::Relaxed), OK);
    assert_eq!(d.launch(LEGACY, buf, G), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    assert_eq!(
        d.stream_is_capturing(blocking),
        Ok(CaptureStatus::Invalidated)
    );
    assert_eq!(d.stream_end_capture(blocking), INVALIDATED);
    assert_eq!(d.contract_faults(), 1);
    // One launch queued: the refused one queued nothing.
    assert_eq!(queued_streams(&d), vec![LEGACY]);
}

/// NVIDIA's rule for relaxed mode ("still prohibited from calls which necessarily
/// conflict with stream capture, e.g. cuEventQuery on an event last recorded inside
/// a capture sequence"): a query of an event recorded on the captured stream breaks
/// the capture whatever the modes; after the capture ends the event covers no work.
#[test]
fn query_of_an_event_recorded_inside_the_capture_breaks_it_even_relaxed() {
    let d = sim();
    let a = d.stream_create().unwrap();
    let e = d.event_create().unwrap();
    assert_eq!(d.stream_begin_capture(a, CaptureMode::Relaxed), OK);
    assert_eq!(d.event_record(e, a), OK);
    d.thread_exchange_capture_mode(CaptureMode::Relaxed);
    assert_eq!(d.event_query(e), UNSUPPORTED);
    d.thread_exchange_capture_mode(CaptureMode::Global);
    assert_eq!(d.stream_end_capture(a), INVALIDATED);
    assert_eq!(
        d.faults(),
        vec![SimFault::CaptureBroken {
            call: "cuEventQuery",
            capture: 1
        }]
    );
    assert_eq!(d.event_query(e), OK);
}

/// A stream being captured cannot be queried or synchronized (NVIDIA: illegal on a
/// capturing stream), whatever the modes: the call breaks its capture.
#[test]
fn query_or_synchronize_of_the_captured_stream_itself_breaks_it() {
    for sync in [false, true] {
        let d = sim();
        let a = d.stream_create().unwrap();
        assert_eq!(d.stream_begin_capture(a, CaptureMode::Relaxed), OK);
        d.thread_exchange_capture_mode(CaptureMode::Relaxed);
        let r = if sync {
            d.stream_synchronize(a)
        } else {
            d.stream_query(a)
        };
        d.thread_exchange_capture_mode(CaptureMode::Global);
        assert_eq!(r, UNSUPPORTED);
        assert_eq!(d.stream_end_capture(a), INVALIDATED);
        assert_eq!(d.contract_faults(), 1);
    }
}

/// A synchronize of the legacy stream during any capture breaks it like a device-wide
/// synchronize (section "Stream capture": the legacy stream synchronizes with other
/// streams), even with the caller relaxed.
#[test]
fn legacy_stream_synchronize_breaks_a_capture_even_relaxed() {
    let d = sim();
    let a = d.stream_create().unwrap();
    assert_eq!(d.stream_begin_capture(a, CaptureMode::Relaxed), OK);
    d.thread_exchange_capture_mode(CaptureMode::Relaxed);
    assert_eq!(d.stream_synchronize(LEGACY), UNSUPPORTED);
    assert_eq!(d.stream_query(LEGACY), UNSUPPORTED);
    d.thread_exchange_capture_mode(CaptureMode::Global);
    assert_eq!(d.stream_end_capture(a), INVALIDATED);
    assert_eq!(d.contract_faults(), 2);
}

/// During a capture, work on the captured stream is a graph node: nothing is queued,
/// so unmapping that memory is no fault; the capture counts the launch. Once the
/// capture is invalidated, launches on the stream fail with STREAM_CAPTURE_INVALIDATED
/// (NVIDIA's code for operations on an invalidated capture).
#[test]
fn captured_launches_queue_no_work() {
    let d = sim();
    let buf = mapped(&d, G);
    let a = d.stream_create().unwrap();
    assert_eq!(d.stream_begin_capture(a, CaptureMode::Global), OK);
    assert_eq!(d.launch(a, buf, G), OK);
    assert!(d.queued_work().is_empty());
    assert_eq!(d.stream_get_capture_info(a).unwrap().launches, 1);
    assert_eq!(d.ctx_synchronize(0), UNSUPPORTED);
    assert_eq!(d.launch(a, buf, G), INVALIDATED);
    let e = d.event_create().unwrap();
    assert_eq!(d.event_record(e, a), INVALIDATED);
    assert_eq!(d.stream_end_capture(a), INVALIDATED);
    assert_eq!(d.mem_unmap(buf, G), OK);
    assert_eq!(d.contract_faults(), 1); // the synchronize only
}

/// cuStreamBeginCapture / cuStreamEndCapture errors (NVIDIA's documentation): the
/// legacy stream cannot be captured; a stream already capturing cannot begin again;
/// ending a stream not capturing is ILLEGAL_STATE; a capture not begun in relaxed mode
/// must be ended by its own thread (WRONG_THREAD, and it stays open); a relaxed one may
/// be ended by any thread; unknown handles are INVALID_HANDLE.
#[test]
fn begin_and_end_capture_errors() {
    let d = sim();
    let a = d.stream_create().unwrap();
    assert_eq!(
        d.stream_begin_capture(LEGACY, CaptureMode::Global),
        UNSUPPORTED
    );
    assert_eq!(d.stream_end_capture(a), CUDA_ERROR_ILLEGAL_STATE);
    assert_eq!(d.stream_begin_capture(a, CaptureMode::Global), OK);
    assert_eq!(
        d.stream_begin_capture(a, CaptureMode::Global),
        CUDA_ERROR_ILLEGAL_STATE
    );
    let other = thread::scope(|sc| sc.spawn(|| d.stream_end_capture(a)).join().unwrap());
    assert_eq!(other, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    assert_eq!(d.stream_is_capturing(a), Ok(CaptureStatus::Active));
    assert_eq!(d.stream_destroy(a), CUDA_ERROR_ILLEGAL_STATE);
    assert_eq!(d.stream_end_capture(a), OK);
    assert_eq!(d.stream_begin_capture(a, CaptureMode::Relaxed), OK);
    let other = thread::scope(|sc| sc.spawn(|| d.stream_end_capture(a)).join().unwrap());
    assert_eq!(other, OK);
    assert_eq!(d.stream_is_capturing(a), Ok(CaptureStatus::None));
    assert_eq!(
        d.stream_begin_capture(0x1234, CaptureMode::Global),
        CUDA_ERROR_INVALID_HANDLE
    );
    assert_eq!(d.stream_end_capture(0x1234), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.contract_faults(), 0);
}

/// Cross-stream capture (NVIDIA): a stream that waits on an event recorded in a
/// capture joins it; it cannot end the capture it joined (UNMATCHED); the origin's end
/// ends it for both. A stream of another capture waiting on it would merge two
/// captures (MERGE).
#[test]
fn a_stream_waiting_on_a_captured_event_joins_the_capture() {
    let d = sim();
    let buf = mapped(&d, G);
    let (a, b, c) = (
        d.stream_create().unwrap(),
        d.stream_create().unwrap(),
        d.stream_create().unwrap(),
    );
    let e = d.event_create().unwrap();
    assert_eq!(d.stream_begin_capture(a, CaptureMode::Global), OK);
    assert_eq!(d.stream_begin_capture(c, CaptureMode::Global), OK);
    assert_eq!(d.stream_captures_open(), 2);
    assert!(!d.is_capturing(), "the stream-less capture is not open");
    assert_eq!(d.event_record(e, a), OK);
    assert_eq!(d.stream_wait_event(b, e), OK);
    let info = d.stream_get_capture_info(b).unwrap();
    assert_eq!((info.status, info.id), (CaptureStatus::Active, 1));
    assert_eq!(d.launch(b, buf, G), OK);
    assert!(d.queued_work().is_empty(), "b's launch is a graph node");
    assert_eq!(d.stream_wait_event(c, e), CUDA_ERROR_STREAM_CAPTURE_MERGE);
    assert_eq!(d.stream_end_capture(b), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    assert_eq!(d.stream_end_capture(a), OK);
    assert_eq!(d.stream_is_capturing(b), Ok(CaptureStatus::None));
    assert_eq!(d.stream_end_capture(c), OK);
    assert_eq!(d.stream_captures_open(), 0);
}

// ====================================================================== the stream-less capture

/// The stream-less capture ([`SimDriver::begin_capture`], phase 1) keeps its meaning:
/// cuCtxSynchronize during it is refused and invalidates it (row "cuCtxSynchronize"),
/// but is not a contract fault (the phase-1 pool expects and retries it); for the
/// query rules it is another thread's global-mode capture.
#[test]
fn the_stream_less_capture_keeps_its_contract() {
    let d = sim();
    let buf = mapped(&d, G);
    let b = d.stream_create().unwrap();
    let e = d.event_create().unwrap();
    assert_eq!(d.launch(b, buf, G), OK);
    assert_eq!(d.event_record(e, b), OK);
    assert_eq!(d.begin_capture(), OK);
    assert!(d.is_capturing());
    assert_eq!(d.ctx_synchronize(0), UNSUPPORTED);
    assert_eq!(d.event_query(e), UNSUPPORTED);
    d.thread_exchange_capture_mode(CaptureMode::Relaxed);
    assert_eq!(d.event_query(e), CUDA_ERROR_NOT_READY);
    d.thread_exchange_capture_mode(CaptureMode::Global);
    assert_eq!(
        d.stream_captures_open(),
        0,
        "the stream-less capture is on no stream"
    );
    assert_eq!(d.end_capture(), INVALIDATED);
    assert!(!d.is_capturing());
    assert_eq!(d.contract_faults(), 0);
    assert!(d.faults().is_empty());
}

/// `cuStreamWaitEvent`: `CUDA_ERROR_STREAM_CAPTURE_MERGE` only "when a stream in one
/// capture waits on an event of another". NVIDIA's cross-stream capture forks and
/// joins inside one capture: s2 waits on an event s1 recorded in the capture (s2
/// joins it), s1 then waits on an event s2 recorded in that same capture (the join),
/// which is legal, and the capture ends fine; a stream in another capture waiting
/// on s1's event is the merge error.
#[test]
fn a_wait_inside_one_capture_is_legal() {
    use flare_package::driver::sim::{CaptureMode, CUDA_ERROR_STREAM_CAPTURE_MERGE};
    let d = sim();
    let flags = flare_package::driver::sim::CU_STREAM_NON_BLOCKING;
    let (s1, s2, s3) = (
        d.stream_create_with_flags(flags).unwrap(),
        d.stream_create_with_flags(flags).unwrap(),
        d.stream_create_with_flags(flags).unwrap(),
    );
    let (fork, join) = (d.event_create().unwrap(), d.event_create().unwrap());
    assert_eq!(d.stream_begin_capture(s1, CaptureMode::Global), OK);
    assert_eq!(d.event_record(fork, s1), OK);
    assert_eq!(d.stream_wait_event(s2, fork), OK, "s2 joins the capture");
    assert_eq!(d.event_record(join, s2), OK);
    assert_eq!(
        d.stream_wait_event(s1, join),
        OK,
        "the join, in one capture"
    );
    assert_eq!(d.stream_wait_event(s1, fork), OK, "its own event");
    assert_eq!(d.stream_begin_capture(s3, CaptureMode::Global), OK);
    assert_eq!(
        d.stream_wait_event(s3, fork),
        CUDA_ERROR_STREAM_CAPTURE_MERGE
    );
    assert_eq!(d.stream_end_capture(s3), OK);
    assert_eq!(d.stream_end_capture(s1), OK);
}
