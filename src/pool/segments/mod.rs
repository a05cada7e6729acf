//! Segment mode ([`ReusePolicy::Segments`](super::ReusePolicy::Segments)): blocks
//! carved from segments.
//!
//! - A **heap** per home: the synchronous API's (home [`SYNC_FREED`]) and one per
//!   stream (home: the stream's bucket). Each heap has a small class (requests up to
//!   [`SEGMENT_SMALL_MAX_BYTES`]) and a large one; a (home, class) pair is a heap
//!   key, [`heap_key`].
//! - A **segment** is one reserved virtual range of a heap key, covered from its
//!   start by whole physical handles mapped back to back (each handle is mapped whole,
//!   so the driver's sub-range rule holds by construction). It grows at its end
//!   (`claimed`) by mapping a new whole handle; a released handle below the highest
//!   mapping left leaves an unmapped hole that is not reused until the segment is
//!   empty again (the growing end comes back down to that highest mapping).
//! - A **block** is a range of a segment: live (handed out), idle in a stream-order
//!   bucket (waiting on a fence, a capture, a synchronize: the buckets of
//!   `books.rs`), or free in its heap (`HeapFree`, indexed by (heap key, size) in
//!   [`Segments::free`]). Blocks of one mapped run are linked in address order;
//!   a block returning to its heap coalesces with free neighbours at once.
//!
//! Memory enters a heap's free space only when its home may use it at once: freed on
//! the heap's own stream (or with the synchronous `free` for the synchronous heap),
//! or known complete (bucket [`ANY`]), or after a device synchronize (a release
//! point). Everything else stays a whole block in the bucket stream order put it in.
//!
//! A handle whose whole range is free is released (outside a retention scope, while
//! the pool's cached bytes are over the release threshold): unmapped and released,
//! the segment's reservation kept. Its release needs a device synchronize unless its
//! segment's memory is known complete: a stream heap's frees fenced
//! (`Segment::mark`) and nothing merged that needs one since the last synchronize
//! (`Segment::dirty_at`).

use std::collections::HashMap;

use super::books::{
    BucketKind, Mapping, MappingState, Piece, State, ANY, NIL, NO_SEGMENT, SYNC_FREED,
};
use super::config::{SEGMENT_BLOCK_ROUND_BYTES, SEGMENT_SMALL_MAX_BYTES};
use super::fit::FreeIndex;
use super::release::Batch;
use super::Pool;
use crate::driver::{
    CuResult, DevicePtr, DriverCall, DriverError, PhysicalHandle, Reservation, Stream,
};
use crate::error::{Error, Result};
use crate::sync::lock;

/// One handle mapped in a segment.
#[derive(Clone, Copy, Debug)]
pub(super) struct SegHandle {
    pub(super) ptr: DevicePtr,
    pub(super) size: u64,
    pub(super) slot: u32,
}

/// A segment: one reservation of one heap key.
#[derive(Debug)]
pub(super) struct Segment {
    pub(super) reservation: Reservation,
    /// The heap key ([`heap_key`]).
    pub(super) key: u32,
    /// Bytes from the start claimed for handles (mapped, or being mapped).
    pub(super) claimed: u64,
    /// The block that ends at the highest booked handle end (`tail_end`), or
    /// [`NIL`]: a growth right after it links to it.
    pub(super) tail: u32,
    pub(super) tail_end: DevicePtr,
    /// Handles mapped, by address.
    pub(super) handles: Vec<SegHandle>,
    /// The home stream's free mark of the latest own-stream free merged into it: its
    /// handles are released without a synchronize once the stream's fences complete
    /// through this mark.
    pub(super) mark: u64,
    /// Memory needing a device synchronize before release was merged while this
    /// many synchronizes had started (`None`: none since the last).
    pub(super) dirty_at: Option<u64>,
    /// Growths and handle releases in flight outside the lock.
    pub(super) busy: u32,
    /// A failed undo left a mapping inside the claimed range: never reset.
    pub(super) va_lost: bool,
    /// The tag whose heap this is (issue 15): a tag's own heaps (home
    /// [`BucketKind::Tag`]) hold only its blocks; every other heap is tag 0's.
    pub(super) tag: u32,
    /// Its tag sleeps: its handles are released (`tags.rs`), its blocks kept in the
    /// books, its free blocks out of the index, and `busy` raised by one.
    pub(super) asleep: bool,
}

impl Segment {
    fn base(&self) -> DevicePtr {
        self.reservation.ptr
    }
}

/// The heaps and segments of a pool in segment mode.
#[derive(Default)]
pub(super) struct Segments {
    pub(super) segs: Vec<Segment>,
    /// Segment ids of each heap key, oldest first.
    pub(super) by_key: HashMap<u32, Vec<u32>>,
    /// Free blocks by (heap key, size).
    pub(super) free: FreeIndex,
}

/// The heap key of a request of `size` bytes on home `home` (a bucket number).
pub(super) fn heap_key(home: u32, size: u64) -> u32 {
    (home << 1) | u32::from(size > SEGMENT_SMALL_MAX_BYTES)
}

/// The home bucket of heap key `key`.
pub(super) fn home_of(key: u32) -> u32 {
    key >> 1
}

/// Where a growth maps its new handle (`size` 0: none, the lent handles cover the
/// need).
#[derive(Clone, Copy, Debug)]
pub(super) struct Claim {
    pub(super) seg: u32,
    pub(super) ptr: DevicePtr,
    pub(super) size: u64,
}

/// A handle lent to a segment's growing end: mapped again there, its old mapping
/// (`old_ptr`) kept, retired.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lend {
    pub(super) slot: u32,
    pub(super) handle: PhysicalHandle,
    pub(super) old_ptr: DevicePtr,
}

/// A growth planned under the lock: handles lent, mapped back to back from `start`,
/// then a new handle (`claim`) right after them.
#[derive(Debug)]
pub(super) struct Growth {
    pub(super) claim: Claim,
    pub(super) lends: Vec<Lend>,
    pub(super) start: DevicePtr,
}

impl State {
    /// Takes the smallest free block of heap `key` of at least `size` bytes, splits
    /// off its first `size` bytes and makes them live; counted as a reuse hit when
    /// `hit` (no driver call served it).
    pub(super) fn carve(
        &mut self,
        key: u32,
        size: u64,
        requested: u64,
        hit: bool,
    ) -> Option<DevicePtr> {
        self.carve_unless_tail(key, size, requested, hit, false)
            .ok()?
    }

