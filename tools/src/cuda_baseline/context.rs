//! The device's primary context held current by a guard, and the baseline calls
//! made through it with no push or pop of their own.

use std::marker::PhantomData;
use std::ptr;

use cudarc::driver::sys;

use flare_package::driver::cuda::{CudaDriver, TransferError};
use flare_package::driver::DevicePtr;

use super::stream_ordered_pool::free_on;
use super::{check, code, require_symbols, to_usize, PoolStream, StreamOrderedPool};

/// The device's primary context, current on this thread until the guard is dropped
/// (pushed by [`make_current`], popped on drop). Not `Send`: it is popped on the
/// thread that pushed it. Its methods call the driver directly, with no push or pop
/// of their own: what an engine's host thread pays, its context being current.
#[derive(Debug)]
pub struct CurrentContext<'a> {
    driver: &'a CudaDriver,
    _not_send: PhantomData<*const ()>,
}

/// Makes `driver`'s primary context current on the calling thread until the
/// returned guard is dropped.
///
/// # Errors
///
/// `cuCtxPushCurrent_v2` with its code; a function of this module missing from
/// libcuda (`CUDA_ERROR_NOT_FOUND`, naming it).
pub fn make_current(driver: &CudaDriver) -> Result<CurrentContext<'_>, TransferError> {
    require_symbols(driver)?;
    // SAFETY: `raw_context` is the primary context retained by `driver`, valid while
    // `driver` lives, and the guard borrows `driver`.
    let pushed = code(unsafe { sys::cuCtxPushCurrent_v2(driver.raw_context()) });
    check("cuCtxPushCurrent_v2", pushed)?;
    Ok(CurrentContext {
        driver,
        _not_send: PhantomData,
    })
}

impl Drop for CurrentContext<'_> {
    fn drop(&mut self) {
        let mut popped: sys::CUcontext = ptr::null_mut();
        // SAFETY: balances the successful push in `make_current` on this thread (the
        // guard is not `Send`); `popped` is a valid out-pointer.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    }
}

impl CurrentContext<'_> {
    /// The driver whose context this is.
    pub fn driver(&self) -> &CudaDriver {
        self.driver
    }

    /// `cuMemAlloc_v2(bytes)`.
    ///
    /// # Errors
    ///
    /// `cuMemAlloc_v2` with its code (`CUDA_ERROR_OUT_OF_MEMORY` when the device is
    /// full).
    pub fn plain_alloc(&self, bytes: u64) -> Result<DevicePtr, TransferError> {
        let n = to_usize("cuMemAlloc_v2", bytes)?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `dptr` is a valid out-pointer; the context is current (this guard).
        check(
            "cuMemAlloc_v2",
            code(unsafe { sys::cuMemAlloc_v2(&mut dptr, n) }),
        )?;
        Ok(dptr)
    }

    /// `cuMemFree_v2(ptr)`.
    ///
    /// # Errors
    ///
    /// `cuMemFree_v2` with its code (`CUDA_ERROR_INVALID_VALUE` for a pointer
    /// `cuMemAlloc_v2` did not return).
    pub fn plain_free(&self, ptr: DevicePtr) -> Result<(), TransferError> {
        // SAFETY: the driver validates the pointer; no host memory is involved.
        check("cuMemFree_v2", code(unsafe { sys::cuMemFree_v2(ptr) }))
    }

    /// `cuMemAllocFromPoolAsync(bytes, pool, stream)` on `pool`'s stream.
    ///
    /// # Errors
    ///
    /// `cuMemAllocFromPoolAsync` with its code.
    pub fn pool_alloc(
        &self,
        pool: &StreamOrderedPool,
        bytes: u64,
    ) -> Result<DevicePtr, TransferError> {
        pool.alloc_raw(bytes)
    }

    /// `cuMemAllocAsync(bytes, stream)` on `pool`'s stream: an allocation from the
    /// device's current memory pool (its default pool unless the process set another;
    /// used as it is, no attribute changed), not from `pool` itself. Its release
    /// threshold is the driver's default, 0: memory freed to it goes back to the
    /// device at the next synchronize, and in between an allocation on the same stream
    /// reuses it (stream order), so a loop of pairs with no synchronize stays warm.
    ///
    /// # Errors
    ///
    /// `cuMemAllocAsync` with its code (`CUDA_ERROR_OUT_OF_MEMORY`).
    pub fn default_pool_alloc(
        &self,
        pool: &StreamOrderedPool,
        bytes: u64,
    ) -> Result<DevicePtr, TransferError> {
        let n = to_usize("cuMemAllocAsync", bytes)?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `dptr` is a valid out-pointer; `pool.stream` was created in
        // `StreamOrderedPool::new` and is destroyed only in its `Drop`, and the
        // context is current (this guard).
        let c = code(unsafe { sys::cuMemAllocAsync(&mut dptr, n, pool.stream) });
        check("cuMemAllocAsync", c)?;
        Ok(dptr)
    }

    /// `cuMemFreeAsync(ptr, stream)` on `pool`'s stream (for memory from
    /// [`CurrentContext::pool_alloc`] or [`CurrentContext::default_pool_alloc`]: the
    /// driver returns it to the pool it came from).
    ///
    /// # Errors
    ///
    /// `cuMemFreeAsync` with its code.
    pub fn pool_free(&self, pool: &StreamOrderedPool, ptr: DevicePtr) -> Result<(), TransferError> {
        pool.free_raw(ptr)
    }

    /// `cuMemAllocFromPoolAsync(bytes, pool, stream)` from `stream`'s pool, on
    /// `stream` (a stream of its own, [`StreamOrderedPool::new_stream`]).
    ///
    /// # Errors
    ///
    /// `cuMemAllocFromPoolAsync` with its code (`CUDA_ERROR_OUT_OF_MEMORY`).
    pub fn stream_alloc(
        &self,
        stream: &PoolStream<'_>,
        bytes: u64,
    ) -> Result<DevicePtr, TransferError> {
        stream.pool.alloc_on(stream.stream, bytes)
    }

    /// `cuMemFreeAsync(ptr, stream)` on `stream` (memory from
    /// [`CurrentContext::stream_alloc`] or any of the pool's allocations: the driver
    /// returns it to the pool it came from).
    ///
    /// # Errors
    ///
    /// `cuMemFreeAsync` with its code.
    pub fn stream_free(
        &self,
        stream: &PoolStream<'_>,
        ptr: DevicePtr,
    ) -> Result<(), TransferError> {
        free_on(stream.stream, ptr)
    }
}
