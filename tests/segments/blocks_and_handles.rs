//! Segment mode on the simulated driver (issue 12): blocks carved from segments,
//! split and coalesced, handles released whole, stream order per heap. Every
//! expectation comes from the issue's semantics (512-byte rounding, a heap per
//! stream, no release inside a scope, whole handles released outside one with the
//! reservation kept) or from the driver rows of `docs/vmm-semantics.md` (a handle is
//! mapped whole, at a granularity-aligned address); the simulated driver counts a
//! contract fault for an unmap of memory queued work touches and for a hand-off of
//! memory that another stream's unordered work touches: every test ends with none.

use crate::common;

use common::{assert_driver_empty, check, no_faults, stream, MIB};
use flare_package::driver::sim::{CaptureMode, SimStreamCall};
use flare_package::{CuResult, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SimDriver};
use std::sync::Arc;

const G: u64 = 2 * MIB;
const KIB: u64 = 1 << 10;

/// A segment-mode pool on a simulated H200 (140 GiB) with `threshold`.
fn seg_pool(threshold: u64) -> (Pool, Arc<SimDriver>) {
    seg_pool_on(140 << 30, threshold)
}

fn seg_pool_on(capacity: u64, threshold: u64) -> (Pool, Arc<SimDriver>) {
    common::segment_pool(capacity, threshold)
}

/// Every driver call the simulated driver counted, memory and stream calls (a stream
/// or event kind of `DriverCall` counts its stream call: counted once, below).
fn total_calls(sim: &SimDriver) -> u64 {
    DriverCall::ALL
        .iter()
        .filter(|&&c| SimStreamCall::of_driver_call(c).is_none())
        .map(|&c| sim.call_count(c))
        .sum::<u64>()
        + SimStreamCall::ALL
            .iter()
            .map(|&c| sim.stream_call_count(c))
            .sum::<u64>()
}

fn is_oom(e: &Error) -> bool {
    matches!(e, Error::OutOfMemory { .. })
}

/// A hundred 4 KiB tensors share one 2 MiB handle (a whole mapping each would take
/// 100 handles, 200 MiB): distinct, 512-byte aligned, not overlapping.
#[test]
fn small_requests_share_one_handle() {
    let (pool, sim) = seg_pool(0);
    pool.retention_begin().unwrap();
    let mut ptrs: Vec<u64> = (0..100)
        .map(|_| pool.allocate_raw(4 * KIB).unwrap())
        .collect();
    let s = check(&pool);
    assert_eq!(s.physical_bytes, G, "one granule holds 400 KiB");
    assert_eq!(
        (s.segment_handles, s.mappings_created, s.segment_count),
        (1, 1, 1)
    );
    assert_eq!((s.block_live_count, s.block_live_bytes), (100, 400 * KIB));
    assert_eq!(s.block_free_bytes, G - 400 * KIB);
    assert_eq!((s.live_count, s.live_mapped_bytes), (100, 0));
    ptrs.sort_unstable();
    for w in ptrs.windows(2) {
        assert!(w[1] - w[0] >= 4 * KIB, "overlap: {:#x} {:#x}", w[0], w[1]);
    }
    assert!(ptrs.iter().all(|p| p % 512 == 0));
    assert!(
        ptrs[99] + 4 * KIB - ptrs[0] <= G,
        "all inside the one handle"
    );
    // Each block is usable memory of the device: the driver sees it mapped.
    for &p in &ptrs {
        assert_eq!(sim.touch(p, 4 * KIB, 0), CuResult::SUCCESS);
    }
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    let s = check(&pool);
    assert_eq!(s.physical_bytes, G, "inside a scope nothing is released");
    assert_eq!((s.block_live_bytes, s.block_free_bytes), (0, G));
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.segment_handles), (0, 0));
    assert_eq!(s.segment_count, 1, "the reservation is kept for regrowth");
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// Requests round up to 512 bytes (PyTorch's rounding); a fresh segment is carved
/// from its start, so the second block follows the first.
#[test]
fn requests_round_to_512_bytes() {
    let (pool, _sim) = seg_pool(0);
    let a = pool.allocate_raw(1).unwrap();
    let b = pool.allocate_raw(513).unwrap();
    let c = pool.allocate_raw(512).unwrap();
    assert_eq!(b, a + 512);
    assert_eq!(c, b + 1024);
    let s = check(&pool);
    assert_eq!(s.live_requested_bytes, 1 + 513 + 512);
    assert_eq!(s.block_live_bytes, 512 + 1024 + 512);
    assert_eq!(a % G, 0, "the segment starts granularity-aligned");
}

