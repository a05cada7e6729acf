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

use once_cell::sync::OnceCell;
use std::ffi::c_void;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use cudarc::driver::sys;

#[cfg(feature = "testing")]
mod testing;
#[cfg(feature = "testing")]
pub use testing::{
    driver_functions_called, TestGraph, TestGraphExec, TestKernel, TransferError, SUM_REPEAT_PTX,
};

use super::{
    check, CaptureMode, CuResult, DevicePtr, Driver, DriverCall, DriverError, Event, HostBuffer,
    MemInfo, PhysicalHandle, Reservation, Stream,
};

/// Every driver function this backend calls, the test-support ones included, but
/// for `cuStreamGetCaptureInfo` (one of [`CAPTURE_INFO_SYMBOLS`]).
/// [`CudaDriver::new`] checks that libcuda exports each of them, so that no later call
/// can hit cudarc's panic on a missing symbol (a unit test checks that every
/// `sys::cu*` call in this file and in `testing.rs` is in one of the two lists, and
/// every one in `cuda_baseline.rs` is here or in its own list).
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

/// The raw `CUresult` as the project's own value, without calling the driver.
fn code(r: sys::CUresult) -> CuResult {
    CuResult(r as u32)
}

/// The largest special stream handle: `0` (the NULL stream), `CU_STREAM_LEGACY` (1)
/// and `CU_STREAM_PER_THREAD` (2) name a stream of whatever context is current on the
/// calling thread (CUDA's "default stream semantics"); every other handle is a
/// created stream, which carries its own context.
const LAST_SPECIAL_STREAM: u64 = 2;

/// Whether `stream` is one of the special handles that the driver resolves against
/// the calling thread's current context (see [`LAST_SPECIAL_STREAM`]).
fn resolved_by_current_context(stream: Stream) -> bool {
    stream.0 <= LAST_SPECIAL_STREAM
}

/// The driver's event handle for a raw [`Event`] value (the handle's address).
fn cu_event(event: Event) -> sys::CUevent {
    event as usize as sys::CUevent
}

/// The driver's stream handle for a [`Stream`] (its raw value, as the address).
fn cu_stream(stream: Stream) -> sys::CUstream {
    stream.0 as usize as sys::CUstream
}

/// `CUstreamCaptureMode` for a [`CaptureMode`] (the same numbers).
fn cu_capture_mode(mode: CaptureMode) -> sys::CUstreamCaptureMode {
    match mode {
        CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        CaptureMode::ThreadLocal => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    }
}

/// The [`CaptureMode`] of a raw `CUstreamCaptureMode` value; `None` for a value CUDA
/// does not define.
fn capture_mode_of(raw: u32) -> Option<CaptureMode> {
    [
        CaptureMode::Global,
        CaptureMode::ThreadLocal,
        CaptureMode::Relaxed,
    ]
    .into_iter()
    .find(|&m| cu_capture_mode(m) as u32 == raw)
}

/// A byte count or address as the driver's `size_t`. Only fails on a target whose
/// `usize` is narrower than 64 bits, with `CUDA_ERROR_INVALID_VALUE`, as the driver
/// itself would for a size it cannot represent.
fn to_usize(v: u64) -> Result<usize, CuResult> {
    usize::try_from(v).map_err(|_| CuResult::INVALID_VALUE)
}

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

/// Which step of [`CudaDriver::with_context`] failed.
#[derive(Clone, Copy, Debug)]
enum Stage {
    Push,
    Call,
    Pop,
}

/// Pops the pool's context from the calling thread's stack when dropped, unless
/// [`Pushed::pop`] already did: even a panic inside the call leaves the thread's
/// context stack as it was.
struct Pushed {
    armed: bool,
}

impl Pushed {
    /// Pops now and returns the driver's answer.
    fn pop(mut self) -> CuResult {
        self.armed = false;
        pop_context()
    }
}

impl Drop for Pushed {
    fn drop(&mut self) {
        if self.armed {
            let _ = pop_context();
        }
    }
}

fn pop_context() -> CuResult {
    let mut popped: sys::CUcontext = ptr::null_mut();
    // SAFETY: only called after a successful `cuCtxPushCurrent_v2` on this thread
    // (libcuda is loaded and the symbol was checked in `CudaDriver::new`); `popped`
    // is a valid out-pointer for the duration of the call.
    code(unsafe { sys::cuCtxPopCurrent_v2(&mut popped) })
}

impl CudaDriver {
    /// Whether libcuda can be loaded on this machine. Never panics and never calls
    /// the driver; the answer is computed once per process. `true` does not promise a
    /// usable device: [`CudaDriver::new`] says that.
    pub fn is_available() -> bool {
        static PRESENT: OnceCell<bool> = OnceCell::new();
        *PRESENT.get_or_init(|| {
            // SAFETY: `is_culib_present` only tries to open the library with
            // `dlopen`; it calls no driver function.
            catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
        })
    }

