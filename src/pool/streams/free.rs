//! The stream-ordered free (`free_async`) and `record_stream`: memory freed on a
//! stream goes to its bucket (or its capture's), or waits for the fences of the
//! streams recorded on it.

use super::fences::{count_stream_failure, hold, is_capture, Cover};
use crate::driver::{DevicePtr, DriverError, Stream};
use crate::error::{Error, Result};
use crate::pool::books::{stream_key, BucketKind, Deferred, State, ANY, HELD};
use crate::pool::release::Batch;
use crate::pool::Pool;
use crate::sync::{lock, MutexGuard};

impl Pool {
    /// Frees `ptr` on `stream`, stream-ordered (like `cuMemFreeAsync`): the caller
    /// promises that every use of `ptr` is ordered before this point on `stream`, or
    /// on a stream given to [`Pool::record_stream`]. No host synchronization, ever:
    /// the memory is reusable on `stream` at once, by other streams per
    /// [`CrossStreamReuse`], and released (outside a retention scope, over the release
    /// threshold) only after a fence event recorded on `stream` (and on each recorded
    /// stream) at or after this free has completed. During a capture of `stream` the
    /// memory is kept for that capture (see the module documentation of the pool's
    /// stream order).
    ///
    /// Driver calls: one `cuStreamGetCaptureInfo`; with streams from
    /// `record_stream`, a `cuEventRecord` on each; over the release threshold, at
    /// most one fence record and query per stream every `poll_interval` frees (1 to
    /// 64), and the release of what completed.
    ///
    /// `stream` must stay alive while the pool knows it (the pool passes it to
    /// `cuStreamGetCaptureInfo` and `cuEventRecord` later, lazily): before destroying
    /// a stream, call [`Pool::forget_stream`], which fences its work once more and
    /// never passes it to the driver again, so that a stream created later with the
    /// same handle value (the driver may hand it out again) is not taken for it.
    /// [`Pool::trim`] (or a scope's finish) releases its memory too, but keeps the
    /// handle's history. (On the simulated driver, memory freed on a stream destroyed
    /// first, with no forget, is held, reported as idle by an out-of-memory, until
    /// trim.)
    ///
    /// Errors: [`Error::UnknownPointer`] and [`Error::TagState`] as
    /// [`Pool::free_raw`]; nothing changes then. A failed stream or event call does
    /// not fail the free: the memory is kept (not reused) until a release point that
    /// synchronizes the device, and counted in `stream_call_failures`.
    ///
    /// [`CrossStreamReuse`]: crate::pool::CrossStreamReuse
    pub fn free_async_raw(&self, ptr: DevicePtr, stream: Stream) -> Result<()> {
        self.free_async_inner(ptr, stream, None)
    }

    /// Frees `ptr` on `stream` if it is live, and, with `id`, only if it is that
    /// allocation.
    pub(in crate::pool) fn free_async_inner(
        &self,
        ptr: DevicePtr,
        stream: Stream,
        id: Option<u64>,
    ) -> Result<()> {
        let _order = self.record_order();
        self.settle_if_cached(ptr);
        let capture = self.driver.stream_capture(stream);
        let mut st = lock(&self.state);
        // The pointer's tag is entered in the hold that frees it (`tag_gate.rs`).
        let entry = self.enter_live(&mut st, ptr)?;
        let r = self.free_async_locked(st, ptr, stream, id, capture);
        self.leave(entry);
        r
    }

