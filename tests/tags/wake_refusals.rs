//! A wake whose driver steps are refused: what is undone, the handles the driver
//! keeps (the tag's physical memory from then on) and what is left pending.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::sleep_and_wake::keeping_segments;
use common::{assert_driver_empty, check, no_faults, simulated_pool, GIB, MIB};
use flare_package::{CuResult, DriverCall, Error, PoolConfig, ReusePolicy, SleepMode};

/// A wake (whole mappings, best-fit) whose first map is refused, and whose undo's
/// release of the handle it had just created is refused too: the driver keeps that
/// handle, so the pool books it as the sleeping allocation's kept handle
/// (`sleeping_held_count` 1, `sleeping_held_bytes` and `physical_bytes` 2 MiB, as
/// the driver's one handle), the tag asleep; the next wake maps it and restores the
/// bytes.
#[test]
fn a_wake_whose_undo_release_is_refused_keeps_the_handle() {
    let (pool, sim) = simulated_pool(GIB, PoolConfig::default().with_policy(ReusePolicy::BestFit));
    let p = pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap();
    assert_eq!(sim.write(p, &[7; 4096]), CuResult::SUCCESS);
    pool.sleep(1, SleepMode::Offload).unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    sim.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    assert!(pool.wake(1).is_err());
    sim.clear_failures();
    assert!(pool.tag_census(1).sleeping);
    let s = check(&pool);
    assert_eq!(
        (
            s.sleeping_count,
            s.sleeping_held_count,
            s.sleeping_held_bytes
        ),
        (1, 1, 2 * MIB)
    );
    assert_eq!((s.sleeping_bytes, s.physical_bytes), (0, 2 * MIB));
    assert_eq!(sim.state().handles, 1);
    let creates = sim.call_count(DriverCall::Create);
    pool.wake(1).unwrap();
    assert_eq!(
        sim.call_count(DriverCall::Create),
        creates,
        "the kept handle"
    );
    assert_eq!(sim.read(p, 4096).unwrap(), vec![7; 4096]);
    pool.free_raw(p).unwrap();
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}

