//! Tags (issue 15): allocations labelled with a `u32` tag, a census of what each tag
//! holds, and sleep / wake: a tag's physical memory given back to the device while
//! every reservation (every pointer) stays, then mapped again at the same addresses.
//!
//! - Tag 0 is what the untagged functions use. A tag other than 0 takes **whole
//!   mappings** only, in every policy (in segment mode too: a tag's handles then hold
//!   no other tag's blocks, and tag 0 keeps the segments), and never goes through the
//!   thread caches. Its synchronous frees idle in the tag's own bucket
//!   ([`BucketKind::Tag`]), which only that tag's allocations take (and release
//!   points release, after a device synchronize). Memory a tag frees on a stream
//!   joins the stream-order buckets, which belong to tag 0 (the pool's shared idle
//!   memory): from then on it is tag 0's.
//! - The census of a tag other than 0 is kept in [`TagBooks`], updated where the
//!   books move bytes (hand-out, free, index insert and removal, sleep, wake): O(1),
//!   no walk. Tag 0's is the snapshot less every other tag's.
//! - Sleep and wake walk the tag's live mappings (the pointer map) once each.

use super::books::{BucketKind, MappingState, Piece, State, ANY};
use super::release::Batch;
use super::{Pool, ReusePolicy};
use crate::driver::{DevicePtr, DriverError, HostBuffer, PhysicalHandle, Stream};
use crate::error::{Error, Result};
use crate::sync::lock;
use std::sync::atomic::Ordering;

/// What [`Pool::sleep`] does with the contents of a tag's live allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SleepMode {
    /// Contents are lost: after [`Pool::wake`] every pointer is valid again with
    /// unspecified contents (`FLARE_SLEEP_DISCARD`, 0).
    Discard = 0,
    /// Contents are copied to pinned host memory (`cuMemHostAlloc`, `cuMemcpyDtoH`)
    /// before the physical memory is released, and copied back at wake
    /// (`FLARE_SLEEP_OFFLOAD`, 1).
    Offload = 1,
}

/// What one tag holds ([`Pool::tag_census`]). Bytes are the pool's sizes (a whole
/// mapping's size, rounded to the granularity; a block's, rounded to 512 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TagCensus {
    /// Whether the tag sleeps ([`Pool::sleep`] succeeded, [`Pool::wake`] not yet).
    pub sleeping: bool,
    /// Live allocations of the tag (sleeping ones included).
    pub live_count: u64,
    /// Bytes of those.
    pub live_bytes: u64,
    /// High watermark of `live_bytes`. Tags other than 0: exact. Tag 0 (whose live
    /// bytes may change in thread caches with no shared write): the highest value
    /// seen by a census.
    pub peak_live_bytes: u64,
    /// Idle bytes the tag holds: its own bucket (tags other than 0); for tag 0, every
    /// other idle mapping and free block of the pool.
    pub idle_bytes: u64,
    /// Physical bytes the tag holds on the device: live (not asleep) and idle, plus
    /// the handles of sleeping allocations the driver refused to release. Pending
    /// releases are the pool's, in no tag.
    pub physical_bytes: u64,
    /// Bytes of pinned host memory holding the tag's contents while it sleeps in
    /// [`SleepMode::Offload`]: the sum of its live allocations' requested bytes (not
    /// the rounded sizes: only what was asked is copied).
    pub offloaded_bytes: u64,
}

/// The books of one tag.
#[derive(Debug, Default)]
pub(super) struct TagBooks {
    /// The tag's bucket ([`BucketKind::Tag`]), made on first use (tags other than 0).
    pub(super) bucket: Option<u32>,
    pub(super) live_count: u64,
    pub(super) live_bytes: u64,
    pub(super) peak_live_bytes: u64,
    pub(super) idle_bytes: u64,
    /// Physical bytes of its live allocations (awake, or asleep with a handle the
    /// driver kept).
    pub(super) live_physical: u64,
    /// Asleep, with this mode.
    pub(super) sleeping: Option<SleepMode>,
    /// A sleep or wake is running: allocations and frees of the tag are refused.
    pub(super) busy: bool,
    /// Its offloaded contents, while asleep in offload mode.
    pub(super) host: Option<HostBuffer>,
    /// While asleep: each live slot put to sleep and, offloaded, its bytes' offset in
    /// `host` (`u64::MAX`: not copied).
    pub(super) asleep: Vec<(u32, u64)>,
}

impl TagBooks {
    fn blocked(&self) -> bool {
        self.sleeping.is_some() || self.busy
    }
}