/// Two freed 4 MiB blocks next to each other coalesce: an 8 MiB request takes their
/// range with no new handle.
#[test]
fn freed_neighbours_coalesce() {
    let (pool, _sim) = seg_pool(0);
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    let b = pool.allocate_raw(4 * MIB).unwrap();
    assert_eq!(
        b,
        a + 4 * MIB,
        "the second grows the segment right after the first"
    );
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    let created = check(&pool).mappings_created;
    let c = pool.allocate_raw(8 * MIB).unwrap();
    assert_eq!(c, a);
    let s = check(&pool);
    assert_eq!(s.mappings_created, created, "no new handle");
    assert_eq!(s.physical_bytes, 8 * MIB);
    assert_eq!((s.reuse_hits, s.reuse_exact_hits), (1, 1));
    // The middle of a free range: freeing a block between two free ones merges all
    // three.
    pool.free_raw(c).unwrap();
    let x = pool.allocate_raw(2 * MIB).unwrap();
    let y = pool.allocate_raw(2 * MIB).unwrap();
    let z = pool.allocate_raw(4 * MIB).unwrap();
    assert_eq!((y, z), (x + 2 * MIB, x + 4 * MIB));
    pool.free_raw(x).unwrap();
    pool.free_raw(z).unwrap();
    pool.free_raw(y).unwrap();
    assert_eq!(pool.allocate_raw(8 * MIB).unwrap(), x);
    assert_eq!(check(&pool).physical_bytes, 8 * MIB);
    pool.retention_abort().unwrap();
}

/// vLLM's capture order (issue 12): graphs captured largest first, each freeing its
/// transient, peak at the largest.
#[test]
fn largest_first_captures_peak_at_the_largest() {
    let (pool, _sim) = seg_pool(0);
    pool.retention_begin().unwrap();
    // Above 1 MiB: one heap class (smaller requests have a segment of their own).
    for size in [8 * MIB, 4 * MIB, 2 * MIB, 3 * MIB / 2] {
        let p = pool.allocate_raw(size).unwrap();
        pool.free_raw(p).unwrap();
    }
    let s = check(&pool);
    assert_eq!(s.peak_physical_bytes, 8 * MIB);
    pool.retention_finish().unwrap();
    // The same, with each graph's transient freed only after the next is allocated.
    let (pool, _sim) = seg_pool(0);
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    let b = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(b).unwrap();
    assert_eq!(check(&pool).peak_physical_bytes, 4 * MIB);
}