    /// [`State::carve`]; with `spare_tail`, a fit that is its segment's free end is
    /// left there (`Err`): a thread cache may hold blocks that would coalesce into a
    /// fit below it, and carving the end first would split the heap for good.
    pub(super) fn carve_unless_tail(
        &mut self,
        key: u32,
        size: u64,
        requested: u64,
        hit: bool,
        spare_tail: bool,
    ) -> Result<Option<DevicePtr>, ()> {
        let Some((slot, found)) = self.segs.free.take_fit(key, size) else {
            return Ok(None);
        };
        if spare_tail && self.segs.segs[self.mref(slot).seg as usize].tail == slot {
            self.segs.free.insert(slot, key, found);
            return Err(());
        }
        self.split_front(slot, found, size, key);
        if hit {
            let c = &mut self.counters;
            c.reuse_hits += 1;
            if found == size {
                c.reuse_exact_hits += 1;
            }
        }
        let m = self.mapping_mut(slot);
        m.state = MappingState::Idle;
        m.bucket = SYNC_FREED;
        Ok(Some(self.make_live(slot, requested)))
    }

    /// Free block `slot` (`found` bytes, out of the index) keeps its first `size`
    /// bytes; the rest becomes a free block of its own, indexed in `key`.
    fn split_front(&mut self, slot: u32, found: u64, size: u64, key: u32) {
        if found == size {
            return;
        }
        let m = self.mapping(slot);
        let rest_size = found - size;
        let mut rest = Mapping::block(m.seg, m.ptr() + size, rest_size, MappingState::HeapFree);
        rest.prev = slot;
        rest.next = m.next;
        let r = self.add_slot(rest);
        if m.next != NIL {
            self.mapping_mut(m.next).prev = r;
        }
        let mm = self.mapping_mut(slot);
        mm.next = r;
        mm.handle.size = size;
        self.segs.free.insert(r, key, rest_size);
        let seg = &mut self.segs.segs[m.seg as usize];
        if seg.tail == slot {
            seg.tail = r;
        }
    }

    /// Called by `index_insert` for idle block `slot` going to `bucket`: when that
    /// makes it safe for its heap's home (the home's own bucket, or [`ANY`]), it goes
    /// back to the heap's free space; returns whether it did.
    pub(super) fn block_to_heap(&mut self, slot: u32, bucket: u32) -> bool {
        let (sid, needs_sync, mark) = {
            let m = self.mref(slot);
            (m.seg, m.needs_sync, m.mark)
        };
        let ticket = self.sync_ticket;
        let seg = &mut self.segs.segs[sid as usize];
        let home = home_of(seg.key);
        if bucket != home && bucket != ANY {
            return false;
        }
        if bucket == home {
            if home == SYNC_FREED || needs_sync {
                seg.dirty_at = Some(ticket);
            } else {
                seg.mark = seg.mark.max(mark);
            }
        }
        self.merge_free(slot);
        true
    }

    /// Idle block `slot` (out of every index) joins its heap's free space, coalesced
    /// with its free neighbours.
    pub(super) fn merge_free(&mut self, slot: u32) {
        let (sid, mut ptr, mut size, mut prev, mut next) = {
            let m = self.mref(slot);
            (m.seg, m.ptr(), m.size(), m.prev, m.next)
        };
        if prev != NIL {
            let p = self.mref(prev);
            if p.state == MappingState::HeapFree && p.ptr() + p.size() == ptr {
                let (pptr, psize, pprev) = (p.ptr(), p.size(), p.prev);
                self.segs.free.remove(prev);
                let seg = &mut self.segs.segs[sid as usize];
                if seg.tail == prev {
                    seg.tail = slot;
                }
                self.remove_slot(prev);
                ptr = pptr;
                size += psize;
                prev = pprev;
                if prev != NIL {
                    self.mapping_mut(prev).next = slot;
                }
            }
        }
        if next != NIL {
            let n = self.mref(next);
            if n.state == MappingState::HeapFree && ptr + size == n.ptr() {
                let (nsize, nnext) = (n.size(), n.next);
                self.segs.free.remove(next);
                let seg = &mut self.segs.segs[sid as usize];
                if seg.tail == next {
                    seg.tail = slot;
                }
                self.remove_slot(next);
                size += nsize;
                next = nnext;
                if next != NIL {
                    self.mapping_mut(next).prev = slot;
                }
            }
        }
        let key = self.segs.segs[sid as usize].key;
        let m = self.mapping_mut(slot);
        m.reservation.ptr = ptr;
        m.handle.size = size;
        m.prev = prev;
        m.next = next;
        m.state = MappingState::HeapFree;
        m.requested = 0;
        m.retry = false;
        m.needs_sync = false;
        m.freed_on = None;
        self.segs.free.insert(slot, key, size);
    }

    /// Claims room for a handle of at least `size` bytes at the end of heap `key`'s
    /// newest segment, counting the free block at its end (unless `alone`: then the
    /// new memory alone covers `size`): `step(need)` says how much to map for a need
    /// of `need` bytes (a multiple of `g`). `None`: no segment has room (a new one is
    /// needed).
    pub(super) fn claim_growth(
        &mut self,
        key: u32,
        size: u64,
        g: u64,
        alone: bool,
        step: impl Fn(u64, u64) -> u64,
    ) -> Option<Growth> {
        // The newest segment first (it holds the free block at the growing end),
        // then the older ones, oldest first (one emptied or shrunk since has room).
        let ids = self.segs.by_key.get(&key)?;
        let (&last, older) = ids.split_last()?;
        let (sid, end, need, room) = std::iter::once(last)
            .chain(older.iter().copied())
            .find_map(|sid| {
                let seg = &self.segs.segs[sid as usize];
                let end = seg.base() + seg.claimed;
                let trailing = if !alone && seg.tail != NIL && seg.tail_end == end {
                    let t = self.mref(seg.tail);
                    if t.state == MappingState::HeapFree {
                        t.size()
                    } else {
                        0
                    }
                } else {
                    0
                };
                let need = round_up(size.saturating_sub(trailing), g)?;
                let room = seg.reservation.size.saturating_sub(seg.claimed);
                (need <= room).then_some((sid, end, need, room))
            })?;
        let seg = &self.segs.segs[sid as usize];
        let mapped = seg.handles.iter().map(|h| h.size).sum::<u64>();
        let lends = self.lend_handles(sid, need);
        let lent: u64 = lends.iter().map(|l| l.handle.size).sum();
        // As much as a growth without lending would map, less what is lent.
        let fresh = if lent == need {
            0
        } else {
            step(need, mapped).min(room).max(need) - lent
        };
        let seg = &mut self.segs.segs[sid as usize];
        seg.claimed += lent + fresh;
        seg.busy += 1;
        Some(Growth {
            claim: Claim {
                seg: sid,
                ptr: end + lent,
                size: fresh,
            },
            lends,
            start: end,
        })
    }

