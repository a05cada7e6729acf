//! The real CUDA driver backend: a thin wrapper over cudarc's raw, dynamically loaded
//! driver functions (`cudarc::driver::sys`), one driver call per [`Driver`] method.
//!
//! - libcuda is loaded at run time, so the crate builds and its non-GPU tests run on a
//!   machine with no CUDA at all; [`CudaDriver::is_available`] says whether it loads,
//!   and [`CudaDriver::new`] fails with a typed [`DriverCall::Init`] error (never a
//!   panic) when it does not.
//! - Every call that needs a current context runs with the pool's device context (the
//!   device's primary context, retained for the driver's lifetime) current on the
//!   calling thread: it is pushed before the call and popped after, so the caller's
//!   own context is left as it was, and a thread with no current context works. The
//!   stream-order calls whose handles carry their context (event query, synchronize
//!   and destroy; a wait, a capture query or a destroy on a created stream) and the
//!   per-thread capture-mode exchange push nothing (section "stream order" of the
//!   [`Driver`] implementation).
//! - Errors keep the raw `CUresult` and the call that returned it
//!   ([`DriverError`]); cudarc's own error type is never formatted, because that
//!   calls the driver.
//!
//! Costs measured on an H200 (medians; `docs/vmm-semantics.md`): a fresh 2 MiB
//! mapping costs about 8 µs (create) + 0.4 µs (reserve) + 0.6 µs (map) + 20 µs (set
//! access), and tearing it down about 14 µs (unmap) + 9 µs (release) + 0.4 µs (free
//! the addresses). The push/pop of the context around each call adds well under a
//! microsecond.
//!
//! [`Driver`]: crate::driver::Driver
//! [`DriverCall::Init`]: crate::driver::DriverCall::Init
//! [`DriverError`]: crate::driver::DriverError

use std::fmt;

use cudarc::driver::sys;

mod context;
mod conversions;
mod open;
#[cfg(feature = "testing")]
mod testing;
mod trait_impl;

#[cfg(feature = "testing")]
pub use testing::{
    driver_functions_called, TestGraph, TestGraphExec, TestKernel, TransferError, SUM_REPEAT_PTX,
};

/// Every driver function this backend calls, the test-support ones included, but
/// for `cuStreamGetCaptureInfo` (one of [`CAPTURE_INFO_SYMBOLS`]).
/// [`CudaDriver::new`] checks that libcuda exports each of them, so that no later call
/// can hit cudarc's panic on a missing symbol (a unit test checks that every
/// `sys::cu*` call in the files of this backend, `testing/` included, is in one of
/// the two lists, and every one in `cuda_baseline.rs` is here or in its own list).
pub const REQUIRED_SYMBOLS: [&str; 46] = [
    "cuInit",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemUnmap",
    "cuMemGetInfo_v2",
    // Stream order (issue 11).
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuStreamWaitEvent",
    "cuThreadExchangeStreamCaptureMode",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    // Sleep in offload mode (issue 15); the copies are also test support.
    "cuMemHostAlloc",
    "cuMemFreeHost",
    // Test support (`testing.rs`).
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8_v2",
    "cuMemsetD8Async",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoD_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// The versions of `cuStreamGetCaptureInfo` this backend can call, newest first:
/// [`CudaDriver::new`] requires libcuda to export at least one and uses the first it
/// finds. `_v3` (CUDA 12.3, driver 545, and the one CUDA 13's header names
/// `cuStreamGetCaptureInfo`) adds only the graph-edge data this backend does not ask
/// for; `_v2` (CUDA 11.3) keeps drivers of the 535 long-term branch (CUDA 12.2)
/// working. Both return the same capture status and id.
pub const CAPTURE_INFO_SYMBOLS: [&str; 2] =
    ["cuStreamGetCaptureInfo_v3", "cuStreamGetCaptureInfo_v2"];
/// The real CUDA driver for one device: the device's primary context (retained for
/// the driver's lifetime) and the allocation property every handle is created with
/// (pinned device memory on that device, no exportable handle types).
///
/// `Send + Sync`: every method may be called from any thread, concurrently; each one
/// that needs a current context makes the context current on the calling thread for
/// the duration of the call.
pub struct CudaDriver {
    /// The device ordinal given to [`CudaDriver::new`].
    device: i32,
    /// The driver's device handle (`cuDeviceGet`), kept for the primary-context release.
    cu_device: sys::CUdevice,
    /// The device's primary context, retained in `new` and released in `Drop`.
    context: sys::CUcontext,
    /// The allocation property for `cuMemCreate` and the granularity query.
    prop: sys::CUmemAllocationProp,
    /// Allocation granularity (RECOMMENDED, for `prop`), bytes; queried once.
    granularity: u64,
    /// Peer devices given to [`CudaDriver::with_peers`]: (ordinal, device handle,
    /// primary context retained in `with_peers` and released in `Drop`), so that a
    /// release can synchronize every device with access.
    peers: Vec<(i32, sys::CUdevice, sys::CUcontext)>,
    /// Whether libcuda exports `cuStreamGetCaptureInfo_v3` (else `_v2` is used):
    /// looked up once in `new`.
    capture_info_v3: bool,
}

// SAFETY: `context` (and each peer's context) is a primary context. The driver API allows a context to be made
// current on any thread (and on several threads at once), and every use of it here
// pushes it onto the calling thread's context stack and pops it before returning, so
// no thread-affine state is ever left behind. `prop` holds only a null
// `win32HandleMetaData` pointer, which is never dereferenced. The remaining fields
// are plain integers, never mutated after `new`.
unsafe impl Send for CudaDriver {}
// SAFETY: as for `Send`: every method takes `&self`, reads only fields fixed at
// construction, and the CUDA driver API is thread-safe for concurrent calls on one
// context from several threads.
unsafe impl Sync for CudaDriver {}

impl fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDriver")
            .field("device", &self.device)
            .field("granularity", &self.granularity)
            .finish_non_exhaustive()
    }
}
