//! Memory outside the pool's calls: plain allocations, memsets, copies, raw mappings.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::TransferError;
use crate::driver::cuda::conversions::{code, cu_stream, to_usize};
use crate::driver::cuda::CudaDriver;
use crate::driver::{DevicePtr, DriverCall, DriverError, Stream};

impl CudaDriver {
    /// `cuMemAlloc_v2(bytes)`: plain device memory outside any pool, for tests that
    /// take the memory a sleeping tag gave back (issue 15). Free it with
    /// [`CudaDriver::plain_free`].
    ///
    /// # Errors
    ///
    /// `cuMemAlloc_v2` with its code (`CUDA_ERROR_OUT_OF_MEMORY` when the device is
    /// full).
    pub fn plain_alloc(&self, bytes: u64) -> Result<DevicePtr, TransferError> {
        let n = to_usize(bytes).map_err(|code| TransferError {
            function: "cuMemAlloc_v2",
            code,
        })?;
        let mut dptr: sys::CUdeviceptr = 0;
        self.transfer("cuMemAlloc_v2", || {
            // SAFETY: `dptr` is a valid out-pointer for the duration of the call.
            code(unsafe { sys::cuMemAlloc_v2(&mut dptr, n) })
        })?;
        Ok(dptr)
    }

    /// `cuMemFree_v2(ptr)` of memory from [`CudaDriver::plain_alloc`].
    ///
    /// # Errors
    ///
    /// `cuMemFree_v2` with its code (`CUDA_ERROR_INVALID_VALUE` for a pointer
    /// `cuMemAlloc_v2` did not return).
    pub fn plain_free(&self, ptr: DevicePtr) -> Result<(), TransferError> {
        self.transfer("cuMemFree_v2", || {
            // SAFETY: the driver validates the pointer; no host memory is involved.
            code(unsafe { sys::cuMemFree_v2(ptr) })
        })
    }

