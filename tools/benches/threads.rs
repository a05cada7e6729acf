//! Allocate/free reuse throughput (pairs per second, all threads together) with 1,
//! 2, 4 and 8 threads on one pool, inside a retention scope: each thread asks for its
//! own size, so every allocation is a reuse hit on that thread's own idle memory
//! (one lock round trip, no driver call) and every free retains it again.
//!
//! - `alloc_free_reuse/threads/<n>`: whole mappings (exact policy), thread `t` asks
//!   for `t` granules.
//! - `alloc_free_reuse/segments-threads/<n>`: segment mode, thread `t` asks for
//!   `t * 4 KiB` (the small heap); the threads' blocks lie in one heap, each between
//!   two live blocks, so a free never coalesces and each thread's allocation is an
//!   exact hit on its own block.
//! - `alloc_free_reuse/shared/<n>` (2 threads: this machine has 2 cores): shared
//!   sizes, cross-thread frees (issue 13). Whole mappings (exact policy); thread `t`
//!   allocates 1, 2, 3, 4 granules in turn and hands each pointer to thread
//!   `(t + 1) % n` through a bounded lock-free queue of [`SHARED_QUEUE`] entries,
//!   and frees what thread `t - 1` hands it: every free is made by another thread
//!   than the allocation. Per iteration each thread allocates once and frees once
//!   (a pair). Pre-warmed with as many mappings of each size as can be live at once,
//!   so that the steady state is reuse; the mappings created, thread-cache hits and
//!   remote frees while measuring are printed after the group.
//!
//! `cargo bench --bench threads` runs on the simulated driver;
//! `FLARE_BENCH_BACKEND=cuda` runs on the real driver (device 0).

use std::sync::Barrier;

use crossbeam_queue::ArrayQueue;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{
    black_box, criterion_group, criterion_main, measurement::WallTime, BenchmarkGroup, BenchmarkId,
    Criterion, Throughput,
};
use flare_package::{Pool, PoolConfig, ReusePolicy};

const THREADS: [u64; 4] = [1, 2, 4, 8];
/// Thread counts of the shared-sizes benchmark.
const SHARED_THREADS: [u64; 1] = [2];
/// Granules of the shared sizes, taken in turn by every thread.
const SHARED_GRANULES: [u64; 4] = [1, 2, 3, 4];
/// Entries of each thread's outgoing queue (shared sizes).
const SHARED_QUEUE: usize = 16;
/// The most allocations of one shared size that one thread's allocations can have
/// live at once: a full queue of consecutive allocations of the cycle holds at most
/// `ceil(SHARED_QUEUE / 4)` of one size, plus one between an allocation and its
/// push, and one between the next thread's pop and its free.
const SHARED_LIVE_PER_SIZE: usize = SHARED_QUEUE.div_ceil(SHARED_GRANULES.len()) + 2;

fn config(policy: ReusePolicy) -> PoolConfig {
    let config = match std::env::var("FLARE_BENCH_BACKEND").as_deref() {
        Ok("cuda") => PoolConfig::cuda(0),
        Ok("sim") | Err(_) => PoolConfig::default(),
        Ok(other) => panic!("FLARE_BENCH_BACKEND={other}: expected sim or cuda"),
    };
    config.with_policy(policy)
}

/// Measures `name/<n>` for every thread count: thread `t` (from 1) runs pairs of
/// `size_of(t)` bytes on `pool`.
fn measure(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    pool: &Pool,
    size_of: impl Fn(u64) -> u64 + Sync,
) {
    for n in THREADS {
        group.throughput(Throughput::Elements(n));
        group.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let barrier = Barrier::new(n as usize + 1);
                thread::scope(|s| {
                    for t in 1..=n {
                        let (pool, barrier, size) = (pool, &barrier, size_of(t));
                        s.spawn(move || {
                            barrier.wait();
                            for _ in 0..iters {
                                let p = pool.allocate_raw(size).unwrap();
                                pool.free_raw(black_box(p)).unwrap();
                            }
                            barrier.wait();
                        });
                    }
                    barrier.wait();
                    let start = Instant::now();
                    barrier.wait();
                    start.elapsed()
                })
            })
        });
    }
}

