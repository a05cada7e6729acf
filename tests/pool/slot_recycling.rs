//! Issue 16: the pool's books recycle the slots of released mappings. Nothing in the
//! public API shows the slot table (the snapshot counts mappings, not slots), so this
//! test watches the one thing a leak of slots would show: the heap. A counting
//! global allocator (the binary's; this test runs alone in a process of its own,
//! `crate::common::own_process`) measures the bytes the process holds; after a
//! warmup, many more allocate / free / scope / trim cycles must not make it grow.
//! Each cycle creates and releases mappings; if a released slot were never reused
//! (or never marked free), the books would grow by one slot per mapping created.
//!
//! Thread caches are off: their pointer table keeps a node per address range first
//! used until the pool is dropped (by design, `src/pool/table.rs`), and the simulated
//! driver never hands out an address twice, so with caches on the heap grows for a
//! reason that is not a slot.

use std::sync::atomic::Ordering;

use flare_package::{Pool, PoolConfig, ReusePolicy, SimConfig};

use crate::common::heap::{Counting, HELD};

/// The pool tests' allocator: it counts what the process holds (each test runs on
/// it; only this one reads the count, alone in its process).
#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: u64 = 1 << 20;

fn pool(threshold: u64, policy: ReusePolicy) -> Pool {
    Pool::new(PoolConfig {
        release_threshold_bytes: threshold,
        thread_cache_entries: 0,
        reuse_policy: policy,
        ..PoolConfig::simulated(SimConfig::default())
    })
    .unwrap()
}

/// One cycle on each pool: mappings created and released by a free over the
/// threshold, by a scope's finish, and by trim.
fn cycle(release_at_once: &Pool, cached: &Pool, i: u64) {
    let a = release_at_once.allocate_raw(2 * MIB).unwrap();
    let b = release_at_once
        .allocate_raw((2 + 2 * (i % 3)) * MIB)
        .unwrap();
    release_at_once.free_raw(a).unwrap();
    release_at_once.free_raw(b).unwrap();
    release_at_once.retention_begin().unwrap();
    let c = release_at_once.allocate_raw(6 * MIB).unwrap();
    release_at_once.free_raw(c).unwrap();
    release_at_once.retention_finish().unwrap();

    let d = cached.allocate_raw(4 * MIB).unwrap();
    let e = cached.allocate_raw((8 + 2 * (i % 2)) * MIB).unwrap();
    cached.free_raw(d).unwrap();
    cached.free_raw(e).unwrap();
    cached.trim().unwrap();
}

#[test]
fn released_slots_are_recycled() {
    crate::common::own_process::run(module_path!(), "released_slots_are_recycled", steps);
}

/// The steps of [`released_slots_are_recycled`], in a process of its own.
fn steps() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Exact, ReusePolicy::None] {
        let at_once = pool(0, policy);
        let cached = pool(u64::MAX, policy);
        for i in 0..500 {
            cycle(&at_once, &cached, i);
        }
        let before = HELD.load(Ordering::SeqCst);
        const CYCLES: u64 = 20_000;
        for i in 0..CYCLES {
            cycle(&at_once, &cached, i);
        }
        let after = HELD.load(Ordering::SeqCst);
        for p in [&at_once, &cached] {
            let s = p.snapshot();
            assert_eq!(s.check_invariants(), Ok(()));
            assert_eq!((s.live_count, s.idle_count, s.physical_bytes), (0, 0, 0));
            // 5 mappings per cycle over both pools: 3 and 2.
            assert!(
                s.mappings_created >= 2 * (CYCLES + 500),
                "{policy:?}: {s:#?}"
            );
            assert_eq!(s.mappings_created, s.mappings_released);
        }
        // 100,000 mappings made and released: a slot kept per mapping would be
        // megabytes. Allow a little for the allocator's and the harness's noise.
        let grown = after - before;
        assert!(
            grown < 64 * 1024,
            "{policy:?}: the heap grew by {grown} bytes over {CYCLES} cycles"
        );
    }
}
