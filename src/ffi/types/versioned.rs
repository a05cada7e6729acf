//! The `struct_size` prefix rule every versioned struct follows, and the safe
//! writing of a caller's versioned output struct.

use std::marker::PhantomData;
use std::mem::size_of;
use std::ptr;

use super::super::boundary::check_out;
use super::{FlareDestroyReport, FlareSnapshot, FlareTagCensus};
use crate::Error;

/// The largest `struct_size` accepted from a caller.
const MAX_STRUCT_SIZE: u32 = 4096;
/// Checks a caller's `struct_size` and returns how many leading bytes of the struct
/// to read or write: the end of the last field lying wholly inside it (at most the
/// library's own size). `field_ends` is in layout order (`FIELD_ENDS`).
pub(crate) fn struct_prefix<T>(
    what: &str,
    struct_size: u32,
    field_ends: &[usize],
) -> Result<usize, Error> {
    let min = field_ends.get(1).copied().unwrap_or(size_of::<T>());
    if (struct_size as usize) < min || struct_size > MAX_STRUCT_SIZE {
        return Err(Error::InvalidArgument(format!(
            "{what}.struct_size is {struct_size}: must be between {min} and {MAX_STRUCT_SIZE} (sizeof is {})",
            size_of::<T>()
        )));
    }
    Ok(field_ends
        .iter()
        .copied()
        .filter(|&end| end <= struct_size as usize)
        .max()
        .unwrap_or(min))
}

/// A versioned output struct of the C ABI that is written by a prefix copy
/// ([`VersionedOut`]).
///
/// # Safety
/// `Self` is a `#[repr(C)]` struct with no padding whose first field is
/// `struct_size: u32`, and [`VersionedOutput::ENDS`] is the end of each of its fields
/// in layout order (its `FIELD_ENDS`).
pub(crate) unsafe trait VersionedOutput: Sized {
    /// The end of each field, bytes from the start, in layout order.
    const ENDS: &'static [usize];
}

// SAFETY: `versioned_struct!` makes each a `#[repr(C)]` struct starting with
// `struct_size: u32`, its `FIELD_ENDS` in layout order; their fields are `u32`s in
// pairs and `u64`s, so there is no padding (`types::tests` checks the layouts).
unsafe impl VersionedOutput for FlareSnapshot {
    const ENDS: &'static [usize] = &FlareSnapshot::FIELD_ENDS;
}
// SAFETY: as for `FlareSnapshot`.
unsafe impl VersionedOutput for FlareTagCensus {
    const ENDS: &'static [usize] = &FlareTagCensus::FIELD_ENDS;
}
// SAFETY: as for `FlareSnapshot`.
unsafe impl VersionedOutput for FlareDestroyReport {
    const ENDS: &'static [usize] = &FlareDestroyReport::FIELD_ENDS;
}

/// A caller's versioned output struct (`FlareSnapshot *out` and the like) as a safe
/// value: NULL, or a struct of at least its `struct_size` writable bytes. Checked by
/// [`VersionedOut::check`], written by [`CheckedOut::write`].
pub(crate) struct VersionedOut<'a, T: VersionedOutput> {
    ptr: *mut T,
    _caller: PhantomData<&'a mut T>,
}

impl<'a, T: VersionedOutput> VersionedOut<'a, T> {
    /// The caller's output pointer.
    ///
    /// # Safety
    /// `ptr` is NULL or, when aligned, points to a struct whose first field
    /// (`struct_size`, a `uint32_t`) is readable and which has at least `struct_size`
    /// writable bytes, none of them accessed otherwise during `'a`.
    pub(crate) unsafe fn new(ptr: *mut T) -> Self {
        VersionedOut {
            ptr,
            _caller: PhantomData,
        }
    }

    /// Checks the struct, the argument `arg` (a `what`): non-NULL, aligned, a valid
    /// `struct_size` ([`struct_prefix`]); returns the struct with how many leading
    /// bytes to write.
    pub(crate) fn check(self, arg: &str, what: &str) -> Result<CheckedOut<'a, T>, Error> {
        check_out(self.ptr, arg)?;
        // SAFETY: non-NULL and aligned, so by `new`'s contract its first field, a
        // `u32`, is readable.
        let struct_size = unsafe { self.ptr.cast::<u32>().read() };
        let prefix = struct_prefix::<T>(what, struct_size, T::ENDS)?;
        Ok(CheckedOut {
            ptr: self.ptr,
            prefix,
            _caller: PhantomData,
        })
    }
}

/// A caller's versioned output struct that passed [`VersionedOut::check`]: non-NULL,
/// aligned, with at least `prefix` writable bytes.
pub(crate) struct CheckedOut<'a, T: VersionedOutput> {
    ptr: *mut T,
    /// The end of the last field lying wholly inside the caller's `struct_size`.
    prefix: usize,
    _caller: PhantomData<&'a mut T>,
}

impl<T: VersionedOutput> CheckedOut<'_, T> {
    /// Copies the fields of `value` lying wholly inside the caller's `struct_size` to
    /// the caller's struct, except its leading `u32` (`struct_size`, which stays the
    /// caller's).
    pub(crate) fn write(self, value: &T) {
        let skip = size_of::<u32>();
        // SAFETY: `ptr` is non-NULL, aligned and has at least `prefix` writable bytes
        // (`check`, by `VersionedOut::new`'s contract); `prefix` is a field end of `T`
        // ([`struct_prefix`]), so at least 4 (the minimum covers two fields) and at
        // most `size_of::<T>()`; `T` has no padding (`VersionedOutput`), so every byte
        // copied from `value`, a separate Rust value, is initialised.
        unsafe {
            ptr::copy_nonoverlapping(
                ptr::from_ref(value).cast::<u8>().add(skip),
                self.ptr.cast::<u8>().add(skip),
                self.prefix - skip,
            )
        };
    }
}