    /// Books a new segment of heap `key` on `reservation`; returns its id.
    pub(super) fn add_segment(&mut self, key: u32, reservation: Reservation) -> u32 {
        let sid = self.segs.segs.len() as u32;
        let tag = self.heap_tag(key);
        self.segs.segs.push(Segment {
            reservation,
            key,
            claimed: 0,
            tail: NIL,
            tail_end: reservation.ptr,
            handles: Vec::new(),
            mark: 0,
            dirty_at: None,
            busy: 0,
            va_lost: false,
            tag,
            asleep: false,
        });
        self.segs.by_key.entry(key).or_default().push(sid);
        let c = &mut self.counters;
        c.segment_count += 1;
        c.reserved_bytes += reservation.size;
        sid
    }

    /// Claims the start of new segment `sid` (nothing claimed in it yet) for a
    /// handle of `size` bytes.
    pub(super) fn claim_start(&mut self, sid: u32, size: u64) -> Claim {
        let seg = &mut self.segs.segs[sid as usize];
        let ptr = seg.base();
        seg.claimed = size;
        seg.busy += 1;
        Claim {
            seg: sid,
            ptr,
            size,
        }
    }

    /// A growth's handle failed: gives its claimed range back (when nothing was
    /// claimed after it; else it stays a hole until the segment empties).
    pub(super) fn unclaim(&mut self, claim: Claim, va_lost: bool) {
        let seg = &mut self.segs.segs[claim.seg as usize];
        if seg.base() + seg.claimed == claim.ptr + claim.size && !va_lost {
            seg.claimed -= claim.size;
        }
        seg.va_lost |= va_lost;
        seg.busy -= 1;
        self.maybe_reset(claim.seg);
    }

    /// Books `handle`, mapped at `claim`, as a free block of its segment, coalesced
    /// with the block before it; returns the free block's slot.
    pub(super) fn book_growth(&mut self, claim: Claim, handle: PhysicalHandle) -> u32 {
        let size = claim.size;
        let c = &mut self.counters;
        c.mappings_created += 1;
        c.segment_handles += 1;
        c.segment_mapped_bytes += size;
        c.block_free_bytes += size;
        self.add_physical(size, 0);
        self.tag_handle_bytes(claim.seg, size, true);
        let hslot = self.add_slot(Mapping {
            state: MappingState::InSegment,
            piece: Piece::Handle,
            seg: claim.seg,
            reservation_live: false,
            ..Mapping::created(
                Reservation {
                    ptr: claim.ptr,
                    size: 0,
                },
                handle,
                0,
            )
        });
        self.place_range(claim.seg, claim.ptr, size, hslot)
    }

    /// Handle `hslot`, mapped at `ptr` (`size` bytes) at segment `sid`'s growing end,
    /// joins the segment: its range becomes a free block, linked to (and coalesced
    /// with) the blocks next to it. Ends one in-flight growth step (`busy`).
    fn place_range(&mut self, sid: u32, ptr: DevicePtr, size: u64, hslot: u32) -> u32 {
        let seg = &mut self.segs.segs[sid as usize];
        seg.busy -= 1;
        let at = seg.handles.partition_point(|h| h.ptr < ptr);
        seg.handles.insert(
            at,
            SegHandle {
                ptr,
                size,
                slot: hslot,
            },
        );
        let (tail, tail_end) = (seg.tail, seg.tail_end);
        // Blocks cover every booked handle: a booked handle right before (after) it
        // holds the block that ends (starts) there. Usually that is the end block
        // only; a growth booked after a later growth of the segment (both in flight
        // at once) lies below it, and its neighbours are found by a scan (rare path:
        // left unlinked, the ranges could never coalesce).
        let left_booked = at > 0 && seg.handles[at - 1].ptr + seg.handles[at - 1].size == ptr;
        let right_booked = seg.handles.get(at + 1).is_some_and(|h| h.ptr == ptr + size);
        let by_tail = tail != NIL && tail_end == ptr;
        let (prev, next) = if right_booked || (left_booked && !by_tail) {
            self.block_neighbours(sid, ptr, size)
        } else if by_tail {
            (tail, NIL)
        } else {
            (NIL, NIL)
        };
        let mut block = Mapping::block(sid, ptr, size, MappingState::Idle);
        block.prev = prev;
        block.next = next;
        let slot = self.add_slot(block);
        if prev != NIL {
            self.mapping_mut(prev).next = slot;
        }
        if next != NIL {
            self.mapping_mut(next).prev = slot;
        }
        let seg = &mut self.segs.segs[sid as usize];
        if next == NIL && (ptr + size > seg.tail_end || seg.tail == NIL) {
            seg.tail = slot;
            seg.tail_end = ptr + size;
        }
        self.merge_free(slot);
        slot
    }