    /// [`Pool::free_async_inner`] from the books' lock on (`st`, the pointer's tag
    /// entered); `capture`: the stream's capture query.
    fn free_async_locked(
        &self,
        st: MutexGuard<'_, State>,
        ptr: DevicePtr,
        stream: Stream,
        id: Option<u64>,
        capture: std::result::Result<Option<u64>, DriverError>,
    ) -> Result<()> {
        let mut batch = Batch::default();
        {
            let mut st = st;
            let (slot, recorded) = st.free_live(ptr, id, Some(stream))?;
            if self.rec.is_some() {
                // What this section's poll learns is written with this free's line.
                st.rec_held.hold();
            }
            let freed_on = st.stream_bucket_unmarked(stream);
            st.mapping_mut(slot).freed_on = Some(freed_on);
            let capture = match capture {
                Ok(c) => c,
                Err(e) => {
                    // Unknown order: keep it from everyone until a device synchronize.
                    count_stream_failure(&mut st, e);
                    st.index_insert(slot, HELD);
                    self.record_free_async(&mut st, ptr, stream);
                    return Ok(());
                }
            };
            // A pool only captures allocate from: what the capture frees on its own
            // stream serves that stream's next allocations (in the capture: stream
            // order) at once, coalesced in its heap.
            let own_capture = recorded.is_none()
                && self
                    .captures_only
                    .load(std::sync::atomic::Ordering::Relaxed);
            if let Some(cid) = capture.filter(|_| !own_capture) {
                let b = st.capture_bucket(cid);
                // A block of a tag's heap: kept for the capture, taken by nobody.
                let b = st.tag_capture_bucket(slot, b);
                match recorded {
                    // Live work on the recorded streams may still touch it: the
                    // capture reuses it only once their fences complete.
                    Some(others) => self.defer(&mut st, slot, b, stream, &others),
                    None => st.index_insert(slot, b),
                }
                self.record_free_async(&mut st, ptr, stream);
                return Ok(());
            }
            let own = st.stream_bucket(stream);
            let bucket = &mut st.buckets[own as usize];
            bucket.marks += 1;
            let mark = bucket.marks;
            let m = st.mapping_mut(slot);
            m.mark = mark;
            m.needs_sync = false;
            match recorded {
                Some(others) => self.defer(&mut st, slot, own, stream, &others),
                // A block of a tag's heap waits for its fence out of every bucket.
                None if st.is_tag_block(slot) => self.defer(&mut st, slot, own, stream, &[]),
                None => st.index_insert(slot, own),
            }
            if !st.counters.scope_open && st.cached_bytes() > self.release_threshold {
                st.poll_countdown = st.poll_countdown.saturating_sub(1);
                if st.poll_countdown == 0 {
                    self.poll_and_release(&mut st, &mut batch);
                }
            }
            if !batch.is_empty() {
                st.collect_retries(&mut batch, false);
                st.start_release(&mut batch);
            }
            // Recorded under the lock, before the memory can be handed out again,
            // and after what this free's poll saw complete (its `done` lines, held
            // until now and appended with it: nothing comes between).
            self.record_free_async(&mut st, ptr, stream);
        }
        let _ = self.release_batch(batch);
        Ok(())
    }

    /// Records a stream-ordered free (`f ID STREAM`) after the `done` lines its
    /// locked section held, when recording.
    fn record_free_async(&self, st: &mut State, ptr: DevicePtr, stream: Stream) {
        if let Some(rec) = &self.rec {
            rec.free_after(&mut st.rec_held, ptr, stream);
        }
    }

    /// Marks live `ptr` as used by work on `stream` too (PyTorch's `record_stream`):
    /// when it is freed (on its own stream, with `free_async`), a fence is recorded on
    /// `stream` as well, and the memory is reused or released only once that fence
    /// completes. Recording the free's own stream, or a stream twice, changes
    /// nothing. A synchronous `free` ignores it (its release synchronizes the device).
    ///
    /// Errors: [`Error::UnknownPointer`] for a pointer that is not a live allocation
    /// of this pool; [`Error::TagState`] while its tag sleeps (its memory is
    /// unmapped).
    pub fn record_stream(&self, ptr: DevicePtr, stream: Stream) -> Result<()> {
        let _order = self.record_order();
        self.settle_if_cached(ptr);
        let mut st = lock(&self.state);
        let slot = *st.live.get(&ptr).ok_or(Error::UnknownPointer { ptr })?;
        // A sleeping tag's memory is unmapped: no stream may use it (a review found
        // the call accepted while the free was refused).
        st.tag_usable(st.mref(slot).tag)?;
        let b = st.stream_bucket_unmarked(stream);
        let list = st.recorded.entry(slot).or_default();
        if !list.contains(&b) {
            list.push(b);
        }
        if let Some(rec) = &self.rec {
            rec.record_stream(ptr, stream);
        }
        Ok(())
    }

