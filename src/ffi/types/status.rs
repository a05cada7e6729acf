//! `FlareStatus`: the outcome of every call, and its integer form as C passes it.

use super::super::generate::c_enum;

c_enum! {
    /// The outcome of a call. The numbers are stable. On a status other than
    /// `FLARE_STATUS_SUCCESS`, `flare_last_error_message` gives the detail.
    pub enum FlareStatus from Error;
    /// The call did what it says; its outputs are written.
    FLARE_STATUS_SUCCESS = 0;
    /// A NULL pointer, a size of 0 bytes, a bad `struct_size`, an unknown enum value,
    /// a negative device ordinal. Nothing changed.
    FLARE_STATUS_INVALID_ARGUMENT = 1 <- InvalidArgument;
    /// The device has no room for the request now. Outside a retention scope the pool
    /// already released its idle mappings and retried once; inside one, nothing
    /// retained was released. Freeing memory can make the request succeed (a request
    /// that never can is `FLARE_STATUS_REQUEST_TOO_LARGE`).
    FLARE_STATUS_OUT_OF_MEMORY = 2 <- OutOfMemory;
    /// The operation is not available on this backend (fault injection on a CUDA
    /// pool).
    FLARE_STATUS_NOT_SUPPORTED = 3 <- NotSupported;
    /// The pointer was not handed out by this pool, is interior to an allocation, or
    /// was already freed. Nothing changed.
    FLARE_STATUS_UNKNOWN_POINTER = 4 <- UnknownPointer;
    /// A retention-scope call in the wrong state: begin while a scope is open,
    /// finish/abort with none open, trim inside a scope. Nothing changed.
    FLARE_STATUS_SCOPE_STATE = 5 <- ScopeState;
    /// A CUDA driver call failed; the message names the call, its `CUresult` and the
    /// size. The pool stays usable: what the driver refused to release is kept and
    /// retried at the next release point (finish, abort, trim, a free outside a
    /// scope).
    FLARE_STATUS_DRIVER_ERROR = 6 <- Driver;
    /// No CUDA driver could be loaded or initialised (libcuda absent, no device).
    FLARE_STATUS_NO_DRIVER = 7 <- NoDriver;
    /// A bug in the library (a panic caught at the C boundary). The message has the
    /// panic's text. The pool the call was on is poisoned: every later call on it
    /// returns this status too (the message says the pool is poisoned), except
    /// `flare_pool_destroy`, which still releases what the pool holds.
    FLARE_STATUS_INTERNAL = 8;
    /// The request, rounded up to the granularity, is more than the device's total
    /// memory: it can never succeed, whatever is freed. Refused at once: no driver
    /// call, nothing released, nothing counted.
    FLARE_STATUS_REQUEST_TOO_LARGE = 9 <- RequestTooLarge;
    /// A tag in the wrong state (issue 15): allocating or freeing with a tag that
    /// sleeps, sleeping a tag that sleeps, waking one that does not. Nothing changed.
    FLARE_STATUS_TAG_STATE = 10 <- TagState;
    /// A stream in the wrong state for the call (issue 34): forgetting a stream
    /// (`flare_pool_forget_stream`) while it is being captured. Nothing changed.
    FLARE_STATUS_STREAM_STATE = 11 <- StreamState;
    /// A file could not be written (`flare_pool_dump_snapshot`, issue 38: a missing
    /// directory, no permission, a full disk); the message names the file and the
    /// system's reason. The pool is unchanged.
    FLARE_STATUS_IO = 12 <- Io;
}
/// A `FlareStatus` as C passes it: read as its integer so that any value is
/// defined. Rendered as `FlareStatus` in the header.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStatus(pub u32);