    /// The blocks of segment `sid` that end at `ptr` and that start at `ptr + size`
    /// ([`NIL`] where none does): a scan of the books (rare paths only).
    fn block_neighbours(&self, sid: u32, ptr: DevicePtr, size: u64) -> (u32, u32) {
        let (mut left, mut right) = (NIL, NIL);
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(b) = s {
                if b.piece == Piece::Block && b.seg == sid {
                    if b.ptr() + b.size() == ptr {
                        left = i as u32;
                    } else if b.ptr() == ptr + size {
                        right = i as u32;
                    }
                }
            }
        }
        (left, right)
    }

    /// Resets segment `sid` to empty when its last handle is gone and nothing is in
    /// flight: growth starts at its beginning again.
    fn maybe_reset(&mut self, sid: u32) {
        let seg = &mut self.segs.segs[sid as usize];
        if seg.handles.is_empty() && seg.busy == 0 && !seg.va_lost {
            seg.claimed = 0;
            seg.tail = NIL;
            seg.tail_end = seg.base();
        }
    }

    /// Whether the handles of segment `sid` may be released now and need a device
    /// synchronize first: `None` while it holds memory freed on its home stream that
    /// no completed fence covers (released once one does, with no synchronize, as
    /// memory idle in a stream's bucket is; a release point whose fence failed holds
    /// it for a synchronize instead, [`State::hold_heaps`]), else `Some(needs_sync)`.
    fn segment_release(&self, sid: u32) -> Option<bool> {
        let seg = &self.segs.segs[sid as usize];
        let home = home_of(seg.key);
        if let Some(BucketKind::Stream(_)) = self.buckets.get(home as usize).map(|b| b.kind) {
            if self.buckets[home as usize].completed < seg.mark {
                return None;
            }
        }
        Some(seg.dirty_at.is_some_and(|t| self.synced <= t))
    }

    /// Stream bucket `b`'s fence could not be recorded or waited on (or the pool is
    /// being destroyed): memory freed on its stream into its heaps that no completed
    /// fence covers is released after a device synchronize instead (as
    /// `hold_unconfirmed` holds idle memory).
    pub(super) fn hold_heaps(&mut self, b: u32) {
        let completed = self.buckets[b as usize].completed;
        let ticket = self.sync_ticket;
        for k in [b << 1, (b << 1) | 1] {
            let n = self.segs.by_key.get(&k).map_or(0, Vec::len);
            for i in 0..n {
                let sid = self.segs.by_key[&k][i];
                let seg = &mut self.segs.segs[sid as usize];
                if seg.mark > completed {
                    seg.mark = 0;
                    seg.dirty_at = Some(ticket);
                }
            }
        }
    }

    /// Whether a heap of stream bucket `b` holds memory (its stream may have work
    /// on it, and is asked about captures and fenced at release points).
    pub(super) fn heap_holds_memory(&self, b: u32) -> bool {
        [b << 1, (b << 1) | 1].iter().any(|k| {
            self.segs.by_key.get(k).is_some_and(|ids| {
                ids.iter()
                    .any(|&s| !self.segs.segs[s as usize].handles.is_empty())
            })
        })
    }

    /// Whether a heap of stream bucket `b` holds memory freed on the stream that no
    /// completed fence covers (with `aged`, freed at or before `polled` marks).
    pub(super) fn heap_wants_fence(&self, b: u32, aged: Option<u64>) -> bool {
        let completed = self.buckets[b as usize].completed;
        [b << 1, (b << 1) | 1].iter().any(|k| {
            self.segs.by_key.get(k).is_some_and(|ids| {
                ids.iter().any(|&s| {
                    let seg = &self.segs.segs[s as usize];
                    !seg.handles.is_empty()
                        && seg.mark > completed
                        && aged.is_none_or(|polled| seg.mark <= polled)
                })
            })
        })
    }

    /// Collects for release (into `batch`) the handles of every segment whose whole
    /// range is free, while the pool's cached bytes stay over `keep` (if any);
    /// segments needing a device synchronize only with `may_sync`.
    pub(super) fn collect_heaps(&mut self, batch: &mut Batch, may_sync: bool, keep: Option<u64>) {
        for sid in 0..self.segs.segs.len() as u32 {
            self.collect_segment(sid, batch, may_sync, keep);
        }
    }

    /// As [`State::collect_heaps`], for the segments of segment `sid`'s heap key: a
    /// free's release. Not `sid` alone: a heap has more than one segment when its
    /// first growths raced (each reserved one) or one ran out of room, and a growth
    /// whose carve took a block of another segment (freed meanwhile) leaves its new
    /// handle wholly free, which no free in that segment may ever come to collect.
    pub(super) fn collect_heap_of(
        &mut self,
        sid: u32,
        batch: &mut Batch,
        may_sync: bool,
        keep: Option<u64>,
    ) {
        let key = self.segs.segs[sid as usize].key;
        let n = self.segs.by_key.get(&key).map_or(0, Vec::len);
        for i in 0..n {
            let s = self.segs.by_key[&key][i];
            self.collect_segment(s, batch, may_sync, keep);
        }
    }

    /// Collects for release (into `batch`) the wholly free handles of the heaps of
    /// stream homes other than `home` whose release needs no synchronize (their
    /// stream's work up to the last free is known complete), while the pool's cached
    /// bytes stay over `keep`: memory a growth of `home`'s heap may take the place of
    /// (see [`Pool::release_other_homes`]).
    pub(super) fn collect_other_homes(&mut self, home: u32, batch: &mut Batch, keep: u64) {
        for sid in 0..self.segs.segs.len() as u32 {
            let h = home_of(self.segs.segs[sid as usize].key);
            let stream = matches!(
                self.buckets.get(h as usize).map(|b| b.kind),
                Some(BucketKind::Stream(_))
            );
            if h != home && stream {
                self.collect_segment(sid, batch, false, Some(keep));
            }
        }
    }

    /// Whether a heap of a stream home other than `home` holds a handle (cheap: what
    /// a miss asks before polling fences for [`State::collect_other_homes`]).
    pub(super) fn other_homes_hold_memory(&self, home: u32) -> bool {
        self.segs.segs.iter().any(|seg| {
            let h = home_of(seg.key);
            h != home
                && !seg.handles.is_empty()
                && matches!(
                    self.buckets.get(h as usize).map(|b| b.kind),
                    Some(BucketKind::Stream(_))
                )
        })
    }

    /// As [`State::collect_heaps`], for segment `sid` only.
    fn collect_segment(&mut self, sid: u32, batch: &mut Batch, may_sync: bool, keep: Option<u64>) {
        if self.segs.segs[sid as usize].handles.is_empty() {
            return;
        }
        let Some(needs_sync) = self.segment_release(sid) else {
            return;
        };
        if needs_sync && !may_sync {
            return;
        }
        let key = self.segs.segs[sid as usize].key;
        let smallest = self.segs.segs[sid as usize]
            .handles
            .iter()
            .map(|h| h.size)
            .min()
            .unwrap_or(u64::MAX);
        let mut ranges = Vec::new();
        self.segs.free.any_in_from(key, smallest, |s| {
            ranges.push(s);
            false
        });
        for f in ranges {
            if self.mapping(f).seg != sid {
                continue;
            }
            let mut f = Some(f);
            while let Some(range) = f {
                // What `batch` releases is still counted cached until it is booked.
                if keep.is_some_and(|k| {
                    self.cached_bytes().saturating_sub(releasing_bytes(batch)) <= k
                }) {
                    return;
                }
                f = self.take_handle_from(range, batch, needs_sync).flatten();
            }
        }
    }

    /// Bytes the pool caches: idle whole mappings and free blocks.
    pub(super) fn cached_bytes(&self) -> u64 {
        self.counters.idle_bytes + self.counters.block_free_bytes
    }

    /// Takes the first handle lying wholly inside free block `f` out of its segment
    /// for release (into `batch`), splitting `f` around it. Returns `None` when no
    /// handle lies inside, else the free block after the handle, to look in next.
    fn take_handle_from(
        &mut self,
        f: u32,
        batch: &mut Batch,
        needs_sync: bool,
    ) -> Option<Option<u32>> {
        let fm = self.mapping(f);
        let (a, b) = (fm.ptr(), fm.ptr() + fm.size());
        let seg = &self.segs.segs[fm.seg as usize];
        let i = seg.handles.partition_point(|h| h.ptr < a);
        let h = *seg.handles.get(i)?;
        if h.ptr + h.size > b {
            return None;
        }
        let right = self.detach_handle(f, i);
        let m = self.mapping_mut(h.slot);
        m.state = MappingState::Releasing;
        m.needs_sync = needs_sync;
        let m = *m;
        batch.mappings.push((h.slot, m));
        Some(right)
    }

    /// Takes handle `i` of free block `f`'s segment (lying wholly inside `f`) out of
    /// the segment, splitting `f` around it; the handle's bytes move from the
    /// segment's counters to the idle ones (it is in flight: released or lent).
    /// Returns the free block after the handle, if any.
    fn detach_handle(&mut self, f: u32, i: usize) -> Option<u32> {
        let fm = self.mapping(f);
        let (a, b) = (fm.ptr(), fm.ptr() + fm.size());
        let sid = fm.seg;
        let seg = &self.segs.segs[sid as usize];
        let h = seg.handles[i];
        let key = seg.key;
        let (hs, he) = (h.ptr, h.ptr + h.size);
        self.segs.free.remove(f);
        // The part after the handle.
        let right = if he < b {
            let mut r = Mapping::block(sid, he, b - he, MappingState::HeapFree);
            r.next = fm.next;
            let r = self.add_slot(r);
            if fm.next != NIL {
                self.mapping_mut(fm.next).prev = r;
            }
            self.segs.free.insert(r, key, b - he);
            Some(r)
        } else {
            if fm.next != NIL {
                self.mapping_mut(fm.next).prev = NIL;
            }
            None
        };
        // The part before it.
        if a < hs {
            let m = self.mapping_mut(f);
            m.handle.size = hs - a;
            m.next = NIL;
            self.segs.free.insert(f, key, hs - a);
        } else {
            if fm.prev != NIL {
                self.mapping_mut(fm.prev).next = NIL;
            }
            self.remove_slot(f);
        }
        let seg = &mut self.segs.segs[sid as usize];
        if seg.tail == f {
            match right {
                Some(r) => seg.tail = r,
                None => {
                    seg.tail = NIL;
                }
            }
        }
        seg.handles.remove(i);
        seg.busy += 1;
        let c = &mut self.counters;
        c.segment_handles -= 1;
        c.segment_mapped_bytes -= h.size;
        c.block_free_bytes -= h.size;
        c.idle_count += 1;
        c.idle_bytes += h.size;
        self.mapping_mut(h.slot).state = MappingState::Releasing;
        right
    }

    /// Chooses handles of segment `sid` to lend to its end for a growth of `need`
    /// bytes (stitching: a free handle serves a request larger than itself, with a new
    /// handle for the rest): handles whose free block is exactly their range (not the
    /// block at the segment's end, which the growth extends anyway), never lent
    /// before, largest first while they fit in `need`. Detaches them (in flight,
    /// counted idle) and returns them.
    fn lend_handles(&mut self, sid: u32, need: u64) -> Vec<Lend> {
        let seg = &self.segs.segs[sid as usize];
        let (key, end_block) = (seg.key, seg.tail);
        let smallest = seg.handles.iter().map(|h| h.size).min().unwrap_or(u64::MAX);
        if smallest > need {
            return Vec::new();
        }
        let mut ranges = Vec::new();
        self.segs.free.any_in_from(key, smallest, |f| {
            ranges.push(f);
            false
        });
        // (size, handle slot)
        let mut cands: Vec<(u64, u32)> = Vec::new();
        for f in ranges {
            let fm = self.mapping(f);
            if fm.seg != sid || f == end_block {
                continue;
            }
            let (a, b) = (fm.ptr(), fm.ptr() + fm.size());
            let seg = &self.segs.segs[sid as usize];
            let first = seg.handles.partition_point(|h| h.ptr < a);
            for h in &seg.handles[first..] {
                if h.ptr + h.size > b {
                    break;
                }
                // Only a handle that is its free block exactly: its neighbours are in
                // use (or holes), so moving it costs no coalescing. Lending handles
                // out of larger free blocks fragments them: on the graph-warmup
                // tensor trace it raised the peak from 1.13x to 1.27x the lower
                // bound.
                let alone = h.ptr == a && h.ptr + h.size == b;
                if alone && h.size <= need && self.mapping(h.slot).alias == 0 {
                    cands.push((h.size, h.slot));
                }
            }
        }
        cands.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
        let mut left = need;
        let mut out = Vec::new();
        for (size, slot) in cands {
            if size > left {
                continue;
            }
            // Where it lies now (earlier detaches split its free block).
            let m = self.mapping(slot);
            let seg = &self.segs.segs[sid as usize];
            let Ok(i) = seg.handles.binary_search_by(|h| h.ptr.cmp(&m.ptr())) else {
                continue;
            };
            let Some(f) = self.free_block_covering(sid, m.ptr()) else {
                continue;
            };
            self.detach_handle(f, i);
            out.push(Lend {
                slot,
                handle: m.handle,
                old_ptr: m.ptr(),
            });
            left -= size;
            if left == 0 {
                break;
            }
        }
        out
    }

    /// The free block of segment `sid` that contains address `ptr` (a scan of the
    /// heap's free blocks: growths only).
    fn free_block_covering(&self, sid: u32, ptr: DevicePtr) -> Option<u32> {
        let key = self.segs.segs[sid as usize].key;
        let mut found = None;
        self.segs.free.any_in_from(key, 0, |f| {
            let m = self.mapping(f);
            if m.seg == sid && m.ptr() <= ptr && ptr < m.ptr() + m.size() {
                found = Some(f);
                true
            } else {
                false
            }
        });
        found
    }

    /// Books a lent handle mapped again at `ptr` (its old mapping kept, retired) as a
    /// free block at its segment's end; returns the block's slot.
    pub(super) fn book_lent(&mut self, lend: &Lend, ptr: DevicePtr) -> u32 {
        let size = lend.handle.size;
        let c = &mut self.counters;
        c.idle_count -= 1;
        c.idle_bytes -= size;
        c.segment_handles += 1;
        c.segment_handles_lent += 1;
        c.segment_lent_bytes += size;
        c.segment_mapped_bytes += size;
        c.block_free_bytes += size;
        let m = self.mapping_mut(lend.slot);
        m.state = MappingState::InSegment;
        m.reservation.ptr = ptr;
        m.alias = lend.old_ptr;
        let sid = m.seg;
        self.place_range(sid, ptr, size, lend.slot)
    }

    /// A lend that failed (its new mapping refused, or undone): the handle goes back
    /// to its old place; with `dead`, a new mapping of it at `dead` could not be
    /// undone and is kept, retired, as its alias.
    pub(super) fn lend_failed(&mut self, lend: &Lend, dead: Option<DevicePtr>) {
        if let Some(at) = dead {
            self.mapping_mut(lend.slot).alias = at;
            self.counters.segment_handles_lent += 1;
            self.counters.segment_lent_bytes += lend.handle.size;
            let sid = self.mapping(lend.slot).seg;
            self.segs.segs[sid as usize].va_lost = true;
        }
        self.handle_still_mapped(lend.slot);
    }

    /// A handle's release failed before its unmap (a synchronize or the unmap
    /// refused): it goes back to its segment, a free block again, needing a device
    /// synchronize before the next try.
    pub(super) fn handle_still_mapped(&mut self, slot: u32) {
        let mut m = self.mapping(slot);
        m.state = MappingState::InSegment;
        m.retry = false;
        *self.mapping_mut(slot) = m;
        let (sid, ptr, size) = (m.seg, m.ptr(), m.size());
        let ticket = self.sync_ticket;
        let seg = &mut self.segs.segs[sid as usize];
        seg.busy -= 1;
        seg.dirty_at = Some(ticket);
        let at = seg.handles.partition_point(|h| h.ptr < ptr);
        seg.handles.insert(at, SegHandle { ptr, size, slot });
        let c = &mut self.counters;
        c.idle_count -= 1;
        c.idle_bytes -= size;
        c.segment_handles += 1;
        c.segment_mapped_bytes += size;
        c.block_free_bytes += size;
        // Its neighbours (rare path: a scan of the segment's blocks).
        let (left, right) = self.block_neighbours(sid, ptr, size);
        let mut block = Mapping::block(sid, ptr, size, MappingState::Idle);
        block.prev = left;
        block.next = right;
        let b = self.add_slot(block);
        if left != NIL {
            self.mapping_mut(left).next = b;
        }
        if right != NIL {
            self.mapping_mut(right).prev = b;
        }
        let seg = &mut self.segs.segs[sid as usize];
        if ptr + size >= seg.tail_end {
            seg.tail = b;
            seg.tail_end = ptr + size;
        }
        self.merge_free(b);
    }

    /// A handle of segment `sid` was unmapped (released or left pending): its range
    /// is a hole now.
    pub(super) fn handle_unmapped(&mut self, sid: u32) {
        self.segs.segs[sid as usize].busy -= 1;
        self.maybe_reset(sid);
        self.maybe_retreat(sid);
    }

    /// With nothing in flight in segment `sid`, brings its growing end back down to
    /// the end of the highest mapping left in it (a handle, or a lent handle's
    /// retired mapping): a heap that frees and regrows its top handles (an engine's
    /// activations above long-lived weights, outside a scope) then maps them at the
    /// same addresses again, instead of walking up its reservation and reserving a
    /// new segment each time the range runs out.
    fn maybe_retreat(&mut self, sid: u32) {
        let seg = &self.segs.segs[sid as usize];
        if seg.busy != 0 || seg.va_lost || seg.handles.is_empty() {
            return;
        }
        let top = seg
            .handles
            .iter()
            .map(|h| {
                let alias = self.mref(h.slot).alias;
                let alias_end = if alias != 0 { alias + h.size } else { 0 };
                (h.ptr + h.size).max(alias_end)
            })
            .max()
            .unwrap_or(seg.base());
        let seg = &mut self.segs.segs[sid as usize];
        let end = seg.base() + seg.claimed;
        if top < end {
            seg.claimed = top - seg.base();
            if seg.tail_end > top || seg.tail == NIL {
                // The block that ends at the new end is found by `place_range`'s
                // scan when a growth books a handle right after it; a free one is
                // looked up now (a scan of the heap's free blocks: releases only),
                // so that the next growth counts it.
                seg.tail = NIL;
                seg.tail_end = top;
                if let Some(f) = self.free_block_covering(sid, top - 1) {
                    let m = self.mref(f);
                    if m.ptr() + m.size() == top {
                        self.segs.segs[sid as usize].tail = f;
                    }
                }
            }
        }
    }

    /// Segments left with no handle, for destroy: forgotten here, their
    /// reservations returned to the caller to free.
    pub(super) fn take_empty_segments(&mut self) -> Vec<Reservation> {
        let mut out = Vec::new();
        for seg in &mut self.segs.segs {
            if seg.handles.is_empty() && seg.busy == 0 && seg.reservation.size > 0 {
                out.push(seg.reservation);
                self.counters.segment_count -= 1;
                self.counters.reserved_bytes -= seg.reservation.size;
                seg.reservation.size = 0;
                seg.claimed = 0;
            }
        }
        out
    }

    /// Whether every segment's handles are gone (destroy's end test).
    pub(super) fn segments_empty(&self) -> bool {
        self.segs.segs.iter().all(|s| s.handles.is_empty())
    }
}

