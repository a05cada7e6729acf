//! The allocators an engine would use instead of the pool, as a small safe API, for
//! the GPU comparison benchmark (`flare-bench-gpu`). Not used by the pool.
//!
//! - [`StreamOrderedPool`]: a CUDA stream-ordered memory pool of its own
//!   (`cuMemPoolCreate`, release threshold `u64::MAX`, so freed memory stays warm)
//!   with one non-blocking stream; `alloc` is `cuMemAllocFromPoolAsync`, `free` is
//!   `cuMemFreeAsync`. The pool is created for the benchmark, so no device setting
//!   (the device's default pool included) is changed. Its stream also serves
//!   `cuMemAllocAsync` ([`CurrentContext::default_pool_alloc`]: the device's current
//!   pool, used as it is) and flare-package's own stream-ordered calls. More streams
//!   on the same pool ([`StreamOrderedPool::new_stream`], [`PoolStream`]) give each
//!   thread of a multi-threaded measurement a stream of its own.
//! - [`InflightKernels`]: the `sum_repeat` test kernel, to keep a stream busy (a long
//!   kernel, then short ones reading the buffers about to be freed) while frees of
//!   memory in flight are timed.
//! - [`plain_alloc`] / [`plain_free`]: `cuMemAlloc_v2` / `cuMemFree_v2`.
//! - [`raw_mapping_cycle`]: the driver sequence a fresh mapping of the pool wraps
//!   (create, reserve, map, set access, then synchronize, unmap, release, free the
//!   reservation), through the [`Driver`] trait, so it runs on [`CudaDriver`] and on
//!   the simulated driver alike.
//!
//! Each call makes the device's primary context current around itself (pushed and
//! popped, as [`CudaDriver`] does). A hot loop that should time the call alone, as an
//! engine sees it with its context already current, holds a [`CurrentContext`]
//! ([`make_current`]) and calls its methods, which push nothing.
//!
//! Errors are [`TransferError`]s: the driver function and its raw `CUresult`, named
//! without calling the driver.

mod context;
mod inflight_kernels;
mod stream_ordered_pool;

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::driver::sys;

use flare_package::driver::cuda::{CudaDriver, TransferError};
use flare_package::driver::{
    CuResult, DevicePtr, Driver, DriverError, PhysicalHandle, Reservation,
};

pub use context::{make_current, CurrentContext};
pub use inflight_kernels::{InflightKernels, TOUCH_BYTES};
pub use stream_ordered_pool::{PoolStream, StreamOrderedPool};

/// Every driver function this module calls beyond those [`CudaDriver::new`] checks
/// (`cuStreamCreate`, `cuStreamDestroy_v2` and `cuStreamSynchronize` are among those).
pub const BASELINE_SYMBOLS: [&str; 10] = [
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolSetAttribute",
    "cuMemPoolGetAttribute",
    "cuMemPoolTrimTo",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
];

fn code(r: sys::CUresult) -> CuResult {
    CuResult(r as u32)
}

fn check(function: &'static str, c: CuResult) -> Result<(), TransferError> {
    if c.is_success() {
        Ok(())
    } else {
        Err(TransferError { function, code: c })
    }
}

/// A byte count as the driver's `size_t` (`CUDA_ERROR_INVALID_VALUE` on a target
/// whose `usize` cannot hold it).
fn to_usize(function: &'static str, bytes: u64) -> Result<usize, TransferError> {
    usize::try_from(bytes).map_err(|_| TransferError {
        function,
        code: CuResult::INVALID_VALUE,
    })
}

/// Checks once per process that libcuda exports every function of
/// [`BASELINE_SYMBOLS`], so that no later call hits cudarc's panic on a missing
/// symbol. Only called with a [`CudaDriver`] alive, which proves libcuda is loaded.
fn require_symbols(_proof: &CudaDriver) -> Result<(), TransferError> {
    static FOUND: OnceLock<Result<(), TransferError>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        // SAFETY: a `CudaDriver` exists, so `culib` already loaded the library in
        // `CudaDriver::new` and returns it without loading again.
        let lib = unsafe { sys::culib() };
        for name in BASELINE_SYMBOLS {
            // SAFETY: the symbol is only looked up, never called through this
            // pointer type.
            let found = unsafe { lib.get::<*const c_void>(name.as_bytes()) };
            if found.is_err() {
                return Err(TransferError {
                    function: name,
                    code: CuResult::NOT_FOUND,
                });
            }
        }
        Ok(())
    })
}

/// `cuMemAlloc_v2(bytes)` with `driver`'s context pushed around the call.
///
/// # Errors
///
/// As [`CurrentContext::plain_alloc`], or the context push / pop.
pub fn plain_alloc(driver: &CudaDriver, bytes: u64) -> Result<DevicePtr, TransferError> {
    make_current(driver)?.plain_alloc(bytes)
}

/// `cuMemFree_v2(ptr)` with `driver`'s context pushed around the call.
///
/// # Errors
///
/// As [`CurrentContext::plain_free`], or the context push.
pub fn plain_free(driver: &CudaDriver, ptr: DevicePtr) -> Result<(), TransferError> {
    make_current(driver)?.plain_free(ptr)
}

/// The driver sequence behind one fresh mapping of the pool, done and undone on
/// `driver` with no pool around it: create a handle of `size` bytes, reserve `size`
/// bytes of addresses, map the handle, grant access to `devices`, then synchronize,
/// unmap, release the handle and free the reservation (the pool's release order).
/// A failed step undoes the steps already done, in reverse.
///
/// # Errors
///
/// The first failed call with its code.
pub fn raw_mapping_cycle(
    driver: &dyn Driver,
    size: u64,
    devices: &[i32],
) -> Result<(), DriverError> {
    let handle: PhysicalHandle = driver.create(size)?;
    let reservation: Reservation = match driver.reserve(size) {
        Ok(r) => r,
        Err(e) => {
            let _ = driver.release(handle);
            return Err(e);
        }
    };
    let undo = |mapped: bool| {
        if mapped {
            let _ = driver.unmap(reservation.ptr, size);
        }
        let _ = driver.free_reservation(reservation);
        let _ = driver.release(handle);
    };
    if let Err(e) = driver.map(reservation.ptr, handle) {
        undo(false);
        return Err(e);
    }
    if let Err(e) = driver.set_access(reservation.ptr, size, devices) {
        undo(true);
        return Err(e);
    }
    // As the pool does: wait for every device with access.
    if let Err(e) = devices.iter().try_for_each(|&d| driver.synchronize(d)) {
        undo(true);
        return Err(e);
    }
    driver.unmap(reservation.ptr, size)?;
    let released = driver.release(handle);
    let freed = driver.free_reservation(reservation);
    released.and(freed)
}

#[cfg(test)]
mod tests {
    use super::BASELINE_SYMBOLS;
    use flare_package::driver::cuda::{driver_functions_called, REQUIRED_SYMBOLS};

    #[test]
    fn every_driver_function_called_is_checked_at_load() {
        let baseline = driver_functions_called(concat!(
            include_str!("mod.rs"),
            include_str!("context.rs"),
            include_str!("inflight_kernels.rs"),
            include_str!("stream_ordered_pool.rs"),
        ));
        assert!(baseline.contains(&"cuMemPoolCreate"), "{baseline:?}");
        for name in &baseline {
            assert!(
                REQUIRED_SYMBOLS.contains(name) || BASELINE_SYMBOLS.contains(name),
                "cuda_baseline/ calls {name}, which neither symbol list checks"
            );
        }
    }
}
