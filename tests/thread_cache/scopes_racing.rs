//! Scopes racing allocations on other threads, whole mappings and segments.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::caching::invariants;
use crate::common;
use common::{assert_driver_empty, check, simulated_pool, GIB, MIB};
use flare_package::{PoolConfig, ReusePolicy};
use std::thread;

/// A small deterministic generator (xorshift), one per thread.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Worker threads allocate and free (raw and through guards, up to `hold` live
/// each) while another thread begins, finishes and aborts scopes and another takes
/// snapshots, each checked against the invariants. At the end everything was freed
/// once: the books match the driver, and a trim leaves the driver empty.
fn scopes_racing(policy: ReusePolicy, threshold: u64) {
    let (pool, _sim) = simulated_pool(
        4 * GIB,
        PoolConfig {
            reuse_policy: policy,
            release_threshold_bytes: threshold,
            thread_cache_entries: 8,
            ..PoolConfig::default()
        },
    );
    let unit = if policy.is_segments() {
        16 << 10
    } else {
        2 * MIB
    };
    let workers = 4;
    let ops = 3000;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (mut finished, mut aborted) = (0u64, 0u64);
    thread::scope(|t| {
        let mut handles = Vec::new();
        for w in 0..workers {
            let pool = &pool;
            handles.push(t.spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (w + 1));
                let mut raw: Vec<u64> = Vec::new();
                let mut guards = Vec::new();
                for _ in 0..ops {
                    let bytes = unit * (1 + rng.below(4));
                    match rng.below(4) {
                        0 | 1 if raw.len() < 4 => raw.push(pool.allocate_raw(bytes).unwrap()),
                        2 if guards.len() < 4 => guards.push(pool.allocate(bytes).unwrap()),
                        0 | 1 if !raw.is_empty() => {
                            let p = raw.swap_remove(rng.below(raw.len() as u64) as usize);
                            pool.free_raw(p).unwrap();
                        }
                        _ if !guards.is_empty() => {
                            guards.swap_remove(rng.below(guards.len() as u64) as usize);
                        }
                        _ => {}
                    }
                }
                for p in raw {
                    pool.free_raw(p).unwrap();
                }
            }));
        }
        let scopes = {
            let (pool, stop) = (&pool, &stop);
            t.spawn(move || {
                let (mut f, mut a) = (0u64, 0u64);
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    match i % 3 {
                        0 => {
                            let s = pool.retention_scope().unwrap();
                            thread::yield_now();
                            drop(s); // aborted
                            a += 1;
                        }
                        1 => {
                            pool.retention_begin().unwrap();
                            thread::yield_now();
                            pool.retention_finish().unwrap();
                            f += 1;
                        }
                        _ => {
                            pool.retention_begin().unwrap();
                            pool.retention_abort().unwrap();
                            a += 1;
                        }
                    }
                    invariants(pool);
                }
                (f, a)
            })
        };
        {
            let (pool, stop) = (&pool, &stop);
            t.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    invariants(pool);
                }
            });
        }
        for h in handles {
            h.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (finished, aborted) = scopes.join().unwrap();
    });
    let s = check(&pool);
    assert!(!s.scope_open);
    assert_eq!((s.scopes_finished, s.scopes_aborted), (finished, aborted));
    assert_eq!(s.live_count, 0, "every allocation freed once");
    assert_eq!(s.allocations, s.frees);
    assert!(s.thread_cache_hits <= s.reuse_hits);
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.thread_cache_count, s.thread_cache_bytes), (0, 0));
    assert_eq!(
        (s.physical_bytes, s.idle_bytes, s.block_free_bytes),
        (0, 0, 0)
    );
    assert_driver_empty(&pool);
}

#[test]
fn scopes_racing_allocations_whole_mappings() {
    scopes_racing(ReusePolicy::BestFit, 0);
    scopes_racing(ReusePolicy::Exact, u64::MAX);
}

#[test]
fn scopes_racing_allocations_segments() {
    scopes_racing(ReusePolicy::Segments, 0);
    scopes_racing(ReusePolicy::Segments, u64::MAX);
}