    /// Loads libcuda, initialises it (`cuInit`), finds device ordinal `device`
    /// (`cuDeviceGet`), retains its primary context (`cuDevicePrimaryCtxRetain`; released
    /// when the driver is dropped) and queries the allocation granularity once
    /// (RECOMMENDED, with the same property [`Driver::create`] uses).
    ///
    /// # Errors
    ///
    /// - [`DriverCall::Init`] with `CUDA_ERROR_NOT_INITIALIZED` (3) when libcuda cannot
    ///   be loaded (no panic), or with `CUDA_ERROR_NOT_FOUND` (500) when it lacks a
    ///   function this backend needs;
    /// - [`DriverCall::Init`] with the driver's code when `cuInit`, `cuDeviceGet`
    ///   (`CUDA_ERROR_INVALID_DEVICE` for an ordinal that does not exist,
    ///   `CUDA_ERROR_NO_DEVICE` with no GPU) or the context retain fails;
    /// - [`DriverCall::Granularity`] when the granularity query fails.
    pub fn new(device: i32) -> Result<CudaDriver, DriverError> {
        Self::with_peers(device, &[])
    }

    /// [`CudaDriver::new`], and retains the primary context of each device in
    /// `peers` too (ordinals other than `device`; repeats are ignored), so that
    /// [`Driver::synchronize`] can wait for the work of every device a pool grants
    /// access to: a kernel on a peer may be reading memory the pool is about to
    /// unmap, and `cuCtxSynchronize` waits only for its own context's work.
    ///
    /// # Errors
    ///
    /// As [`CudaDriver::new`]; a peer's `cuDeviceGet` or context retain failing is
    /// [`DriverCall::Init`] with the driver's code (`CUDA_ERROR_INVALID_DEVICE` for an
    /// ordinal that does not exist).
    pub fn with_peers(device: i32, peers: &[i32]) -> Result<CudaDriver, DriverError> {
        let not_loaded = DriverError::new(DriverCall::Init, CuResult::NOT_INITIALIZED);
        if !Self::is_available() {
            return Err(not_loaded);
        }
        // The library was found a moment ago; should loading it or a symbol still
        // fail, cudarc panics: that becomes the same typed error.
        catch_unwind(AssertUnwindSafe(|| {
            let mut driver = Self::init(device)?;
            for &peer in peers {
                if peer == device || driver.peers.iter().any(|&(p, _, _)| p == peer) {
                    continue;
                }
                let (cu_device, context) = retain_primary(peer)?;
                driver.peers.push((peer, cu_device, context));
            }
            Ok(driver)
        }))
        .unwrap_or(Err(not_loaded))
    }

    fn init(device: i32) -> Result<CudaDriver, DriverError> {
        let init_err = |c: CuResult| DriverError::new(DriverCall::Init, c);
        // SAFETY: `is_available` found the library; `culib` loads it (or panics, which
        // `new` catches).
        let lib = unsafe { sys::culib() };
        for name in REQUIRED_SYMBOLS {
            // SAFETY: the symbol is only looked up, never called through this
            // pointer type.
            let found = unsafe { lib.get::<*const c_void>(name.as_bytes()) };
            if found.is_err() {
                return Err(init_err(CuResult::NOT_FOUND));
            }
        }
        let exported = |name: &str| {
            // SAFETY: as above, a lookup only.
            unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_ok()
        };
        let capture_info_v3 = exported(CAPTURE_INFO_SYMBOLS[0]);
        if !capture_info_v3 && !exported(CAPTURE_INFO_SYMBOLS[1]) {
            return Err(init_err(CuResult::NOT_FOUND));
        }
        // SAFETY: libcuda is loaded and exports `cuInit`; flags must be 0.
        check(DriverCall::Init, code(unsafe { sys::cuInit(0) }))?;
        let (cu_device, context) = retain_primary(device)?;

        let prop = sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            win32HandleMetaData: ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        };
        // From here on, dropping `driver` (on the error path too) releases the context.
        let mut driver = CudaDriver {
            device,
            cu_device,
            context,
            prop,
            granularity: 0,
            peers: Vec::new(),
            capture_info_v3,
        };
        let mut granularity: usize = 0;
        driver.in_context(DriverCall::Granularity, || {
            // SAFETY: `granularity` is a valid out-pointer and `prop` a fully
            // initialised property that outlives the call.
            code(unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut granularity,
                    &driver.prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
                )
            })
        })?;
        driver.granularity = granularity as u64;
        Ok(driver)
    }

    /// The device ordinal this driver was created for.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// Runs `f` (one driver call, returning its raw `CUresult`) with the pool's
    /// context pushed on the calling thread, then pops it, so the thread's context
    /// stack is left as it was (a panic in `f` pops too). The error is the first
    /// failure of push, call and pop, with the stage that failed; on a failed push
    /// `f` is not run.
    fn with_context(&self, f: impl FnOnce() -> CuResult) -> Result<(), (Stage, CuResult)> {
        self.with_context_of(self.context, f)
    }

    /// [`CudaDriver::with_context`] with `context` (this driver's or a peer's
    /// retained primary context) pushed instead.
    fn with_context_of(
        &self,
        context: sys::CUcontext,
        f: impl FnOnce() -> CuResult,
    ) -> Result<(), (Stage, CuResult)> {
        // SAFETY: `context` is a primary context retained in `new` or `with_peers`,
        // released only in `Drop`, so it is valid for as long as `self` is.
        let pushed = code(unsafe { sys::cuCtxPushCurrent_v2(context) });
        if !pushed.is_success() {
            return Err((Stage::Push, pushed));
        }
        let guard = Pushed { armed: true };
        let result = f();
        let popped = guard.pop();
        if !result.is_success() {
            return Err((Stage::Call, result));
        }
        if !popped.is_success() {
            return Err((Stage::Pop, popped));
        }
        Ok(())
    }

    /// [`CudaDriver::with_context`] for a pool call: a failure of the push, the call
    /// or the pop is a [`DriverError`] for `call` with the raw code.
    fn in_context(
        &self,
        call: DriverCall,
        f: impl FnOnce() -> CuResult,
    ) -> Result<(), DriverError> {
        self.with_context(f)
            .map_err(|(_, c)| DriverError::new(call, c))
    }

    /// [`CudaDriver::in_context`] when `needed`, else `f` alone (no push, no pop): for
    /// the stream calls, which need the pool's context current only for the special
    /// stream handles ([`resolved_by_current_context`]).
    fn in_context_if(
        &self,
        needed: bool,
        call: DriverCall,
        f: impl FnOnce() -> CuResult,
    ) -> Result<(), DriverError> {
        if needed {
            self.in_context(call, f)
        } else {
            check(call, f())
        }
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        // SAFETY: balances the `cuDevicePrimaryCtxRetain` in `new` (a `CudaDriver`
        // exists only after it succeeded). The result is ignored: at process exit the
        // driver may already be deinitialised, and nothing can be done either way.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.cu_device) };
        for &(_, cu_device, _) in &self.peers {
            // SAFETY: balances the peer's `cuDevicePrimaryCtxRetain` in `with_peers`.
            let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(cu_device) };
        }
    }
}

