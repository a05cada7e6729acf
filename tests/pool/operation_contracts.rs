//! The pool's contracts on the simulated driver (runs in CI). One concern in one file:
//! each test is one contract of docs/ARCHITECTURE.md, "Operations and their contracts".

use crate::common;

use common::*;
use flare_package::{Backend, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SimConfig};

#[test]
fn warmup_one_transient_at_a_time() {
    // Twelve forwards of two 1 GiB transients: reuse keeps one mapping; no reuse
    // keeps all 24.
    assert_eq!(warmup(On::Sim, ReusePolicy::Exact, false), GIB);
    assert_eq!(warmup(On::Sim, ReusePolicy::BestFit, false), GIB);
    assert_eq!(warmup(On::Sim, ReusePolicy::None, false), 24 * GIB);
}

#[test]
fn warmup_both_transients_live() {
    assert_eq!(warmup(On::Sim, ReusePolicy::Exact, true), 2 * GIB);
    assert_eq!(warmup(On::Sim, ReusePolicy::BestFit, true), 2 * GIB);
    assert_eq!(warmup(On::Sim, ReusePolicy::None, true), 24 * GIB);
}

#[test]
fn per_shape_sizes_stay_bounded_outside_a_scope() {
    let sizes = shape_sizes();
    assert_eq!(sizes.len(), 1000);
    let round = |b: u64| b.div_ceil(2 * MIB) * 2 * MIB;
    let mut sorted: Vec<u64> = sizes.iter().map(|&b| round(b)).collect();
    sorted.sort_unstable();
    let two_largest = sorted[999] + sorted[998];
    for policy in ReusePolicy::ALL {
        let pool = pool(On::Sim, policy);
        let mut live = std::collections::VecDeque::new();
        for &b in &sizes {
            live.push_back(pool.allocate_raw(b).unwrap());
            if live.len() > 2 {
                pool.free_raw(live.pop_front().unwrap()).unwrap();
            }
            let s = check(&pool);
            assert!(
                s.physical_bytes <= two_largest,
                "{policy:?}: {} > {}",
                s.physical_bytes,
                two_largest
            );
        }
        let s = check(&pool);
        assert!(s.peak_physical_bytes <= two_largest);
        assert_eq!(s.live_count, 2);
        for p in live {
            pool.free_raw(p).unwrap();
        }
        let s = check(&pool);
        assert_eq!(s.physical_bytes, 0, "release threshold 0: nothing cached");
        assert_driver_empty(&pool);
    }
}

#[test]
fn per_shape_sizes_with_a_release_threshold_stay_under_it() {
    let threshold = 256 * MIB;
    let pool = Pool::new(PoolConfig {
        release_threshold_bytes: threshold,
        ..PoolConfig::default()
    })
    .unwrap();
    let sizes = shape_sizes();
    let max = sizes
        .iter()
        .map(|b| b.div_ceil(2 * MIB) * 2 * MIB)
        .max()
        .unwrap();
    let mut live = std::collections::VecDeque::new();
    for &b in &sizes {
        live.push_back(pool.allocate_raw(b).unwrap());
        if live.len() > 2 {
            pool.free_raw(live.pop_front().unwrap()).unwrap();
        }
        let s = check(&pool);
        assert!(s.idle_bytes <= threshold);
        assert!(s.physical_bytes <= 2 * max + threshold);
    }
    drop(live);
    pool.trim().unwrap();
    assert_eq!(check(&pool).idle_bytes, 0);
}

