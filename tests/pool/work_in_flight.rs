//! Work in flight on the simulated driver: every allocation is read by "work" until
//! the next synchronize (`SimDriver::mark_busy`). Over a long random sequence of
//! allocations, frees outside and inside scopes, trims, finishes, aborts and graph
//! captures (during which a synchronize is refused), the pool never unmaps a busy
//! range: `faults()` stays empty.

use crate::common;

use common::{check, MIB};
use flare_package::{DevicePtr, Error, Pool, PoolConfig, ReusePolicy};

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn busy_ranges_are_never_unmapped_over_a_long_random_sequence() {
    for (seed, policy, threshold) in [
        (1u64, ReusePolicy::BestFit, 0u64),
        (2, ReusePolicy::Exact, 64 * MIB),
        (3, ReusePolicy::None, 0),
    ] {
        let pool = Pool::new(PoolConfig {
            reuse_policy: policy,
            release_threshold_bytes: threshold,
            ..PoolConfig::default()
        })
        .unwrap();
        let sim = pool.sim_driver().unwrap().clone();
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut live: Vec<DevicePtr> = Vec::new();
        let mut scope = false;
        let (mut captures, mut released_while_busy_refused) = (0u64, 0u64);
        for step in 0..100_000u32 {
            match rng.below(100) {
                0..=39 if live.len() < 48 => {
                    let max = if rng.below(8) == 0 { 1 << 30 } else { 64 * MIB };
                    let bytes = 1 + rng.below(max);
                    match pool.allocate_raw(bytes) {
                        Ok(p) => {
                            sim.mark_busy(p, bytes);
                            live.push(p);
                        }
                        Err(Error::OutOfMemory { .. }) => {}
                        Err(e) => panic!("step {step}: {e}"),
                    }
                }
                0..=79 if !live.is_empty() => {
                    let i = rng.below(live.len() as u64) as usize;
                    pool.free_raw(live.swap_remove(i)).unwrap();
                }
                80..=84 if !scope => {
                    pool.retention_begin().unwrap();
                    scope = true;
                }
                85..=89 if scope => {
                    let r = if rng.below(4) == 0 {
                        pool.retention_abort()
                    } else {
                        pool.retention_finish()
                    };
                    released_while_busy_refused += u64::from(r.is_err());
                    scope = false;
                }
                90..=93 if !scope => {
                    released_while_busy_refused += u64::from(pool.trim().is_err());
                }
                94..=95 => {
                    // A graph capture opens or closes elsewhere: synchronize is refused
                    // while it is open.
                    if sim.is_capturing() {
                        sim.end_capture();
                    } else {
                        sim.begin_capture();
                        captures += 1;
                    }
                }
                _ => {}
            }
            if step % 16 == 0 {
                check(&pool);
            }
            assert!(sim.faults().is_empty(), "step {step}: {:?}", sim.faults());
        }
        if sim.is_capturing() {
            sim.end_capture();
        }
        let s = check(&pool);
        assert!(
            captures > 100 && s.sync_failures > 100,
            "captures exercised: {s:?}"
        );
        assert!(released_while_busy_refused > 0);
        assert!(s.mappings_released > 1000, "{s:?}");
        drop(pool);
        assert!(sim.faults().is_empty(), "{:?}", sim.faults());
        assert_eq!(sim.state(), Default::default());
    }
}
