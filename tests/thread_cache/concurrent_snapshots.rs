//! Thread caches (issue 13): snapshots taken while eight threads run allocate/free
//! pairs through their caches stay consistent.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use crate::caching::{default_pool, released_once, G};
use common::{check, MIB};
use flare_package::Snapshot;

/// Sets its flag when its thread unwinds (so that threads waiting on it stop).
struct PanicFlag<'a>(&'a AtomicBool);

impl Drop for PanicFlag<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// Sets its flag when dropped, on a panic's unwinding too.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Eight threads each run allocate/free pairs of their own size in a scope while
/// another takes snapshots: every snapshot satisfies the invariants (and the
/// counters only grow); once all stop, the snapshot is exact, every counter: each
/// thread's first allocation made its mapping, every later one was a cache hit.
#[test]
fn snapshots_while_eight_threads_run_pairs() {
    const THREADS: u64 = 8;
    const PAIRS: u64 = 200_000;
    let (pool, sim) = default_pool();
    pool.retention_begin().unwrap();
    // Sizes 2, 4, .. 16 MiB; asked 1000 bytes less (rounded up again).
    let size = |i: u64| (i + 1) * 2 * MIB;
    let stop = AtomicBool::new(false);
    // Every thread makes its first allocation before any frees one: a miss takes
    // what fits from every cache before it creates memory, so a late thread's first
    // 14 MiB would take an early thread's idle 16 MiB (14 % waste) and the early
    // thread would then create another. Nor does a thread exit before every one
    // started (its cache would be adopted). Unless one panicked.
    let started = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let checks = thread::scope(|t| {
        let checker = t.spawn(|| {
            let mut n = 0u64;
            let mut last = pool.snapshot();
            while !stop.load(Ordering::Relaxed) {
                let s = pool.snapshot();
                if let Err(e) = s.check_invariants() {
                    panic!("invariant broken while running: {e}\n{s:#?}");
                }
                assert!(s.allocations >= last.allocations && s.frees >= last.frees);
                assert!(s.thread_cache_hits >= last.thread_cache_hits);
                assert!(s.live_count <= THREADS && s.mappings_created <= THREADS);
                assert_eq!(s.mappings_released, 0);
                last = s;
                n += 1;
            }
            n
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|i| {
                let (pool, started, failed) = (&pool, &started, &failed);
                t.spawn(move || {
                    let _flag = PanicFlag(failed);
                    let first = pool.allocate_raw(size(i) - 1000).unwrap();
                    started.fetch_add(1, Ordering::SeqCst);
                    while started.load(Ordering::SeqCst) < THREADS && !failed.load(Ordering::SeqCst)
                    {
                        thread::yield_now();
                    }
                    pool.free_raw(first).unwrap();
                    for _ in 1..PAIRS {
                        let p = pool.allocate_raw(size(i) - 1000).unwrap();
                        assert_eq!(p, first, "thread {i}: its own mapping every time");
                        pool.free_raw(p).unwrap();
                    }
                    while started.load(Ordering::SeqCst) < THREADS && !failed.load(Ordering::SeqCst)
                    {
                        thread::yield_now();
                    }
                })
            })
            .collect();
        // Stops the checker on the way out, a worker's panic included (else the
        // scope would wait for the checker for ever).
        let stop_checker = StopOnDrop(&stop);
        for w in workers {
            w.join().unwrap();
        }
        drop(stop_checker);
        checker.join().unwrap()
    });
    assert!(checks > 0);
    let s = check(&pool);
    let total: u64 = (0..THREADS).map(size).sum();
    let largest = size(THREADS - 1);
    assert!(
        s.peak_live_mapped_bytes >= largest && s.peak_live_mapped_bytes <= total,
        "{s:#?}"
    );
    let want = Snapshot {
        scope_open: true,
        granularity_bytes: G,
        idle_count: THREADS,
        idle_bytes: total,
        physical_bytes: total,
        reserved_bytes: total,
        peak_physical_bytes: total,
        peak_live_mapped_bytes: s.peak_live_mapped_bytes,
        allocations: THREADS * PAIRS,
        frees: THREADS * PAIRS,
        reuse_hits: THREADS * (PAIRS - 1),
        reuse_exact_hits: THREADS * (PAIRS - 1),
        mappings_created: THREADS,
        thread_cache_count: THREADS,
        thread_cache_bytes: total,
        thread_cache_hits: THREADS * (PAIRS - 1),
        ..Snapshot::default()
    };
    assert_eq!(s, want);
    println!("{checks} snapshots checked while running");
    pool.retention_finish().unwrap();
    released_once(&pool, &sim);
}
