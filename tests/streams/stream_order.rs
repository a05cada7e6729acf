//! Stream order on the simulated driver (issue 11): `allocate_async`, `free_async`,
//! `record_stream`, fences, cross-stream reuse, captures. Every expectation comes
//! from the semantics or the driver rows of `docs/vmm-semantics.md`; the
//! simulated driver counts a contract fault for an unmap of memory queued work
//! touches, a hand-off of memory to a stream while another stream's unordered work
//! touches it, and anything that breaks a capture: every test ends with none.

use crate::common;

use common::{check, no_faults, stream, MIB};
use flare_package::driver::sim::{CaptureMode, SimStreamCall};
use flare_package::driver::Driver;
use flare_package::{
    CrossStreamReuse, CuResult, DriverCall, Error, Pool, PoolConfig, SimConfig, SimDriver, Stream,
};
use std::sync::Arc;

const G: u64 = 2 * MIB;

fn pool_with(cross: CrossStreamReuse, threshold: u64) -> (Pool, Arc<SimDriver>) {
    let config = PoolConfig {
        cross_stream_reuse: cross,
        release_threshold_bytes: threshold,
        ..PoolConfig::default()
    };
    common::simulated_pool(SimConfig::default().capacity_bytes, config)
}

/// A pool on a simulated device of `capacity` bytes that caches everything idle
/// (release threshold `u64::MAX`).
fn small_device(capacity: u64) -> (Pool, Arc<SimDriver>) {
    let config = PoolConfig {
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::default()
    };
    common::simulated_pool(capacity, config)
}

fn syncs(sim: &SimDriver) -> u64 {
    sim.call_count(DriverCall::Synchronize)
}

/// Memory freed on S with S's kernel still queued is handed back to S at once (stream
/// order makes it safe), with no driver call but the capture query, no synchronize
/// and no fault.
#[test]
fn same_stream_reuse_is_immediate_while_work_is_queued() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(sim.launch(s.0, p, G), CuResult::SUCCESS);
    pool.free_async_raw(p, s).unwrap();
    let creates = sim.call_count(DriverCall::Create);
    let q = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(q, p, "the same stream gets its own freed memory back");
    assert_eq!(sim.call_count(DriverCall::Create), creates);
    assert_eq!(sim.queued_work().len(), 1, "the kernel is still queued");
    assert_eq!(syncs(&sim), 0);
    let snap = check(&pool);
    assert_eq!((snap.reuse_hits, snap.cross_stream_hits), (1, 0));
    no_faults(&sim);
}

/// `WhenComplete` (the default): another stream does not get memory whose freeing
/// stream's work is still queued, and gets it once that work completes.
#[test]
fn another_stream_waits_for_completion_by_default() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    sim.launch(s.0, p, G);
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_async_raw(G, t).unwrap();
    assert_ne!(q, p, "S's kernel still reads p");
    let snap = check(&pool);
    assert_eq!(snap.events_outstanding, 1, "one fence on S, not complete");
    assert_eq!(snap.event_wait_bytes, G, "p waits on it");
    sim.stream_complete(s.0);
    let r = pool.allocate_async_raw(G, t).unwrap();
    assert_eq!(r, p, "S's work completed: p goes to T");
    let snap = check(&pool);
    assert_eq!((snap.cross_stream_hits, snap.cross_stream_waits), (1, 0));
    assert_eq!((snap.events_outstanding, snap.event_wait_bytes), (0, 0));
    assert_eq!(syncs(&sim), 0);
    no_faults(&sim);
}

/// `Never`: memory freed on S is not handed to T, even after S's work completed, until
/// a release point moved it.
#[test]
fn never_keeps_memory_on_its_stream() {
    let (pool, sim) = pool_with(CrossStreamReuse::Never, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    sim.stream_complete(s.0);
    let q = pool.allocate_async_raw(G, t).unwrap();
    assert_ne!(q, p);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), 0);
    assert_eq!(pool.allocate_async_raw(G, s).unwrap(), p, "S still gets it");
    no_faults(&sim);
}

