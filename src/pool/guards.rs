//! The guards: [`Allocation`] frees its allocation on drop, [`RetentionScope`]
//! aborts its scope on drop; each acts only on what it made.

use super::Pool;
use crate::driver::{DevicePtr, Stream};
use crate::error::Result;

/// A live allocation that frees itself when dropped.
#[derive(Debug)]
pub struct Allocation<'a> {
    pub(super) pool: &'a Pool,
    pub(super) ptr: DevicePtr,
    pub(super) bytes: u64,
    /// Which allocation of the pool this is: dropping the guard frees the pointer
    /// only while it is still this allocation (not after a `free_raw` of it and a
    /// later allocation that reused the address).
    pub(super) id: u64,
    /// The stream it was allocated on ([`Pool::allocate_async`]): dropping the
    /// guard frees it there, stream-ordered. `None`: freed with [`Pool::free_raw`]'s
    /// rules.
    pub(super) stream: Option<Stream>,
}

impl Allocation<'_> {
    /// The stream the allocation was made on (`None` for [`Pool::allocate`]).
    pub fn stream(&self) -> Option<Stream> {
        self.stream
    }

    /// The device address, aligned to the granularity.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The size asked for, bytes (the mapping behind it may be larger).
    pub fn size(&self) -> u64 {
        self.bytes
    }

    /// Gives up the guard without freeing; returns the address, to be freed later
    /// with [`Pool::free_raw`].
    pub fn into_raw(self) -> DevicePtr {
        let ptr = self.ptr;
        std::mem::forget(self);
        ptr
    }
}

impl Drop for Allocation<'_> {
    fn drop(&mut self) {
        // Refused only when the caller already freed this allocation with
        // `free_raw`: then there is nothing left to free.
        let _ = match self.stream {
            Some(s) => self.pool.free_async_inner(self.ptr, s, Some(self.id)),
            None => self.pool.free_inner(self.ptr, Some(self.id)),
        };
    }
}

/// An open retention scope; finish it with [`RetentionScope::finish`]. Dropping it
/// without finishing aborts the scope (the release is the same; the snapshot counts
/// it as aborted).
#[derive(Debug)]
pub struct RetentionScope<'a> {
    pub(super) pool: &'a Pool,
    /// The scope this guard opened: it never closes another one.
    pub(super) epoch: u64,
    pub(super) open: bool,
}

impl RetentionScope<'_> {
    /// Finishes the scope: see [`Pool::retention_finish`].
    ///
    /// Errors: as [`Pool::retention_finish`]; [`Error::ScopeState`](crate::Error::ScopeState) also when this
    /// guard's scope was already closed by a direct `retention_finish` or
    /// `retention_abort` call (a later scope, if one is open, is left alone).
    pub fn finish(mut self) -> Result<()> {
        self.open = false;
        self.pool.close_scope(false, Some(self.epoch))
    }

    /// Aborts the scope: see [`Pool::retention_abort`]. Errors: as
    /// [`RetentionScope::finish`].
    pub fn abort(mut self) -> Result<()> {
        self.open = false;
        self.pool.close_scope(true, Some(self.epoch))
    }
}

impl Drop for RetentionScope<'_> {
    fn drop(&mut self) {
        if self.open {
            // Refused only when this scope was already closed directly.
            let _ = self.pool.close_scope(true, Some(self.epoch));
        }
    }
}
