//! The pool never holds its lock across a driver call that creates, maps, grants
//! access, unmaps, releases or synchronizes.
//!
//! How: a `Driver` wrapper around the simulated driver, which inside each of those
//! calls asks a *different* thread to take `pool.snapshot()` (which takes the
//! pool's lock) and waits for it with a timeout. If the calling thread held the
//! lock, the snapshot could not complete until the driver call returned, so the
//! wait would time out; the call is then recorded as a violation. Every call kind
//! must have been probed at least once, on the success paths and on the undo and
//! retry paths (failures injected into the inner simulated driver).
//!
//! Not probed: the calls `Drop`/`destroy` make (the pool is no longer reachable
//! through a `Weak` then; they run the same `release_batch` as `trim` and `finish`)
//! and the granularity query in `Pool::with_driver` (before the pool exists).

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use flare_package::driver::{MemInfo, PhysicalHandle, Reservation};
use flare_package::{
    CuResult, DevicePtr, Driver, DriverCall, DriverError, Pool, PoolConfig, SimDriver,
};

const MIB: u64 = 1 << 20;

struct Probe {
    inner: SimDriver,
    pool: OnceLock<Weak<Pool>>,
    probed: Mutex<BTreeMap<DriverCall, u64>>,
    violations: Mutex<Vec<DriverCall>>,
}

impl Probe {
    fn probe(&self, call: DriverCall) {
        let Some(pool) = self.pool.get().and_then(Weak::upgrade) else {
            return;
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = pool.snapshot();
            drop(pool);
            let _ = tx.send(());
        });
        if rx.recv_timeout(Duration::from_secs(5)).is_ok() {
            *self.probed.lock().unwrap().entry(call).or_default() += 1;
        } else {
            self.violations.lock().unwrap().push(call);
        }
    }
}

impl Driver for Probe {
    fn granularity(&self) -> Result<u64, DriverError> {
        self.inner.granularity()
    }
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
        self.probe(DriverCall::Create);
        self.inner.create(size)
    }
    fn release(&self, handle: PhysicalHandle) -> Result<(), DriverError> {
        self.probe(DriverCall::Release);
        self.inner.release(handle)
    }
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
        self.probe(DriverCall::Reserve);
        self.inner.reserve(size)
    }
    fn free_reservation(&self, reservation: Reservation) -> Result<(), DriverError> {
        self.probe(DriverCall::FreeReservation);
        self.inner.free_reservation(reservation)
    }
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DriverError> {
        self.probe(DriverCall::Map);
        self.inner.map(ptr, handle)
    }
    fn set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> Result<(), DriverError> {
        self.probe(DriverCall::SetAccess);
        self.inner.set_access(ptr, size, devices)
    }
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> {
        self.probe(DriverCall::Unmap);
        self.inner.unmap(ptr, size)
    }
    fn synchronize(&self, device: i32) -> Result<(), DriverError> {
        self.probe(DriverCall::Synchronize);
        self.inner.synchronize(device)
    }
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.inner.mem_info()
    }
}

#[test]
fn no_driver_call_runs_under_the_pool_lock() {
    let driver = Arc::new(Probe {
        inner: SimDriver::default(),
        pool: OnceLock::new(),
        probed: Mutex::new(BTreeMap::new()),
        violations: Mutex::new(Vec::new()),
    });
    let config = PoolConfig {
        release_threshold_bytes: 2 * MIB,
        ..PoolConfig::default()
    };
    let pool = Arc::new(Pool::with_driver(config, driver.clone()).unwrap());
    assert!(driver.pool.set(Arc::downgrade(&pool)).is_ok());
    let sim = &driver.inner;

    // Miss: create, reserve, map, set access. Free under the threshold: cached.
    let a = pool.allocate_raw(MIB).unwrap();
    pool.free_raw(a).unwrap();
    // Reuse hit (no driver call), then a free over the threshold: released by the
    // free (synchronize, unmap, release, free reservation).
    let a = pool.allocate_raw(MIB).unwrap();
    let b = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    pool.trim().unwrap();
    // Scope: retained, released by finish.
    pool.retention_begin().unwrap();
    let c = pool.allocate_raw(8 * MIB).unwrap();
    pool.free_raw(c).unwrap();
    pool.retention_finish().unwrap();
    // A failed set access: undone in reverse (unmap, free reservation, release).
    sim.inject_failure(DriverCall::SetAccess, 1, CuResult::UNKNOWN);
    assert!(pool.allocate_raw(2 * MIB).is_err());
    // A failed unmap at a release point: kept, retried by the next trim.
    let d = pool.allocate_raw(2 * MIB).unwrap();
    sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
    pool.free_raw(d).unwrap();
    assert!(pool.trim().is_err());
    assert_eq!(pool.snapshot().unmap_failures, 1);
    pool.trim().unwrap();
    // Out of memory outside a scope: release what is idle, retry once.
    let e = pool.allocate_raw(2 * MIB).unwrap();
    pool.free_raw(e).unwrap();
    sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    let f = pool.allocate_raw(64 * MIB).unwrap();
    assert_eq!(pool.snapshot().oom_retries, 1);
    pool.free_raw(f).unwrap();
    pool.trim().unwrap();

    let s = pool.snapshot();
    assert_eq!((s.physical_bytes, s.pending_count, s.live_count), (0, 0, 0));
    let violations = driver.violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "driver calls made while the pool's lock was held: {violations:?}"
    );
    let probed = driver.probed.lock().unwrap().clone();
    println!("driver calls probed with the pool's lock free: {probed:?}");
    for call in DriverCall::MEMORY_CALLS {
        assert!(
            probed.get(&call).copied().unwrap_or(0) > 0,
            "{call} never probed"
        );
    }
    drop(pool);
    assert_eq!(sim.state().physical_bytes, 0);
}
