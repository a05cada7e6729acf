//! `Allocation` guards: a guard frees its own allocation when dropped (also one a
//! thread cache handed out), never the address reused after a `free_raw` of it.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::out_of_memory::small_pool;
use common::{assert_driver_empty, check, simulated_pool, MIB};
use flare_package::{DriverCall, Error, PoolConfig};

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// `Allocation` (guards.rs): "dropping the guard frees the pointer only while it is
/// still this allocation (not after a `free_raw` of it and a later allocation that
/// reused the address)". Without thread caches (the books' path): a guard whose
/// address was freed with `free_raw` and handed out again frees nothing on drop; the
/// new allocation stays live and is freed once, by its owner.
#[test]
fn a_stale_guard_does_not_free_the_reused_address() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            thread_cache_entries: 0,
            thread_cache_bytes: 0,
            // Idle memory is kept (not released at the free), so the address is
            // reused.
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let a = pool.allocate(3 * MIB).unwrap();
    let p = a.ptr();
    pool.free_raw(p).unwrap();
    // Best fit reuses the idle mapping of the same size: the same address.
    let b = pool.allocate_raw(3 * MIB).unwrap();
    assert_eq!(b, p);
    assert_eq!(pool.snapshot().reuse_hits, 1);
    drop(a);
    let s = check(&pool);
    assert_eq!(
        (s.live_count, s.frees),
        (1, 1),
        "the stale drop freed nothing"
    );
    assert_eq!(s.live_mapped_bytes, 2 * G);
    // Still live: its owner frees it, once.
    pool.free_raw(b).unwrap();
    assert!(matches!(
        pool.free_raw(b),
        Err(Error::UnknownPointer { ptr }) if ptr == b
    ));
    let s = check(&pool);
    assert_eq!((s.live_count, s.frees), (0, 2));
    assert_eq!(sim.call_count(DriverCall::Create), 1);
}

/// `Allocation` (`Pool::allocate`'s guard) frees its allocation when dropped, also
/// one a thread cache handed out (a hit: its guard's id is the cache's allocation
/// key): after the drop nothing is live and the mapping is cached again.
#[test]
fn a_guard_of_a_thread_cache_hit_frees_it_when_dropped() {
    let (pool, _sim) = small_pool(32);
    let a = pool.allocate(2 * MIB).unwrap();
    let p = a.ptr();
    drop(a);
    let b = pool.allocate(2 * MIB).unwrap();
    assert_eq!(b.ptr(), p);
    assert_eq!(check(&pool).thread_cache_hits, 1);
    drop(b);
    let s = check(&pool);
    assert_eq!(
        (s.live_count, s.idle_count, s.thread_cache_count),
        (0, 1, 1)
    );
    let c = pool.allocate(2 * MIB).unwrap();
    assert_eq!(c.ptr(), p, "cached again: a second hit");
    assert_eq!(check(&pool).thread_cache_hits, 2);
    drop(c);
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}
