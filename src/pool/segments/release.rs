//! Releasing a heap's wholly free handles: when a segment's handles may go (and
//! whether a device synchronize must come first), collecting them for a release,
//! a handle whose release failed back in its segment, and the reservations of
//! segments left with no handle freed (destroy).

use super::{home_of, SegHandle};
use crate::driver::Reservation;
use crate::error::{Error, Result};
use crate::pool::books::{BucketKind, Mapping, MappingState, State, NIL};
use crate::pool::release::Batch;
use crate::pool::Pool;
use crate::sync::lock;

impl State {
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
    pub(in crate::pool) fn hold_heaps(&mut self, b: u32) {
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
    pub(in crate::pool) fn heap_holds_memory(&self, b: u32) -> bool {
        [b << 1, (b << 1) | 1].iter().any(|k| {
            self.segs.by_key.get(k).is_some_and(|ids| {
                ids.iter()
                    .any(|&s| !self.segs.segs[s as usize].handles.is_empty())
            })
        })
    }

    /// Whether a heap of stream bucket `b` holds memory freed on the stream that no
    /// completed fence covers (with `aged`, freed at or before `polled` marks).
    pub(in crate::pool) fn heap_wants_fence(&self, b: u32, aged: Option<u64>) -> bool {
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
    pub(in crate::pool) fn collect_heaps(
        &mut self,
        batch: &mut Batch,
        may_sync: bool,
        keep: Option<u64>,
    ) {
        for sid in 0..self.segs.segs.len() as u32 {
            self.collect_segment(sid, batch, may_sync, keep);
        }
    }

    /// As [`State::collect_heaps`], for the segments of segment `sid`'s heap key: a
    /// free's release. Not `sid` alone: a heap has more than one segment when its
    /// first growths raced (each reserved one) or one ran out of room, and a growth
    /// whose carve took a block of another segment (freed meanwhile) leaves its new
    /// handle wholly free, which no free in that segment may ever come to collect.
    pub(in crate::pool) fn collect_heap_of(
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
    pub(in crate::pool) fn collect_other_homes(&mut self, home: u32, batch: &mut Batch, keep: u64) {
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
    pub(in crate::pool) fn other_homes_hold_memory(&self, home: u32) -> bool {
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
    pub(super) fn detach_handle(&mut self, f: u32, i: usize) -> Option<u32> {
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
        self.history_handle(h.slot, false);
        let seg = &mut self.segs.segs[sid as usize];
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

    /// A handle's release failed before its unmap (a synchronize or the unmap
    /// refused): it goes back to its segment, a free block again, needing a device
    /// synchronize before the next try.
    pub(in crate::pool) fn handle_still_mapped(&mut self, slot: u32) {
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
        self.history_handle(slot, true);
    }

    /// A handle of segment `sid` was unmapped (released or left pending): its range
    /// is a hole now.
    pub(in crate::pool) fn handle_unmapped(&mut self, sid: u32) {
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
    pub(in crate::pool) fn take_empty_segments(&mut self) -> Vec<Reservation> {
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
    pub(in crate::pool) fn segments_empty(&self) -> bool {
        self.segs.segs.iter().all(|s| s.handles.is_empty())
    }
}

impl Pool {
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
    pub(super) fn release_other_homes(&self, home: u32, need: u64) {
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

    /// Frees the reservations of segments left with no handle (destroy, after every
    /// release): a refused free is kept pending, retried once more by destroy.
    pub(in crate::pool) fn free_empty_segments(&self) -> Result<()> {
        let empty = lock(&self.state).take_empty_segments();
        let mut first = Ok(());
        for r in empty {
            if let Err(e) = self.free_reservation_or_keep(r) {
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
