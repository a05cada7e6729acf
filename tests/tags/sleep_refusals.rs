//! A sleep whose driver steps are refused: what is undone, what is mapped back (with
//! access granted again) and what is left pending.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::sleep_and_wake::keeping_segments;
use common::{check, no_faults, simulated_pool, GIB, MIB};
use flare_package::driver::sim::SimDriver;
use flare_package::{
    CuResult, DevicePtr, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SleepMode,
};

/// Tag 3's heap of [`a_sleep_releases_lent_handles`]: four 2 MiB blocks `w` and a
/// 4 MiB `n1`, then `w[0]` and `w[2]` freed on a stream with no queued work (back
/// in the heap once their fence completes), and a 4 MiB `n2` whose growth lends
/// those two lone handles to the heap's end. Returns `(w, n1, n2)`.
fn lent_tag_heap(pool: &Pool, sim: &SimDriver) -> (Vec<DevicePtr>, DevicePtr, DevicePtr) {
    let s = common::stream(sim);
    let w: Vec<_> = (0..4)
        .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 3).unwrap())
        .collect();
    let n1 = pool.allocate_tagged_raw(4 * MIB, None, 3).unwrap();
    pool.free_async_raw(w[0], s).unwrap();
    pool.free_async_raw(w[2], s).unwrap();
    let n2 = pool.allocate_tagged_raw(4 * MIB, None, 3).unwrap();
    (w, n1, n2)
}

/// The heap of [`a_sleep_releases_lent_handles`] (handles in address order: w1, w3,
/// n1, then the two lent ones at the heap's end). The sleep unmaps each handle, a
/// lent one's retired mapping first; the first lent handle's own unmap is refused
/// (the fifth unmap) after its retired mapping is gone, and mapping n1 back is
/// refused too: the sleep goes on ("the undo was refused as well"), the error
/// returned and the tag asleep. The refused unmap is tried again, of the handle's
/// own mapping only (the retired one is gone: unmapping it again would be a wasted
/// call), and succeeds: 8 unmaps in all (the 7 mappings once each, the refused one
/// twice); every handle is released, none pending, nothing mapped, and the wake
/// restores the bytes.
#[test]
fn a_sleep_whose_lent_handle_unmap_and_undo_fail() {
    let (pool, sim) = keeping_segments(GIB);
    let (w, n1, n2) = lent_tag_heap(&pool, &sim);
    let snap = check(&pool);
    assert_eq!((snap.segment_handles, snap.segment_handles_lent), (5, 2));
    assert_eq!(sim.write(n2, &[9; 4096]), CuResult::SUCCESS);
    sim.inject_failure(DriverCall::Unmap, 5, CuResult::UNKNOWN);
    sim.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    let unmaps = sim.call_count(DriverCall::Unmap);
    match pool.sleep(3, SleepMode::Offload) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Unmap),
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.call_count(DriverCall::Unmap) - unmaps, 8);
    sim.clear_failures();
    assert!(pool.tag_census(3).sleeping);
    let snap = check(&pool);
    assert_eq!((snap.pending_count, snap.physical_bytes), (0, 0));
    assert_eq!((snap.segment_handles, snap.segment_handles_lent), (0, 0));
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (0, 0), "{d:?}");
    pool.wake(3).unwrap();
    assert_eq!(sim.read(n2, 4096).unwrap(), vec![9; 4096]);
    for p in [w[1], w[3], n1, n2] {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}

