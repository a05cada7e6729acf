//! The simulated backend's test hooks: fault injection (`flare_sim_inject_failure`)
//! and an injected panic (`flare_sim_inject_panic`), for testing how a caller copes
//! with driver failures and with `FLARE_STATUS_INTERNAL`; and the simulated device's
//! streams (create, launch work, complete it, capture) and the contract faults it saw,
//! for testing stream order (issue 11) without a GPU.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::boundary::{out_arg, pool_boundary};
use super::pool::FlarePool;
use super::types::{FlareDriverCall, FlareStatus, FlareStream, RawDriverCall};
use crate::driver::sim::{
    CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
};
use crate::driver::{CaptureMode, CuResult, DriverCall, DriverError};
use crate::{Error, SimDriver};

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
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_sim_inject_failure_inner(unsafe { pool.as_ref() }, call, nth, cuda_error)
}

/// `flare_sim_inject_failure` on the caller's pool.
fn flare_sim_inject_failure_inner(
    pool: Option<&FlarePool>,
    call: RawDriverCall,
    nth: u32,
    cuda_error: i32,
) -> FlareStatus {
    pool_boundary("flare_sim_inject_failure", pool, |pool| {
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
    })
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
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_sim_inject_panic_inner(unsafe { pool.as_ref() })
}

/// `flare_sim_inject_panic` on the caller's pool.
fn flare_sim_inject_panic_inner(pool: Option<&FlarePool>) -> FlareStatus {
    pool_boundary("flare_sim_inject_panic", pool, |pool| {
        if pool.pool.sim_driver().is_none() {
            return Err(Error::NotSupported(
                "panic injection needs a simulated pool",
            ));
        }
        pool.panic_next.store(true, Ordering::Relaxed);
        Ok(())
    })
}

/// The simulated driver under `pool`, or `FLARE_STATUS_NOT_SUPPORTED` on a CUDA pool.
fn sim_of(pool: &FlarePool) -> Result<Arc<SimDriver>, Error> {
    pool.pool.sim_driver().ok_or(Error::NotSupported(
        "simulated streams and captures need a simulated pool",
    ))
}

/// Creates a stream of `sim` on `device` (the simulated driver creates streams on
/// the calling thread's current device, `cuCtxSetCurrent`: switch to it and back).
/// `after` runs between the creation and the error check (a pool's injected panic
/// point).
///
/// Errors: [`Error::Driver`] (`cuStreamCreate`) when the simulated driver refuses.
pub(super) fn create_stream_on(
    sim: &SimDriver,
    device: i32,
    after: impl FnOnce(),
) -> Result<FlareStream, Error> {
    let previous = sim.ctx_get_device();
    let switched = sim.ctx_set_current(device);
    let created = sim.stream_create();
    if switched.is_success() {
        let _ = sim.ctx_set_current(previous);
    }
    after();
    let stream = created.map_err(|code| Error::Driver {
        source: DriverError::new(DriverCall::StreamCreate, code),
        bytes: 0,
    })?;
    Ok(stream as usize as FlareStream)
}

/// Ends the capture of `stream` on `sim`: 1 when it ended valid, 0 when something
/// invalidated it (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`). `after` runs between
/// the call and the check.
///
/// Errors: [`refused`]'s, for every other failure.
pub(super) fn end_capture_on(
    sim: &SimDriver,
    stream: FlareStream,
    after: impl FnOnce(),
) -> Result<c_int, Error> {
    let code = sim.stream_end_capture(handle(stream));
    after();
    match code {
        CuResult::STREAM_CAPTURE_INVALIDATED => Ok(0),
        code => refused("cuStreamEndCapture", stream, code).map(|()| 1),
    }
}

/// A simulated stream handle as C passes it.
pub(super) fn handle(stream: FlareStream) -> u64 {
    stream as usize as u64
}

