//! The driver's values as the project's and back: `CUresult`, stream and event
//! handles, capture modes, sizes.

use cudarc::driver::sys;

use crate::driver::{CaptureMode, CuResult, Event, Stream};

/// The raw `CUresult` as the project's own value, without calling the driver.
pub(super) fn code(r: sys::CUresult) -> CuResult {
    CuResult(r as u32)
}

/// The largest special stream handle: `0` (the NULL stream), `CU_STREAM_LEGACY` (1)
/// and `CU_STREAM_PER_THREAD` (2) name a stream of whatever context is current on the
/// calling thread (CUDA's "default stream semantics"); every other handle is a
/// created stream, which carries its own context.
const LAST_SPECIAL_STREAM: u64 = 2;

/// Whether `stream` is one of the special handles that the driver resolves against
/// the calling thread's current context (see [`LAST_SPECIAL_STREAM`]).
pub(super) fn resolved_by_current_context(stream: Stream) -> bool {
    stream.0 <= LAST_SPECIAL_STREAM
}

/// The driver's event handle for a raw [`Event`] value (the handle's address).
pub(super) fn cu_event(event: Event) -> sys::CUevent {
    event as usize as sys::CUevent
}

/// The driver's stream handle for a [`Stream`] (its raw value, as the address).
pub(super) fn cu_stream(stream: Stream) -> sys::CUstream {
    stream.0 as usize as sys::CUstream
}

/// `CUstreamCaptureMode` for a [`CaptureMode`] (the same numbers).
pub(super) fn cu_capture_mode(mode: CaptureMode) -> sys::CUstreamCaptureMode {
    match mode {
        CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        CaptureMode::ThreadLocal => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    }
}

/// The [`CaptureMode`] of a raw `CUstreamCaptureMode` value; `None` for a value CUDA
/// does not define.
pub(super) fn capture_mode_of(raw: u32) -> Option<CaptureMode> {
    [
        CaptureMode::Global,
        CaptureMode::ThreadLocal,
        CaptureMode::Relaxed,
    ]
    .into_iter()
    .find(|&m| cu_capture_mode(m) as u32 == raw)
}

/// A byte count or address as the driver's `size_t`. Only fails on a target whose
/// `usize` is narrower than 64 bits, with `CUDA_ERROR_INVALID_VALUE`, as the driver
/// itself would for a size it cannot represent.
pub(super) fn to_usize(v: u64) -> Result<usize, CuResult> {
    usize::try_from(v).map_err(|_| CuResult::INVALID_VALUE)
}

#[cfg(test)]
mod tests {
    use super::{capture_mode_of, cu_capture_mode, resolved_by_current_context};
    use crate::driver::{CaptureMode, Stream};

    /// `CUstreamCaptureMode`'s values in CUDA's header (`cuda.h`): GLOBAL 0,
    /// THREAD_LOCAL 1, RELAXED 2; the mode read back from the driver maps to the
    /// same mode, and a value CUDA does not define to none.
    #[test]
    fn capture_modes_have_cudas_numbers_both_ways() {
        for (mode, n) in [
            (CaptureMode::Global, 0),
            (CaptureMode::ThreadLocal, 1),
            (CaptureMode::Relaxed, 2),
        ] {
            assert_eq!(cu_capture_mode(mode) as u32, n, "{mode:?}");
            assert_eq!(mode as u32, n, "{mode:?}: the Rust discriminant");
            assert_eq!(capture_mode_of(n), Some(mode));
        }
        assert_eq!(capture_mode_of(3), None);
        assert_eq!(capture_mode_of(u32::MAX), None);
    }

    /// The special handles (NULL, `CU_STREAM_LEGACY` = 1, `CU_STREAM_PER_THREAD` = 2
    /// in `cuda.h`) are resolved against the current context, so the pool's context
    /// is pushed for them; a created stream's handle (a driver address) is not.
    #[test]
    fn only_the_special_stream_handles_need_the_context() {
        for raw in [0, 1, 2] {
            assert!(resolved_by_current_context(Stream(raw)), "{raw}");
        }
        assert!(resolved_by_current_context(Stream::LEGACY));
        for raw in [3, 0x5555_0000_1000, u64::MAX] {
            assert!(!resolved_by_current_context(Stream(raw)), "{raw:#x}");
        }
    }
}
