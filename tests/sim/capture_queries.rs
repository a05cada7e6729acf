//! One concern in one file: one test per measured stream, event and capture row.
//!
//! The simulated driver's streams, queued work, events and captures reproduce the rows
//! of `docs/vmm-semantics.md`, sections "Stream capture" and "Events and stream
//! queries while another stream is captured" (measured on an H200), and the rules of
//! its stream model (issue 11): work queued on a stream until the device finishes it,
//! events covering the work up to their record, stream order and the legacy stream's
//! implicit order, and the contract faults.
//!
//! Each test names the row or rule it checks; expected values come from the document
//! (or, where a test says so, from NVIDIA's documentation of the call), not from
//! running the simulator.

use crate::common;

use common::mapped_for;

use std::thread;

use flare_package::driver::sim::{
    CaptureMode, CaptureStatus, SimConfig, SimDriver, SimFault, SimStreamCall, SimWork,
    CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_READY,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_STREAM_CAPTURE_MERGE,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, CU_STREAM_DEFAULT,
    CU_STREAM_NON_BLOCKING, SIM_LEGACY_STREAM,
};
use flare_package::driver::{CuResult, DevicePtr, DriverCall};

const G: u64 = 2 << 20;
const OK: CuResult = CuResult::SUCCESS;
const UNSUPPORTED: CuResult = CuResult::STREAM_CAPTURE_UNSUPPORTED;
const INVALIDATED: CuResult = CuResult::STREAM_CAPTURE_INVALIDATED;
const LEGACY: u64 = SIM_LEGACY_STREAM;

fn sim() -> SimDriver {
    SimDriver::new(SimConfig::default())
}

fn sim_devices(n: u32) -> SimDriver {
    SimDriver::new(SimConfig {
        device_count: n,
        ..SimConfig::default()
    })
}

fn mapped(d: &SimDriver, size: u64) -> DevicePtr {
    mapped_for(d, size, &[0])
}

/// The streams that have queued work, one entry per launch.
fn queued_streams(d: &SimDriver) -> Vec<u64> {
    d.queued_work().iter().map(|w| w.stream).collect()
}

// ====================================================================== the table
//
// "Events and stream queries while another stream is captured": stream A
// (non-blocking) is being captured; the call is made on stream B (non-blocking, not
// captured, with a kernel still running on it), from the capturing thread ("same")
// or another thread ("other"). "Breaks": the call returns STREAM_CAPTURE_UNSUPPORTED
// and EndCapture on A then returns STREAM_CAPTURE_INVALIDATED.

/// The columns of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Column {
    /// "A captured in global mode".
    Global,
    /// "thread-local mode".
    ThreadLocal,
    /// "relaxed mode".
    Relaxed,
    /// "global mode, caller switched itself to relaxed first".
    GlobalCallerRelaxed,
}

const COLUMNS: [Column; 4] = [
    Column::Global,
    Column::ThreadLocal,
    Column::Relaxed,
    Column::GlobalCallerRelaxed,
];

