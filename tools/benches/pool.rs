//! CPU benchmarks of the pool on the simulated driver (criterion).
//!
//! - `reuse/<size>/<idle>` (best-fit, whole mappings): an allocate + free pair served
//!   from an idle mapping (no driver call), inside a retention scope, with 0, 1k or
//!   100k other idle mappings of distinct sizes in the reuse index; none of them fits
//!   the request's best-fit window, about half are smaller and half larger (where the
//!   size allows), so the measured size class is found by an ordered lookup among
//!   them. Sizes below the granularity (4 KiB, 512 KiB) take a whole 2 MiB mapping.
//! - `reuse/segments-<size>/<n>` (segment mode): the same pair inside a retention
//!   scope, served from a free block of exactly the size lying between two live
//!   blocks (no split, no coalescing), in a heap holding `n` other live blocks and `n`
//!   other free blocks (holes between live blocks, so they never coalesce) of
//!   distinct sizes that do not fit (outside `[size, 2 * size]`); their size classes
//!   share the free index with the measured one. `reuse/segments-split-<size>/<n>`:
//!   the same, but the free block is twice the size: the allocation splits it and
//!   the free coalesces the two halves again (two slot bookings per pair).
//! - `reuse_async/<size>/0` and `reuse_async/segments-<size>/0`: the stream-ordered
//!   pair (`allocate_async_raw` + `free_async_raw`) on one simulated stream outside a
//!   scope with release threshold 0, best-fit and segment mode; in segment mode the
//!   block lies between two live blocks of the stream's heap, so its handle never
//!   becomes wholly free (which the threshold would release).
//! - `miss/pool/<size>` and `miss/raw/<size>`: a fresh mapping outside a scope,
//!   created and released through the pool, against the same driver sequence (create,
//!   reserve, map, set access, synchronize, unmap, release, free the reservation)
//!   made directly on the same simulated driver: the ratio is the pool's own overhead.
//! - `history/<2MiB|segments-4KiB>/<off|on>`: the pairs of `reuse/2MiB/0` and
//!   `reuse/segments-4KiB/0` with the history ring off and on (issue 38), in one run.
//! - `replay/<policy>/<trace>`: the replay of each shipped trace on a fresh pool of
//!   each policy (best-fit, segments; parsing and the pool's creation outside the
//!   timed loop, its drop too); throughput in events per second.
//!
//! Run: `cargo bench --bench pool` (see docs/benchmarks.md).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use flare_package::{trace, DevicePtr, Pool, PoolConfig, ReusePolicy, SimConfig, Stream};
use flare_tools::cuda_baseline::raw_mapping_cycle;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GRANULARITY: u64 = 2 * MIB;
/// Best-fit's sizes: the whole-mapping sizes, and the small sizes of segment mode
/// (which best-fit rounds up to one 2 MiB mapping).
const SIZES: [(u64, &str); 5] = [
    (4 * KIB, "4KiB"),
    (512 * KIB, "512KiB"),
    (2 * MIB, "2MiB"),
    (64 * MIB, "64MiB"),
    (1024 * MIB, "1GiB"),
];
/// Segment mode's sizes: small-heap (up to 1 MiB) and large-heap requests.
const SEGMENT_SIZES: [(u64, &str); 4] = [
    (4 * KIB, "4KiB"),
    (512 * KIB, "512KiB"),
    (2 * MIB, "2MiB"),
    (64 * MIB, "64MiB"),
];
/// The fresh-mapping sizes (whole mappings).
const MISS_SIZES: [(u64, &str); 3] = [(2 * MIB, "2MiB"), (64 * MIB, "64MiB"), (1024 * MIB, "1GiB")];
const IDLE: [usize; 3] = [0, 1_000, 100_000];
/// Segment mode's block rounding (bytes), PyTorch's.
const BLOCK_ROUND: u64 = 512;
/// Segment mode: the largest request of a heap's small class (bytes).
const SMALL_MAX: u64 = MIB;

/// A simulated device large enough for 100k idle mappings of distinct sizes (the
/// simulator only counts bytes).
fn big_sim() -> PoolConfig {
    PoolConfig::simulated(SimConfig {
        capacity_bytes: 1 << 62,
        ..SimConfig::default()
    })
}

/// `n` distinct sizes (multiples of the granularity) outside the best-fit window
/// `[rounded, 2 * rounded]` of `size` rounded to the granularity: up to half below
/// it, the rest above it.
fn filler_sizes(size: u64, n: usize) -> Vec<u64> {
    let size = size.div_ceil(GRANULARITY) * GRANULARITY;
    let below_available = (size / GRANULARITY - 1) as usize;
    let below = below_available.min(n / 2);
    let mut out: Vec<u64> = (1..=below as u64).map(|k| size - k * GRANULARITY).collect();
    out.extend((1..=(n - below) as u64).map(|k| 2 * size + k * GRANULARITY));
    out
}

/// A pool inside an open retention scope holding one idle mapping of `size` bytes
/// and `idle` idle mappings of other, distinct sizes that do not fit it.
fn pool_with_idle(size: u64, idle: usize) -> Pool {
    pool_with_idle_on(big_sim(), size, idle)
}

