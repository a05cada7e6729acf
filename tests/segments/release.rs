//! Releasing segment handles: a wholly free handle is released (and the release
//! returns), a synchronize covers what was freed before it, a trim walks a heap's
//! free handles (of every segment) to the end, and destroy retries a refused step
//! once and keeps the reservation of a handle left mapped.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::pools::{seg_pool, seg_pool_on_device};
use common::{assert_driver_empty, check, no_faults, simulated_pool, MIB};
use flare_package::driver::sim::CU_STREAM_NON_BLOCKING;
use flare_package::{CuResult, DriverCall, Error, PoolConfig, ReusePolicy, SimConfig, Stream};
use std::sync::Arc;

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A code no memory call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

/// A release of a segment handle completes (`Pool::free_raw` outside a scope with
/// threshold 0 releases a handle whose whole range is free, `docs/ARCHITECTURE.md`,
/// "Release"): a watchdog (10 s) fails the test where the release never returns.
#[test]
fn releasing_a_segment_handle_returns() {
    use std::sync::mpsc;
    use std::time::Duration;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (pool, _sim) = seg_pool(0);
        let a = pool.allocate_raw(G).unwrap();
        let b = pool.allocate_raw(G).unwrap();
        pool.free_raw(b).unwrap();
        pool.free_raw(a).unwrap();
        let s = check(&pool);
        assert_driver_empty(&pool);
        let _ = tx.send((s.segment_handles, s.physical_bytes));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the releases return");
    assert_eq!(got, (0, 0), "both handles released");
}

/// A synchronous free in segment mode over the threshold (0: nothing kept) returns,
/// and releases its heap's handle left wholly free: the freed block goes back to its
/// heap, only a stream heap's block (kept whole) takes the release path of a block.
/// Watched from another thread for 10 s, so a hang fails here.
#[test]
fn a_segment_free_over_the_threshold_returns_and_releases_the_free_handle() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: 0,
            ..PoolConfig::default()
        },
    );
    let pool = Arc::new(pool);
    for bytes in [MIB, 3 * MIB, 8 * MIB] {
        let p = pool.allocate_raw(bytes).unwrap();
        assert!(check(&pool).physical_bytes >= bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        let freer = Arc::clone(&pool);
        std::thread::spawn(move || {
            let _ = tx.send(freer.free_raw(p));
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the free did not return within 10 s")
            .unwrap();
        let s = check(&pool);
        assert_eq!((s.physical_bytes, s.pending_count), (0, 0), "{bytes}");
        assert_eq!(sim.state().physical_bytes, 0, "{bytes}");
    }
    assert_driver_empty(&pool);
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
    let (pool, sim) = seg_pool_on_device(140 << 30, 0);
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

/// A device synchronize covers every free made before it: a segment's handle freed
/// before a synchronize (made to release a whole mapping) is released later with
/// no synchronize of its own (the books keep the ticket of the last synchronize
/// made and each segment's last free's: release.rs, segments.rs). Threshold 2 MiB: the freed handle (2 MiB of free blocks) is kept; the
/// whole mapping freed after it goes over the threshold and is released, after one
/// synchronize; the trim then releases the handle with none.
#[test]
fn a_synchronize_covers_a_segment_freed_before_it() {
    let (pool, sim) = simulated_pool(
        SimConfig::default().capacity_bytes,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: G,
            segment_whole_threshold_bytes: G,
            ..PoolConfig::default()
        },
    );
    let b = pool.allocate_raw(4096).unwrap();
    let w = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_mapped_bytes, s.live_mapped_bytes), (G, 4 * MIB));
    pool.free_raw(b).unwrap();
    assert_eq!(
        check(&pool).block_free_bytes,
        G,
        "kept: 2 MiB, at the threshold"
    );
    assert_eq!(sim.call_count(DriverCall::Synchronize), 0);
    pool.free_raw(w).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.idle_bytes, s.physical_bytes),
        (0, G),
        "the whole mapping released"
    );
    assert_eq!(sim.call_count(DriverCall::Synchronize), 1);
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        1,
        "the handle's free came before that synchronize"
    );
    assert_driver_empty(&pool);
}