impl Column {
    fn capture_mode(self) -> CaptureMode {
        match self {
            Column::Global | Column::GlobalCallerRelaxed => CaptureMode::Global,
            Column::ThreadLocal => CaptureMode::ThreadLocal,
            Column::Relaxed => CaptureMode::Relaxed,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Caller {
    Same,
    Other,
}

const CALLERS: [Caller; 2] = [Caller::Same, Caller::Other];

/// What the rows "event query", "event synchronize", "stream query" and "stream
/// synchronize" say: breaks in global mode (same and other thread), in thread-local
/// mode on the same thread only, never in relaxed mode or with the caller switched to
/// relaxed first.
fn query_row_breaks(column: Column, caller: Caller) -> bool {
    match column {
        Column::Global => true,
        Column::ThreadLocal => caller == Caller::Same,
        Column::Relaxed | Column::GlobalCallerRelaxed => false,
    }
}

/// The scene of the table: A captured (mode of the column) by the test's thread, B
/// with a kernel running, an event recorded on B before the capture and one during
/// it (after a second kernel on B), and stream C with a kernel and an event.
struct Scene {
    d: SimDriver,
    a: u64,
    b: u64,
    c: u64,
    /// Recorded on B before the capture (covers B's first kernel).
    before: u64,
    /// Recorded on B during the capture (covers both of B's kernels).
    during: u64,
    /// Recorded on C before the capture.
    on_c: u64,
    /// An event never recorded.
    fresh: u64,
}

fn scene(mode: CaptureMode) -> Scene {
    let d = sim();
    let buf = mapped(&d, 4 * G);
    let a = d.stream_create().unwrap();
    let b = d.stream_create().unwrap();
    let c = d.stream_create().unwrap();
    let (before, during, on_c, fresh) = (
        d.event_create().unwrap(),
        d.event_create().unwrap(),
        d.event_create().unwrap(),
        d.event_create().unwrap(),
    );
    assert_eq!(d.launch(b, buf, G), OK);
    assert_eq!(d.event_record(before, b), OK);
    assert_eq!(d.launch(c, buf + 3 * G, G), OK);
    assert_eq!(d.event_record(on_c, c), OK);
    assert_eq!(d.stream_begin_capture(a, mode), OK);
    assert_eq!(d.launch(a, buf + 2 * G, G), OK); // a graph node, not work
    assert_eq!(d.launch(b, buf + G, G), OK);
    assert_eq!(d.event_record(during, b), OK);
    Scene {
        d,
        a,
        b,
        c,
        before,
        during,
        on_c,
        fresh,
    }
}

/// What one cell did.
struct Cell<R> {
    result: R,
    /// `stream_end_capture(A)` by the capturing thread, after the call.
    end: CuResult,
    faults: Vec<SimFault>,
    /// Launches of B still queued right after the call (B had 2).
    b_queued: usize,
}

/// Runs `call` in the scene of `column`, from `caller`; the caller switches itself to
/// relaxed mode around the call in the last column (and the test checks the exchange
/// hands back the previous mode).
fn cell<R: Send>(column: Column, caller: Caller, call: impl Fn(&Scene) -> R + Sync) -> Cell<R> {
    let s = scene(column.capture_mode());
    let make_call = || {
        let switched = column == Column::GlobalCallerRelaxed;
        if switched {
            assert_eq!(
                s.d.thread_exchange_capture_mode(CaptureMode::Relaxed),
                CaptureMode::Global
            );
        }
        let r = call(&s);
        if switched {
            assert_eq!(
                s.d.thread_exchange_capture_mode(CaptureMode::Global),
                CaptureMode::Relaxed
            );
        }
        r
    };
    let result = match caller {
        Caller::Same => make_call(),
        Caller::Other => thread::scope(|sc| sc.spawn(make_call).join().unwrap()),
    };
    let b_queued = queued_streams(&s.d).iter().filter(|&&x| x == s.b).count();
    let faults = s.d.faults();
    let end = s.d.stream_end_capture(s.a);
    Cell {
        result,
        end,
        faults,
        b_queued,
    }
}

/// Checks a query/synchronize row: where it breaks, `UNSUPPORTED`, the capture's end
/// `INVALIDATED`, one capture-broken fault naming `cuda_name` and nothing completed;
/// where legal, `legal`, the end `SUCCESS`, no fault, and `left` of B's two launches
/// still queued.
fn check_query_row(
    row: &str,
    cuda_name: &'static str,
    legal: CuResult,
    left: usize,
    call: impl Fn(&Scene) -> CuResult + Sync + Copy,
) {
    for column in COLUMNS {
        for caller in CALLERS {
            let at = format!("row {row:?}, column {column:?}, {caller:?} thread");
            let c = cell(column, caller, call);
            if query_row_breaks(column, caller) {
                assert_eq!(c.result, UNSUPPORTED, "{at}: the call breaks");
                assert_eq!(c.end, INVALIDATED, "{at}: the end capture");
                assert_eq!(
                    c.faults,
                    vec![SimFault::CaptureBroken {
                        call: cuda_name,
                        capture: 1
                    }],
                    "{at}"
                );
                assert_eq!(c.b_queued, 2, "{at}: a refused call completes nothing");
            } else {
                assert_eq!(c.result, legal, "{at}: the call is legal");
                assert_eq!(c.end, OK, "{at}: the capture stays valid");
                assert!(c.faults.is_empty(), "{at}: {:?}", c.faults);
                assert_eq!(c.b_queued, left, "{at}");
            }
        }
    }
}

/// Row "event record": legal in every column, from the same and another thread; the
/// capture stays valid.
#[test]
fn row_event_record_on_another_stream_is_legal_in_every_mode() {
    for column in COLUMNS {
        for caller in CALLERS {
            let c = cell(column, caller, |s| s.d.event_record(s.fresh, s.b));
            let at = format!("{column:?}, {caller:?}");
            assert_eq!(c.result, OK, "{at}");
            assert_eq!(c.end, OK, "{at}");
            assert!(c.faults.is_empty(), "{at}");
            assert_eq!(c.b_queued, 2, "{at}: a record waits for nothing");
        }
    }
}

/// Row "stream wait on an event": legal in every column, same and other thread, for
/// an event recorded before the capture (on C) or during it (on B); the capture stays
/// valid.
#[test]
fn row_stream_wait_event_on_another_stream_is_legal_in_every_mode() {
    for column in COLUMNS {
        for caller in CALLERS {
            let c = cell(column, caller, |s| {
                (
                    s.d.stream_wait_event(s.b, s.on_c),
                    s.d.stream_wait_event(s.c, s.during),
                )
            });
            let at = format!("{column:?}, {caller:?}");
            assert_eq!(c.result, (OK, OK), "{at}");
            assert_eq!(c.end, OK, "{at}");
            assert!(c.faults.is_empty(), "{at}");
        }
    }
}

/// Row "event query (recorded before the capture)": breaks in global mode (same and
/// other thread); thread-local: breaks on the same thread, legal (NOT_READY: B's
/// kernel still runs) on another; relaxed: legal; global with the caller switched to
/// relaxed first: legal, capture stays valid.
#[test]
fn row_event_query_recorded_before_the_capture() {
    check_query_row(
        "event query (before)",
        "cuEventQuery",
        CUDA_ERROR_NOT_READY,
        2,
        |s| s.d.event_query(s.before),
    );
}

/// Row "event query (recorded during the capture)" (on B, which is not captured):
/// the same columns as recorded before.
#[test]
fn row_event_query_recorded_during_the_capture() {
    check_query_row(
        "event query (during)",
        "cuEventQuery",
        CUDA_ERROR_NOT_READY,
        2,
        |s| s.d.event_query(s.during),
    );
}

/// Row "event synchronize": breaks in global mode (same and other); thread-local:
/// breaks on the same thread, legal on another; relaxed and caller-switched: legal.
/// Where legal, it waits for B's first kernel (recorded before), which completes it,
/// and not B's second.
#[test]
fn row_event_synchronize() {
    check_query_row("event synchronize", "cuEventSynchronize", OK, 1, |s| {
        s.d.event_synchronize(s.before)
    });
    // Recorded during the capture: covers both of B's kernels.
    check_query_row("event synchronize", "cuEventSynchronize", OK, 0, |s| {
        s.d.event_synchronize(s.during)
    });
}

/// Row "stream query": breaks in global mode; thread-local: breaks on the same
/// thread; relaxed and caller-switched: legal (NOT_READY, B's kernel runs).
#[test]
fn row_stream_query() {
    check_query_row(
        "stream query",
        "cuStreamQuery",
        CUDA_ERROR_NOT_READY,
        2,
        |s| s.d.stream_query(s.b),
    );
}

/// Row "stream synchronize": breaks in global mode; thread-local: breaks on the same
/// thread; relaxed and caller-switched: legal, and B's work is complete afterwards.
#[test]
fn row_stream_synchronize() {
    check_query_row("stream synchronize", "cuStreamSynchronize", OK, 0, |s| {
        s.d.stream_synchronize(s.b)
    });
}

/// Row "`GetCaptureInfo` of A": legal in every column, same and other thread: A is
/// being captured (active, capture 1, the column's mode, the one launch recorded into
/// it), and the capture stays valid.
#[test]
fn row_get_capture_info_of_the_captured_stream_is_legal_in_every_mode() {
    for column in COLUMNS {
        for caller in CALLERS {
            let c = cell(column, caller, |s| {
                (
                    s.d.stream_get_capture_info(s.a),
                    s.d.stream_is_capturing(s.a),
                    s.d.stream_is_capturing(s.b),
                )
            });
            let at = format!("{column:?}, {caller:?}");
            let (info, a, b) = c.result;
            let info = info.unwrap();
            assert_eq!(info.status, CaptureStatus::Active, "{at}");
            assert_eq!(info.id, 1, "{at}");
            assert_eq!(info.mode, column.capture_mode(), "{at}");
            assert_eq!(info.launches, 1, "{at}");
            assert_eq!(a, Ok(CaptureStatus::Active), "{at}");
            assert_eq!(b, Ok(CaptureStatus::None), "{at}");
            assert_eq!(c.end, OK, "{at}");
            assert!(c.faults.is_empty(), "{at}");
        }
    }
}

/// The paragraph after the table: the switch to relaxed mode is the caller's own
/// (`cuThreadExchangeStreamCaptureMode` is per thread): a thread that switched makes
/// a legal query while another thread, still in global mode, breaks the capture.
#[test]
fn exchange_capture_mode_is_per_thread() {
    let s = scene(CaptureMode::Global);
    assert_eq!(
        s.d.thread_exchange_capture_mode(CaptureMode::Relaxed),
        CaptureMode::Global
    );
    // This thread (the capturing one) is relaxed: legal.
    assert_eq!(s.d.event_query(s.before), CUDA_ERROR_NOT_READY);
    thread::scope(|sc| {
        sc.spawn(|| {
            // A new thread starts in global mode, and the switch above is not its.
            assert_eq!(
                s.d.thread_exchange_capture_mode(CaptureMode::Global),
                CaptureMode::Global
            );
            assert_eq!(s.d.event_query(s.before), UNSUPPORTED);
        })
        .join()
        .unwrap();
    });
    assert_eq!(
        s.d.thread_exchange_capture_mode(CaptureMode::Global),
        CaptureMode::Relaxed
    );
    assert_eq!(s.d.stream_end_capture(s.a), INVALIDATED);
    assert_eq!(s.d.contract_faults(), 1);
    assert_eq!(
        s.d.stream_call_count(SimStreamCall::ThreadExchangeCaptureMode),
        3
    );
}

/// NVIDIA's rule for a thread in thread-local mode (`cuThreadExchangeStreamCapture
/// Mode`: "concurrent capture sequences in other threads are ignored"): another
/// thread's global-mode capture does not forbid it a query; its own does.
#[test]
fn thread_local_caller_ignores_other_threads_captures() {
    let s = scene(CaptureMode::Global);
    thread::scope(|sc| {
        sc.spawn(|| {
            s.d.thread_exchange_capture_mode(CaptureMode::ThreadLocal);
            assert_eq!(s.d.event_query(s.before), CUDA_ERROR_NOT_READY);
            assert_eq!(s.d.stream_query(s.b), CUDA_ERROR_NOT_READY);
            // Its own capture (thread-local or global) forbids it.
            assert_eq!(s.d.stream_begin_capture(s.c, CaptureMode::Global), OK);
            assert_eq!(s.d.event_query(s.before), UNSUPPORTED);
            assert_eq!(s.d.stream_end_capture(s.c), INVALIDATED);
        })
        .join()
        .unwrap();
    });
    assert_eq!(s.d.stream_end_capture(s.a), OK);
}

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

// ====================================================================== contract faults

/// Section "In-flight work: unmap does not wait": unmapping memory that queued work
/// still touches succeeds at once (the kernel would then fault) and is a contract
/// fault; after the work completed it is none. Releasing a handle that is still mapped
/// is none (row "cuMemRelease while the handle is still mapped: memory stays usable");
/// the unmap that then frees it is.
#[test]
fn unmapping_memory_queued_work_touches_is_a_fault() {
    let d = sim();
    let s = d.stream_create().unwrap();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), OK);
    assert_eq!(d.launch(s, va + G, 1), OK);
    assert_eq!(d.mem_release(h), OK);
    assert_eq!(d.contract_faults(), 0, "release of a mapped handle");
    assert_eq!(d.mem_unmap(va, 2 * G), OK);
    assert_eq!(
        d.faults(),
        vec![SimFault::UnmapWhileQueued {
            ptr: va,
            size: 2 * G,
            stream: s
        }]
    );
    assert_eq!(d.contract_faults(), 1);
    // The same after the work completed: no fault.
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va + 2 * G, 2 * G, 0, h), OK);
    assert_eq!(d.mem_set_access(va + 2 * G, 2 * G, &[0]), OK);
    assert_eq!(d.launch(LEGACY, va + 2 * G, 2 * G), OK);
    assert_eq!(d.stream_complete(LEGACY), OK);
    assert_eq!(d.mem_unmap(va + 2 * G, 2 * G), OK);
    assert_eq!(d.mem_release(h), OK);
    assert_eq!(d.contract_faults(), 1);
    // Both handles were freed at their last unmap, the faulting one included.
    assert_eq!(d.state().physical_bytes, 0);
}

