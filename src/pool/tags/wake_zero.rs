//! The zeroing wake (issue 34): a wake that sets to zero what a discard sleep dropped.
//!
//! A tag put to sleep in [`SleepMode::Discard`](super::SleepMode::Discard) wakes on new physical memory, whose
//! contents the driver does not specify: on the GPU it holds what an earlier owner
//! left there (vLLM PR 45542: a KV cache woken from a discard sleep held stale bytes,
//! and NaNs followed). [`Pool::wake_zeroed`] wakes the tag as [`Pool::wake`] does,
//! then queues one `cuMemsetD8Async` to 0 per live allocation the sleep dropped, on
//! the caller's stream, so that the caller's later work on that stream reads zeros.
//!
//! - **What is zeroed.** The requested bytes of every live allocation of the tag put
//!   to sleep: a whole mapping's (not the rest of its mapping, rounded to the
//!   granularity), a segment block's (not the rest of its 512-byte rounding, nor the
//!   free space of the tag's heaps: no caller owns it, and an allocation that later
//!   takes it gets unspecified contents, as any allocation does). An allocation with
//!   0 requested bytes gets no memset.
//! - **Offload.** A wake from an offload sleep restores the bytes: zeroing does
//!   nothing there (no memset, nothing counted).
//! - **Order.** The memsets are queued while the tag is still marked busy (its
//!   allocations and frees refused), so the ranges are the sleep's own; the wake
//!   returns once they are queued, not run. They are work of `stream` like the
//!   caller's kernels: later work on `stream` sees zeros; work on another stream must
//!   wait for `stream` first (an event), and a sleep of the tag synchronizes the
//!   device before it unmaps, as for any work.
//! - **Census.** [`TagCensus::zeroed_bytes`](super::TagCensus::zeroed_bytes) and
//!   [`TagCensus::zero_memsets`](super::TagCensus::zero_memsets) count what the
//!   memsets that the driver accepted covered, cumulative per tag.
//! - **Failures.** Before the wake, the stream's capture state is asked
//!   (`cuStreamGetCaptureInfo`): on a stream being captured the memsets would only
//!   be graph nodes, so the wake is refused with nothing done. A memset the driver
//!   refuses comes after the map-back succeeded: the tag is left **awake** (its
//!   memory mapped and usable, the wake recorded) and the error returned, its bytes
//!   not guaranteed zero. Undoing the wake instead would unmap memory that the
//!   memsets already queued may be writing (unmapping under queued work faults it,
//!   `docs/vmm-semantics.md`), so it would need a device synchronize, itself likely
//!   to fail the same way (a sticky fault, a broken stream); the caller, told that
//!   zeros are not guaranteed, can zero the memory itself or sleep and wake again.
//!   The memsets after the refused one are not queued.

use crate::driver::{CuResult, DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::pool::books::State;
use crate::pool::Pool;
use crate::sync::lock;

/// What a tag's zeroing wakes zeroed, cumulative (its census's `zeroed_bytes` and
/// `zero_memsets`).
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::pool) struct Zeroed {
    /// Bytes set to zero.
    pub(in crate::pool) bytes: u64,
    /// Memsets queued.
    pub(in crate::pool) memsets: u64,
}

impl State {
    /// What a discard sleep of a tag dropped, as (address, requested bytes): each live
    /// whole mapping it put to sleep (`slots`: slot, offset of its bytes in the host
    /// buffer) and each live block of its segments (`blocks`: address, requested
    /// bytes, offset). Allocations with 0 requested bytes are left out.
    pub(in crate::pool) fn dropped_ranges(
        &self,
        slots: &[(u32, u64)],
        blocks: &[(DevicePtr, u64, u64)],
    ) -> Vec<(DevicePtr, u64)> {
        let whole = slots.iter().map(|&(slot, _)| {
            let m = self.mref(slot);
            (m.ptr(), m.requested)
        });
        let seg = blocks.iter().map(|&(ptr, n, _)| (ptr, n));
        whole.chain(seg).filter(|&(_, n)| n > 0).collect()
    }
}

