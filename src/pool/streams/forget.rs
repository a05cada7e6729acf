//! A stream's end (issue 34, item 6): [`Pool::forget_stream`], which a caller makes
//! before destroying a stream, so that a new stream that gets the destroyed stream's
//! handle value (the CUDA driver hands them out again: RAPIDS RMM issue 2251) starts
//! with no history.
//!
//! The pool keys a stream's state by its raw handle ([`State::by_stream`]): its
//! bucket (memory freed on it, which it takes at once), its fences and marks, the
//! deferred memory waiting on them, and its segment heaps (keyed by the bucket). A
//! new stream with the old handle would inherit all of it: take memory the old
//! stream's queued work still touches, at once, as stream order allows only on the
//! same stream.
//!
//! Forgetting records one last fence on the stream (covering every free made on it,
//! and all its work queued so far, `record_stream` uses included), then unlinks its
//! bucket from the handle. The bucket stays, *forgotten*: its idle memory, deferred
//! memory and heaps drain as any other stream's do (moved to [`ANY`](crate::pool::books::ANY)
//! when the fence is seen complete, released at release points after it, reused by
//! other streams per `cross_stream_reuse`), and its stream is never passed to the
//! driver again. `cuEventRecord` before `cuStreamDestroy` is enough: a destroyed
//! stream's queued work still runs, and an event recorded on it completes when that
//! work has (NVIDIA's documentation of `cuStreamDestroy`). No host synchronization.
//! When no fence can be recorded (the stream already destroyed, a failed call), what
//! it held is kept from everyone and released after a device synchronize, as memory
//! whose order the pool lost is (`HELD`).
//!
//! A forgotten bucket that has drained (no memory, fences, deferred memory or
//! `record_stream` use left, its heaps holding no handle) is given to the next stream
//! the pool meets, reset: a process that creates and destroys streams does not grow
//! the pool's bucket list.

use super::{count_stream_failure, hold_unconfirmed, Cover};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::pool::books::{stream_key, Bucket, BucketKind, State};
use crate::pool::Pool;
use crate::sync::lock;

/// CUDA's `CU_STREAM_PER_THREAD`: the per-thread default stream, never destroyed.
const PER_THREAD_STREAM: u64 = 2;

impl Pool {
    /// Forgets everything the pool keeps under `stream`'s handle; call it before
    /// destroying the stream (`cuStreamDestroy`), so that a stream created later with
    /// the same handle value (the driver may hand it out again at once) starts with
    /// no history: it does not take memory freed on the old stream at once (the old
    /// stream's queued work may still use it), nor wait on its fences or grow its
    /// heaps.
    ///
    /// What the pool held for `stream` stays in the pool, safely: one fence event is
    /// recorded on `stream` now, after all its queued work; memory freed on it (and
    /// in segment mode, its heap's free blocks) is reused by other streams, or
    /// released, once that fence completes, as memory freed on any stream is; memory
    /// freed on other streams with `stream` given to [`Pool::record_stream`] waits on
    /// that fence too. Live allocations made on `stream` stay valid; freeing one later
    /// on a stream with the same handle acts as a free on a new stream. Memory freed
    /// during a capture on `stream` stays its capture's (a graph may replay into it).
    /// After the call, passing the handle to the pool again is using a new stream.
    ///
    /// Called after the stream was destroyed: the fence cannot be recorded (on the
    /// simulated driver the capture query fails with `CUDA_ERROR_INVALID_HANDLE`,
    /// counted in `stream_call_failures`), so memory freed on it that no earlier
    /// fence covers is kept from every stream and released after a device
    /// synchronize (trim, finish, destroy), never early. If a new stream got the
    /// handle in between, the pool cannot tell it from the old one: the call must
    /// come before `cuStreamDestroy`.
    ///
    /// A stream the pool never saw, or forgot already, changes nothing (`Ok`, no
    /// driver call). Otherwise one `cuStreamGetCaptureInfo` and, when frees on it are
    /// not covered yet, one `cuEventRecord` (and a `cuEventCreate` when no spare
    /// event is left); never a synchronize.
    ///
    /// Errors (nothing changes): [`Error::InvalidArgument`] for a default stream,
    /// never destroyed (the legacy stream, handles 0 and 1, or the per-thread stream,
    /// handle 2); [`Error::StreamState`] while `stream` is being captured (a capture
    /// on it must end before it is destroyed; the driver refuses to destroy a
    /// capturing stream too).
    pub fn forget_stream(&self, stream: Stream) -> Result<()> {
        let _order = self.record_order();
        check_forgettable(stream)?;
        let mut st = lock(&self.state);
        let key = stream_key(stream);
        let Some(&b) = st.by_stream.get(&key) else {
            return Ok(());
        };
        let fenced = match self.driver.stream_capture(stream) {
            Ok(Some(_)) => return Err(capturing(stream)),
            Ok(None) => match self.cover_all_work(&mut st, b) {
                Cover::Covered => true,
                // Began a capture since the query: another thread uses the stream.
                Cover::Capturing => return Err(capturing(stream)),
                Cover::Failed => false,
            },
            Err(e) => {
                count_stream_failure(&mut st, e);
                false
            }
        };
        if !fenced {
            // Its order is lost: what no completed fence covers waits for a device
            // synchronize (as after a failed fence at a release point).
            hold_unconfirmed(&mut st, &[b], false);
            st.hold_heaps(b);
        }
        st.by_stream.remove(&key);
        let bucket = &mut st.buckets[b as usize];
        bucket.forgotten = true;
        bucket.active = false;
        if let Some(rec) = &self.rec {
            rec.forget(stream);
        }
        Ok(())
    }
}