/// `Ok` for `CUDA_SUCCESS`; else the invalid-argument error saying that the simulated
/// driver refused `call` (a CUDA function's name) on `stream`, with the `CUresult`
/// and what it means there. Every refusal of these test controls comes from the
/// caller's use of them (a handle that is no stream, a range not mapped, a capture in
/// the wrong state), and changes nothing.
pub(super) fn refused(call: &str, stream: FlareStream, code: CuResult) -> Result<(), Error> {
    if code.is_success() {
        return Ok(());
    }
    let why = match code {
        CUDA_ERROR_INVALID_HANDLE => "not a live stream of this pool's simulated driver",
        CuResult::INVALID_VALUE => {
            "a byte of the range is not mapped with access for the stream's device"
        }
        CUDA_ERROR_ILLEGAL_STATE => "the stream is not in a capture state that allows it",
        CuResult::STREAM_CAPTURE_UNSUPPORTED => "the legacy stream cannot be captured",
        CuResult::STREAM_CAPTURE_INVALIDATED => "the stream's capture was invalidated: end it",
        CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => {
            "the stream joined a capture that another stream began"
        }
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => {
            "the legacy stream would depend on a captured blocking stream"
        }
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => "the capture was begun on another thread",
        _ => "refused by the simulated driver",
    };
    Err(Error::InvalidArgument(format!(
        "{call} on stream {:#x}: {code}: {why}",
        handle(stream)
    )))
}

/// Simulated backend only: creates a stream on the pool's device (`cuStreamCreate`
/// with `CU_STREAM_NON_BLOCKING`, the kind PyTorch uses and the kind the measured rows
/// of `docs/vmm-semantics.md` were taken with: it does not synchronize with the legacy
/// stream) and writes its handle to `*out_stream` (never NULL; the handle of the
/// stream `flare_sim_stream_destroy` destroyed last, when one is free, as the CUDA
/// driver may hand a destroyed stream's handle to the next stream). Each pool has its
/// own simulated driver, so a handle is a stream of the pool that made it only.
/// Streams live as long as the pool unless destroyed.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool or `out_stream`;
/// `FLARE_STATUS_NOT_SUPPORTED` on a CUDA pool; `FLARE_STATUS_INTERNAL` on a poisoned
/// pool. Nothing is written on failure. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool; `out_stream` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn flare_sim_stream_create(
    pool: *mut FlarePool,
    out_stream: *mut FlareStream,
) -> FlareStatus {
    flare_sim_stream_create_inner(
        // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
        unsafe { pool.as_ref() },
        // SAFETY: `out_stream` is NULL or writable, by the caller's contract.
        unsafe { out_arg(out_stream, "out_stream") },
    )
}

/// `flare_sim_stream_create` on the caller's pool and output.
fn flare_sim_stream_create_inner(
    pool: Option<&FlarePool>,
    out_stream: Result<&mut MaybeUninit<FlareStream>, Error>,
) -> FlareStatus {
    pool_boundary("flare_sim_stream_create", pool, |pool| {
        let out_stream = out_stream?;
        let sim = sim_of(pool)?;
        let stream = create_stream_on(&sim, pool.device, || pool.injected_panic_point())?;
        out_stream.write(stream);
        Ok(())
    })
}

/// Simulated backend only: destroys `stream` (`cuStreamDestroy`): its handle is
/// refused from then on (a launch or a completion naming it, a pool's event record on
/// it: `CUDA_ERROR_INVALID_HANDLE`) until `flare_sim_stream_create` hands the same
/// value to a new stream, which is ordered after none of the old stream's work. Work
/// already queued on it still runs until a device synchronize, an event recorded on
/// it before, or `flare_sim_stream_complete` of the handle while no live stream has
/// it. Call `flare_pool_forget_stream` first for a stream the pool has seen.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool, and when the simulated
/// driver refuses (nothing changes; the message gives the `CUresult`): `stream` NULL
/// or a handle that is not a live stream of this pool (`CUDA_ERROR_INVALID_HANDLE`),
/// a stream in an open capture (`CUDA_ERROR_ILLEGAL_STATE`);
/// `FLARE_STATUS_NOT_SUPPORTED` on a CUDA pool; `FLARE_STATUS_INTERNAL` on a poisoned
/// pool. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_sim_stream_destroy(
    pool: *mut FlarePool,
    stream: FlareStream,
) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_sim_stream_destroy_inner(unsafe { pool.as_ref() }, stream)
}

/// `flare_sim_stream_destroy` on the caller's pool.
fn flare_sim_stream_destroy_inner(pool: Option<&FlarePool>, stream: FlareStream) -> FlareStatus {
    pool_boundary("flare_sim_stream_destroy", pool, |pool| {
        let sim = sim_of(pool)?;
        let code = sim.stream_destroy(handle(stream));
        pool.injected_panic_point();
        refused("cuStreamDestroy", stream, code)
    })
}

