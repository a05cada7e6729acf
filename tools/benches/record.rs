//! CPU cost of recording (issue 17), on the simulated driver (criterion).
//!
//! - `record/cache-hit/{off,on}`: an allocate + free pair of 1 MiB inside a retention
//!   scope, served by the thread's cache (the hot path, no lock shared with other
//!   threads), without and with `record_path` (a file in the temporary directory).
//! - `record/books/{off,on}`: the same pair with thread caches off (the books' lock).
//!
//! Recording appends two lines per pair (`a 0x... 1048576`, `f 0x...`) to one
//! buffer under a mutex; a writer thread writes it out. The ratio on/off is the
//! figure in docs/benchmarks.md (issue 17 asks at most 2x).
//!
//! Run: `cargo bench -p flare-tools --bench record`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use flare_package::{Pool, PoolConfig};

const MIB: u64 = 1 << 20;

fn pool(record: bool, caches: bool) -> Pool {
    let path =
        std::env::temp_dir().join(format!("flare-bench-record-{}.trace", std::process::id()));
    let pool = Pool::new(PoolConfig {
        record_path: record.then_some(path),
        thread_cache_entries: if caches { 32 } else { 0 },
        ..PoolConfig::default()
    })
    .expect("a simulated pool");
    pool.retention_begin().expect("a scope");
    // Warm: the mapping exists and is idle in the cache (or the books).
    let p = pool.allocate_raw(MIB).expect("an allocation");
    pool.free_raw(p).expect("a free");
    pool
}

fn record(c: &mut Criterion) {
    let mut g = c.benchmark_group("record");
    for (name, caches) in [("cache-hit", true), ("books", false)] {
        for (mode, on) in [("off", false), ("on", true)] {
            let pool = pool(on, caches);
            g.bench_function(BenchmarkId::new(name, mode), |b| {
                b.iter(|| {
                    let p = pool.allocate_raw(black_box(MIB)).expect("a hit");
                    pool.free_raw(black_box(p)).expect("a free");
                })
            });
            assert_eq!(pool.record_error(), None);
            drop(pool);
        }
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = record
}
criterion_main!(benches);