/// `cuDeviceGet` of ordinal `device` and `cuDevicePrimaryCtxRetain` of its primary
/// context (the caller releases it with `cuDevicePrimaryCtxRelease_v2`). The driver
/// must be initialised (`cuInit`).
fn retain_primary(device: i32) -> Result<(sys::CUdevice, sys::CUcontext), DriverError> {
    let mut cu_device: sys::CUdevice = 0;
    check(
        DriverCall::Init,
        // SAFETY: `cu_device` is a valid out-pointer; the caller initialised the driver.
        code(unsafe { sys::cuDeviceGet(&mut cu_device, device) }),
    )?;
    let mut context: sys::CUcontext = ptr::null_mut();
    check(
        DriverCall::Init,
        // SAFETY: `context` is a valid out-pointer and `cu_device` a device handle the
        // driver just returned. The caller balances the retain with a release.
        code(unsafe { sys::cuDevicePrimaryCtxRetain(&mut context, cu_device) }),
    )?;
    Ok((cu_device, context))
}

impl Driver for CudaDriver {
    /// Allocation granularity, bytes: queried once in [`CudaDriver::new`]
    /// (`cuMemGetAllocationGranularity`, RECOMMENDED, with the property
    /// [`Driver::create`] uses) and cached, so this makes no driver call and cannot
    /// fail. 2 MiB (2097152) on an H200.
    fn granularity(&self) -> Result<u64, DriverError> {
        Ok(self.granularity)
    }

