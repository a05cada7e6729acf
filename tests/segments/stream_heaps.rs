//! The heaps of streams in segment mode: a stream's growth releases other streams'
//! wholly free handles (polling only their fences) and nothing of the synchronous
//! heap, a failed fence holds only what was freed on its stream, and capture memory
//! whose fence failed is kept for its graph.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::pools::{seg_pool, seg_pool_on_device};
use common::{assert_driver_empty, check, MIB};
use flare_package::driver::sim::{CaptureMode, SimStreamCall, CU_STREAM_NON_BLOCKING};
use flare_package::{CuResult, DriverCall, Error, SimDriver, Stream};

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A code no memory call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

/// The event calls (`cuEventRecord`, `cuEventQuery`) the pool has made so far.
fn event_calls(sim: &SimDriver) -> u64 {
    sim.stream_call_count(SimStreamCall::EventRecord)
        + sim.stream_call_count(SimStreamCall::EventQuery)
}

/// Segment mode, a stream's growth (`Pool::release_other_homes`): before it, "other
/// streams' heaps' wholly free handles whose stream work is known complete (their
/// fences polled now)" are released. The growing stream's own heap is not another
/// stream's: its fences are not polled there. With S's freed block waiting on S's
/// unfinished kernel and a live block in T's heap, S's 4 MiB growth polls T (nothing
/// to record or query: T freed nothing) and records no fence on S.
#[test]
fn a_streams_growth_polls_only_the_other_streams_heaps() {
    let (pool, sim) = common::segment_pool(1 << 30, 0);
    let (s, t) = (common::stream(&sim), common::stream(&sim));
    // T's heap holds a handle (wholly live).
    let on_t = pool.allocate_async_raw(G, t).unwrap();
    // S's block, used by a kernel still running, freed on S: back in S's heap at
    // once (its own stream), not releasable before a fence on S completes.
    let on_s = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(sim.launch(s.0, on_s, G), CuResult::SUCCESS);
    pool.free_async_raw(on_s, s).unwrap();
    let before = event_calls(&sim);
    let snap = check(&pool);
    assert_eq!((snap.events_outstanding, snap.physical_bytes), (0, 2 * G));
    // 4 MiB fits no free block of S's heap: S's heap grows.
    let big = pool.allocate_async_raw(4 * MIB, s).unwrap();
    let snap = check(&pool);
    assert_eq!(event_calls(&sim), before, "no fence recorded or queried");
    assert_eq!(snap.events_outstanding, 0);
    sim.stream_complete(s.0);
    pool.free_async_raw(big, s).unwrap();
    pool.free_async_raw(on_t, t).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    common::no_faults(&sim);
}

/// Segment mode, a growth with no other stream's heap holding memory
/// (`State::other_homes_hold_memory`, "what a miss asks before polling fences"):
/// nothing of another stream's heap can be released for it, so it polls no fence.
/// S's block, freed on S after `record_stream` on T (T's kernel still running), waits
/// on T's fence (recorded at the free); S's 4 MiB growth then records and queries
/// no event, and the block stays waiting.
#[test]
fn a_growth_with_no_other_streams_heap_polls_no_fence() {
    let (pool, sim) = common::segment_pool(1 << 30, 0);
    let (s, t) = (common::stream(&sim), common::stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.record_stream(p, t).unwrap();
    assert_eq!(sim.launch(t.0, p, G), CuResult::SUCCESS);
    pool.free_async_raw(p, s).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.event_wait_bytes, snap.events_outstanding), (G, 1));
    let before = event_calls(&sim);
    let q = pool.allocate_async_raw(4 * MIB, s).unwrap();
    let snap = check(&pool);
    assert_eq!(event_calls(&sim), before, "no fence recorded or queried");
    assert_eq!((snap.event_wait_bytes, snap.events_outstanding), (G, 1));
    assert_eq!(
        snap.physical_bytes,
        G + 4 * MIB,
        "p's handle and the growth's"
    );
    sim.stream_complete(t.0);
    pool.free_async_raw(q, s).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    common::no_faults(&sim);
}

/// `Pool::release_other_homes`: before a stream's heap grows, wholly free handles of
/// *other streams'* heaps are released; "nothing is released ... from the
/// synchronous API's heap" (`State::collect_other_homes`: "the heaps of stream homes
/// other than `home`"). The synchronous heap keeps a wholly free handle (its free's
/// release, over the 2 MiB threshold, took the other one and synchronized, so this
/// one needs no further synchronize); T's heap holds a live handle. S's heap grows by
/// 2 MiB: T's handle is live, and the synchronous heap's free handle stays.
#[test]
fn a_streams_growth_releases_nothing_of_the_synchronous_heap() {
    let (pool, sim) = seg_pool(G);
    let (s, t) = (common::stream(&sim), common::stream(&sim));
    let x1 = pool.allocate_raw(G).unwrap();
    let x2 = pool.allocate_raw(G).unwrap();
    pool.free_raw(x1).unwrap();
    // 4 MiB cached, over 2 MiB: one handle released, one kept.
    pool.free_raw(x2).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.segment_handles, snap.block_free_bytes), (1, G));
    let on_t = pool.allocate_async_raw(G, t).unwrap();
    let released = sim.call_count(DriverCall::Release);
    let on_s = pool.allocate_async_raw(G, s).unwrap();
    let snap = check(&pool);
    assert_eq!(
        sim.call_count(DriverCall::Release),
        released,
        "nothing released"
    );
    assert_eq!(
        (snap.segment_handles, snap.physical_bytes),
        (3, 3 * G),
        "the synchronous heap's free handle, T's and S's"
    );
    pool.free_async_raw(on_s, s).unwrap();
    pool.free_async_raw(on_t, t).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    common::no_faults(&sim);
}

