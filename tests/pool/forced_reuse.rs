//! The forced reuse of an idle mapping when the device is full: inside a scope a
//! larger idle mapping serves the request, the smallest that fits, before any release
//! outside a scope, and an exact size found so counts as an exact hit.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::gated::{sim_config, Gated};
use common::{check, GIB, MIB};
use flare_package::{Backend, DriverCall, Error, Pool, PoolConfig, ReusePolicy};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

fn sim_pool(capacity: u64, policy: ReusePolicy, threshold: u64) -> Pool {
    Pool::new(PoolConfig {
        backend: Backend::Simulated(sim_config(capacity)),
        reuse_policy: policy,
        release_threshold_bytes: threshold,
        ..PoolConfig::default()
    })
    .unwrap()
}

/// Inside a scope, a 4 MiB device with 4 MiB retained idle serves a 2 MiB request
/// from that mapping: creating 2 MiB more cannot fit (4 + 2 > 4), and the idle
/// mapping is the only memory there is. The exact policy and best-fit's 30% bound
/// (2 MiB * 1.3 < 4 MiB) would both pass it by; before issue 9 the request failed
/// with "0 B live, 4.0 MiB retained idle".
#[test]
fn a_full_device_reuses_a_larger_idle_mapping_inside_a_scope() {
    for policy in [ReusePolicy::Exact, ReusePolicy::BestFit] {
        let pool = sim_pool(4 * MIB, policy, 0);
        pool.retention_begin().unwrap();
        let x = pool.allocate_raw(4 * MIB).unwrap();
        pool.free_raw(x).unwrap();
        let y = pool
            .allocate_raw(2 * MIB)
            .unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        assert_eq!(y, x, "{policy:?}: the idle mapping is the one reused");
        let s = check(&pool);
        assert_eq!(s.reuse_hits, 1);
        assert_eq!(s.reuse_forced_hits, 1);
        assert_eq!(s.reuse_exact_hits, 0);
        assert_eq!(s.mappings_created, 1);
        assert_eq!(s.peak_physical_bytes, 4 * MIB);
        assert_eq!(s.live_mapped_bytes, 4 * MIB);
        assert_eq!(s.live_requested_bytes, 2 * MIB);
        assert_eq!(s.create_failures, 1, "{policy:?}: one create was refused");
        pool.free_raw(y).unwrap();
        pool.retention_finish().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0);
    }
}

/// The second case: a 10 GiB device, 8 GiB retained idle, a 3 GiB request.
/// 8 + 3 > 10, so nothing new fits; the 8 GiB mapping serves.
#[test]
fn ten_gib_device_eight_idle_three_requested() {
    for policy in [ReusePolicy::Exact, ReusePolicy::BestFit] {
        let pool = sim_pool(10 * GIB, policy, 0);
        pool.retention_begin().unwrap();
        let x = pool.allocate_raw(8 * GIB).unwrap();
        pool.free_raw(x).unwrap();
        assert_eq!(pool.allocate_raw(3 * GIB).unwrap(), x, "{policy:?}");
        let s = check(&pool);
        assert_eq!((s.reuse_hits, s.reuse_forced_hits), (1, 1));
        assert_eq!(s.physical_bytes, 8 * GIB);
    }
}