#[test]
fn a_reuse_hit_makes_no_driver_call() {
    let pool = pool(On::Sim, ReusePolicy::BestFit);
    let sim = pool.sim_driver().unwrap().clone();
    pool.retention_begin().unwrap();
    let p = pool.allocate_raw(64 * MIB).unwrap();
    pool.free_raw(p).unwrap();
    let before: Vec<u64> = DriverCall::ALL.iter().map(|&c| sim.call_count(c)).collect();
    let q = pool.allocate_raw(64 * MIB - 5).unwrap();
    assert_eq!(q, p, "the idle mapping is handed out again");
    pool.free_raw(q).unwrap();
    let after: Vec<u64> = DriverCall::ALL.iter().map(|&c| sim.call_count(c)).collect();
    assert_eq!(before, after);
    let s = check(&pool);
    assert_eq!(
        (s.reuse_hits, s.reuse_exact_hits, s.mappings_created),
        (1, 1, 1)
    );
    assert_eq!(s.idle_bytes, 64 * MIB);
    pool.retention_finish().unwrap();
    assert_driver_empty(&pool);
}

#[test]
fn best_fit_respects_the_waste_bound() {
    let pool = Pool::new(PoolConfig {
        best_fit_max_waste_percent: 100,
        ..PoolConfig::default()
    })
    .unwrap();
    pool.retention_begin().unwrap();
    let big = pool.allocate_raw(8 * MIB).unwrap();
    pool.free_raw(big).unwrap();
    // 2 MiB may take at most 4 MiB: the idle 8 MiB mapping is too wasteful.
    let small = pool.allocate_raw(2 * MIB).unwrap();
    assert_ne!(small, big);
    // 6 MiB may take up to 12 MiB: the 8 MiB one fits.
    let mid = pool.allocate_raw(6 * MIB).unwrap();
    assert_eq!(mid, big);
    let s = check(&pool);
    assert_eq!(
        (s.reuse_hits, s.reuse_exact_hits, s.mappings_created),
        (1, 0, 2)
    );
    assert_eq!(s.live_requested_bytes, 8 * MIB);
    assert_eq!(s.live_mapped_bytes, 10 * MIB);
    pool.free_raw(small).unwrap();
    pool.free_raw(mid).unwrap();
    pool.retention_finish().unwrap();
    assert_driver_empty(&pool);
}

#[test]
fn exact_reuses_only_the_same_rounded_size() {
    let pool = pool(On::Sim, ReusePolicy::Exact);
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    let b = pool.allocate_raw(2 * MIB).unwrap();
    assert_ne!(a, b);
    let c = pool.allocate_raw(3 * MIB + 1).unwrap();
    assert_eq!(c, a, "3 MiB + 1 rounds to 4 MiB");
    let s = check(&pool);
    assert_eq!(
        (s.reuse_hits, s.reuse_exact_hits, s.mappings_created),
        (1, 1, 2)
    );
    drop(pool);
}

