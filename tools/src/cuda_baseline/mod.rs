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

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;
use std::sync::OnceLock;

use cudarc::driver::sys;

use flare_package::driver::cuda::{CudaDriver, TestKernel, TransferError, SUM_REPEAT_PTX};
use flare_package::driver::{
    CuResult, DevicePtr, Driver, DriverError, PhysicalHandle, Reservation, Stream,
};

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

/// A stream-ordered memory pool of its own on one device (`cuMemPoolCreate`, pinned
/// device memory, release threshold `u64::MAX`: memory freed to it stays reserved and
/// is reused warm) and one non-blocking stream that every allocation and free is
/// ordered on. Dropping it synchronizes the stream, destroys it and destroys the
/// pool.
pub struct StreamOrderedPool {
    driver: CudaDriver,
    pool: sys::CUmemoryPool,
    stream: sys::CUstream,
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

    fn alloc_raw(&self, bytes: u64) -> Result<DevicePtr, TransferError> {
        self.alloc_on(self.stream, bytes)
    }

    /// `cuMemAllocFromPoolAsync` on `stream`: this pool's own stream, or one of a
    /// [`PoolStream`] of this pool (which borrows the pool, so it lives no longer).
    fn alloc_on(&self, stream: sys::CUstream, bytes: u64) -> Result<DevicePtr, TransferError> {
        let n = to_usize("cuMemAllocFromPoolAsync", bytes)?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `dptr` is a valid out-pointer; `self.pool` was created in `new` and
        // is destroyed only in `Drop`; `stream` is this pool's stream (also destroyed
        // only in `Drop`) or a live `PoolStream`'s, which borrows this pool.
        let c = code(unsafe { sys::cuMemAllocFromPoolAsync(&mut dptr, n, self.pool, stream) });
        check("cuMemAllocFromPoolAsync", c)?;
        Ok(dptr)
    }