/// The heap of [`a_sleep_releases_lent_handles`] (handles in address order: w1, w3,
/// n1, then the two lent ones, L1 and L2, at the heap's end; unmaps in that order,
/// a lent handle's retired mapping before its own). One unmap refused, every
/// undo mapped back: the sleep fails, the tag awake and usable ("a failed unmap
/// maps what was already unmapped back ... the tag awake"). A lent handle whose
/// retired mapping the sleep already unmapped is no longer lent (that mapping is
/// gone, and is not mapped again): refused at L1's own unmap (the fifth), L1 is
/// no longer lent and L2 still is; at L2's retired mapping (the sixth), L1 no
/// longer is and L2 still is; at L2's own unmap (the seventh), neither is. The
/// handles stay mapped (5), the bytes are kept, and the books match the driver's
/// mappings (`check`).
#[test]
fn a_sleep_undone_after_unmapping_a_retired_mapping() {
    for (nth, lent) in [(5u32, 1u64), (6, 1), (7, 0)] {
        let (pool, sim) = keeping_segments(GIB);
        let (w, n1, n2) = lent_tag_heap(&pool, &sim);
        assert_eq!(check(&pool).segment_handles_lent, 2);
        assert_eq!(sim.write(n2, &[9; 4096]), CuResult::SUCCESS);
        assert_eq!(sim.write(n2 + 2 * MIB, &[8; 4096]), CuResult::SUCCESS);
        sim.inject_failure(DriverCall::Unmap, nth, CuResult::UNKNOWN);
        let maps = sim.call_count(DriverCall::Map);
        match pool.sleep(3, SleepMode::Offload) {
            Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Unmap),
            other => panic!("{nth}: {other:?}"),
        }
        assert_eq!(sim.pending_failures(), 0, "{nth}");
        // Every handle unmapped before the refused one is mapped back.
        let unmapped_before = if nth == 5 { 3 } else { 4 };
        assert_eq!(
            sim.call_count(DriverCall::Map) - maps,
            unmapped_before,
            "{nth}"
        );
        assert!(!pool.tag_census(3).sleeping, "{nth}");
        assert_eq!(sim.host_bytes(), 0, "{nth}: the host buffer is freed");
        let snap = check(&pool);
        assert_eq!(
            (
                snap.segment_handles,
                snap.segment_handles_lent,
                snap.segment_lent_bytes
            ),
            (5, lent, lent * 2 * MIB),
            "{nth}"
        );
        assert_eq!(snap.unmap_failures, 1, "{nth}");
        assert_eq!(sim.state().mappings, 5 + lent, "{nth}");
        assert_eq!(sim.read(n2, 4096).unwrap(), vec![9; 4096], "{nth}");
        pool.sleep(3, SleepMode::Offload).unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{nth}");
        pool.wake(3).unwrap();
        assert_eq!(sim.read(n2, 4096).unwrap(), vec![9; 4096], "{nth}");
        assert_eq!(sim.read(n2 + 2 * MIB, 4096).unwrap(), vec![8; 4096]);
        for p in [w[1], w[3], n1, n2] {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{nth}");
        let d = sim.state();
        assert_eq!((d.handles, d.mappings), (0, 0), "{nth}: {d:?}");
        no_faults(&sim);
    }
}

/// The same heap. w3's unmap (the second) is refused, and mapping w1 back too: "the
/// undo was refused as well: the segments go to sleep after all". Unmapping again
/// w3 and what comes after it, w3's own unmap is refused again and L1's retired
/// mapping's unmap is refused: each such handle "is left pending, still mapped
/// (released at the next release point or wake)", not released by the sleep (3
/// releases: w1, n1, L2). The sleep returns the first error, the tag asleep with
/// no physical bytes of its own; the two pending handles (4 MiB) are the pool's,
/// held by the driver with their three mappings (w3's, L1's and L1's retired
/// one). The wake releases them first, then maps 5 new handles and restores the
/// bytes; once all is freed and trimmed the driver holds nothing.
#[test]
fn a_sleep_whose_second_unmaps_are_refused_leaves_handles_pending() {
    let (pool, sim) = keeping_segments(GIB);
    let (w, n1, n2) = lent_tag_heap(&pool, &sim);
    assert_eq!(check(&pool).segment_handles_lent, 2);
    assert_eq!(sim.write(w[1], &[1; 4096]), CuResult::SUCCESS);
    assert_eq!(sim.write(n1, &[2; 4096]), CuResult::SUCCESS);
    assert_eq!(sim.write(n2, &[9; 4096]), CuResult::SUCCESS);
    for nth in [2, 3, 5] {
        sim.inject_failure(DriverCall::Unmap, nth, CuResult::UNKNOWN);
    }
    sim.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    let (unmaps, releases) = (
        sim.call_count(DriverCall::Unmap),
        sim.call_count(DriverCall::Release),
    );
    match pool.sleep(3, SleepMode::Offload) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Unmap),
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.pending_failures(), 0);
    assert_eq!(sim.call_count(DriverCall::Unmap) - unmaps, 7);
    assert_eq!(sim.call_count(DriverCall::Release) - releases, 3);
    let c = pool.tag_census(3);
    assert!(c.sleeping);
    assert_eq!(c.physical_bytes, 0);
    // Not `check`: its bound counts at most one mapping per pending leftover, and
    // L1's holds two (its own and its retired one).
    let snap = pool.snapshot();
    snap.check_invariants().unwrap();
    assert_eq!(snap.physical_bytes, sim.state().physical_bytes);
    assert_eq!((snap.pending_count, snap.pending_bytes), (2, 4 * MIB));
    assert_eq!(snap.physical_bytes, 4 * MIB);
    assert_eq!((snap.segment_handles, snap.segment_handles_lent), (0, 0));
    assert_eq!((snap.unmap_failures, snap.map_failures), (3, 1));
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (2, 3), "{d:?}");
    pool.wake(3).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.pending_count, snap.segment_handles), (0, 5));
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (5, 5), "{d:?}");
    assert_eq!(sim.read(w[1], 4096).unwrap(), vec![1; 4096]);
    assert_eq!(sim.read(n1, 4096).unwrap(), vec![2; 4096]);
    assert_eq!(sim.read(n2, 4096).unwrap(), vec![9; 4096]);
    for p in [w[1], w[3], n1, n2] {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (0, 0), "{d:?}");
    no_faults(&sim);
}

