//! Sixteen threads hammering one pool on the simulated driver (see
//! `tests/common/hammer.rs`): a seeded random mix of allocate, free and scope
//! operations, invariants checked all along, a 60 s watchdog against deadlock, the
//! totals reconciled at the end and the simulated driver left empty.
//!
//! `FLARE_STRESS_OPS` sets the operations per thread (default 100 000).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::hammer::caches::{hammer_caches, CacheParams, Memory, SimMemory};
use common::hammer::{hammer, ops_per_thread, Params};
use common::*;
use flare_package::driver::sim::SimState;
use flare_package::{Pool, PoolConfig, ReusePolicy, SimConfig};

fn params(ops: u64, scope_threads: u64) -> Params {
    Params {
        threads: 16,
        scope_threads,
        ops,
        max_live: 8,
        max_bytes: GIB,
        limit: Duration::from_secs(60),
        captures: false,
        small_sizes: false,
    }
}

/// [`params`] for segment mode: half the requests small (512 B to 1 MiB, the heaps'
/// small class), the rest up to 1 GiB.
fn seg_params(ops: u64, scope_threads: u64) -> Params {
    Params {
        small_sizes: true,
        ..params(ops, scope_threads)
    }
}

/// A segment-mode pool on a simulated device of 16 TiB with release threshold
/// `threshold` bytes.
fn seg_pool(threshold: u64) -> Arc<Pool> {
    let config = PoolConfig {
        release_threshold_bytes: threshold,
        ..PoolConfig::simulated(SimConfig {
            capacity_bytes: 16 << 40,
            ..SimConfig::default()
        })
    }
    .with_policy(ReusePolicy::Segments);
    Arc::new(Pool::new(config).unwrap())
}

/// After a segment-mode run: the books match the driver, which holds only the
/// segments' reservations (no handle, no mapping) until the pool is dropped, and
/// nothing after.
fn seg_end(pool: Arc<Pool>) {
    let s = check(&pool);
    assert!(s.segment_count > 0, "{s:#?}");
    println!(
        "segments: {} held ({} reserved), peak physical {}",
        s.segment_count,
        flare_package::fmt_bytes(s.reserved_bytes),
        flare_package::fmt_bytes(s.peak_physical_bytes)
    );
    assert_driver_empty(&pool);
    let driver = pool.sim_driver().unwrap().clone();
    assert_eq!(driver.state().reservations, s.segment_count);
    let pool = Arc::try_unwrap(pool).unwrap_or_else(|_| panic!("pool still shared"));
    drop(pool);
    assert_eq!(driver.state(), SimState::default());
    assert!(driver.faults().is_empty(), "{:?}", driver.faults());
}

#[test]
fn sixteen_threads_on_the_simulated_driver() {
    // 16 TiB: the mix never runs the device out of memory (up to 16 x 8 live 1 GiB
    // allocations plus what a scope retains).
    let sim = SimConfig {
        capacity_bytes: 16 << 40,
        ..SimConfig::default()
    };
    let pool = Arc::new(Pool::new(PoolConfig::simulated(sim)).unwrap());
    let ops = ops_per_thread(100_000);
    hammer(pool.clone(), params(ops, 4));
    // Quiet now: the books match what the driver holds, and it holds nothing.
    check(&pool);
    assert_driver_empty(&pool);
    let driver = pool.sim_driver().unwrap().clone();
    drop(pool);
    assert_eq!(driver.state(), SimState::default());
}

#[test]
fn sixteen_threads_with_a_release_threshold_and_exact_reuse() {
    // Cached mappings outside scopes (threshold 256 MiB) and exact reuse: the other
    // release path (free releasing over the threshold, with retries collected).
    let config = PoolConfig {
        release_threshold_bytes: 256 * MIB,
        ..PoolConfig::simulated(SimConfig {
            capacity_bytes: 16 << 40,
            ..SimConfig::default()
        })
    }
    .with_policy(ReusePolicy::Exact);
    let pool = Arc::new(Pool::new(config).unwrap());
    let ops = ops_per_thread(100_000) / 2;
    hammer(pool.clone(), params(ops, 2));
    check(&pool);
    assert_driver_empty(&pool);
}

/// Scopes opened and captures begun from one thread while 16 workers free outside
/// any scope (threshold 0: every free releases, with a synchronize): the scope is a
/// barrier, so no capture is ever invalidated (the capture thread asserts it) and no
/// synchronize fails.
#[test]
fn sixteen_threads_releasing_while_another_captures_in_scopes() {
    let sim = SimConfig {
        capacity_bytes: 16 << 40,
        ..SimConfig::default()
    };
    let pool = Arc::new(Pool::new(PoolConfig::simulated(sim)).unwrap());
    let ops = ops_per_thread(100_000);
    let p = Params {
        captures: true,
        ..params(ops, 0)
    };
    hammer(pool.clone(), p);
    assert_eq!(pool.snapshot().sync_failures, 0);
    check(&pool);
    assert_driver_empty(&pool);
}

