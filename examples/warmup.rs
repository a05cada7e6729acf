//! A forward's warm-up, as an inference engine does it: the weights stay, and each of
//! 12 warm-up forwards (one per batch shape, say) allocates a 1 GiB transient and
//! frees it. Inside a retention scope nothing freed is released (queued or captured
//! GPU work may still touch it), and the next transient reuses the freed mapping with
//! no driver call: the pool holds 4 + 1 GiB, not 4 + 12.
//!
//! Runs anywhere, on the simulated H200: `cargo run --release --example warmup`.
//! On a GPU, build the pool with `PoolConfig::cuda(0)` instead.

use flare_package::{Pool, PoolConfig};

const GIB: u64 = 1 << 30;

fn main() -> Result<(), flare_package::Error> {
    let pool = Pool::new(PoolConfig::default())?; // simulated H200; PoolConfig::cuda(0) for a GPU
    let weights = pool.allocate(4 * GIB)?; // stays live
    let scope = pool.retention_scope()?; // around warm-up and graph capture
    for _shape in 0..12 {
        let transient = pool.allocate(GIB)?; // 1 GiB; the first creates a mapping
        drop(transient); // freed: retained, and the next allocation reuses it
    }
    scope.finish()?; // one synchronize, then everything idle is released

    let s = pool.snapshot();
    println!(
        "peak {} GiB, {} mappings created, {} reuse hits, {} GiB held after the scope",
        s.peak_physical_bytes / GIB,
        s.mappings_created,
        s.reuse_hits,
        s.physical_bytes / GIB
    );
    assert_eq!(s.peak_physical_bytes, 5 * GIB);
    assert_eq!(s.reuse_hits, 11);
    assert_eq!(s.physical_bytes, 4 * GIB);
    drop(weights);
    Ok(())
}