impl Pool {
    /// Wakes tag `tag` as [`Pool::wake`] does and, when it slept in
    /// [`SleepMode::Discard`](super::SleepMode::Discard), sets to zero the requested bytes of each of its live
    /// allocations (whole mappings and segment blocks; not the free space of its
    /// heaps) with one `cuMemsetD8Async` each, queued on `stream`
    /// ([`Stream::LEGACY`]: the legacy default stream). The call returns once they are
    /// queued: the caller's later work on `stream` reads zeros (work on another
    /// stream must wait for `stream` first). A wake from an offload sleep restores the
    /// bytes, and zeroes nothing. The census counts what was zeroed
    /// ([`TagCensus::zeroed_bytes`](super::TagCensus::zeroed_bytes),
    /// [`TagCensus::zero_memsets`](super::TagCensus::zero_memsets)). Recorded as a
    /// plain `wake` (the memsets change no decision of the pool). Why: new physical
    /// memory holds whatever an earlier owner left (vLLM PR 45542: a KV cache woken
    /// from a discard sleep held stale bytes, and NaNs followed); the driver gives no
    /// guarantee of zeros.
    ///
    /// Errors, with nothing done (the tag as it was): [`Error::ScopeState`] while
    /// `stream` is being captured (the memsets would be graph nodes, run only when
    /// the graph is), or is the legacy stream while a blocking stream is being
    /// captured (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`); [`Error::NotSupported`] on a
    /// backend without streams; [`Error::Driver`] when the stream's capture query is
    /// refused otherwise (`CUDA_ERROR_INVALID_HANDLE`: not a live stream of the
    /// device); and the errors of [`Pool::wake`] (the tag asleep, as there).
    /// [`Error::Driver`] naming `cuMemsetD8Async` when the driver refuses a memset:
    /// the wake itself succeeded, so the tag is **awake** and usable, but its bytes
    /// are not guaranteed zero (the memsets after the refused one are not queued;
    /// those before it count in the census). The module's documentation says why the
    /// wake is not undone.
    pub fn wake_zeroed(&self, tag: u32, stream: Stream) -> Result<()> {
        self.check_zero_stream(stream)?;
        self.wake_zeroing(tag, Some(stream))
    }

    /// The checks of [`Pool::wake_zeroed`] on its stream, before anything is done.
    fn check_zero_stream(&self, stream: Stream) -> Result<()> {
        match self.driver.stream_capture(stream) {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err(Error::ScopeState(
                "a zeroing wake on a stream being captured: its memsets would only run \
                 with the graph; wake on a stream outside the capture",
            )),
            Err(e) if e.code == CuResult::STREAM_CAPTURE_IMPLICIT => Err(Error::ScopeState(
                "a zeroing wake on the legacy stream while a blocking stream is being \
                 captured: wake on a stream outside the capture",
            )),
            Err(e) if e.code == CuResult::NOT_SUPPORTED => Err(Error::NotSupported(
                "a zeroing wake needs a backend with streams and memsets",
            )),
            Err(source) => Err(Error::Driver { source, bytes: 0 }),
        }
    }

    /// Queues a memset to 0 of each range of `ranges` (address, bytes) on `stream`,
    /// in order, and counts what the driver accepted in tag `tag`'s census. Stops at
    /// the first refusal: [`Error::Driver`] with its size.
    pub(in crate::pool) fn zero_dropped(
        &self,
        tag: u32,
        stream: Stream,
        ranges: &[(DevicePtr, u64)],
    ) -> Result<()> {
        let mut done = Zeroed::default();
        let mut result = Ok(());
        for &(ptr, bytes) in ranges {
            if let Err(source) = self.driver.memset_async(ptr, 0, bytes, stream) {
                result = Err(Error::Driver { source, bytes });
                break;
            }
            done.bytes += bytes;
            done.memsets += 1;
        }
        if done.memsets > 0 {
            let mut st = lock(&self.state);
            let z = &mut st.tags.entry(tag).or_default().zeroed;
            z.bytes += done.bytes;
            z.memsets += done.memsets;
        }
        result
    }
}
