//! Opening the backend: loading libcuda, checking its symbols, retaining the
//! device's (and peers') primary context; dropping the driver releases them.

use once_cell::sync::OnceCell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use cudarc::driver::sys;

use super::conversions::code;
use super::{CudaDriver, CAPTURE_INFO_SYMBOLS, REQUIRED_SYMBOLS};
use crate::driver::{check, CuResult, DriverCall, DriverError};

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
    ///
    /// [`Driver::create`]: crate::driver::Driver::create
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
    ///
    /// [`Driver::synchronize`]: crate::driver::Driver::synchronize
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