/// Three whole mappings of a tag (best-fit, 2 MiB each, in address order), asleep.
/// A wake whose step on the second one is refused (its bytes' copy back in offload
/// mode, its `cuMemSetAccess` in discard mode) and whose undo of that mapping (the
/// unmap) is refused too: "a mapping whose undo the driver refuses stays mapped
/// (awake, counted), and the next wake skips it"; the mapping that must stay gets
/// access again, and its bytes copied back (`grant_again`), so it holds its
/// contents in offload mode. The first one is undone (no access, its new handle
/// released), the third never touched. The wake fails, the tag asleep with two
/// allocations, its host copy kept; the next wake maps only those two.
#[test]
fn a_wake_whose_undo_unmap_is_refused_keeps_that_mapping_awake() {
    for mode in [SleepMode::Offload, SleepMode::Discard] {
        let (pool, sim) =
            simulated_pool(GIB, PoolConfig::default().with_policy(ReusePolicy::BestFit));
        let mut ptrs: Vec<_> = (0..3)
            .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap())
            .collect();
        ptrs.sort_unstable();
        for (i, &p) in ptrs.iter().enumerate() {
            assert_eq!(sim.write(p, &[i as u8 + 1; 4096]), CuResult::SUCCESS);
        }
        pool.sleep(1, mode).unwrap();
        let step = match mode {
            SleepMode::Offload => DriverCall::MemcpyHtoD,
            SleepMode::Discard => DriverCall::SetAccess,
        };
        sim.inject_failure(step, 2, CuResult::UNKNOWN);
        sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
        let (steps, creates, releases) = (
            sim.call_count(step),
            sim.call_count(DriverCall::Create),
            sim.call_count(DriverCall::Release),
        );
        match pool.wake(1) {
            Err(Error::Driver { source, .. }) => assert_eq!(source.call, step, "{mode:?}"),
            other => panic!("{mode:?}: {other:?}"),
        }
        assert_eq!(sim.pending_failures(), 0, "{mode:?}");
        // The first two, the second refused and done again.
        assert_eq!(sim.call_count(step) - steps, 3, "{mode:?}");
        assert_eq!(sim.call_count(DriverCall::Create) - creates, 2, "{mode:?}");
        assert_eq!(
            sim.call_count(DriverCall::Release) - releases,
            1,
            "{mode:?}"
        );
        assert!(pool.tag_census(1).sleeping, "{mode:?}");
        let snap = check(&pool);
        assert_eq!(
            (snap.sleeping_count, snap.sleeping_bytes),
            (2, 4 * MIB),
            "{mode:?}"
        );
        assert_eq!(
            (snap.live_mapped_bytes, snap.physical_bytes),
            (2 * MIB, 2 * MIB),
            "{mode:?}"
        );
        assert_eq!(pool.tag_census(1).physical_bytes, 2 * MIB, "{mode:?}");
        assert_eq!(snap.unmap_failures, 1, "{mode:?}");
        assert_eq!(sim.access_of(ptrs[0]), Vec::<i32>::new(), "{mode:?}");
        assert_eq!(sim.access_of(ptrs[1]), vec![0], "{mode:?}");
        let offload = mode == SleepMode::Offload;
        assert_eq!(sim.host_bytes(), if offload { 6 * MIB } else { 0 });
        if offload {
            assert_eq!(sim.read(ptrs[1], 4096).unwrap(), vec![2; 4096]);
        }
        let creates = sim.call_count(DriverCall::Create);
        pool.wake(1).unwrap();
        assert_eq!(sim.call_count(DriverCall::Create) - creates, 2, "{mode:?}");
        let snap = check(&pool);
        assert_eq!((snap.sleeping_count, snap.physical_bytes), (0, 6 * MIB));
        if offload {
            for (i, &p) in ptrs.iter().enumerate() {
                assert_eq!(sim.read(p, 4096).unwrap(), vec![i as u8 + 1; 4096]);
            }
        }
        for p in ptrs {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{mode:?}");
    }
}

/// A sleep whose release of the first whole mapping's handle is refused succeeds,
/// keeping that handle ("mapped again at wake": `sleeping_held_count` 1). A wake
/// whose `cuMemMap` of that kept handle is refused undoes nothing else and
/// releases nothing (the handle is the sleeping allocation's, not one this wake
/// created): the tag asleep, the handle still held and booked. The next wake maps
/// it again and creates handles for the other two only.
#[test]
fn a_wake_whose_map_of_a_kept_handle_is_refused() {
    let (pool, sim) = simulated_pool(GIB, PoolConfig::default().with_policy(ReusePolicy::BestFit));
    let mut ptrs: Vec<_> = (0..3)
        .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap())
        .collect();
    ptrs.sort_unstable();
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.write(p, &[i as u8 + 1; 4096]), CuResult::SUCCESS);
    }
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    pool.sleep(1, SleepMode::Offload).unwrap();
    assert_eq!(check(&pool).sleeping_held_count, 1);
    sim.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    let (creates, releases) = (
        sim.call_count(DriverCall::Create),
        sim.call_count(DriverCall::Release),
    );
    match pool.wake(1) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Map),
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.call_count(DriverCall::Create), creates);
    assert_eq!(sim.call_count(DriverCall::Release), releases);
    assert!(pool.tag_census(1).sleeping);
    let snap = check(&pool);
    assert_eq!(
        (
            snap.sleeping_count,
            snap.sleeping_held_count,
            snap.sleeping_held_bytes
        ),
        (3, 1, 2 * MIB)
    );
    assert_eq!((snap.physical_bytes, snap.map_failures), (2 * MIB, 1));
    assert_eq!(sim.state().handles, 1);
    pool.wake(1).unwrap();
    assert_eq!(sim.call_count(DriverCall::Create) - creates, 2);
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.read(p, 4096).unwrap(), vec![i as u8 + 1; 4096]);
    }
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}