/// `Wait`: T gets S's memory at once, after `cuStreamWaitEvent` on a fence recorded
/// on S; T's later work is ordered after S's kernel (no hand-off fault).
#[test]
fn wait_orders_the_new_stream_after_the_old() {
    let (pool, sim) = pool_with(CrossStreamReuse::Wait, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    sim.launch(s.0, p, G);
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_async_raw(G, t).unwrap();
    assert_eq!(q, p, "handed over at once");
    assert_eq!(sim.stream_call_count(SimStreamCall::StreamWaitEvent), 1);
    let snap = check(&pool);
    assert_eq!((snap.cross_stream_hits, snap.cross_stream_waits), (1, 1));
    // T's kernel is queued behind S's: completing T completes S's too.
    sim.launch(t.0, q, G);
    sim.stream_complete(t.0);
    assert!(sim.queued_work().is_empty(), "{:?}", sim.queued_work());
    no_faults(&sim);
}

/// Outside a scope with threshold 0, freeing memory that a queued kernel touches
/// neither synchronizes nor unmaps; the release comes at a later release point,
/// after the fence completed, with no synchronize.
#[test]
fn release_waits_for_the_fence_never_for_the_device() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    sim.launch(s.0, p, G);
    pool.free_async_raw(p, s).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, G, "still mapped: the kernel reads it");
    assert_eq!(
        snap.events_outstanding, 0,
        "the first free polls, but nothing was idle at an earlier poll: no fence"
    );
    assert_eq!(sim.call_count(DriverCall::Unmap), 0);
    sim.stream_complete(s.0);
    // Polls come at frees 1, 3, 7 (the countdown doubles while polls find nothing).
    // Free 3's poll finds p idle since free 1's poll and records a fence (covering
    // every free so far); free 7's poll queries it, complete: p is released. The
    // 4 MiB mapping, freed again at every pair, is never old enough to fence.
    for free in 2..=7 {
        let q = pool.allocate_async_raw(4 * MIB, s).unwrap();
        pool.free_async_raw(q, s).unwrap();
        let snap = check(&pool);
        let want = u64::from(free == 7);
        assert_eq!(snap.mappings_released, want, "after free {free}\n{snap:#?}");
        assert_eq!(
            snap.events_outstanding,
            u64::from((3..7).contains(&free)),
            "after free {free}"
        );
    }
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, 4 * MIB, "{snap:#?}");
    assert_eq!(syncs(&sim), 0, "no cuCtxSynchronize on the stream path");
    assert_eq!(sim.stream_call_count(SimStreamCall::EventSynchronize), 0);
    no_faults(&sim);
}

/// trim (and finish, and the out-of-memory release) wait on the fences alone
/// (`cuEventSynchronize`), never on the device, then release.
#[test]
fn trim_waits_on_events_not_the_device() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    let other = pool.allocate_async_raw(G, t).unwrap();
    sim.launch(s.0, p, G);
    sim.launch(t.0, other, G);
    pool.free_async_raw(p, s).unwrap();
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, G, "p released, the live one kept");
    assert_eq!(syncs(&sim), 0);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventSynchronize), 1);
    assert_eq!(
        sim.queued_work().len(),
        1,
        "waiting on S's fence completed S's work only"
    );
    no_faults(&sim);
}

/// An out-of-memory on a stream waits on the fences of idle memory, releases it and
/// retries: the device never fills up with memory freed on streams.
#[test]
fn out_of_memory_waits_on_fences_then_retries() {
    let (pool, sim) = small_device(8 * MIB);
    let s = stream(&sim);
    let mut ptrs = Vec::new();
    for _ in 0..4 {
        let p = pool.allocate_async_raw(G, s).unwrap();
        sim.launch(s.0, p, G);
        ptrs.push(p);
    }
    for p in ptrs {
        pool.free_async_raw(p, s).unwrap();
    }
    let t = stream(&sim);
    let big = pool.allocate_async_raw(8 * MIB, t).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, 8 * MIB);
    assert_eq!((snap.oom_retries, snap.mappings_released), (1, 4));
    assert_eq!(syncs(&sim), 0);
    pool.free_async_raw(big, t).unwrap();
    no_faults(&sim);
}

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

