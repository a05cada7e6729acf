//! Release points: a free over the release threshold polls and releases what
//! completed; trim, a scope's finish, an out-of-memory retry and destroy wait on every
//! fence and release what they may, synchronizing the device only where no capture
//! would break.

use super::fences::{complete_through, count_stream_failure, is_capture, Cover, Relaxed};
use crate::driver::DriverError;
use crate::error::{Error, Result};
use crate::pool::books::{BucketKind, Fence, State, HELD};
use crate::pool::release::{Batch, Captures};
use crate::pool::Pool;
use crate::sync::lock;

/// The most frees over the release threshold between two event polls (the interval
/// doubles from 1 to this while polls find nothing complete): 1,000 frees of
/// buffers still in flight make about 20 polls, not 1,000.
const MAX_POLL_INTERVAL: u32 = 64;

impl Pool {
    /// A free over the release threshold, when its countdown ran out: polls every
    /// stream bucket, releases (into `batch`) completed memory while the idle bytes
    /// stay over the threshold, and sets the next countdown.
    pub(super) fn poll_and_release(&self, st: &mut State, batch: &mut Batch) {
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
    ///
    /// [`ANY`]: crate::pool::books::ANY
    pub(in crate::pool) fn release_now(
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
    pub(in crate::pool) fn release_for_retry(&self, may_sync: bool) {
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
            .any(|(_, m)| m.piece == crate::pool::books::Piece::Block);
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
    pub(in crate::pool) fn open_captures(&self, st: &State) -> Vec<u64> {
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

    /// Gives the pool's events and its fence stream back to the driver (destroy).
    pub(in crate::pool) fn drop_stream_resources(&self) {
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

/// The stream buckets' numbers.
fn stream_buckets(st: &State) -> Vec<u32> {
    (0..st.buckets.len() as u32)
        .filter(|&b| matches!(st.buckets[b as usize].kind, BucketKind::Stream(_)))
        .collect()
}

/// A release point that may synchronize the device: memory of buckets `buckets`
/// still waiting on a fence after the waits (a stream or event call failed) goes to
/// [`HELD`], released after the device synchronize; with `all`, so does every
/// deferred mapping (destroy), else those waiting on those buckets (memory of a
/// capture to its capture's bucket instead, released with it after a synchronize).
pub(in crate::pool) fn hold_unconfirmed(st: &mut State, buckets: &[u32], all: bool) {
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
