//! Test and benchmark support for the CUDA backend, compiled only with the `testing`
//! feature (the project's own tests, the GPU comparison benchmark in `tools/`):
//! memsets and copies, raw mappings, hand-written PTX kernels to keep work in
//! flight, non-blocking streams, and stream capture into graphs that are replayed.
//! None of it is used by the pool, and none of it is part of the library's API for
//! engines.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use cudarc::driver::sys;

use super::context::Stage;
use super::conversions::code;
use super::CudaDriver;
use crate::driver::CuResult;

mod graphs;
mod kernels;
mod memory;
mod streams;
mod symbols;

pub use graphs::{TestGraph, TestGraphExec};
pub use kernels::{TestKernel, SUM_REPEAT_PTX};
pub use symbols::driver_functions_called;

/// A failed memset or copy ([`CudaDriver::memset_d8`], [`CudaDriver::copy_dtoh`],
/// [`CudaDriver::copy_htod`]): these are not pool operations, so they have no
/// [`DriverCall`]; the error names the driver function instead, with its raw
/// `CUresult`.
///
/// [`DriverCall`]: crate::driver::DriverCall
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{function} failed with {code}")]
pub struct TransferError {
    /// The driver function that failed (`"cuMemsetD8_v2"`); `"cuCtxPushCurrent_v2"`
    /// when the pool's context could not be made current.
    pub function: &'static str,
    /// The raw `CUresult` it returned.
    pub code: CuResult,
}

impl CudaDriver {
    /// The device's primary context, retained by this driver until it is dropped:
    /// for the baselines of `cuda_baseline`, which make it current themselves.
    pub fn raw_context(&self) -> sys::CUcontext {
        self.context
    }

    /// Runs `f` (one driver call, returning its raw `CUresult`) with this driver's
    /// context pushed, as every driver call does, for a memset or copy: the error
    /// names `function`, or the context push or pop when that is what failed.
    pub fn transfer(
        &self,
        function: &'static str,
        f: impl FnOnce() -> CuResult,
    ) -> Result<(), TransferError> {
        self.with_context(f).map_err(|(stage, code)| {
            let function = match stage {
                Stage::Push => "cuCtxPushCurrent_v2",
                Stage::Call => function,
                Stage::Pop => "cuCtxPopCurrent_v2",
            };
            TransferError { function, code }
        })
    }
    /// Whether the calling thread has no current CUDA context (`cuCtxGetCurrent`
    /// returns null, or fails). `true` when libcuda is absent. For the test that
    /// checks a call leaves the thread's context as it found it.
    #[doc(hidden)]
    pub fn current_context_is_null() -> bool {
        if !Self::is_available() {
            return true;
        }
        let mut current: sys::CUcontext = ptr::null_mut();
        // A panic (a symbol missing) is caught and read as "no context".
        let r = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: libcuda is present; `current` is a valid out-pointer.
            code(unsafe { sys::cuCtxGetCurrent(&mut current) })
        }));
        match r {
            Ok(c) if c.is_success() => current.is_null(),
            _ => true,
        }
    }
}
