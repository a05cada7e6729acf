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
//!
//! `cargo bench --bench threads` runs on the simulated driver;
//! `FLARE_BENCH_BACKEND=cuda` runs on the real driver (device 0).

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{
    black_box, criterion_group, criterion_main, measurement::WallTime, BenchmarkGroup, BenchmarkId,
    Criterion, Throughput,
};
use flare_package::{Pool, PoolConfig, ReusePolicy};

const THREADS: [u64; 4] = [1, 2, 4, 8];

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
    group.finish();
}

criterion_group!(benches, threads);
criterion_main!(benches);
