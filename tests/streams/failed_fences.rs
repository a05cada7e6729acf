//! Fences that fail: a refused creation of the fence stream holds the free, and a
//! failed fence wait at a release point holds only the memory waiting on its stream.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use common::hooked::hooked_pool;
use common::{assert_driver_empty, check, no_faults, simulated_pool, MIB};
use flare_package::driver::sim::SimStreamCall;
use flare_package::{CuResult, DriverCall, PoolConfig, Stream};
use std::sync::Arc;

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A code no call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

/// `Pool::record_stream` and `free_async_raw`: memory used on a recorded stream is
/// released only after a fence on that stream. After the legacy stream, the fence
/// is recorded on the pool's own blocking stream, created on first use
/// (`cuStreamCreate`). When that creation fails, the stream order of the recorded
/// use cannot be tracked: the free is held for a device synchronize instead (no
/// fence, nothing waiting on events), the failure is counted in
/// `Snapshot::stream_call_failures`, and the mapping is not reused on the freeing
/// stream. A later free creates the fence stream then.
#[test]
fn a_failed_fence_stream_creation_holds_the_free() {
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let s = common::stream(&sim);
    let created = sim.stream_call_count(SimStreamCall::StreamCreate);
    let p = pool.allocate_async_raw(3 * MIB, s).unwrap();
    pool.record_stream(p, Stream::LEGACY).unwrap();
    sim.inject_stream_failure(SimStreamCall::StreamCreate, 1, FAIL);
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamCreate),
        created + 1,
        "the fence stream's creation was tried once"
    );
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1);
    // No fence recorded; the held mapping is counted in `event_wait_bytes` (idle,
    // "reusable ... for release only after" its order is known: here a synchronize).
    assert_eq!(snap.events_outstanding, 0);
    assert_eq!((snap.idle_bytes, snap.event_wait_bytes), (2 * G, 2 * G));
    // Held: not reused on its stream (a new mapping instead).
    let q = pool.allocate_async_raw(3 * MIB, s).unwrap();
    assert_ne!(q, p);
    assert_eq!(pool.snapshot().mappings_created, 2);

    // The next recorded legacy use: the fence stream is created now, and the free
    // waits on a fence recorded there.
    pool.record_stream(q, Stream::LEGACY).unwrap();
    pool.free_async_raw(q, s).unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamCreate),
        created + 2
    );
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1);
    assert_eq!(snap.events_outstanding, 1);
    pool.trim().unwrap();
    check(&pool);
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// A release point whose event wait failed (`Pool::trim`, `docs/ARCHITECTURE.md`
/// "Release points"): "What a failed stream or event call left unconfirmed goes to
/// *held* there ... memory freed after the release point recorded its fences is left
/// for a later one". While a trim waits on T's fence (outside the lock), another
/// thread frees X after `record_stream` on U (U's kernel running) and Y after
/// `record_stream` on T (T's kernel running, after the fence); then the wait fails.
/// Y waits on T, whose order is unknown now: held, released after the trim's device
/// synchronize. X waits on U only, which nothing failed on: left waiting for a later
/// release point. The failed wait guarded memory that was not kept: the trim
/// succeeds.
#[test]
fn a_failed_fence_wait_holds_only_the_memory_waiting_on_its_stream() {
    let (pool, driver, sim) = hooked_pool(PoolConfig::default());
    let (s, t, u) = (
        common::stream(&sim),
        common::stream(&sim),
        common::stream(&sim),
    );
    let x = pool.allocate_async_raw(G, s).unwrap();
    let y = pool.allocate_async_raw(2 * G, s).unwrap();
    // Idle on T, for the trim to fence and wait on.
    let w = pool.allocate_async_raw(3 * G, t).unwrap();
    pool.free_async_raw(w, t).unwrap();
    let weak = Arc::downgrade(&pool);
    let hook_sim = sim.clone();
    driver.arm(DriverCall::EventSynchronize, Some(FAIL), move || {
        let other = weak.upgrade().expect("the pool");
        std::thread::spawn(move || {
            assert_eq!(hook_sim.launch(u.0, x, G), CuResult::SUCCESS);
            other.record_stream(x, u).unwrap();
            other.free_async_raw(x, s).unwrap();
            assert_eq!(hook_sim.launch(t.0, y, 2 * G), CuResult::SUCCESS);
            other.record_stream(y, t).unwrap();
            other.free_async_raw(y, s).unwrap();
            let snap = other.snapshot();
            assert_eq!(snap.event_wait_bytes, 3 * G, "X and Y wait on their fences");
        })
        .join()
        .unwrap();
    });
    pool.trim()
        .expect("the failed wait's memory was released after a synchronize");
    let snap = pool.snapshot();
    assert_eq!(snap.stream_call_failures, 1);
    assert_eq!(snap.event_wait_bytes, G, "X still waits on U");
    assert_eq!(snap.physical_bytes, G, "Y (held) and W released; X kept");
    assert_eq!(sim.state().physical_bytes, G);
    assert_eq!(snap.live_count, 0);
    // U's work done: the next trim releases X.
    sim.stream_complete(u.0);
    pool.trim().unwrap();
    assert_eq!(pool.snapshot().physical_bytes, 0);
    assert_eq!(sim.state().physical_bytes, 0);
}