    fn free_raw(&self, ptr: DevicePtr) -> Result<(), TransferError> {
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
fn free_on(stream: sys::CUstream, ptr: DevicePtr) -> Result<(), TransferError> {
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
    pool: &'a StreamOrderedPool,
    stream: sys::CUstream,
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

/// Bytes of the buffer the long kernel of [`InflightKernels`] reads: 64 MiB.
const HEAD_BYTES: u64 = 64 << 20;

/// Bytes each short kernel of [`InflightKernels::queue`] reads at the start of a
/// buffer: 4 KiB (1024 u32, one per thread).
pub const TOUCH_BYTES: u64 = 4096;

/// Threads of the one block every `sum_repeat` launch uses.
const THREADS: u32 = 1024;

/// The `sum_repeat` kernel (`SUM_REPEAT_PTX`, loaded on a driver's context) with a
/// 64 MiB buffer of its own for the long kernel to read and a 4-byte result: what
/// keeps a stream busy while frees of memory in flight are timed. The buffers are
/// `cuMemAlloc_v2` memory, freed with the module unloaded when this is dropped: let
/// the work queued with it end first.
#[derive(Debug)]
pub struct InflightKernels<'a> {
    driver: &'a CudaDriver,
    kernel: Option<TestKernel>,
    head: DevicePtr,
    out: DevicePtr,
}

impl<'a> InflightKernels<'a> {
    /// Loads the kernel on `driver`'s context and allocates and zeroes its buffers
    /// (then waits for the device, once, so that work on any stream sees them
    /// zeroed).
    ///
    /// # Errors
    ///
    /// The failed driver function with its code (`cuModuleLoadData`, `cuMemAlloc_v2`,
    /// `cuMemsetD8_v2`, `cuCtxSynchronize`); a missing driver function
    /// (`CUDA_ERROR_NOT_FOUND`, naming it).
    pub fn new(driver: &'a CudaDriver) -> Result<InflightKernels<'a>, TransferError> {
        let mut this = InflightKernels {
            driver,
            kernel: Some(driver.load_test_kernel(SUM_REPEAT_PTX, "sum_repeat")?),
            head: 0,
            out: 0,
        };
        this.head = plain_alloc(driver, HEAD_BYTES)?;
        this.out = plain_alloc(driver, 4)?;
        for (ptr, bytes) in [(this.head, HEAD_BYTES), (this.out, 4)] {
            // SAFETY: `ptr` is a `cuMemAlloc_v2` allocation of `bytes` bytes owned by
            // `this`, and no work uses it yet.
            unsafe { driver.memset_d8(ptr, 0, bytes) }?;
        }
        driver
            .synchronize(driver.device())
            .map_err(|e| TransferError {
                function: e.call.cuda_name(),
                code: e.code,
            })?;
        Ok(this)
    }

    fn kernel(&self) -> Result<&TestKernel, TransferError> {
        self.kernel.as_ref().ok_or(TransferError {
            function: "cuModuleGetFunction",
            code: CuResult::NOT_FOUND,
        })
    }

    /// The number of passes over the 64 MiB buffer that take about `target` on
    /// `stream`: one pass queued there, timed with a stream synchronize (the module's
    /// first launch made before, untimed). At least 1.
    ///
    /// # Errors
    ///
    /// `cuLaunchKernel` or `cuStreamSynchronize` with its code.
    pub fn passes_for(
        &self,
        stream: Stream,
        target: std::time::Duration,
    ) -> Result<u64, TransferError> {
        let mut one = std::time::Duration::ZERO;
        for _ in 0..2 {
            let t = std::time::Instant::now();
            self.launch(stream, self.head, HEAD_BYTES / 4, 1)?;
            self.driver.stream_synchronize(stream)?;
            one = t.elapsed().max(std::time::Duration::from_micros(10));
        }
        Ok(((target.as_secs_f64() / one.as_secs_f64()).ceil() as u64).max(1))
    }

    fn launch(
        &self,
        stream: Stream,
        data: DevicePtr,
        n: u64,
        passes: u64,
    ) -> Result<(), TransferError> {
        let kernel = self.kernel()?;
        // SAFETY: `sum_repeat` takes four 64-bit parameters (data, count, passes,
        // out). Every caller passes `data` = the 64 MiB head buffer with `n` covering
        // it, or a buffer that `queue`'s caller promises; `out` is this struct's
        // 4-byte allocation; `stream` is the caller's live stream of this context.
        unsafe {
            self.driver.launch_test_kernel_on(
                kernel,
                1,
                THREADS,
                &[data, n, passes, self.out],
                stream,
            )
        }
    }

    /// Queues on `stream` a kernel reading the 64 MiB buffer `passes` times (about
    /// the `target` given to [`InflightKernels::passes_for`]), then a one-pass kernel
    /// reading the first [`TOUCH_BYTES`] of every `every`-th buffer of `buffers`
    /// (the first included), behind it. Returns once queued. A launch per buffer of a
    /// thousand could fill the driver's launch queue, whose depth is not documented,
    /// and block the host until the long kernel ends.
    ///
    /// # Errors
    ///
    /// `cuLaunchKernel` with its code.
    ///
    /// # Safety
    ///
    /// Each buffer is device memory of at least [`TOUCH_BYTES`] bytes in this
    /// driver's context (not host memory, under unified addressing), and stays mapped
    /// until `stream`'s work up to the kernel reading it has completed: it is freed
    /// only stream-ordered on `stream` (`cuMemFreeAsync`, flare-package's
    /// `free_async`) or by a free that waits for the device first; `stream` is a live
    /// stream of this context.
    pub unsafe fn queue(
        &self,
        stream: Stream,
        passes: u64,
        buffers: &[DevicePtr],
        every: usize,
    ) -> Result<(), TransferError> {
        self.launch(stream, self.head, HEAD_BYTES / 4, passes)?;
        for &b in buffers.iter().step_by(every.max(1)) {
            self.launch(stream, b, TOUCH_BYTES / 4, 1)?;
        }
        Ok(())
    }
}

impl Drop for InflightKernels<'_> {
    fn drop(&mut self) {
        // Failures are ignored, as in `StreamOrderedPool`'s drop. The owner lets the
        // work queued with these buffers end first (a stream synchronize).
        for ptr in [self.head, self.out] {
            if ptr != 0 {
                let _ = plain_free(self.driver, ptr);
            }
        }
        if let Some(k) = self.kernel.take() {
            let _ = self.driver.unload_test_kernel(k);
        }
    }
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
        let baseline = driver_functions_called(include_str!("cuda_baseline.rs"));
        assert!(baseline.contains(&"cuMemPoolCreate"), "{baseline:?}");
        for name in &baseline {
            assert!(
                REQUIRED_SYMBOLS.contains(name) || BASELINE_SYMBOLS.contains(name),
                "cuda_baseline.rs calls {name}, which neither symbol list checks"
            );
        }
    }
}
