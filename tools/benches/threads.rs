//! Allocate/free reuse throughput (pairs per second, all threads together) with 1,
//! 2, 4 and 8 threads on one pool, inside a retention scope: each thread asks for its
//! own size, so every allocation is a reuse hit on that thread's own idle mapping
//! (one lock round trip, no driver call) and every free retains it again.
//!
//! `cargo bench --bench threads` runs on the simulated driver;
//! `FLARE_BENCH_BACKEND=cuda` runs on the real driver (device 0).

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flare_package::{Pool, PoolConfig, ReusePolicy};

fn config() -> PoolConfig {
    let config = match std::env::var("FLARE_BENCH_BACKEND").as_deref() {
        Ok("cuda") => PoolConfig::cuda(0),
        Ok("sim") | Err(_) => PoolConfig::default(),
        Ok(other) => panic!("FLARE_BENCH_BACKEND={other}: expected sim or cuda"),
    };
    config.with_policy(ReusePolicy::Exact)
}

fn threads(c: &mut Criterion) {
    let pool = Pool::new(config()).unwrap_or_else(|e| panic!("cannot create the pool: {e}"));
    let g = pool.granularity();
    pool.retention_begin().unwrap();
    // One idle mapping per thread, of that thread's size.
    let ptrs: Vec<_> = (1..=8).map(|t| pool.allocate_raw(t * g).unwrap()).collect();
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    let mut group = c.benchmark_group("alloc_free_reuse");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    for n in [1u64, 2, 4, 8] {
        group.throughput(Throughput::Elements(n));
        group.bench_with_input(BenchmarkId::new("threads", n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let barrier = Barrier::new(n as usize + 1);
                thread::scope(|s| {
                    for t in 1..=n {
                        let (pool, barrier) = (&pool, &barrier);
                        s.spawn(move || {
                            barrier.wait();
                            for _ in 0..iters {
                                let p = pool.allocate_raw(t * g).unwrap();
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
    group.finish();
    let s = pool.snapshot();
    assert_eq!(s.mappings_created, 8, "every allocation was a reuse hit");
    pool.retention_finish().unwrap();
}

criterion_group!(benches, threads);
criterion_main!(benches);
