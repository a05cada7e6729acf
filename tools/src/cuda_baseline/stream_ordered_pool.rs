//! The stream-ordered pool: a CUDA memory pool of its own with its stream, and more
//! streams on it for multi-threaded measurements.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys;

use flare_package::driver::cuda::{CudaDriver, TransferError};
use flare_package::driver::{CuResult, DevicePtr, Stream};

use super::{check, code, make_current, require_symbols, to_usize, CurrentContext};

/// A stream-ordered memory pool of its own on one device (`cuMemPoolCreate`, pinned
/// device memory, release threshold `u64::MAX`: memory freed to it stays reserved and
/// is reused warm) and one non-blocking stream that every allocation and free is
/// ordered on. Dropping it synchronizes the stream, destroys it and destroys the
/// pool.
pub struct StreamOrderedPool {
    driver: CudaDriver,
    pool: sys::CUmemoryPool,
    pub(super) stream: sys::CUstream,
}

// SAFETY: `pool` and `stream` are driver handles, created in `new` and destroyed only
// in `Drop`, and `driver` is `Send + Sync`. The CUDA driver API is thread-safe: a
// memory pool and a stream may be used from any thread with the context current, and
// every method here either pushes the context itself (`CudaDriver::transfer`) or is
// called through a `CurrentContext` made current on the calling thread. No method
// mutates the struct after `new`.
unsafe impl Send for StreamOrderedPool {}
// SAFETY: as for `Send`: every method takes `&self` and only passes the handles to
// the driver, which allows concurrent calls on one pool from several threads (each
// allocation and free is ordered on the stream it names).
unsafe impl Sync for StreamOrderedPool {}

impl std::fmt::Debug for StreamOrderedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamOrderedPool")
            .field("device", &self.driver.device())
            .finish_non_exhaustive()
    }
}