/// Weights reloaded with padding (issue 12): two 2 MiB weights, each replaced by a
/// 4 MiB one allocated before the old one is freed. Live at most: 2 + 4 + 4 = 10
/// MiB; the pool grows by at most the padding (2 x 2 MiB) plus one weight (2 MiB)
/// over the 4 MiB it started with.
#[test]
fn weights_reloaded_with_padding_grow_by_the_padding_and_one_weight() {
    let (pool, sim) = seg_pool(0);
    pool.retention_begin().unwrap();
    let w1 = pool.allocate_raw(2 * MIB).unwrap();
    let w2 = pool.allocate_raw(2 * MIB).unwrap();
    let start = check(&pool).physical_bytes;
    assert_eq!(start, 4 * MIB);
    let n1 = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(w1).unwrap();
    let n2 = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(w2).unwrap();
    let s = check(&pool);
    assert!(
        s.peak_physical_bytes <= start + 2 * 2 * MIB + 2 * MIB,
        "peak {} MiB",
        s.peak_physical_bytes / MIB
    );
    // 10 MiB were live at once (w2, n1, n2): the bound is met exactly, by lending
    // w1's free handle to n2's range with a new 2 MiB handle after it.
    assert_eq!(s.peak_physical_bytes, 10 * MIB);
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (1, 2 * MIB));
    assert_eq!(s.mappings_created, 4, "w1, w2, n1 and n2's second half");
    assert_eq!(sim.state().mappings, 5, "w1's handle is mapped twice");
    // Both new weights are whole device memory the driver maps with access.
    for p in [n1, n2] {
        assert_eq!(sim.touch(p, 4 * MIB, 0), CuResult::SUCCESS);
    }
    pool.retention_finish().unwrap();
    pool.free_raw(n1).unwrap();
    pool.free_raw(n2).unwrap();
    check(&pool);
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// Outside a scope (threshold 0) a handle is released as soon as its whole range is
/// free, and not before; the segment keeps its reservation and regrows from its start.
#[test]
fn outside_a_scope_wholly_free_handles_are_released_and_the_reservation_kept() {
    let (pool, sim) = seg_pool(0);
    let a = pool.allocate_raw(KIB).unwrap();
    let b = pool.allocate_raw(KIB).unwrap();
    pool.free_raw(a).unwrap();
    let s = check(&pool);
    assert_eq!(s.physical_bytes, G, "b still lives in the handle");
    pool.free_raw(b).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.physical_bytes, s.segment_handles, s.segment_count),
        (0, 0, 1)
    );
    assert_eq!(sim.call_count(DriverCall::Release), 1);
    assert_eq!(sim.call_count(DriverCall::FreeReservation), 0);
    assert_eq!(sim.state().reservations, 1);
    let c = pool.allocate_raw(KIB).unwrap();
    assert_eq!(c, a, "regrown at the segment's start");
    assert_eq!(sim.call_count(DriverCall::Reserve), 1, "no new reservation");
    pool.free_raw(c).unwrap();
    drop(pool);
    let d = sim.state();
    assert_eq!((d.reservations, d.handles, d.mappings), (0, 0, 0), "{d:?}");
    no_faults(&sim);
}

/// A release threshold keeps free handles cached up to it: the next request reuses
/// them with no driver call.
#[test]
fn a_release_threshold_keeps_free_handles_cached() {
    let (pool, sim) = seg_pool(8 * MIB);
    let p = pool.allocate_raw(3 * MIB).unwrap();
    pool.free_raw(p).unwrap();
    let s = check(&pool);
    assert_eq!(s.physical_bytes, 4 * MIB, "3 MiB needs two granules, kept");
    let creates = sim.call_count(DriverCall::Create);
    let q = pool.allocate_raw(3 * MIB).unwrap();
    assert_eq!((q, sim.call_count(DriverCall::Create)), (p, creates));
    pool.free_raw(q).unwrap();
    // Above the threshold: 10 MiB free, 8 kept at most, so the released handles
    // bring the cached bytes back to it or under.
    let r = pool.allocate_raw(10 * MIB).unwrap();
    pool.free_raw(r).unwrap();
    let s = check(&pool);
    assert!(s.block_free_bytes <= 8 * MIB, "{s:#?}");
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!(s.physical_bytes, 0, "trim releases every free handle");
}