#[test]
fn bad_arguments_change_nothing() {
    let pool = pool(On::Sim, ReusePolicy::BestFit);
    let p = pool.allocate_raw(3 * MIB).unwrap();
    let before = check(&pool);
    assert!(matches!(
        pool.allocate_raw(0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        pool.allocate_raw(u64::MAX),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(
        pool.free_raw(p + 4096),
        Err(Error::UnknownPointer { ptr: p + 4096 })
    );
    assert_eq!(
        pool.free_raw(12345),
        Err(Error::UnknownPointer { ptr: 12345 })
    );
    assert!(matches!(pool.retention_finish(), Err(Error::ScopeState(_))));
    assert!(matches!(pool.retention_abort(), Err(Error::ScopeState(_))));
    assert_eq!(check(&pool), before);
    pool.free_raw(p).unwrap();
    let after_free = check(&pool);
    assert_eq!(
        pool.free_raw(p),
        Err(Error::UnknownPointer { ptr: p }),
        "double free"
    );
    assert_eq!(check(&pool), after_free);
    pool.retention_begin().unwrap();
    let in_scope = check(&pool);
    assert!(matches!(pool.retention_begin(), Err(Error::ScopeState(_))));
    assert!(matches!(pool.trim(), Err(Error::ScopeState(_))));
    assert_eq!(check(&pool), in_scope);
}

#[test]
fn out_of_memory_inside_a_scope_releases_nothing_and_says_why() {
    let pool = Pool::new(PoolConfig::simulated(SimConfig {
        capacity_bytes: 4 * GIB,
        ..SimConfig::default()
    }))
    .unwrap();
    pool.retention_begin().unwrap();
    let live = pool.allocate_raw(2 * GIB).unwrap();
    let t = pool.allocate_raw(GIB).unwrap();
    pool.free_raw(t).unwrap();
    let before = check(&pool);
    let err = pool.allocate_raw(2 * GIB).unwrap_err();
    match &err {
        Error::OutOfMemory {
            requested,
            live,
            idle,
            in_scope,
            source,
        } => {
            assert_eq!(
                (*requested, *live, *idle, *in_scope),
                (2 * GIB, 2 * GIB, GIB, true)
            );
            assert_eq!(source.unwrap().call, DriverCall::Create);
        }
        e => panic!("expected out of memory, got {e:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("2.0 GiB live")
            && msg.contains("1.0 GiB retained idle")
            && msg.contains("2.0 GiB requested"),
        "{msg}"
    );
    assert!(msg.contains("finish the scope"), "{msg}");
    let after = check(&pool);
    assert_eq!(after.idle_bytes, GIB, "nothing retained was released");
    assert_eq!(after.create_failures, before.create_failures + 1);
    assert_eq!(after.oom_retries, 0);
    pool.free_raw(live).unwrap();
    pool.retention_finish().unwrap();
    assert_driver_empty(&pool);
}

#[test]
fn out_of_memory_outside_a_scope_releases_idle_and_retries_once() {
    let pool = Pool::new(PoolConfig {
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::simulated(SimConfig {
            capacity_bytes: 4 * GIB,
            ..SimConfig::default()
        })
    })
    .unwrap();
    let a = pool.allocate_raw(GIB).unwrap();
    let b = pool.allocate_raw(GIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    assert_eq!(
        check(&pool).idle_bytes,
        2 * GIB,
        "cached under the threshold"
    );
    // 3 GiB does not fit beside 2 GiB cached: release them, then it does.
    let c = pool.allocate_raw(3 * GIB).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.oom_retries, s.idle_bytes, s.physical_bytes),
        (1, 0, 3 * GIB)
    );
    assert_eq!(s.mappings_released, 2);
    // 2 GiB fits the device but not beside 3 GiB live: released (nothing idle),
    // retried once, still out of memory, with the driver's failure attached.
    let before = check(&pool);
    let err = pool.allocate_raw(2 * GIB).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { in_scope: false, requested, live, idle: 0, source: Some(_) } if requested == 2 * GIB && live == 3 * GIB),
        "{err:?}"
    );
    let s = check(&pool);
    assert_eq!(s.oom_retries, 2);
    assert_eq!(
        s.create_failures,
        before.create_failures + 2,
        "the first try and the retry"
    );
    // Beyond the whole device: fails at once, as too large rather than out of
    // memory (no freeing can help), no driver call, nothing counted.
    let before = check(&pool);
    let err = pool.allocate_raw(8 * GIB).unwrap_err();
    assert!(
        matches!(err, Error::RequestTooLarge { requested, device_total } if requested == 8 * GIB && device_total == 4 * GIB),
        "{err:?}"
    );
    assert_eq!(check(&pool), before);
    pool.free_raw(c).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

#[test]
fn release_threshold_keeps_small_frees_cached() {
    let pool = Pool::new(PoolConfig {
        release_threshold_bytes: 4 * MIB,
        ..PoolConfig::default()
    })
    .unwrap();
    let a = pool.allocate_raw(2 * MIB).unwrap();
    let b = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    assert_eq!(check(&pool).idle_bytes, 2 * MIB);
    pool.free_raw(b).unwrap();
    let s = check(&pool);
    assert_eq!(
        s.idle_bytes,
        2 * MIB,
        "6 MiB idle would pass 4 MiB: the 4 MiB one is released"
    );
    assert_eq!(s.mappings_released, 1);
    let c = pool.allocate_raw(MIB).unwrap();
    assert_eq!(c, a);
    pool.free_raw(c).unwrap();
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.idle_bytes, s.physical_bytes, s.mappings_released),
        (0, 0, 2)
    );
    assert_driver_empty(&pool);
}

