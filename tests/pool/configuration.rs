//! The configuration a pool is made with: peer devices, the simulated granularity's
//! least and its power of two, the names of policies and modes, the constructors,
//! and what `Debug` shows.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use common::{assert_driver_empty, check, check_with_devices, simulated_pool, MIB};
use flare_package::{Error, Pool, PoolConfig, ReusePolicy, SimConfig, SimDriver};
use std::sync::Arc;

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// `Pool::new` / `Pool::with_driver`: "[`Error::InvalidArgument`] for a negative
/// device or peer ordinal": device 0 is not negative, so it is a valid peer (of a
/// pool on device 1), and naming the pool's own device 0 as a peer is harmless.
#[test]
fn peer_device_zero_is_accepted() {
    let two = SimConfig {
        device_count: 2,
        ..SimConfig::default()
    };
    let pool = Pool::new(PoolConfig {
        device: 1,
        peer_devices: vec![0],
        ..PoolConfig::simulated(two)
    })
    .expect("peer device 0 of a pool on device 1");
    let sim = pool.sim_driver().unwrap();
    let a = pool.allocate_raw(3 * MIB).unwrap();
    // `PoolConfig::peer_devices`: "other device ordinals that get read/write access
    // to every mapping".
    assert_eq!(sim.access_of(a), vec![0, 1]);
    check_with_devices(&pool, 2);
    pool.free_raw(a).unwrap();
    assert_driver_empty(&pool);

    // Through `with_driver` (no simulated-machine check, only the ordinal rule).
    let driver = Arc::new(SimDriver::new(two));
    let pool = Pool::with_driver(
        PoolConfig {
            device: 1,
            peer_devices: vec![0],
            ..PoolConfig::default()
        },
        driver.clone(),
    )
    .expect("peer device 0 through with_driver");
    let a = pool.allocate_raw(G).unwrap();
    assert_eq!(driver.access_of(a), vec![0, 1]);
    pool.free_raw(a).unwrap();

    // The pool's own device named as a peer: one grant, device 0's.
    let pool = Pool::with_driver(
        PoolConfig {
            peer_devices: vec![0],
            ..PoolConfig::default()
        },
        Arc::new(SimDriver::new(SimConfig::default())),
    )
    .expect("device 0 named as its own peer");
    let a = pool.allocate_raw(G).unwrap();
    assert_eq!(pool.sim_driver().unwrap().access_of(a), vec![0]);
    check_with_devices(&pool, 1);
    pool.free_raw(a).unwrap();

    // -1 is negative: refused, by both constructors.
    for peers in [vec![-1], vec![0, -1]] {
        let config = PoolConfig {
            peer_devices: peers.clone(),
            ..PoolConfig::simulated(two)
        };
        assert!(
            matches!(Pool::new(config.clone()), Err(Error::InvalidArgument(_))),
            "{peers:?}"
        );
        assert!(
            matches!(
                Pool::with_driver(config, Arc::new(SimDriver::new(two))),
                Err(Error::InvalidArgument(_))
            ),
            "{peers:?}"
        );
    }
}

/// The simulated granularity has a least, one page: below it mappings would share
/// the 512-byte units of the thread caches' pointer table (a review saw a live
/// pointer refused as unknown at a granularity of 1). At the least, small requests
/// through a thread cache in a scope work.
#[test]
fn simulated_granularity_below_a_page_is_refused() {
    let config = |g: u64| PoolConfig {
        backend: flare_package::Backend::Simulated(SimConfig {
            granularity_bytes: g,
            ..SimConfig::default()
        }),
        ..PoolConfig::default()
    };
    for g in [1u64, 256, 2048] {
        match Pool::new(config(g)) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("below the least"), "{m}"),
            other => panic!("granularity {g}: {:?}", other.map(|_| ())),
        }
    }
    let pool = Pool::new(config(4096)).unwrap();
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(1000).unwrap();
    let b = pool.allocate_raw(3000).unwrap();
    assert_eq!((a % 4096, b % 4096), (0, 0));
    pool.free_raw(a).unwrap();
    let c = pool.allocate_raw(900).unwrap();
    assert_eq!(c, a, "the idle 4 KiB mapping");
    pool.free_raw(c).unwrap();
    pool.free_raw(b).unwrap();
    assert_eq!(check(&pool).live_count, 0);
    pool.retention_finish().unwrap();
}