    /// Sets `bytes` bytes from device address `ptr` to `value` (`cuMemsetD8_v2` on the
    /// legacy default stream; asynchronous with respect to the host, ordered before a
    /// later [`CudaDriver::copy_dtoh`] or [`Driver::synchronize`](crate::driver::Driver::synchronize)). For tests and
    /// benchmarks, not used by the pool.
    ///
    /// # Errors
    ///
    /// `cuMemsetD8_v2` with the driver's code: `CUDA_ERROR_INVALID_VALUE` when the range
    /// is not mapped with access granted.
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + bytes)` is device memory the caller may overwrite (a mapping it
    /// owns, with access granted to this device), and nothing else reads or writes it
    /// until the memset has completed (a later synchronize or synchronous copy; the
    /// memset is asynchronous). The driver checks only that the range is accessible
    /// to the device, and under unified addressing a device address can name host
    /// memory (pinned or managed memory, or any pageable page where the system has
    /// HMM): the driver would then write memory that Rust code may hold references to.
    pub unsafe fn memset_d8(
        &self,
        ptr: DevicePtr,
        value: u8,
        bytes: u64,
    ) -> Result<(), TransferError> {
        let n = to_usize(bytes).map_err(|c| TransferError {
            function: "cuMemsetD8_v2",
            code: c,
        })?;
        self.transfer("cuMemsetD8_v2", || {
            // SAFETY: the caller guarantees `[ptr, ptr + n)` is device memory it may
            // overwrite, untouched by anything else until the memset completes.
            code(unsafe { sys::cuMemsetD8_v2(ptr, value, n) })
        })
    }

    /// Copies `dst.len()` bytes from device address `ptr` into `dst`
    /// (`cuMemcpyDtoH_v2`; synchronous: waits for earlier work on the legacy default
    /// stream). For tests and benchmarks, not used by the pool.
    ///
    /// # Errors
    ///
    /// `cuMemcpyDtoH_v2` with the driver's code: `CUDA_ERROR_INVALID_VALUE` when the
    /// source range is not mapped with access granted.
    pub fn copy_dtoh(&self, ptr: DevicePtr, dst: &mut [u8]) -> Result<(), TransferError> {
        let n = dst.len();
        let host = dst.as_mut_ptr().cast::<c_void>();
        self.transfer("cuMemcpyDtoH_v2", || {
            // SAFETY: `host` points to `n` writable bytes borrowed mutably for the
            // duration of this call; the copy is synchronous, so the driver does not
            // touch them after it returns.
            code(unsafe { sys::cuMemcpyDtoH_v2(host, ptr, n) })
        })
    }

    /// Copies `src` to device address `ptr` (`cuMemcpyHtoD_v2`; returns once `src` may
    /// be reused). For tests and benchmarks, not used by the pool.
    ///
    /// # Errors
    ///
    /// `cuMemcpyHtoD_v2` with the driver's code: `CUDA_ERROR_INVALID_VALUE` when the
    /// destination range is not mapped with access granted.
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + src.len())` is device memory the caller may overwrite (a mapping
    /// it owns, with access granted to this device), not read or written by other
    /// work during the copy. As for [`CudaDriver::memset_d8`], the driver cannot tell
    /// a device address that names host memory (unified addressing) from device
    /// memory, and would write it.
    pub unsafe fn copy_htod(&self, ptr: DevicePtr, src: &[u8]) -> Result<(), TransferError> {
        let n = src.len();
        let host = src.as_ptr().cast::<c_void>();
        self.transfer("cuMemcpyHtoD_v2", || {
            // SAFETY: `host` points to `n` readable bytes borrowed for the duration
            // of this call; a pageable host-to-device copy has consumed them when it
            // returns. The caller guarantees the destination is device memory it may
            // overwrite.
            code(unsafe { sys::cuMemcpyHtoD_v2(ptr, host, n) })
        })
    }

    /// Raw `cuMemMap(ptr, size, offset, handle_raw, 0)`, with any size and offset.
    /// Only for the test that checks the driver refuses to map part of a handle
    /// (`CUDA_ERROR_NOT_SUPPORTED`); the pool always maps whole handles
    /// ([`Driver::map`]).
    #[doc(hidden)]
    pub fn map_range_raw(
        &self,
        ptr: DevicePtr,
        size: u64,
        offset: u64,
        handle_raw: u64,
    ) -> Result<(), DriverError> {
        let err = |c| DriverError::new(DriverCall::Map, c);
        let size = to_usize(size).map_err(err)?;
        let offset = to_usize(offset).map_err(err)?;
        self.in_context(DriverCall::Map, || {
            // SAFETY: the driver validates the range, offset and handle.
            code(unsafe { sys::cuMemMap(ptr, size, offset, handle_raw, 0) })
        })
    }
    /// Sets `bytes` bytes from device address `ptr` to `value` on `stream`
    /// (`cuMemsetD8Async`): ordered with the stream's other work and asynchronous with
    /// respect to the host; on a stream being captured it becomes a memset node of
    /// the graph. For tests, not used by the pool.
    ///
    /// # Errors
    ///
    /// `cuMemsetD8Async` with the driver's code: `CUDA_ERROR_INVALID_VALUE` when the
    /// range is not mapped with access granted.
    ///
    /// # Safety
    ///
    /// As [`CudaDriver::memset_d8`], with "until the memset has completed" meaning
    /// until `stream`'s work up to it has completed; `stream` is a live stream of
    /// this device or a special handle.
    pub unsafe fn memset_d8_async(
        &self,
        ptr: DevicePtr,
        value: u8,
        bytes: u64,
        stream: Stream,
    ) -> Result<(), TransferError> {
        let n = to_usize(bytes).map_err(|c| TransferError {
            function: "cuMemsetD8Async",
            code: c,
        })?;
        let s = cu_stream(stream);
        self.transfer("cuMemsetD8Async", || {
            // SAFETY: the caller guarantees `[ptr, ptr + n)` is device memory it may
            // overwrite, untouched by anything else until the memset completes, and
            // that `s` is a live stream of this device.
            code(unsafe { sys::cuMemsetD8Async(ptr, value, n, s) })
        })
    }
}