/// A segment-mode trim ends: its walk over a segment's wholly free handles moves past
/// each handle it takes out (a walk that revisited one would never end). The trim
/// runs on another thread, watched for 10 s, so a hang fails here (the trim of four
/// small free handles takes microseconds) instead of stopping the whole run.
#[test]
fn a_segment_trim_of_free_handles_ends() {
    let (pool, _sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default()
        },
    );
    let ptrs: Vec<_> = [MIB, 3 * MIB, 8 * MIB, 20 * MIB]
        .iter()
        .map(|&n| pool.allocate_raw(n).unwrap())
        .collect();
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    assert!(
        check(&pool).physical_bytes > 0,
        "the threshold keeps the frees"
    );
    let pool = Arc::new(pool);
    let (tx, rx) = std::sync::mpsc::channel();
    let trimmer = Arc::clone(&pool);
    std::thread::spawn(move || {
        let _ = tx.send(trimmer.trim());
    });
    let trimmed = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the trim did not end within 10 s");
    trimmed.unwrap();
    // Every handle was wholly free: all of them are released.
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.pending_count), (0, 0));
    assert_driver_empty(&pool);
}

/// `docs/ARCHITECTURE.md`, "Segments": a segment reserves the device's total (so a
/// heap's growth never runs out of address range while the device has memory),
/// and "a heap has more than one segment when ... one ran out of room"
/// (`collect_heap_of`). On an 8 MiB device: four 2 MiB blocks fill the first
/// segment; the first block's handle released by trim leaves a hole below the live
/// top block, so the growing end stays at the top and the next 2 MiB growth
/// reserves a second segment. Trim then releases the wholly free handles of both
/// segments, each from its own segment, and keeps both reservations (they stay for
/// regrowth until destroy).
#[test]
fn a_heap_of_two_segments_releases_the_free_handles_of_both() {
    let (pool, sim) = simulated_pool(
        8 * MIB,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let w: Vec<_> = (0..4).map(|_| pool.allocate_raw(G).unwrap()).collect();
    assert_eq!(check(&pool).segment_count, 1);
    pool.free_raw(w[0]).unwrap();
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (3, 6 * MIB));
    let e = pool.allocate_raw(G).unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_count, s.segment_handles), (2, 4));
    assert_eq!(sim.state().reservations, 2);
    assert!(e < w[0] || e >= w[3] + G, "outside the first segment");
    // One free handle in each segment.
    pool.free_raw(w[1]).unwrap();
    pool.free_raw(e).unwrap();
    let unmaps = sim.call_count(DriverCall::Unmap);
    pool.trim().unwrap();
    assert_eq!(sim.call_count(DriverCall::Unmap), unmaps + 2);
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (2, 4 * MIB));
    assert_eq!((s.segment_count, s.block_free_bytes), (2, 0));
    pool.free_raw(w[2]).unwrap();
    pool.free_raw(w[3]).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
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
        let (pool, sim) = seg_pool_on_device(140 << 30, 0);
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

/// `Pool::destroy` with a segment handle the driver will not unmap (refused, and
/// again at the retry): the error names the unmap, and that handle's memory is left
/// to the driver, its segment's reservation with it ("a reservation is never freed
/// while a mapping in it is live"); the rest is released.
#[test]
fn destroy_keeps_the_reservation_of_a_segment_left_mapped() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            ..PoolConfig::default()
        },
    );
    let _p = pool.allocate_raw(4096).unwrap();
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    sim.inject_failure(DriverCall::Unmap, 2, FAIL);
    match pool.destroy() {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Unmap),
        other => panic!("{other:?}"),
    }
    let d = sim.state();
    assert_eq!((d.handles, d.mappings, d.reservations), (1, 1, 1), "{d:?}");
    // Not even tried: the segment's is the only reservation.
    assert_eq!(sim.call_count(DriverCall::FreeReservation), 0);
    assert!(sim.faults().is_empty(), "{:?}", sim.faults());
}
