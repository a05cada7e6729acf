//! Tags (issue 15): allocations labelled with a `u32` tag, a census of what each tag
//! holds, and sleep / wake: a tag's physical memory given back to the device while
//! every reservation (every pointer) stays, then mapped again at the same addresses.
//!
//! - Tag 0 is what the untagged functions use. A tag other than 0 never goes through
//!   the thread caches. Outside segment mode it takes **whole mappings**; its
//!   synchronous frees idle in the tag's own bucket ([`BucketKind::Tag`]), which only
//!   that tag's allocations take (and release points release, after a device
//!   synchronize). Memory a tag frees on a stream joins the stream-order buckets,
//!   which belong to tag 0 (the pool's shared idle memory): from then on it is tag
//!   0's.
//! - Segment mode: **segments are per tag**. An allocation of a tag other than 0
//!   (synchronous or stream-ordered) up to the whole-mapping threshold is a block of
//!   the tag's own heaps (home: the tag's bucket, heap key `heap_key(tag bucket,
//!   size)`), so a tag's handles hold no other tag's blocks; every other heap (the
//!   synchronous API's, the streams') is tag 0's. The heap's free space holds only
//!   memory any stream may use at once. A block of it freed with the synchronous
//!   `free` waits whole in the tag's [`BucketKind::TagBlocks`] bucket (taken by the
//!   tag's synchronous allocations; back in the heap after a release point's device
//!   synchronize); one freed on a stream waits, out of every bucket, for that
//!   stream's fence (then [`ANY`]: back in the heap); one freed during a capture
//!   waits in a capture bucket of its own that nobody takes from
//!   ([`State::tag_capture_bucket`]). No other tag's allocation ever takes it. A
//!   request above the whole-mapping threshold takes a whole mapping as outside
//!   segment mode.
//! - The census of a tag other than 0 is kept in [`TagBooks`], updated where the
//!   books move bytes (hand-out, free, index insert and removal, a heap's handle
//!   booked or released, sleep, wake): O(1), no walk. Tag 0's is the snapshot less
//!   every other tag's.
//! - Sleep and wake walk the tag's live mappings (the pointer map) once each; in
//!   segment mode, sleep walks the slot table once for the blocks of the tag's
//!   segments.

use super::books::{BucketKind, MappingState, Piece, State, ANY, SYNC_FREED};
use super::release::Batch;
use super::segments::{heap_key, home_of, round_up, SegHandle};
use super::wake_zero::Zeroed;
use super::{OnOom, Pool, ReusePolicy};
use crate::driver::{CuResult, DevicePtr, DriverError, HostBuffer, PhysicalHandle, Stream};
use crate::error::{Error, Result};
use crate::sync::lock;

/// What [`Pool::sleep`] does with the contents of a tag's live allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SleepMode {
    /// Contents are lost: after [`Pool::wake`] every pointer is valid again with
    /// unspecified contents, zeros after [`Pool::wake_zeroed`] (`FLARE_SLEEP_DISCARD`,
    /// 0).
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
    /// Bytes the tag's zeroing wakes ([`Pool::wake_zeroed`]) set to zero, cumulative:
    /// the requested bytes of each live allocation a discard sleep dropped, per wake.
    pub zeroed_bytes: u64,
    /// Memsets (`cuMemsetD8Async`) those wakes queued, cumulative: one per live
    /// allocation with requested bytes.
    pub zero_memsets: u64,
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
    /// Calls on the tag's memory in flight (tags other than 0; tag 0's are counted
    /// in the gate): a sleep or wake waits for none (`tag_gate.rs`).
    pub(super) users: u32,
    /// Its offloaded contents, while asleep in offload mode.
    pub(super) host: Option<HostBuffer>,
    /// While asleep: each live slot put to sleep and, offloaded, its bytes' offset in
    /// `host` (`u64::MAX`: not copied).
    pub(super) asleep: Vec<(u32, u64)>,
    /// Segment mode, tags other than 0: bytes of the handles of the tag's heaps
    /// (mapped in a segment, or taken out of it for a release still running).
    pub(super) seg_physical: u64,
    /// Segment mode, tags other than 0: bytes of the tag's live blocks, awake.
    pub(super) seg_live: u64,
    /// While asleep in segment mode: the tag's segments put to sleep.
    pub(super) seg_sleep: SegSleep,
    /// Its heap blocks freed with the synchronous `free` ([`BucketKind::TagBlocks`]),
    /// made on first use.
    pub(super) blocks_bucket: Option<u32>,
    /// Capture buckets of its heap blocks freed during a capture, by the capture's
    /// own bucket ([`State::tag_capture_bucket`]).
    pub(super) capture_buckets: std::collections::HashMap<u32, u32>,
    /// What its zeroing wakes zeroed (`wake_zero.rs`).
    pub(super) zeroed: Zeroed,
}

/// A handle of a segment put to sleep: released at sleep (or left pending), mapped
/// again at `ptr` (a new handle of `size` bytes) at wake.
#[derive(Clone, Copy, Debug)]
pub(super) struct SleepingHandle {
    seg: u32,
    /// The handle's slot (piece `Handle`), kept while asleep.
    slot: u32,
    ptr: DevicePtr,
    size: u64,
}

/// What a tag's sleeping segments hold (segment mode): every handle of its heaps,
/// its live blocks (slot, offset of their bytes in the host buffer, `u64::MAX`: not
/// copied) and its free blocks (out of the free index while asleep).
#[derive(Clone, Debug, Default)]
pub(super) struct SegSleep {
    segs: Vec<u32>,
    handles: Vec<SleepingHandle>,
    live: Vec<(u32, u64)>,
    free: Vec<u32>,
}

