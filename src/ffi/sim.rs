//! The simulated backend's test hooks: fault injection (`flare_sim_inject_failure`)
//! and an injected panic (`flare_sim_inject_panic`), for testing how a caller copes
//! with driver failures and with `FLARE_STATUS_INTERNAL`.

use std::sync::atomic::Ordering;

use super::boundary::{pool_boundary, pool_ref};
use super::pool::FlarePool;
use super::types::{FlareDriverCall, FlareStatus, RawDriverCall};
use crate::driver::{CuResult, DriverCall};
use crate::Error;

/// Simulated backend only: makes the `nth` future call of kind `call` (1 = the next
/// one) fail with the `CUresult` value `cuda_error` (e.g. 2,
/// `CUDA_ERROR_OUT_OF_MEMORY`; 999, `CUDA_ERROR_UNKNOWN`). For testing how a caller
/// copes with driver failures.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool, an unknown `call`, `nth`
/// 0 or `cuda_error` <= 0; `FLARE_STATUS_NOT_SUPPORTED` on a CUDA pool. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_sim_inject_failure(
    pool: *mut FlarePool,
    call: RawDriverCall,
    nth: u32,
    cuda_error: i32,
) -> FlareStatus {
    // SAFETY: by the caller's contract.
    pool_boundary(
        "flare_sim_inject_failure",
        unsafe { pool_ref(pool) },
        |pool| {
            let kind = DriverCall::from(FlareDriverCall::parse(call.0, "call")?);
            if nth == 0 {
                return Err(Error::InvalidArgument(
                    "nth is 0: 1 is the next call".into(),
                ));
            }
            let code = match u32::try_from(cuda_error) {
                Ok(code) if code != 0 => CuResult(code),
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "cuda_error {cuda_error} is not a failure CUresult (must be > 0)"
                    )))
                }
            };
            let sim = pool.pool.sim_driver().ok_or(Error::NotSupported(
                "fault injection needs a simulated pool",
            ))?;
            sim.inject_failure(kind, nth, code);
            pool.injected_panic_point();
            Ok(())
        },
    )
}

/// Simulated backend only: makes the next call on this pool panic inside the
/// library, as a bug would, once its pool operation is done and before it writes its
/// outputs (an allocation is made but its pointer not returned, a free is done, a
/// snapshot is taken but not copied). For testing how a caller copes with
/// `FLARE_STATUS_INTERNAL`: that call returns it, and the pool is then poisoned
/// (every later call on it returns it, and says so); `flare_pool_destroy` still
/// releases what the pool holds, the allocation the panicking call made included.
/// `flare_pool_destroy` itself never fires the injected panic.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool;
/// `FLARE_STATUS_NOT_SUPPORTED` on a CUDA pool; `FLARE_STATUS_INTERNAL` on a poisoned
/// pool. Thread-safe (the next call on any thread panics).
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_sim_inject_panic(pool: *mut FlarePool) -> FlareStatus {
    // SAFETY: by the caller's contract.
    pool_boundary(
        "flare_sim_inject_panic",
        unsafe { pool_ref(pool) },
        |pool| {
            if pool.pool.sim_driver().is_none() {
                return Err(Error::NotSupported(
                    "panic injection needs a simulated pool",
                ));
            }
            pool.panic_next.store(true, Ordering::Relaxed);
            Ok(())
        },
    )
}
