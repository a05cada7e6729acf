//! Stream-ordered memory and stream captures (issue 11): a capture without a scope
//! stays valid and keeps its memory, a capture's memory goes with the scope open when
//! it began, the pool's event polls leave a global capture elsewhere valid, and a
//! capture reuses no memory another stream still touches. Memory freed in a capture,
//! or recorded on a capturing stream, is that capture's, kept for its graph (also
//! when its fence could not be confirmed); a trim never invalidates an open capture,
//! and asks only the pool's streams about captures. The simulated driver counts
//! anything that breaks a capture: every test ends with none.

use crate::common;

use crate::stream_order::{pool_with, sim_pool, G};
use common::{assert_driver_empty, check, no_faults, simulated_pool, stream, MIB};
use flare_package::driver::sim::{CaptureMode, SimStreamCall};
use flare_package::{
    CrossStreamReuse, CuResult, DriverCall, DriverError, Error, PoolConfig, SimConfig, SimDriver,
};

/// A code no call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

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

/// FINDING 3. A graph was captured earlier on S (allocating and freeing inside the
/// capture with no scope, as the README allows); now a capture is open on T, and
/// another thread trims. `trim` releases the earlier capture's memory after a
/// `cuCtxSynchronize`, which invalidates T's capture, although T's capture has
/// nothing to do with that memory and the pool knows a capture may be open (it
/// skips device synchronizes for a capturing stream's own bucket). README: "Event
/// queries run with the thread in relaxed capture mode, so a CUDA graph captured on
/// any stream stays valid"; issue: "cuCtxSynchronize and legacy-stream events are
/// never used on these paths"; `tests/streams/captures.rs`
/// `event_polls_elsewhere_leave_a_global_capture_valid` asserts exactly this for a
/// trim on another thread, but only when no capture memory is held.
#[test]
fn trim_on_another_thread_leaves_an_open_capture_valid() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, 140 << 30);
    let (s, t) = (stream(&sim), stream(&sim));
    // T is one of the pool's streams (it allocated before): the pool checks every
    // stream it has seen for an open capture before a release that would
    // synchronize the device. A capture on a stream the pool never saw is the
    // caller's to keep clear of trim and finish (documented on `Pool::trim`).
    let warm = pool.allocate_async_raw(G, t).unwrap();
    pool.free_async_raw(warm, t).unwrap();
    sim.stream_begin_capture(s.0, CaptureMode::Global);
    let a = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(a, s).unwrap();
    assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    assert_eq!(check(&pool).capture_held_bytes, G);
    assert_eq!(
        sim.stream_begin_capture(t.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    let trimmed = std::thread::scope(|sc| sc.spawn(|| pool.trim()).join().unwrap());
    assert_eq!(
        sim.stream_end_capture(t.0),
        CuResult::SUCCESS,
        "trim ({trimmed:?}) invalidated a capture open elsewhere: {:?}",
        sim.faults()
    );
    assert_eq!(
        check(&pool).capture_held_bytes,
        G,
        "kept: releasing it needs a synchronize"
    );
    pool.trim().unwrap();
    assert_eq!(
        check(&pool).capture_held_bytes,
        0,
        "released once no capture is open"
    );
    no_faults(&sim);
}

/// FINDING 4a (resolved: capture memory). `record_stream(p, T)` while T is being
/// captured (a tensor used by the graph being captured), then the stream-ordered free
/// on S: the graph may replay into p, so p is that capture's memory: kept after the
/// capture (counted in `capture_held_bytes`, not handed to anyone) until trim, as
/// for memory freed during a capture; then it serves again. (The finding: it went to
/// a bucket only a device synchronize released, outside the capture contract.)
#[test]
fn memory_recorded_on_a_capturing_stream_is_reusable_after_the_capture() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, G);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(
        sim.stream_begin_capture(t.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    pool.record_stream(p, t).unwrap();
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(sim.stream_end_capture(t.0), CuResult::SUCCESS);
    assert!(sim.queued_work().is_empty());
    let snap = check(&pool);
    assert_eq!((snap.capture_held_bytes, snap.captures_seen), (G, 1));
    assert!(pool.allocate_async_raw(G, s).is_err(), "kept for the graph");
    pool.trim().unwrap();
    let q = pool.allocate_async_raw(G, s);
    assert!(q.is_ok(), "after trim: {q:?}");
    no_faults(&sim);
}

/// FINDING 4b. The same held memory, with T's capture still open: a trim releases it
/// after a `cuCtxSynchronize`, which invalidates T's capture (the same
/// root as finding 3: the release engine's "a stream being captured now: a device
/// synchronize would invalidate its capture" check looks only at the idle memory of
/// stream buckets, not at memory held for a capturing stream or capture).
#[test]
fn trim_leaves_a_capture_valid_after_record_stream_on_it() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, 140 << 30);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(
        sim.stream_begin_capture(t.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    pool.record_stream(p, t).unwrap();
    pool.free_async_raw(p, s).unwrap();
    let trimmed = pool.trim();
    assert_eq!(
        sim.stream_end_capture(t.0),
        CuResult::SUCCESS,
        "trim ({trimmed:?}) invalidated T's capture: {:?}",
        sim.faults()
    );
    no_faults(&sim);
}

/// FINDING 6. README: "memory freed in a capture is reused only by that capture and
/// kept for its graph until the scope open at capture time finishes, or, with none,
/// until trim or destroy". Here no scope is open when the capture begins; a scope
/// opened afterwards (during the capture) takes the capture's memory with it at its
/// finish: the pool stamps a capture with the scope open when it first *sees* the
/// capture, not the one open at capture time. The graph then replays into memory
/// that was unmapped.
#[test]
fn capture_memory_outlives_a_scope_opened_after_the_capture_began() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, 140 << 30);
    let s = stream(&sim);
    // S is one of the pool's streams before the capture (a scope's begin asks each
    // stream it has seen which capture is open; a capture on a stream the pool never
    // saw, first met inside the scope, is taken as the scope's: documented on
    // `Pool::retention_begin`).
    let warm = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(warm, s).unwrap();
    assert_eq!(
        sim.stream_begin_capture(s.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    let scope = pool.retention_scope().unwrap();
    let a = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(a, s).unwrap();
    assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    scope.finish().unwrap();
    let snap = check(&pool);
    assert_eq!(
        snap.capture_held_bytes, G,
        "the graph's memory was released by a scope that opened after its capture began"
    );
    no_faults(&sim);
}

/// `Pool::free_async_raw` during a capture, of memory also used (`record_stream`) on
/// a stream that another capture is capturing: "Used by a graph being captured on
/// `s`: the graph may replay into it, so it becomes that capture's memory" (kept
/// for that capture: `Snapshot::capture_held_bytes`, a second capture seen). It
/// waits on no fence of the freeing capture's (no stream) bucket: nothing is counted
/// in `event_wait_bytes` and no event is recorded. Once both captures ended, trim
/// releases it.
#[test]
fn a_free_recorded_on_another_capture_becomes_that_captures_memory() {
    use flare_package::driver::sim::CaptureMode;
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let (s1, s2) = (common::stream(&sim), common::stream(&sim));
    let p = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    pool.record_stream(p, s2).unwrap();
    for s in [s1, s2] {
        assert_eq!(
            sim.stream_begin_capture(s.0, CaptureMode::Relaxed),
            CuResult::SUCCESS
        );
    }
    let records = sim.stream_call_count(SimStreamCall::EventRecord);
    pool.free_async_raw(p, s1).unwrap();
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), records);
    let snap = check(&pool);
    assert_eq!(snap.captures_seen, 2, "both captures seen");
    assert_eq!((snap.capture_held_bytes, snap.event_wait_bytes), (2 * G, 0));
    assert_eq!((snap.idle_bytes, snap.events_outstanding), (2 * G, 0));
    // Kept for s2's capture: an allocation on s1 (its own capture) does not take it.
    let q = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    assert_ne!(q, p);
    pool.free_async_raw(q, s1).unwrap();
    for s in [s1, s2] {
        assert!(sim.stream_end_capture(s.0).is_success());
    }
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.capture_held_bytes, snap.physical_bytes), (0, 0));
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// Memory freed during a capture while also used (`record_stream`) on another,
/// uncaptured stream is the capture's, reused by it only once that stream's fence
/// completes. A release point whose wait on that fence fails
/// (`cuEventSynchronize` refused) cannot confirm it; memory of a capture "stays its
/// capture's (its graph may replay into it), released with that capture's memory
/// after a device synchronize". The out-of-memory release keeps captures' memory
/// (`Pool::allocate_raw`: the release before the retry; `docs/ARCHITECTURE.md`:
/// capture-held memory is released at the scope's close, trim or destroy): so the
/// allocation that needed it fails with `Error::OutOfMemory`, the memory counted in
/// `capture_held_bytes`, and trim (after the capture) releases it.
#[test]
fn an_unconfirmed_free_of_a_capture_stays_the_captures() {
    use flare_package::driver::sim::CaptureMode;
    let (pool, sim) = simulated_pool(
        8 * MIB,
        PoolConfig {
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let (s1, s2) = (common::stream(&sim), common::stream(&sim));
    let p = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    pool.record_stream(p, s2).unwrap();
    // Work on s2 still queued: no query finds its fence complete.
    assert_eq!(sim.launch(s2.0, p, 3 * MIB), CuResult::SUCCESS);
    assert_eq!(
        sim.stream_begin_capture(s1.0, CaptureMode::Relaxed),
        CuResult::SUCCESS
    );
    pool.free_async_raw(p, s1).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.captures_seen, 1);
    assert_eq!(snap.event_wait_bytes, 2 * G, "waiting on s2's fence");
    assert!(sim.stream_end_capture(s1.0).is_success());

    sim.inject_stream_failure(SimStreamCall::EventSynchronize, 1, FAIL);
    match pool.allocate_raw(6 * MIB) {
        Err(Error::OutOfMemory { .. }) => {}
        other => panic!("want out-of-memory, got {other:?}"),
    }
    let snap = check(&pool);
    assert_eq!(snap.oom_retries, 1);
    assert_eq!(snap.stream_call_failures, 1);
    assert_eq!((snap.capture_held_bytes, snap.event_wait_bytes), (2 * G, 0));
    assert_eq!((snap.idle_bytes, snap.physical_bytes), (2 * G, 2 * G));

    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.capture_held_bytes, snap.physical_bytes), (0, 0));
    // Now it fits.
    let q = pool.allocate_raw(6 * MIB).unwrap();
    pool.free_raw(q).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// `Pool::trim` forgets the streams whose memory is all gone ("Streams whose memory is