/// record_stream: memory used on T too is not reused on its own stream, nor released,
/// until T's work up to the free completes.
#[test]
fn record_stream_holds_memory_until_the_recorded_stream_completes() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.record_stream(p, t).unwrap();
    sim.launch(t.0, p, G);
    pool.free_async_raw(p, s).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.event_wait_bytes, G);
    assert_eq!(
        snap.events_outstanding, 1,
        "a fence on T, recorded at the free"
    );
    let q = pool.allocate_async_raw(G, s).unwrap();
    assert_ne!(q, p, "T's kernel still reads p");
    sim.stream_complete(t.0);
    let r = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(r, p, "T completed: p is S's again");
    assert!(matches!(
        pool.record_stream(0x1234, t),
        Err(Error::UnknownPointer { ptr: 0x1234 })
    ));
    no_faults(&sim);
}

/// Frees on the legacy stream are fenced on the pool's own blocking stream, never
/// with an event on the legacy stream, and released once the legacy work completes.
#[test]
fn legacy_stream_frees_are_fenced_on_a_pool_stream() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let p = pool.allocate_async_raw(G, Stream::LEGACY).unwrap();
    sim.launch(0, p, G);
    pool.free_async_raw(p, Stream::LEGACY).unwrap();
    assert_eq!(check(&pool).physical_bytes, G);
    sim.stream_complete(0);
    pool.trim().unwrap();
    assert_eq!(sim.stream_call_count(SimStreamCall::StreamCreate), 1);
    assert_eq!(check(&pool).physical_bytes, 0);
    assert_eq!(syncs(&sim), 0);
    // Stream handle 1 (CU_STREAM_LEGACY) is the same stream: its memory comes back.
    let q = pool.allocate_async_raw(G, Stream(1)).unwrap();
    pool.free_async_raw(q, Stream(1)).unwrap();
    assert_eq!(pool.allocate_async_raw(G, Stream::LEGACY).unwrap(), q);
    no_faults(&sim);
}

/// The synchronous functions keep their meaning and cost: no stream or event call,
/// and a free outside a scope still synchronizes before it unmaps.
#[test]
fn synchronous_functions_make_no_stream_call() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let p = pool.allocate_raw(G).unwrap();
    pool.free_raw(p).unwrap();
    let q = pool.allocate_raw(G).unwrap();
    pool.retention_begin().unwrap();
    pool.free_raw(q).unwrap();
    pool.retention_finish().unwrap();
    for call in SimStreamCall::ALL {
        assert_eq!(sim.stream_call_count(call), 0, "{call:?}");
    }
    assert_eq!(syncs(&sim), 2, "one per release point, as before");
    no_faults(&sim);
}

/// A free inside a scope makes no event call and releases nothing.
#[test]
fn inside_a_scope_a_stream_free_only_retains() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    pool.retention_begin().unwrap();
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), 0);
    assert_eq!(check(&pool).idle_bytes, G);
    pool.retention_finish().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    assert_eq!(syncs(&sim), 0, "finish waited on a fence, not the device");
    no_faults(&sim);
}

/// Freeing twice, or a pointer the pool never gave, on a stream is an unknown
/// pointer and changes nothing.
#[test]
fn stream_free_of_an_unknown_pointer_changes_nothing() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    let before = check(&pool);
    assert!(matches!(
        pool.free_async_raw(p, s),
        Err(Error::UnknownPointer { .. })
    ));
    assert!(matches!(
        pool.free_async_raw(p + 4096, s),
        Err(Error::UnknownPointer { .. })
    ));
    assert_eq!(check(&pool), before);
}

/// The guard frees on its stream.
#[test]
fn the_guard_frees_on_its_stream() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let s = stream(&sim);
    let a = pool.allocate_async(G, s).unwrap();
    assert_eq!(a.stream(), Some(s));
    let p = a.ptr();
    sim.launch(s.0, p, G);
    drop(a);
    let snap = check(&pool);
    assert_eq!((snap.frees, snap.event_wait_bytes), (1, G), "freed on S");
    assert_eq!(pool.allocate_async_raw(G, s).unwrap(), p);
    no_faults(&sim);
}

