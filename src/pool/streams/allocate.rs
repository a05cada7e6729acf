//! The stream-ordered allocation (`allocate_async`): memory freed on the stream
//! first, then what any stream may take, then memory freed on other streams per
//! [`CrossStreamReuse`], then a miss.

use super::fences::{count_stream_failure, Cover};
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::pool::books::{BucketKind, State, ANY};
use crate::pool::release::Batch;
use crate::pool::{CrossStreamReuse, Pool, ReusePolicy};
use crate::sync::lock;

impl Pool {
    /// Allocates `bytes` for use on `stream`, stream-ordered (like
    /// `cuMemAllocAsync`): work queued on `stream` from now on may use it. Memory
    /// last freed on `stream` is taken first, at once; then memory any stream may
    /// take; then, per [`CrossStreamReuse`], memory freed on another stream whose
    /// work up to the free has completed (or, with `Wait`, after making `stream` wait
    /// on it); else a new mapping (create, reserve, map, set access: legal during a
    /// capture). On a stream being captured, after memory freed on `stream` before
    /// the capture, memory freed earlier in the same capture is taken first, and no
    /// stream is made to wait.
    ///
    /// In [`ReusePolicy::Segments`] (up to `segment_whole_threshold_bytes`) the size
    /// is rounded up to 512 bytes and a block is carved from `stream`'s own heap
    /// first (the address aligned to 512 bytes), then taken as above from memory
    /// waiting in buckets, else the heap grows. Free blocks of another stream's heap
    /// are never taken: that memory reaches `stream` only once its handle is
    /// released (outside a retention scope).
    ///
    /// Driver calls on a reuse of memory freed on `stream`: none (stream order makes
    /// it safe whether or not `stream` is being captured: memory freed during a
    /// capture is in the capture's bucket, not the stream's). Otherwise one
    /// `cuStreamGetCaptureInfo` first.
    ///
    /// Errors: as [`Pool::allocate_raw`]; [`Error::Driver`] also when
    /// `cuStreamGetCaptureInfo` fails for `stream` (an invalid handle; the legacy
    /// stream while a blocking stream is captured: `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`),
    /// or on a backend without streams (`CUDA_ERROR_NOT_SUPPORTED`).
    pub fn allocate_async_raw(&self, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        let _order = self.record_order();
        self.record_call_start();
        let r = self.allocate_async_unrecorded(bytes, stream);
        self.history_alloc(&r, |p| *p, bytes, 0, Some(stream));
        match &r {
            Ok(ptr) => {
                if let Some(rec) = &self.rec {
                    rec.alloc(*ptr, bytes, 0, Some(stream));
                }
            }
            Err(e) => self.record_failed(e, bytes, 0, Some(stream)),
        }
        r
    }

    /// [`Pool::allocate_async_raw`], not recorded.
    fn allocate_async_unrecorded(&self, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        // Bad input first (refused whatever tag 0's state), then tag 0's gate.
        let block = self.checked_request(bytes)?;
        let entry = self.enter_untagged()?;
        let r = self.allocate_async_entered(bytes, block, stream);
        self.leave(entry);
        r
    }

    /// [`Pool::allocate_async_raw`] (`block`: its block size in segment mode), tag 0
    /// entered.
    fn allocate_async_entered(
        &self,
        bytes: u64,
        block: Option<u64>,
        stream: Stream,
    ) -> Result<DevicePtr> {
        if let Some(size) = block {
            let ptr = self.allocate_block_async(stream, size, bytes)?;
            self.driver.note_handoff(stream, ptr, size);
            return Ok(ptr);
        }
        self.allocate_async_whole(bytes, stream)
    }

    /// [`Pool::allocate_async_raw`] of a whole mapping.
    pub(in crate::pool) fn allocate_async_whole(
        &self,
        bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        let (rounded, max_size) = self.sizes(bytes)?;
        let own = {
            let mut st = lock(&self.state);
            let own = st.stream_bucket(stream);
            st.take_idle(own, rounded, bytes, self.policy, max_size)
        };
        let ptr = match own {
            Some(ptr) => ptr,
            None => self.allocate_async_other(stream, bytes, rounded, max_size)?,
        };
        self.driver.note_handoff(stream, ptr, rounded);
        Ok(ptr)
    }

    /// `allocate_async` when `stream`'s own bucket had nothing that fits: the
    /// capture's bucket, [`ANY`], other streams, a new mapping.
    #[cold]
    fn allocate_async_other(
        &self,
        stream: Stream,
        bytes: u64,
        rounded: u64,
        max_size: u64,
    ) -> Result<DevicePtr> {
        let capture = self
            .driver
            .stream_capture(stream)
            .map_err(|source| Error::Driver { source, bytes: 0 })?;
        let hit = {
            let mut st = lock(&self.state);
            self.take_for_stream(&mut st, stream, capture, rounded, bytes, max_size)
        };
        match hit {
            Some(ptr) => Ok(ptr),
            None => self.allocate_async_miss(stream, capture, bytes, rounded, max_size),
        }
    }

    /// An idle mapping `stream` may take at once: freed in its capture, freed on it,
    /// or free for any stream.
    pub(in crate::pool) fn take_for_stream(
        &self,
        st: &mut State,
        stream: Stream,
        capture: Option<u64>,
        rounded: u64,
        bytes: u64,
        max_size: u64,
    ) -> Option<DevicePtr> {
        take_reachable(st, stream, capture, |st, b| {
            st.take_idle(b, rounded, bytes, self.policy, max_size)
        })
    }