/// A live mapping a sleep or wake works on: slot, address, handle, requested bytes.
#[derive(Clone, Copy, Debug)]
struct Piece2 {
    slot: u32,
    ptr: DevicePtr,
    handle: PhysicalHandle,
    requested: u64,
    handle_live: bool,
}

impl State {
    /// The bucket an idle whole mapping freed into `bucket` goes to: a tagged
    /// mapping freed with the synchronous `free` goes to its tag's bucket; one freed
    /// anywhere else becomes tag 0's.
    pub(super) fn tag_bucket_for(&mut self, slot: u32, bucket: u32) -> u32 {
        let (tag, block) = {
            let m = self.mref(slot);
            (m.tag, m.is_block())
        };
        if tag == 0 || block {
            return bucket;
        }
        let is_tag_bucket = matches!(
            self.buckets.get(bucket as usize).map(|b| b.kind),
            Some(BucketKind::Tag(_))
        );
        if bucket == super::books::SYNC_FREED || is_tag_bucket {
            return self.tag_bucket(tag);
        }
        self.mapping_mut(slot).tag = 0;
        bucket
    }

    /// The bucket of tag `tag` (not 0), made on first use.
    pub(super) fn tag_bucket(&mut self, tag: u32) -> u32 {
        if let Some(b) = self.tags.get(&tag).and_then(|t| t.bucket) {
            return b;
        }
        let b = self.buckets.len() as u32;
        self.buckets
            .push(super::books::Bucket::new(BucketKind::Tag(tag)));
        self.tags.entry(tag).or_default().bucket = Some(b);
        b
    }

    /// `size` idle bytes into (`add`) or out of tag `tag`'s bucket.
    pub(super) fn tag_idle_bytes(&mut self, tag: u32, size: u64, add: bool) {
        let t = self.tags.entry(tag).or_default();
        if add {
            t.idle_bytes += size;
        } else {
            t.idle_bytes = t.idle_bytes.saturating_sub(size);
        }
    }

    /// Live `slot` is no longer live: out of its tag's live counts (tags other than
    /// 0; the tag is kept on the mapping for [`State::tag_bucket_for`]).
    pub(super) fn untag_live(&mut self, slot: u32) {
        let (tag, size) = {
            let m = self.mref(slot);
            (m.tag, m.size())
        };
        if tag == 0 {
            return;
        }
        if let Some(t) = self.tags.get_mut(&tag) {
            t.live_count = t.live_count.saturating_sub(1);
            t.live_bytes = t.live_bytes.saturating_sub(size);
            t.live_physical = t.live_physical.saturating_sub(size);
        }
    }

    /// Live whole mapping `ptr`, just handed out, becomes tag `tag`'s.
    fn tag_live(&mut self, ptr: DevicePtr, tag: u32) {
        let Some(&slot) = self.live.get(&ptr) else {
            return;
        };
        let size = {
            let m = self.mapping_mut(slot);
            m.tag = tag;
            m.size()
        };
        let t = self.tags.entry(tag).or_default();
        t.live_count += 1;
        t.live_bytes += size;
        t.live_physical += size;
        t.peak_live_bytes = t.peak_live_bytes.max(t.live_bytes);
    }