/// A failed fence record keeps the memory from every other stream (its order is
/// unknown) and counts the failure; trim releases it after a device synchronize.
#[test]
fn a_failed_event_record_holds_the_memory() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    sim.launch(s.0, p, G);
    pool.free_async_raw(p, s).unwrap();
    sim.inject_stream_failure(SimStreamCall::EventRecord, 1, CuResult::UNKNOWN);
    let q = pool.allocate_async_raw(G, t).unwrap();
    assert_ne!(q, p);
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1);
    // Still S's: S's own order is known.
    assert_eq!(pool.allocate_async_raw(G, s).unwrap(), p);
    // A failed fence wait at trim: what it guards is released after a device
    // synchronize instead (counted, not an error).
    pool.free_async_raw(p, s).unwrap();
    pool.free_async_raw(q, t).unwrap();
    sim.inject_stream_failure(SimStreamCall::EventSynchronize, 1, CuResult::UNKNOWN);
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.physical_bytes, snap.stream_call_failures), (0, 2));
    assert_eq!(syncs(&sim), 1, "the fallback synchronize");
    no_faults(&sim);
}

/// A backend without stream support refuses the stream functions with the driver's
/// NOT_SUPPORTED and changes nothing.
#[test]
fn a_driver_without_streams_refuses_stream_allocations() {
    struct Plain(SimDriver);
    impl Driver for Plain {
        fn granularity(&self) -> Result<u64, flare_package::DriverError> {
            self.0.granularity()
        }
        fn create(
            &self,
            size: u64,
        ) -> Result<flare_package::driver::PhysicalHandle, flare_package::DriverError> {
            Driver::create(&self.0, size)
        }
        fn release(
            &self,
            h: flare_package::driver::PhysicalHandle,
        ) -> Result<(), flare_package::DriverError> {
            Driver::release(&self.0, h)
        }
        fn reserve(
            &self,
            size: u64,
        ) -> Result<flare_package::driver::Reservation, flare_package::DriverError> {
            Driver::reserve(&self.0, size)
        }
        fn free_reservation(
            &self,
            r: flare_package::driver::Reservation,
        ) -> Result<(), flare_package::DriverError> {
            Driver::free_reservation(&self.0, r)
        }
        fn map(
            &self,
            ptr: u64,
            h: flare_package::driver::PhysicalHandle,
        ) -> Result<(), flare_package::DriverError> {
            Driver::map(&self.0, ptr, h)
        }
        fn set_access(
            &self,
            ptr: u64,
            size: u64,
            d: &[i32],
        ) -> Result<(), flare_package::DriverError> {
            Driver::set_access(&self.0, ptr, size, d)
        }
        fn unmap(&self, ptr: u64, size: u64) -> Result<(), flare_package::DriverError> {
            Driver::unmap(&self.0, ptr, size)
        }
        fn synchronize(&self, device: i32) -> Result<(), flare_package::DriverError> {
            Driver::synchronize(&self.0, device)
        }
        fn mem_info(&self) -> Result<flare_package::driver::MemInfo, flare_package::DriverError> {
            Driver::mem_info(&self.0)
        }
    }
    let pool = Pool::with_driver(
        PoolConfig::default(),
        Arc::new(Plain(SimDriver::new(SimConfig::default()))),
    )
    .unwrap();
    match pool.allocate_async_raw(G, Stream(5)) {
        Err(Error::Driver { source, .. }) => {
            assert_eq!(source.call, DriverCall::StreamGetCaptureInfo);
            assert_eq!(source.code, CuResult::NOT_SUPPORTED);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(check(&pool).allocations, 0);
    let p = pool.allocate_raw(G).unwrap();
    pool.free_raw(p).unwrap();
}

/// 1,000 frees of buffers still in flight poll the fences about log2(1000) + 1000/64
/// times, not 1,000 (the cost target: at most 2x `cuMemFreeAsync` each).
#[test]
fn in_flight_frees_poll_with_backoff() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let ptrs: Vec<u64> = (0..1000)
        .map(|_| pool.allocate_async_raw(G, s).unwrap())
        .collect();
    sim.launch(s.0, ptrs[0], G);
    // The kernel reads the first buffer: its fence never completes here.
    for p in ptrs {
        pool.free_async_raw(p, s).unwrap();
    }
    let queries = sim.stream_call_count(SimStreamCall::EventQuery);
    // Polls at frees 1, 3, 7, ..., 127 (7 polls: the countdown doubles from 1 to 64
    // while polls find nothing), then every 64: (1000 - 127) / 64 = 13 more. The
    // first two have no fence to query: the first finds nothing idle since an earlier
    // poll, the second records the fence (after its queries).
    assert_eq!(queries, 7 + 13 - 2, "queries");
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), 1);
    assert_eq!(
        check(&pool).physical_bytes,
        1000 * G,
        "nothing released yet"
    );
    assert_eq!(syncs(&sim), 0);
    no_faults(&sim);
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