/// Over the release threshold, a free releases wholly free handles only until the
/// cached bytes are back at the threshold (the handles in flight count as released):
/// the rest stay cached, as whole mappings do.
#[test]
fn a_release_over_the_threshold_stops_at_it() {
    let (pool, sim) = seg_pool(8 * MIB);
    // Four 4 MiB requests: a 4 MiB handle each (an eighth of what is mapped is at
    // most 1.5 MiB: never more than the need).
    let p: Vec<u64> = (0..4)
        .map(|_| pool.allocate_raw(4 * MIB).unwrap())
        .collect();
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (4, 16 * MIB));
    pool.free_raw(p[0]).unwrap();
    pool.free_raw(p[1]).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.physical_bytes, s.block_free_bytes),
        (16 * MIB, 8 * MIB),
        "8 MiB free: at the threshold, all kept"
    );
    // 12 MiB free in three wholly free handles: releasing one brings the cached bytes
    // back to 8 MiB.
    pool.free_raw(p[2]).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.physical_bytes, s.block_free_bytes, s.segment_handles),
        (12 * MIB, 8 * MIB, 3),
        "{s:#?}"
    );
    assert_eq!(sim.call_count(DriverCall::Release), 1);
    pool.free_raw(p[3]).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.physical_bytes, s.block_free_bytes, s.segment_handles),
        (8 * MIB, 8 * MIB, 2),
        "{s:#?}"
    );
    assert_eq!(sim.call_count(DriverCall::Release), 2);
    no_faults(&sim);
}

/// A request above `segment_whole_threshold_bytes` takes a whole mapping.
#[test]
fn requests_above_the_whole_threshold_take_whole_mappings() {
    let pool = Pool::new(PoolConfig {
        reuse_policy: ReusePolicy::Segments,
        segment_whole_threshold_bytes: 8 * MIB,
        ..PoolConfig::default()
    })
    .unwrap();
    let big = pool.allocate_raw(16 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.live_mapped_bytes, s.block_live_count, s.segment_count),
        (16 * MIB, 0, 0)
    );
    let small = pool.allocate_raw(8 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.block_live_count, s.block_live_bytes), (1, 8 * MIB));
    pool.free_raw(big).unwrap();
    pool.free_raw(small).unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}

/// The stream pair: a block freed on its stream is reused there at once, with a
/// kernel still queued on it, and no synchronize, capture query or event call.
#[test]
fn a_stream_reuses_its_blocks_at_once() {
    let (pool, sim) = seg_pool(u64::MAX);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(64 * KIB, s).unwrap();
    assert_eq!(sim.launch(s.0, p, 64 * KIB), CuResult::SUCCESS);
    pool.free_async_raw(p, s).unwrap();
    let calls = total_calls(&sim);
    let q = pool.allocate_async_raw(64 * KIB, s).unwrap();
    assert_eq!(q, p);
    assert_eq!(total_calls(&sim), calls, "no driver call on the reuse");
    assert_eq!(sim.call_count(DriverCall::Synchronize), 0);
    pool.free_async_raw(q, s).unwrap();
    no_faults(&sim);
}