/// A growth maps at least this fraction (1 / it) of what its segment has mapped.
const GROWTH_DIVISOR: u64 = 8;

/// ... but never more than this many bytes beyond the need (64 MiB).
const GROWTH_CAP_BYTES: u64 = 64 << 20;

/// Bytes of the handles and whole mappings in `batch`: idle until it is booked, then
/// released (its blocks go back to their heaps, still cached).
fn releasing_bytes(batch: &Batch) -> u64 {
    batch
        .mappings
        .iter()
        .filter(|(_, m)| !m.is_block())
        .map(|(_, m)| m.size())
        .sum()
}

/// `v` rounded up to a multiple of `g` (a power of two); `None` on overflow.
pub(super) fn round_up(v: u64, g: u64) -> Option<u64> {
    v.checked_add(g - 1).map(|x| x & !(g - 1))
}

/// A block's segment id is never [`NO_SEGMENT`].
#[allow(dead_code)]
const _: () = assert!(NO_SEGMENT == u32::MAX);

impl State {
    /// Keeps reservation `r` (counted in `reserved_bytes`), whose free the driver
    /// refused, pending: retried at the next release point.
    fn keep_pending_reservation(&mut self, r: Reservation) {
        self.counters.pending_count += 1;
        let slot = self.add_slot(Mapping {
            state: MappingState::Pending,
            created: false,
            mapped: false,
            handle_live: false,
            reservation_live: true,
            ..Mapping::created(r, PhysicalHandle { raw: 0, size: 0 }, 0)
        });
        self.pending.push(slot);
    }

