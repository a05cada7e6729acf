//! Stream order on the simulated driver (issue 11): `allocate_async`, `free_async`,
//! the guard, scopes, a driver without streams, the legacy stream, destroy; and the
//! pools the stream tests share. Cross-stream reuse, the release on fences, failed
//! fences, captures, `record_stream`, a stream's end, destroyed streams and the
//! scope barrier against a release waiting on a fence have modules of their own.
//! Every expectation comes
//! from the semantics or the driver rows of `docs/vmm-semantics.md`; the
//! simulated driver counts a contract fault for an unmap of memory queued work
//! touches, a hand-off of memory to a stream while another stream's unordered work
//! touches it, and anything that breaks a capture: every test ends with none.

use crate::common;

use common::{check, no_faults, stream, MIB};
use flare_package::driver::sim::SimStreamCall;
use flare_package::driver::Driver;
use flare_package::{
    CrossStreamReuse, CuResult, DriverCall, Error, Pool, PoolConfig, SimConfig, SimDriver, Stream,
};
use std::sync::Arc;

pub(crate) const G: u64 = 2 * MIB;

pub(crate) fn pool_with(cross: CrossStreamReuse, threshold: u64) -> (Pool, Arc<SimDriver>) {
    let config = PoolConfig {
        cross_stream_reuse: cross,
        release_threshold_bytes: threshold,
        ..PoolConfig::default()
    };
    common::simulated_pool(SimConfig::default().capacity_bytes, config)
}

/// A pool on a simulated device of `capacity` bytes that caches everything idle
/// (release threshold `u64::MAX`).
pub(crate) fn small_device(capacity: u64) -> (Pool, Arc<SimDriver>) {
    let config = PoolConfig {
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::default()
    };
    common::simulated_pool(capacity, config)
}

pub(crate) fn syncs(sim: &SimDriver) -> u64 {
    sim.call_count(DriverCall::Synchronize)
}

/// Frees on the legacy stream are fenced on the pool's own blocking stream, never
/// with an event on the legacy stream, and released once the legacy work completes.
#[test]
fn legacy_stream_frees_are_fenced_on_a_pool_stream() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let p = pool.allocate_async_raw(G, Stream::LEGACY).unwrap();
    sim.launch(0, p, G);
    pool.free_async_raw(p, Stream::LEGACY).unwrap();
    assert_eq!(check(&pool).physical_bytes, G);
    sim.stream_complete(0);
    pool.trim().unwrap();
    assert_eq!(sim.stream_call_count(SimStreamCall::StreamCreate), 1);
    assert_eq!(check(&pool).physical_bytes, 0);
    assert_eq!(syncs(&sim), 0);
    // Stream handle 1 (CU_STREAM_LEGACY) is the same stream: its memory comes back.
    let q = pool.allocate_async_raw(G, Stream(1)).unwrap();
    pool.free_async_raw(q, Stream(1)).unwrap();
    assert_eq!(pool.allocate_async_raw(G, Stream::LEGACY).unwrap(), q);
    no_faults(&sim);
}

/// The synchronous functions keep their meaning and cost: no stream or event call,
/// and a free outside a scope still synchronizes before it unmaps.
#[test]
fn synchronous_functions_make_no_stream_call() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let p = pool.allocate_raw(G).unwrap();
    pool.free_raw(p).unwrap();
    let q = pool.allocate_raw(G).unwrap();
    pool.retention_begin().unwrap();
    pool.free_raw(q).unwrap();
    pool.retention_finish().unwrap();
    for call in SimStreamCall::ALL {
        assert_eq!(sim.stream_call_count(call), 0, "{call:?}");
    }
    assert_eq!(syncs(&sim), 2, "one per release point, as before");
    no_faults(&sim);
}

/// A free inside a scope makes no event call and releases nothing.
#[test]
fn inside_a_scope_a_stream_free_only_retains() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    pool.retention_begin().unwrap();
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), 0);
    assert_eq!(check(&pool).idle_bytes, G);
    pool.retention_finish().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    assert_eq!(syncs(&sim), 0, "finish waited on a fence, not the device");
    no_faults(&sim);
}

/// Freeing twice, or a pointer the pool never gave, on a stream is an unknown
/// pointer and changes nothing.
#[test]
fn stream_free_of_an_unknown_pointer_changes_nothing() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    let before = check(&pool);
    assert!(matches!(
        pool.free_async_raw(p, s),
        Err(Error::UnknownPointer { .. })
    ));
    assert!(matches!(
        pool.free_async_raw(p + 4096, s),
        Err(Error::UnknownPointer { .. })
    ));
    assert_eq!(check(&pool), before);
}