/// Heaps are per stream: T never gets a block of S's heap while S's kernel on it
/// is queued, and S's free space is not T's.
#[test]
fn streams_have_heaps_of_their_own() {
    let (pool, sim) = seg_pool(u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(64 * KIB, s).unwrap();
    sim.launch(s.0, p, 64 * KIB);
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_async_raw(64 * KIB, t).unwrap();
    assert_ne!(q / G, p / G, "T's block is in a handle of its own heap");
    let s2 = check(&pool);
    assert_eq!((s2.segment_count, s2.segment_handles), (2, 2));
    sim.launch(t.0, q, 64 * KIB);
    no_faults(&sim);
}

/// A heap that grows takes the place of what other streams' heaps hold wholly free
/// once their work is complete: a side stream's warmup memory does not stay cached
/// beside the main stream's growth (a stream's heap serves only its stream). The
/// release comes before the creation, so the peak never holds both. Not while the
/// other stream's work may still touch the memory, and not inside a retention scope.
#[test]
fn a_growth_takes_the_place_of_other_streams_idle_handles() {
    let size = 64 * MIB; // above the small class: one handle of exactly this size
    for (complete, scope) in [(true, false), (false, false), (true, true)] {
        let (pool, sim) = seg_pool(u64::MAX);
        let (s, t) = (stream(&sim), stream(&sim));
        if scope {
            pool.retention_begin().unwrap();
        }
        let p = pool.allocate_async_raw(size, s).unwrap();
        sim.launch(s.0, p, size);
        pool.free_async_raw(p, s).unwrap();
        if complete {
            sim.stream_complete(s.0);
        }
        let q = pool.allocate_async_raw(size, t).unwrap();
        sim.launch(t.0, q, size);
        let snap = check(&pool);
        let released = complete && !scope;
        let expect = if released { size } else { 2 * size };
        let case = format!("complete {complete}, scope {scope}");
        assert_eq!(snap.physical_bytes, expect, "{case}: {snap:#?}");
        assert_eq!(snap.peak_physical_bytes, expect, "{case}");
        assert_eq!(snap.segment_handles, expect / size, "{case}");
        assert_eq!(
            sim.call_count(DriverCall::Synchronize),
            0,
            "{case}: fences only"
        );
        no_faults(&sim);
        if scope {
            pool.retention_finish().unwrap();
        }
        sim.stream_complete(t.0);
        pool.free_async_raw(q, t).unwrap();
        pool.trim().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{case}");
        assert_driver_empty(&pool);
    }
}

/// A block freed on a stream other than its heap's waits for that stream's work:
/// its heap's stream gets it back only once the fence completes.
#[test]
fn a_block_freed_on_another_stream_returns_after_its_fence() {
    let (pool, sim) = seg_pool(u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    sim.launch(t.0, p, G);
    pool.free_async_raw(p, t).unwrap();
    let q = pool.allocate_async_raw(G, s).unwrap();
    assert_ne!(q, p, "T's kernel still touches p");
    sim.stream_complete(t.0);
    pool.free_async_raw(q, s).unwrap();
    // A release point polls T's fence and gives p back to S's heap.
    let r = pool.allocate_async_raw(2 * G, s).unwrap();
    pool.free_async_raw(r, s).unwrap();
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, 0, "{snap:#?}");
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        0,
        "fences, not the device"
    );
    no_faults(&sim);
}

/// Trim releases a stream heap's free handles after its fence (`cuEventSynchronize`),
/// never with a device synchronize, and not before its kernel completes.
#[test]
fn trim_waits_for_a_stream_heaps_fence() {
    let (pool, sim) = seg_pool(u64::MAX);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(MIB, s).unwrap();
    sim.launch(s.0, p, MIB);
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(check(&pool).physical_bytes, G);
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, 0);
    assert_eq!(sim.call_count(DriverCall::Synchronize), 0);
    assert!(
        sim.queued_work().is_empty(),
        "the fence wait ran the kernel"
    );
    no_faults(&sim);
}

/// A stream heap whose fence cannot be recorded, or waited on, at trim: the order of
/// its stream's work is unknown, so its free handles are released after a device
/// synchronize instead (counted, not an error), as idle memory of a stream is, and
/// not before the stream's kernel is done.
#[test]
fn a_failed_fence_releases_a_stream_heap_after_a_synchronize() {
    for call in [SimStreamCall::EventRecord, SimStreamCall::EventSynchronize] {
        let (pool, sim) = seg_pool(u64::MAX);
        let s = stream(&sim);
        let p = pool.allocate_async_raw(MIB, s).unwrap();
        sim.launch(s.0, p, MIB);
        pool.free_async_raw(p, s).unwrap();
        sim.inject_stream_failure(call, 1, CuResult::UNKNOWN);
        pool.trim().unwrap();
        let snap = check(&pool);
        assert_eq!(
            (snap.physical_bytes, snap.stream_call_failures),
            (0, 1),
            "{call:?}: {snap:#?}"
        );
        assert_eq!(sim.call_count(DriverCall::Synchronize), 1, "{call:?}");
        no_faults(&sim);
    }
}

/// The synchronous free of a block with work in flight: its handle's release
/// synchronizes the device first (the synchronous API's contract).
#[test]
fn a_synchronous_release_synchronizes_first() {
    let (pool, sim) = seg_pool(0);
    let p = pool.allocate_raw(MIB).unwrap();
    sim.mark_busy(p, MIB);
    pool.free_raw(p).unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    assert_eq!(sim.call_count(DriverCall::Synchronize), 1);
    no_faults(&sim);
}