impl Pool {
    /// Records the forgotten stream's last fence on bucket `b`: covering its frees
    /// ([`Pool::cover`]), and, when a live allocation has it from `record_stream`, all
    /// its work so far (a mark of its own: that allocation's free, on another stream,
    /// will wait on this fence, the last one the stream can get).
    fn cover_all_work(&self, st: &mut State, b: u32) -> Cover {
        if st.recorded.values().any(|list| list.contains(&b)) {
            st.buckets[b as usize].marks += 1;
        }
        self.cover(st, b)
    }
}

/// [`Pool::forget_stream`]'s argument check: the default streams (the legacy
/// stream, 0 and `CU_STREAM_LEGACY`, and `CU_STREAM_PER_THREAD`, 2) are never
/// destroyed.
///
/// Errors: [`Error::InvalidArgument`] for those.
pub(crate) fn check_forgettable(stream: Stream) -> Result<()> {
    if stream.is_legacy() || stream.0 == PER_THREAD_STREAM {
        return Err(Error::InvalidArgument(format!(
            "stream {:#x} is a default stream, never destroyed: nothing to forget",
            stream.0
        )));
    }
    Ok(())
}

/// The refusal of forgetting `stream` while it is being captured.
fn capturing(stream: Stream) -> Error {
    Error::StreamState {
        stream: stream.0,
        reason: "being captured: end its capture before forgetting and destroying it",
    }
}

impl State {
    /// A forgotten stream bucket that holds nothing and that nothing refers to, if
    /// any: no idle memory, fences, deferred memory waiting on it or going to it,
    /// `record_stream` use, or heap of it holding a handle or with a growth or
    /// release in flight. None while a release point runs: it holds bucket numbers
    /// across its event waits (outside the lock), and a fence's completion booked
    /// into a bucket given to a new stream since would tell that stream its work
    /// completed. Rare: only when a new stream bucket is made.
    pub(in crate::pool) fn drained_forgotten_bucket(&self) -> Option<u32> {
        if self.releases_running > 0 {
            return None;
        }
        let mut candidates = (0..self.buckets.len() as u32).filter(|&b| {
            let bucket = &self.buckets[b as usize];
            bucket.forgotten
                && bucket.fences.is_empty()
                && self.idle.bucket_is_empty(b)
                && !self.heap_busy_or_holding(b)
        });
        candidates.find(|&b| {
            !self
                .deferred
                .iter()
                .any(|d| self.mapping(d.slot).bucket == b || d.needs.iter().any(|&(n, _)| n == b))
                && !self.recorded.values().any(|list| list.contains(&b))
        })
    }

    /// Gives drained forgotten bucket `b` to a new stream (`kind`): no marks, fences
    /// or completion of the old stream's; its heaps' empty segments (their
    /// reservations kept) start with no mark either.
    pub(in crate::pool) fn reuse_forgotten_bucket(&mut self, b: u32, kind: BucketKind) {
        self.buckets[b as usize] = Bucket::new(kind);
        for k in [b << 1, (b << 1) | 1] {
            let n = self.segs.by_key.get(&k).map_or(0, Vec::len);
            for i in 0..n {
                let sid = self.segs.by_key[&k][i];
                self.segs.segs[sid as usize].mark = 0;
            }
        }
    }

    /// Whether a heap of stream bucket `b` holds a handle or has a growth or handle
    /// release in flight.
    fn heap_busy_or_holding(&self, b: u32) -> bool {
        [b << 1, (b << 1) | 1].iter().any(|k| {
            self.segs.by_key.get(k).is_some_and(|ids| {
                ids.iter().any(|&s| {
                    let seg = &self.segs.segs[s as usize];
                    !seg.handles.is_empty() || seg.busy > 0
                })
            })
        })
    }
}