impl StreamOrderedPool {
    /// Creates the pool and its stream on device ordinal `device`.
    ///
    /// # Errors
    ///
    /// `cuInit` (and the rest of [`CudaDriver::new`]) when the driver cannot be loaded
    /// or the device does not exist; `cuMemPoolCreate`, `cuMemPoolSetAttribute` or
    /// `cuStreamCreate` with its code; a missing driver function
    /// (`CUDA_ERROR_NOT_FOUND`, naming it). What was created is destroyed again.
    pub fn new(device: i32) -> Result<StreamOrderedPool, TransferError> {
        let driver = CudaDriver::new(device).map_err(|e| TransferError {
            function: e.call.cuda_name(),
            code: e.code,
        })?;
        require_symbols(&driver)?;
        let props = sys::CUmemPoolProps {
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            win32SecurityAttributes: ptr::null_mut(),
            maxSize: 0,
            usage: 0,
            reserved: [0; 54],
        };
        let mut pool: sys::CUmemoryPool = ptr::null_mut();
        driver.transfer("cuMemPoolCreate", || {
            // SAFETY: `pool` is a valid out-pointer and `props` a fully initialised
            // property (reserved bytes zero) that outlives the call.
            code(unsafe { sys::cuMemPoolCreate(&mut pool, &props) })
        })?;
        // From here on, dropping `this` (on the error path too) destroys what exists.
        let mut this = StreamOrderedPool {
            driver,
            pool,
            stream: ptr::null_mut(),
        };
        let mut threshold: u64 = u64::MAX;
        let pool = this.pool;
        this.driver.transfer("cuMemPoolSetAttribute", || {
            // SAFETY: `pool` was created above; RELEASE_THRESHOLD takes a
            // `cuuint64_t`, and `threshold` is one, alive for the call.
            code(unsafe {
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    ptr::from_mut(&mut threshold).cast::<c_void>(),
                )
            })
        })?;
        let mut stream: sys::CUstream = ptr::null_mut();
        this.driver.transfer("cuStreamCreate", || {
            // SAFETY: `stream` is a valid out-pointer; the context is current.
            code(unsafe {
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            })
        })?;
        this.stream = stream;
        Ok(this)
    }

    /// The driver (and primary context) this pool was created with.
    pub fn driver(&self) -> &CudaDriver {
        &self.driver
    }

    /// The pool's non-blocking stream, live until the pool is dropped: the one
    /// stream the stream-ordered measurements run on (this pool's, `cuMemAllocAsync`'s
    /// and flare-package's). A flare-package pool given it must be dropped before
    /// this pool (it may record fence events on it until then).
    pub fn stream(&self) -> Stream {
        Stream(self.stream as usize as u64)
    }

    /// Makes this pool's context current until the guard is dropped: see
    /// [`make_current`].
    ///
    /// # Errors
    ///
    /// As [`make_current`].
    pub fn make_current(&self) -> Result<CurrentContext<'_>, TransferError> {
        make_current(&self.driver)
    }

    pub(super) fn alloc_raw(&self, bytes: u64) -> Result<DevicePtr, TransferError> {
        self.alloc_on(self.stream, bytes)
    }

    /// `cuMemAllocFromPoolAsync` on `stream`: this pool's own stream, or one of a
    /// [`PoolStream`] of this pool (which borrows the pool, so it lives no longer).
    pub(super) fn alloc_on(
        &self,
        stream: sys::CUstream,
        bytes: u64,
    ) -> Result<DevicePtr, TransferError> {
        let n = to_usize("cuMemAllocFromPoolAsync", bytes)?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `dptr` is a valid out-pointer; `self.pool` was created in `new` and
        // is destroyed only in `Drop`; `stream` is this pool's stream (also destroyed
        // only in `Drop`) or a live `PoolStream`'s, which borrows this pool.
        let c = code(unsafe { sys::cuMemAllocFromPoolAsync(&mut dptr, n, self.pool, stream) });
        check("cuMemAllocFromPoolAsync", c)?;
        Ok(dptr)
    }

    pub(super) fn free_raw(&self, ptr: DevicePtr) -> Result<(), TransferError> {
        free_on(self.stream, ptr)
    }

    /// Creates another non-blocking stream for allocations from this pool
    /// (`cuStreamCreate`): one per thread of a multi-threaded measurement, each
    /// thread allocating and freeing on its own stream
    /// ([`CurrentContext::stream_alloc`], [`CurrentContext::stream_free`]).
    ///
    /// # Errors
    ///
    /// `cuStreamCreate` with its code, or the context push / pop.
    pub fn new_stream(&self) -> Result<PoolStream<'_>, TransferError> {
        let mut stream: sys::CUstream = ptr::null_mut();
        self.driver.transfer("cuStreamCreate", || {
            // SAFETY: `stream` is a valid out-pointer; the context is current.
            code(unsafe {
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            })
        })?;
        Ok(PoolStream { pool: self, stream })
    }

    /// `cuMemAllocFromPoolAsync(bytes)` on this pool's stream, the context pushed
    /// around the call.
    ///
    /// # Errors
    ///
    /// `cuMemAllocFromPoolAsync` with its code, or the context push / pop.
    pub fn alloc(&self, bytes: u64) -> Result<DevicePtr, TransferError> {
        self.make_current()?.pool_alloc(self, bytes)
    }

    /// `cuMemFreeAsync(ptr)` on this pool's stream, the context pushed around the call.
    ///
    /// # Errors
    ///
    /// `cuMemFreeAsync` with its code, or the context push.
    pub fn free(&self, ptr: DevicePtr) -> Result<(), TransferError> {
        self.make_current()?.pool_free(self, ptr)
    }

    /// Waits for every allocation and free queued on the stream (`cuStreamSynchronize`).
    ///
    /// # Errors
    ///
    /// `cuStreamSynchronize` with its code.
    pub fn synchronize(&self) -> Result<(), TransferError> {
        let stream = self.stream;
        self.driver.transfer("cuStreamSynchronize", || {
            // SAFETY: `stream` lives until `Drop`.
            code(unsafe { sys::cuStreamSynchronize(stream) })
        })
    }

    /// Releases reserved memory the pool does not use, down to `keep` bytes
    /// (`cuMemPoolTrimTo`).
    ///
    /// # Errors
    ///
    /// `cuMemPoolTrimTo` with its code.
    pub fn trim_to(&self, keep: u64) -> Result<(), TransferError> {
        let n = to_usize("cuMemPoolTrimTo", keep)?;
        let pool = self.pool;
        self.driver.transfer("cuMemPoolTrimTo", || {
            // SAFETY: `pool` lives until `Drop`.
            code(unsafe { sys::cuMemPoolTrimTo(pool, n) })
        })
    }

    fn attribute(
        &self,
        attr: sys::CUmemPool_attribute,
        function: &'static str,
    ) -> Result<u64, TransferError> {
        let mut value: u64 = 0;
        let pool = self.pool;
        self.driver.transfer(function, || {
            // SAFETY: `pool` lives until `Drop`; the RESERVED/USED memory attributes
            // are `cuuint64_t`, and `value` is one, alive for the call.
            code(unsafe {
                sys::cuMemPoolGetAttribute(pool, attr, ptr::from_mut(&mut value).cast::<c_void>())
            })
        })?;
        Ok(value)
    }

    /// The high watermark of memory the pool reserved from the device, bytes
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`): its peak physical footprint.
    ///
    /// # Errors
    ///
    /// `cuMemPoolGetAttribute` with its code.
    pub fn reserved_high_bytes(&self) -> Result<u64, TransferError> {
        self.attribute(
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            "cuMemPoolGetAttribute",
        )
    }

    /// Memory the pool holds reserved now, bytes (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    ///
    /// # Errors
    ///
    /// `cuMemPoolGetAttribute` with its code.
    pub fn reserved_current_bytes(&self) -> Result<u64, TransferError> {
        self.attribute(
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            "cuMemPoolGetAttribute",
        )
    }

    /// The high watermark of memory handed out by the pool, bytes
    /// (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`).
    ///
    /// # Errors
    ///
    /// `cuMemPoolGetAttribute` with its code.
    pub fn used_high_bytes(&self) -> Result<u64, TransferError> {
        self.attribute(
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            "cuMemPoolGetAttribute",
        )
    }
}