/// The same three whole mappings, the first one's handle kept at sleep. A wake
/// whose third `cuMemCreate` is refused (the third mapping's: the first reuses its
/// kept handle) undoes the first two, latest first: the second's new handle, whose
/// release is refused, "the driver keeps it" and it becomes that sleeping
/// allocation's kept handle; the first's kept handle is unmapped, not released
/// (the wake did not create it). The tag asleep with two kept handles
/// (`sleeping_held_count` 2, 4 MiB, counted in its census's physical bytes) and
/// one released (`sleeping_bytes` 2 MiB). The next wake creates one handle.
#[test]
fn a_wake_undone_keeps_the_handles_the_driver_keeps() {
    let (pool, sim) = simulated_pool(GIB, PoolConfig::default().with_policy(ReusePolicy::BestFit));
    let mut ptrs: Vec<_> = (0..3)
        .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap())
        .collect();
    ptrs.sort_unstable();
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.write(p, &[i as u8 + 1; 4096]), CuResult::SUCCESS);
    }
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    pool.sleep(1, SleepMode::Offload).unwrap();
    sim.inject_failure(DriverCall::Create, 2, CuResult::UNKNOWN);
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    let (releases, unmaps) = (
        sim.call_count(DriverCall::Release),
        sim.call_count(DriverCall::Unmap),
    );
    match pool.wake(1) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Create),
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.pending_failures(), 0);
    assert_eq!(sim.call_count(DriverCall::Unmap) - unmaps, 2);
    assert_eq!(sim.call_count(DriverCall::Release) - releases, 1);
    let c = pool.tag_census(1);
    assert!(c.sleeping);
    assert_eq!(c.physical_bytes, 4 * MIB);
    let snap = check(&pool);
    assert_eq!(
        (
            snap.sleeping_count,
            snap.sleeping_held_count,
            snap.sleeping_held_bytes,
            snap.sleeping_bytes
        ),
        (3, 2, 4 * MIB, 2 * MIB)
    );
    assert_eq!((snap.physical_bytes, snap.live_mapped_bytes), (4 * MIB, 0));
    assert_eq!((snap.create_failures, snap.release_failures), (1, 2));
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (2, 0), "{d:?}");
    let creates = sim.call_count(DriverCall::Create);
    pool.wake(1).unwrap();
    assert_eq!(sim.call_count(DriverCall::Create) - creates, 1);
    let snap = check(&pool);
    assert_eq!(
        (snap.sleeping_held_count, snap.physical_bytes),
        (0, 6 * MIB)
    );
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.read(p, 4096).unwrap(), vec![i as u8 + 1; 4096]);
    }
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}

/// A tag's heap of three 2 MiB handles (segment mode), asleep. A wake whose second
/// `cuMemCreate` is refused undoes the first handle it mapped: unmapped, and its
/// release refused, so "what the driver refuses to undo is left pending" (the
/// pool's, in no tag: `pending_bytes` 2 MiB, the tag's census 0). The tag asleep;
/// the next wake releases the pending handle first, then maps three new ones and
/// restores the bytes.
#[test]
fn a_segment_wake_whose_undo_release_is_refused_leaves_it_pending() {
    let (pool, sim) = keeping_segments(GIB);
    let ptrs: Vec<_> = (0..3)
        .map(|_| pool.allocate_tagged_raw(2 * MIB, None, 1).unwrap())
        .collect();
    assert_eq!(check(&pool).segment_handles, 3);
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.write(p, &[i as u8 + 1; 4096]), CuResult::SUCCESS);
    }
    pool.sleep(1, SleepMode::Offload).unwrap();
    sim.inject_failure(DriverCall::Create, 2, CuResult::UNKNOWN);
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    match pool.wake(1) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Create),
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.pending_failures(), 0);
    let c = pool.tag_census(1);
    assert!(c.sleeping);
    assert_eq!(c.physical_bytes, 0);
    let snap = check(&pool);
    assert_eq!((snap.pending_count, snap.pending_bytes), (1, 2 * MIB));
    assert_eq!((snap.physical_bytes, snap.segment_handles), (2 * MIB, 0));
    assert_eq!((snap.create_failures, snap.release_failures), (1, 1));
    let d = sim.state();
    assert_eq!((d.handles, d.mappings), (1, 0), "{d:?}");
    pool.wake(1).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.pending_count, snap.segment_handles), (0, 3));
    assert_eq!(snap.physical_bytes, 6 * MIB);
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(sim.read(p, 4096).unwrap(), vec![i as u8 + 1; 4096]);
    }
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}