/// `State::hold_heaps`: when a stream's fence cannot be recorded at a release
/// point, "memory freed on its stream into its heaps that no completed fence covers
/// is released after a device synchronize instead"; memory of its heaps that was
/// never freed on it (freed on another stream, whose fence completed) needs no
/// synchronize ("Release": a segment's release "needs a device synchronize when its
/// segment merged memory that needs one ... and otherwise only the home stream's
/// fence through the last free merged into it"). S's large heap holds X's handle,
/// X freed on T; S's small heap holds two 4 KiB blocks, one freed on S. A trim whose
/// `cuEventRecord` on S is refused releases X's handle (T's fence completed) with no
/// device synchronize: the one handle that would need it (S's small heap's) is not
/// wholly free.
#[test]
fn a_failed_fence_does_not_hold_a_heap_segment_freed_on_another_stream() {
    // Nothing released by a free (no poll on the free's path either).
    let (pool, sim) = seg_pool(1 << 30);
    let (s, t) = (common::stream(&sim), common::stream(&sim));
    let x = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(x, t).unwrap();
    let y1 = pool.allocate_async_raw(4096, s).unwrap();
    let y2 = pool.allocate_async_raw(4096, s).unwrap();
    pool.free_async_raw(y1, s).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.segment_handles, snap.physical_bytes), (2, 2 * G));
    // S is the pool's first stream: its fence is the trim's first record.
    sim.inject_stream_failure(SimStreamCall::EventRecord, 1, FAIL);
    let syncs = sim.call_count(DriverCall::Synchronize);
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1, "S's fence refused");
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        syncs,
        "no device synchronize"
    );
    assert_eq!(
        (snap.segment_handles, snap.physical_bytes),
        (1, G),
        "X's handle released, S's small heap's kept"
    );
    pool.free_async_raw(y2, s).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    common::no_faults(&sim);
}

/// The README: "memory freed in a capture is reused only by that capture and kept for
/// its graph until the scope open at capture time finishes, or, with none, until trim
/// or destroy" (a replay of the graph writes into it). A block freed in a capture
/// while `record_stream` named another stream waits for that stream's fence; when the
/// fence could not be recorded (at the free) or waited on (at a release point), the
/// block went to the "held" bucket, which the next release point that synchronizes
/// releases: here the synchronous out-of-memory release, with no scope closed and no
/// trim, unmapped the graph's memory. Found by a fuzzer that checks capture-held
/// ranges stay mapped.
#[test]
fn capture_memory_whose_fence_failed_is_kept_for_its_graph() {
    for call in [SimStreamCall::EventRecord, SimStreamCall::EventSynchronize] {
        // 4 MiB: S's small segment (2 MiB) and the synchronous heap's 2 MiB fill it.
        let (pool, sim) = seg_pool_on_device(2 * G, 0);
        let s = Stream(
            sim.stream_create_with_flags(CU_STREAM_NON_BLOCKING)
                .unwrap(),
        );
        let t = Stream(
            sim.stream_create_with_flags(CU_STREAM_NON_BLOCKING)
                .unwrap(),
        );
        let p = pool.allocate_async_raw(MIB, s).unwrap();
        let q = pool.allocate_raw(G).unwrap();
        pool.record_stream(p, t).unwrap();
        sim.launch(t.0, p, MIB);
        sim.stream_begin_capture(s.0, CaptureMode::Global);
        if call == SimStreamCall::EventRecord {
            sim.inject_stream_failure(call, 1, CuResult::UNKNOWN);
        }
        pool.free_async_raw(p, s).unwrap();
        assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
        sim.stream_complete(t.0);
        if call == SimStreamCall::EventSynchronize {
            sim.inject_stream_failure(call, 1, CuResult::UNKNOWN);
        }
        // The device is full: the synchronous allocation releases what it may.
        let r = pool.allocate_raw(G);
        assert!(
            matches!(r, Err(Error::OutOfMemory { .. })),
            "{call:?}: the graph's 2 MiB handle served {r:x?}"
        );
        assert_eq!(
            sim.touch(p, MIB, 0),
            CuResult::SUCCESS,
            "{call:?}: the graph's memory was unmapped"
        );
        check(&pool);
        // Trim releases it (no scope: the capture's memory goes at trim).
        pool.free_raw(q).unwrap();
        pool.trim().unwrap();
        let snap = check(&pool);
        assert_eq!(snap.physical_bytes, 0, "{call:?}: {snap:#?}");
        assert_eq!(sim.contract_faults(), 0, "{:?}", sim.faults());
    }
}