/// Work queued on a legacy stream, and work on another range, are found the same way:
/// an unmap faults only where a queued launch overlaps it.
#[test]
fn unmap_faults_only_where_queued_work_overlaps() {
    let d = sim();
    let buf = mapped(&d, 2 * G);
    let other = mapped(&d, 2 * G);
    assert_eq!(d.launch(LEGACY, buf, 2 * G), OK);
    assert_eq!(d.mem_unmap(other, 2 * G), OK);
    assert_eq!(d.contract_faults(), 0);
    assert_eq!(d.mem_unmap(buf, 2 * G), OK);
    assert_eq!(
        d.faults(),
        vec![SimFault::UnmapWhileQueued {
            ptr: buf,
            size: 2 * G,
            stream: LEGACY
        }]
    );
}

/// Handing memory to stream S while another stream T's queued work still touches it
/// is a fault unless that work is ordered before S's next work: completed, or covered
/// by an event S waited on. S's own work is in stream order.
#[test]
fn handoff_while_another_streams_unordered_work_touches_it_is_a_fault() {
    let d = sim();
    let buf = mapped(&d, 2 * G);
    let (s, t) = (d.stream_create().unwrap(), d.stream_create().unwrap());
    // S's own work: stream order.
    assert_eq!(d.launch(s, buf, G), OK);
    assert_eq!(d.note_handoff(s, buf, G), OK);
    assert_eq!(d.contract_faults(), 0);
    // T's work, unordered with S.
    assert_eq!(d.note_handoff(t, buf, 2 * G), OK);
    assert_eq!(
        d.faults(),
        vec![SimFault::HandoffWhileQueued {
            stream: t,
            ptr: buf,
            size: 2 * G,
            other: s
        }]
    );
    // An event recorded before S's work does not cover it.
    let early = d.event_create().unwrap();
    let s2 = d.stream_create().unwrap();
    assert_eq!(d.event_record(early, s2), OK);
    assert_eq!(d.launch(s2, buf + G, G), OK);
    assert_eq!(d.stream_wait_event(t, early), OK);
    assert_eq!(d.note_handoff(t, buf + G, G), OK);
    assert_eq!(d.contract_faults(), 2);
    // T waits on an event recorded after the work: ordered.
    let e = d.event_create().unwrap();
    assert_eq!(d.event_record(e, s2), OK);
    assert_eq!(d.stream_wait_event(t, e), OK);
    assert_eq!(d.note_handoff(t, buf + G, G), OK);
    assert_eq!(d.contract_faults(), 2);
    // Completed work is no obstacle.
    assert_eq!(d.stream_complete(s), OK);
    assert_eq!(d.note_handoff(t, buf, G), OK);
    assert_eq!(d.contract_faults(), 2);
    // No work on the range at all.
    let u = d.stream_create().unwrap();
    assert_eq!(d.note_handoff(u, buf, G), OK);
    assert_eq!(d.contract_faults(), 2);
    assert_eq!(d.note_handoff(0x1234, buf, G), CUDA_ERROR_INVALID_HANDLE);
}

