//! With peer devices, a release waits for every device with access: it synchronizes
//! each, and a failed synchronize of a peer keeps the mapping.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use common::{check, MIB};
use flare_package::{Backend, CuResult, DriverCall, Pool, PoolConfig, SimConfig, SimDriver};
use std::sync::Arc;

/// A pool on device 0 of a simulated two-device machine, granting device 1 access.
fn peer_pool() -> (Pool, Arc<SimDriver>) {
    let pool = Pool::new(PoolConfig {
        backend: Backend::Simulated(SimConfig {
            device_count: 2,
            ..SimConfig::default()
        }),
        peer_devices: vec![1],
        ..PoolConfig::default()
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap();
    (pool, sim)
}

/// With a peer, a release waits for both devices: a kernel on device 1 reading a
/// device-0 pool's buffer is cleared only by device 1's synchronize
/// (`cuCtxSynchronize` waits for its own context's work), so a pool that
/// synchronized only device 0 would unmap under it, which the simulated driver
/// records as a fault.
#[test]
fn a_release_synchronizes_every_device_with_access() {
    let (pool, sim) = peer_pool();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(sim.touch(p, 2 * MIB, 1), CuResult::SUCCESS);
    sim.mark_busy_on(1, p, 2 * MIB);
    pool.free_raw(p).unwrap();
    assert!(sim.faults().is_empty(), "faults: {:?}", sim.faults());
    assert!(sim.busy_ranges().is_empty());
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        2,
        "devices 0 and 1"
    );
    let s = check(&pool);
    assert_eq!(s.mappings_released, 1);
    assert_eq!(s.sync_failures, 0);
}

/// A failed synchronize of the peer keeps the mapping whole (idle, retried later):
/// nothing is unmapped while the peer may still be reading it.
#[test]
fn a_failed_peer_synchronize_keeps_the_mapping() {
    let (pool, sim) = peer_pool();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    sim.mark_busy_on(1, p, 2 * MIB);
    // The pool synchronizes device 0, then device 1: fail the second.
    sim.inject_failure(DriverCall::Synchronize, 2, CuResult::LAUNCH_FAILED);
    pool.free_raw(p).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.idle_count, s.mappings_released, s.sync_failures),
        (1, 0, 1)
    );
    assert_eq!(sim.call_count(DriverCall::Unmap), 0);
    assert!(sim.faults().is_empty());
    pool.trim().unwrap();
    assert_eq!(check(&pool).mappings_released, 1);
    assert!(sim.faults().is_empty());
}