/// A sleep's plan for the tag's segments: each handle with its driver handle and
/// retired mapping (`alias`, 0: none), each live block (slot, address, requested
/// bytes, size) and free block.
#[derive(Debug, Default)]
struct SegPlan {
    segs: Vec<u32>,
    handles: Vec<(SleepingHandle, PhysicalHandle, DevicePtr)>,
    live: Vec<(u32, DevicePtr, u64)>,
    free: Vec<u32>,
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
        let (tag, block, seg) = {
            let m = self.mref(slot);
            (m.tag, m.is_block(), m.seg)
        };
        if block {
            // A block of a tag's own heap freed with the synchronous `free` waits
            // whole for the tag's synchronous allocations or a release point's
            // synchronize (`BucketKind::TagBlocks`), never in `SYNC_FREED`, which
            // tag 0's allocations take from.
            let seg_tag = self.segs.segs[seg as usize].tag;
            if seg_tag != 0 && bucket == SYNC_FREED {
                return self.tag_blocks_bucket(seg_tag);
            }
            return bucket;
        }
        if tag == 0 {
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
        let (tag, size, block) = {
            let m = self.mref(slot);
            (m.tag, m.size(), m.is_block())
        };
        if tag == 0 {
            return;
        }
        if let Some(t) = self.tags.get_mut(&tag) {
            t.live_count = t.live_count.saturating_sub(1);
            t.live_bytes = t.live_bytes.saturating_sub(size);
            if block {
                t.seg_live = t.seg_live.saturating_sub(size);
            } else {
                t.live_physical = t.live_physical.saturating_sub(size);
            }
        }
    }

    /// Live `ptr` (a whole mapping, or a block of the tag's heap), just handed out,
    /// becomes tag `tag`'s.
    fn tag_live(&mut self, ptr: DevicePtr, tag: u32) {
        let Some(&slot) = self.live.get(&ptr) else {
            return;
        };
        let (size, block) = {
            let m = self.mapping_mut(slot);
            m.tag = tag;
            (m.size(), m.is_block())
        };
        let t = self.tags.entry(tag).or_default();
        t.live_count += 1;
        t.live_bytes += size;
        if block {
            t.seg_live += size;
        } else {
            t.live_physical += size;
        }
        t.peak_live_bytes = t.peak_live_bytes.max(t.live_bytes);
    }

    /// The tag whose heap `key` is: the tag of its home bucket when that is a tag's
    /// bucket, else 0.
    pub(super) fn heap_tag(&self, key: u32) -> u32 {
        match self.buckets.get(home_of(key) as usize).map(|b| b.kind) {
            Some(BucketKind::Tag(t)) => t,
            _ => 0,
        }
    }

    /// `size` bytes of handles join (`add`) or leave segment `seg`'s heap: counted
    /// in its tag's books (tags other than 0; tag 0's census is the rest).
    pub(super) fn tag_handle_bytes(&mut self, seg: u32, size: u64, add: bool) {
        let tag = self.segs.segs[seg as usize].tag;
        if tag == 0 {
            return;
        }
        let t = self.tags.entry(tag).or_default();
        if add {
            t.seg_physical += size;
        } else {
            t.seg_physical = t.seg_physical.saturating_sub(size);
        }
    }

    /// Whether `slot` is a block of a tag's own heap (tags other than 0).
    pub(super) fn is_tag_block(&self, slot: u32) -> bool {
        let m = self.mref(slot);
        m.is_block() && self.segs.segs[m.seg as usize].tag != 0
    }

    /// The bucket of tag `tag`'s heap blocks freed with the synchronous `free`
    /// ([`BucketKind::TagBlocks`]), made on first use.
    pub(super) fn tag_blocks_bucket(&mut self, tag: u32) -> u32 {
        if let Some(b) = self.tags.get(&tag).and_then(|t| t.blocks_bucket) {
            return b;
        }
        let b = self.buckets.len() as u32;
        self.buckets
            .push(super::books::Bucket::new(BucketKind::TagBlocks(tag)));
        self.tags.entry(tag).or_default().blocks_bucket = Some(b);
        b
    }

    /// The bucket where `slot`, freed during a capture, waits for the capture's
    /// release (`b`: the capture's bucket): `b` itself, or for a block of a tag's
    /// heap a bucket of the same kind that no allocation takes from (not registered
    /// for the capture's id): the capture's graph may replay into it, and no other
    /// tag's allocation may take a block of the tag's handles. Released with the
    /// capture's memory.
    pub(super) fn tag_capture_bucket(&mut self, slot: u32, b: u32) -> u32 {
        if !self.is_tag_block(slot) {
            return b;
        }
        let tag = self.segs.segs[self.mref(slot).seg as usize].tag;
        if let Some(&own) = self.tags.get(&tag).and_then(|t| t.capture_buckets.get(&b)) {
            return own;
        }
        let kind = self.buckets[b as usize].kind;
        let own = self.buckets.len() as u32;
        self.buckets.push(super::books::Bucket::new(kind));
        self.tags
            .entry(tag)
            .or_default()
            .capture_buckets
            .insert(b, own);
        own
    }