/// A wake whose mapping step fails undoes the piece: the handle it created is
/// released, and where the driver refuses that too it keeps the handle, which the
/// books take as the sleeping allocation's held handle. It is the tag's physical
/// memory from then on (`TagCensus::physical_bytes`, 2 MiB, as in the pool's
/// `physical_bytes` and `sleeping_held_bytes`), and the next wake maps it (no new
/// handle) and succeeds.
#[test]
fn a_handle_kept_by_a_failed_wake_is_the_tags_physical_memory() {
    let (pool, sim) = simulated_pool(GIB, PoolConfig::default());
    let p = pool.allocate_tagged_raw(2 * MIB, None, 7).unwrap();
    pool.sleep(7, SleepMode::Discard).unwrap();
    assert_eq!(pool.tag_census(7).physical_bytes, 0);
    sim.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    match pool.wake(7) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Map),
        other => panic!("{other:?}"),
    }
    let s = check(&pool);
    assert_eq!(
        (s.physical_bytes, s.sleeping_held_bytes),
        (2 * MIB, 2 * MIB)
    );
    let c = pool.tag_census(7);
    assert!(c.sleeping);
    assert_eq!(c.physical_bytes, 2 * MIB, "the kept handle is the tag's");
    let creates = sim.call_count(DriverCall::Create);
    pool.wake(7).unwrap();
    assert_eq!(
        sim.call_count(DriverCall::Create),
        creates,
        "the kept handle is mapped"
    );
    assert_eq!(pool.tag_census(7).physical_bytes, 2 * MIB);
    pool.free_raw(p).unwrap();
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    assert_driver_empty(&pool);
}

/// `Pool::wake`: "Errors: `Error::TagState` when the tag does not sleep", and the
/// pending retry it makes first is part of a wake: a wake refused so releases
/// nothing. With a release refused part-way (the handle's `cuMemRelease`: the
/// mapping pending, 2 MiB), a wake of a tag that is awake (one live allocation) or
/// unknown is refused and the pending mapping stays pending, with no driver call;
/// the next release point (a trim) releases it.
#[test]
fn a_refused_wake_leaves_what_is_pending() {
    let (pool, sim) = simulated_pool(GIB, PoolConfig::default());
    let kept = pool.allocate_tagged_raw(2 * MIB, None, 7).unwrap();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    let _ = pool.free_raw(p);
    let s = check(&pool);
    assert_eq!((s.pending_count, s.pending_bytes), (1, 2 * MIB));
    let releases = sim.call_count(DriverCall::Release);
    for tag in [7, 8] {
        assert!(
            matches!(pool.wake(tag), Err(Error::TagState { .. })),
            "tag {tag}"
        );
        assert_eq!(check(&pool).pending_count, 1, "tag {tag}");
    }
    assert_eq!(sim.call_count(DriverCall::Release), releases);
    pool.trim().unwrap();
    assert_eq!(check(&pool).pending_count, 0);
    pool.free_raw(kept).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}
