//! Memory freed on a stream that is then destroyed: after a trim it serves another
//! stream; destroyed first, it is held until trim.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::stream_order::sim_pool;
use common::{check, no_faults, stream, MIB};
use flare_package::{CrossStreamReuse, CuResult};

const G: u64 = 2 * MIB;

/// FINDING 2 (resolved as a documented contract). Freeing on a stream and then
/// destroying the stream: the pool records fences lazily, so it passes the stream to
/// the driver after the free. `free_async_raw`'s documentation now says to trim
/// before destroying such a stream. Done so, the memory is released, the pool never
/// touches the destroyed stream again, and another stream allocates.
#[test]
fn memory_freed_on_a_destroyed_stream_serves_another_stream() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, G);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    pool.trim().unwrap();
    assert_eq!(sim.stream_destroy(s.0), CuResult::SUCCESS);
    let q = pool.allocate_async_raw(G, t).unwrap();
    pool.free_async_raw(q, t).unwrap();
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.stream_call_failures, snap.physical_bytes), (0, 0));
    no_faults(&sim);
}

/// The misuse (destroyed first), on the simulated driver, where a destroyed handle
/// is refused with `CUDA_ERROR_INVALID_HANDLE`: the memory is held, named by the
/// out-of-memory error, and released by trim.
#[test]
fn memory_freed_on_a_stream_destroyed_first_is_held_until_trim() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, G);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(sim.stream_destroy(s.0), CuResult::SUCCESS);
    match pool.allocate_async_raw(G, t) {
        Err(flare_package::Error::OutOfMemory { idle, live, .. }) => {
            assert_eq!((idle, live), (G, 0))
        }
        other => panic!("expected an out-of-memory naming the held memory: {other:?}"),
    }
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, 0, "{snap:#?}");
    assert!(snap.stream_call_failures >= 1, "{snap:#?}");
    assert!(pool.allocate_async_raw(G, t).is_ok());
    no_faults(&sim);
}