/// Simulated backend only: queues work on `stream` (a kernel launch,
/// `cuLaunchKernel`) that reads and writes `[ptr, ptr + bytes)` until it completes:
/// `flare_sim_stream_complete` of the stream (or of a stream ordered after it), or
/// any synchronize that covers it (an event synchronize, a device synchronize).
/// While it is queued, unmapping any of those bytes, or handing them to another
/// stream not ordered after it, is a contract fault (`flare_sim_faults`). On a stream
/// being captured the launch is a graph node instead: nothing is queued. `bytes` 0
/// touches nothing but is still work in the stream's order.
///
/// `stream` NULL: the legacy default stream (of the calling thread's current device,
/// device 0 in the simulated driver), which waits for, and is waited for by, blocking
/// streams only.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool, and when the simulated
/// driver refuses the launch (nothing queued; the message gives the `CUresult`): a
/// handle that is not a stream of this pool (`CUDA_ERROR_INVALID_HANDLE`), a byte of
/// the range not mapped with access for the stream's device
/// (`CUDA_ERROR_INVALID_VALUE`: on a GPU the launch would succeed and the kernel
/// fault), a stream whose capture was invalidated
/// (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`); `FLARE_STATUS_NOT_SUPPORTED` on a CUDA
/// pool; `FLARE_STATUS_INTERNAL` on a poisoned pool. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool. `ptr` is a device address, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn flare_sim_launch(
    pool: *mut FlarePool,
    stream: FlareStream,
    ptr: *const c_void,
    bytes: usize,
) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract; `ptr` is a
    // device address, never dereferenced.
    flare_sim_launch_inner(unsafe { pool.as_ref() }, stream, ptr, bytes)
}

/// `flare_sim_launch` on the caller's pool; `ptr` is never dereferenced.
fn flare_sim_launch_inner(
    pool: Option<&FlarePool>,
    stream: FlareStream,
    ptr: *const c_void,
    bytes: usize,
) -> FlareStatus {
    pool_boundary("flare_sim_launch", pool, |pool| {
        let sim = sim_of(pool)?;
        let code = sim.launch(handle(stream), ptr as usize as u64, bytes as u64);
        pool.injected_panic_point();
        refused("cuLaunchKernel", stream, code)
    })
}

/// Simulated backend only: the device finishes all the work queued on `stream` so
/// far, and all the work it was ordered after (events it waited on; on the legacy
/// stream, earlier work of blocking streams). The test's stand-in for time passing on
/// the GPU: it is no driver call, breaks no capture and is not counted. `stream` NULL:
/// the legacy default stream.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool or a handle that was never
/// a stream of this pool (`CUDA_ERROR_INVALID_HANDLE`); `FLARE_STATUS_NOT_SUPPORTED`
/// on a CUDA pool; `FLARE_STATUS_INTERNAL` on a poisoned pool. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_sim_stream_complete(
    pool: *mut FlarePool,
    stream: FlareStream,
) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_sim_stream_complete_inner(unsafe { pool.as_ref() }, stream)
}

/// `flare_sim_stream_complete` on the caller's pool.
fn flare_sim_stream_complete_inner(pool: Option<&FlarePool>, stream: FlareStream) -> FlareStatus {
    pool_boundary("flare_sim_stream_complete", pool, |pool| {
        let sim = sim_of(pool)?;
        let code = sim.stream_complete(handle(stream));
        pool.injected_panic_point();
        refused("stream completion", stream, code)
    })
}

/// Simulated backend only: begins capturing `stream` on the calling thread
/// (`cuStreamBeginCapture`) in global capture mode (`CU_STREAM_CAPTURE_MODE_GLOBAL`,
/// PyTorch's default for `torch.cuda.graph`). From now on launches on `stream` are
/// graph nodes, not work. While the capture is open, an event query or synchronize,
/// or a stream query or synchronize, on any stream from any thread in global mode, and
/// a device synchronize (`cuCtxSynchronize`) in any mode, invalidate it and count a
/// contract fault; the same event and stream calls from a thread switched to relaxed
/// mode (`cuThreadExchangeStreamCaptureMode`) leave it valid. These are the rows
/// measured on an H200 (`docs/vmm-semantics.md`, "Events and stream queries while
/// another stream is captured" and "Stream capture"); every VMM call stays legal.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool, and when the simulated
/// driver refuses (nothing begins; the message gives the `CUresult`): `stream` NULL
/// (the legacy stream cannot be captured, `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), a
/// handle that is not a stream of this pool, a stream already being captured
/// (`CUDA_ERROR_ILLEGAL_STATE`); `FLARE_STATUS_NOT_SUPPORTED` on a CUDA pool;
/// `FLARE_STATUS_INTERNAL` on a poisoned pool. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_sim_begin_capture(
    pool: *mut FlarePool,
    stream: FlareStream,
) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_sim_begin_capture_inner(unsafe { pool.as_ref() }, stream)
}