    /// The out-of-memory forced reuse for an allocation on `stream`: the smallest
    /// idle mapping that fits, whatever its size, from the buckets `stream` may take
    /// from at once.
    pub(in crate::pool) fn take_forced_for_stream(
        &self,
        st: &mut State,
        stream: Stream,
        capture: Option<u64>,
        rounded: u64,
        bytes: u64,
    ) -> Option<DevicePtr> {
        take_reachable(st, stream, capture, |st, b| {
            st.take_forced(b, rounded, bytes)
        })
    }

    #[cold]
    fn allocate_async_miss(
        &self,
        stream: Stream,
        capture: Option<u64>,
        bytes: u64,
        rounded: u64,
        max_size: u64,
    ) -> Result<DevicePtr> {
        if let Some(p) = self.take_cross_stream(Some(stream), capture, rounded, bytes, max_size) {
            return Ok(p);
        }
        self.allocate_miss(bytes, rounded, max_size, Some((stream, capture)))
    }

    /// On a miss: memory freed on other streams, per [`CrossStreamReuse`]. With
    /// `WhenComplete` (and for the synchronous `allocate`, `target` `None`), the
    /// fences of other streams holding a fitting mapping are recorded if needed and
    /// polled; what completed moves to [`ANY`] and is taken from there. With `Wait`
    /// (not during a capture, where a wait would be a graph dependency that orders no
    /// live work), a fitting mapping is taken after `cuStreamWaitEvent` on its fence.
    pub(in crate::pool) fn take_cross_stream(
        &self,
        target: Option<Stream>,
        capture: Option<u64>,
        rounded: u64,
        bytes: u64,
        max_size: u64,
    ) -> Option<DevicePtr> {
        if self.policy == ReusePolicy::None || self.cross_stream == CrossStreamReuse::Never {
            return None;
        }
        let mut st = lock(&self.state);
        let own = target.map(|s| st.stream_bucket(s));
        let candidates: Vec<u32> = (0..st.buckets.len() as u32)
            .filter(|&b| Some(b) != own)
            .filter(|&b| matches!(st.buckets[b as usize].kind, BucketKind::Stream(_)))
            .filter(|&b| {
                let max = if self.policy == ReusePolicy::Exact {
                    rounded
                } else {
                    max_size
                };
                st.idle.peek_best_fit(b, rounded, max).is_some()
            })
            .collect();
        if candidates.is_empty() && st.deferred.is_empty() {
            return None;
        }
        let wait = self.cross_stream == CrossStreamReuse::Wait && capture.is_none();
        if let (true, Some(s)) = (wait, target) {
            for &b in &candidates {
                if let Some(p) = self.take_with_wait(&mut st, b, s, rounded, bytes, max_size) {
                    return Some(p);
                }
            }
        }
        let _ = self.poll(&mut st, &candidates, true);
        self.settle_deferred(&mut st);
        let mut moved = Batch::default();
        for &b in &candidates {
            self.settle_bucket(&mut st, b, None, &mut moved);
        }
        match target {
            // Deferred memory freed on `s` may have come back to its own bucket.
            Some(s) => self.take_for_stream(&mut st, s, capture, rounded, bytes, max_size),
            None => st.take_idle(ANY, rounded, bytes, self.policy, max_size),
        }
    }

    /// `Wait` mode: takes a mapping of bucket `b` that fits, after making `stream`
    /// wait on a fence that covers its free.
    fn take_with_wait(
        &self,
        st: &mut State,
        b: u32,
        stream: Stream,
        rounded: u64,
        bytes: u64,
        max_size: u64,
    ) -> Option<DevicePtr> {
        // `b` passed the candidates' filter, which bounds `exact` to the size: the
        // smallest fit is then the exact one.
        let (slot, _) = st.idle.peek_best_fit(b, rounded, max_size)?;
        let mark = st.mapping(slot).mark;
        if st.buckets[b as usize].fenced < mark && self.cover(st, b) != Cover::Covered {
            return None;
        }
        let fence = st.buckets[b as usize]
            .fences
            .iter()
            .find(|f| f.covers >= mark)
            .copied();
        if let Some(f) = fence {
            if let Err(e) = self.driver.stream_wait_event(stream, f.event) {
                count_stream_failure(st, e);
                return None;
            }
            st.counters.cross_stream_waits += 1;
        }
        // No fence left covering it: its work has completed already. The slot peeked
        // is the one taken (nothing changed the index in between).
        let size = st.mapping(slot).size();
        st.idle.remove(slot);
        let p = st.hand_out(slot, size, rounded, bytes, false);
        st.counters.cross_stream_hits += 1;
        Some(p)
    }
}

/// Takes with `take` from the buckets `stream` may take from at once, in order:
/// its capture's (`capture`), its own, [`ANY`].
fn take_reachable(
    st: &mut State,
    stream: Stream,
    capture: Option<u64>,
    mut take: impl FnMut(&mut State, u32) -> Option<DevicePtr>,
) -> Option<DevicePtr> {
    if let Some(id) = capture {
        let b = st.capture_bucket(id);
        if let Some(p) = take(st, b) {
            return Some(p);
        }
    }
    let own = st.stream_bucket(stream);
    if let Some(p) = take(st, own) {
        return Some(p);
    }
    let p = take(st, ANY)?;
    note_cross_stream(st, p, own);
    Some(p)
}

/// Counts a reuse from [`ANY`] by `target` (its bucket) of memory last freed on
/// another stream.
fn note_cross_stream(st: &mut State, ptr: DevicePtr, target: u32) {
    if let Some(&slot) = st.live.get(&ptr) {
        let from = st.mapping(slot).freed_on;
        if from.is_some_and(|b| b != target) {
            st.counters.cross_stream_hits += 1;
        }
    }
}
