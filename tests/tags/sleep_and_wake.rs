//! Tags (issue 15) on the simulated driver: the census, sleep and wake in both modes,
//! the errors, the interplay with scopes, captures, thread caches and segments, and
//! every driver call of sleep and wake failing.
//!
//! Here: sleep and wake in both modes, with whole mappings; and the pools and data
//! patterns the tag tests share. The census, tagged requests, scopes and captures,
//! segments and a tag's heaps, a sleep against calls in flight, the failing driver
//! calls and the refused steps of a sleep and of a wake have modules of their own.

use crate::common;

use common::{check, check_with_devices, no_faults, simulated_pool, GIB, MIB};
use flare_package::driver::sim::SimDriver;
use flare_package::{
    CuResult, DevicePtr, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SleepMode,
};
use std::sync::Arc;

/// A pattern that differs per allocation and per byte.
/// Byte `i` is `(31 seed + 7 i) mod 251`: a sequence of period 251 (prime), built
/// from one period (per-byte arithmetic over the 64 MiB buffers cost seconds).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let period: Vec<u8> = (0..251u64)
        .map(|i| ((seed % 251 * 31 + i * 7) % 251) as u8)
        .collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let n = (len - out.len()).min(period.len());
        out.extend_from_slice(&period[..n]);
    }
    out
}

pub(crate) fn fill(sim: &SimDriver, ptr: DevicePtr, seed: u64, len: usize) {
    assert_eq!(sim.write(ptr, &pattern(seed, len)), CuResult::SUCCESS);
}

#[track_caller]
pub(crate) fn same(sim: &SimDriver, ptr: DevicePtr, seed: u64, len: usize) {
    let got = sim.read(ptr, len as u64).expect("mapped with access");
    assert!(got == pattern(seed, len), "contents of {ptr:#x} changed");
}

pub(crate) fn pool_with(policy: ReusePolicy, capacity: u64) -> (Pool, std::sync::Arc<SimDriver>) {
    simulated_pool(capacity, PoolConfig::default().with_policy(policy))
}

/// [`pool_with`] keeping what is freed (release threshold `u64::MAX`): idle memory
/// stays until trim.
pub(crate) fn keeping_pool(
    policy: ReusePolicy,
    capacity: u64,
) -> (Pool, std::sync::Arc<SimDriver>) {
    simulated_pool(
        capacity,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default().with_policy(policy)
        },
    )
}

