//! Stream-ordered memory and stream captures (issue 11): a capture without a scope
//! stays valid and keeps its memory, a capture's memory goes with the scope open when
//! it began, the pool's event polls leave a global capture elsewhere valid, and a
//! capture reuses no memory another stream still touches. The simulated driver counts
//! anything that breaks a capture: every test ends with none.

use crate::common;

use crate::stream_order::{pool_with, G};
use common::{check, no_faults, stream, MIB};
use flare_package::driver::sim::{CaptureMode, SimStreamCall};
use flare_package::{CrossStreamReuse, CuResult, SimConfig, SimDriver};

/// A capture on a non-blocking stream (global mode, PyTorch's) that allocates and
/// frees with no retention scope stays valid; memory freed in it is reused in it,
/// never outside it, and kept until trim.
#[test]
fn capture_without_a_scope_stays_valid_and_keeps_its_memory() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    assert_eq!(
        sim.stream_begin_capture(s.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    let a = pool.allocate_async_raw(G, s).unwrap();
    sim.launch(s.0, a, G);
    pool.free_async_raw(a, s).unwrap();
    let b = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(b, a, "reused inside the same capture");
    pool.free_async_raw(b, s).unwrap();
    assert_eq!(
        sim.stream_end_capture(s.0),
        CuResult::SUCCESS,
        "the capture is valid"
    );
    let snap = check(&pool);
    assert_eq!(snap.captures_seen, 1);
    assert_eq!(snap.capture_held_bytes, G, "kept for the graph");
    assert_eq!(snap.physical_bytes, G);
    // After the capture: the graph may replay into it, so no one else gets it.
    let c = pool.allocate_async_raw(G, s).unwrap();
    assert_ne!(c, a);
    pool.free_async_raw(c, s).unwrap();
    assert_eq!(check(&pool).capture_held_bytes, G);
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.capture_held_bytes, snap.physical_bytes), (0, 0));
    no_faults(&sim);
}

/// With a scope open at capture time, the captured memory is released when that
/// scope finishes (not before, and not by a trim, which the scope refuses).
#[test]
fn capture_memory_goes_with_the_scope_open_at_capture_time() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    pool.retention_begin().unwrap();
    sim.stream_begin_capture(s.0, CaptureMode::Global);
    let a = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(a, s).unwrap();
    assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    assert_eq!(check(&pool).capture_held_bytes, G);
    pool.retention_finish().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.capture_held_bytes, snap.physical_bytes), (0, 0));
    no_faults(&sim);
}

/// A capture in global mode on stream A; meanwhile another thread frees and allocates
/// on stream B (polling fences), and trims: every event query and wait runs in
/// relaxed mode, so A's capture stays valid (the rows of "Events and stream queries
/// while another stream is captured").
#[test]
fn event_polls_elsewhere_leave_a_global_capture_valid() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let (a, b) = (stream(&sim), stream(&sim));
    sim.stream_begin_capture(a.0, CaptureMode::Global);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            // Distinct sizes: every buffer stays idle, so the frees' polls fence and
            // query it.
            for i in 1..=8 {
                let p = pool.allocate_async_raw(i * G, b).unwrap();
                sim.launch(b.0, p, i * G);
                pool.free_async_raw(p, b).unwrap();
                sim.stream_complete(b.0);
            }
            pool.trim().unwrap();
        });
    });
    assert!(sim.stream_call_count(SimStreamCall::EventQuery) > 0);
    assert!(sim.stream_call_count(SimStreamCall::EventSynchronize) > 0);
    assert_eq!(sim.stream_end_capture(a.0), CuResult::SUCCESS);
    no_faults(&sim);
}

/// The same queries made without relaxed mode would break it: the simulated
/// driver's row, so the test above is not vacuous.
#[test]
fn an_event_query_in_global_mode_breaks_a_capture_elsewhere() {
    let sim = SimDriver::new(SimConfig::default());
    let (a, b) = (stream(&sim), stream(&sim));
    sim.stream_begin_capture(a.0, CaptureMode::Global);
    let e = sim.event_create().unwrap();
    sim.event_record(e, b.0);
    let other = std::thread::scope(|sc| sc.spawn(|| sim.event_query(e)).join().unwrap());
    assert_eq!(other, CuResult::STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(
        sim.stream_end_capture(a.0),
        CuResult::STREAM_CAPTURE_INVALIDATED
    );
}

/// Found by the property test: memory freed during a capture while a recorded
/// stream's live work still touches it is not reused in the capture until that work
/// completes.
#[test]
fn a_capture_does_not_reuse_memory_a_recorded_stream_still_touches() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(8 * MIB, s).unwrap();
    sim.stream_begin_capture(s.0, CaptureMode::Global);
    pool.record_stream(p, t).unwrap();
    sim.launch(t.0, p, 8 * MIB);
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_async_raw(8 * MIB, s).unwrap();
    assert_ne!(q, p, "T's kernel still touches p");
    sim.stream_complete(t.0);
    let r = pool.allocate_async_raw(8 * MIB, s).unwrap();
    assert_eq!(r, p, "T completed: the capture reuses p");
    assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    no_faults(&sim);
}

/// Found by the property test: memory freed on S (not captured) after
/// `record_stream` on T while T is being captured becomes the capture's memory,
/// but only after S's own queued work on it completes (a stream in the capture is
/// not ordered after S).
#[test]
fn memory_recorded_on_a_capture_waits_for_its_own_stream_first() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let (s, t) = (stream(&sim), stream(&sim));
    sim.stream_begin_capture(t.0, CaptureMode::Global);
    let p = pool.allocate_async_raw(6 * MIB, s).unwrap();
    pool.record_stream(p, t).unwrap();
    sim.launch(t.0, p, 6 * MIB); // a graph node: nothing queued
    sim.launch(s.0, p, 6 * MIB); // live work on S
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_async_raw(6 * MIB, t).unwrap();
    assert_ne!(q, p, "S's kernel still touches p");
    sim.stream_complete(s.0);
    let r = pool.allocate_async_raw(6 * MIB, t).unwrap();
    assert_eq!(r, p, "S done: the capture takes it");
    assert_eq!(sim.stream_end_capture(t.0), CuResult::SUCCESS);
    no_faults(&sim);
}

/// The pool queries and waits on its fences in relaxed capture mode and gives the
/// calling thread its mode back after (`cuThreadExchangeStreamCaptureMode` twice,
/// ARCHITECTURE.md "Stream order"): after a trim that waited on a fence, the
/// thread's mode is the default, global, again.
#[test]
fn fence_waits_give_the_thread_its_capture_mode_back() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(sim.launch(s.0, p, G), CuResult::SUCCESS);
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::ThreadExchangeCaptureMode),
        0
    );
    pool.trim().unwrap();
    let exchanges = sim.stream_call_count(SimStreamCall::ThreadExchangeCaptureMode);
    assert!(
        exchanges >= 2 && exchanges % 2 == 0,
        "relaxed, then restored: {exchanges}"
    );
    assert_eq!(
        sim.thread_exchange_capture_mode(CaptureMode::Global),
        CaptureMode::Global,
        "the thread's mode is back"
    );
    assert_eq!(
        check(&pool).physical_bytes,
        0,
        "the trim released the freed memory"
    );
    no_faults(&sim);
}