/// The smallest idle mapping that fits is the one forced, not merely any: with 4 and
/// 8 MiB idle on a full 12 MiB device under the exact policy, 2 MiB takes the 4 MiB
/// mapping, 6 MiB the 8 MiB one, and a third request, which nothing idle can serve,
/// fails.
#[test]
fn the_forced_mapping_is_the_smallest_that_fits() {
    let pool = sim_pool(12 * MIB, ReusePolicy::Exact, 0);
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    let b = pool.allocate_raw(8 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    // 2 MiB: exact finds no 2 MiB mapping, the device is full (12 of 12): the
    // smallest that fits is the 4 MiB one.
    assert_eq!(pool.allocate_raw(2 * MIB).unwrap(), a);
    // 6 MiB: exact finds none, full: only the 8 MiB one fits.
    assert_eq!(pool.allocate_raw(6 * MIB).unwrap(), b);
    // 2 MiB more: nothing idle, nothing fits: out of memory inside the scope.
    match pool.allocate_raw(2 * MIB) {
        Err(Error::OutOfMemory { in_scope: true, .. }) => {}
        other => panic!("expected out of memory in the scope, got {other:?}"),
    }
    let s = check(&pool);
    assert_eq!((s.reuse_hits, s.reuse_forced_hits), (2, 2));
}

/// Outside a scope the forced reuse comes before releasing anything: a 4 MiB device
/// caching 4 MiB idle (threshold above it) serves 2 MiB from the cache with no
/// synchronize and no release. The no-reuse policy does not reuse: it releases the
/// idle mapping and creates a new one.
#[test]
fn outside_a_scope_forced_reuse_comes_before_any_release() {
    let pool = sim_pool(4 * MIB, ReusePolicy::BestFit, u64::MAX);
    let sim = pool.sim_driver().unwrap().clone();
    let x = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(x).unwrap();
    assert_eq!(pool.allocate_raw(2 * MIB).unwrap(), x);
    let s = check(&pool);
    assert_eq!((s.reuse_hits, s.reuse_forced_hits), (1, 1));
    assert_eq!(s.mappings_released, 0);
    assert_eq!(s.oom_retries, 0, "nothing was released to retry");
    assert_eq!(sim.call_count(DriverCall::Synchronize), 0);

    let pool = sim_pool(4 * MIB, ReusePolicy::None, u64::MAX);
    let x = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(x).unwrap();
    pool.allocate_raw(2 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.reuse_hits, s.reuse_forced_hits), (0, 0));
    assert_eq!((s.mappings_created, s.mappings_released), (2, 1));
    assert_eq!(s.oom_retries, 1);
}

/// A forced reuse that finds a mapping of exactly the rounded size counts it as an
/// exact hit too (`reuse_exact_hits` counts hits whose mapping had exactly the
/// rounded size, however they were found). Single-threaded that cannot happen (the
/// policy would have taken it), so a race makes it: a miss is held at its create
/// while another thread frees a mapping of the same size; the create then finds the
/// device full and the forced reuse takes that mapping.
#[test]
fn a_forced_reuse_of_the_exact_size_is_an_exact_hit() {
    let gated = Gated::new(sim_config(4 * MIB));
    let config = PoolConfig {
        reuse_policy: ReusePolicy::Exact,
        ..PoolConfig::default()
    };
    let pool = Arc::new(Pool::with_driver(config, gated.clone()).unwrap());
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(2 * MIB).unwrap();
    let b = pool.allocate_raw(2 * MIB).unwrap();
    // The device is full (4 of 4 MiB live): a third 2 MiB request misses, and its
    // create is held.
    let started = gated.arm_for(DriverCall::Create);
    let miss = {
        let pool = pool.clone();
        thread::spawn(move || pool.allocate_raw(2 * MIB))
    };
    started
        .recv_timeout(Duration::from_secs(10))
        .expect("the miss reached its create");
    // Meanwhile `b` is freed: retained idle, exactly 2 MiB.
    pool.free_raw(b).unwrap();
    gated.open();
    let c = miss.join().unwrap().unwrap();
    assert_eq!(c, b, "the freed mapping serves the held miss");
    let s = pool.snapshot();
    assert_eq!(
        (s.reuse_hits, s.reuse_forced_hits, s.reuse_exact_hits),
        (1, 1, 1)
    );
    assert_eq!((s.create_failures, s.mappings_created), (1, 2));
    pool.free_raw(a).unwrap();
    pool.free_raw(c).unwrap();
    pool.retention_finish().unwrap();
}
