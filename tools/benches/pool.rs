//! CPU benchmarks of the pool on the simulated driver (criterion).
//!
//! - `reuse/<size>/<idle>`: an allocate + free pair served from an idle mapping (no
//!   driver call), inside a retention scope, with 0, 1k or 100k other idle mappings of
//!   distinct sizes in the reuse index; none of them fits the request's best-fit
//!   window, about half are smaller and half larger (where the size allows), so the
//!   measured size class is found by an ordered lookup among them.
//! - `miss/pool/<size>` and `miss/raw/<size>`: a fresh mapping outside a scope,
//!   created and released through the pool, against the same driver sequence (create,
//!   reserve, map, set access, synchronize, unmap, release, free the reservation)
//!   made directly on the same simulated driver: the ratio is the pool's own overhead.
//! - `replay/<trace>`: the replay of each shipped trace on a fresh pool (parsing
//!   outside the timed loop); throughput in events per second.
//!
//! Run: `cargo bench --bench pool` (see BENCHMARKS.md).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use flare_package::{trace, Pool, PoolConfig, SimConfig, Stream};
use flare_tools::cuda_baseline::raw_mapping_cycle;

const MIB: u64 = 1 << 20;
const GRANULARITY: u64 = 2 * MIB;
const SIZES: [(u64, &str); 3] = [(2 * MIB, "2MiB"), (64 * MIB, "64MiB"), (1024 * MIB, "1GiB")];
const IDLE: [usize; 3] = [0, 1_000, 100_000];

/// A simulated device large enough for 100k idle mappings of distinct sizes (the
/// simulator only counts bytes).
fn big_sim() -> PoolConfig {
    PoolConfig::simulated(SimConfig {
        capacity_bytes: 1 << 62,
        ..SimConfig::default()
    })
}

/// `n` distinct sizes (multiples of the granularity) outside the best-fit window
/// `[size, 2 * size]` of `size`: up to half below it, the rest above it.
fn filler_sizes(size: u64, n: usize) -> Vec<u64> {
    let below_available = (size / GRANULARITY - 1) as usize;
    let below = below_available.min(n / 2);
    let mut out: Vec<u64> = (1..=below as u64).map(|k| size - k * GRANULARITY).collect();
    out.extend((1..=(n - below) as u64).map(|k| 2 * size + k * GRANULARITY));
    out
}

/// A pool inside an open retention scope holding one idle mapping of `size` bytes
/// and `idle` idle mappings of other, distinct sizes that do not fit it.
fn pool_with_idle(size: u64, idle: usize) -> Pool {
    let pool = Pool::new(big_sim()).expect("simulated pool");
    pool.retention_begin().expect("scope");
    let mut ptrs = Vec::with_capacity(idle + 1);
    for s in filler_sizes(size, idle) {
        ptrs.push(pool.allocate_raw(s).expect("filler"));
    }
    ptrs.push(pool.allocate_raw(size).expect("measured mapping"));
    for p in ptrs {
        pool.free_raw(p).expect("free");
    }
    let before = pool.snapshot();
    assert_eq!(before.idle_count, idle as u64 + 1);
    let p = pool.allocate_raw(size).expect("hit");
    pool.free_raw(p).expect("free");
    let after = pool.snapshot();
    assert_eq!(
        after.mappings_created, before.mappings_created,
        "a reuse hit"
    );
    assert_eq!(after.reuse_exact_hits, before.reuse_exact_hits + 1);
    pool
}

fn reuse(c: &mut Criterion) {
    let mut g = c.benchmark_group("reuse");
    for (size, size_name) in SIZES {
        for idle in IDLE {
            // Set up on first use, so that a filtered-out benchmark costs nothing.
            let mut pool: Option<Pool> = None;
            g.bench_with_input(BenchmarkId::new(size_name, idle), &size, |b, &size| {
                let pool = pool.get_or_insert_with(|| pool_with_idle(size, idle));
                b.iter(|| {
                    let p = pool.allocate_raw(black_box(size)).expect("hit");
                    pool.free_raw(p).expect("free");
                })
            });
            if let Some(pool) = pool {
                let s = pool.snapshot();
                assert_eq!(s.mappings_created, idle as u64 + 1, "every pair was a hit");
            }
        }
    }
    g.finish();
}

/// The stream-ordered pair on one simulated stream, outside a scope with the default
/// threshold 0 (so each free counts down to its fence poll): the CPU cost of the
/// bookkeeping, beside `reuse` (the simulated driver's capture query takes its own
/// lock; on the H200, `flare-bench-gpu` measures the pair against
/// `cuMemAllocAsync` + `cuMemFreeAsync`).
fn reuse_async(c: &mut Criterion) {
    let mut g = c.benchmark_group("reuse_async");
    for (size, size_name) in SIZES {
        let mut state: Option<(Pool, Stream)> = None;
        g.bench_with_input(BenchmarkId::new(size_name, 0), &size, |b, &size| {
            let (pool, s) = state.get_or_insert_with(|| {
                let pool = Pool::new(big_sim()).expect("simulated pool");
                let sim = pool.sim_driver().expect("simulated");
                let s = Stream(sim.stream_create().expect("stream"));
                (pool, s)
            });
            b.iter(|| {
                let p = pool.allocate_async_raw(black_box(size), *s).expect("alloc");
                pool.free_async_raw(p, *s).expect("free");
            })
        });
        if let Some((pool, _)) = state {
            let snap = pool.snapshot();
            assert_eq!(
                snap.mappings_created, 1,
                "every pair after the first was a hit"
            );
        }
    }
    g.finish();
}

fn miss(c: &mut Criterion) {
    let mut g = c.benchmark_group("miss");
    for (size, size_name) in SIZES {
        // Outside a scope, release threshold 0: every free releases the mapping.
        let pool = Pool::new(PoolConfig::default()).expect("simulated pool");
        g.bench_with_input(BenchmarkId::new("pool", size_name), &size, |b, &size| {
            b.iter(|| {
                let p = pool.allocate_raw(black_box(size)).expect("miss");
                pool.free_raw(p).expect("free");
            })
        });
        let s = pool.snapshot();
        assert_eq!(
            s.mappings_created, s.mappings_released,
            "every pair was a miss"
        );
        assert_eq!(s.reuse_hits, 0);
        let driver = pool.driver().clone();
        g.bench_with_input(BenchmarkId::new("raw", size_name), &size, |b, &size| {
            b.iter(|| raw_mapping_cycle(driver.as_ref(), black_box(size), &[0]).expect("raw"))
        });
    }
    g.finish();
}

fn replay(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/data")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    files.sort();
    let mut g = c.benchmark_group("replay");
    for file in files {
        let t = trace::parse(&file).expect("trace");
        let name = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        g.throughput(Throughput::Elements(t.len() as u64));
        g.bench_function(name, |b| {
            b.iter_batched(
                || Pool::new(PoolConfig::default()).expect("simulated pool"),
                |pool| {
                    let report = trace::replay(&pool, &t, None).expect("replay");
                    assert_eq!(report.out_of_memory_at_line, None);
                    (pool, report)
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = reuse, reuse_async, miss, replay
}
criterion_main!(benches);