impl Drop for StreamOrderedPool {
    fn drop(&mut self) {
        let (pool, stream) = (self.pool, self.stream);
        // Failures are ignored: nothing can be done about them here, and the
        // driver frees what is left with the context at process exit.
        let _ = self.driver.transfer("cuStreamDestroy_v2", || {
            if stream.is_null() {
                return CuResult::SUCCESS;
            }
            // SAFETY: `stream` was created in `new` and is destroyed only here; the
            // synchronize lets every queued free complete first.
            unsafe {
                let _ = sys::cuStreamSynchronize(stream);
                code(sys::cuStreamDestroy_v2(stream))
            }
        });
        let _ = self.driver.transfer("cuMemPoolDestroy", || {
            // SAFETY: `pool` was created in `new` (a `StreamOrderedPool` exists only
            // after that succeeded) and is destroyed only here.
            code(unsafe { sys::cuMemPoolDestroy(pool) })
        });
    }
}

/// `cuMemFreeAsync(ptr, stream)`.
pub(super) fn free_on(stream: sys::CUstream, ptr: DevicePtr) -> Result<(), TransferError> {
    // SAFETY: the driver validates the pointer; every caller passes a stream that
    // lives at least as long as the call (a `StreamOrderedPool`'s or a `PoolStream`'s,
    // each destroyed only in its `Drop`).
    check(
        "cuMemFreeAsync",
        code(unsafe { sys::cuMemFreeAsync(ptr, stream) }),
    )
}

/// A non-blocking stream of its own for allocations from a [`StreamOrderedPool`]
/// ([`StreamOrderedPool::new_stream`]). Not `Send`: a thread creates its own and
/// drops it. Dropping it synchronizes the stream (every queued free completes) and
/// destroys it.
#[derive(Debug)]
pub struct PoolStream<'a> {
    pub(super) pool: &'a StreamOrderedPool,
    pub(super) stream: sys::CUstream,
}

impl PoolStream<'_> {
    /// The stream, live until this is dropped.
    pub fn stream(&self) -> Stream {
        Stream(self.stream as usize as u64)
    }

    /// Waits for every allocation and free queued on the stream (`cuStreamSynchronize`).
    ///
    /// # Errors
    ///
    /// `cuStreamSynchronize` with its code.
    pub fn synchronize(&self) -> Result<(), TransferError> {
        let stream = self.stream;
        self.pool.driver.transfer("cuStreamSynchronize", || {
            // SAFETY: `stream` was created in `new_stream` and lives until `Drop`.
            code(unsafe { sys::cuStreamSynchronize(stream) })
        })
    }
}

impl Drop for PoolStream<'_> {
    fn drop(&mut self) {
        let stream = self.stream;
        // A failure is ignored, as in `StreamOrderedPool`'s drop.
        let _ = self.pool.driver.transfer("cuStreamDestroy_v2", || {
            // SAFETY: `stream` was created in `new_stream` and is destroyed only here;
            // the synchronize lets every queued free complete first.
            unsafe {
                let _ = sys::cuStreamSynchronize(stream);
                code(sys::cuStreamDestroy_v2(stream))
            }
        });
    }
}
