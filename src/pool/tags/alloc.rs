//! Tagged allocation: a tag's whole mappings and the blocks of its own heaps.

use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::pool::books::{State, ANY};
use crate::pool::segments::{heap_key, round_up};
use crate::pool::{OnOom, Pool, ReusePolicy};
use crate::sync::lock;

impl Pool {
    /// Allocates `bytes` for tag `tag`; returns a guard that frees it on drop (on
    /// `stream` when given). See [`Pool::allocate_tagged_raw`]. A guard dropped
    /// while its tag sleeps frees nothing (the free is refused): the allocation
    /// stays live until [`Pool::destroy`]; wake the tag before dropping its guards.
    pub fn allocate_tagged(
        &self,
        bytes: u64,
        stream: Option<Stream>,
        tag: u32,
    ) -> Result<crate::pool::Allocation<'_>> {
        if tag == 0 {
            return match stream {
                Some(s) => self.allocate_async(bytes, s),
                None => self.allocate(bytes),
            };
        }
        let ptr = self.allocate_tagged_raw(bytes, stream, tag)?;
        Ok(self.guard(ptr, bytes, stream))
    }

    /// Allocates `bytes` for tag `tag` (`docs/ARCHITECTURE.md`, "Tags: sleep and
    /// wake"): with `stream`, stream-ordered on it as [`Pool::allocate_async_raw`];
    /// with `None`, as [`Pool::allocate_raw`]. Tag 0 is exactly those functions.
    ///
    /// A tag other than 0 never takes a thread cache's memory. In segment mode, a
    /// request up to `segment_whole_threshold_bytes` (synchronous or on `stream`) is
    /// a block (rounded up to 512 bytes, aligned to 512) of the tag's own heap, which
    /// grows by whole handles holding only the tag's blocks; freed with
    /// [`Pool::free_raw`] or [`Pool::free_async_raw`], it stays the tag's (reused by
    /// the tag once a release point or its stream's fence says its work is done).
    /// Otherwise it takes a whole mapping (rounded to the granularity): an idle one of
    /// its own bucket (synchronous only), one freed on a stream whose work is known
    /// complete (or, stream-ordered outside segment mode, what
    /// [`Pool::allocate_async_raw`] may take), else a new one.
    ///
    /// Concurrency: the allocation runs wholly before or wholly after each sleep or
    /// wake of its tag (`docs/ARCHITECTURE.md`, "Tags: sleep and wake"); one that
    /// finds the tag asleep or a sleep or wake of it running is refused. A whole
    /// mapping of a tag other than 0 passes through tag 0's books, so its allocation
    /// waits for a sleep or wake of tag 0 that runs to end (tag 0 asleep does not stop
    /// it).
    ///
    /// Errors: [`Error::InvalidArgument`] for 0 bytes or a size whose rounding
    /// overflows (checked first); [`Error::TagState`] while the tag sleeps or a sleep
    /// or wake of it runs (nothing done); otherwise as [`Pool::allocate_raw`] /
    /// [`Pool::allocate_async_raw`].
    pub fn allocate_tagged_raw(
        &self,
        bytes: u64,
        stream: Option<Stream>,
        tag: u32,
    ) -> Result<DevicePtr> {
        let _order = self.record_order();
        if tag == 0 {
            self.record_call_start();
            return match stream {
                Some(s) => self.allocate_async_raw(bytes, s),
                None => self.allocate_raw(bytes),
            };
        }
        // Bad input first (refused whatever the tag's state), then the tag's gate.
        let whole = self.checked_request(bytes)?.is_none();
        let entry = self.enter_tagged(tag, whole)?;
        self.record_call_start();
        let r = self.allocate_tagged_unrecorded(bytes, stream, tag);
        self.leave(entry);
        self.history_alloc(&r, |p| *p, bytes, tag, stream);
        match &r {
            Ok(ptr) => self.record_tagged(*ptr, bytes, tag, stream),
            Err(e) => self.record_failed(e, bytes, tag, stream),
        }
        r
    }

    /// [`Pool::allocate_tagged_raw`] of a tag other than 0, not recorded.
    fn allocate_tagged_unrecorded(
        &self,
        bytes: u64,
        stream: Option<Stream>,
        tag: u32,
    ) -> Result<DevicePtr> {
        if let Some(size) = self.checked_request(bytes)? {
            return self.allocate_tag_block(tag, size, bytes, stream);
        }
        let (rounded, max_size) = self.sizes(bytes)?;
        let ptr = match stream {
            Some(s) if !self.segments => self.allocate_async_whole(bytes, s)?,
            _ => self.allocate_tag_whole(tag, bytes, rounded, max_size, stream)?,
        };
        let mut st = lock(&self.state);
        st.tag_live(ptr, tag);
        drop(st);
        Ok(ptr)
    }

    /// A block of `size` bytes (`bytes` asked) of tag `tag`'s own heap (segment
    /// mode), synchronous (`stream` `None`) or stream-ordered on `stream`: carved
    /// from the heap's free blocks (memory any stream may use at once: blocks freed on
    /// a stream go back to the heap only once their fence completed, blocks freed
    /// with the synchronous `free` only after a device synchronize); for the
    /// synchronous API, then a block the tag freed with the synchronous `free`
    /// (taken whole, within the policy's bound); then, after polling the fences of
    /// blocks freed on streams, the heap again; else the heap grows by a whole handle.
    /// On out-of-memory (outside a scope) what is idle is released (the synchronous
    /// API: after a device synchronize; a stream: only memory whose fences
    /// completed) and the growth retried once. Never another tag's memory.
    fn allocate_tag_block(
        &self,
        tag: u32,
        size: u64,
        bytes: u64,
        stream: Option<Stream>,
    ) -> Result<DevicePtr> {
        // The tag's heap serves every stream: a hit would never ask the driver about
        // `stream`, so ask first, as the untagged path does on its stream heap's
        // miss (a handle that is no stream is refused there, not handed memory).
        if let Some(s) = stream {
            self.driver
                .stream_capture(s)
                .map_err(|source| Error::Driver { source, bytes: 0 })?;
        }
        let mine = |st: &mut State, p: DevicePtr| {
            st.tag_live(p, tag);
            if let Some(s) = stream {
                self.driver.note_handoff(s, p, size);
            }
            p
        };
        let key = {
            let mut st = lock(&self.state);
            let key = heap_key(st.tag_bucket(tag), size);
            if let Some(p) = st.carve(key, size, bytes, true) {
                return Ok(mine(&mut st, p));
            }
            if stream.is_none() && self.policy != ReusePolicy::None {
                let b = st.tag_blocks_bucket(tag);
                if let Some(p) = st.take_idle(b, size, bytes, self.policy, self.max_fit(size)) {
                    return Ok(mine(&mut st, p));
                }
            }
            if !st.deferred.is_empty() {
                let _ = self.poll(&mut st, &[], false);
                self.settle_deferred(&mut st);
                if let Some(p) = st.carve(key, size, bytes, true) {
                    return Ok(mine(&mut st, p));
                }
            }
            key
        };
        let rounded = round_up(size, self.granularity).unwrap_or(u64::MAX);
        let on_oom = OnOom {
            settle_caches: false,
            take_forced: |_: &mut State| None,
            may_sync: stream.is_none(),
        };
        self.miss_with(
            rounded,
            on_oom,
            || {
                self.grow_and_carve(key, size, bytes)
                    .map(|p| mine(&mut lock(&self.state), p))
            },
            |st| st.carve(key, size, bytes, true).map(|p| mine(st, p)),
        )
    }

    /// A whole mapping for tag `tag`: its bucket (synchronous only), [`ANY`], a new
    /// mapping; on out-of-memory, a forced reuse of the same buckets, then (outside a
    /// scope) a release of idle memory and one retry.
    fn allocate_tag_whole(
        &self,
        tag: u32,
        bytes: u64,
        rounded: u64,
        max_size: u64,
        stream: Option<Stream>,
    ) -> Result<DevicePtr> {
        if rounded > self.device_total {
            return Err(Error::RequestTooLarge {
                requested: rounded,
                device_total: self.device_total,
            });
        }
        let take = |st: &mut State, forced: bool| {
            let own = if stream.is_none() {
                Some(st.tag_bucket(tag))
            } else {
                None
            };
            if self.policy == ReusePolicy::None {
                return None;
            }
            let mut hit = None;
            for b in own.into_iter().chain([ANY]) {
                hit = if forced {
                    st.take_forced(b, rounded, bytes)
                } else {
                    st.take_idle(b, rounded, bytes, self.policy, max_size)
                };
                if hit.is_some() {
                    break;
                }
            }
            hit
        };
        let handoff = |ptr: DevicePtr| {
            if let Some(s) = stream {
                self.driver.note_handoff(s, ptr, rounded);
            }
            ptr
        };
        if let Some(p) = take(&mut lock(&self.state), false) {
            return Ok(handoff(p));
        }
        let on_oom = OnOom {
            settle_caches: false,
            take_forced: |st: &mut State| take(st, true),
            may_sync: stream.is_none(),
        };
        self.miss_with(
            rounded,
            on_oom,
            || self.create_mapping(rounded, bytes),
            |_| None,
        )
        .map(handoff)
    }
}
