//! Releases the driver refuses: what a failed creation leaves is no released mapping,
//! a refused synchronous release waits for a release point that synchronizes, and
//! `trim` reports a refused free of the host buffer a wake kept.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use common::{assert_driver_empty, check, no_faults, simulated_pool, MIB};
use flare_package::{CuResult, DriverCall, DriverError, Error, PoolConfig, SleepMode};

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A code no memory call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

/// `Snapshot::mappings_released`: "Mappings fully released", of those counted in
/// `mappings_created` ("create, reserve, map, set access all succeeded"). What a
/// failed creation leaves to the driver (kept pending, released at the next release
/// point) was never a created mapping: its release does not count.
#[test]
fn mappings_released_does_not_count_leftovers_of_a_failed_creation() {
    // (the step that fails, the undo step that fails too)
    let cases = [
        (DriverCall::Map, DriverCall::Release),
        (DriverCall::Map, DriverCall::FreeReservation),
        (DriverCall::SetAccess, DriverCall::Unmap),
        (DriverCall::SetAccess, DriverCall::Release),
        (DriverCall::Reserve, DriverCall::Release),
    ];
    for (step, undo) in cases {
        let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
        // One real mapping, created and released (threshold 0).
        let a = pool.allocate_raw(4 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        let s = check(&pool);
        assert_eq!((s.mappings_created, s.mappings_released), (1, 1));
        // A creation that fails at `step`, whose undo fails at `undo`.
        sim.inject_failure(step, 1, FAIL);
        sim.inject_failure(undo, 1, FAIL);
        let err = pool.allocate_raw(4 * MIB).unwrap_err();
        assert_eq!(
            err.driver_error(),
            Some(DriverError::new(step, FAIL)),
            "{step:?}/{undo:?}"
        );
        let s = check(&pool);
        assert_eq!(
            s.pending_count, 1,
            "{step:?}/{undo:?}: the leftover is kept"
        );
        assert_eq!(
            (s.mappings_created, s.mappings_released),
            (1, 1),
            "{step:?}/{undo:?}"
        );
        // The next release point releases the leftover: not a created mapping. Only
        // a leftover still mapped (its undo's unmap failed) is unmapped there; one
        // that was never mapped (the map or the reservation failed) or was unmapped
        // by the undo needs no unmap: the retry is the undo's remaining steps.
        let unmaps = sim.call_count(DriverCall::Unmap);
        pool.trim().unwrap();
        let still_mapped = undo == DriverCall::Unmap;
        assert_eq!(
            sim.call_count(DriverCall::Unmap) - unmaps,
            u64::from(still_mapped),
            "{step:?}/{undo:?}: unmaps of the leftover's release"
        );
        let s = check(&pool);
        assert_eq!(s.pending_count, 0, "{step:?}/{undo:?}");
        assert_eq!(
            (s.mappings_created, s.mappings_released),
            (1, 1),
            "{step:?}/{undo:?}: the leftover's release is not a mapping released"
        );
        assert_driver_empty(&pool);
        // A real mapping still counts.
        let b = pool.allocate_raw(4 * MIB).unwrap();
        pool.free_raw(b).unwrap();
        let s = check(&pool);
        assert_eq!((s.mappings_created, s.mappings_released), (2, 2));
    }
}

/// `Pool::free_async_raw`: "No host synchronization, ever"; `Pool::free_raw`'s
/// release synchronizes the device. A synchronous free whose release was refused
/// (`cuMemUnmap`) leaves its mapping idle for a retry at the next release point
/// (`release.rs`: "kept idle-for-retry ... and retried at the next release point").
/// Its release needs a device synchronize, so the stream-ordered frees' release
/// points (which release what their fences say is complete) keep it for later,
/// without synchronizing; the next synchronous free's release retries it: two
/// unmaps (its own mapping and the retried one) after one synchronize.
#[test]
fn a_refused_synchronous_release_waits_for_a_synchronizing_release_point() {
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let a = pool.allocate_raw(3 * MIB).unwrap();
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    pool.free_raw(a).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.idle_count, snap.idle_bytes), (1, 2 * G));
    assert_eq!(snap.unmap_failures, 1);

    // Stream-ordered frees, the device completing the stream's work between them:
    // their fences complete, and their release points release that memory.
    let s = common::stream(&sim);
    let syncs = sim.call_count(DriverCall::Synchronize);
    let released = snap.mappings_released;
    let bs: Vec<_> = (0..8)
        .map(|_| pool.allocate_async_raw(5 * MIB, s).unwrap())
        .collect();
    for b in bs {
        pool.free_async_raw(b, s).unwrap();
        assert_eq!(sim.stream_complete(s.0), CuResult::SUCCESS);
    }
    let snap = check(&pool);
    assert!(
        snap.mappings_released > released,
        "a stream-ordered release point ran: {snap:#?}"
    );
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        syncs,
        "no device synchronize for a stream-ordered free"
    );
    // `a`'s 4 MiB mapping is still idle (the streams' mappings are 6 MiB).
    assert_eq!(snap.idle_bytes % (6 * MIB), 2 * G, "{snap:#?}");

    let c = pool.allocate_raw(MIB).unwrap();
    let unmaps = sim.call_count(DriverCall::Unmap);
    pool.free_raw(c).unwrap();
    assert_eq!(sim.call_count(DriverCall::Synchronize), syncs + 1);
    assert_eq!(
        sim.call_count(DriverCall::Unmap),
        unmaps + 2,
        "c's mapping and the retried one"
    );
    let snap = check(&pool);
    assert_eq!(snap.idle_bytes % (6 * MIB), 0, "{snap:#?}");
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// `Pool::trim`: "frees the pinned host buffer an offload's wake kept for the next
/// offload sleep"; "Errors: [`Error::Driver`] with the first step the driver
/// refused". `Snapshot::host_kept_bytes`: the buffer a wake kept, which trim frees.
/// When `cuMemFreeHost` refuses it, trim answers `Error::Driver` for that call with
/// the buffer's size, and the pool no longer counts it (left to the driver).
#[test]
fn trim_reports_a_refused_host_buffer_free() {
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let p = pool.allocate_tagged_raw(3 * MIB, None, 5).unwrap();
    assert_eq!(sim.write(p, &[9; 64]), CuResult::SUCCESS);
    pool.sleep(5, SleepMode::Offload).unwrap();
    let asleep = check(&pool);
    // `Pool::sleep`: one pinned buffer "receives every live allocation's requested
    // bytes".
    assert_eq!(asleep.offloaded_bytes, 3 * MIB);
    pool.wake(5).unwrap();
    assert_eq!(sim.read(p, 64).unwrap(), vec![9; 64]);
    let awake = check(&pool);
    assert_eq!((awake.offloaded_bytes, awake.host_kept_bytes), (0, 3 * MIB));
    pool.free_raw(p).unwrap();

    let frees = sim.call_count(DriverCall::HostFree);
    sim.inject_failure(DriverCall::HostFree, 1, FAIL);
    match pool.trim() {
        Err(Error::Driver { source, bytes }) => {
            assert_eq!(source.call, DriverCall::HostFree);
            assert_eq!(source.code, FAIL);
            assert_eq!(bytes, 3 * MIB, "the kept buffer's size");
        }
        other => panic!("want the host free's error, got {other:?}"),
    }
    assert_eq!(sim.call_count(DriverCall::HostFree), frees + 1);
    let after = check(&pool);
    assert_eq!(after.host_kept_bytes, 0, "the buffer is the driver's now");
    // The device memory was released all the same (the release ran first).
    assert_eq!((after.physical_bytes, after.idle_bytes), (0, 0));
    assert_driver_empty(&pool);
    // Nothing left to free: the next trim succeeds without a host free.
    pool.trim().unwrap();
    assert_eq!(sim.call_count(DriverCall::HostFree), frees + 1);
}