/// The guard frees on its stream.
#[test]
fn the_guard_frees_on_its_stream() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let s = stream(&sim);
    let a = pool.allocate_async(G, s).unwrap();
    assert_eq!(a.stream(), Some(s));
    let p = a.ptr();
    sim.launch(s.0, p, G);
    drop(a);
    let snap = check(&pool);
    assert_eq!((snap.frees, snap.event_wait_bytes), (1, G), "freed on S");
    assert_eq!(pool.allocate_async_raw(G, s).unwrap(), p);
    no_faults(&sim);
}

/// A backend without stream support refuses the stream functions with the driver's
/// NOT_SUPPORTED and changes nothing.
#[test]
fn a_driver_without_streams_refuses_stream_allocations() {
    struct Plain(SimDriver);
    impl Driver for Plain {
        fn granularity(&self) -> Result<u64, flare_package::DriverError> {
            self.0.granularity()
        }
        fn create(
            &self,
            size: u64,
        ) -> Result<flare_package::driver::PhysicalHandle, flare_package::DriverError> {
            Driver::create(&self.0, size)
        }
        fn release(
            &self,
            h: flare_package::driver::PhysicalHandle,
        ) -> Result<(), flare_package::DriverError> {
            Driver::release(&self.0, h)
        }
        fn reserve(
            &self,
            size: u64,
        ) -> Result<flare_package::driver::Reservation, flare_package::DriverError> {
            Driver::reserve(&self.0, size)
        }
        fn free_reservation(
            &self,
            r: flare_package::driver::Reservation,
        ) -> Result<(), flare_package::DriverError> {
            Driver::free_reservation(&self.0, r)
        }
        fn map(
            &self,
            ptr: u64,
            h: flare_package::driver::PhysicalHandle,
        ) -> Result<(), flare_package::DriverError> {
            Driver::map(&self.0, ptr, h)
        }
        fn set_access(
            &self,
            ptr: u64,
            size: u64,
            d: &[i32],
        ) -> Result<(), flare_package::DriverError> {
            Driver::set_access(&self.0, ptr, size, d)
        }
        fn unmap(&self, ptr: u64, size: u64) -> Result<(), flare_package::DriverError> {
            Driver::unmap(&self.0, ptr, size)
        }
        fn synchronize(&self, device: i32) -> Result<(), flare_package::DriverError> {
            Driver::synchronize(&self.0, device)
        }
        fn mem_info(&self) -> Result<flare_package::driver::MemInfo, flare_package::DriverError> {
            Driver::mem_info(&self.0)
        }
    }
    let pool = Pool::with_driver(
        PoolConfig::default(),
        Arc::new(Plain(SimDriver::new(SimConfig::default()))),
    )
    .unwrap();
    match pool.allocate_async_raw(G, Stream(5)) {
        Err(Error::Driver { source, .. }) => {
            assert_eq!(source.call, DriverCall::StreamGetCaptureInfo);
            assert_eq!(source.code, CuResult::NOT_SUPPORTED);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(check(&pool).allocations, 0);
    let p = pool.allocate_raw(G).unwrap();
    pool.free_raw(p).unwrap();
}

/// `Pool::destroy` gives the pool's stream resources back: every event it created
/// (a fence of a free still waiting, and the spare ones) is destroyed, and so is
/// its own blocking stream (made for a legacy-stream free's fence); the caller's
/// stream is the caller's and is left alone. Counted on the simulated driver: one
/// `cuEventDestroy` per `cuEventCreate`, one `cuStreamDestroy` for the two
/// `cuStreamCreate` (the test's stream and the pool's).
#[test]
fn destroy_gives_back_every_event_and_the_pools_stream() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(sim.launch(s.0, p, G), CuResult::SUCCESS);
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_async_raw(G, Stream::LEGACY).unwrap();
    assert_eq!(sim.launch(0, q, G), CuResult::SUCCESS);
    pool.free_async_raw(q, Stream::LEGACY).unwrap();
    // The legacy work completes; a trim (the pool's own stream is made by now).
    sim.stream_complete(0);
    pool.trim().unwrap();
    let created = sim.stream_call_count(SimStreamCall::EventCreate);
    assert!(
        created >= 1,
        "the fence of the free on s, whose kernel is queued"
    );
    assert_eq!(sim.stream_call_count(SimStreamCall::StreamCreate), 2);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventDestroy), 0);
    pool.destroy().unwrap();
    assert_eq!(sim.stream_call_count(SimStreamCall::EventDestroy), created);
    assert_eq!(sim.stream_call_count(SimStreamCall::StreamDestroy), 1);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventCreate), created);
    no_faults(&sim);
}

pub(crate) fn sim_pool(
    cross: CrossStreamReuse,
    threshold: u64,
    capacity: u64,
) -> (Pool, Arc<SimDriver>) {
    let config = PoolConfig {
        cross_stream_reuse: cross,
        release_threshold_bytes: threshold,
        ..PoolConfig::default()
    };
    common::simulated_pool(capacity, config)
}