/// Found by the property test: memory freed on S with a recorded stream comes back
/// to S's bucket after the recorded stream's fence, and a finish then waits on a
/// fence of S too and releases it (it was left idle, unfenced).
#[test]
fn finish_releases_memory_that_waited_on_a_recorded_stream() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.retention_begin().unwrap();
    pool.record_stream(p, Stream::LEGACY).unwrap();
    sim.launch(0, p, G);
    pool.free_async_raw(p, s).unwrap();
    pool.retention_finish().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.idle_bytes, snap.physical_bytes), (0, 0), "{snap:#?}");
    assert_eq!(syncs(&sim), 0);
    no_faults(&sim);
}

/// A stream that frees and allocates the same size outside a scope (threshold 0)
/// keeps reusing one mapping: a free's poll releases only memory whose fence was
/// recorded at an earlier poll, never the mapping it just freed (the pair would
/// otherwise create and release a mapping every time).
#[test]
fn a_steady_pair_keeps_one_mapping_at_threshold_zero() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    for _ in 0..1000 {
        let p = pool.allocate_async_raw(G, s).unwrap();
        pool.free_async_raw(p, s).unwrap();
    }
    let snap = check(&pool);
    assert_eq!((snap.mappings_created, snap.reuse_hits), (1, 999));
    assert_eq!(
        snap.physical_bytes, G,
        "still cached, waiting for its fence"
    );
    // Once the stream goes quiet, a later release point releases it.
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
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

/// The release threshold is "at or under": a free that leaves the idle bytes exactly
/// at the threshold is not over it and does not count down to a poll. With the
/// threshold at one granule and granule-sized frees, the polls come at frees 2 (the
/// first over it; nothing idle since an earlier poll) and 4 (interval 2: the memory
/// idle at free 2's poll is fenced).
#[test]
fn a_free_at_the_threshold_does_not_count_down() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, G);
    let s = stream(&sim);
    let ptrs: Vec<u64> = (0..4)
        .map(|_| pool.allocate_async_raw(G, s).unwrap())
        .collect();
    let records = || sim.stream_call_count(SimStreamCall::EventRecord);
    for (i, p) in ptrs.iter().enumerate() {
        pool.free_async_raw(*p, s).unwrap();
        let want = u64::from(i == 3);
        assert_eq!(records(), want, "after free {}", i + 1);
    }
    no_faults(&sim);
}

/// `record_stream` with the legacy stream's other handle (1, `CU_STREAM_LEGACY`) on
/// memory freed on the legacy stream (0) records nothing: it is the same stream, and
/// the memory is reused on it at once.
#[test]
fn record_stream_of_the_same_legacy_stream_defers_nothing() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let p = pool.allocate_async_raw(G, Stream::LEGACY).unwrap();
    pool.record_stream(p, Stream(1)).unwrap();
    sim.launch(0, p, G);
    pool.free_async_raw(p, Stream::LEGACY).unwrap();
    assert_eq!(check(&pool).events_outstanding, 0);
    assert_eq!(pool.allocate_async_raw(G, Stream(1)).unwrap(), p);
    no_faults(&sim);
}

/// Wait mode uses a fence that already covers the memory instead of recording
/// another (only memory freed after that fence would need a new one).
#[test]
fn wait_mode_reuses_a_covering_fence() {
    let (pool, sim) = pool_with(CrossStreamReuse::Wait, u64::MAX);
    let (s, t, u) = (stream(&sim), stream(&sim), stream(&sim));
    let q = pool.allocate_async_raw(4 * MIB, s).unwrap();
    let p = pool.allocate_async_raw(G, s).unwrap();
    let r = pool.allocate_async_raw(8 * MIB, s).unwrap();
    sim.launch(s.0, p, G);
    pool.free_async_raw(q, s).unwrap(); // mark 1
    pool.free_async_raw(p, s).unwrap(); // mark 2
                                        // T takes q after a fence on S covering marks 1 and 2.
    assert_eq!(pool.allocate_async_raw(4 * MIB, t).unwrap(), q);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), 1);
    pool.free_async_raw(r, s).unwrap(); // mark 3, after the fence
                                        // U takes p: the fence covers its free already.
    assert_eq!(pool.allocate_async_raw(G, u).unwrap(), p);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), 1);
    assert_eq!(check(&pool).cross_stream_waits, 2);
    no_faults(&sim);
}