    /// Books idle `slot` (freed on `stream`, to go to bucket `own`: the stream's, or
    /// the capture's) as waiting for fences on the recorded streams' buckets `others`,
    /// recording them now. A recorded stream forgotten since
    /// ([`Pool::forget_stream`]) needs no new fence: its work all came before the
    /// fence its forget recorded.
    fn defer(&self, st: &mut State, slot: u32, own: u32, stream: Stream, others: &[u32]) {
        let mut needs = Vec::with_capacity(others.len() + 1);
        let mut dest = own;
        let freeing = st.by_stream.get(&stream_key(stream)).copied();
        for &b in others {
            if b == own || Some(b) == freeing {
                continue;
            }
            let bucket = &mut st.buckets[b as usize];
            if !bucket.forgotten {
                // Used now: a release point asks it about captures.
                bucket.active = true;
                bucket.marks += 1;
            }
            let mark = bucket.marks;
            match self.cover(st, b) {
                Cover::Covered => needs.push((b, mark)),
                Cover::Capturing => {
                    // Used by a graph being captured on `s`: the graph may replay
                    // into it, so it becomes that capture's memory (kept until the
                    // scope open then closes, or trim or destroy), once the live
                    // work of the other streams is done with it.
                    let BucketKind::Stream(s) = st.buckets[b as usize].kind else {
                        return hold(st, slot);
                    };
                    match self.driver.stream_capture(s) {
                        Ok(Some(id)) => {
                            let b = st.capture_bucket(id);
                            dest = st.tag_capture_bucket(slot, b);
                        }
                        _ => return hold(st, slot),
                    }
                }
                // Memory of a capture is kept for its graph, not released at the
                // next synchronize: it waits for a fence a later call records.
                Cover::Failed if is_capture(st, dest) => needs.push((b, mark)),
                // The recorded stream's order cannot be tracked (a failed call).
                Cover::Failed => return hold(st, slot),
            }
        }
        if dest != own {
            st.mapping_mut(slot).needs_sync = true;
            // Memory of a capture is taken by any stream in it, not only in the
            // freeing stream's order: wait for the freeing stream's fence too.
            if matches!(st.buckets[own as usize].kind, BucketKind::Stream(_)) {
                let mark = st.mapping(slot).mark;
                if self.cover(st, own) != Cover::Covered {
                    return hold(st, slot);
                }
                needs.push((own, mark));
            }
        }
        // A block of a tag's own heap never waits in a stream's bucket (other tags'
        // allocations take from it): it waits, out of every index, for the freeing
        // stream's fence too, then goes back to its heap ([`ANY`]).
        if dest == own
            && st.is_tag_block(slot)
            && matches!(st.buckets[own as usize].kind, BucketKind::Stream(_))
        {
            let mark = st.mapping(slot).mark;
            if self.cover(st, own) != Cover::Covered {
                return hold(st, slot);
            }
            needs.push((own, mark));
            dest = ANY;
        }
        st.mapping_mut(slot).bucket = dest;
        if needs.is_empty() {
            st.index_insert(slot, dest);
            return;
        }
        let size = st.mapping(slot).size();
        st.counters.event_wait_bytes += size;
        st.deferred.push(Deferred { slot, needs });
    }

    /// Marks the pool as one only stream captures allocate from, each capture's
    /// memory staying with the pool (a PyTorch graph pool, `torch.rs`: a pool of its
    /// own per CUDA graph pool, allocated from only while a capture binds it, its
    /// memory released only when PyTorch releases the pool). Memory freed during a
    /// capture on the stream it is freed on (no `record_stream`) then goes back to that
    /// stream's heap (segment mode: coalescing with its free neighbours) or bucket,
    /// and serves the stream's next allocations at once, as a free outside a capture
    /// does: within a capture, stream order makes that safe, and nothing outside the
    /// pool's captures can receive it. Without this, such memory waits whole in the
    /// capture's bucket and serves only requests it fits: on the H200 PyTorch model
    /// of `python/tests/gpu/run_h200.py` the five graph pools held 218 MiB for a live
    /// peak of 117 MiB.
    pub(crate) fn dedicate_to_captures(&self) {
        self.captures_only
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