/// [`pool_with_idle`] with `config`.
fn pool_with_idle_on(config: PoolConfig, size: u64, idle: usize) -> Pool {
    let pool = Pool::new(config).expect("simulated pool");
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

/// Sizes (multiples of 512 bytes) of the heap class of `size` (at most 1 MiB, or
/// above it) outside `[size, 2 * size]`, cycled to `n` values: up to 2,048
/// distinct size classes, from the class's smallest size upwards (the large class:
/// up to 4 MiB above 1 MiB).
fn hole_sizes(size: u64, n: usize) -> Vec<u64> {
    let (lo, hi) = if size <= SMALL_MAX {
        (BLOCK_ROUND, SMALL_MAX)
    } else {
        (SMALL_MAX + BLOCK_ROUND, SMALL_MAX + 8 * SMALL_MAX)
    };
    let classes: Vec<u64> = (lo / BLOCK_ROUND..=hi / BLOCK_ROUND)
        .map(|k| k * BLOCK_ROUND)
        .filter(|&s| s < size || s > 2 * size)
        .take(2_048)
        .collect();
    assert!(!classes.is_empty());
    classes.iter().copied().cycle().take(n).collect()
}

/// A live block's size in the heap class of `size` (the smallest of the class).
fn live_filler(size: u64) -> u64 {
    if size <= SMALL_MAX {
        BLOCK_ROUND
    } else {
        SMALL_MAX + BLOCK_ROUND
    }
}

/// A segment-mode pool inside an open retention scope whose synchronous heap (the
/// class of `size`) holds `n` live blocks with a free block (a hole of a size from
/// [`hole_sizes`]) after each, then a free block of `free` bytes between two live
/// blocks; `size` bytes are then served from that block.
fn segments_with_holes(size: u64, free: u64, n: usize) -> Pool {
    segments_with_holes_on(big_sim(), size, free, n)
}

/// [`segments_with_holes`] with `config` (its policy set to segments).
fn segments_with_holes_on(config: PoolConfig, size: u64, free: u64, n: usize) -> Pool {
    let pool = Pool::new(config.with_policy(ReusePolicy::Segments)).expect("simulated pool");
    pool.retention_begin().expect("scope");
    let filler = live_filler(size);
    let mut holes: Vec<DevicePtr> = Vec::with_capacity(n + 1);
    let mut live = Vec::with_capacity(n + 2);
    for h in hole_sizes(size, n) {
        live.push(pool.allocate_raw(filler).expect("live filler"));
        holes.push(pool.allocate_raw(h).expect("hole"));
    }
    live.push(pool.allocate_raw(filler).expect("live before"));
    holes.push(pool.allocate_raw(free).expect("measured block"));
    live.push(pool.allocate_raw(filler).expect("live after"));
    for p in holes {
        pool.free_raw(p).expect("free");
    }
    let before = pool.snapshot();
    assert_eq!(before.block_live_count, n as u64 + 2);
    let p = pool.allocate_raw(size).expect("hit");
    pool.free_raw(p).expect("free");
    let after = pool.snapshot();
    assert_eq!(after.segment_handles, before.segment_handles, "a reuse hit");
    assert_eq!(after.reuse_hits, before.reuse_hits + 1);
    assert_eq!(after.block_free_bytes, before.block_free_bytes);
    drop(live); // they stay live: freed with the pool
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
    // Segment mode: an exact free block, and one twice the size (split + coalesce).
    let variants: [(&str, u64, &[usize]); 2] =
        [("segments", 1, &IDLE), ("segments-split", 2, &[1_000])];
    for (variant, factor, counts) in variants {
        for (size, size_name) in SEGMENT_SIZES {
            for &n in counts {
                let mut pool: Option<Pool> = None;
                let id = BenchmarkId::new(format!("{variant}-{size_name}"), n);
                g.bench_with_input(id, &size, |b, &size| {
                    let pool =
                        pool.get_or_insert_with(|| segments_with_holes(size, factor * size, n));
                    b.iter(|| {
                        let p = pool.allocate_raw(black_box(size)).expect("hit");
                        pool.free_raw(p).expect("free");
                    })
                });
                if let Some(pool) = pool {
                    let s = pool.snapshot();
                    assert_eq!(s.block_live_count, n as u64 + 2, "every pair was freed");
                    assert_eq!(s.reuse_forced_hits, 0);
                    let created = s.mappings_created;
                    let p = pool.allocate_raw(size).expect("hit");
                    pool.free_raw(p).expect("free");
                    assert_eq!(pool.snapshot().mappings_created, created, "no growth");
                }
            }
        }
    }
    g.finish();
}

/// The stream-ordered pair on one simulated stream, outside a scope with the default
/// threshold 0 (so each free counts down to its fence poll): the CPU cost of the
/// bookkeeping, beside `reuse` (the simulated driver's capture query takes its own
/// lock; on the H200, `flare-bench-gpu` measures the pair against
/// `cuMemAllocAsync` + `cuMemFreeAsync`). Best-fit at every size of [`SIZES`], then
/// segment mode at [`SEGMENT_SIZES`] with the block between two live blocks of the
/// stream's heap.
fn reuse_async(c: &mut Criterion) {
    let mut g = c.benchmark_group("reuse_async");
    let runs = SIZES
        .iter()
        .map(|&(size, name)| (ReusePolicy::BestFit, size, name.to_string()))
        .chain(
            SEGMENT_SIZES
                .iter()
                .map(|&(size, name)| (ReusePolicy::Segments, size, format!("segments-{name}"))),
        );
    for (policy, size, name) in runs {
        let mut state: Option<(Pool, Stream, u64)> = None;
        g.bench_with_input(BenchmarkId::new(name, 0), &size, |b, &size| {
            let (pool, s, _) = state.get_or_insert_with(|| {
                let pool = Pool::new(big_sim().with_policy(policy)).expect("simulated pool");
                let sim = pool.sim_driver().expect("simulated");
                let s = Stream(sim.stream_create().expect("stream"));
                if policy.is_segments() {
                    // Two live blocks around the measured one (never freed: they go
                    // with the pool).
                    let filler = live_filler(size);
                    pool.allocate_async_raw(filler, s).expect("live before");
                    let p = pool.allocate_async_raw(size, s).expect("measured");
                    pool.allocate_async_raw(filler, s).expect("live after");
                    pool.free_async_raw(p, s).expect("free");
                }
                let created = pool.snapshot().mappings_created;
                (pool, s, created)
            });
            b.iter(|| {
                let p = pool.allocate_async_raw(black_box(size), *s).expect("alloc");
                pool.free_async_raw(p, *s).expect("free");
            })
        });
        if let Some((pool, _, created)) = state {
            let snap = pool.snapshot();
            if policy.is_segments() {
                assert_eq!(snap.mappings_created, created, "every pair was a hit");
                assert_eq!(snap.block_live_count, 2);
            } else {
                assert_eq!(
                    snap.mappings_created, 1,
                    "every pair after the first was a hit"
                );
            }
            assert_eq!(snap.cross_stream_hits, 0);
        }
    }
    g.finish();
}

fn miss(c: &mut Criterion) {
    let mut g = c.benchmark_group("miss");
    for (size, size_name) in MISS_SIZES {
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
    let traces: Vec<(String, trace::Trace)> = files
        .iter()
        .map(|file| {
            let name = file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, trace::parse(file).expect("trace"))
        })
        .collect();
    let mut g = c.benchmark_group("replay");
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        for (name, t) in &traces {
            g.throughput(Throughput::Elements(t.len() as u64));
            g.bench_function(BenchmarkId::new(policy.name(), name), |b| {
                b.iter_batched(
                    || {
                        Pool::new(PoolConfig::default().with_policy(policy))
                            .expect("simulated pool")
                    },
                    |pool| {
                        let report = trace::replay(&pool, t, None).expect("replay");
                        assert_eq!(report.out_of_memory_at_line, None);
                        // Returned, so that the pool's drop is not timed.
                        (pool, report)
                    },
                    BatchSize::LargeInput,
                )
            });
        }
    }
    g.finish();
}