    /// Keeps what a failed growth's undo left with the driver (a handle, mapped at
    /// `ptr` or not) pending: retried at the next release point.
    pub(super) fn keep_pending_handle(
        &mut self,
        ptr: DevicePtr,
        handle: PhysicalHandle,
        mapped: bool,
    ) {
        self.add_physical(handle.size, 0);
        let c = &mut self.counters;
        c.pending_count += 1;
        c.pending_bytes += handle.size;
        let slot = self.add_slot(Mapping {
            state: MappingState::Pending,
            created: false,
            mapped,
            handle_live: true,
            reservation_live: false,
            ..Mapping::created(Reservation { ptr, size: 0 }, handle, 0)
        });
        self.pending.push(slot);
    }
}

impl Pool {
    /// The block size of a request of `bytes` in segment mode (rounded up to
    /// [`SEGMENT_BLOCK_ROUND_BYTES`]), or `None` when it takes a whole mapping (not
    /// segment mode, or above the whole-mapping threshold).
    ///
    /// Errors: [`Error::InvalidArgument`] for 0 bytes.
    pub(super) fn block_size(&self, bytes: u64) -> Result<Option<u64>> {
        if !self.segments || bytes > self.whole_threshold {
            return Ok(None);
        }
        if bytes == 0 {
            return Err(Error::InvalidArgument("allocation of 0 bytes".into()));
        }
        // Cannot overflow: `bytes` is at most the threshold, and a threshold near
        // `u64::MAX` rounds within range or is refused below.
        match round_up(bytes, SEGMENT_BLOCK_ROUND_BYTES) {
            Some(size) if round_up(size, self.granularity).is_some() => Ok(Some(size)),
            _ => Err(Error::InvalidArgument(format!(
                "allocation of {bytes} bytes overflows when rounded to the granularity"
            ))),
        }
    }