/// `flare_sim_begin_capture` on the caller's pool.
fn flare_sim_begin_capture_inner(pool: Option<&FlarePool>, stream: FlareStream) -> FlareStatus {
    pool_boundary("flare_sim_begin_capture", pool, |pool| {
        let sim = sim_of(pool)?;
        let code = sim.stream_begin_capture(handle(stream), CaptureMode::Global);
        pool.injected_panic_point();
        refused("cuStreamBeginCapture", stream, code)
    })
}

/// Simulated backend only: ends the capture `flare_sim_begin_capture` began on
/// `stream` (`cuStreamEndCapture`), on the thread that began it, and writes to
/// `*out_valid` 1 when the capture ended valid (the graph could be instantiated), 0
/// when something invalidated it (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`: a call that
/// breaks a capture was made while it was open, see `flare_sim_begin_capture`). The
/// capture ends in both cases; an invalidated one is a success of this call.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool or `out_valid`, and when the
/// simulated driver refuses (the capture, if any, stays open; the message gives the
/// `CUresult`): a handle that is not a stream of this pool, a stream not being
/// captured (`CUDA_ERROR_ILLEGAL_STATE`), a call from another thread than the one
/// that began the capture (`CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`);
/// `FLARE_STATUS_NOT_SUPPORTED` on a CUDA pool; `FLARE_STATUS_INTERNAL` on a poisoned
/// pool. Nothing is written on failure.
///
/// # Safety
/// `pool` is NULL or a live pool; `out_valid` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn flare_sim_end_capture(
    pool: *mut FlarePool,
    stream: FlareStream,
    out_valid: *mut c_int,
) -> FlareStatus {
    flare_sim_end_capture_inner(
        // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
        unsafe { pool.as_ref() },
        stream,
        // SAFETY: `out_valid` is NULL or writable, by the caller's contract.
        unsafe { out_arg(out_valid, "out_valid") },
    )
}

/// `flare_sim_end_capture` on the caller's pool and output.
fn flare_sim_end_capture_inner(
    pool: Option<&FlarePool>,
    stream: FlareStream,
    out_valid: Result<&mut MaybeUninit<c_int>, Error>,
) -> FlareStatus {
    pool_boundary("flare_sim_end_capture", pool, |pool| {
        let out_valid = out_valid?;
        let sim = sim_of(pool)?;
        let valid = end_capture_on(&sim, stream, || pool.injected_panic_point())?;
        out_valid.write(valid);
        Ok(())
    })
}

/// Simulated backend only: writes to `*out_faults` how many contract faults the pool's
/// simulated driver has seen since the pool was created: unmapping memory that queued
/// work (`flare_sim_launch`) still touches; handing memory to a stream (a
/// stream-ordered allocation) while another stream's queued work, not ordered before
/// it, still touches it; a call that broke an open stream capture (a synchronize, an
/// event or stream query in global mode). On a GPU each would be a kernel fault, a
/// data race or an invalidated capture. A correct pool keeps it at 0.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool or `out_faults`;
/// `FLARE_STATUS_NOT_SUPPORTED` on a CUDA pool; `FLARE_STATUS_INTERNAL` on a poisoned
/// pool. Nothing is written on failure. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool; `out_faults` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn flare_sim_faults(
    pool: *const FlarePool,
    out_faults: *mut u64,
) -> FlareStatus {
    flare_sim_faults_inner(
        // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
        unsafe { pool.as_ref() },
        // SAFETY: `out_faults` is NULL or writable, by the caller's contract.
        unsafe { out_arg(out_faults, "out_faults") },
    )
}

/// `flare_sim_faults` on the caller's pool and output.
fn flare_sim_faults_inner(
    pool: Option<&FlarePool>,
    out_faults: Result<&mut MaybeUninit<u64>, Error>,
) -> FlareStatus {
    pool_boundary("flare_sim_faults", pool, |pool| {
        let out_faults = out_faults?;
        let faults = sim_of(pool)?.contract_faults();
        pool.injected_panic_point();
        out_faults.write(faults);
        Ok(())
    })
}
