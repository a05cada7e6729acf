//! Growth: a heap's segment grows at its end by whole handles (a new segment first
//! when none has room), claimed under the lock, created and mapped outside it, booked
//! free after; a failed step undoes the earlier ones.

use super::{round_up, Claim, Growth, Lend, SegHandle, Segment};
use crate::driver::{CuResult, DevicePtr, DriverCall, DriverError, PhysicalHandle, Reservation};
use crate::error::Result;
use crate::pool::books::{Mapping, MappingState, Piece, State, NIL};
use crate::pool::undo::Steps;
use crate::pool::Pool;
use crate::sync::lock;

/// A growth maps at least this fraction (1 / it) of what its segment has mapped.
const GROWTH_DIVISOR: u64 = 8;

/// ... but never more than this many bytes beyond the need (64 MiB).
const GROWTH_CAP_BYTES: u64 = 64 << 20;

impl State {
    /// Claims room for a handle of at least `size` bytes at the end of heap `key`'s
    /// newest segment, counting the free block at its end (unless `alone`: then the
    /// new memory alone covers `size`): `step(need)` says how much to map for a need
    /// of `need` bytes (a multiple of `g`). `None`: no segment has room (a new one is
    /// needed).
    pub(in crate::pool) fn claim_growth(
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
    pub(in crate::pool) fn add_segment(&mut self, key: u32, reservation: Reservation) -> u32 {
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
    pub(in crate::pool) fn claim_start(&mut self, sid: u32, size: u64) -> Claim {
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
    pub(in crate::pool) fn unclaim(&mut self, claim: Claim, va_lost: bool) {
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
    pub(in crate::pool) fn book_growth(&mut self, claim: Claim, handle: PhysicalHandle) -> u32 {
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
        let placed = self.place_range(claim.seg, claim.ptr, size, hslot);
        self.history_handle(hslot, true);
        placed
    }

    /// Handle `hslot`, mapped at `ptr` (`size` bytes) at segment `sid`'s growing end,
    /// joins the segment: its range becomes a free block, linked to (and coalesced
    /// with) the blocks next to it. Ends one in-flight growth step (`busy`).
    pub(super) fn place_range(&mut self, sid: u32, ptr: DevicePtr, size: u64, hslot: u32) -> u32 {
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
    pub(super) fn block_neighbours(&self, sid: u32, ptr: DevicePtr, size: u64) -> (u32, u32) {
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
    pub(super) fn maybe_reset(&mut self, sid: u32) {
        let seg = &mut self.segs.segs[sid as usize];
        if seg.handles.is_empty() && seg.busy == 0 && !seg.va_lost {
            seg.claimed = 0;
            seg.tail = NIL;
            seg.tail_end = seg.base();
        }
    }
}

impl Pool {
    /// Grows heap `key` and carves the block from it. Another thread may carve the
    /// new memory first: then it grows again (a few times at most).
    pub(in crate::pool) fn grow_and_carve(
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
                    let _ = self.free_reservation_or_keep(r);
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
            let mut steps = Steps::new(d);
            let mapped = steps
                .map(at, lend.handle)
                .and_then(|()| steps.set_access(at, size, &self.access_devices));
            match mapped {
                Ok(()) => lent.push((*lend, at)),
                Err(e) => {
                    failures.push(e.call);
                    err = Some(e);
                    // Never had access at `at`: no work can touch it there. A mapping
                    // the driver refuses to remove is kept, retired, as its alias.
                    let left = steps.undo(&mut failures);
                    refused.push((*lend, left.mapped.then_some(at)));
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
        let mut steps = Steps::new(&*self.driver);
        let result: Result<_, DriverError> = (|| {
            let handle = steps.create(claim.size)?;
            steps.map(claim.ptr, handle)?;
            steps.set_access(claim.ptr, claim.size, &self.access_devices)?;
            Ok(handle)
        })();
        let e = match result {
            Ok(handle) => return Ok(Some(handle)),
            Err(e) => e,
        };
        failures.push(e.call);
        // Never had access: no work can touch it.
        let left = steps.undo(failures);
        let kept = steps
            .handle()
            .filter(|_| left.handle_live)
            .map(|h| (h, left.mapped));
        Err((e, kept, left.mapped))
    }
}