/// all gone are done with, until used again (a stream may be destroyed after a
/// trim)"), and only "one of the pool's streams (used since the last trim or finish,
/// or holding memory in the pool)" is asked whether it is being captured: a stream
/// the pool is done with is not asked, at a release point nor at a scope's begin. So
/// a capture begun on such a stream before a scope, whose first allocation in the
/// pool comes inside the scope, is first seen in that scope, and its memory is
/// released when the scope finishes (`docs/ARCHITECTURE.md`: "Capture-held memory
/// is released when the retention scope open when the capture was first seen
/// closes").
#[test]
fn a_stream_forgotten_at_a_trim_is_not_asked_about_captures() {
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let s = common::stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    // Done with `s`: neither a trim nor a scope's begin asks about it.
    let asked = sim.stream_call_count(SimStreamCall::StreamGetCaptureInfo);
    pool.trim().unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamGetCaptureInfo),
        asked,
        "a trim asks no forgotten stream"
    );
    assert_eq!(
        sim.stream_begin_capture(s.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    pool.retention_begin().unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamGetCaptureInfo),
        asked,
        "a scope's begin asks no forgotten stream"
    );
    // The capture's first allocation and free in the pool, inside the scope.
    let q = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(q, s).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.captures_seen, snap.capture_held_bytes), (1, G));
    assert!(sim.stream_end_capture(s.0).is_success());
    pool.retention_finish().unwrap();
    let snap = check(&pool);
    assert_eq!(
        (snap.capture_held_bytes, snap.physical_bytes),
        (0, 0),
        "first seen in the scope: released at its finish"
    );
    common::no_faults(&sim);
}

/// A release point that may synchronize the device first asks each stream the pool
/// has seen whether it is being captured (a synchronize would invalidate its
/// capture). Only `CUDA_ERROR_INVALID_HANDLE` (a destroyed stream: nothing of it can
/// be captured) is passed over; any other failed query leaves the answer unknown,
/// and the trim reports it (`Error::Driver` with the query's call and code). The next
/// trim, whose query succeeds, releases the stream's memory.
#[test]
fn a_failed_capture_query_at_trim_is_reported() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default()
        },
    );
    let s = common::stream(&sim);
    let p = pool.allocate_async_raw(4 * MIB, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(check(&pool).physical_bytes, 4 * MIB);
    sim.inject_stream_failure(SimStreamCall::StreamGetCaptureInfo, 1, FAIL);
    let err = pool.trim().unwrap_err();
    assert_eq!(
        err.driver_error(),
        Some(DriverError::new(DriverCall::StreamGetCaptureInfo, FAIL))
    );
    check(&pool);
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.pending_count), (0, 0));
    assert_driver_empty(&pool);
}
