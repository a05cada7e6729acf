//! A heap's free space: a block carved from the smallest free block that fits (its
//! front split off), and a block back in it, coalesced with its free neighbours.

use super::home_of;
use crate::driver::DevicePtr;
use crate::error::Result;
use crate::pool::books::{Mapping, MappingState, State, ANY, NIL, SYNC_FREED};

impl State {
    /// Takes the smallest free block of heap `key` of at least `size` bytes, splits
    /// off its first `size` bytes and makes them live; counted as a reuse hit when
    /// `hit` (no driver call served it).
    pub(in crate::pool) fn carve(
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
    pub(in crate::pool) fn carve_unless_tail(
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
    pub(in crate::pool) fn block_to_heap(&mut self, slot: u32, bucket: u32) -> bool {
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
    pub(in crate::pool) fn merge_free(&mut self, slot: u32) {
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

    /// Bytes the pool caches: idle whole mappings and free blocks.
    pub(in crate::pool) fn cached_bytes(&self) -> u64 {
        self.counters.idle_bytes + self.counters.block_free_bytes
    }
}