/// Memory freed during a capture is the capture's: reused inside it once its heap
/// has no room, never by its stream outside the capture until the scope closes.
#[test]
fn blocks_freed_in_a_capture_stay_with_it() {
    let (pool, sim) = seg_pool(0);
    let s = stream(&sim);
    pool.retention_begin().unwrap();
    sim.stream_begin_capture(s.0, CaptureMode::Global);
    // Two 1 MiB blocks fill the small segment's one handle.
    let p = pool.allocate_async_raw(MIB, s).unwrap();
    let keep = pool.allocate_async_raw(MIB, s).unwrap();
    sim.launch(s.0, p, MIB);
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(check(&pool).capture_held_bytes, MIB);
    let q = pool.allocate_async_raw(MIB, s).unwrap();
    assert_eq!(q, p, "reused inside the same capture");
    pool.free_async_raw(q, s).unwrap();
    sim.stream_end_capture(s.0);
    let r = pool.allocate_async_raw(MIB, s).unwrap();
    assert_ne!(r, p, "the graph may replay into p: not the stream's");
    assert_eq!(check(&pool).physical_bytes, 2 * G, "a second handle for r");
    pool.free_async_raw(r, s).unwrap();
    pool.free_async_raw(keep, s).unwrap();
    pool.retention_finish().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.capture_held_bytes, snap.physical_bytes), (0, 0));
    no_faults(&sim);
}

/// Out of memory inside a heap: free handles of another heap are released (outside
/// a scope) and the request retried. (With the other stream's work known complete,
/// the growth gives its handle way before creating: no out-of-memory at all.)
#[test]
fn out_of_memory_releases_other_heaps_free_handles() {
    for pending in [true, false] {
        let (pool, sim) = seg_pool_on(8 * MIB, u64::MAX);
        let s = stream(&sim);
        let a = pool.allocate_async_raw(6 * MIB, s).unwrap();
        if pending {
            sim.launch(s.0, a, 6 * MIB);
        }
        pool.free_async_raw(a, s).unwrap();
        assert_eq!(check(&pool).physical_bytes, 6 * MIB, "cached");
        let b = pool.allocate_raw(6 * MIB).unwrap();
        let snap = check(&pool);
        assert_eq!(snap.physical_bytes, 6 * MIB, "S's handle gave way");
        assert_eq!(snap.oom_retries, u64::from(pending), "pending {pending}");
        assert_eq!(snap.peak_physical_bytes, 6 * MIB, "never both");
        pool.free_raw(b).unwrap();
        no_faults(&sim);
    }
    // Inside a scope nothing is released: the same request fails.
    let (pool, sim) = seg_pool_on(8 * MIB, u64::MAX);
    let s = stream(&sim);
    let a = pool.allocate_async_raw(6 * MIB, s).unwrap();
    pool.free_async_raw(a, s).unwrap();
    pool.retention_begin().unwrap();
    assert!(is_oom(&pool.allocate_raw(6 * MIB).unwrap_err()));
    pool.retention_finish().unwrap();
    no_faults(&sim);
}

/// A failed `cuMemMap` of a growth undoes it (the handle released) and leaves the
/// pool usable; the books match the driver.
#[test]
fn a_failed_growth_is_undone() {
    let (pool, sim) = seg_pool(0);
    sim.inject_failure(DriverCall::Map, 1, CuResult::INVALID_VALUE);
    let e = pool.allocate_raw(MIB).unwrap_err();
    assert!(
        matches!(e, Error::Driver { source, .. } if source.call == DriverCall::Map),
        "{e}"
    );
    assert_eq!(
        sim.call_count(DriverCall::Release),
        1,
        "the handle released"
    );
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.map_failures), (0, 1));
    let p = pool.allocate_raw(MIB).unwrap();
    pool.free_raw(p).unwrap();
    check(&pool);
    assert_driver_empty(&pool);
}