/// `Pool::with_driver`: "[`Error::InvalidArgument`] for ... a granularity that is
/// not a power of two" (the pool rounds with masks); the simulated driver reports
/// whatever granularity it is given, so 3 MiB is refused and 4 MiB is taken.
#[test]
fn a_granularity_that_is_not_a_power_of_two_is_refused() {
    let with = |g: u64| {
        Pool::with_driver(
            PoolConfig::default(),
            Arc::new(SimDriver::new(SimConfig {
                granularity_bytes: g,
                ..SimConfig::default()
            })),
        )
    };
    match with(3 * MIB) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("not a power of two"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let pool = with(4 * MIB).unwrap();
    let a = pool.allocate_raw(1).unwrap();
    assert_eq!(a % (4 * MIB), 0);
    pool.free_raw(a).unwrap();
}

/// The names of policies and cross-stream modes (`ReusePolicy::name`,
/// `CrossStreamReuse::name`, and `FromStr`): every name parses back to its value;
/// `bestfit` and `best_fit` are taken for `best-fit`; an unknown name is refused
/// with a message that lists the names. `ReusePolicy::default()` is best-fit.
#[test]
fn policy_and_mode_names_round_trip() {
    use flare_package::CrossStreamReuse;
    assert_eq!(ReusePolicy::default(), ReusePolicy::BestFit);
    for p in ReusePolicy::ALL {
        assert_eq!(p.name().parse::<ReusePolicy>(), Ok(p));
    }
    for alias in ["bestfit", "best_fit"] {
        assert_eq!(alias.parse::<ReusePolicy>(), Ok(ReusePolicy::BestFit));
    }
    let err = "best fit".parse::<ReusePolicy>().unwrap_err();
    assert!(err.contains("\"best fit\""), "{err}");
    for p in ReusePolicy::ALL {
        assert!(err.contains(p.name()), "{err}");
    }
    for m in CrossStreamReuse::ALL {
        assert_eq!(m.name().parse::<CrossStreamReuse>(), Ok(m));
    }
    let err = "always".parse::<CrossStreamReuse>().unwrap_err();
    assert!(err.contains("\"always\""), "{err}");
    for m in CrossStreamReuse::ALL {
        assert!(err.contains(m.name()), "{err}");
    }
}

/// `PoolConfig::cuda(device)`: "a default configuration on the real CUDA driver,
/// device `device`"; `PoolConfig::simulated(sim)` the default on the simulated
/// driver with `sim`. Built only (no driver opened): the rest is the default.
#[test]
fn config_constructors_name_their_backend_and_device() {
    let c = PoolConfig::cuda(3);
    assert_eq!(c.backend, flare_package::Backend::Cuda);
    assert_eq!(c.device, 3);
    assert_eq!(
        PoolConfig {
            backend: PoolConfig::default().backend,
            device: 0,
            ..c
        },
        PoolConfig::default()
    );
    let sim = SimConfig {
        device_count: 2,
        ..SimConfig::default()
    };
    let s = PoolConfig::simulated(sim);
    assert_eq!(s.backend, flare_package::Backend::Simulated(sim));
    assert_eq!(
        PoolConfig {
            backend: PoolConfig::default().backend,
            ..s
        },
        PoolConfig::default()
    );
}

/// `Pool`'s `Debug` (what a failing test prints) names its policy, its granularity in
/// bytes and whether it runs on the simulated driver: a best-fit pool on the default
/// simulator shows `BestFit`, 2 MiB (2097152) and `simulated: true`.
#[test]
fn debug_names_the_policy_granularity_and_backend() {
    let (pool, _sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::BestFit,
            ..PoolConfig::default()
        },
    );
    let text = format!("{pool:?}");
    assert!(text.starts_with("Pool { policy: BestFit"), "{text}");
    assert!(
        text.contains("granularity: 2097152, simulated: true, .. }"),
        "{text}"
    );
}