/// Offload: the sleeping tag's physical bytes go back to the device, its pointers
/// keep their addresses and, after wake, their bytes; the other tag never changes.
#[test]
fn offload_sleep_and_wake_keep_addresses_and_bytes() {
    for policy in [
        ReusePolicy::Exact,
        ReusePolicy::BestFit,
        ReusePolicy::Segments,
    ] {
        let (pool, sim) = keeping_pool(policy, 16 * GIB);
        let sizes = [MIB, 2 * MIB, 5 * MIB + 3, 64 * MIB];
        let t1: Vec<_> = sizes
            .iter()
            .map(|&n| pool.allocate_tagged_raw(n, None, 1).unwrap())
            .collect();
        let mut t2: Vec<_> = sizes
            .iter()
            .map(|&n| pool.allocate_tagged_raw(n, None, 2).unwrap())
            .collect();
        for (i, (&p, &n)) in t1.iter().zip(&sizes).enumerate() {
            fill(&sim, p, i as u64, n as usize);
            fill(&sim, t2[i], 100 + i as u64, n as usize);
        }
        // An idle mapping of tag 1 too.
        let spare = pool.allocate_tagged_raw(4 * MIB, None, 1).unwrap();
        pool.free_raw(spare).unwrap();
        let before = pool.snapshot().physical_bytes;
        let held = pool.tag_census(1).physical_bytes;
        let segments = policy == ReusePolicy::Segments;
        if segments {
            // Blocks of the tag's heaps: the small class (up to 1 MiB) one 2 MiB
            // handle; the large class grows by the need or an eighth of what it has
            // mapped (rounded to 2 MiB): 2, then 6 (5 MiB + 512), then 64, then 10
            // (a need of 4 MiB; 72 / 8 = 9, rounded up) holding the idle 4 MiB.
            assert_eq!(held, (2 + 2 + 6 + 64 + 10) * MIB);
        } else {
            // 2 + 2 + 6 + 64 MiB live, 4 MiB idle.
            assert_eq!(held, 78 * MIB);
        }
        pool.sleep(1, SleepMode::Offload).unwrap();
        let s = check_with_devices(&pool, 1);
        assert_eq!(s.physical_bytes, before - held, "{policy:?}");
        assert_eq!(sim.state().physical_bytes, before - held);
        let c = pool.tag_census(1);
        assert!(c.sleeping);
        assert_eq!((c.physical_bytes, c.idle_bytes, c.live_count), (0, 0, 4));
        let requested: u64 = sizes.iter().sum();
        assert_eq!(c.offloaded_bytes, requested);
        assert_eq!(sim.host_bytes(), requested);
        // Unmapped: a kernel would fault.
        for &p in &t1 {
            assert_eq!(sim.touch(p, 1, 0), CuResult::INVALID_VALUE);
        }
        // The tag refuses allocations and frees; other tags work.
        assert!(matches!(
            pool.allocate_tagged_raw(MIB, None, 1),
            Err(Error::TagState { tag: 1, .. })
        ));
        assert!(matches!(
            pool.free_raw(t1[0]),
            Err(Error::TagState { tag: 1, .. })
        ));
        assert!(matches!(
            pool.sleep(1, SleepMode::Discard),
            Err(Error::TagState { tag: 1, .. })
        ));
        // Nor may a stream be recorded on its unmapped memory.
        assert!(matches!(
            pool.record_stream(t1[0], common::stream(&sim)),
            Err(Error::TagState { tag: 1, .. })
        ));
        let other = pool.allocate_tagged_raw(MIB, None, 2).unwrap();
        pool.free_raw(other).unwrap();
        let untagged = pool.allocate_raw(MIB).unwrap();
        pool.free_raw(untagged).unwrap();
        check(&pool);
        pool.wake(1).unwrap();
        let s = check_with_devices(&pool, 1);
        assert_eq!(s.tags_sleeping, 0);
        // The buffer is kept for the next offload of the same size.
        assert_eq!(sim.host_bytes(), requested);
        assert_eq!((s.host_kept_bytes, s.offloaded_bytes), (requested, 0));
        let c = pool.tag_census(1);
        assert!(!c.sleeping);
        // The idle memory was released by the sleep: the 4 MiB mapping, or in
        // segment mode the 10 MiB handle it was carved from (wholly free).
        let live = if segments {
            MIB + 2 * MIB + (5 * MIB + 512) + 64 * MIB
        } else {
            74 * MIB
        };
        assert_eq!(
            (c.physical_bytes, c.offloaded_bytes, c.live_bytes),
            (74 * MIB, 0, live)
        );
        for (i, (&p, &n)) in t1.iter().zip(&sizes).enumerate() {
            same(&sim, p, i as u64, n as usize);
            same(&sim, t2[i], 100 + i as u64, n as usize);
        }
        assert!(matches!(pool.wake(1), Err(Error::TagState { tag: 1, .. })));
        // A second cycle of the same allocations pins nothing: the kept buffer
        // serves, and the bytes come back again.
        let pinned = sim.call_count(DriverCall::HostAlloc);
        assert_eq!(pinned, 1);
        for (i, (&p, &n)) in t1.iter().zip(&sizes).enumerate() {
            fill(&sim, p, 200 + i as u64, n as usize);
        }
        pool.sleep(1, SleepMode::Offload).unwrap();
        assert_eq!(sim.host_bytes(), requested);
        pool.wake(1).unwrap();
        assert_eq!(sim.call_count(DriverCall::HostAlloc), pinned);
        assert_eq!(sim.call_count(DriverCall::HostFree), 0);
        for (i, (&p, &n)) in t1.iter().zip(&sizes).enumerate() {
            same(&sim, p, 200 + i as u64, n as usize);
        }
        // Another size (tag 2's allocations less its 1 MiB one): a new buffer; its
        // wake keeps it and frees the one kept before.
        pool.free_raw(t2.remove(0)).unwrap();
        pool.sleep(2, SleepMode::Offload).unwrap();
        assert_eq!(sim.call_count(DriverCall::HostAlloc), pinned + 1);
        assert_eq!(
            sim.host_bytes(),
            requested + (requested - MIB),
            "in use, and the kept one"
        );
        pool.wake(2).unwrap();
        assert_eq!(sim.call_count(DriverCall::HostFree), 1);
        assert_eq!(sim.host_bytes(), requested - MIB);
        for p in t1.into_iter().chain(t2) {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        assert_eq!(sim.host_bytes(), 0, "trim frees the kept buffer");
        assert_eq!(check(&pool).host_kept_bytes, 0);
        no_faults(&sim);
    }
}

/// Discard: no host memory, pointers valid again after wake.
#[test]
fn discard_sleep_uses_no_host_memory() {
    let (pool, sim) = pool_with(ReusePolicy::BestFit, 16 * GIB);
    let a = pool.allocate_tagged(GIB, None, 3).unwrap();
    let p = a.ptr();
    pool.sleep(3, SleepMode::Discard).unwrap();
    assert_eq!(sim.host_bytes(), 0);
    assert_eq!(sim.call_count(DriverCall::MemcpyDtoH), 0);
    assert_eq!(pool.snapshot().sleeping_bytes, GIB);
    assert_eq!(sim.state().physical_bytes, 0);
    pool.wake(3).unwrap();
    assert_eq!(sim.touch(p, GIB, 0), CuResult::SUCCESS);
    assert_eq!(a.ptr(), p);
    check_with_devices(&pool, 1);
    drop(a);
    check(&pool);
}

/// A wake that cannot fit fails with out-of-memory, maps nothing, keeps the host
/// copy; it succeeds once the memory is freed.
#[test]
fn wake_on_a_full_device_fails_cleanly_then_succeeds() {
    let (pool, sim) = pool_with(ReusePolicy::BestFit, 64 * MIB);
    let ptrs: Vec<_> = (0..4)
        .map(|i| {
            let p = pool.allocate_tagged_raw(8 * MIB, None, 1).unwrap();
            fill(&sim, p, i, 8 * MIB as usize);
            p
        })
        .collect();
    pool.sleep(1, SleepMode::Offload).unwrap();
    // Another tag takes 48 of the 64 MiB: 16 left, 32 needed.
    let filler = pool.allocate_tagged_raw(48 * MIB, None, 2).unwrap();
    let creates = sim.call_count(DriverCall::Create);
    let err = pool.wake(1).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    // Two handles fitted before the third failed; both were released again.
    assert_eq!(sim.call_count(DriverCall::Create), creates + 3);
    let s = check(&pool);
    assert_eq!(s.physical_bytes, 48 * MIB);
    assert!(pool.tag_census(1).sleeping);
    assert_eq!(pool.tag_census(1).offloaded_bytes, 32 * MIB);
    pool.free_raw(filler).unwrap();
    pool.trim().unwrap();
    pool.wake(1).unwrap();
    check(&pool);
    for (i, &p) in ptrs.iter().enumerate() {
        same(&sim, p, i as u64, 8 * MIB as usize);
    }
}

/// Tag 0 with thread caches holding its idle memory: the sleep settles them and
/// releases it; untagged allocations are refused while it sleeps.
#[test]
fn tag_zero_sleep_settles_the_thread_caches() {
    let (pool, sim) = simulated_pool(
        16 * GIB,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default()
        },
    );
    let live = pool.allocate_raw(4 * MIB).unwrap();
    fill(&sim, live, 9, 4 * MIB as usize);
    let idle = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(idle).unwrap();
    assert_eq!(pool.snapshot().thread_cache_count, 1);
    let t = pool.allocate_tagged_raw(2 * MIB, None, 5).unwrap();
    pool.sleep(0, SleepMode::Offload).unwrap();
    let s = check(&pool);
    assert_eq!(s.thread_cache_count, 0);
    assert_eq!(s.physical_bytes, 2 * MIB, "only tag 5's mapping is held");
    assert_eq!(pool.tag_census(0).physical_bytes, 0);
    assert!(matches!(
        pool.allocate_raw(MIB),
        Err(Error::TagState { tag: 0, .. })
    ));
    assert!(matches!(
        pool.free_raw(live),
        Err(Error::TagState { tag: 0, .. })
    ));
    pool.free_raw(t).unwrap();
    pool.wake(0).unwrap();
    same(&sim, live, 9, 4 * MIB as usize);
    pool.free_raw(live).unwrap();
    check(&pool);
}

/// Dropping a pool with a tag asleep releases everything: reservations, host copy.
#[test]
fn a_pool_dropped_asleep_leaves_nothing() {
    let (pool, sim) = pool_with(ReusePolicy::BestFit, 16 * GIB);
    let _a = pool.allocate_tagged_raw(6 * MIB, None, 1).unwrap();
    pool.sleep(1, SleepMode::Offload).unwrap();
    drop(pool);
    let d = sim.state();
    assert_eq!((d.handles, d.reservations, d.mappings), (0, 0, 0));
    assert_eq!(sim.host_bytes(), 0);
}

/// A segment-mode pool that keeps what is freed (release threshold `u64::MAX`).
pub(crate) fn keeping_segments(capacity: u64) -> (Pool, Arc<SimDriver>) {
    simulated_pool(
        capacity,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default().with_policy(ReusePolicy::Segments)
        },
    )
}
