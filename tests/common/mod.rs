//! Shared by the integration tests: the checks run after every operation, and the
//! scenarios that run both on the simulated driver (CI) and on the real one (GPU).
#![allow(dead_code)]

pub mod hammer;

use flare_package::{Backend, Pool, PoolConfig, ReusePolicy, SimConfig, Snapshot};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The backend a scenario runs on.
#[derive(Clone, Copy, Debug)]
pub enum On {
    Sim,
    Cuda,
}

pub fn config(on: On, policy: ReusePolicy) -> PoolConfig {
    let backend = match on {
        On::Sim => Backend::Simulated(SimConfig::default()),
        On::Cuda => Backend::Cuda,
    };
    PoolConfig {
        backend,
        reuse_policy: policy,
        ..PoolConfig::default()
    }
}

pub fn pool(on: On, policy: ReusePolicy) -> Pool {
    match Pool::new(config(on, policy)) {
        Ok(p) => p,
        Err(e) => panic!("cannot create a pool on {on:?}: {e} (a GPU test needs a CUDA GPU)"),
    }
}

/// The snapshot invariants, and on the simulated driver the books against what the
/// driver holds.
#[track_caller]
pub fn check(pool: &Pool) -> Snapshot {
    let s = pool.snapshot();
    if let Err(e) = s.check_invariants() {
        panic!("snapshot invariant broken: {e}\n{s:#?}");
    }
    if let Some(sim) = pool.sim_driver() {
        let d = sim.state();
        assert_eq!(
            s.physical_bytes, d.physical_bytes,
            "physical bytes: books vs driver\n{s:#?}\n{d:#?}"
        );
        assert_eq!(
            s.reserved_bytes, d.reserved_bytes,
            "reserved bytes: books vs driver"
        );
        assert!(
            d.mappings >= s.live_count + s.idle_count
                && d.mappings <= s.live_count + s.idle_count + s.pending_count,
            "driver mappings {} vs live {} + idle {} (+ pending {})",
            d.mappings,
            s.live_count,
            s.idle_count,
            s.pending_count
        );
        assert!(sim.faults().is_empty(), "driver faults: {:?}", sim.faults());
    }
    s
}

/// The simulated driver holds nothing (after finish, trim or drop).
#[track_caller]
pub fn assert_driver_empty(pool: &Pool) {
    if let Some(sim) = pool.sim_driver() {
        let d = sim.state();
        assert_eq!(d.physical_bytes, 0, "driver still holds {d:?}");
        assert_eq!(d.handles, 0, "driver still holds {d:?}");
        assert_eq!(d.reservations, 0, "driver still holds {d:?}");
        assert_eq!(d.mappings, 0, "driver still holds {d:?}");
    }
}

/// The warmup scenario of the design: inside one scope, twelve forwards, each
/// allocating a 1 GiB transient, freeing it, allocating another and freeing it
/// (`both_live`: the two transients live at once). Returns the peak physical bytes.
pub fn warmup(on: On, policy: ReusePolicy, both_live: bool) -> u64 {
    let pool = pool(on, policy);
    let base = check(&pool);
    assert_eq!(base.physical_bytes, 0);
    pool.retention_begin().unwrap();
    for _ in 0..12 {
        if both_live {
            let a = pool.allocate_raw(GIB).unwrap();
            let b = pool.allocate_raw(GIB).unwrap();
            check(&pool);
            pool.free_raw(a).unwrap();
            pool.free_raw(b).unwrap();
        } else {
            let a = pool.allocate_raw(GIB).unwrap();
            pool.free_raw(a).unwrap();
            let b = pool.allocate_raw(GIB).unwrap();
            pool.free_raw(b).unwrap();
        }
        check(&pool);
    }
    let s = check(&pool);
    assert!(s.scope_open);
    pool.retention_finish().unwrap();
    let after = check(&pool);
    assert_eq!(after.physical_bytes, 0, "nothing held after finish");
    assert_eq!(after.idle_bytes, 0);
    assert_eq!(after.reserved_bytes, 0);
    assert_eq!(after.scopes_finished, 1);
    assert_driver_empty(&pool);
    after.peak_physical_bytes
}

/// Arena sizes the way per-shape caches make them: `batch * seq * hidden * 2` bytes
/// for a ladder of shapes (1x34 .. 64x172 .. 16x1117 style), 1000 distinct sizes.
pub fn shape_sizes() -> Vec<u64> {
    let mut v = Vec::new();
    let mut i = 0u64;
    while v.len() < 1000 {
        let batch = [1u64, 2, 4, 8, 16, 32, 64][(i % 7) as usize];
        let seq = 34 + 32 * (i / 7) + (i % 5);
        let bytes = batch * seq * 2048 * 2 + i; // + i: every size distinct
        if !v.contains(&bytes) {
            v.push(bytes);
        }
        i += 1;
    }
    v
}