    /// A block of `size` bytes for the synchronous `allocate` (`bytes` asked).
    pub(super) fn allocate_block_sync(&self, size: u64, bytes: u64) -> Result<DevicePtr> {
        let key = heap_key(SYNC_FREED, size);
        // While thread caches hold blocks, the heap's free end is carved only after
        // this thread's cache went back to the heap (its blocks may coalesce into a
        // fit below the end).
        let spare_tail = self.caches.may_hold();
        {
            let mut st = lock(&self.state);
            match st.carve_unless_tail(key, size, bytes, true, spare_tail) {
                Ok(Some(p)) => return Ok(p),
                Ok(None) => {
                    // Blocks of stream heaps freed with the synchronous `free`.
                    if let Some(p) = self.take_for(&mut st, None, size, bytes, self.max_fit(size)) {
                        return Ok(p);
                    }
                }
                Err(()) => {}
            }
        }
        let retake = |st: &mut State| {
            st.carve(key, size, bytes, true)
                .or_else(|| self.take_for(st, None, size, bytes, self.max_fit(size)))
        };
        if let Some(p) = self.refill_from_caches(&self.want(bytes, Some(size))?, retake) {
            return Ok(p);
        }
        if spare_tail {
            if let Some(p) = retake(&mut lock(&self.state)) {
                return Ok(p);
            }
        }
        self.block_miss(key, size, bytes, None)
    }

    /// A block of `size` bytes on `stream` (`bytes` asked): its heap, then (after a
    /// capture query) blocks freed in its capture or on it, then a growth.
    pub(super) fn allocate_block_async(
        &self,
        stream: Stream,
        size: u64,
        bytes: u64,
    ) -> Result<DevicePtr> {
        let key = {
            let mut st = lock(&self.state);
            let own = st.stream_bucket(stream);
            let key = heap_key(own, size);
            if let Some(p) = st.carve(key, size, bytes, true) {
                return Ok(p);
            }
            key
        };
        let capture = self
            .driver
            .stream_capture(stream)
            .map_err(|source| Error::Driver { source, bytes: 0 })?;
        {
            let mut st = lock(&self.state);
            if let Some(p) =
                self.take_for_stream(&mut st, stream, capture, size, bytes, self.max_fit(size))
            {
                return Ok(p);
            }
        }
        self.block_miss(key, size, bytes, Some((stream, capture)))
    }

    /// A block that no free block of heap `key` fits: grow the heap; on
    /// out-of-memory, a forced reuse of an idle block, then (outside a scope) a
    /// release of what is free and one retry.
    #[cold]
    fn block_miss(
        &self,
        key: u32,
        size: u64,
        bytes: u64,
        on: Option<(Stream, Option<u64>)>,
    ) -> Result<DevicePtr> {
        let rounded = round_up(size, self.granularity).unwrap_or(u64::MAX);
        self.release_other_homes(home_of(key), rounded);
        self.miss(
            rounded,
            size,
            bytes,
            on,
            || match self.grow_and_carve(key, size, bytes) {
                // Blocks idle in thread caches go back to their heaps, where they
                // coalesce with their free neighbours and may serve the request:
                // the forced reuse that follows takes no block from a heap, so
                // inside a scope the request would fail with the memory free.
                Err(e) if e.is_out_of_memory() && self.caches.enabled => {
                    self.caches.settle(&self.state);
                    lock(&self.state).carve(key, size, bytes, true).ok_or(e)
                }
                r => r,
            },
            |st| st.carve(key, size, bytes, true),
        )
    }

    /// Before a heap of home `home` grows by `need` bytes, outside a retention scope:
    /// releases up to `need` bytes (whole handles, so up to one handle more) of other
    /// streams' heaps' wholly free handles whose stream work is known complete (their
    /// fences polled now; no synchronize). A stream's heap serves its own stream only
    /// (as PyTorch's per-stream pools), so what another stream's heap holds idle
    /// cannot serve this growth; without this, memory a side stream used once (a
    /// warmup) stayed cached beside the growth. In a steady state no heap grows and
    /// this costs nothing. (PyTorch's `torch.cuda.graph` empties the cache before
    /// each capture, which releases such memory anyway; an engine with side streams
    /// and no such call keeps it without this.) Nothing is released inside a scope (a
    /// retention scope keeps what is freed for reuse) or from the synchronous API's
    /// heap (its release needs a device synchronize).
    fn release_other_homes(&self, home: u32, need: u64) {
        let mut batch = Batch::default();
        {
            let mut st = lock(&self.state);
            if st.counters.scope_open || !st.other_homes_hold_memory(home) {
                return;
            }
            let streams: Vec<u32> = (0..st.buckets.len() as u32)
                .filter(|&b| {
                    b != home
                        && matches!(st.buckets[b as usize].kind, BucketKind::Stream(_))
                        && st.heap_holds_memory(b)
                })
                .collect();
            self.poll(&mut st, &streams, true);
            let keep = st.cached_bytes().saturating_sub(need);
            st.collect_other_homes(home, &mut batch, keep);
            if batch.is_empty() {
                return;
            }
            st.start_release(&mut batch);
        }
        let _ = self.release_batch(batch);
    }

    /// Grows heap `key` and carves the block from it. Another thread may carve the
    /// new memory first: then it grows again (a few times at most).
    pub(super) fn grow_and_carve(
        &self,
        key: u32,
        size: u64,
        bytes: u64,
    ) -> Result<DevicePtr, DriverError> {
        for _ in 0..2 {
            if let Some(p) = self.grow(key, size, bytes, false)? {
                return Ok(p);
            }
        }
        // Twice another thread carved (or released) the free block at the end that
        // the growth counted on: grow by the whole request, which the new memory then
        // covers alone, and the carve booked with it cannot miss. (Not at once: a
        // second growth that counts the first one's memory maps less.)
        self.grow(key, size, bytes, true)?.ok_or(DriverError::new(
            DriverCall::Create,
            CuResult::OUT_OF_MEMORY,
        ))
    }

    /// How many bytes a growth maps for a need of `need` bytes (a multiple of the
    /// granularity) when the heap's segment has `mapped` bytes mapped: the need, or
    /// an eighth of what is mapped (at most [`GROWTH_CAP_BYTES`]) when that is more,
    /// rounded to the granularity. Chosen on the shipped traces
    /// (`docs/ARCHITECTURE.md`, "Segments"): it cuts the handles a replay creates
    /// (graph-warmup tensor trace: 81 to 50; segment trace: 294 to 236) at no cost in
    /// peak on the tensor traces and 0.2% on the segment trace; larger caps or
    /// fractions cut handles further but raise the tensor traces' peaks above 1.15x
    /// the lower bound.
    fn growth_step(&self, need: u64, mapped: u64) -> u64 {
        let extra = (mapped / GROWTH_DIVISOR).min(GROWTH_CAP_BYTES);
        need.max(round_up(extra, self.granularity).unwrap_or(need))
    }