/// The legacy default stream synchronizes with blocking streams (`CU_STREAM_DEFAULT`)
/// and not with non-blocking ones: work on the legacy stream runs after earlier work
/// of blocking streams, and work on a blocking stream after earlier legacy work. So a
/// handoff across that pair is ordered, one to or from a non-blocking stream is a
/// fault, and the device finishing the legacy stream's work has finished the blocking
/// stream's earlier work.
#[test]
fn the_legacy_stream_synchronizes_with_blocking_streams_only() {
    let d = sim();
    let buf = mapped(&d, 4 * G);
    let blocking = d.stream_create_with_flags(CU_STREAM_DEFAULT).unwrap();
    let nb = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    assert_eq!(d.launch(blocking, buf, G), OK);
    assert_eq!(d.launch(nb, buf + G, G), OK);
    assert_eq!(d.note_handoff(LEGACY, buf, G), OK);
    assert_eq!(d.contract_faults(), 0, "legacy after blocking: ordered");
    assert_eq!(d.note_handoff(LEGACY, buf + G, G), OK);
    assert_eq!(d.contract_faults(), 1, "legacy vs non-blocking: unordered");
    assert_eq!(d.launch(LEGACY, buf + 2 * G, G), OK);
    assert_eq!(d.note_handoff(blocking, buf + 2 * G, G), OK);
    assert_eq!(d.contract_faults(), 1, "blocking after legacy: ordered");
    assert_eq!(d.note_handoff(nb, buf + 2 * G, G), OK);
    assert_eq!(d.contract_faults(), 2, "non-blocking vs legacy: unordered");
    // The legacy launch ran after the blocking stream's first launch.
    assert_eq!(d.stream_complete(LEGACY), OK);
    assert_eq!(d.stream_query(blocking), OK);
    assert_eq!(d.stream_query(nb), CUDA_ERROR_NOT_READY);
    // An event recorded on the legacy stream covers blocking streams' earlier work.
    assert_eq!(d.launch(blocking, buf + 3 * G, G), OK);
    let e = d.event_create().unwrap();
    assert_eq!(d.event_record(e, LEGACY), OK);
    assert_eq!(d.event_synchronize(e), OK);
    assert_eq!(queued_streams(&d), vec![nb]);
}