    /// After a sleep's device synchronize (every queued work complete): every idle
    /// block of tag `tag`'s segments still waiting in a bucket (a fence that could
    /// not be recorded or waited on, a capture's memory) or for fences (deferred)
    /// goes back to its heap. Walks the slot table (sleep only).
    fn merge_idle_blocks(&mut self, tag: u32) {
        let idle: Vec<u32> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let m = s.as_ref()?;
                let seg = self.segs.segs.get(m.seg as usize)?;
                (m.piece == Piece::Block
                    && m.state == MappingState::Idle
                    && seg.tag == tag
                    && !seg.asleep)
                    .then_some(i as u32)
            })
            .collect();
        for slot in idle {
            if !self.index_remove(slot) {
                if let Some(k) = self.deferred.iter().position(|d| d.slot == slot) {
                    self.deferred.swap_remove(k);
                    let size = self.mref(slot).size();
                    self.counters.event_wait_bytes -= size;
                }
            }
            self.merge_free(slot);
        }
    }

    /// The plan of a sleep of tag `tag`'s segments (segment mode): every segment of
    /// its heaps that holds a handle, each handle, each live and free block (a walk
    /// of the slot table). Error (a reason) when one of them is in flight: a growth
    /// or release running, or a block idle in a stream-order bucket (memory a release
    /// point could not release).
    fn seg_sleep_plan(&self, tag: u32) -> std::result::Result<SegPlan, &'static str> {
        let mut plan = SegPlan::default();
        let mut mine = vec![false; self.segs.segs.len()];
        for (sid, seg) in self.segs.segs.iter().enumerate() {
            if seg.tag != tag || seg.asleep || (seg.handles.is_empty() && seg.busy == 0) {
                continue;
            }
            if seg.busy != 0 {
                return Err("a growth or release of the tag's segments is running: retry");
            }
            mine[sid] = true;
            plan.segs.push(sid as u32);
            for h in &seg.handles {
                let m = self.mref(h.slot);
                plan.handles.push((
                    SleepingHandle {
                        seg: sid as u32,
                        slot: h.slot,
                        ptr: h.ptr,
                        size: h.size,
                    },
                    m.handle,
                    m.alias,
                ));
            }
        }
        if plan.segs.is_empty() {
            return Ok(plan);
        }
        for (i, s) in self.slots.iter().enumerate() {
            let Some(m) = s else { continue };
            if m.piece != Piece::Block || !mine.get(m.seg as usize).copied().unwrap_or(false) {
                continue;
            }
            match m.state {
                MappingState::Live => plan.live.push((i as u32, m.ptr(), m.requested)),
                MappingState::HeapFree => plan.free.push(i as u32),
                _ => {
                    return Err("memory of the tag's segments waits on stream work or a \
                                release: trim, then sleep again")
                }
            }
        }
        Ok(plan)
    }

    /// A sleep of the segments of `plan` did not happen (the tag stays awake): their
    /// free blocks, taken out of the free index for the sleep, go back into it.
    fn seg_restore_free(&mut self, plan: &SegPlan) {
        for &slot in &plan.free {
            let (seg, size) = {
                let m = self.mref(slot);
                (m.seg, m.size())
            };
            let key = self.segs.segs[seg as usize].key;
            self.segs.free.insert(slot, key, size);
        }
    }

    /// Books the segments of `plan` asleep for tag `tag`: their handles out of the
    /// segments (released, or pending when in `pending`), their live blocks asleep
    /// (`offsets`: each one's offset in the host buffer), their free blocks out of
    /// the index.
    fn book_seg_asleep(
        &mut self,
        tag: u32,
        plan: &SegPlan,
        offsets: &[u64],
        pending: &[(DevicePtr, PhysicalHandle, bool, DevicePtr)],
    ) {
        if plan.segs.is_empty() {
            return;
        }
        let mut handle_bytes = 0;
        for &(h, _, alias) in &plan.handles {
            let c = &mut self.counters;
            c.segment_handles -= 1;
            c.segment_mapped_bytes -= h.size;
            c.physical_bytes -= h.size;
            if alias != 0 {
                c.segment_handles_lent -= 1;
                c.segment_lent_bytes -= h.size;
            }
            handle_bytes += h.size;
            let m = self.mapping_mut(h.slot);
            m.alias = 0;
            m.asleep = true;
            m.mapped = false;
            m.handle_live = false;
        }
        for &(ptr, handle, mapped, alias) in pending {
            self.keep_pending_handle(ptr, handle, mapped);
            if alias != 0 {
                if let Some(&slot) = self.pending.last() {
                    self.mapping_mut(slot).alias = alias;
                }
            }
        }
        let mut live_bytes = 0;
        let mut live = Vec::with_capacity(plan.live.len());
        for (i, &(slot, _, _)) in plan.live.iter().enumerate() {
            let size = {
                let m = self.mapping_mut(slot);
                m.asleep = true;
                m.size()
            };
            let c = &mut self.counters;
            c.block_live_count -= 1;
            c.block_live_bytes -= size;
            c.sleeping_count += 1;
            c.sleeping_bytes += size;
            c.sleeping_block_count += 1;
            c.sleeping_block_bytes += size;
            live_bytes += size;
            live.push((slot, offsets.get(i).copied().unwrap_or(u64::MAX)));
        }
        for &slot in &plan.free {
            self.segs.free.remove(slot);
            let size = self.mref(slot).size();
            self.counters.block_free_bytes -= size;
        }
        for &sid in &plan.segs {
            let seg = &mut self.segs.segs[sid as usize];
            seg.handles.clear();
            seg.asleep = true;
            seg.busy += 1;
        }
        let t = self.tags.entry(tag).or_default();
        if tag != 0 {
            t.seg_physical = t.seg_physical.saturating_sub(handle_bytes);
            t.seg_live = t.seg_live.saturating_sub(live_bytes);
        }
        t.seg_sleep = SegSleep {
            segs: plan.segs.clone(),
            handles: plan.handles.iter().map(|&(h, _, _)| h).collect(),
            live,
            free: plan.free.clone(),
        };
    }

    /// Books tag `tag`'s sleeping segments awake: each handle of `woken` (in the
    /// order of the sleep's handles) mapped again in its segment, the live blocks
    /// live, the free blocks back in the index.
    fn book_seg_awake(&mut self, tag: u32, woken: &[(SleepingHandle, PhysicalHandle)]) {
        let ss = match self.tags.get_mut(&tag) {
            Some(t) if !t.seg_sleep.segs.is_empty() => std::mem::take(&mut t.seg_sleep),
            _ => return,
        };
        let mut handle_bytes = 0;
        for &(h, handle) in woken {
            {
                let m = self.mapping_mut(h.slot);
                m.handle = handle;
                m.handle_live = true;
                m.mapped = true;
                m.asleep = false;
            }
            let seg = &mut self.segs.segs[h.seg as usize];
            let at = seg.handles.partition_point(|x| x.ptr < h.ptr);
            seg.handles.insert(
                at,
                SegHandle {
                    ptr: h.ptr,
                    size: h.size,
                    slot: h.slot,
                },
            );
            let c = &mut self.counters;
            c.segment_handles += 1;
            c.segment_mapped_bytes += h.size;
            self.add_physical(h.size, 0);
            handle_bytes += h.size;
        }
        let mut live_bytes = 0;
        for &(slot, _) in &ss.live {
            let size = {
                let m = self.mapping_mut(slot);
                m.asleep = false;
                m.size()
            };
            let c = &mut self.counters;
            c.block_live_count += 1;
            c.block_live_bytes += size;
            c.sleeping_count -= 1;
            c.sleeping_bytes -= size;
            c.sleeping_block_count -= 1;
            c.sleeping_block_bytes -= size;
            live_bytes += size;
        }
        for &slot in &ss.free {
            let (seg, size) = {
                let m = self.mref(slot);
                (m.seg, m.size())
            };
            let key = self.segs.segs[seg as usize].key;
            self.segs.free.insert(slot, key, size);
            self.counters.block_free_bytes += size;
        }
        for &sid in &ss.segs {
            let seg = &mut self.segs.segs[sid as usize];
            seg.asleep = false;
            seg.busy -= 1;
            // Released handles: their memory needs no wait, but the segment's next
            // release synchronizes as after the synchronous `free`.
            seg.dirty_at = Some(self.sync_ticket);
        }
        if tag != 0 {
            let t = self.tags.entry(tag).or_default();
            t.seg_physical += handle_bytes;
            t.seg_live += live_bytes;
        }
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

    /// The census of tag `tag`: exact (under the lock, with every thread cache's
    /// deltas for tag 0), O(number of tags), no walk over allocations. A tag never
    /// used reads all zeros.
    pub fn tag_census(&self, tag: u32) -> TagCensus {
        let snap = self.snapshot();
        let mut st = lock(&self.state);
        // Segment mode: the tag's heaps' handles hold its live blocks; the rest of
        // them (free blocks, a handle being released) is idle.
        let own = |t: &TagBooks| TagCensus {
            sleeping: t.sleeping.is_some(),
            live_count: t.live_count,
            live_bytes: t.live_bytes,
            peak_live_bytes: t.peak_live_bytes,
            idle_bytes: t.idle_bytes + t.seg_physical.saturating_sub(t.seg_live),
            physical_bytes: t.live_physical + t.idle_bytes + t.seg_physical,
            offloaded_bytes: t.host.map_or(0, |h| h.size),
            zeroed_bytes: t.zeroed.bytes,
            zero_memsets: t.zeroed.memsets,
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
        c.zeroed_bytes = zero.zeroed.bytes;
        c.zero_memsets = zero.zeroed.memsets;
        c
    }

    /// Puts tag `tag` to sleep: its physical memory goes back to the device, every
    /// reservation (every pointer) stays.
    ///
    /// Steps: every device with access is synchronized (`cuCtxSynchronize`: the work
    /// that may touch the tag's memory, on any stream, completes); the tag's idle
    /// memory is released (tag 0: the thread caches are settled and everything idle
    /// released, as [`Pool::trim`]; another tag: its bucket and, in segment mode, the
    /// handles of its heaps left wholly free); in [`SleepMode::Offload`] one pinned
    /// host buffer (`cuMemHostAlloc`, or the one an earlier wake kept when it is of
    /// the same size: no pinning) receives every live allocation's requested bytes
    /// (`cuMemcpyDtoH`; in segment mode each live block's, not the free space); then
    /// every live whole mapping of the tag is unmapped (`cuMemUnmap`), then every
    /// handle of its segments (segment mode: the tag's own heaps; for tag 0 the
    /// synchronous API's and the streams' heaps), and every handle released
    /// (`cuMemRelease`). The segments' reservations stay, so [`Pool::wake`] maps new
    /// handles at the same addresses. Allocating or freeing with the tag is refused
    /// until [`Pool::wake`]; other tags are untouched.
    ///
    /// Concurrency (`docs/ARCHITECTURE.md`, "Tags: sleep and wake"): every call on
    /// the tag's memory from another thread runs wholly before or wholly after the
    /// sleep. The sleep first marks the tag busy (calls of it are refused with
    /// [`Error::TagState`] from then on) and waits until the calls of the tag in
    /// flight have returned; so a free of the tag's allocation racing the sleep either
    /// ran first or is refused (the allocation sleeps), and an allocation either ran
    /// first (it sleeps with the tag) or is refused. Another sleep or wake of the tag
    /// meanwhile is refused.
    ///
    /// Failures: a failed synchronize, idle release, host allocation or copy changes
    /// nothing (the host buffer is freed); a failed unmap maps what was already
    /// unmapped back (the handles are still held) and returns the error, the tag
    /// awake and usable. If a map-back is refused too: a whole mapping's handle is
    /// kept and the tag sleeps with it ([`Pool::wake`] maps it again); a segment's
    /// handle makes the sleep go on for every segment of the tag (a handle whose
    /// unmap the driver refuses is left pending, released at the next release point
    /// or wake, and a new one mapped at wake), the tag asleep, and the error
    /// returned (so does a whole mapping's refused map-back when segments were
    /// unmapped too: the segments sleep with it). A
    /// handle the driver refuses to release is kept: a whole mapping's counted in
    /// `sleeping_held_bytes` (and the census's physical bytes) and mapped again at
    /// wake; a segment's left pending (the pool's, retried at the next release
    /// point); the sleep succeeds.
    ///
    /// Errors: [`Error::ScopeState`] inside a retention scope, while one of the
    /// pool's streams is being captured, or while a blocking stream of the context
    /// is being captured (the legacy stream's `cuStreamGetCaptureInfo` answers
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`; the capture is left valid); nothing
    /// changed then. A capture of a non-blocking stream the pool has never seen
    /// cannot be detected (no driver call reports it without breaking it): sleeping
    /// during one makes the device synchronize fail (`Error::Driver`, the tag awake)
    /// and invalidates that capture, so an engine must not sleep while it captures.
    /// [`Error::TagState`] when the tag already sleeps or a sleep or wake of it runs
    /// on another thread, or (segment mode) when its segments' memory is in flight
    /// without a call of the tag (a release point on another thread, a trim or an
    /// out-of-memory retry, releasing a handle of its heaps; or blocks waiting on
    /// stream work that the release could not release: trim, then sleep again);
    /// nothing changed then. [`Error::Driver`] as above.
    pub fn sleep(&self, tag: u32, mode: SleepMode) -> Result<()> {
        let _order = self.record_order();
        // Before anything: a device synchronize during a capture would break it.
        self.refuse_during_foreign_capture()?;
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
            self.refuse_sleep(&st)?;
            // The tag's calls in flight end first; none enters from now on.
            st = self.close_tag(st, tag);
            // A scope or a capture may have begun while this sleep waited.
            if let Err(e) = self.refuse_sleep(&st) {
                self.open_tag(&mut st, tag);
                return Err(e);
            }
        }
        let result = self.sleep_steps(tag, mode);
        if let (Some(rec), Ok(())) = (&self.rec, &result) {
            let mode = match mode {
                SleepMode::Offload => "offload",
                SleepMode::Discard => "discard",
            };
            rec.line(&format!("sleep {tag} {mode}"));
        }
        self.open_tag(&mut lock(&self.state), tag);
        result
    }

    /// [`Error::ScopeState`] inside a retention scope and while one of the pool's
    /// streams is being captured (a sleep's device synchronize would break it).
    fn refuse_sleep(&self, st: &State) -> Result<()> {
        if st.counters.scope_open {
            return Err(Error::ScopeState(
                "sleep inside a retention scope: finish the scope first",
            ));
        }
        if !self.open_captures(st).is_empty() {
            return Err(Error::ScopeState(
                "sleep while one of the pool's streams is being captured",
            ));
        }
        Ok(())
    }

    /// [`Error::ScopeState`] while a blocking stream of the pool's context is being
    /// captured, whether or not the pool has seen it: the legacy stream's capture
    /// query (`cuStreamGetCaptureInfo`, legal during any capture) then answers
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (documented by NVIDIA for
    /// `cuStreamIsCapturing` / `cuStreamGetCaptureInfo` on `CU_STREAM_LEGACY`: "the
    /// blocking stream capture is not invalidated"). Any other failure of the query
    /// (a backend without streams) is no answer, and the sleep goes on.
    fn refuse_during_foreign_capture(&self) -> Result<()> {
        match self.driver.stream_capture(Stream::LEGACY) {
            Ok(Some(_)) => Err(Error::ScopeState(
                "sleep while the legacy stream is being captured",
            )),
            Err(e) if e.code == CuResult::STREAM_CAPTURE_IMPLICIT => Err(Error::ScopeState(
                "sleep while a blocking stream is being captured (the legacy stream's \
                 capture query answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT): end the \
                 capture first",
            )),
            _ => Ok(()),
        }
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
                // Blocks of its heap freed on streams: their fences completed with
                // the synchronize; back to the heap.
                if !st.deferred.is_empty() {
                    let _ = self.poll(&mut st, &[], false);
                    self.settle_deferred(&mut st);
                }
                let b = st.tag_bucket(tag);
                let blocks = st.tag_blocks_bucket(tag);
                for slot in st
                    .idle
                    .slots_in(b)
                    .into_iter()
                    .chain(st.idle.slots_in(blocks))
                {
                    st.mark_releasing(slot, &mut batch);
                }
                st.start_release(&mut batch);
            }
            self.release_batch(batch)?;
            // Then (those blocks back in their heap) the handles of its heaps left
            // wholly free.
            let mut batch = Batch::default();
            {
                let mut st = lock(&self.state);
                let b = st.tag_bucket(tag);
                for k in [b << 1, (b << 1) | 1] {
                    if let Some(&sid) = st.segs.by_key.get(&k).and_then(|v| v.first()) {
                        st.collect_heap_of(sid, &mut batch, true, None);
                    }
                }
                st.start_release(&mut batch);
            }
            self.release_batch(batch)?;
        }
        let (pieces, plan) = {
            let mut st = lock(&self.state);
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
            let plan = if self.segments {
                st.merge_idle_blocks(tag);
                let plan = st
                    .seg_sleep_plan(tag)
                    .map_err(|reason| Error::TagState { tag, reason })?;
                // Out of the free index from now on: no carve, lend or release (a
                // trim on another thread) touches the handles this sleep unmaps.
                for &slot in &plan.free {
                    st.segs.free.remove(slot);
                }
                plan
            } else {
                SegPlan::default()
            };
            (v, plan)
        };
        // Every return below that leaves the segments awake puts their free blocks
        // back first.
        let restore = |st: &mut State| st.seg_restore_free(&plan);
        // Offload: one pinned buffer, each allocation's requested bytes at its
        // offset: the whole mappings', then the live blocks'.
        let mut host = None;
        let mut offsets = vec![u64::MAX; pieces.len()];
        let mut block_offsets = vec![u64::MAX; plan.live.len()];
        if mode == SleepMode::Offload {
            let total: u64 = pieces.iter().map(|p| p.requested).sum::<u64>()
                + plan.live.iter().map(|l| l.2).sum::<u64>();
            if total > 0 {
                // The buffer an earlier wake kept, when it is of this size.
                let spare = lock(&self.state).take_spare_host(|h| h.size == total);
                let buf = match spare {
                    Some(buf) => buf,
                    None => d.host_alloc(total).map_err(|source| {
                        let mut st = lock(&self.state);
                        st.counters.count_failure(source.call);
                        restore(&mut st);
                        Error::Driver {
                            source,
                            bytes: total,
                        }
                    })?,
                };
                let mut at = 0;
                let copies = pieces
                    .iter()
                    .map(|p| (p.ptr, p.requested))
                    .chain(plan.live.iter().map(|l| (l.1, l.2)));
                for (i, (ptr, n)) in copies.enumerate() {
                    if n > 0 {
                        if let Err(source) = d.copy_to_host(buf, at, ptr, n) {
                            let _ = d.host_free(buf);
                            restore(&mut lock(&self.state));
                            return Err(Error::Driver { source, bytes: n });
                        }
                    }
                    match offsets.get_mut(i) {
                        Some(o) => *o = at,
                        None => block_offsets[i - pieces.len()] = at,
                    }
                    at += n;
                }
                host = Some(buf);
            }
        }
        // Unmap every whole mapping; on a refusal, map back what was unmapped.
        for (i, p) in pieces.iter().enumerate() {
            if let Err(e) = d.unmap(p.ptr, p.handle.size) {
                let mut failed = vec![e.call];
                let kept = self.map_back_pieces(&pieces[..i], &mut failed);
                let mut st = lock(&self.state);
                restore(&mut st);
                self.fail_awake(&mut st, tag, mode, host, &failed, &kept, &pieces, &offsets);
                return Err(Error::Driver {
                    source: e,
                    bytes: p.handle.size,
                });
            }
        }
        // Then every handle of the tag's segments (a lent one's retired mapping
        // first).
        let mut failed: Vec<crate::driver::DriverCall> = Vec::new();
        // (address, handle, still mapped, retired mapping still mapped)
        let mut pending: Vec<(DevicePtr, PhysicalHandle, bool, DevicePtr)> = Vec::new();
        let mut unmapped = vec![true; plan.handles.len()];
        let mut seg_error = None;
        // The whole mappings unmapped now (indices in `pieces`).
        let mut asleep_pieces: Vec<usize> = (0..pieces.len()).collect();
        for (i, &(h, _, alias)) in plan.handles.iter().enumerate() {
            let mut alias_gone = false;
            let r = if alias != 0 {
                d.unmap(alias, h.size)
            } else {
                Ok(())
            }
            .and_then(|()| {
                alias_gone = alias != 0;
                d.unmap(h.ptr, h.size)
            });
            let Err(e) = r else { continue };
            failed.push(e.call);
            // Undo: map back, latest first, what this loop unmapped (a lent
            // handle's retired mapping is not mapped again: it is gone).
            let mut lost = false;
            for j in (0..i).rev() {
                let (hj, handle_j, _) = plan.handles[j];
                if self.map_back(hj.ptr, handle_j, &mut failed) {
                    unmapped[j] = false;
                } else {
                    lost = true;
                    break;
                }
            }
            if !lost {
                // Undone: the whole mappings too, the tag awake.
                let kept = self.map_back_pieces(&pieces, &mut failed);
                if kept.is_empty() {
                    let mut st = lock(&self.state);
                    restore(&mut st);
                    for (j, &(hj, _, alias_j)) in plan.handles.iter().enumerate() {
                        if alias_j != 0 && (j < i || (j == i && alias_gone)) {
                            st.mapping_mut(hj.slot).alias = 0;
                            st.counters.segment_handles_lent -= 1;
                            st.counters.segment_lent_bytes -= hj.size;
                        }
                    }
                    self.fail_awake(&mut st, tag, mode, host, &failed, &kept, &pieces, &offsets);
                    return Err(Error::Driver {
                        source: e,
                        bytes: h.size,
                    });
                }
                // A whole mapping could not be mapped back: the tag sleeps with it
                // (and those like it); its segments sleep too, as below.
                asleep_pieces.retain(|&k| kept.iter().any(|q| q.slot == pieces[k].slot));
            }
            // The undo was refused as well: the segments go to sleep after all.
            // Unmap again what was mapped back, and what is left from `i` on; a
            // refusal leaves that handle pending, still mapped (released at the next
            // release point; the wake maps a new handle once it is).
            seg_error = Some((e, h.size));
            for (k, &(hk, handle_k, alias_k)) in plan.handles.iter().enumerate() {
                if k < i && unmapped[k] {
                    continue;
                }
                let alias_left = if k > i || (k == i && !alias_gone) {
                    alias_k
                } else {
                    0
                };
                if alias_left != 0 {
                    if let Err(u) = d.unmap(alias_left, hk.size) {
                        failed.push(u.call);
                        unmapped[k] = false;
                        pending.push((hk.ptr, handle_k, true, alias_left));
                        continue;
                    }
                }
                match d.unmap(hk.ptr, hk.size) {
                    Ok(()) => unmapped[k] = true,
                    Err(u) => {
                        failed.push(u.call);
                        unmapped[k] = false;
                        pending.push((hk.ptr, handle_k, true, 0));
                    }
                }
            }
            break;
        }
        // Release every handle; a refused release keeps a whole mapping's handle
        // (mapped again at wake) and leaves a segment's pending.
        let mut entries = Vec::with_capacity(asleep_pieces.len());
        for &i in &asleep_pieces {
            let p = &pieces[i];
            let mut q = *p;
            if let Err(e) = d.release(p.handle) {
                failed.push(e.call);
                q.handle_live = true;
            } else {
                q.handle_live = false;
            }
            entries.push((q, offsets[i]));
        }
        for (k, &(h, handle, _)) in plan.handles.iter().enumerate() {
            if !unmapped[k] {
                continue;
            }
            if let Err(e) = d.release(handle) {
                failed.push(e.call);
                pending.push((h.ptr, handle, false, 0));
            }
        }
        let mut st = lock(&self.state);
        for call in failed {
            st.counters.count_failure(call);
        }
        st.book_seg_asleep(tag, &plan, &block_offsets, &pending);
        self.book_asleep(&mut st, tag, mode, host, &entries);
        match seg_error {
            Some((source, bytes)) => Err(Error::Driver { source, bytes }),
            None => Ok(()),
        }
    }

    /// Maps back every whole mapping of `pieces` (unmapped, handles held); returns
    /// those the driver refused (still unmapped).
    fn map_back_pieces(
        &self,
        pieces: &[Piece2],
        failed: &mut Vec<crate::driver::DriverCall>,
    ) -> Vec<Piece2> {
        pieces
            .iter()
            .filter(|q| !self.map_back(q.ptr, q.handle, failed))
            .copied()
            .collect()
    }

    /// A sleep undone: counts `failed`; with nothing `kept` unmapped, frees the host
    /// buffer (the tag awake), else books the kept whole mappings asleep (the tag
    /// sleeps with them: [`Pool::wake`] maps them again).
    #[allow(clippy::too_many_arguments)]
    fn fail_awake(
        &self,
        st: &mut State,
        tag: u32,
        mode: SleepMode,
        host: Option<HostBuffer>,
        failed: &[crate::driver::DriverCall],
        kept: &[Piece2],
        pieces: &[Piece2],
        offsets: &[u64],
    ) {
        for &call in failed {
            st.counters.count_failure(call);
        }
        if kept.is_empty() {
            if let Some(buf) = host {
                let _ = self.driver.host_free(buf);
            }
            return;
        }
        let entries = kept
            .iter()
            .map(|q| {
                let j = pieces.iter().position(|p| p.slot == q.slot);
                (*q, j.map_or(u64::MAX, |j| offsets[j]))
            })
            .collect::<Vec<_>>();
        self.book_asleep(st, tag, mode, host, &entries);
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
    /// (`cuMemcpyHtoD`); then the host buffer is kept for the next offload sleep of
    /// the same size (a sleep/wake loop offloads the same allocations each time, and
    /// pinning 10 GiB took 5.7 s of a 5.9 s sleep on the H200); the one kept before
    /// is freed (`cuMemFreeHost`; a refusal leaves it to the driver, the wake still
    /// succeeds), and [`Pool::trim`] frees the kept one. Every pointer of the tag is
    /// valid again: same bytes (offload) or unspecified contents (discard: on the GPU,
    /// whatever an earlier owner of the memory left; [`Pool::wake_zeroed`] zeroes
    /// them).
    ///
    /// First, what the pool holds pending (a release refused part-way, or what an
    /// earlier wake's undo could not undo) is released again (`cuMemUnmap`,
    /// `cuMemRelease`, `cuMemAddressFree`; no synchronize), as at a release point.
    ///
    /// Failures: any step refused (the device full: `cuMemCreate` out of memory)
    /// undoes what this wake mapped and created, in reverse, and returns the error;
    /// the tag stays asleep, its host copy kept, and a later wake can succeed. A
    /// mapping whose undo the driver refuses stays mapped (awake, counted), and the
    /// next wake skips it (when that mapping is the one whose copy was refused, its
    /// contents are unspecified: two refusals in a row on one mapping).
    ///
    /// Concurrency: as [`Pool::sleep`], the wake takes the tag exclusively (its calls
    /// are refused until the wake returns, and a wake racing a free or an allocation
    /// of the tag either refuses it or comes wholly before it).
    ///
    /// Errors: [`Error::TagState`] when the tag does not sleep, or a sleep or wake of
    /// it runs on another thread (nothing done, pending kept);
    /// [`Error::OutOfMemory`] when the device is full (nothing released to make
    /// room: free memory or trim, then wake again); [`Error::Driver`] for another
    /// refused call.
    pub fn wake(&self, tag: u32) -> Result<()> {
        self.wake_zeroing(tag, None)
    }

    /// [`Pool::wake`]; with `zero`, what a discard sleep dropped is zeroed on that
    /// stream ([`Pool::wake_zeroed`]). Recorded once the tag is awake (a failed
    /// memset leaves it awake).
    pub(super) fn wake_zeroing(&self, tag: u32, zero: Option<Stream>) -> Result<()> {
        let _order = self.record_order();
        let (woken, zeroed) = self.wake_unrecorded(tag, zero);
        if let (Some(rec), Ok(())) = (&self.rec, &woken) {
            rec.line(&format!("wake {tag}"));
        }
        woken.and(zeroed)
    }

    /// [`Pool::wake_zeroing`], not recorded: the wake's result, and the zeroing's
    /// (`Ok` when not asked for or nothing to do).
    fn wake_unrecorded(&self, tag: u32, zero: Option<Stream>) -> (Result<()>, Result<()>) {
        // What a release or an earlier wake's undo left pending is retried first
        // (no synchronize: a pending leftover's work is done): a leftover still
        // mapped at one of the tag's addresses would make this wake's map fail.
        let mut batch = Batch::default();
        {
            let mut st = lock(&self.state);
            if st
                .tags
                .get(&tag)
                .is_some_and(|t| !t.busy && t.sleeping.is_some())
                && !st.pending.is_empty()
            {
                st.collect_pending(&mut batch);
                st.start_release(&mut batch);
            }
        }
        let _ = self.release_batch(batch);
        let (mode, host, pieces, seg, blocks, dropped) = {
            let mut st = lock(&self.state);
            let t = st.tags.entry(tag).or_default();
            if t.busy || t.sleeping.is_none() {
                let e = Error::TagState {
                    tag,
                    reason: "the tag does not sleep (or a sleep or wake of it runs)",
                };
                return (Err(e), Ok(()));
            }
            // Calls of a sleeping tag are refused; those refused a moment ago leave.
            st = self.close_tag(st, tag);
            let t = st.tags.entry(tag).or_default();
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
            let seg = st
                .tags
                .get(&tag)
                .map(|t| t.seg_sleep.clone())
                .unwrap_or_default();
            // Each live block asleep: address, requested bytes, offset in `host`.
            let blocks: Vec<(DevicePtr, u64, u64)> = seg
                .live
                .iter()
                .map(|&(slot, off)| {
                    let m = st.mref(slot);
                    (m.ptr(), m.requested, off)
                })
                .collect();
            // A zeroing wake of a discard sleep: what the sleep dropped.
            let dropped = match (zero, mode) {
                (Some(_), Some(SleepMode::Discard)) => st.dropped_ranges(&list, &blocks),
                _ => Vec::new(),
            };
            (mode, host, pieces, seg, blocks, dropped)
        };
        // The segments first (new handles at the same addresses, the live blocks'
        // bytes copied back), then the whole mappings; a failure of the latter undoes
        // the former.
        let result = self
            .wake_segments(mode, host, &seg, &blocks)
            .and_then(|woken| {
                let r = self.wake_steps(tag, mode, host, &pieces, &woken);
                if r.is_err() {
                    let mut failed = Vec::new();
                    let mut pending = Vec::new();
                    self.undo_seg_wake(&woken, &mut failed, &mut pending);
                    lock(&self.state).book_wake_leftovers(&failed, &pending);
                }
                r
            });
        // Still busy: no allocation or free of the tag moves what is zeroed.
        let zeroed = match (zero, &result) {
            (Some(stream), Ok(())) => self.zero_dropped(tag, stream, &dropped),
            _ => Ok(()),
        };
        self.open_tag(&mut lock(&self.state), tag);
        (result, zeroed)
    }

    /// Wakes the segments of a sleep (`ss`): for each handle, `cuMemCreate`,
    /// `cuMemMap` at its address, `cuMemSetAccess`; then in offload mode each live
    /// block's bytes (`blocks`: address, requested bytes, offset in `host`) copied
    /// back. Returns the handles mapped (booked by [`Pool::finish_wake`]). A refused
    /// step undoes, in reverse, what this wake mapped and created (what the driver
    /// refuses to undo is left pending) and returns the error (out-of-memory when
    /// the device is full), the segments asleep.
    fn wake_segments(
        &self,
        mode: Option<SleepMode>,
        host: Option<HostBuffer>,
        ss: &SegSleep,
        blocks: &[(DevicePtr, u64, u64)],
    ) -> Result<Vec<(SleepingHandle, PhysicalHandle)>> {
        let d = &*self.driver;
        let mut done = Vec::with_capacity(ss.handles.len());
        let mut failed = Vec::new();
        let mut pending = Vec::new();
        let mut err: Option<(DriverError, u64)> = None;
        for &h in &ss.handles {
            let handle = match d.create(h.size) {
                Ok(x) => x,
                Err(e) => {
                    err = Some((e, h.size));
                    break;
                }
            };
            if let Err(e) = d.map(h.ptr, handle) {
                if let Err(r) = d.release(handle) {
                    failed.push(r.call);
                    pending.push((h.ptr, handle, false));
                }
                err = Some((e, h.size));
                break;
            }
            done.push((h, handle));
            if let Err(e) = d.set_access(h.ptr, h.size, &self.access_devices) {
                err = Some((e, h.size));
                break;
            }
        }
        if let (None, Some(SleepMode::Offload), Some(buf)) = (err, mode, host) {
            for &(ptr, n, off) in blocks {
                if off == u64::MAX || n == 0 {
                    continue;
                }
                if let Err(e) = d.copy_to_device(ptr, buf, off, n) {
                    err = Some((e, n));
                    break;
                }
            }
        }
        let Some((e, bytes)) = err else {
            return Ok(done);
        };
        failed.push(e.call);
        self.undo_seg_wake(&done, &mut failed, &mut pending);
        let mut st = lock(&self.state);
        st.book_wake_leftovers(&failed, &pending);
        Err(if e.is_out_of_memory() {
            self.oom_error(&st, bytes, Some(e))
        } else {
            Error::Driver { source: e, bytes }
        })
    }

    /// Undoes, latest first, the handles a wake of segments mapped (`done`): unmap,
    /// release. Refused calls go to `failed`; what the driver keeps goes to
    /// `pending` (address, handle, still mapped).
    fn undo_seg_wake(
        &self,
        done: &[(SleepingHandle, PhysicalHandle)],
        failed: &mut Vec<crate::driver::DriverCall>,
        pending: &mut Vec<(DevicePtr, PhysicalHandle, bool)>,
    ) {
        let d = &*self.driver;
        for &(h, handle) in done.iter().rev() {
            if let Err(e) = d.unmap(h.ptr, h.size) {
                failed.push(e.call);
                pending.push((h.ptr, handle, true));
                continue;
            }
            if let Err(e) = d.release(handle) {
                failed.push(e.call);
                pending.push((h.ptr, handle, false));
            }
        }
    }

    fn wake_steps(
        &self,
        tag: u32,
        mode: Option<SleepMode>,
        host: Option<HostBuffer>,
        pieces: &[(Piece2, u64)],
        seg: &[(SleepingHandle, PhysicalHandle)],
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
                        return self.finish_wake(tag, host, &done, &calls, failure, false, seg);
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
            return self.finish_wake(tag, host, &done, &calls, failure, false, seg);
        }
        self.finish_wake(tag, host, &done, &calls, None, true, seg)
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

    /// Books the pieces of `done` awake; with `all`, the tag awake (its segments'
    /// handles `seg` booked mapped, its host buffer freed); else returns `failure`'s
    /// error, the tag asleep.
    #[allow(clippy::too_many_arguments)]
    fn finish_wake(
        &self,
        tag: u32,
        host: Option<HostBuffer>,
        done: &[(Piece2, PhysicalHandle, bool)],
        calls: &[crate::driver::DriverCall],
        failure: Option<(DriverError, u64)>,
        all: bool,
        seg: &[(SleepingHandle, PhysicalHandle)],
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
        st.book_seg_awake(tag, seg);
        st.counters.tags_sleeping -= 1;
        if let Some(h) = host {
            st.counters.offloaded_bytes -= h.size;
        }
        let t = st.tags.entry(tag).or_default();
        t.sleeping = None;
        t.host = None;
        t.asleep.clear();
        // The buffer is kept for the next offload of its size; the one kept before
        // is freed.
        let old = host.and_then(|h| st.keep_spare_host(h));
        drop(st);
        if let Some(h) = old {
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
            st.drop_sleeping_segments();
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
            hosts.extend(st.take_spare_host(|_| true));
            self.reset_gate();
            hosts
        };
        for h in hosts {
            let _ = self.driver.host_free(h);
        }
    }
}

impl State {
    /// Counts the refused calls of a wake's undo (`failed`) and keeps what the driver
    /// kept (`pending`: address, handle, still mapped) pending, retried at the next
    /// release point.
    fn book_wake_leftovers(
        &mut self,
        failed: &[crate::driver::DriverCall],
        pending: &[(DevicePtr, PhysicalHandle, bool)],
    ) {
        for &call in failed {
            self.counters.count_failure(call);
        }
        for &(ptr, handle, mapped) in pending {
            self.keep_pending_handle(ptr, handle, mapped);
        }
    }

    /// Destroy: every sleeping segment's blocks are forgotten (its live blocks
    /// counted as freed), its handle slots removed, the segment emptied (its
    /// reservation is freed with the empty segments).
    fn drop_sleeping_segments(&mut self) {
        let tags: Vec<u32> = self
            .tags
            .iter()
            .filter(|(_, t)| !t.seg_sleep.segs.is_empty())
            .map(|(&k, _)| k)
            .collect();
        for tag in tags {
            let ss = match self.tags.get_mut(&tag) {
                Some(t) => std::mem::take(&mut t.seg_sleep),
                None => continue,
            };
            for &(slot, _) in &ss.live {
                let m = self.mapping(slot);
                self.live.remove(&m.ptr());
                let size = m.size();
                let c = &mut self.counters;
                c.live_count -= 1;
                c.live_requested_bytes -= m.requested;
                c.frees += 1;
                c.sleeping_count -= 1;
                c.sleeping_bytes -= size;
                c.sleeping_block_count -= 1;
                c.sleeping_block_bytes -= size;
                self.remove_slot(slot);
            }
            for &slot in &ss.free {
                self.remove_slot(slot);
            }
            for h in &ss.handles {
                self.remove_slot(h.slot);
            }
            for &sid in &ss.segs {
                let seg = &mut self.segs.segs[sid as usize];
                seg.asleep = false;
                seg.busy -= 1;
                seg.claimed = 0;
                seg.tail = super::books::NIL;
                seg.tail_end = seg.reservation.ptr;
            }
        }
    }
}
