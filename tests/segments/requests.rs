//! Review of segment mode (issue 12), as a new user and an adversarial tester: each
//! test is one finding and FAILS on the reviewed commit (c30ae19). Each expectation
//! is quoted from the README, the rustdoc, `docs/ARCHITECTURE.md` or the issue, not
//! taken from the code's output.
//! Run: `cargo test --release --test review_segments`.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use common::{check, MIB};
use flare_package::driver::sim::{CaptureMode, SimStreamCall, CU_STREAM_NON_BLOCKING};
use flare_package::{CuResult, DriverCall, Error, Pool, SimDriver, Stream};
use std::sync::Arc;

const G: u64 = 2 * MIB;

/// A segment-mode pool on a simulated device of `capacity` bytes, release threshold
/// `threshold`.
fn seg_pool(capacity: u64, threshold: u64) -> (Pool, Arc<SimDriver>) {
    common::segment_pool(capacity, threshold)
}

/// `Error::OutOfMemory` says `live`: "Bytes mapped to live allocations when the
/// request failed", and `idle`: "Bytes held idle (retained or cached)". In segment
/// mode live allocations are blocks and retained memory is free blocks, so a full
/// device reported "0 B live, 0 B retained idle" while the pool held all of it: the
/// message sends the user looking for memory elsewhere. Here a 2 MiB block is live
/// and a 2 MiB block retained (inside a scope) on a 4 MiB device.
#[test]
fn out_of_memory_counts_blocks_as_live_and_retained() {
    let (pool, _sim) = seg_pool(2 * G, 0);
    let scope = pool.retention_scope().unwrap();
    let a = pool.allocate_raw(G).unwrap();
    let b = pool.allocate_raw(G).unwrap();
    pool.free_raw(b).unwrap();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.block_live_bytes), (2 * G, G));
    let e = pool.allocate_raw(2 * G).unwrap_err();
    match e {
        Error::OutOfMemory {
            live,
            idle,
            in_scope,
            ..
        } => assert_eq!((live, idle, in_scope), (G, G, true), "{e}"),
        _ => panic!("not out of memory: {e:?}"),
    }
    pool.free_raw(a).unwrap();
    scope.finish().unwrap();
}

/// `Pool::free_raw`: "Outside [a scope], it stays cached while the pool's idle bytes
/// stay at or under the release threshold, else it is released"; the README: outside
/// a scope "a handle whose whole range is free is released (after its stream's fence,
/// or a device synchronize for the synchronous API)". A block of a stream's heap freed
/// with the synchronous `free` (threshold 0) was kept whole for the synchronous API
/// and its handle held until the next trim or finish; a whole mapping freed the same
/// way is released at once. Released now after the free's synchronize, with no
/// contract fault (the kernel queued on the block is done first).
#[test]
fn a_stream_block_freed_synchronously_is_released_under_the_threshold() {
    let (pool, sim) = seg_pool(140 << 30, 0);
    let s = Stream(
        sim.stream_create_with_flags(CU_STREAM_NON_BLOCKING)
            .unwrap(),
    );
    let p = pool.allocate_async_raw(MIB, s).unwrap();
    sim.launch(s.0, p, MIB);
    assert_eq!(check(&pool).physical_bytes, G);
    pool.free_raw(p).unwrap();
    let snap = check(&pool);
    assert_eq!(
        (snap.physical_bytes, snap.segment_handles),
        (0, 0),
        "{snap:#?}"
    );
    assert_eq!(sim.call_count(DriverCall::Synchronize), 1);
    assert_eq!(sim.contract_faults(), 0, "{:?}", sim.faults());
    // The heap still works: the stream gets a block again.
    let q = pool.allocate_async_raw(MIB, s).unwrap();
    pool.free_async_raw(q, s).unwrap();
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
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
        let (pool, sim) = seg_pool(2 * G, 0);
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

/// `docs/ARCHITECTURE.md`: "When the driver is out of memory, the smallest idle
/// mapping that fits is taken whatever its size (the policy's bound chooses between
/// idle mappings; it is no reason to fail)"; the fit "probes the first 8 blocks of
/// the request's own bin ..., else takes the first block of the next non-empty bin".
/// With nine smaller blocks in front of the one block that fits in the request's own
/// bin (sizes 128 to 131 units of 512 bytes share a bin) and no larger free block,
/// the lookup gave up: the heap grew, and on a full device the request failed with
/// out-of-memory although a free block of its heap fits.
#[test]
fn a_fitting_free_block_behind_the_probed_ones_is_found() {
    const U: u64 = 512;
    // One 2 MiB handle: the small heap's segment, and the whole device.
    let (pool, _sim) = seg_pool(G, 0);
    let scope = pool.retention_scope().unwrap();
    let fits = pool.allocate_raw(131 * U).unwrap();
    let mut keep = vec![pool.allocate_raw(U).unwrap()];
    let mut small = Vec::new();
    for _ in 0..9 {
        small.push(pool.allocate_raw(128 * U).unwrap());
        keep.push(pool.allocate_raw(U).unwrap());
    }
    // The rest of the handle: 4096 - 131 - 9 * 128 - 10 units.
    keep.push(pool.allocate_raw(2048 * U).unwrap());
    keep.push(pool.allocate_raw(755 * U).unwrap());
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.block_free_bytes), (G, 0), "{s:#?}");
    // Freed first, so it is last in its bin; the nine 128-unit blocks in front.
    pool.free_raw(fits).unwrap();
    for p in small {
        pool.free_raw(p).unwrap();
    }
    let p = pool.allocate_raw(130 * U);
    assert_eq!(p.as_ref().ok(), Some(&fits), "{p:x?}");
    let s = check(&pool);
    assert_eq!(s.physical_bytes, G, "no growth: {s:#?}");
    scope.finish().unwrap();
}