    /// Maps one new whole handle at the end of heap `key`'s segment (a new segment
    /// first when it has no room), books it free, and carves `size` bytes from the
    /// heap. With `alone`, the new memory covers `size` by itself. `Ok(None)`: the
    /// growth counted on the free block at the segment's end and another thread
    /// carved it first (never with `alone`: the carve is booked with the growth,
    /// under one lock). A failed step undoes the earlier ones; what the driver
    /// refuses to undo is kept pending.
    fn grow(
        &self,
        key: u32,
        size: u64,
        bytes: u64,
        alone: bool,
    ) -> Result<Option<DevicePtr>, DriverError> {
        let g = self.granularity;
        let step = |need: u64, mapped: u64| self.growth_step(need, mapped);
        let planned = lock(&self.state).claim_growth(key, size, g, alone, step);
        let growth = match planned {
            Some(gr) => gr,
            None => {
                let need = round_up(size, g).unwrap_or(u64::MAX);
                let want = self.segment_reserve.max(need);
                let r = match self.driver.reserve(want) {
                    Ok(r) => r,
                    Err(e) => {
                        lock(&self.state).counters.count_failure(e.call);
                        return Err(e);
                    }
                };
                let mut st = lock(&self.state);
                // Another growth may have made room (a segment of this heap, or room
                // in one) while the reservation was made: use that, give this back.
                if let Some(gr) = st.claim_growth(key, size, g, alone, step) {
                    drop(st);
                    if let Err(e) = self.driver.free_reservation(r) {
                        let mut st = lock(&self.state);
                        st.counters.count_failure(e.call);
                        st.counters.reserved_bytes += r.size;
                        st.keep_pending_reservation(r);
                    }
                    gr
                } else {
                    let sid = st.add_segment(key, r);
                    let claim = st.claim_start(sid, step(need, 0).max(need).min(r.size));
                    Growth {
                        claim,
                        lends: Vec::new(),
                        start: claim.ptr,
                    }
                }
            }
        };
        let d = &*self.driver;
        let mut failures: Vec<DriverCall> = Vec::new();
        // The lent handles first, mapped again back to back from the segment's end.
        let mut at = growth.start;
        let mut lent: Vec<(Lend, DevicePtr)> = Vec::new();
        let mut refused: Vec<(Lend, Option<DevicePtr>)> = Vec::new();
        let mut err: Option<DriverError> = None;
        for lend in &growth.lends {
            let size = lend.handle.size;
            if err.is_some() {
                refused.push((*lend, None));
                continue;
            }
            if let Err(e) = d.map(at, lend.handle) {
                failures.push(e.call);
                err = Some(e);
                refused.push((*lend, None));
                continue;
            }
            match d.set_access(at, size, &self.access_devices) {
                Ok(()) => lent.push((*lend, at)),
                Err(e) => {
                    failures.push(e.call);
                    err = Some(e);
                    // Never had access at `at`: no work can touch it there.
                    let dead = match d.unmap(at, size) {
                        Ok(()) => None,
                        Err(u) => {
                            failures.push(u.call);
                            Some(at)
                        }
                    };
                    refused.push((*lend, dead));
                }
            }
            at += size;
        }
        // Then the new handle, if the lent ones do not cover the need.
        let claim = growth.claim;
        let fresh = if err.is_some() || claim.size == 0 {
            Ok(None)
        } else {
            self.map_fresh(claim, &mut failures)
        };
        let mut st = lock(&self.state);
        for call in failures {
            st.counters.count_failure(call);
        }
        for (lend, ptr) in &lent {
            st.book_lent(lend, *ptr);
        }
        for (lend, dead) in &refused {
            st.lend_failed(lend, *dead);
        }
        match fresh {
            Ok(Some(handle)) => {
                st.book_growth(claim, handle);
            }
            Ok(None) => st.unclaim(claim, false),
            Err((e, leftover, va_lost)) => {
                if let Some((handle, mapped)) = leftover {
                    st.keep_pending_handle(claim.ptr, handle, mapped);
                }
                st.unclaim(claim, va_lost);
                err = Some(e);
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        Ok(st.carve(key, size, bytes, false))
    }

    /// Creates a handle of `claim.size` bytes and maps it at `claim.ptr` with access
    /// (outside the lock). On failure, undoes what it did; the error comes with what
    /// the driver refused to undo (the handle, and whether it is still mapped) and
    /// whether the claimed range now holds a mapping that cannot be removed.
    #[allow(clippy::type_complexity)]
    fn map_fresh(
        &self,
        claim: Claim,
        failures: &mut Vec<DriverCall>,
    ) -> Result<Option<PhysicalHandle>, (DriverError, Option<(PhysicalHandle, bool)>, bool)> {
        let d = &*self.driver;
        let handle = match d.create(claim.size) {
            Ok(h) => h,
            Err(e) => {
                failures.push(e.call);
                return Err((e, None, false));
            }
        };
        if let Err(e) = d.map(claim.ptr, handle) {
            failures.push(e.call);
            return match d.release(handle) {
                Ok(()) => Err((e, None, false)),
                Err(r) => {
                    failures.push(r.call);
                    Err((e, Some((handle, false)), false))
                }
            };
        }
        if let Err(e) = d.set_access(claim.ptr, claim.size, &self.access_devices) {
            failures.push(e.call);
            // Never had access: no work can touch it.
            if let Err(u) = d.unmap(claim.ptr, claim.size) {
                failures.push(u.call);
                return Err((e, Some((handle, true)), true));
            }
            return match d.release(handle) {
                Ok(()) => Err((e, None, false)),
                Err(r) => {
                    failures.push(r.call);
                    Err((e, Some((handle, false)), false))
                }
            };
        }
        Ok(Some(handle))
    }

    /// Frees the reservations of segments left with no handle (destroy, after every
    /// release): a refused free is kept pending, retried once more by destroy.
    pub(super) fn free_empty_segments(&self) -> Result<()> {
        let empty = lock(&self.state).take_empty_segments();
        let mut first = Ok(());
        for r in empty {
            if let Err(e) = self.driver.free_reservation(r) {
                let mut st = lock(&self.state);
                st.counters.count_failure(e.call);
                st.counters.reserved_bytes += r.size;
                st.keep_pending_reservation(r);
                if first.is_ok() {
                    first = Err(Error::Driver {
                        source: e,
                        bytes: 0,
                    });
                }
            }
        }
        first
    }
}
