//! Stream order: `allocate_async`, `free_async` and `record_stream`, the fences that
//! tell when memory freed on a stream may go to another stream or be released, and
//! the release points that wait on them.
//!
//! Memory freed on stream S is indexed in S's bucket with a mark (S's free count):
//! an allocation on S takes it at once (stream order makes that safe). A fence is an
//! event recorded on S after some frees (lazily: one event covers every earlier free
//! on S); when a fence completes, the memory it covers has no queued work left, so it
//! moves to the [`ANY`] bucket (or is released, over the release threshold), with no
//! device synchronize. Fences are polled with `cuEventQuery` at release points (a
//! free over the threshold, at most once per `poll_interval` such frees; an
//! allocation that misses) and waited on with `cuEventSynchronize` where memory must
//! be released now (out-of-memory retry, trim, finish, destroy). Every query and wait
//! runs with the calling thread in relaxed capture mode, so that a capture open
//! anywhere in the process stays valid (`docs/vmm-semantics.md`, "Events and stream
//! queries while another stream is captured"); no fence is recorded on the legacy
//! stream (its events break every capture when queried): frees there are fenced on
//! the pool's own blocking stream, which is ordered after the legacy stream's work.
//!
//! During a capture (`cuStreamGetCaptureInfo` on the call's stream) a free never
//! records, queries or synchronizes anything: the memory goes to the capture's
//! bucket, reused only by later allocations in the same capture and kept (a graph
//! may replay into it) until the retention scope open at capture time closes, or,
//! with none open, until trim or destroy. That release synchronizes every device
//! with access first: a graph's replays run on streams the pool never sees, so no
//! fence covers them.

mod forget;

pub(crate) use forget::check_forgettable;

use super::books::{stream_key, BucketKind, Deferred, Fence, MappingState, State, ANY, HELD};
use super::release::{Batch, Captures};
use super::{CrossStreamReuse, Pool, ReusePolicy};
use crate::driver::{CaptureMode, DevicePtr, DriverError, Stream};
use crate::error::{Error, Result};
use crate::sync::{lock, MutexGuard};

/// The most frees over the release threshold between two event polls (the interval
/// doubles from 1 to this while polls find nothing complete): 1,000 frees of
/// buffers still in flight make about 20 polls, not 1,000.
const MAX_POLL_INTERVAL: u32 = 64;