/// `docs/ARCHITECTURE.md`, "Growth": "A miss maps one new whole handle at the
/// segment's end, counting the free block already there". Once a released top handle
/// brought the growing end back down, the free block ending there was not counted:
/// the next growth mapped the whole request rounded up. Here a 3 MiB block holds a
/// 4 MiB handle (1 MiB free at its end); a 2 MiB block grows a second handle and is
/// freed, which releases that handle; a 2.5 MiB request then needs 1.5 MiB beyond the
/// free 1 MiB, one 2 MiB handle (6 MiB in all), and mapped 4 MiB (8 MiB).
#[test]
fn a_growth_after_a_released_top_handle_counts_the_free_end() {
    let (pool, _sim) = seg_pool(140 << 30, 0);
    let x = pool.allocate_raw(3 * MIB).unwrap();
    let y = pool.allocate_raw(G).unwrap();
    assert_eq!(
        y,
        x + 3 * MIB,
        "carved from the 1 MiB free and a new handle"
    );
    pool.free_raw(y).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.physical_bytes, s.block_free_bytes),
        (2 * G, MIB),
        "{s:#?}"
    );
    let z = pool.allocate_raw(5 * MIB / 2).unwrap();
    assert_eq!(z, x + 3 * MIB, "the free end first");
    let s = check(&pool);
    assert_eq!(s.physical_bytes, 3 * G, "one 2 MiB handle more: {s:#?}");
    pool.free_raw(z).unwrap();
    pool.free_raw(x).unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}

/// `Pool::destroy`: "Releases everything the pool holds ... and retries every refused
/// step once. Errors: [`Error::Driver`] with the first step the driver still refused
/// after the retry; that memory is left to the driver". In segment mode a segment's
/// reservation free refused once was never retried (the driver kept the range), and
/// a handle's unmap refused once, then released by the same release point's second
/// pass, was still reported as an error with nothing left.
#[test]
fn destroy_retries_a_refused_step_once_in_segment_mode() {
    for call in [DriverCall::FreeReservation, DriverCall::Unmap] {
        let (pool, sim) = seg_pool(140 << 30, 0);
        let _live = pool.allocate_raw(MIB).unwrap();
        sim.inject_failure(call, 1, CuResult::INVALID_VALUE);
        let r = pool.destroy();
        assert_eq!(
            sim.state(),
            Default::default(),
            "{call:?}: left to the driver"
        );
        assert!(r.is_ok(), "{call:?}: nothing was left, yet {r:?}");
        assert_eq!(
            sim.call_count(call),
            2,
            "{call:?}: refused once, retried once"
        );
    }
}