/// The reuse pair of `reuse/2MiB/0` and `reuse/segments-4KiB/0` with the history
/// ring off (the default) and on (`PoolConfig::history_events`, a ring of 4096
/// events, full after the first iterations: every pair then overwrites three slots),
/// in the same run (issue 38).
fn history(c: &mut Criterion) {
    let mut g = c.benchmark_group("history");
    for (on, events) in [("off", 0), ("on", 4096)] {
        let config = || PoolConfig {
            history_events: events,
            ..big_sim()
        };
        let mut pool: Option<Pool> = None;
        g.bench_function(BenchmarkId::new("2MiB", on), |b| {
            let pool = pool.get_or_insert_with(|| pool_with_idle_on(config(), 2 * MIB, 0));
            b.iter(|| {
                let p = pool.allocate_raw(black_box(2 * MIB)).expect("hit");
                pool.free_raw(p).expect("free");
            })
        });
        if let Some(pool) = pool {
            assert_eq!(pool.history_on(), events > 0);
            assert_eq!(pool.snapshot().mappings_created, 1, "every pair was a hit");
        }
        let mut pool: Option<Pool> = None;
        g.bench_function(BenchmarkId::new("segments-4KiB", on), |b| {
            let pool =
                pool.get_or_insert_with(|| segments_with_holes_on(config(), 4 * KIB, 4 * KIB, 0));
            b.iter(|| {
                let p = pool.allocate_raw(black_box(4 * KIB)).expect("hit");
                pool.free_raw(p).expect("free");
            })
        });
        if let Some(pool) = pool {
            let (events_kept, dropped) = pool.history();
            assert_eq!(events_kept.len(), events);
            assert_eq!(dropped > 0, events > 0);
        }
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
    targets = reuse, reuse_async, miss, replay, history
}
criterion_main!(benches);