/// A free's poll releases completed memory only while the idle bytes are over the
/// threshold: a release never takes them below it ("at or under the threshold stays
/// cached"). Frees of 64 granules on one quiet stream, thresholds of 1 to 8 granules.
#[test]
fn a_polls_release_stops_at_the_threshold() {
    for k in 1..=8u64 {
        let threshold = k * G;
        let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, threshold);
        let s = stream(&sim);
        let ptrs: Vec<u64> = (0..64)
            .map(|_| pool.allocate_async_raw(G, s).unwrap())
            .collect();
        let mut released = 0;
        for p in ptrs {
            pool.free_async_raw(p, s).unwrap();
            let snap = check(&pool);
            if snap.mappings_released > released {
                released = snap.mappings_released;
                assert!(
                    snap.idle_bytes >= threshold,
                    "threshold {k} granules: released down to {} bytes\n{snap:#?}",
                    snap.idle_bytes
                );
            }
        }
        assert!(
            released > 0,
            "threshold {k} granules: a poll released something"
        );
        no_faults(&sim);
    }
}

/// Memory that went to "any stream" after its own stream's fence completed goes
/// back to that stream without counting as a cross-stream hit; only the other
/// stream's take counts.
#[test]
fn a_stream_taking_back_its_own_completed_memory_is_no_cross_stream_hit() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    let q = pool.allocate_async_raw(4 * MIB, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    pool.free_async_raw(q, s).unwrap();
    // T's miss fences S and finds it complete: p and q move to "any"; T takes q.
    assert_eq!(pool.allocate_async_raw(4 * MIB, t).unwrap(), q);
    assert_eq!(pool.allocate_async_raw(G, s).unwrap(), p);
    let snap = check(&pool);
    assert_eq!((snap.reuse_hits, snap.cross_stream_hits), (2, 1));
    no_faults(&sim);
}

/// A trim whose fence wait fails for one recorded stream releases the memory that
/// waited on it after a device synchronize (counted, not an error); the memory that
/// waited on another recorded stream is released after that stream's fence wait.
#[test]
fn a_failed_wait_releases_what_waited_on_it_and_only_that() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t1, t2) = (stream(&sim), stream(&sim), stream(&sim));
    let a = pool.allocate_async_raw(G, s).unwrap();
    let b = pool.allocate_async_raw(4 * MIB, s).unwrap();
    pool.record_stream(a, t1).unwrap();
    pool.record_stream(b, t2).unwrap();
    sim.launch(t2.0, b, 4 * MIB);
    // Deferred in this order: b (waits on T2), then a (waits on T1).
    pool.free_async_raw(b, s).unwrap();
    pool.free_async_raw(a, s).unwrap();
    assert_eq!(check(&pool).event_wait_bytes, 6 * MIB);
    // The fences waited on at trim, in bucket order: S's own, T1's, T2's. The second
    // wait (T1's) fails.
    sim.inject_stream_failure(SimStreamCall::EventSynchronize, 2, CuResult::UNKNOWN);
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1, "{snap:#?}");
    assert_eq!(
        snap.physical_bytes, 0,
        "T2's wait completed its work; all released"
    );
    assert_eq!(syncs(&sim), 1, "the fallback synchronize for a");
    no_faults(&sim);
}

/// Cross-stream reuse follows best fit's waste bound: an 8 MiB request on T takes a
/// 10 MiB mapping freed on S (within 30%) once S's work completed.
#[test]
fn cross_stream_reuse_uses_the_best_fit_bound() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(10 * MIB, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(pool.allocate_async_raw(8 * MIB, t).unwrap(), p);
    assert_eq!(check(&pool).cross_stream_hits, 1);
    no_faults(&sim);
}

/// A stream allocation that finds the device full takes the smallest idle mapping of
/// its own stream that fits, whatever the waste bound, before failing (a forced
/// reuse, counted).
#[test]
fn a_stream_allocation_forces_reuse_before_out_of_memory() {
    let (pool, sim) = small_device(8 * MIB);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(8 * MIB, s).unwrap();
    sim.launch(s.0, p, 8 * MIB);
    pool.free_async_raw(p, s).unwrap();
    // 2 MiB: 8 MiB is beyond the 30% bound, and the device is full.
    assert_eq!(pool.allocate_async_raw(G, s).unwrap(), p);
    let snap = check(&pool);
    assert_eq!((snap.reuse_forced_hits, snap.mappings_created), (1, 1));
    no_faults(&sim);
}