/// The legacy stream is the calling thread's current device's (`cuCtxSetCurrent`):
/// two threads on two devices name different legacy streams with the same handle 0.
#[test]
fn the_legacy_stream_is_the_current_devices() {
    let d = sim_devices(2);
    let buf = mapped_for(&d, G, &[0, 1]);
    thread::scope(|sc| {
        sc.spawn(|| {
            assert_eq!(d.ctx_set_current(1), OK);
            assert_eq!(d.launch(LEGACY, buf, G), OK);
        })
        .join()
        .unwrap();
    });
    assert_eq!(
        d.queued_work(),
        vec![SimWork {
            stream: LEGACY,
            device: 1,
            ptr: buf,
            bytes: G
        }]
    );
    // This thread's legacy stream (device 0) has nothing queued.
    assert_eq!(d.stream_query(LEGACY), OK);
    assert_eq!(d.ctx_synchronize(0), OK);
    assert_eq!(d.queued_work().len(), 1);
    assert_eq!(d.ctx_synchronize(1), OK);
    assert!(d.queued_work().is_empty());
}

/// `contract_faults` counts every kind, and equals the length of `faults()`: an
/// unmap of queued memory, an unordered handoff, a broken stream capture.
#[test]
fn contract_faults_count_every_kind_and_match_the_list() {
    let d = sim();
    let buf = mapped(&d, 2 * G);
    let (s, t, a) = (
        d.stream_create().unwrap(),
        d.stream_create().unwrap(),
        d.stream_create().unwrap(),
    );
    assert_eq!(d.launch(s, buf, G), OK);
    assert_eq!(d.note_handoff(t, buf, G), OK);
    assert_eq!(d.stream_begin_capture(a, CaptureMode::Global), OK);
    assert_eq!(d.stream_query(t), UNSUPPORTED);
    assert_eq!(d.stream_end_capture(a), INVALIDATED);
    assert_eq!(d.mem_unmap(buf, 2 * G), OK);
    d.mark_busy(buf, G);
    assert_eq!(d.contract_faults(), 3);
    assert_eq!(d.faults().len(), 3);
    assert!(matches!(
        d.faults()[..],
        [
            SimFault::HandoffWhileQueued { .. },
            SimFault::CaptureBroken {
                call: "cuStreamQuery",
                capture: 1
            },
            SimFault::UnmapWhileQueued { .. }
        ]
    ));
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