/// Two whole mappings of a tag (best-fit), p0 below p1. The sleep's unmap of p1 is
/// refused, so p0 is mapped back; its `cuMemSetAccess` is refused and so is the
/// unmap that would undo that map: the mapping must stay, and access is granted
/// again, "twice at most" (`map_back`, `grant_again`); it is booked awake either
/// way. Granted at the first retry: p0 has the device's access (2 set-access
/// calls); at the second: 3 calls; never: 3 calls and no access. The sleep fails,
/// the tag awake, its bytes kept; the next sleep and wake work (and grant access).
#[test]
fn a_sleep_whose_map_back_must_stay_grants_access_again() {
    for refused in 1..=3u32 {
        let (pool, sim) =
            simulated_pool(GIB, PoolConfig::default().with_policy(ReusePolicy::BestFit));
        let mut ptrs: Vec<_> = (0..2)
            .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap())
            .collect();
        ptrs.sort_unstable();
        let (p0, p1) = (ptrs[0], ptrs[1]);
        assert_eq!(sim.write(p0, &[3; 4096]), CuResult::SUCCESS);
        assert_eq!(sim.write(p1, &[4; 4096]), CuResult::SUCCESS);
        sim.inject_failure(DriverCall::Unmap, 2, CuResult::UNKNOWN);
        sim.inject_failure(DriverCall::Unmap, 3, CuResult::UNKNOWN);
        for nth in 1..=refused {
            sim.inject_failure(DriverCall::SetAccess, nth, CuResult::UNKNOWN);
        }
        let access = sim.call_count(DriverCall::SetAccess);
        match pool.sleep(1, SleepMode::Discard) {
            Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Unmap),
            other => panic!("{refused}: {other:?}"),
        }
        assert_eq!(sim.pending_failures(), 0, "{refused}");
        let calls = if refused == 1 { 2 } else { 3 };
        assert_eq!(
            sim.call_count(DriverCall::SetAccess) - access,
            calls,
            "{refused}"
        );
        let granted = if refused == 3 { vec![] } else { vec![0] };
        assert_eq!(sim.access_of(p0), granted, "{refused}");
        assert_eq!(sim.access_of(p1), vec![0], "{refused}");
        assert!(!pool.tag_census(1).sleeping, "{refused}");
        let snap = check(&pool);
        assert_eq!(
            (snap.unmap_failures, snap.access_failures),
            (2, u64::from(refused)),
            "{refused}"
        );
        assert_eq!(
            (
                snap.live_mapped_bytes,
                snap.physical_bytes,
                snap.sleeping_count
            ),
            (4 * MIB, 4 * MIB, 0),
            "{refused}"
        );
        // A kernel reads only what is mapped with access (the simulated `read`).
        if refused < 3 {
            assert_eq!(sim.read(p0, 4096).unwrap(), vec![3; 4096], "{refused}");
        } else {
            assert_eq!(sim.read(p0, 4096), Err(CuResult::INVALID_VALUE));
        }
        assert_eq!(sim.read(p1, 4096).unwrap(), vec![4; 4096], "{refused}");
        pool.sleep(1, SleepMode::Discard).unwrap();
        pool.wake(1).unwrap();
        assert_eq!(sim.access_of(p0), vec![0], "{refused}");
        for p in ptrs {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{refused}");
    }
}
