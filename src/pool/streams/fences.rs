//! Fences: events recorded on a stream after its frees, polled (`cuEventQuery`) with
//! the calling thread in relaxed capture mode; what a completed fence covers moves to
//! [`ANY`].

use crate::driver::{CaptureMode, DriverError, Stream};
use crate::pool::books::{BucketKind, Fence, MappingState, State, ANY, HELD};
use crate::pool::release::Batch;
use crate::pool::Pool;

/// What recording a fence on a bucket's stream did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::pool) enum Cover {
    /// Its frees are covered by a fence (recorded now or before).
    Covered,
    /// The stream is being captured: a record would be a graph node; try later.
    Capturing,
    /// A stream or event call failed (counted).
    Failed,
}

/// The calling thread in relaxed capture mode until dropped
/// (`cuThreadExchangeStreamCaptureMode`, the previous mode restored): event queries
/// and waits then never invalidate a capture open elsewhere.
pub(super) struct Relaxed<'a> {
    driver: &'a dyn crate::driver::Driver,
    previous: Option<CaptureMode>,
}

impl Pool {
    /// Records that bucket `b`'s stream completed through mark `covers`
    /// (`done STREAM MARK`), when recording and `advanced`: held for the line of a
    /// stream-ordered free whose locked section this is.
    pub(super) fn record_done(&self, st: &mut State, b: u32, covers: u64, advanced: bool) {
        // A forgotten stream's handle names another stream in the trace from its
        // `forget` line on: what completes of it is not written (not reproduced).
        if let (Some(rec), true, false) = (&self.rec, advanced, st.buckets[b as usize].forgotten) {
            if let BucketKind::Stream(s) = st.buckets[b as usize].kind {
                rec.done(&mut st.rec_held, s, covers);
            }
        }
    }

    /// Records a fence on bucket `b`'s stream covering every free made on it so far,
    /// unless one already does. A forgotten stream's bucket is never recorded on (its
    /// handle may name a new stream now): `Failed` when its forget could not fence it.
    pub(in crate::pool) fn cover(&self, st: &mut State, b: u32) -> Cover {
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
    pub(super) fn fence_stream(&self, st: &mut State) -> Option<Stream> {
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
    pub(in crate::pool) fn poll(
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
    pub(super) fn cover_waited(
        &self,
        st: &mut State,
        list: &[u32],
        first_deferred: usize,
        aged: bool,
    ) {
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

    /// Moves bucket `b`'s idle mappings whose fence completed to [`ANY`]: with
    /// `threshold`, released into `batch` instead while the pool's idle bytes are over
    /// it (and no scope is open).
    pub(super) fn settle_bucket(
        &self,
        st: &mut State,
        b: u32,
        threshold: Option<u64>,
        batch: &mut Batch,
    ) {
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
                st.history_whole(slot, false);
            } else {
                st.index_insert(slot, ANY);
            }
        }
    }

    /// Indexes deferred mappings whose recorded streams' fences all completed.
    pub(in crate::pool) fn settle_deferred(&self, st: &mut State) {
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
}

impl<'a> Relaxed<'a> {
    pub(super) fn enter(driver: &'a dyn crate::driver::Driver) -> Relaxed<'a> {
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

/// The bytes already put in `batch` for release.
fn released_bytes(batch: &Batch) -> u64 {
    batch.mappings.iter().map(|(_, m)| m.size()).sum()
}

/// Bucket `b`'s work up to mark `covers` completed: retires the fences it covers.
/// Returns whether that is news (the bucket's completed mark advanced).
pub(super) fn complete_through(st: &mut State, b: u32, covers: u64) -> bool {
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

/// Whether bucket `b` is a capture's.
pub(super) fn is_capture(st: &State, b: u32) -> bool {
    matches!(st.buckets[b as usize].kind, BucketKind::Capture { .. })
}

/// Keeps idle `slot` from everyone until a device synchronize ([`HELD`]): its
/// stream order cannot be tracked.
pub(super) fn hold(st: &mut State, slot: u32) {
    st.mapping_mut(slot).needs_sync = true;
    st.index_insert(slot, HELD);
}

pub(in crate::pool) fn count_stream_failure(st: &mut State, _e: DriverError) {
    st.counters.stream_call_failures += 1;
}