    /// Error unless tag `tag` may allocate and free now (and have streams
    /// recorded on its allocations).
    pub(super) fn tag_usable(&self, tag: u32) -> Result<()> {
        match self.tags.get(&tag) {
            Some(t) if t.blocked() => Err(Error::TagState {
                tag,
                reason: "the tag is asleep (or being put to sleep or woken): wake it first",
            }),
            _ => Ok(()),
        }
    }
}

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
    ) -> Result<super::Allocation<'_>> {
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
    /// with `None`, as [`Pool::allocate_raw`]. Tag 0 is exactly those functions. A
    /// tag other than 0 takes a whole mapping (rounded to the granularity) in every
    /// policy, segment mode included: an idle one of its own bucket (synchronous
    /// only), one freed on a stream whose work is known complete (or, stream-ordered
    /// outside segment mode, what [`Pool::allocate_async_raw`] may take), else a new
    /// one; never a thread cache.
    ///
    /// Errors: [`Error::TagState`] while the tag sleeps (or a sleep or wake of it
    /// runs); otherwise as [`Pool::allocate_raw`] / [`Pool::allocate_async_raw`].
    pub fn allocate_tagged_raw(
        &self,
        bytes: u64,
        stream: Option<Stream>,
        tag: u32,
    ) -> Result<DevicePtr> {
        lock(&self.state).tag_usable(tag)?;
        self.record_call_start();
        if tag == 0 {
            return match stream {
                Some(s) => self.allocate_async_raw(bytes, s),
                None => self.allocate_raw(bytes),
            };
        }
        let (rounded, max_size) = self.sizes(bytes)?;
        let ptr = match stream {
            Some(s) if !self.segments => self.allocate_async_whole(bytes, s)?,
            _ => self.allocate_tag_whole(tag, bytes, rounded, max_size, stream)?,
        };
        let mut st = lock(&self.state);
        st.tag_live(ptr, tag);
        drop(st);
        self.record_tagged(ptr, bytes, tag, stream);
        Ok(ptr)
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
        let driver_error = |source| Error::Driver {
            source,
            bytes: rounded,
        };
        let err = match self.create_mapping(rounded, bytes) {
            Ok(p) => return Ok(handoff(p)),
            Err(e) if e.is_out_of_memory() => e,
            Err(e) => return Err(driver_error(e)),
        };
        {
            let mut st = lock(&self.state);
            if let Some(p) = take(&mut st, true) {
                return Ok(handoff(p));
            }
            if st.counters.scope_open {
                return Err(self.oom_error(&st, rounded, Some(err)));
            }
            st.counters.oom_retries += 1;
        }
        let _ = self.release_now(
            super::release::Captures::Keep,
            stream.is_none(),
            false,
            false,
        );
        match self.create_mapping(rounded, bytes) {
            Ok(p) => Ok(handoff(p)),
            Err(e) if e.is_out_of_memory() => {
                let st = lock(&self.state);
                Err(self.oom_error(&st, rounded, Some(e)))
            }
            Err(e) => Err(driver_error(e)),
        }
    }

    /// Refuses a free of `ptr` while its tag sleeps (checked only while some tag
    /// sleeps or is in transition: one relaxed load otherwise... under the lock).
    pub(super) fn check_free_tag(&self, ptr: DevicePtr) -> Result<()> {
        let st = lock(&self.state);
        if st.tags.values().all(|t| !t.blocked()) {
            return Ok(());
        }
        let Some(&slot) = st.live.get(&ptr) else {
            return Ok(());
        };
        st.tag_usable(st.mref(slot).tag)
    }

    /// Whether tag 0 may allocate now (checked by the untagged allocation functions
    /// while some tag sleeps).
    pub(super) fn check_tag0(&self) -> Result<()> {
        lock(&self.state).tag_usable(0)
    }

    /// The census of tag `tag`: exact (under the lock, with every thread cache's
    /// deltas for tag 0), O(number of tags), no walk over allocations. A tag never
    /// used reads all zeros.
    pub fn tag_census(&self, tag: u32) -> TagCensus {
        let snap = self.snapshot();
        let mut st = lock(&self.state);
        let own = |t: &TagBooks| TagCensus {
            sleeping: t.sleeping.is_some(),
            live_count: t.live_count,
            live_bytes: t.live_bytes,
            peak_live_bytes: t.peak_live_bytes,
            idle_bytes: t.idle_bytes,
            physical_bytes: t.live_physical + t.idle_bytes,
            offloaded_bytes: t.host.map_or(0, |h| h.size),
        };
        if tag != 0 {
            return st.tags.get(&tag).map(own).unwrap_or_default();
        }
        let mut c = TagCensus {
            live_count: snap.live_count,
            live_bytes: snap.live_mapped_bytes
                + snap.block_live_bytes
                + snap.sleeping_bytes
                + snap.sleeping_held_bytes,
            idle_bytes: snap.idle_bytes + snap.block_free_bytes,
            physical_bytes: snap.physical_bytes - snap.pending_bytes,
            ..TagCensus::default()
        };
        for (&t, b) in st.tags.iter().filter(|(&t, _)| t != 0) {
            let _ = t;
            let o = own(b);
            c.live_count = c.live_count.saturating_sub(o.live_count);
            c.live_bytes = c.live_bytes.saturating_sub(o.live_bytes);
            c.idle_bytes = c.idle_bytes.saturating_sub(o.idle_bytes);
            c.physical_bytes = c.physical_bytes.saturating_sub(o.physical_bytes);
        }
        let zero = st.tags.entry(0).or_default();
        zero.peak_live_bytes = zero.peak_live_bytes.max(c.live_bytes);
        c.peak_live_bytes = zero.peak_live_bytes;
        c.sleeping = zero.sleeping.is_some();
        c.offloaded_bytes = zero.host.map_or(0, |h| h.size);
        c
    }

    /// Puts tag `tag` to sleep: its physical memory goes back to the device, every
    /// reservation (every pointer) stays.
    ///
    /// Steps: the tag's idle memory is released (tag 0: the thread caches are settled
    /// and everything idle released, as [`Pool::trim`]; another tag: its bucket);
    /// every device with access is synchronized (`cuCtxSynchronize`: the work that
    /// may touch the tag's memory, on any stream, completes); in
    /// [`SleepMode::Offload`] one pinned host buffer (`cuMemHostAlloc`) receives every
    /// live allocation's requested bytes (`cuMemcpyDtoH`); then every live mapping of
    /// the tag is unmapped (`cuMemUnmap`) and its handle released (`cuMemRelease`).
    /// Allocating or freeing with the tag is refused until [`Pool::wake`]; other tags
    /// are untouched. Sleep and wake must not race allocations or frees of the same
    /// tag on other threads (they are refused once the sleep has begun; one that
    /// began before may finish after it).
    ///
    /// Failures: a failed synchronize, host allocation or copy changes nothing (the
    /// host buffer is freed); a failed unmap maps the mappings already unmapped back
    /// (their handles are still held) and returns the error, the tag awake; if that
    /// too is refused, the tag sleeps with those handles kept and [`Pool::wake`]
    /// maps them again. A handle the driver refuses to release is kept (counted in
    /// `sleeping_held_bytes` and the census's physical bytes) and mapped again at
    /// wake; the sleep succeeds.
    ///
    /// Errors: [`Error::ScopeState`] inside a retention scope or while one of the
    /// pool's streams is being captured; [`Error::TagState`] when the tag already
    /// sleeps; [`Error::NotSupported`] for tag 0 in segment mode (its blocks share
    /// handles); [`Error::Driver`] as above.
    pub fn sleep(&self, tag: u32, mode: SleepMode) -> Result<()> {
        if tag == 0 && self.segments {
            return Err(Error::NotSupported(
                "sleep of tag 0 in segment mode: its blocks share handles (tag the memory to sleep)",
            ));
        }
        {
            let mut st = lock(&self.state);
            if st.counters.scope_open {
                return Err(Error::ScopeState(
                    "sleep inside a retention scope: finish the scope first",
                ));
            }
            st.tag_usable(tag).map_err(|_| Error::TagState {
                tag,
                reason: "the tag already sleeps (or a sleep or wake of it runs)",
            })?;
            if !self.open_captures(&st).is_empty() {
                return Err(Error::ScopeState(
                    "sleep while one of the pool's streams is being captured",
                ));
            }
            st.tags.entry(tag).or_default().busy = true;
            self.tags_blocked.fetch_add(1, Ordering::Relaxed);
        }
        let result = self.sleep_steps(tag, mode);
        let mut st = lock(&self.state);
        let t = st.tags.entry(tag).or_default();
        t.busy = false;
        if t.sleeping.is_none() {
            self.tags_blocked.fetch_sub(1, Ordering::Relaxed);
        }
        result
    }

    /// Whether some tag sleeps or is being put to sleep or woken.
    pub(super) fn any_tag_blocked(&self) -> bool {
        self.tags_blocked.load(Ordering::Relaxed) > 0
    }

    fn sleep_steps(&self, tag: u32, mode: SleepMode) -> Result<()> {
        let d = &*self.driver;
        // The work that may touch the tag's memory, on any stream, completes.
        for &device in &self.access_devices {
            if let Err(source) = d.synchronize(device) {
                lock(&self.state).counters.count_failure(source.call);
                return Err(Error::Driver { source, bytes: 0 });
            }
        }
        // The tag's idle memory is released as a release point does (tag 0: as
        // trim); a refusal fails the sleep, the tag awake (what was refused is kept
        // and retried at the next release point, as always).
        if tag == 0 {
            self.release_idle(true)?;
        } else {
            let mut batch = Batch::default();
            {
                let mut st = lock(&self.state);
                let b = st.tag_bucket(tag);
                for slot in st.idle.slots_in(b) {
                    st.mark_releasing(slot, &mut batch);
                }
                st.start_release(&mut batch);
            }
            self.release_batch(batch)?;
        }
        let pieces: Vec<Piece2> = {
            let st = lock(&self.state);
            let mut v: Vec<Piece2> = st
                .live
                .values()
                .map(|&slot| (slot, st.mref(slot)))
                .filter(|(_, m)| {
                    m.tag == tag
                        && m.piece == Piece::Whole
                        && m.state == MappingState::Live
                        && !m.asleep
                })
                .map(|(slot, m)| Piece2 {
                    slot,
                    ptr: m.ptr(),
                    handle: m.handle,
                    requested: m.requested,
                    handle_live: true,
                })
                .collect();
            v.sort_by_key(|p| p.ptr);
            v
        };
        // Offload: one pinned buffer, each allocation's requested bytes at its offset.
        let mut host = None;
        let mut offsets = vec![u64::MAX; pieces.len()];
        if mode == SleepMode::Offload {
            let total: u64 = pieces.iter().map(|p| p.requested).sum();
            if total > 0 {
                let buf = d.host_alloc(total).map_err(|source| Error::Driver {
                    source,
                    bytes: total,
                })?;
                let mut at = 0;
                for (i, p) in pieces.iter().enumerate() {
                    if let Err(source) = d.copy_to_host(buf, at, p.ptr, p.requested) {
                        let _ = d.host_free(buf);
                        return Err(Error::Driver {
                            source,
                            bytes: p.requested,
                        });
                    }
                    offsets[i] = at;
                    at += p.requested;
                }
                host = Some(buf);
            }
        }
        // Unmap every mapping; on a refusal, map back what was unmapped.
        for (i, p) in pieces.iter().enumerate() {
            if let Err(e) = d.unmap(p.ptr, p.handle.size) {
                let mut st_fail = vec![e.call];
                let mut kept = Vec::new();
                for q in &pieces[..i] {
                    if !self.map_back(q.ptr, q.handle, &mut st_fail) {
                        kept.push(*q);
                    }
                }
                let mut st = lock(&self.state);
                for call in st_fail {
                    st.counters.count_failure(call);
                }
                if kept.is_empty() {
                    drop(st);
                    if let Some(buf) = host {
                        let _ = d.host_free(buf);
                    }
                } else {
                    // Undoing failed: the tag sleeps with these handles kept.
                    let entries = kept
                        .iter()
                        .map(|q| {
                            let j = pieces.iter().position(|p| p.slot == q.slot);
                            (*q, j.map_or(u64::MAX, |j| offsets[j]))
                        })
                        .collect::<Vec<_>>();
                    self.book_asleep(&mut st, tag, mode, host, &entries);
                }
                return Err(Error::Driver {
                    source: e,
                    bytes: p.handle.size,
                });
            }
        }
        // Release every handle; a refused release keeps the handle (mapped again at
        // wake).
        let mut entries = Vec::with_capacity(pieces.len());
        let mut failed = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            let mut q = *p;
            if let Err(e) = d.release(p.handle) {
                failed.push(e.call);
                q.handle_live = true;
            } else {
                q.handle_live = false;
            }
            entries.push((q, offsets[i]));
        }
        let mut st = lock(&self.state);
        for call in failed {
            st.counters.count_failure(call);
        }
        self.book_asleep(&mut st, tag, mode, host, &entries);
        Ok(())
    }

    /// Maps `handle` at `ptr` again with the pool's access (undoing an unmap);
    /// refused calls go to `failed`. Returns whether it is mapped (false: unmapped,
    /// its handle still held). A refused set-access is undone by an unmap; when that
    /// is refused too, the set-access is tried twice more (the mapping stays either
    /// way, and is booked awake).
    fn map_back(
        &self,
        ptr: DevicePtr,
        handle: PhysicalHandle,
        failed: &mut Vec<crate::driver::DriverCall>,
    ) -> bool {
        let d = &*self.driver;
        if let Err(e) = d.map(ptr, handle) {
            failed.push(e.call);
            return false;
        }
        match d.set_access(ptr, handle.size, &self.access_devices) {
            Ok(()) => true,
            Err(e) => {
                failed.push(e.call);
                match d.unmap(ptr, handle.size) {
                    Ok(()) => false,
                    Err(u) => {
                        failed.push(u.call);
                        self.grant_again(ptr, handle.size, None, failed);
                        true
                    }
                }
            }
        }
    }

    /// A mapping that must stay (its undo was refused): grants access again (and
    /// copies its bytes back, with `copy`), twice at most; refusals go to `failed`.
    fn grant_again(
        &self,
        ptr: DevicePtr,
        size: u64,
        copy: Option<(HostBuffer, u64, u64)>,
        failed: &mut Vec<crate::driver::DriverCall>,
    ) {
        let d = &*self.driver;
        for _ in 0..2 {
            let r = d
                .set_access(ptr, size, &self.access_devices)
                .and_then(|()| match copy {
                    Some((buf, off, n)) => d.copy_to_device(ptr, buf, off, n),
                    None => Ok(()),
                });
            match r {
                Ok(()) => return,
                Err(e) => failed.push(e.call),
            }
        }
    }

    /// Books `entries` (unmapped; each with its handle kept or not, and its offset
    /// in `host`) asleep, and the tag sleeping.
    fn book_asleep(
        &self,
        st: &mut State,
        tag: u32,
        mode: SleepMode,
        host: Option<HostBuffer>,
        entries: &[(Piece2, u64)],
    ) {
        let mut list = Vec::with_capacity(entries.len());
        for (q, off) in entries {
            let size = q.handle.size;
            {
                let m = st.mapping_mut(q.slot);
                m.asleep = true;
                m.mapped = false;
                m.handle_live = q.handle_live;
            }
            let c = &mut st.counters;
            c.live_mapped_bytes -= size;
            c.sleeping_count += 1;
            if q.handle_live {
                c.sleeping_held_count += 1;
                c.sleeping_held_bytes += size;
            } else {
                c.sleeping_bytes += size;
                c.physical_bytes -= size;
            }
            if !q.handle_live {
                if let Some(t) = st.tags.get_mut(&tag) {
                    t.live_physical = t.live_physical.saturating_sub(size);
                }
            }
            list.push((q.slot, *off));
        }
        st.counters.tags_sleeping += 1;
        if let Some(h) = host {
            st.counters.offloaded_bytes += h.size;
        }
        let t = st.tags.entry(tag).or_default();
        t.sleeping = Some(mode);
        t.host = host;
        t.asleep = list;
    }

    /// Wakes tag `tag`: for every allocation put to sleep, a new handle
    /// (`cuMemCreate`; a handle the driver kept at sleep is reused) is mapped at the
    /// same address (`cuMemMap`) with the same access (`cuMemSetAccess`, the device
    /// and every peer), and in [`SleepMode::Offload`] its bytes copied back
    /// (`cuMemcpyHtoD`); then the host buffer is freed (`cuMemFreeHost`; a refusal
    /// leaves it to the driver, the wake still succeeds). Every pointer of the tag is
    /// valid again: same bytes (offload) or unspecified contents (discard).
    ///
    /// Failures: any step refused (the device full: `cuMemCreate` out of memory)
    /// undoes what this wake mapped and created, in reverse, and returns the error;
    /// the tag stays asleep, its host copy kept, and a later wake can succeed. A
    /// mapping whose undo the driver refuses stays mapped (awake, counted), and the
    /// next wake skips it (when that mapping is the one whose copy was refused, its
    /// contents are unspecified: two refusals in a row on one mapping).
    ///
    /// Errors: [`Error::TagState`] when the tag does not sleep;
    /// [`Error::OutOfMemory`] when the device is full (nothing released to make
    /// room: free memory or trim, then wake again); [`Error::Driver`] for another
    /// refused call.
    pub fn wake(&self, tag: u32) -> Result<()> {
        let (mode, host, pieces) = {
            let mut st = lock(&self.state);
            let t = st.tags.entry(tag).or_default();
            if t.busy || t.sleeping.is_none() {
                return Err(Error::TagState {
                    tag,
                    reason: "the tag does not sleep (or a sleep or wake of it runs)",
                });
            }
            t.busy = true;
            let (mode, host, list) = (t.sleeping, t.host, t.asleep.clone());
            let st = &*st;
            let pieces: Vec<(Piece2, u64)> = list
                .iter()
                .filter_map(|&(slot, off)| {
                    let m = st.mref(slot);
                    m.asleep.then_some((
                        Piece2 {
                            slot,
                            ptr: m.ptr(),
                            handle: m.handle,
                            requested: m.requested,
                            handle_live: m.handle_live,
                        },
                        off,
                    ))
                })
                .collect();
            (mode, host, pieces)
        };
        let result = self.wake_steps(tag, mode, host, &pieces);
        let mut st = lock(&self.state);
        let t = st.tags.entry(tag).or_default();
        t.busy = false;
        if t.sleeping.is_none() {
            self.tags_blocked.fetch_sub(1, Ordering::Relaxed);
        }
        result
    }

    fn wake_steps(
        &self,
        tag: u32,
        mode: Option<SleepMode>,
        host: Option<HostBuffer>,
        pieces: &[(Piece2, u64)],
    ) -> Result<()> {
        let d = &*self.driver;
        // (piece, new handle, created now)
        let mut done: Vec<(Piece2, PhysicalHandle, bool)> = Vec::with_capacity(pieces.len());
        let mut failure: Option<(DriverError, u64)> = None;
        let mut calls = Vec::new();
        for &(p, off) in pieces {
            let size = p.handle.size;
            let (handle, created) = if p.handle_live {
                (p.handle, false)
            } else {
                match d.create(size) {
                    Ok(h) => (h, true),
                    Err(e) => {
                        failure = Some((e, size));
                        break;
                    }
                }
            };
            let step = (|| {
                d.map(p.ptr, handle).map_err(|e| (e, false))?;
                if let Err(e) = d.set_access(p.ptr, size, &self.access_devices) {
                    return Err((e, true));
                }
                if mode == Some(SleepMode::Offload) && off != u64::MAX && p.requested > 0 {
                    if let Some(buf) = host {
                        if let Err(e) = d.copy_to_device(p.ptr, buf, off, p.requested) {
                            return Err((e, true));
                        }
                    }
                }
                Ok(())
            })();
            match step {
                Ok(()) => done.push((p, handle, created)),
                Err((e, mapped)) => {
                    // Undo this piece.
                    let mut still_mapped = false;
                    if mapped {
                        if let Err(u) = d.unmap(p.ptr, size) {
                            calls.push(u.call);
                            still_mapped = true;
                        }
                    }
                    if still_mapped {
                        let copy = match (mode, host) {
                            (Some(SleepMode::Offload), Some(buf))
                                if off != u64::MAX && p.requested > 0 =>
                            {
                                Some((buf, off, p.requested))
                            }
                            _ => None,
                        };
                        self.grant_again(p.ptr, size, copy, &mut calls);
                        done.push((p, handle, created));
                        failure = Some((e, size));
                        // Keep it awake; undo the others below.
                        let keep = done.pop();
                        self.undo_wake(&mut done, &mut calls);
                        if let Some(k) = keep {
                            done.push(k);
                        }
                        return self.finish_wake(tag, host, &done, &calls, failure, false);
                    }
                    if created {
                        if let Err(r) = d.release(handle) {
                            // The driver keeps it: book it as the sleeping
                            // allocation's kept handle.
                            calls.push(r.call);
                            let mut q = p;
                            q.handle = handle;
                            let mut st = lock(&self.state);
                            let m = st.mapping_mut(q.slot);
                            m.handle = handle;
                            m.handle_live = true;
                            let c = &mut st.counters;
                            c.sleeping_held_count += 1;
                            c.sleeping_bytes -= size;
                            c.sleeping_held_bytes += size;
                            c.physical_bytes += size;
                            c.peak_physical_bytes = c.peak_physical_bytes.max(c.physical_bytes);
                            if let Some(t) = st.tags.get_mut(&tag) {
                                t.live_physical += size;
                            }
                        }
                    }
                    failure = Some((e, size));
                    break;
                }
            }
        }
        if failure.is_some() {
            self.undo_wake(&mut done, &mut calls);
            return self.finish_wake(tag, host, &done, &calls, failure, false);
        }
        self.finish_wake(tag, host, &done, &calls, None, true)
    }

    /// Undoes the pieces of `done` (mapped this wake): unmap, release what was
    /// created. What the driver refuses to unmap stays in `done` (awake).
    fn undo_wake(
        &self,
        done: &mut Vec<(Piece2, PhysicalHandle, bool)>,
        calls: &mut Vec<crate::driver::DriverCall>,
    ) {
        let d = &*self.driver;
        let mut kept = Vec::new();
        let mut held = Vec::new();
        while let Some((p, handle, created)) = done.pop() {
            if let Err(e) = d.unmap(p.ptr, handle.size) {
                calls.push(e.call);
                kept.push((p, handle, created));
                continue;
            }
            if created {
                if let Err(e) = d.release(handle) {
                    calls.push(e.call);
                    held.push((p, handle));
                }
            }
        }
        // Handles created now and kept by the driver: the sleeping allocation's.
        if !held.is_empty() {
            let mut st = lock(&self.state);
            for (p, handle) in held {
                let size = handle.size;
                let tag = {
                    let m = st.mapping_mut(p.slot);
                    m.handle = handle;
                    m.handle_live = true;
                    m.tag
                };
                let c = &mut st.counters;
                c.sleeping_held_count += 1;
                c.sleeping_bytes -= size;
                c.sleeping_held_bytes += size;
                c.physical_bytes += size;
                c.peak_physical_bytes = c.peak_physical_bytes.max(c.physical_bytes);
                if let Some(t) = st.tags.get_mut(&tag) {
                    t.live_physical += size;
                }
            }
        }
        *done = kept;
    }

    /// Books the pieces of `done` awake; with `all`, the tag awake (its host buffer
    /// freed); else returns `failure`'s error, the tag asleep.
    fn finish_wake(
        &self,
        tag: u32,
        host: Option<HostBuffer>,
        done: &[(Piece2, PhysicalHandle, bool)],
        calls: &[crate::driver::DriverCall],
        failure: Option<(DriverError, u64)>,
        all: bool,
    ) -> Result<()> {
        let mut st = lock(&self.state);
        if let Some((e, _)) = failure {
            st.counters.count_failure(e.call);
        }
        for &call in calls {
            st.counters.count_failure(call);
        }
        for (p, handle, created) in done {
            let size = handle.size;
            let was_held = {
                let m = st.mapping_mut(p.slot);
                let was_held = m.handle_live;
                m.asleep = false;
                m.mapped = true;
                m.handle_live = true;
                m.handle = *handle;
                was_held && !created
            };
            let c = &mut st.counters;
            c.live_mapped_bytes += size;
            c.peak_live_mapped_bytes = c.peak_live_mapped_bytes.max(c.live_mapped_bytes);
            c.sleeping_count -= 1;
            if was_held {
                c.sleeping_held_count -= 1;
                c.sleeping_held_bytes -= size;
            } else {
                c.sleeping_bytes -= size;
                c.physical_bytes += size;
                c.peak_physical_bytes = c.peak_physical_bytes.max(c.physical_bytes);
                if let Some(t) = st.tags.get_mut(&tag) {
                    t.live_physical += size;
                }
            }
        }
        if !all {
            drop(st);
            return Err(match failure {
                Some((e, size)) if e.is_out_of_memory() => {
                    let st = lock(&self.state);
                    self.oom_error(&st, size, Some(e))
                }
                Some((source, bytes)) => Error::Driver { source, bytes },
                None => Error::TagState {
                    tag,
                    reason: "wake undone",
                },
            });
        }
        st.counters.tags_sleeping -= 1;
        if let Some(h) = host {
            st.counters.offloaded_bytes -= h.size;
        }
        let t = st.tags.entry(tag).or_default();
        t.sleeping = None;
        t.host = None;
        t.asleep.clear();
        drop(st);
        if let Some(h) = host {
            // A refusal leaves the buffer to the driver; the tag is awake either way.
            let _ = self.driver.host_free(h);
        }
        Ok(())
    }

    /// Destroy: every sleeping allocation becomes a pending release of what is left
    /// (its reservation, and a handle the driver kept); host buffers are freed.
    pub(super) fn drop_sleeping(&self) {
        let hosts: Vec<HostBuffer> = {
            let mut st = lock(&self.state);
            let asleep: Vec<u32> = st
                .live
                .values()
                .copied()
                .filter(|&s| st.mref(s).asleep)
                .collect();
            for slot in asleep {
                let m = st.mapping(slot);
                st.live.remove(&m.ptr());
                let size = m.size();
                let c = &mut st.counters;
                c.live_count -= 1;
                c.live_requested_bytes -= m.requested;
                c.frees += 1;
                c.sleeping_count -= 1;
                if m.handle_live {
                    c.sleeping_held_count -= 1;
                    c.sleeping_held_bytes -= size;
                    c.pending_bytes += size;
                } else {
                    c.sleeping_bytes -= size;
                }
                c.pending_count += 1;
                let mm = st.mapping_mut(slot);
                mm.asleep = false;
                mm.state = MappingState::Pending;
                mm.mapped = false;
                mm.requested = 0;
                st.pending.push(slot);
            }
            let mut hosts = Vec::new();
            for t in st.tags.values_mut() {
                t.sleeping = None;
                if let Some(h) = t.host.take() {
                    hosts.push(h);
                }
                t.asleep.clear();
            }
            st.counters.tags_sleeping = 0;
            st.counters.offloaded_bytes = 0;
            self.tags_blocked.store(0, Ordering::Relaxed);
            hosts
        };
        for h in hosts {
            let _ = self.driver.host_free(h);
        }
    }
}
