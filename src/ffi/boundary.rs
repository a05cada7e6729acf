//! The boundary every C call passes: panics caught and returned as
//! `FLARE_STATUS_INTERNAL` (poisoning the pool the call was on), errors mapped to
//! their status with the message kept per thread, NULL and misaligned pointers
//! refused; and the two functions that read it back, `flare_status_name` and
//! `flare_last_error_message`.

use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use super::pool::FlarePool;
use super::types::{FlareStatus, RawStatus};
use crate::Error;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Replaces the calling thread's last error message.
pub(crate) fn set_last_error(message: String) {
    // try_with: during thread teardown the slot may be gone; the message is then lost
    // rather than panicking across the C boundary.
    let _ = LAST_ERROR.try_with(|m| {
        if let Ok(mut m) = m.try_borrow_mut() {
            *m = message;
        }
    });
}

/// Appends `"; "` and `more` to the calling thread's last error message.
pub(crate) fn append_last_error(more: &str) {
    let _ = LAST_ERROR.try_with(|m| {
        if let Ok(mut m) = m.try_borrow_mut() {
            m.push_str("; ");
            m.push_str(more);
        }
    });
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// The panic boundary of every status-returning function: runs `f`, maps its error
/// to a status and records the message, catches a panic as `FLARE_STATUS_INTERNAL`.
pub(crate) fn boundary(name: &'static str, f: impl FnOnce() -> Result<(), Error>) -> FlareStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => FlareStatus::FLARE_STATUS_SUCCESS,
        Ok(Err(e)) => {
            set_last_error(format!("{name}: {e}"));
            FlareStatus::from_error(&e)
        }
        Err(payload) => {
            set_last_error(format!(
                "{name}: internal error (a panic was caught at the C boundary): {}",
                panic_text(&*payload)
            ));
            FlareStatus::FLARE_STATUS_INTERNAL
        }
    }
}

/// The boundary of every function on a pool (all but create and destroy): a NULL
/// pool is `FLARE_STATUS_INVALID_ARGUMENT`; a poisoned pool is refused with
/// `FLARE_STATUS_INTERNAL`; otherwise runs `f` as [`boundary`] does, and a panic in it
/// poisons the pool.
pub(crate) fn pool_boundary(
    name: &'static str,
    pool: Result<&FlarePool, Error>,
    f: impl FnOnce(&FlarePool) -> Result<(), Error>,
) -> FlareStatus {
    let pool = match pool {
        Ok(pool) => pool,
        Err(e) => return boundary(name, || Err(e)),
    };
    if let Some(cause) = pool.poisoned.get() {
        set_last_error(format!(
            "{name}: the pool is poisoned: a panic was caught in an earlier call on it \
             ({cause}), so its books may be half-updated; every call on it but \
             flare_pool_destroy returns FLARE_STATUS_INTERNAL"
        ));
        return FlareStatus::FLARE_STATUS_INTERNAL;
    }
    match catch_unwind(AssertUnwindSafe(|| f(pool))) {
        Ok(result) => boundary(name, || result),
        Err(payload) => {
            let text = panic_text(&*payload).to_owned();
            set_last_error(format!(
                "{name}: internal error (a panic was caught at the C boundary): {text}; \
                 the pool is now poisoned: every later call on it but flare_pool_destroy \
                 returns FLARE_STATUS_INTERNAL"
            ));
            let _ = pool.poisoned.set(format!("{name}: {text}"));
            FlareStatus::FLARE_STATUS_INTERNAL
        }
    }
}

/// [`boundary`] for a check that yields a value: the value, or the status (the
/// message recorded).
pub(crate) fn boundary_value<T>(
    name: &'static str,
    f: impl FnOnce() -> Result<T, Error>,
) -> Result<T, FlareStatus> {
    let mut value = None;
    let status = boundary(name, || {
        value = Some(f()?);
        Ok(())
    });
    value.ok_or(status)
}

/// The error for a NULL pointer argument `what`.
pub(crate) fn null_error(what: &str) -> Error {
    Error::InvalidArgument(format!("{what} is NULL"))
}

/// `ptr` as an output the call may write: `Ok` when it is non-NULL and aligned, else
/// the invalid-argument error naming `what`.
pub(crate) fn check_out<T>(ptr: *const T, what: &str) -> Result<(), Error> {
    if ptr.is_null() {
        return Err(null_error(what));
    }
    if !ptr.is_aligned() {
        return Err(Error::InvalidArgument(format!("{what} is misaligned")));
    }
    Ok(())
}

/// The pool behind a caller's pointer.
///
/// # Safety
/// `pool` is NULL or was returned by `flare_pool_create` and not yet destroyed.
pub(crate) unsafe fn pool_ref<'a>(pool: *const FlarePool) -> Result<&'a FlarePool, Error> {
    // SAFETY: the caller guarantees `pool` is NULL or a live pointer from
    // `flare_pool_create` (a `Box<FlarePool>`); `FlarePool` is `Sync` and only shared
    // references are formed here, so concurrent calls are fine.
    unsafe { pool.as_ref() }.ok_or_else(|| null_error("pool"))
}

/// The enumerator's name (`"FLARE_STATUS_OUT_OF_MEMORY"`), or
/// `"FLARE_STATUS_UNRECOGNIZED"` for a value outside the enum. Static storage, never
/// NULL, never freed. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_status_name(status: RawStatus) -> *const c_char {
    let name: &'static CStr =
        FlareStatus::from_raw(status.0).map_or(c"FLARE_STATUS_UNRECOGNIZED", FlareStatus::name);
    name.as_ptr()
}

/// Copies the calling thread's last error message (UTF-8: the function, then what
/// failed, with the driver call, its `CUresult` and the sizes) into `buf` as a
/// NUL-terminated string truncated to `len - 1` bytes, and returns the message's full
/// length in bytes, without the NUL (so a return value `>= len` means it was
/// truncated; call again with a larger buffer).
///
/// The message is that of the last call on this thread that returned a status other
/// than `FLARE_STATUS_SUCCESS`; successful calls leave it as it is (read it right after
/// the failure), except a destroy that released live allocations, which records what
/// it released. Empty (returns 0) before any failure on this thread. `buf` NULL or
/// `len` 0: nothing is written; the length is still returned. Thread-safe (one
/// message per thread).
///
/// # Safety
/// `buf` is NULL or points to at least `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_last_error_message(buf: *mut c_char, len: usize) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        LAST_ERROR
            .try_with(|m| {
                let m = m.borrow();
                let bytes = m.as_bytes();
                if !buf.is_null() && len > 0 {
                    let n = bytes.len().min(len - 1);
                    // SAFETY: the caller guarantees `len` writable bytes at `buf`;
                    // `n + 1 <= len`, and the message is a separate Rust allocation.
                    unsafe {
                        ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, n);
                        buf.add(n).write(0);
                    }
                }
                bytes.len()
            })
            .unwrap_or(0)
    }))
    .unwrap_or(0)
}
