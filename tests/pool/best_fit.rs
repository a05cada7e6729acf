//! The best-fit policy's waste bound: the rounded size plus its percent, rounded down,
//! and an exact size reused whatever the bound.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use common::{assert_driver_empty, check, simulated_pool, MIB};
use flare_package::{DriverCall, PoolConfig, ReusePolicy};

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// `ReusePolicy::BestFit`: "the smallest idle mapping *at least as large as* the
/// rounded request whose excess over it is *at most* the waste bound". With a bound
/// of 0% an idle mapping of exactly the rounded size has no excess and is reused;
/// a larger one is not. Checked in the books (thread caches off) and through a
/// thread cache (which holds memory while the threshold is `u64::MAX`).
#[test]
fn best_fit_with_zero_waste_still_reuses_an_exact_size() {
    for cache_entries in [0, 32] {
        let (pool, sim) = simulated_pool(
            1 << 30,
            PoolConfig {
                reuse_policy: ReusePolicy::BestFit,
                best_fit_max_waste_percent: 0,
                release_threshold_bytes: u64::MAX,
                thread_cache_entries: cache_entries,
                ..PoolConfig::default()
            },
        );
        let a = pool.allocate_raw(3 * MIB).unwrap(); // a 4 MiB mapping
        pool.free_raw(a).unwrap();
        let b = pool.allocate_raw(4 * MIB).unwrap();
        assert_eq!(
            b, a,
            "cache entries {cache_entries}: the idle 4 MiB mapping"
        );
        let s = check(&pool);
        assert_eq!(
            (s.mappings_created, s.reuse_hits, s.reuse_exact_hits),
            (1, 1, 1),
            "cache entries {cache_entries}"
        );
        assert_eq!(sim.call_count(DriverCall::Create), 1);
        // A larger idle mapping has an excess above 0%: not taken.
        pool.free_raw(b).unwrap();
        let c = pool.allocate_raw(G).unwrap();
        assert_ne!(
            c, a,
            "cache entries {cache_entries}: 4 MiB is 100% over 2 MiB"
        );
        let s = check(&pool);
        assert_eq!((s.mappings_created, s.reuse_hits), (2, 1));
        // ... and the exact size is still found afterwards.
        let d = pool.allocate_raw(4 * MIB).unwrap();
        assert_eq!(d, a);
        pool.free_raw(c).unwrap();
        pool.free_raw(d).unwrap();
        pool.trim().unwrap();
        assert_driver_empty(&pool);
    }
}

/// The best-fit bound is the rounded size plus `percent` of it, rounded down: for a
/// 2 MiB request (2,097,152 bytes) at 99% that is 2,097,152 + 2,076,180 bytes, below
/// 4 MiB (4,194,304), so an idle 4 MiB mapping is not taken; at 100% the bound is
/// 4 MiB exactly and it is. (2 MiB is not a multiple of 100: the bound's remainder
/// term, floor(52 * 99 / 100) = 51 bytes, is what a wrong remainder would inflate.)
#[test]
fn best_fit_bound_is_the_rounded_size_plus_its_percent_rounded_down() {
    for cache_entries in [0, 32] {
        for (percent, reused) in [(99, false), (100, true)] {
            let (pool, _sim) = simulated_pool(
                1 << 30,
                PoolConfig {
                    reuse_policy: ReusePolicy::BestFit,
                    best_fit_max_waste_percent: percent,
                    release_threshold_bytes: u64::MAX,
                    thread_cache_entries: cache_entries,
                    ..PoolConfig::default()
                },
            );
            let a = pool.allocate_raw(3 * MIB).unwrap(); // a 4 MiB mapping
            pool.free_raw(a).unwrap();
            let b = pool.allocate_raw(G).unwrap();
            assert_eq!(
                b == a,
                reused,
                "cache entries {cache_entries}, {percent}%: the idle 4 MiB mapping"
            );
            let s = check(&pool);
            assert_eq!(
                (s.mappings_created, s.reuse_hits),
                if reused { (1, 1) } else { (2, 0) },
                "cache entries {cache_entries}, {percent}%"
            );
        }
    }
}