/// Outside a scope, a heap whose top handle is released and regrown every iteration
/// (activations above a long-lived weight) maps it at the same address each time:
/// the segment's growing end comes back down, so its reservation is never walked
/// through (at 64 MiB an iteration, 140 GiB would last 2 240 iterations before a
/// new reservation).
#[test]
fn a_released_top_handle_is_regrown_in_place() {
    let (pool, sim) = seg_pool(0);
    let weight = pool.allocate_raw(4 * MIB).unwrap();
    let first = pool.allocate_raw(64 * MIB).unwrap();
    pool.free_raw(first).unwrap();
    assert_eq!(
        check(&pool).physical_bytes,
        4 * MIB,
        "the top handle released"
    );
    for _ in 0..100 {
        let a = pool.allocate_raw(64 * MIB).unwrap();
        assert_eq!(a, first, "regrown at the same address");
        pool.free_raw(a).unwrap();
    }
    assert_eq!(sim.call_count(DriverCall::Reserve), 1);
    let s = check(&pool);
    assert_eq!((s.segment_count, s.physical_bytes), (1, 4 * MIB));
    pool.free_raw(weight).unwrap();
    no_faults(&sim);
}

/// A handle released out of the middle of a free block leaves the part before it
/// free and usable at its size: a 2.5 MiB block in a 4 MiB handle, a 3.5 MiB one
/// spanning the handle's free 1.5 MiB and a new 2 MiB handle; freeing the second
/// (threshold 0) releases the new handle, and a 1.5 MiB request then takes the
/// first handle's free part with no driver call.
#[test]
fn the_free_part_beside_a_released_handle_keeps_its_size() {
    let (pool, sim) = seg_pool(0);
    let a = pool.allocate_raw(5 * MIB / 2).unwrap();
    let x = pool.allocate_raw(7 * MIB / 2).unwrap();
    assert_eq!(x, a + 5 * MIB / 2, "x starts in a's handle");
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (2, 6 * MIB));
    pool.free_raw(x).unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (1, 4 * MIB));
    assert_eq!(s.block_free_bytes, 3 * MIB / 2);
    let creates = sim.call_count(DriverCall::Create);
    let y = pool.allocate_raw(3 * MIB / 2).unwrap();
    assert_eq!(y, x, "the free part of a's handle");
    assert_eq!(sim.call_count(DriverCall::Create), creates);
    for p in [a, y] {
        pool.free_raw(p).unwrap();
    }
    assert_eq!(check(&pool).physical_bytes, 0);
}

/// A steady stream pair (allocate and free the same size on one stream, outside a
/// scope, threshold 0, the block between two live ones so its handle is never
/// wholly free) records no fence: memory reused at once is never fenced, as with
/// whole mappings (`cover_waited`, aged).
#[test]
fn a_steady_stream_pair_records_no_fence() {
    let (pool, sim) = seg_pool(0);
    let s = stream(&sim);
    let left = pool.allocate_async_raw(64 * KIB, s).unwrap();
    let p = pool.allocate_async_raw(64 * KIB, s).unwrap();
    let right = pool.allocate_async_raw(64 * KIB, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    for _ in 0..200 {
        let q = pool.allocate_async_raw(64 * KIB, s).unwrap();
        assert_eq!(q, p);
        pool.free_async_raw(q, s).unwrap();
    }
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), 0);
    assert_eq!(check(&pool).events_outstanding, 0);
    for b in [left, right] {
        pool.free_async_raw(b, s).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}

/// A growth whose `cuMemMap` fails gives its claimed range back: the next growth of
/// the segment maps right after the handle before it, leaving no hole.
#[test]
fn a_failed_growth_gives_its_range_back() {
    let (pool, sim) = seg_pool(u64::MAX);
    let a = pool.allocate_raw(2 * MIB).unwrap();
    sim.inject_failure(DriverCall::Map, 1, CuResult::INVALID_VALUE);
    assert!(pool.allocate_raw(2 * MIB).is_err());
    let b = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(b, a + 2 * MIB, "mapped where the failed growth claimed");
    let s = check(&pool);
    assert_eq!(
        (s.segment_handles, s.physical_bytes, s.map_failures),
        (2, 4 * MIB, 1)
    );
    no_faults(&sim);
}