#[test]
fn peers_get_access_to_every_mapping() {
    // A real one-GPU host has no device 1: neither has the default simulated one.
    let err = Pool::new(PoolConfig {
        peer_devices: vec![1, 2],
        ..PoolConfig::default()
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("peer device 1 does not exist"),
        "{err}"
    );
    let pool = Pool::new(PoolConfig {
        peer_devices: vec![1, 2],
        ..PoolConfig::simulated(SimConfig {
            device_count: 3,
            ..SimConfig::default()
        })
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap().clone();
    let a = pool.allocate_raw(2 * MIB).unwrap();
    let b = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(sim.state().access_grants, 6, "2 mappings x 3 devices");
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    assert_eq!(sim.state().access_grants, 0);
    assert!(matches!(
        Pool::new(PoolConfig {
            peer_devices: vec![-1],
            ..PoolConfig::default()
        }),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn guards_free_on_drop_and_scope_drop_aborts() {
    let pool = pool(On::Sim, ReusePolicy::BestFit);
    {
        let scope = pool.retention_scope().unwrap();
        let a = pool.allocate(5 * MIB).unwrap();
        assert_eq!(a.size(), 5 * MIB);
        assert_eq!(a.ptr() % (2 * MIB), 0);
        drop(a);
        assert_eq!(check(&pool).idle_bytes, 6 * MIB);
        drop(scope);
    }
    let s = check(&pool);
    assert_eq!(
        (s.scopes_aborted, s.scopes_finished, s.physical_bytes),
        (1, 0, 0)
    );
    let scope = pool.retention_scope().unwrap();
    let kept = pool.allocate(2 * MIB).unwrap().into_raw();
    scope.finish().unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.scopes_finished, s.live_count, s.physical_bytes),
        (1, 1, 2 * MIB)
    );
    pool.free_raw(kept).unwrap();
    assert_driver_empty(&pool);
}

#[test]
fn live_allocations_survive_finish_and_release_when_freed() {
    let pool = pool(On::Sim, ReusePolicy::BestFit);
    pool.retention_begin().unwrap();
    let weights = pool.allocate_raw(GIB).unwrap();
    let t = pool.allocate_raw(GIB).unwrap();
    pool.free_raw(t).unwrap();
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.live_mapped_bytes, s.idle_bytes, s.physical_bytes),
        (GIB, 0, GIB)
    );
    pool.free_raw(weights).unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    assert_driver_empty(&pool);
}

#[test]
fn drop_releases_everything_live_included() {
    let pool = Pool::new(PoolConfig::simulated(SimConfig::default())).unwrap();
    let sim = pool.sim_driver().unwrap().clone();
    pool.retention_begin().unwrap();
    let _a = pool.allocate_raw(GIB).unwrap();
    let b = pool.allocate_raw(GIB).unwrap();
    pool.free_raw(b).unwrap();
    assert_eq!(sim.state().physical_bytes, 2 * GIB);
    drop(pool);
    let d = sim.state();
    assert_eq!(
        (d.physical_bytes, d.handles, d.reservations, d.mappings),
        (0, 0, 0, 0)
    );
}

#[test]
fn destroy_reports_success_when_everything_is_released() {
    let pool = Pool::new(PoolConfig {
        backend: Backend::Simulated(SimConfig::default()),
        ..PoolConfig::default()
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap().clone();
    pool.allocate_raw(MIB).unwrap();
    pool.destroy().unwrap();
    assert_eq!(sim.state().handles, 0);
}

#[test]
fn pool_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Pool>();
}

#[test]
fn the_simulated_machine_must_be_a_real_one() {
    let sim = |c: SimConfig| Pool::new(PoolConfig::simulated(c));
    let msg = |r: flare_package::Result<Pool>| match r {
        Err(Error::InvalidArgument(m)) => m,
        other => panic!("expected an invalid argument, got {other:?}"),
    };
    assert!(msg(sim(SimConfig {
        capacity_bytes: 0,
        ..SimConfig::default()
    }))
    .contains("capacity is 0"));
    assert!(msg(sim(SimConfig {
        granularity_bytes: 3 << 20,
        ..SimConfig::default()
    }))
    .contains("not a power of two"));
    // Below one granule nothing could ever be mapped (found by a new user: such a
    // pool was accepted and every allocation failed). One granule is enough.
    assert!(msg(sim(SimConfig {
        capacity_bytes: (2 << 20) - 1,
        ..SimConfig::default()
    }))
    .contains("less than one granule (2097152 bytes)"));
    assert!(msg(sim(SimConfig {
        capacity_bytes: 1 << 20,
        granularity_bytes: 1 << 21,
        ..SimConfig::default()
    }))
    .contains("less than one granule"));
    let one = sim(SimConfig {
        capacity_bytes: 2 << 20,
        ..SimConfig::default()
    })
    .unwrap();
    one.allocate_raw(1).unwrap();
    // A granularity of 0 is the documented default, 2 MiB (SimConfig), not an error.
    let zero = sim(SimConfig {
        granularity_bytes: 0,
        ..SimConfig::default()
    })
    .unwrap();
    assert_eq!(zero.granularity(), 2 << 20);
    // Exactly 128 devices is allowed (SIM_MAX_DEVICES is "at most"): the last one is
    // a device like any other.
    let last = Pool::new(PoolConfig {
        device: 127,
        ..PoolConfig::simulated(SimConfig {
            device_count: 128,
            ..SimConfig::default()
        })
    })
    .unwrap();
    let p = last.allocate_raw(1).unwrap();
    assert_eq!(last.sim_driver().unwrap().access_of(p), vec![127]);
    last.free_raw(p).unwrap();
    // More devices than can be simulated is refused, not silently capped.
    assert!(msg(sim(SimConfig {
        device_count: 129,
        ..SimConfig::default()
    }))
    .contains("at most 128"));
    assert!(msg(Pool::new(PoolConfig {
        device: 1,
        ..PoolConfig::default()
    }))
    .contains("device 1 does not exist: the simulated machine has 1 device(s)"));
    let pool = Pool::new(PoolConfig {
        device: 3,
        ..PoolConfig::simulated(SimConfig {
            device_count: 4,
            ..SimConfig::default()
        })
    })
    .unwrap();
    let p = pool.allocate_raw(1).unwrap();
    assert_eq!(pool.sim_driver().unwrap().access_of(p), vec![3]);
    pool.free_raw(p).unwrap();
    // A granularity of 64 KiB (a power of two) is fine; pointers are aligned to it.
    let pool = sim(SimConfig {
        granularity_bytes: 64 << 10,
        ..SimConfig::default()
    })
    .unwrap();
    let p = pool.allocate_raw(1).unwrap();
    assert_eq!(
        (p % (64 << 10), pool.snapshot().live_mapped_bytes),
        (0, 64 << 10)
    );
}

#[test]
fn a_guard_never_frees_an_allocation_that_is_not_its_own() {
    let pool = pool(On::Sim, ReusePolicy::Exact);
    pool.retention_begin().unwrap();
    let guard = pool.allocate(2 * MIB).unwrap();
    // Misuse: the guard's pointer freed by hand, and the address reused.
    pool.free_raw(guard.ptr()).unwrap();
    let other = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(
        other,
        guard.ptr(),
        "exact reuse hands the same mapping out again"
    );
    drop(guard);
    let s = check(&pool);
    assert_eq!(
        (s.live_count, s.frees),
        (1, 1),
        "the other allocation is still live"
    );
    pool.free_raw(other).unwrap();
    pool.retention_finish().unwrap();
}

#[test]
fn a_scope_guard_never_closes_a_scope_it_did_not_open() {
    let pool = pool(On::Sim, ReusePolicy::BestFit);
    let guard = pool.retention_scope().unwrap();
    pool.retention_finish().unwrap();
    pool.retention_begin().unwrap();
    drop(guard);
    let s = check(&pool);
    assert!(s.scope_open, "the later scope is still open");
    assert_eq!((s.scopes_finished, s.scopes_aborted), (1, 0));
    let guard = pool.retention_scope();
    assert!(matches!(guard, Err(Error::ScopeState(_))));
    pool.retention_finish().unwrap();
    let guard = pool.retention_scope().unwrap();
    pool.retention_abort().unwrap();
    assert!(matches!(guard.finish(), Err(Error::ScopeState(_))));
    let s = check(&pool);
    assert_eq!(
        (s.scopes_finished, s.scopes_aborted, s.scope_open),
        (2, 1, false)
    );
}

#[test]
fn a_pointer_of_another_simulated_pool_is_unknown_there() {
    // On the real driver addresses are unique per process, so a pointer of pool A
    // freed on pool B is unknown to B. Two simulated pools must behave the same.
    let a = pool(On::Sim, ReusePolicy::BestFit);
    let b = pool(On::Sim, ReusePolicy::BestFit);
    let p = a.allocate_raw(1).unwrap();
    let q = b.allocate_raw(1).unwrap();
    assert_ne!(p, q, "two pools handed out the same address");
    let (before, driver_before) = (check(&b), b.sim_driver().unwrap().state());
    assert!(
        matches!(b.free_raw(p), Err(Error::UnknownPointer { ptr }) if ptr == p),
        "B freed A's pointer"
    );
    assert_eq!(check(&b), before, "B's books unchanged");
    assert_eq!(b.sim_driver().unwrap().state(), driver_before);
    assert!(matches!(a.free_raw(q), Err(Error::UnknownPointer { .. })));
    // Each frees its own.
    b.free_raw(q).unwrap();
    a.free_raw(p).unwrap();
    assert_driver_empty(&a);
    assert_driver_empty(&b);
}

#[test]
fn many_simulated_pools_never_share_an_address() {
    let pools: Vec<Pool> = (0..8).map(|_| pool(On::Sim, ReusePolicy::Exact)).collect();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for (i, p) in pools.iter().enumerate() {
        for k in 1..=3 {
            let size = (i as u64 + k) * 2 * MIB;
            ranges.push((p.allocate_raw(size).unwrap(), size));
        }
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(
            w[0].0 + w[0].1 <= w[1].0,
            "{:#x}+{} overlaps {:#x}",
            w[0].0,
            w[0].1,
            w[1].0
        );
    }
}

#[test]
fn a_negative_device_is_an_invalid_argument_on_every_backend() {
    // The check comes before any driver is touched: the same error with or without
    // libcuda (it used to be NoDriver on the CUDA backend).
    for config in [PoolConfig::cuda(-1), PoolConfig::default()] {
        let backend = config.backend;
        let config = PoolConfig {
            device: -1,
            ..config
        };
        let err = Pool::new(config).unwrap_err();
        assert_eq!(
            err,
            Error::InvalidArgument("device ordinal -1 is negative".into()),
            "{backend:?}"
        );
    }
    let err = Pool::new(PoolConfig {
        peer_devices: vec![-3],
        ..PoolConfig::cuda(0)
    })
    .unwrap_err();
    assert_eq!(
        err,
        Error::InvalidArgument("peer device ordinal -3 is negative".into())
    );
}
