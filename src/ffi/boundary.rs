//! The boundary every C call passes: panics caught and returned as
//! `FLARE_STATUS_INTERNAL` (poisoning the pool the call was on), errors mapped to
//! their status with the message kept per thread, NULL and misaligned pointers
//! refused; and the two functions that read it back, `flare_status_name` and
//! `flare_last_error_message`.

use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

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
/// pool (`None`) is `FLARE_STATUS_INVALID_ARGUMENT`; a poisoned pool is refused with
/// `FLARE_STATUS_INTERNAL`; otherwise runs `f` as [`boundary`] does, and a panic in it
/// poisons the pool.
pub(crate) fn pool_boundary(
    name: &'static str,
    pool: Option<&FlarePool>,
    f: impl FnOnce(&FlarePool) -> Result<(), Error>,
) -> FlareStatus {
    let pool = match pool {
        Some(pool) => pool,
        None => return boundary(name, || Err(null_error("pool"))),
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

/// A caller's output pointer `ptr` (the argument `what`) as a safe value: the
/// place to write, or, when it is NULL or misaligned, the invalid-argument error
/// ([`check_out`]) for the call to return where it checks its outputs.
///
/// # Safety
/// `ptr` is NULL, misaligned, or valid for writes of a `T` during `'a` and not
/// accessed otherwise during it.
pub(crate) unsafe fn out_arg<'a, T>(
    ptr: *mut T,
    what: &str,
) -> Result<&'a mut MaybeUninit<T>, Error> {
    check_out(ptr, what)?;
    // SAFETY: non-NULL and aligned (checked above); writable and unaliased during
    // `'a` by the caller's contract; `MaybeUninit` makes no claim on the contents.
    Ok(unsafe { &mut *ptr.cast::<MaybeUninit<T>>() })
}

/// A caller's string buffer (`char *buf` of `len` bytes) as a safe value: `None`
/// when NULL.
///
/// # Safety
/// `buf` is NULL or points to at least `len` writable bytes, not accessed otherwise
/// during `'a`.
pub(crate) unsafe fn c_buffer<'a>(
    buf: *mut c_char,
    len: usize,
) -> Option<&'a mut [MaybeUninit<c_char>]> {
    let buf = NonNull::new(buf)?;
    // SAFETY: non-NULL; `len` writable bytes (so `len <= isize::MAX`), not accessed
    // otherwise, by the caller's contract; `c_char` has alignment 1.
    Some(unsafe { std::slice::from_raw_parts_mut(buf.as_ptr().cast::<MaybeUninit<c_char>>(), len) })
}

/// Copies `bytes` into `buf` as a NUL-terminated string truncated to `buf.len() - 1`
/// bytes and returns `bytes.len()`; `buf` `None` or empty: nothing is written.
pub(crate) fn copy_c_string(bytes: &[u8], buf: Option<&mut [MaybeUninit<c_char>]>) -> usize {
    if let Some(buf) = buf {
        if let Some(last) = buf.len().checked_sub(1) {
            let n = bytes.len().min(last);
            for (to, &from) in buf.iter_mut().zip(&bytes[..n]) {
                to.write(from as c_char);
            }
            buf[n].write(0);
        }
    }
    bytes.len()
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
    // SAFETY: `buf` is NULL or has `len` writable bytes, by the caller's contract.
    flare_last_error_message_inner(unsafe { c_buffer(buf, len) })
}

/// `flare_last_error_message` on the caller's buffer.
fn flare_last_error_message_inner(buf: Option<&mut [MaybeUninit<c_char>]>) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        LAST_ERROR
            .try_with(|m| copy_c_string(m.borrow().as_bytes(), buf))
            .unwrap_or(0)
    }))
    .unwrap_or(0)
}
