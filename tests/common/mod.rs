//! Helpers shared by the integration tests: a tiny in-test driver (bump-allocated
//! virtual addresses, a capacity, 2 MiB granularity) so that pools can run without
//! the simulated driver.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use flare_package::driver::{MemInfo, PhysicalHandle, Reservation};
use flare_package::{
    CuResult, DevicePtr, Driver, DriverCall, DriverError, Pool, PoolConfig, ReusePolicy,
};

/// 2 MiB, the granularity of an H200.
pub const GRANULARITY: u64 = 2 << 20;
/// One GiB, bytes.
pub const GIB: u64 = 1 << 30;

/// A minimal driver: physical bytes against a capacity, virtual addresses from a
/// bump pointer, every other call succeeds.
#[derive(Debug)]
pub struct BumpDriver {
    capacity: u64,
    used: Mutex<u64>,
    next_va: AtomicU64,
    next_handle: AtomicU64,
    /// `(n, code)`: the n-th create from now (1-based) fails with `code`.
    fail_create: Mutex<Option<(u64, CuResult)>>,
}

impl BumpDriver {
    /// A driver with `capacity` physical bytes.
    pub fn new(capacity: u64) -> Self {
        BumpDriver {
            capacity,
            used: Mutex::new(0),
            next_va: AtomicU64::new(1 << 40),
            next_handle: AtomicU64::new(1),
            fail_create: Mutex::new(None),
        }
    }

    /// Makes the `n`-th create from now (1-based) fail with `code`.
    pub fn fail_nth_create(&self, n: u64, code: CuResult) {
        *self.fail_create.lock().unwrap() = Some((n, code));
    }

    /// Physical bytes currently held by handles.
    pub fn used(&self) -> u64 {
        *self.used.lock().unwrap()
    }
}

fn invalid(call: DriverCall) -> DriverError {
    DriverError::new(call, CuResult::INVALID_VALUE)
}

impl Driver for BumpDriver {
    fn granularity(&self) -> Result<u64, DriverError> {
        Ok(GRANULARITY)
    }
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
        if size == 0 || size % GRANULARITY != 0 {
            return Err(invalid(DriverCall::Create));
        }
        {
            let mut fail = self.fail_create.lock().unwrap();
            if let Some((n, code)) = *fail {
                if n <= 1 {
                    *fail = None;
                    return Err(DriverError::new(DriverCall::Create, code));
                }
                *fail = Some((n - 1, code));
            }
        }
        let mut used = self.used.lock().unwrap();
        if size > self.capacity - *used {
            return Err(DriverError::new(
                DriverCall::Create,
                CuResult::OUT_OF_MEMORY,
            ));
        }
        *used += size;
        Ok(PhysicalHandle {
            raw: self.next_handle.fetch_add(1, Ordering::Relaxed),
            size,
        })
    }
    fn release(&self, handle: PhysicalHandle) -> Result<(), DriverError> {
        let mut used = self.used.lock().unwrap();
        *used = used
            .checked_sub(handle.size)
            .ok_or(invalid(DriverCall::Release))?;
        Ok(())
    }
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
        if size == 0 || size % GRANULARITY != 0 {
            return Err(invalid(DriverCall::Reserve));
        }
        let ptr = self.next_va.fetch_add(size, Ordering::Relaxed);
        Ok(Reservation { ptr, size })
    }
    fn free_reservation(&self, _reservation: Reservation) -> Result<(), DriverError> {
        Ok(())
    }
    fn map(&self, _ptr: DevicePtr, _handle: PhysicalHandle) -> Result<(), DriverError> {
        Ok(())
    }
    fn set_access(&self, _ptr: DevicePtr, _size: u64, _devices: &[i32]) -> Result<(), DriverError> {
        Ok(())
    }
    fn unmap(&self, _ptr: DevicePtr, _size: u64) -> Result<(), DriverError> {
        Ok(())
    }
    fn synchronize(&self) -> Result<(), DriverError> {
        Ok(())
    }
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        Ok(MemInfo {
            free: self.capacity - self.used(),
            total: self.capacity,
        })
    }
}

/// A pool with `policy` on a fresh [`BumpDriver`] of `capacity` bytes.
pub fn bump_pool(policy: ReusePolicy, capacity: u64) -> (Pool, Arc<BumpDriver>) {
    let driver = Arc::new(BumpDriver::new(capacity));
    let pool = Pool::with_driver(PoolConfig::default().with_policy(policy), driver.clone())
        .expect("pool on the bump driver");
    (pool, driver)
}

/// The path of a shipped trace, by file name (`graph-warmup-20sizes.segment.trace`).
pub fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The four shipped traces with their README figures, GiB: (file, lower bound,
/// no reuse).
pub const SHIPPED: [(&str, f64, f64); 4] = [
    ("eager-prefill-20shapes.tensor.trace", 1.26, 123.11),
    ("eager-prefill-20shapes.segment.trace", 1.93, 1.93),
    ("graph-warmup-20sizes.tensor.trace", 3.08, 1208.91),
    ("graph-warmup-20sizes.segment.trace", 28.58, 53.43),
];