/// Measures `shared/<n>`: thread `t` of `n` allocates `sizes` in turn, each handed
/// to thread `(t + 1) % n`, which frees it; per iteration every thread allocates
/// once and frees once.
fn measure_shared(group: &mut BenchmarkGroup<'_, WallTime>, pool: &Pool, sizes: &[u64]) {
    for n in SHARED_THREADS {
        group.throughput(Throughput::Elements(n));
        group.bench_with_input(BenchmarkId::new("shared", n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let n = n as usize;
                // `queues[t]`: what thread t frees, pushed by thread t - 1.
                let queues: Vec<ArrayQueue<u64>> =
                    (0..n).map(|_| ArrayQueue::new(SHARED_QUEUE)).collect();
                let barrier = Barrier::new(n + 1);
                thread::scope(|s| {
                    for t in 0..n {
                        let (pool, barrier) = (pool, &barrier);
                        let (inbox, outbox) = (&queues[t], &queues[(t + 1) % n]);
                        s.spawn(move || {
                            barrier.wait();
                            let (mut allocated, mut freed) = (0u64, 0u64);
                            // Thread t - 1 pushes exactly `iters`: both counts end.
                            while allocated < iters || freed < iters {
                                let mut progressed = false;
                                if freed < iters {
                                    if let Some(p) = inbox.pop() {
                                        pool.free_raw(black_box(p)).unwrap();
                                        freed += 1;
                                        progressed = true;
                                    }
                                }
                                if allocated < iters && !outbox.is_full() {
                                    let size = sizes[(t + allocated as usize) % sizes.len()];
                                    outbox.push(pool.allocate_raw(size).unwrap()).unwrap();
                                    allocated += 1;
                                    progressed = true;
                                }
                                if !progressed {
                                    thread::yield_now();
                                }
                            }
                            barrier.wait();
                        });
                    }
                    barrier.wait();
                    let start = Instant::now();
                    barrier.wait();
                    start.elapsed()
                })
            })
        });
    }
}

fn threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free_reuse");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    let max = *THREADS.iter().max().unwrap_or(&1);

    // Whole mappings: one idle mapping per thread, of that thread's size.
    let pool = Pool::new(config(ReusePolicy::Exact))
        .unwrap_or_else(|e| panic!("cannot create the pool: {e}"));
    let g = pool.granularity();
    pool.retention_begin().unwrap();
    let ptrs: Vec<_> = (1..=max)
        .map(|t| pool.allocate_raw(t * g).unwrap())
        .collect();
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    measure(&mut group, "threads", &pool, |t| t * g);
    let s = pool.snapshot();
    assert_eq!(s.mappings_created, max, "every allocation was a reuse hit");
    pool.retention_finish().unwrap();
    drop(pool);

    // Segment mode: [live][thread 1's block][live][thread 2's block]...[live].
    const KIB: u64 = 1 << 10;
    let pool = Pool::new(config(ReusePolicy::Segments))
        .unwrap_or_else(|e| panic!("cannot create the pool: {e}"));
    pool.retention_begin().unwrap();
    let mut live = vec![pool.allocate_raw(512).unwrap()];
    let mut blocks = Vec::new();
    for t in 1..=max {
        blocks.push(pool.allocate_raw(t * 4 * KIB).unwrap());
        live.push(pool.allocate_raw(512).unwrap());
    }
    for p in blocks {
        pool.free_raw(p).unwrap();
    }
    let created = pool.snapshot().mappings_created;
    measure(&mut group, "segments-threads", &pool, |t| t * 4 * KIB);
    let s = pool.snapshot();
    assert_eq!(
        s.mappings_created, created,
        "every allocation was a reuse hit"
    );
    assert_eq!(s.reuse_forced_hits, 0);
    for p in live {
        pool.free_raw(p).unwrap();
    }
    pool.retention_finish().unwrap();
    drop(pool);

    // Shared sizes, cross-thread frees.
    let pool = Pool::new(config(ReusePolicy::Exact))
        .unwrap_or_else(|e| panic!("cannot create the pool: {e}"));
    let g = pool.granularity();
    let sizes = SHARED_GRANULES.map(|k| k * g);
    pool.retention_begin().unwrap();
    let max = *SHARED_THREADS.iter().max().unwrap_or(&1) as usize;
    // On a helper thread, joined: whatever it caches goes back to the pool when it
    // exits.
    thread::scope(|s| {
        s.spawn(|| {
            let held: Vec<_> = sizes
                .iter()
                .flat_map(|&size| std::iter::repeat_n(size, max * SHARED_LIVE_PER_SIZE))
                .map(|size| pool.allocate_raw(size).unwrap())
                .collect();
            for p in held {
                pool.free_raw(p).unwrap();
            }
        })
        .join()
        .unwrap();
    });
    let before = pool.snapshot();
    measure_shared(&mut group, &pool, &sizes);
    let after = pool.snapshot();
    eprintln!(
        "shared: {} mappings created while measuring, {} thread-cache hits, {} remote frees",
        after.mappings_created - before.mappings_created,
        after.thread_cache_hits - before.thread_cache_hits,
        after.remote_frees - before.remote_frees,
    );
    assert_eq!(after.live_count, 0, "every allocation was freed");
    pool.retention_finish().unwrap();
    group.finish();
}

criterion_group!(benches, threads);
criterion_main!(benches);
