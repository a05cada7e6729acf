//! Issue 16: a dropped pool's thread caches are let go by the threads that used it
//! (`src/pool/cache/`: a pool's drop retires its caches, "thread-locals let go of
//! its caches" at their next registration). Nothing in the public API shows a
//! thread's caches of a pool that is gone, so this test watches the one thing
//! keeping them would show: the heap. A counting global allocator (the binary's;
//! this test runs alone in a process of its own, `crate::common::own_process`)
//! measures the bytes the process holds.
//!
//! Each cycle makes a pool with thread caches open (release threshold `u64::MAX`),
//! allocates, frees into the thread's cache, allocates again from it (a cache hit:
//! the thread's cache keeps the pointer table's leaf of that address,
//! `src/pool/table.rs` `Tlb`, 512 entries of 40 bytes) and drops the pool. All of
//! it runs on one thread, which keeps a cache of each pool it used until it next
//! registers one: the next cycle's pool lets go of the previous pool's. Kept
//! instead, each dropped pool would leave at least its leaf (20 KiB) and its cache
//! behind: 200 cycles, 4 MiB at least.

use std::sync::atomic::Ordering;

use flare_package::{Pool, PoolConfig, SimConfig};

use crate::common::heap::{Counting, HELD};

/// The thread_cache tests' allocator: it counts what the process holds (each test runs on
/// it; only this one reads the count, alone in its process).
#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: u64 = 1 << 20;

/// One pool used through the calling thread's cache, then dropped.
fn cycle() {
    let pool = Pool::new(PoolConfig {
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::simulated(SimConfig::default())
    })
    .unwrap();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(p).unwrap();
    let q = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(q, p);
    let s = pool.snapshot();
    assert_eq!(s.thread_cache_hits, 1, "{s:#?}");
    pool.free_raw(q).unwrap();
}

#[test]
fn a_dropped_pools_thread_caches_are_let_go() {
    crate::common::own_process::run(
        module_path!(),
        "a_dropped_pools_thread_caches_are_let_go",
        steps,
    );
}

/// The steps of [`a_dropped_pools_thread_caches_are_let_go`], in a process of its own.
fn steps() {
    std::thread::spawn(|| {
        for _ in 0..20 {
            cycle();
        }
        let before = HELD.load(Ordering::SeqCst);
        const CYCLES: i64 = 200;
        for _ in 0..CYCLES {
            cycle();
        }
        let grown = HELD.load(Ordering::SeqCst) - before;
        // Kept caches would be 20 KiB a cycle at least; allow a little for the
        // allocator's and the harness's noise.
        assert!(
            grown < 256 * 1024,
            "the heap grew by {grown} bytes over {CYCLES} dropped pools"
        );
    })
    .join()
    .unwrap();
}