    /// `cuMemCreate(size, prop, 0)`: pinned device memory on this device, `size` bytes.
    /// About 8 µs at 2 MiB and 64 MiB, 54 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::Create`]: `CUDA_ERROR_INVALID_VALUE` for 0 or a size that is not
    /// a multiple of the granularity, `CUDA_ERROR_OUT_OF_MEMORY` when the device is
    /// full; a failed context push is reported with its own code.
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
        let bytes = to_usize(size).map_err(|c| DriverError::new(DriverCall::Create, c))?;
        let mut raw: sys::CUmemGenericAllocationHandle = 0;
        self.in_context(DriverCall::Create, || {
            // SAFETY: `raw` is a valid out-pointer, `prop` a fully initialised
            // property that outlives the call.
            code(unsafe { sys::cuMemCreate(&mut raw, bytes, &self.prop, 0) })
        })?;
        Ok(PhysicalHandle { raw, size })
    }

    /// `cuMemRelease(handle)`. A handle still mapped stays usable and is freed at its
    /// last unmap. About 9 µs at 2 MiB, 25 µs at 64 MiB, 412 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::Release`]: `CUDA_ERROR_INVALID_VALUE` for a handle already
    /// released.
    fn release(&self, handle: PhysicalHandle) -> Result<(), DriverError> {
        self.in_context(DriverCall::Release, || {
            // SAFETY: the driver validates the handle value.
            code(unsafe { sys::cuMemRelease(handle.raw) })
        })
    }

    /// `cuMemAddressReserve(size, alignment = granularity, addr = 0, flags = 0)`.
    /// About 0.4 µs at 2 MiB, 4.6 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::Reserve`]: `CUDA_ERROR_INVALID_VALUE` for 0 or a size that is not
    /// a multiple of the granularity; `CUDA_ERROR_OUT_OF_MEMORY` when the address
    /// space is exhausted.
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
        let err = |c| DriverError::new(DriverCall::Reserve, c);
        let bytes = to_usize(size).map_err(err)?;
        let alignment = to_usize(self.granularity).map_err(err)?;
        let mut ptr: sys::CUdeviceptr = 0;
        self.in_context(DriverCall::Reserve, || {
            // SAFETY: `ptr` is a valid out-pointer; no fixed address is requested.
            code(unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, alignment, 0, 0) })
        })?;
        Ok(Reservation { ptr, size })
    }

    /// `cuMemAddressFree(ptr, size)` of the whole reservation. About 0.4 µs at 2 MiB,
    /// 6.8 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::FreeReservation`]: `CUDA_ERROR_INVALID_VALUE` while a mapping
    /// inside it is live, for part of a reservation, or for one already freed.
    fn free_reservation(&self, reservation: Reservation) -> Result<(), DriverError> {
        let bytes = to_usize(reservation.size)
            .map_err(|c| DriverError::new(DriverCall::FreeReservation, c))?;
        self.in_context(DriverCall::FreeReservation, || {
            // SAFETY: the driver validates the range against its reservations.
            code(unsafe { sys::cuMemAddressFree(reservation.ptr, bytes) })
        })
    }

    /// `cuMemMap(ptr, handle.size, 0, handle.raw, 0)`: always the whole handle. About
    /// 0.6 µs at 2 MiB and 64 MiB, 2.1 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::Map`]: `CUDA_ERROR_INVALID_VALUE` for an address that is not
    /// reserved, not granularity-aligned, or overlaps a live mapping.
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DriverError> {
        let bytes = to_usize(handle.size).map_err(|c| DriverError::new(DriverCall::Map, c))?;
        self.in_context(DriverCall::Map, || {
            // SAFETY: the driver validates the range and the handle.
            code(unsafe { sys::cuMemMap(ptr, bytes, 0, handle.raw, 0) })
        })
    }

    /// `cuMemSetAccess(ptr, size, descs)` with one read/write descriptor per device
    /// ordinal in `devices` (location type DEVICE). The most expensive step of a fresh
    /// mapping: about 20 µs at 2 MiB, 33 µs at 64 MiB, 77 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::SetAccess`]: `CUDA_ERROR_INVALID_VALUE` for a range that is not
    /// exactly mapped, a device ordinal that does not exist, or an empty `devices`.
    fn set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> Result<(), DriverError> {
        let bytes = to_usize(size).map_err(|c| DriverError::new(DriverCall::SetAccess, c))?;
        let descs: Vec<sys::CUmemAccessDesc> = devices
            .iter()
            .map(|&id| sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        self.in_context(DriverCall::SetAccess, || {
            // SAFETY: `descs` holds `descs.len()` initialised descriptors and outlives
            // the call; the driver validates the range.
            code(unsafe { sys::cuMemSetAccess(ptr, bytes, descs.as_ptr(), descs.len()) })
        })
    }

    /// `cuMemUnmap(ptr, size)`. Does not wait for work in flight (measured: it returns
    /// while a kernel still reads the range, and the kernel then faults): synchronize
    /// first. About 14 µs at 2 MiB, 37.5 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::Unmap`]: `CUDA_ERROR_INVALID_VALUE` for part of a mapping or a
    /// size that is not a multiple of the granularity.
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> {
        let bytes = to_usize(size).map_err(|c| DriverError::new(DriverCall::Unmap, c))?;
        self.in_context(DriverCall::Unmap, || {
            // SAFETY: the driver validates the range.
            code(unsafe { sys::cuMemUnmap(ptr, bytes) })
        })
    }

    /// `cuMemHostAlloc(size, flags 0)`: pinned host memory, with the pool's context
    /// current (pinned memory is registered with the current context).
    ///
    /// # Errors
    ///
    /// [`DriverCall::HostAlloc`]: `CUDA_ERROR_OUT_OF_MEMORY` when the host cannot pin
    /// that much, `CUDA_ERROR_INVALID_VALUE` for 0 bytes.
    fn host_alloc(&self, size: u64) -> Result<HostBuffer, DriverError> {
        let bytes = to_usize(size).map_err(|c| DriverError::new(DriverCall::HostAlloc, c))?;
        let mut host: *mut c_void = ptr::null_mut();
        self.in_context(DriverCall::HostAlloc, || {
            // SAFETY: `host` is a valid out-pointer; the driver allocates `bytes`.
            code(unsafe { sys::cuMemHostAlloc(&mut host, bytes, 0) })
        })?;
        Ok(HostBuffer {
            raw: host as usize as u64,
            size,
        })
    }

    /// `cuMemFreeHost` of memory from [`CudaDriver::host_alloc`].
    ///
    /// # Errors
    ///
    /// [`DriverCall::HostFree`]: `CUDA_ERROR_INVALID_VALUE` for an address that is not
    /// live pinned memory.
    fn host_free(&self, buffer: HostBuffer) -> Result<(), DriverError> {
        let host = buffer.raw as usize as *mut c_void;
        self.in_context(DriverCall::HostFree, || {
            // SAFETY: the driver validates the address; the pool passes only buffers
            // it got from `host_alloc` and frees each once.
            code(unsafe { sys::cuMemFreeHost(host) })
        })
    }

    /// `cuMemcpyDtoH_v2` into pinned `dst` at `offset` (synchronous).
    ///
    /// # Errors
    ///
    /// [`DriverCall::MemcpyDtoH`]: `CUDA_ERROR_INVALID_VALUE` when the range is
    /// outside `dst` (no call is made) or the source is not mapped with access.
    fn copy_to_host(
        &self,
        dst: HostBuffer,
        offset: u64,
        src: DevicePtr,
        size: u64,
    ) -> Result<(), DriverError> {
        let err = |c| DriverError::new(DriverCall::MemcpyDtoH, c);
        if offset.checked_add(size).is_none_or(|e| e > dst.size) {
            return Err(err(CuResult::INVALID_VALUE));
        }
        let n = to_usize(size).map_err(err)?;
        let off = to_usize(offset).map_err(err)?;
        let host = (dst.raw as usize).wrapping_add(off) as *mut c_void;
        self.in_context(DriverCall::MemcpyDtoH, || {
            // SAFETY: `[host, host + n)` lies inside the pinned buffer `dst` (checked
            // above), which the pool owns and nothing else touches; the copy is
            // synchronous, so the driver does not touch it after the call.
            code(unsafe { sys::cuMemcpyDtoH_v2(host, src, n) })
        })
    }

    /// `cuMemcpyHtoD_v2` from pinned `src` at `offset` (synchronous).
    ///
    /// # Errors
    ///
    /// [`DriverCall::MemcpyHtoD`]: as [`CudaDriver::copy_to_host`].
    fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: HostBuffer,
        offset: u64,
        size: u64,
    ) -> Result<(), DriverError> {
        let err = |c| DriverError::new(DriverCall::MemcpyHtoD, c);
        if offset.checked_add(size).is_none_or(|e| e > src.size) {
            return Err(err(CuResult::INVALID_VALUE));
        }
        let n = to_usize(size).map_err(err)?;
        let off = to_usize(offset).map_err(err)?;
        let host = (src.raw as usize).wrapping_add(off) as *const c_void;
        self.in_context(DriverCall::MemcpyHtoD, || {
            // SAFETY: `[host, host + n)` lies inside the pinned buffer `src` (checked
            // above), readable and untouched by anything else during the copy; the
            // destination is the pool's own mapping of a sleeping tag being woken,
            // which no caller can reach until the wake returns.
            code(unsafe { sys::cuMemcpyHtoD_v2(dst, host, n) })
        })
    }

    /// `cuMemsetD8Async(ptr, value, size, stream)` with the pool's context pushed (a
    /// special stream handle then names this device's stream; the memset is queued
    /// and the call returns before it runs).
    ///
    /// # Errors
    ///
    /// [`DriverCall::MemsetD8Async`]: `CUDA_ERROR_INVALID_VALUE` for a range that is
    /// not mapped with access (`docs/vmm-semantics.md`, "Memset") or a size that does
    /// not fit a `size_t` (no call is made); `CUDA_ERROR_INVALID_HANDLE` for a stream
    /// of another context; a sticky fault of earlier work; a failed context push with
    /// its own code.
    fn memset_async(
        &self,
        ptr: DevicePtr,
        value: u8,
        size: u64,
        stream: Stream,
    ) -> Result<(), DriverError> {
        let n = to_usize(size).map_err(|c| DriverError::new(DriverCall::MemsetD8Async, c))?;
        let s = cu_stream(stream);
        self.in_context(DriverCall::MemsetD8Async, || {
            // SAFETY: no Rust memory is passed: the driver validates the device range
            // and the stream handle (a stream of this device or a special handle, by
            // the trait's contract); the context is current.
            code(unsafe { sys::cuMemsetD8Async(ptr, value, n, s) })
        })
    }

    /// `cuCtxSynchronize` with `device`'s primary context current (this driver's
    /// device, or a peer given to [`CudaDriver::with_peers`]): waits for all that
    /// device's work.
    ///
    /// # Errors
    ///
    /// [`DriverCall::Synchronize`]: `CUDA_ERROR_INVALID_DEVICE` for a device that is
    /// neither this driver's nor one of its peers (no call is made);
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` while any stream is being captured
    /// (and the capture is invalidated); a sticky fault of earlier work
    /// (`CUDA_ERROR_ILLEGAL_ADDRESS`, ...).
    fn synchronize(&self, device: i32) -> Result<(), DriverError> {
        let context = if device == self.device {
            self.context
        } else {
            match self.peers.iter().find(|&&(p, _, _)| p == device) {
                Some(&(_, _, c)) => c,
                None => {
                    return Err(DriverError::new(
                        DriverCall::Synchronize,
                        CuResult::INVALID_DEVICE,
                    ))
                }
            }
        };
        self.with_context_of(context, || {
            // SAFETY: no arguments; the device's context is current.
            code(unsafe { sys::cuCtxSynchronize() })
        })
        .map_err(|(_, c)| DriverError::new(DriverCall::Synchronize, c))
    }

    /// `cuMemGetInfo_v2`: free and total bytes of this device.
    ///
    /// # Errors
    ///
    /// [`DriverCall::MemGetInfo`] with the driver's code (a lost context, say).
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        let mut free: usize = 0;
        let mut total: usize = 0;
        self.in_context(DriverCall::MemGetInfo, || {
            // SAFETY: `free` and `total` are valid out-pointers.
            code(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })
        })?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    // ---- stream order (issue 11). Each method is one driver call and allocates
    // nothing. The pool's context is pushed only where the call needs a current
    // context: creating an event or a stream (they belong to the current context),
    // recording an event, and a call given a special stream handle (`0`,
    // `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`, which name the current context's
    // stream). Event and created-stream handles carry their context, and the capture
    // mode is per thread, so the other calls make no push.

    /// `cuEventCreate(CU_EVENT_DISABLE_TIMING)` in this device's primary context (the
    /// context pushed around the call). No timing: recording and querying such an
    /// event is the cheapest fence the driver has.
    ///
    /// # Errors
    ///
    /// [`DriverCall::EventCreate`] with the driver's code (`CUDA_ERROR_OUT_OF_MEMORY`
    /// when the driver cannot allocate the event); a failed context push with its
    /// own code.
    fn event_create(&self) -> Result<Event, DriverError> {
        let mut event: sys::CUevent = ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        self.in_context(DriverCall::EventCreate, || {
            // SAFETY: `event` is a valid out-pointer for the call; the context is
            // current (pushed by `in_context`).
            code(unsafe { sys::cuEventCreate(&mut event, flags) })
        })?;
        Ok(event as usize as u64)
    }

    /// `cuEventDestroy_v2(event)`; no context push (the handle names its context).
    /// An event whose recorded work has not completed yet is destroyed once it
    /// completes (documented by NVIDIA); the call does not wait.
    ///
    /// # Errors
    ///
    /// [`DriverCall::EventDestroy`]: `CUDA_ERROR_INVALID_HANDLE` or
    /// `CUDA_ERROR_INVALID_VALUE` for a value the driver does not know as an event.
    fn event_destroy(&self, event: Event) -> Result<(), DriverError> {
        // SAFETY: `event` is an event handle made by `event_create` on this driver and
        // not destroyed before (the pool passes no other value; the trait's
        // contract). The call takes no pointer to Rust memory.
        check(
            DriverCall::EventDestroy,
            code(unsafe { sys::cuEventDestroy_v2(cu_event(event)) }),
        )
    }

    /// `cuEventRecord(event, stream)` with the pool's context pushed: a special stream
    /// handle then names this device's stream, and the event (made in this context)
    /// and the stream must belong to the same context (`CUDA_ERROR_INVALID_HANDLE`
    /// otherwise, documented by NVIDIA). Legal during any capture (measured on the
    /// H200, `docs/vmm-semantics.md`); on a stream being captured it becomes a graph
    /// node instead, so the pool does not record a fence there. Not on a hot path:
    /// the pool records lazily, once per stream per release point.
    ///
    /// # Errors
    ///
    /// [`DriverCall::EventRecord`]: `CUDA_ERROR_INVALID_HANDLE` for an event or stream
    /// of another context; a sticky fault of earlier work (`CUDA_ERROR_ILLEGAL_ADDRESS`,
    /// ...); a failed context push with its own code.
    fn event_record(&self, event: Event, stream: Stream) -> Result<(), DriverError> {
        let (e, s) = (cu_event(event), cu_stream(stream));
        self.in_context(DriverCall::EventRecord, || {
            // SAFETY: `event` came from `event_create` on this driver and `stream` is a
            // stream handle of this device or a special handle (the pool's and the
            // caller's contract); the context is current. No Rust memory is passed.
            code(unsafe { sys::cuEventRecord(e, s) })
        })
    }

    /// `cuEventQuery(event)`, no context push: `CUDA_SUCCESS` is `Ok(true)` (the work
    /// the event covers has completed, or it was never recorded),
    /// `CUDA_ERROR_NOT_READY` is `Ok(false)`. Called by the pool with the thread in
    /// relaxed capture mode: in global mode it would invalidate a capture open on any
    /// stream (measured on the H200, `docs/vmm-semantics.md`).
    ///
    /// # Errors
    ///
    /// [`DriverCall::EventQuery`] with any other code: `CUDA_ERROR_INVALID_HANDLE`,
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (queried in global mode during a
    /// capture), a sticky fault of the work it covers.
    fn event_query(&self, event: Event) -> Result<bool, DriverError> {
        // SAFETY: `event` came from `event_create` on this driver (the pool's
        // contract); no Rust memory is passed.
        match unsafe { sys::cuEventQuery(cu_event(event)) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => Err(DriverError::new(DriverCall::EventQuery, code(other))),
        }
    }

    /// `cuEventSynchronize(event)`, no context push: blocks the calling thread until
    /// the work the event covers has completed (at once for an event never
    /// recorded). Called in relaxed capture mode, as [`Driver::event_query`].
    ///
    /// # Errors
    ///
    /// [`DriverCall::EventSynchronize`] with the driver's code:
    /// `CUDA_ERROR_INVALID_HANDLE`, `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` in global
    /// mode during a capture, a sticky fault of the work it covers.
    fn event_synchronize(&self, event: Event) -> Result<(), DriverError> {
        // SAFETY: `event` came from `event_create` on this driver (the pool's
        // contract); no Rust memory is passed.
        check(
            DriverCall::EventSynchronize,
            code(unsafe { sys::cuEventSynchronize(cu_event(event)) }),
        )
    }

    /// `cuStreamWaitEvent(stream, event, 0)`: later work on `stream` waits on the
    /// device for the work `event` covers; the host does not wait. The event may
    /// belong to another context (documented by NVIDIA). The pool's context is pushed
    /// only for a special stream handle. Legal during any capture (measured on the
    /// H200); on a stream being captured it adds a dependency to the graph.
    ///
    /// # Errors
    ///
    /// [`DriverCall::StreamWaitEvent`]: `CUDA_ERROR_INVALID_HANDLE` for an unknown
    /// stream or event; a failed context push with its own code.
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<(), DriverError> {
        let (s, e) = (cu_stream(stream), cu_event(event));
        self.in_context_if(
            resolved_by_current_context(stream),
            DriverCall::StreamWaitEvent,
            || {
                // SAFETY: `stream` is a stream of this device or a special handle
                // (with the context current), `event` came from `event_create` (the
                // pool's and the caller's contract); flags 0 is the default wait. No
                // Rust memory is passed.
                code(unsafe { sys::cuStreamWaitEvent(s, e, 0) })
            },
        )
    }

    /// `cuStreamGetCaptureInfo_v3` (or `_v2` on a driver older than CUDA 12.3, see
    /// [`CAPTURE_INFO_SYMBOLS`]), asking for the status and the capture id only:
    /// `Some(id)` while `stream` is being captured (status active or invalidated),
    /// `None` when not. The id is unique over the process's lifetime (documented by
    /// NVIDIA); CUDA documents it as valid only while the capture is active, so for an
    /// invalidated capture it is whatever the driver wrote (0 if it wrote nothing).
    /// Legal during any capture, from any thread (measured on the H200). The pool's
    /// context is pushed only for a special stream handle.
    ///
    /// # Errors
    ///
    /// [`DriverCall::StreamGetCaptureInfo`]: `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` for
    /// the legacy stream while a blocking stream of the context is being captured
    /// (documented by NVIDIA); `CUDA_ERROR_INVALID_HANDLE`; a failed context push
    /// with its own code.
    fn stream_capture(&self, stream: Stream) -> Result<Option<u64>, DriverError> {
        let s = cu_stream(stream);
        // Read as plain integers: the driver writes a `CUstreamCaptureStatus` and a
        // `cuuint64_t`; a `u32` holds any status value, even one this crate's
        // bindings do not name.
        let mut status: u32 = 0;
        let mut id: u64 = 0;
        let status_out = ptr::from_mut(&mut status).cast::<sys::CUstreamCaptureStatus>();
        let id_out = ptr::from_mut(&mut id);
        let v3 = self.capture_info_v3;
        self.in_context_if(
            resolved_by_current_context(stream),
            DriverCall::StreamGetCaptureInfo,
            || {
                // SAFETY: `status_out` and `id_out` point to live, writable locals of
                // the sizes the driver writes (`CUstreamCaptureStatus` is a 32-bit
                // enum); every other out-pointer is NULL, which the driver documents
                // as "not requested". `new` checked that the symbol called is
                // exported. `stream` is a stream of this device or a special handle
                // (with the context current).
                code(unsafe {
                    if v3 {
                        sys::cuStreamGetCaptureInfo_v3(
                            s,
                            status_out,
                            id_out,
                            ptr::null_mut(),
                            ptr::null_mut(),
                            ptr::null_mut(),
                            ptr::null_mut(),
                        )
                    } else {
                        sys::cuStreamGetCaptureInfo_v2(
                            s,
                            status_out,
                            id_out,
                            ptr::null_mut(),
                            ptr::null_mut(),
                            ptr::null_mut(),
                        )
                    }
                })
            },
        )?;
        let none = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as u32;
        Ok((status != none).then_some(id))
    }

    /// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's capture mode to
    /// `mode` and returns the one it had (per thread; no context push). Cheap: it
    /// touches only thread-local driver state.
    ///
    /// # Errors
    ///
    /// [`DriverCall::ThreadExchangeCaptureMode`] with the driver's code; with
    /// `CUDA_ERROR_UNKNOWN` if the driver reports a previous mode CUDA does not
    /// define, after putting that mode back (the thread is left as it was).
    fn exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode, DriverError> {
        let call = DriverCall::ThreadExchangeCaptureMode;
        let mut raw: u32 = cu_capture_mode(mode) as u32;
        let exchange = |raw: &mut u32| {
            // SAFETY: `raw` is a live, writable 32-bit value holding a valid
            // `CUstreamCaptureMode` on the way in (the driver reads it and writes
            // the previous mode back); `CUstreamCaptureMode` is a 32-bit enum.
            code(unsafe {
                sys::cuThreadExchangeStreamCaptureMode(
                    ptr::from_mut(raw).cast::<sys::CUstreamCaptureMode>(),
                )
            })
        };
        check(call, exchange(&mut raw))?;
        match capture_mode_of(raw) {
            Some(previous) => Ok(previous),
            None => {
                let _ = exchange(&mut raw);
                Err(DriverError::new(call, CuResult::UNKNOWN))
            }
        }
    }

    /// `cuStreamCreate(CU_STREAM_DEFAULT)` in this device's primary context (pushed
    /// around the call): a blocking stream, whose work is ordered after earlier work
    /// on the legacy stream (documented by NVIDIA).
    ///
    /// # Errors
    ///
    /// [`DriverCall::StreamCreate`] with the driver's code
    /// (`CUDA_ERROR_OUT_OF_MEMORY`); a failed context push with its own code.
    fn stream_create_blocking(&self) -> Result<Stream, DriverError> {
        let mut stream: sys::CUstream = ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_DEFAULT as u32;
        self.in_context(DriverCall::StreamCreate, || {
            // SAFETY: `stream` is a valid out-pointer for the call; the context is
            // current (pushed by `in_context`).
            code(unsafe { sys::cuStreamCreate(&mut stream, flags) })
        })?;
        Ok(Stream(stream as usize as u64))
    }

    /// `cuStreamDestroy_v2(stream)`, no context push (the handle names its context).
    /// Work still queued on it completes first; the call does not wait (documented
    /// by NVIDIA).
    ///
    /// # Errors
    ///
    /// [`DriverCall::StreamDestroy`]: `CUDA_ERROR_INVALID_HANDLE` for a handle the
    /// driver does not know as a stream.
    fn stream_destroy(&self, stream: Stream) -> Result<(), DriverError> {
        // SAFETY: `stream` was made by `stream_create_blocking` on this driver and not
        // destroyed before (the pool's contract); no Rust memory is passed.
        check(
            DriverCall::StreamDestroy,
            code(unsafe { sys::cuStreamDestroy_v2(cu_stream(stream)) }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{capture_mode_of, cu_capture_mode, resolved_by_current_context};
    use crate::driver::{CaptureMode, Stream};

    /// `CUstreamCaptureMode`'s values in CUDA's header (`cuda.h`): GLOBAL 0,
    /// THREAD_LOCAL 1, RELAXED 2; the mode read back from the driver maps to the
    /// same mode, and a value CUDA does not define to none.
    #[test]
    fn capture_modes_have_cudas_numbers_both_ways() {
        for (mode, n) in [
            (CaptureMode::Global, 0),
            (CaptureMode::ThreadLocal, 1),
            (CaptureMode::Relaxed, 2),
        ] {
            assert_eq!(cu_capture_mode(mode) as u32, n, "{mode:?}");
            assert_eq!(mode as u32, n, "{mode:?}: the Rust discriminant");
            assert_eq!(capture_mode_of(n), Some(mode));
        }
        assert_eq!(capture_mode_of(3), None);
        assert_eq!(capture_mode_of(u32::MAX), None);
    }

    /// The special handles (NULL, `CU_STREAM_LEGACY` = 1, `CU_STREAM_PER_THREAD` = 2
    /// in `cuda.h`) are resolved against the current context, so the pool's context
    /// is pushed for them; a created stream's handle (a driver address) is not.
    #[test]
    fn only_the_special_stream_handles_need_the_context() {
        for raw in [0, 1, 2] {
            assert!(resolved_by_current_context(Stream(raw)), "{raw}");
        }
        assert!(resolved_by_current_context(Stream::LEGACY));
        for raw in [3, 0x5555_0000_1000, u64::MAX] {
            assert!(!resolved_by_current_context(Stream(raw)), "{raw:#x}");
        }
    }
}