/// What recording a fence on a bucket's stream did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cover {
    /// Its frees are covered by a fence (recorded now or before).
    Covered,
    /// The stream is being captured: a record would be a graph node; try later.
    Capturing,
    /// A stream or event call failed (counted).
    Failed,
}

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
    pub(super) fn allocate_async_whole(&self, bytes: u64, stream: Stream) -> Result<DevicePtr> {
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
    pub(super) fn take_for_stream(
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
    pub(super) fn take_forced_for_stream(
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
    pub(super) fn take_cross_stream(
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
    pub fn free_async_raw(&self, ptr: DevicePtr, stream: Stream) -> Result<()> {
        self.free_async_inner(ptr, stream, None)
    }

    /// Frees `ptr` on `stream` if it is live, and, with `id`, only if it is that
    /// allocation.
    pub(super) fn free_async_inner(
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
            let (slot, recorded) = st.free_live(ptr, id)?;
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

    /// Records that bucket `b`'s stream completed through mark `covers`
    /// (`done STREAM MARK`), when recording and `advanced`: held for the line of a
    /// stream-ordered free whose locked section this is.
    fn record_done(&self, st: &mut State, b: u32, covers: u64, advanced: bool) {
        // A forgotten stream's handle names another stream in the trace from its
        // `forget` line on: what completes of it is not written (not reproduced).
        if let (Some(rec), true, false) = (&self.rec, advanced, st.buckets[b as usize].forgotten) {
            if let BucketKind::Stream(s) = st.buckets[b as usize].kind {
                rec.done(&mut st.rec_held, s, covers);
            }
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

    /// Records a fence on bucket `b`'s stream covering every free made on it so far,
    /// unless one already does. A forgotten stream's bucket is never recorded on (its
    /// handle may name a new stream now): `Failed` when its forget could not fence it.
    pub(super) fn cover(&self, st: &mut State, b: u32) -> Cover {
        let bucket = &st.buckets[b as usize];
        let BucketKind::Stream(stream) = bucket.kind else {
            return Cover::Covered;
        };
        if bucket.fenced == bucket.marks {
            return Cover::Covered;
        }
        if bucket.forgotten {
            return Cover::Failed;
        }
        let target = if stream.is_legacy() {
            match self.fence_stream(st) {
                Some(s) => s,
                None => return Cover::Failed,
            }
        } else {
            stream
        };
        match self.driver.stream_capture(target) {
            Ok(None) => {}
            Ok(Some(_)) => return Cover::Capturing,
            Err(e) => {
                count_stream_failure(st, e);
                return Cover::Failed;
            }
        }
        let event = match st.spare_events.pop() {
            Some(e) => e,
            None => match self.driver.event_create() {
                Ok(e) => e,
                Err(e) => {
                    count_stream_failure(st, e);
                    return Cover::Failed;
                }
            },
        };
        if let Err(e) = self.driver.event_record(event, target) {
            st.spare_events.push(event);
            count_stream_failure(st, e);
            return Cover::Failed;
        }
        let bucket = &mut st.buckets[b as usize];
        let covers = bucket.marks;
        bucket.fences.push_back(Fence { event, covers });
        bucket.fenced = covers;
        st.counters.events_outstanding += 1;
        Cover::Covered
    }

    /// The pool's blocking stream for fences after legacy-stream frees, created on
    /// first use.
    fn fence_stream(&self, st: &mut State) -> Option<Stream> {
        if st.fence_stream.is_none() {
            match self.driver.stream_create_blocking() {
                Ok(s) => st.fence_stream = Some(s),
                Err(e) => count_stream_failure(st, e),
            }
        }
        st.fence_stream
    }

    /// Polls buckets `buckets` and every bucket deferred memory waits on, with the
    /// calling thread in relaxed capture mode. With `record_first` (a miss that wants
    /// the memory now), it first records a fence where idle memory is not covered and
    /// none is outstanding; a free's poll records after settling instead
    /// ([`Pool::cover_waited`], aged), so memory is released at the earliest one poll
    /// after its fence, and a stream that frees and allocates the same size keeps
    /// reusing it instead of releasing and re-creating it on every pair. Returns
    /// whether a fence completed, and the buckets polled (then those of deferred
    /// memory).
    pub(super) fn poll(
        &self,
        st: &mut State,
        buckets: &[u32],
        record_first: bool,
    ) -> (bool, Vec<u32>) {
        let mut list: Vec<u32> = buckets.to_vec();
        for d in &st.deferred {
            let own = st.mapping(d.slot).bucket;
            for b in d.needs.iter().map(|&(b, _)| b).chain(std::iter::once(own)) {
                let stream = matches!(st.buckets[b as usize].kind, BucketKind::Stream(_));
                if stream && !list.contains(&b) {
                    list.push(b);
                }
            }
        }
        if record_first {
            self.cover_waited(st, &list, buckets.len(), false);
        }
        if list
            .iter()
            .all(|&b| st.buckets[b as usize].fences.is_empty())
        {
            return (false, list);
        }
        let mut progress = false;
        let _relaxed = Relaxed::enter(&*self.driver);
        for &b in &list {
            while let Some(f) = st.buckets[b as usize].fences.front().copied() {
                match self.driver.event_query(f.event) {
                    Ok(true) => {
                        let advanced = complete_through(st, b, f.covers);
                        self.record_done(st, b, f.covers, advanced);
                        progress = true;
                    }
                    Ok(false) => break,
                    Err(e) => {
                        count_stream_failure(st, e);
                        break;
                    }
                }
            }
        }
        (progress, list)
    }

    /// Records a fence on each bucket of `list` whose idle memory (or, from index
    /// `first_deferred` on, deferred memory) no outstanding fence covers. With
    /// `aged` (a free's poll), only where some idle memory was already idle at the
    /// bucket's previous poll: a stream that frees and soon reuses the same memory
    /// (a steady allocate/free pair) then records no fence at all, where it would
    /// record and query one every poll for memory that is never released (measured on
    /// the H200: about 25 ns a pair at a poll every 64 frees); memory left idle is
    /// fenced one poll later.
    fn cover_waited(&self, st: &mut State, list: &[u32], first_deferred: usize, aged: bool) {
        for (i, &b) in list.iter().enumerate() {
            let bucket = &st.buckets[b as usize];
            if !bucket.fences.is_empty() || bucket.fenced >= bucket.marks {
                continue;
            }
            // Deferred memory's buckets (after `buckets`) are waited on even empty.
            let waited_on = if i >= first_deferred {
                true
            } else if aged {
                let polled = bucket.polled_marks;
                st.idle.any_in(b, |slot| st.mapping(slot).mark <= polled)
                    || st.heap_wants_fence(b, Some(polled))
            } else {
                !st.idle.bucket_is_empty(b) || st.heap_wants_fence(b, None)
            };
            if waited_on {
                let _ = self.cover(st, b);
            }
        }
        if aged {
            for &b in list {
                let bucket = &mut st.buckets[b as usize];
                bucket.polled_marks = bucket.marks;
            }
        }
    }

    /// A free over the release threshold, when its countdown ran out: polls every
    /// stream bucket, releases (into `batch`) completed memory while the idle bytes
    /// stay over the threshold, and sets the next countdown.
    fn poll_and_release(&self, st: &mut State, batch: &mut Batch) {
        let streams: Vec<u32> = (0..st.buckets.len() as u32)
            .filter(|&b| matches!(st.buckets[b as usize].kind, BucketKind::Stream(_)))
            .collect();
        let (_, list) = self.poll(st, &streams, false);
        self.settle_deferred(st);
        let mut released = Batch::default();
        for &b in &streams {
            self.settle_bucket(st, b, Some(self.release_threshold), &mut released);
        }
        // Segment mode: handles wholly free whose stream work is known complete.
        st.collect_heaps(&mut released, false, Some(self.release_threshold));
        // Fences for what is still idle, after the release (not for what it took).
        self.cover_waited(st, &list, streams.len(), true);
        let found = !released.mappings.is_empty();
        batch.mappings.append(&mut released.mappings);
        st.poll_interval = if found {
            1
        } else {
            (st.poll_interval * 2).min(MAX_POLL_INTERVAL)
        };
        st.poll_countdown = st.poll_interval;
    }

    /// Moves bucket `b`'s idle mappings whose fence completed to [`ANY`]: with
    /// `threshold`, released into `batch` instead while the pool's idle bytes are over
    /// it (and no scope is open).
    fn settle_bucket(&self, st: &mut State, b: u32, threshold: Option<u64>, batch: &mut Batch) {
        let completed = st.buckets[b as usize].completed;
        if completed == 0 {
            return;
        }
        for slot in st.idle.slots_in(b) {
            if st.mapping(slot).mark > completed {
                continue;
            }
            st.index_remove(slot);
            st.mapping_mut(slot).needs_sync = false;
            // A block "released" goes back to its heap, which `ANY` does at once
            // (its work completed); the caller then releases its heap's wholly free
            // handles against the threshold.
            let over = !st.mref(slot).is_block()
                && threshold.is_some_and(|t| {
                    !st.counters.scope_open && st.cached_bytes() - released_bytes(batch) > t
                });
            if over {
                let m = st.mapping_mut(slot);
                m.state = MappingState::Releasing;
                let m = *m;
                batch.mappings.push((slot, m));
            } else {
                st.index_insert(slot, ANY);
            }
        }
    }

    /// Indexes deferred mappings whose recorded streams' fences all completed.
    pub(super) fn settle_deferred(&self, st: &mut State) {
        let mut i = 0;
        while i < st.deferred.len() {
            let done = st.deferred[i]
                .needs
                .iter()
                .all(|&(b, mark)| st.buckets[b as usize].completed >= mark);
            if done {
                let d = st.deferred.swap_remove(i);
                let m = st.mapping(d.slot);
                st.counters.event_wait_bytes -= m.size();
                st.index_insert(d.slot, m.bucket);
            } else {
                i += 1;
            }
        }
    }

    /// Releases everything idle that a release point may release now: records fences
    /// where memory freed on streams is not covered, waits on every outstanding fence
    /// (`cuEventSynchronize`, relaxed capture mode, outside the lock), moves what
    /// completed to [`ANY`], then releases [`ANY`], [`HELD`] and the capture buckets
    /// `captures` names (one device synchronize first only if a mapping needs one).
    /// Memory whose stream work could not be confirmed complete (a failed stream or
    /// event call) is released after a device synchronize instead, counted in
    /// `stream_call_failures`. Without `may_sync` (an out-of-memory on a stream being
    /// captured), or while a stream with idle memory is being captured (unless
    /// `destroying`), nothing that needs a device synchronize is released: that
    /// synchronize would invalidate the capture.
    ///
    /// Errors: the first failed release step; a failed event wait only when the
    /// memory it guards was kept.
    pub(super) fn release_now(
        &self,
        captures: Captures,
        may_sync: bool,
        destroying: bool,
        registered: bool,
    ) -> Result<()> {
        self.release_point(captures, may_sync, destroying, registered, true)
    }

    /// The release before an out-of-memory's retry: as [`Pool::release_now`] with
    /// [`Captures::Keep`], but the pool's streams stay known (a stream is forgotten
    /// only at a trim, a finish or destroy, as documented: an out-of-memory the
    /// engine never asked for must not make the pool forget a stream whose capture
    /// a later sleep or release must see; a review found a sleep after one
    /// synchronizing during the stream's capture).
    pub(super) fn release_for_retry(&self, may_sync: bool) {
        let _ = self.release_point(Captures::Keep, may_sync, false, false, false);
    }

    fn release_point(
        &self,
        captures: Captures,
        may_sync: bool,
        destroying: bool,
        registered: bool,
        forget_streams: bool,
    ) -> Result<()> {
        // Every release point first empties the thread caches into the books.
        self.caches.settle(&self.state);
        let mut first: Option<Error> = None;
        let mut capturing = false;
        // Buckets whose fence could not be recorded or waited on.
        let mut failed: Vec<u32> = Vec::new();
        let waits: Vec<(u32, Fence)> = {
            let mut st = lock(&self.state);
            if !registered {
                // The scope barrier: a release that would start inside a scope does
                // not; one that starts is counted until it is booked, so a scope's
                // begin waits for it (its fence waits and its synchronize included).
                if st.counters.scope_open && !destroying {
                    return Ok(());
                }
                st.releases_running += 1;
            }
            let streams = stream_buckets(&st);
            if may_sync && !destroying {
                match self.any_stream_capturing(&st, &streams) {
                    Ok(c) => capturing = c,
                    Err(e) => {
                        // Unknown: taken as capturing (nothing needing a synchronize
                        // is released), and reported.
                        count_stream_failure(&mut st, e);
                        capturing = true;
                        first = Some(Error::Driver {
                            source: e,
                            bytes: 0,
                        });
                    }
                }
            }
            // Deferred memory waits on its recorded streams' fences and, once back,
            // on its own stream's.
            let mut needed: Vec<u32> = st
                .deferred
                .iter()
                .flat_map(|d| {
                    let own = st.mapping(d.slot).bucket;
                    d.needs.iter().map(|&(b, _)| b).chain(std::iter::once(own))
                })
                .collect();
            needed.sort_unstable();
            needed.dedup();
            for &b in &streams {
                if !st.idle.bucket_is_empty(b) || needed.contains(&b) || st.heap_holds_memory(b) {
                    match self.cover(&mut st, b) {
                        Cover::Covered => {}
                        Cover::Capturing => capturing = true,
                        Cover::Failed => failed.push(b),
                    }
                }
            }
            streams
                .iter()
                .flat_map(|&b| st.buckets[b as usize].fences.iter().map(move |&f| (b, f)))
                .collect()
        };
        let mut results = Vec::with_capacity(waits.len());
        if !waits.is_empty() {
            let _relaxed = Relaxed::enter(&*self.driver);
            for &(b, f) in &waits {
                results.push((b, f, self.driver.event_synchronize(f.event)));
            }
        }
        // A stream being captured now: a device synchronize would invalidate its
        // capture, so nothing that needs one is released (unless destroying).
        let may_sync = destroying || (may_sync && !capturing);
        let mut batch = Batch::default();
        {
            let mut st = lock(&self.state);
            for (b, f, r) in results {
                match r {
                    Ok(()) => {
                        let advanced = complete_through(&mut st, b, f.covers);
                        self.record_done(&mut st, b, f.covers, advanced);
                    }
                    Err(e) => {
                        count_stream_failure(&mut st, e);
                        failed.push(b);
                        if first.is_none() {
                            first = Some(Error::Driver {
                                source: e,
                                bytes: 0,
                            });
                        }
                    }
                }
            }
            let streams = stream_buckets(&st);
            self.settle_deferred(&mut st);
            let mut unused = Batch::default();
            for &b in &streams {
                self.settle_bucket(&mut st, b, None, &mut unused);
            }
            if may_sync {
                // What a failed stream or event call left unconfirmed is released
                // after the device synchronize instead (counted, not an error).
                // Memory freed after this release point recorded its fences is left
                // for a later one.
                let hold = if destroying { &streams } else { &failed };
                hold_unconfirmed(&mut st, hold, destroying);
                for &b in hold {
                    st.hold_heaps(b);
                }
                if !failed.is_empty() {
                    first = None;
                }
            }
            st.collect_all(&mut batch, captures, may_sync);
            st.collect_heaps(&mut batch, may_sync, None);
            st.start_release(&mut batch);
            if may_sync && !capturing && forget_streams {
                // Streams whose memory is all gone are done with, until used again
                // (a stream may be destroyed after a trim).
                for &b in &streams {
                    st.buckets[b as usize].active = false;
                }
            }
        }
        let blocks = batch
            .mappings
            .iter()
            .any(|(_, m)| m.piece == super::books::Piece::Block);
        let mut released = self.release_batch(batch);
        if blocks {
            // Blocks just back in their heaps may have left handles wholly free.
            let mut more = Batch::default();
            {
                let mut st = lock(&self.state);
                st.collect_heaps(&mut more, may_sync, None);
                st.start_release(&mut more);
            }
            released = released.and(self.release_batch(more));
        }
        self.end_release();
        match first {
            Some(e) => Err(e),
            None => released,
        }
    }

    /// A release point counted in `releases_running` is done: the scope barrier may
    /// pass when it was the last.
    fn end_release(&self) {
        let mut st = lock(&self.state);
        st.releases_running -= 1;
        if st.releases_running == 0 {
            self.releases_done.notify_all();
        }
    }

    /// Whether a stream the pool has seen (`streams`, the stream buckets) is being
    /// captured now: a device synchronize would invalidate its capture. Errors: the
    /// first failed query (a destroyed stream's `CUDA_ERROR_INVALID_HANDLE` aside). A capture on a stream the pool never saw is the
    /// caller's to keep clear of trim and finish.
    fn any_stream_capturing(&self, st: &State, streams: &[u32]) -> Result<bool, DriverError> {
        for &b in streams {
            let BucketKind::Stream(s) = st.buckets[b as usize].kind else {
                continue;
            };
            if !in_use(st, b) {
                continue;
            }
            match self.driver.stream_capture(s) {
                Ok(None) => {}
                Ok(Some(_)) => return Ok(true),
                // Destroyed: nothing of it can be captured.
                Err(e) if e.code == crate::driver::CuResult::INVALID_HANDLE => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    /// The ids of the captures open now on the streams the pool has seen (at a
    /// scope's begin: those captures began before the scope, so their memory is not
    /// the scope's).
    pub(super) fn open_captures(&self, st: &State) -> Vec<u64> {
        stream_buckets(st)
            .iter()
            .filter_map(|&b| {
                let bucket = &st.buckets[b as usize];
                match bucket.kind {
                    // As in `any_stream_capturing`.
                    BucketKind::Stream(s) if in_use(st, b) => {
                        self.driver.stream_capture(s).ok().flatten()
                    }
                    _ => None,
                }
            })
            .collect()
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

    /// Gives the pool's events and its fence stream back to the driver (destroy).
    pub(super) fn drop_stream_resources(&self) {
        let mut st = lock(&self.state);
        let mut events = std::mem::take(&mut st.spare_events);
        for b in st.buckets.iter_mut() {
            events.extend(b.fences.drain(..).map(|f| f.event));
        }
        st.counters.events_outstanding = 0;
        let stream = st.fence_stream.take();
        drop(st);
        for e in events {
            let _ = self.driver.event_destroy(e);
        }
        if let Some(s) = stream {
            let _ = self.driver.stream_destroy(s);
        }
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

/// Whether stream bucket `b`'s stream may be asked about captures: used since the
/// last release point that may synchronize, or still holding memory or fences. A
/// stream the pool is done with may have been destroyed, and is not asked; nor is a
/// forgotten one (its handle may name a new stream).
fn in_use(st: &State, b: u32) -> bool {
    let bucket = &st.buckets[b as usize];
    if bucket.forgotten {
        return false;
    }
    bucket.active
        || !bucket.fences.is_empty()
        || !st.idle.bucket_is_empty(b)
        || st.heap_holds_memory(b)
}

/// The bytes already put in `batch` for release.
fn released_bytes(batch: &Batch) -> u64 {
    batch.mappings.iter().map(|(_, m)| m.size()).sum()
}

/// The stream buckets' numbers.
fn stream_buckets(st: &State) -> Vec<u32> {
    (0..st.buckets.len() as u32)
        .filter(|&b| matches!(st.buckets[b as usize].kind, BucketKind::Stream(_)))
        .collect()
}

/// Bucket `b`'s work up to mark `covers` completed: retires the fences it covers.
/// Returns whether that is news (the bucket's completed mark advanced).
fn complete_through(st: &mut State, b: u32, covers: u64) -> bool {
    let bucket = &mut st.buckets[b as usize];
    let advanced = bucket.completed < covers;
    if advanced {
        bucket.completed = covers;
    }
    let mut retired = 0;
    while bucket
        .fences
        .front()
        .is_some_and(|f| f.covers <= bucket.completed)
    {
        if let Some(f) = bucket.fences.pop_front() {
            st.spare_events.push(f.event);
            retired += 1;
        }
    }
    st.counters.events_outstanding -= retired;
    advanced
}

/// A release point that may synchronize the device: memory of buckets `buckets`
/// still waiting on a fence after the waits (a stream or event call failed) goes to
/// [`HELD`], released after the device synchronize; with `all`, so does every
/// deferred mapping (destroy), else those waiting on those buckets (memory of a
/// capture to its capture's bucket instead, released with it after a synchronize).
pub(super) fn hold_unconfirmed(st: &mut State, buckets: &[u32], all: bool) {
    for &b in buckets {
        let completed = st.buckets[b as usize].completed;
        for slot in st.idle.slots_in(b) {
            if st.mapping(slot).mark <= completed {
                continue;
            }
            st.index_remove(slot);
            st.mapping_mut(slot).needs_sync = true;
            st.index_insert(slot, HELD);
        }
    }
    let mut i = 0;
    while i < st.deferred.len() {
        let waits_on_failed = st.deferred[i]
            .needs
            .iter()
            .any(|(b, _)| buckets.contains(b));
        if all || waits_on_failed {
            let d = st.deferred.swap_remove(i);
            let size = st.mapping(d.slot).size();
            st.counters.event_wait_bytes -= size;
            st.mapping_mut(d.slot).needs_sync = true;
            // Memory of a capture stays its capture's (its graph may replay into
            // it), released with that capture's memory after a device synchronize:
            // no stream being captured now (else this release point would not
            // synchronize), so nobody takes it from there.
            let dest = st.mapping(d.slot).bucket;
            let to = if !all && is_capture(st, dest) {
                dest
            } else {
                HELD
            };
            st.index_insert(d.slot, to);
        } else {
            i += 1;
        }
    }
}

/// Whether bucket `b` is a capture's.
fn is_capture(st: &State, b: u32) -> bool {
    matches!(st.buckets[b as usize].kind, BucketKind::Capture { .. })
}

/// Keeps idle `slot` from everyone until a device synchronize ([`HELD`]): its
/// stream order cannot be tracked.
fn hold(st: &mut State, slot: u32) {
    st.mapping_mut(slot).needs_sync = true;
    st.index_insert(slot, HELD);
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

pub(super) fn count_stream_failure(st: &mut State, _e: DriverError) {
    st.counters.stream_call_failures += 1;
}

/// The calling thread in relaxed capture mode until dropped
/// (`cuThreadExchangeStreamCaptureMode`, the previous mode restored): event queries
/// and waits then never invalidate a capture open elsewhere.
struct Relaxed<'a> {
    driver: &'a dyn crate::driver::Driver,
    previous: Option<CaptureMode>,
}

impl<'a> Relaxed<'a> {
    fn enter(driver: &'a dyn crate::driver::Driver) -> Relaxed<'a> {
        let previous = driver.exchange_capture_mode(CaptureMode::Relaxed).ok();
        Relaxed { driver, previous }
    }
}

impl Drop for Relaxed<'_> {
    fn drop(&mut self) {
        if let Some(mode) = self.previous {
            let _ = self.driver.exchange_capture_mode(mode);
        }
    }
}
