//! Making the pool's context current around a driver call: push, call, pop, with a
//! guard that pops even when the call panics.

use std::ptr;

use cudarc::driver::sys;

use super::conversions::code;
use super::CudaDriver;
use crate::driver::{check, CuResult, DriverCall, DriverError};

/// Which step of [`CudaDriver::with_context`] failed.
#[derive(Clone, Copy, Debug)]
pub(super) enum Stage {
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
    /// Runs `f` (one driver call, returning its raw `CUresult`) with the pool's
    /// context pushed on the calling thread, then pops it, so the thread's context
    /// stack is left as it was (a panic in `f` pops too). The error is the first
    /// failure of push, call and pop, with the stage that failed; on a failed push
    /// `f` is not run.
    pub(super) fn with_context(
        &self,
        f: impl FnOnce() -> CuResult,
    ) -> Result<(), (Stage, CuResult)> {
        self.with_context_of(self.context, f)
    }

    /// [`CudaDriver::with_context`] with `context` (this driver's or a peer's
    /// retained primary context) pushed instead.
    pub(super) fn with_context_of(
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
    pub(super) fn in_context(
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
    pub(super) fn in_context_if(
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
