//! The crate's error type.

use crate::driver::{CuResult, DriverCall, DriverError};
use crate::units::fmt_bytes;

/// Everything a pool operation can fail with. Each variant keeps what a caller needs
/// to act: byte counts, the driver call and its raw `CUresult`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument is out of range: a size of 0 bytes, a size whose rounding to the
    /// granularity overflows, or a bad configuration. The string says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The device has no room for `requested` bytes now. Outside a retention scope
    /// the pool already released its idle mappings and retried once; inside a scope
    /// nothing retained is released, so `idle` bytes may still be held. (A request
    /// larger than the device's total memory is [`Error::RequestTooLarge`] instead.)
    #[error(
        "out of memory{}: {} live, {} retained idle, {} requested{}; {}",
        if *.in_scope { " inside a retention scope" } else { "" },
        fmt_bytes(*.live), fmt_bytes(*.idle), fmt_bytes(*.requested),
        driver_cause(.source),
        oom_advice(*.in_scope)
    )]
    OutOfMemory {
        /// Bytes asked for, rounded up to the granularity.
        requested: u64,
        /// Bytes mapped to live allocations when the request failed (in segment
        /// mode, live blocks included: the snapshot's `live_mapped_bytes +
        /// block_live_bytes`).
        live: u64,
        /// Bytes held idle (retained or cached) when the request failed (in segment
        /// mode, free blocks included: `idle_bytes + block_free_bytes`).
        idle: u64,
        /// Whether a retention scope was open.
        in_scope: bool,
        /// The driver's out-of-memory failure (`None` only for an error built
        /// without one).
        source: Option<DriverError>,
    },

    /// The request, `requested` bytes rounded up to the granularity, is more than
    /// the device's total memory (`cuMemGetInfo`'s total when the pool was
    /// created): no amount of freeing can make room. Returned at once, with no
    /// driver call, nothing released and nothing counted.
    #[error(
        "request too large: {} requested ({requested} bytes), more than the device's \
         total memory of {} ({device_total} bytes); no amount of freeing can make room",
        fmt_bytes(*.requested), fmt_bytes(*.device_total)
    )]
    RequestTooLarge {
        /// Bytes asked for, rounded up to the granularity.
        requested: u64,
        /// The device's total memory, bytes.
        device_total: u64,
    },

    /// The pointer was not handed out by this pool, is interior to an allocation, or
    /// was already freed. Nothing changed.
    #[error("unknown pointer {ptr:#x}: not an allocation of this pool (interior pointer, or already freed)")]
    UnknownPointer {
        /// The pointer passed in.
        ptr: u64,
    },

    /// A retention-scope operation in the wrong state: `begin` while a scope is open,
    /// `finish`/`abort` with none open, `trim` inside a scope.
    #[error("retention scope state: {0}")]
    ScopeState(&'static str),

    /// A tag-state error (issue 15): allocating or freeing with a tag that sleeps (or
    /// is being put to sleep or woken), sleeping a tag that already sleeps, waking one
    /// that does not. Nothing changed.
    #[error("tag {tag}: {reason}")]
    TagState {
        /// The tag the call named (0: the untagged functions').
        tag: u32,
        /// What is wrong.
        reason: &'static str,
    },
    /// A stream in the wrong state for the call (issue 34):
    /// [`Pool::forget_stream`](crate::Pool::forget_stream) of a stream being
    /// captured. Nothing changed.
    #[error("stream {stream:#x}: {reason}")]
    StreamState {
        /// The stream's handle.
        stream: u64,
        /// What is wrong.
        reason: &'static str,
    },

    /// A driver call failed. `bytes` is the size the call was about (0 for
    /// synchronize). The pool's books are unchanged by the failed step and any steps
    /// before it were undone.
    #[error("driver call {} failed with {} ({}){}; {}", .source.call, .source.code.name(), .source.code.0, on_bytes(*.bytes), hint(.source))]
    Driver {
        /// The failed call and its raw `CUresult`.
        source: DriverError,
        /// The size in bytes the call was about.
        bytes: u64,
    },

    /// The operation is not available on this backend (fault injection on a CUDA
    /// pool, say).
    #[error("not supported: {0}")]
    NotSupported(&'static str),

    /// No CUDA driver could be loaded or initialised (libcuda absent, no device).
    #[error("no CUDA driver: {0}")]
    NoDriver(String),

    /// A file could not be written (a memory_viz snapshot: issue 38): `path`, and
    /// what the system said.
    #[error("cannot write {path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The system's message (no space left, permission denied, no such
        /// directory...).
        message: String,
    },
}

/// What the caller can do about an out-of-memory.
fn oom_advice(in_scope: bool) -> &'static str {
    if in_scope {
        "finish the scope or free live allocations"
    } else {
        "idle mappings were released and the allocation retried once; free live allocations"
    }
}

/// " (cuMemCreate failed with CUDA_ERROR_OUT_OF_MEMORY (2))", or nothing.
fn driver_cause(source: &Option<DriverError>) -> String {
    match source {
        Some(e) => format!(" ({} failed with {} ({}))", e.call, e.code.name(), e.code.0),
        None => String::new(),
    }
}

/// " on 2.0 MiB", or nothing for a call about no size (a synchronize).
fn on_bytes(bytes: u64) -> String {
    if bytes == 0 {
        String::new()
    } else {
        format!(" on {}", fmt_bytes(bytes))
    }
}

fn hint(e: &DriverError) -> &'static str {
    match (e.call, e.code) {
        (DriverCall::Synchronize, CuResult::STREAM_CAPTURE_UNSUPPORTED) => {
            "a stream is being captured, and a device synchronize breaks its capture: keep releases and sleeps out of captures (a retention scope around the capture keeps the pool from releasing); what needed it is retried at the next release point"
        }
        (_, CuResult::ILLEGAL_ADDRESS) | (_, CuResult::ILLEGAL_INSTRUCTION) => {
            "the context is lost (sticky fault): recreate the context"
        }
        (DriverCall::MemsetD8Async, _) => {
            "a zeroing wake's memset: the tag is awake but its memory is not guaranteed zero (zero it yourself, or sleep and wake it again)"
        }
        (DriverCall::Map, CuResult::NOT_SUPPORTED) => {
            "the driver refuses this mapping (only whole handles can be mapped)"
        }
        (DriverCall::Unmap, _)
        | (DriverCall::Release, _)
        | (DriverCall::FreeReservation, _) => {
            "the memory is kept and the step retried at the next release point"
        }
        _ => "nothing was leaked; the pool is still usable",
    }
}

impl Error {
    /// The driver failure behind this error, if a driver call failed.
    pub fn driver_error(&self) -> Option<DriverError> {
        match self {
            Error::Driver { source, .. } => Some(*source),
            Error::OutOfMemory { source, .. } => *source,
            _ => None,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
