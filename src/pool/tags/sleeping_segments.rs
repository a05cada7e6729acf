//! A tag's segments asleep (segment mode): the sleep's plan of its handles and
//! blocks, and their books at sleep and wake.

use crate::driver::{DevicePtr, PhysicalHandle};
use crate::pool::books::{MappingState, Piece, State};
use crate::pool::segments::SegHandle;

/// A handle of a segment put to sleep: released at sleep (or left pending), mapped
/// again at `ptr` (a new handle of `size` bytes) at wake.
#[derive(Clone, Copy, Debug)]
pub(in crate::pool) struct SleepingHandle {
    pub(super) seg: u32,
    /// The handle's slot (piece `Handle`), kept while asleep.
    pub(super) slot: u32,
    pub(super) ptr: DevicePtr,
    pub(super) size: u64,
}

/// What a tag's sleeping segments hold (segment mode): every handle of its heaps,
/// its live blocks (slot, offset of their bytes in the host buffer, `u64::MAX`: not
/// copied) and its free blocks (out of the free index while asleep).
#[derive(Clone, Debug, Default)]
pub(in crate::pool) struct SegSleep {
    pub(super) segs: Vec<u32>,
    pub(super) handles: Vec<SleepingHandle>,
    pub(super) live: Vec<(u32, u64)>,
    pub(super) free: Vec<u32>,
}

/// A sleep's plan for the tag's segments: each handle with its driver handle and
/// retired mapping (`alias`, 0: none), each live block (slot, address, requested
/// bytes, size) and free block.
#[derive(Debug, Default)]
pub(super) struct SegPlan {
    pub(super) segs: Vec<u32>,
    pub(super) handles: Vec<(SleepingHandle, PhysicalHandle, DevicePtr)>,
    pub(super) live: Vec<(u32, DevicePtr, u64)>,
    pub(super) free: Vec<u32>,
}

impl State {
    /// After a sleep's device synchronize (every queued work complete): every idle
    /// block of tag `tag`'s segments still waiting in a bucket (a fence that could
    /// not be recorded or waited on, a capture's memory) or for fences (deferred)
    /// goes back to its heap. Walks the slot table (sleep only).
    pub(super) fn merge_idle_blocks(&mut self, tag: u32) {
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
    pub(super) fn seg_sleep_plan(&self, tag: u32) -> std::result::Result<SegPlan, &'static str> {
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
    pub(super) fn seg_restore_free(&mut self, plan: &SegPlan) {
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
    pub(super) fn book_seg_asleep(
        &mut self,
        tag: u32,
        plan: &SegPlan,
        offsets: &[u64],
        pending: &[(DevicePtr, PhysicalHandle, bool, DevicePtr)],
    ) {
        if plan.segs.is_empty() {
            return;
        }
        // The history (when on): the live blocks freed, then their handles unmapped.
        for &(slot, _, _) in &plan.live {
            self.history_sleep(slot, true);
        }
        for &(h, _, _) in &plan.handles {
            self.history_handle(h.slot, false);
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
            let slot = self.keep_pending_handle(ptr, handle, mapped);
            if alias != 0 {
                // Its retired mapping, still mapped: unmapped at the release too.
                self.mapping_mut(slot).alias = alias;
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
    pub(super) fn book_seg_awake(&mut self, tag: u32, woken: &[(SleepingHandle, PhysicalHandle)]) {
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
            self.history_handle(h.slot, true);
        }
        let mut live_bytes = 0;
        for &(slot, _) in &ss.live {
            let size = {
                let m = self.mapping_mut(slot);
                m.asleep = false;
                m.size()
            };
            self.history_sleep(slot, false);
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
}