/// Segment mode (issue 12), threshold 0: the plain mix with scope threads, blocks
/// split, coalesced and grown concurrently, handles released as soon as they are
/// wholly free outside a scope. Every allocation is 512-byte aligned, mapped with
/// access for all its bytes, and overlaps no other live one.
#[test]
fn sixteen_threads_in_segment_mode() {
    let pool = seg_pool(0);
    let ops = ops_per_thread(100_000);
    hammer(pool.clone(), seg_params(ops, 4));
    seg_end(pool);
}

/// Segment mode with a release threshold (256 MiB): free handles cached up to it,
/// released over it by the frees (with retries collected).
#[test]
fn sixteen_threads_in_segment_mode_with_a_release_threshold() {
    let pool = seg_pool(256 * MIB);
    let ops = ops_per_thread(100_000) / 2;
    hammer(pool.clone(), seg_params(ops, 2));
    seg_end(pool);
}

/// Segment mode: scopes opened and captures begun from one thread while 16 workers
/// free outside any scope (threshold 0: every free that leaves a handle wholly free
/// releases it, with a synchronize): no capture is ever invalidated and no
/// synchronize fails.
#[test]
fn sixteen_threads_in_segment_mode_releasing_while_another_captures_in_scopes() {
    let pool = seg_pool(0);
    let ops = ops_per_thread(100_000);
    let p = Params {
        captures: true,
        ..seg_params(ops, 0)
    };
    hammer(pool.clone(), p);
    assert_eq!(pool.snapshot().sync_failures, 0);
    seg_end(pool);
}

// The thread caches (issue 13): sixteen workers each allocating from their own few
// sizes (most allocations served by their thread's cache), a quarter of the frees
// passed to another worker (a free of memory another thread's cache handed out goes
// through its remote list), while a controller begins and finishes scopes, trims
// and checks a snapshot after each step (see `hammer_caches`).

fn cache_params(ops: u64) -> CacheParams {
    CacheParams {
        threads: 16,
        ops,
        max_live: 6,
        sizes: 4,
        max_bytes: 8 * MIB,
        small_sizes: false,
        cross_percent: 25,
        inbox: 256,
        limit: Duration::from_secs(60),
    }
}

/// A pool on a simulated device of 16 TiB with `config`'s settings, and what the
/// cache stress checks each allocation with.
fn cache_pool(config: PoolConfig) -> (Arc<Pool>, Arc<dyn Memory>) {
    let (pool, sim) = simulated_pool(16 << 40, config);
    (Arc::new(pool), Arc::new(SimMemory(sim)))
}

/// After a cache stress: the snapshot taken then and the books against the driver,
/// and the driver empty once the pool is dropped.
fn cache_end(pool: Arc<Pool>) {
    check(&pool);
    assert_driver_empty(&pool);
    let driver = pool.sim_driver().unwrap();
    let pool = Arc::try_unwrap(pool).unwrap_or_else(|_| panic!("pool still shared"));
    drop(pool);
    assert_eq!(driver.state(), SimState::default());
    assert!(driver.faults().is_empty(), "{:?}", driver.faults());
}

/// Whole mappings, release threshold 0: the caches hold memory only inside the
/// controller's scopes; outside, frees release as before. Every allocation either
/// made a mapping or reused one (no out-of-memory on 16 TiB).
#[test]
fn sixteen_threads_through_the_thread_caches() {
    let (pool, memory) = cache_pool(PoolConfig::default());
    let ops = ops_per_thread(100_000);
    let r = hammer_caches(pool.clone(), cache_params(ops), memory);
    let e = r.end;
    assert_eq!(e.allocations, e.reuse_hits + e.mappings_created, "{e:#?}");
    assert!(r.passed > 0);
    cache_end(pool);
}

/// Whole mappings, no release threshold (`u64::MAX`): the caches hold memory
/// outside scopes too, so nearly every allocation is a cache hit and many passed-on
/// frees are remote frees; the controller's trims drain them.
#[test]
fn sixteen_threads_through_the_thread_caches_with_no_threshold() {
    let (pool, memory) = cache_pool(PoolConfig {
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::default()
    });
    let ops = ops_per_thread(100_000);
    let r = hammer_caches(pool.clone(), cache_params(ops), memory);
    let e = r.end;
    assert_eq!(e.allocations, e.reuse_hits + e.mappings_created, "{e:#?}");
    assert!(
        e.remote_frees > 0,
        "no passed-on free was a remote free\n{e:#?}"
    );
    cache_end(pool);
}

/// Segment mode, release threshold 0: half of each worker's sizes are small blocks
/// (cached), the others up to 8 MiB (blocks of the large heap: never cached).
#[test]
fn sixteen_threads_through_the_thread_caches_in_segment_mode() {
    let (pool, memory) = cache_pool(PoolConfig {
        reuse_policy: ReusePolicy::Segments,
        ..PoolConfig::default()
    });
    let ops = ops_per_thread(100_000);
    let p = CacheParams {
        small_sizes: true,
        ..cache_params(ops)
    };
    hammer_caches(pool.clone(), p, memory);
    cache_end(pool);
}
