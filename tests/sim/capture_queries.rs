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
//!
//! Here: the table of "Events and stream queries while another stream is captured",
//! and the drivers, scenes and constants the stream tests share; stream capture,
//! streams and work, and the contract faults have modules of their own.

use crate::common;

use common::mapped_for;

use std::thread;

use flare_package::driver::sim::{
    CaptureMode, CaptureStatus, SimConfig, SimDriver, SimFault, SimStreamCall,
    CUDA_ERROR_NOT_READY, SIM_LEGACY_STREAM,
};
use flare_package::driver::{CuResult, DevicePtr};

pub(crate) const G: u64 = 2 << 20;

pub(crate) const OK: CuResult = CuResult::SUCCESS;

pub(crate) const UNSUPPORTED: CuResult = CuResult::STREAM_CAPTURE_UNSUPPORTED;

pub(crate) const INVALIDATED: CuResult = CuResult::STREAM_CAPTURE_INVALIDATED;

pub(crate) const LEGACY: u64 = SIM_LEGACY_STREAM;

pub(crate) fn sim() -> SimDriver {
    SimDriver::new(SimConfig::default())
}

pub(crate) fn sim_devices(n: u32) -> SimDriver {
    SimDriver::new(SimConfig {
        device_count: n,
        ..SimConfig::default()
    })
}

pub(crate) fn mapped(d: &SimDriver, size: u64) -> DevicePtr {
    mapped_for(d, size, &[0])
}

/// The streams that have queued work, one entry per launch.
pub(crate) fn queued_streams(d: &SimDriver) -> Vec<u64> {
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
pub(crate) enum Caller {
    Same,
    Other,
}

pub(crate) const CALLERS: [Caller; 2] = [Caller::Same, Caller::Other];

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
pub(crate) struct Scene {
    pub(crate) d: SimDriver,
    pub(crate) a: u64,
    pub(crate) b: u64,
    pub(crate) c: u64,
    /// Recorded on B before the capture (covers B's first kernel).
    pub(crate) before: u64,
    /// Recorded on B during the capture (covers both of B's kernels).
    pub(crate) during: u64,
    /// Recorded on C before the capture.
    pub(crate) on_c: u64,
    /// An event never recorded.
    pub(crate) fresh: u64,
}

pub(crate) fn scene(mode: CaptureMode) -> Scene {
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
pub(crate) struct Cell<R> {
    pub(crate) result: R,
    /// `stream_end_capture(A)` by the capturing thread, after the call.
    pub(crate) end: CuResult,
    pub(crate) faults: Vec<SimFault>,
    /// Launches of B still queued right after the call (B had 2).
    pub(crate) b_queued: usize,
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