/// A release made by a free's poll is counted for the scope barrier and uncounted
/// when booked: a scope begun after it returns at once (it would wait forever on a
/// release counted wrongly; the waiting thread is then left behind and the test
/// fails after 10 s).
#[test]
fn a_scope_after_a_polled_release_begins() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let pool = Arc::new(pool);
    let s = stream(&sim);
    let ptrs: Vec<u64> = (0..12)
        .map(|_| pool.allocate_async_raw(G, s).unwrap())
        .collect();
    for p in ptrs {
        pool.free_async_raw(p, s).unwrap();
    }
    assert!(check(&pool).mappings_released > 0, "a poll released memory");
    let (tx, rx) = std::sync::mpsc::channel();
    let p2 = Arc::clone(&pool);
    std::thread::spawn(move || {
        let _ = tx.send(p2.retention_begin().is_ok());
    });
    let begun = rx.recv_timeout(std::time::Duration::from_secs(10));
    assert_eq!(
        begun,
        Ok(true),
        "retention_begin waited for a release that was never booked"
    );
    pool.retention_finish().unwrap();
    no_faults(&sim);
}

/// A stream the pool used stays one it asks about captures until a trim or finish,
/// even when an out-of-memory release (which never synchronizes) took all its
/// memory: a capture begun on it later is then seen by a trim, which keeps what
/// needs a device synchronize instead of breaking the capture.
#[test]
fn an_out_of_memory_release_keeps_a_used_stream_in_view() {
    let (pool, sim) = small_device(4 * MIB);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, t).unwrap();
    pool.free_async_raw(p, t).unwrap();
    // S's 4 MiB finds the device full: T's idle memory is fenced, waited on and
    // released (no synchronize), and the retry succeeds.
    let big = pool.allocate_async_raw(4 * MIB, s).unwrap();
    assert_eq!(check(&pool).oom_retries, 1);
    // Memory freed with the synchronous free: releasing it needs a synchronize.
    sim.stream_complete(s.0);
    pool.free_raw(big).unwrap();
    assert_eq!(
        sim.stream_begin_capture(t.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    pool.trim().unwrap();
    assert_eq!(
        sim.stream_end_capture(t.0),
        CuResult::SUCCESS,
        "trim synchronized during T's capture: {:?}",
        sim.faults()
    );
    assert_eq!(
        check(&pool).idle_bytes,
        4 * MIB,
        "kept for after the capture"
    );
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}

/// `Pool::destroy` gives the pool's stream resources back: every event it created
/// (a fence of a free still waiting, and the spare ones) is destroyed, and so is
/// its own blocking stream (made for a legacy-stream free's fence); the caller's
/// stream is the caller's and is left alone. Counted on the simulated driver: one
/// `cuEventDestroy` per `cuEventCreate`, one `cuStreamDestroy` for the two
/// `cuStreamCreate` (the test's stream and the pool's).
#[test]
fn destroy_gives_back_every_event_and_the_pools_stream() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(sim.launch(s.0, p, G), CuResult::SUCCESS);
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_async_raw(G, Stream::LEGACY).unwrap();
    assert_eq!(sim.launch(0, q, G), CuResult::SUCCESS);
    pool.free_async_raw(q, Stream::LEGACY).unwrap();
    // The legacy work completes; a trim (the pool's own stream is made by now).
    sim.stream_complete(0);
    pool.trim().unwrap();
    let created = sim.stream_call_count(SimStreamCall::EventCreate);
    assert!(
        created >= 1,
        "the fence of the free on s, whose kernel is queued"
    );
    assert_eq!(sim.stream_call_count(SimStreamCall::StreamCreate), 2);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventDestroy), 0);
    pool.destroy().unwrap();
    assert_eq!(sim.stream_call_count(SimStreamCall::EventDestroy), created);
    assert_eq!(sim.stream_call_count(SimStreamCall::StreamDestroy), 1);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventCreate), created);
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
