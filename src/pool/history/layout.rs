//! The pool's memory as memory_viz draws it: segments (a whole mapping; in segment
//! mode, each run of handles mapped back to back in a segment) tiled by blocks,
//! taken under the books' lock.

use super::What;
use crate::driver::DevicePtr;
use crate::pool::books::{BucketKind, MappingState, Piece, State};
use crate::pool::segments::home_of;
use crate::pool::table::{self, LIVE};
use crate::pool::Pool;
use crate::sync::atomic::Ordering;
use crate::sync::lock;

/// A block's state, as memory_viz names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// Handed out to a caller (`"active_allocated"`).
    ActiveAllocated,
    /// Not handed out: idle, retained, cached or free in a heap (`"inactive"`).
    Inactive,
}

impl BlockState {
    /// The state's name in memory_viz.
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::Inactive => "inactive",
        }
    }
}

/// A block of a [`LayoutSegment`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutBlock {
    /// Its device address.
    pub address: DevicePtr,
    /// Its bytes (a whole mapping's size; a segment block's, a multiple of 512).
    pub size: u64,
    /// Bytes the caller asked for (0 when inactive).
    pub requested_size: u64,
    /// Whether it is handed out.
    pub state: BlockState,
    /// Its tag (0: untagged).
    pub tag: u32,
}

/// A range of device memory the pool has mapped, tiled by its blocks: block `i + 1`
/// starts where block `i` ends, the first at `address`, the last ending at `address
/// + total_size`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutSegment {
    /// Its first address.
    pub address: DevicePtr,
    /// Its bytes: a whole mapping's size, or the handles of one mapped run.
    pub total_size: u64,
    /// The raw stream of its heap (segment mode; 0: the synchronous API's heap, and
    /// every whole mapping).
    pub stream: u64,
    /// Its tag (a whole mapping: its allocation's, or its bucket's; a segment: its
    /// heap's).
    pub tag: u32,
    /// `"small"` for a heap's small class (requests up to 1 MiB), else `"large"`.
    pub segment_type: &'static str,
    /// A run of a segment that grows by handles (segment mode), not a whole mapping.
    pub is_expandable: bool,
    /// Its blocks, by address.
    pub blocks: Vec<LayoutBlock>,
}

impl LayoutSegment {
    /// Bytes of its blocks that are handed out.
    pub fn allocated_size(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .sum()
    }

    /// Bytes asked for by the callers of its blocks that are handed out.
    pub fn requested_size(&self) -> u64 {
        self.blocks.iter().map(|b| b.requested_size).sum()
    }
}

impl Pool {
    /// The memory this pool has mapped now, as segments tiled by blocks (what the
    /// memory_viz snapshot's `segments` holds), by address. Left out: memory being
    /// released (its `segment_unmap` is written), a sleeping tag's memory (unmapped),
    /// and what a failed creation or release left pending.
    pub fn memory_layout(&self) -> Vec<LayoutSegment> {
        let st = lock(&self.state);
        let mut out = Vec::new();
        let mut blocks_of: Vec<Vec<u32>> = vec![Vec::new(); st.segs.segs.len()];
        for (slot, m) in st.slots.iter().enumerate() {
            let Some(m) = m else { continue };
            match m.piece {
                Piece::Block => {
                    if let Some(list) = blocks_of.get_mut(m.seg as usize) {
                        list.push(slot as u32);
                    }
                }
                Piece::Whole => {
                    let (state, requested) = match m.state {
                        MappingState::Live if !m.asleep => {
                            (BlockState::ActiveAllocated, m.requested)
                        }
                        MappingState::Idle => (BlockState::Inactive, 0),
                        MappingState::Cached => self.cached_state(m.ptr()),
                        _ => continue,
                    };
                    out.push(LayoutSegment {
                        address: m.ptr(),
                        total_size: m.size(),
                        stream: 0,
                        tag: m.tag,
                        segment_type: if m.size() <= crate::pool::SEGMENT_SMALL_MAX_BYTES {
                            "small"
                        } else {
                            "large"
                        },
                        is_expandable: false,
                        blocks: vec![LayoutBlock {
                            address: m.ptr(),
                            size: m.size(),
                            requested_size: requested,
                            state,
                            tag: m.tag,
                        }],
                    });
                }
                Piece::Handle => {}
            }
        }
        for (sid, seg) in st.segs.segs.iter().enumerate() {
            if seg.asleep || seg.handles.is_empty() {
                continue;
            }
            let mut blocks: Vec<(DevicePtr, u32)> = blocks_of[sid]
                .iter()
                .map(|&s| (st.mref(s).ptr(), s))
                .collect();
            blocks.sort_unstable();
            let stream = heap_stream(&st, seg.key);
            let segment_type = if seg.key & 1 == 1 { "large" } else { "small" };
            let mut next_block = 0;
            let mut i = 0;
            while i < seg.handles.len() {
                let start = seg.handles[i].ptr;
                let mut end = start + seg.handles[i].size;
                i += 1;
                while i < seg.handles.len() && seg.handles[i].ptr == end {
                    end += seg.handles[i].size;
                    i += 1;
                }
                while next_block < blocks.len() && blocks[next_block].0 < start {
                    next_block += 1;
                }
                let mut run = Vec::new();
                while next_block < blocks.len() && blocks[next_block].0 < end {
                    let m = st.mref(blocks[next_block].1);
                    let (state, requested) = match m.state {
                        MappingState::Live => (BlockState::ActiveAllocated, m.requested),
                        MappingState::Cached => self.cached_state(m.ptr()),
                        _ => (BlockState::Inactive, 0),
                    };
                    run.push(LayoutBlock {
                        address: m.ptr(),
                        size: m.size(),
                        requested_size: requested,
                        state,
                        tag: seg.tag,
                    });
                    next_block += 1;
                }
                out.push(LayoutSegment {
                    address: start,
                    total_size: end - start,
                    stream,
                    tag: seg.tag,
                    segment_type,
                    is_expandable: true,
                    blocks: run,
                });
            }
        }
        drop(st);
        out.sort_unstable_by_key(|s| s.address);
        out
    }

    /// A slot the thread caches hold: live through a cache (with its requested
    /// bytes), or idle in one.
    fn cached_state(&self, ptr: DevicePtr) -> (BlockState, u64) {
        match self.caches.table.get(ptr) {
            Some(e) if table::state(e.word.load(Ordering::Acquire)) == LIVE => (
                BlockState::ActiveAllocated,
                e.requested.load(Ordering::Relaxed),
            ),
            _ => (BlockState::Inactive, 0),
        }
    }
}

/// The raw stream of heap key `key`'s home (0: the synchronous API's or a tag's).
pub(in crate::pool) fn heap_stream(st: &State, key: u32) -> u64 {
    match st.buckets.get(home_of(key) as usize).map(|b| b.kind) {
        Some(BucketKind::Stream(s)) => s.raw(),
        _ => 0,
    }
}

impl State {
    /// Writes `what()` to the history ring, when the history is on.
    #[inline]
    pub(in crate::pool) fn history(&self, what: impl FnOnce(&State) -> What) {
        if let Some(h) = &self.history {
            h.write(&[what(self)]);
        }
    }

    /// `segment_map` (`map`) or `segment_unmap` of handle `slot` of a segment,
    /// when the history is on.
    #[inline]
    pub(in crate::pool) fn history_handle(&self, slot: u32, map: bool) {
        self.history(|st| {
            let m = st.mref(slot);
            let seg = &st.segs.segs[m.seg as usize];
            super::segment(map, m.ptr(), m.size(), heap_stream(st, seg.key), seg.tag)
        });
    }

    /// `segment_map` (`map`) or `segment_unmap` of whole mapping `slot`, when the
    /// history is on.
    #[inline]
    pub(in crate::pool) fn history_whole(&self, slot: u32, map: bool) {
        self.history(|st| {
            let m = st.mref(slot);
            super::segment(map, m.ptr(), m.size(), 0, m.tag)
        });
    }

    /// The free of live `slot` (still live in its fields: requested bytes, tag), on
    /// raw stream `stream`, when the history is on.
    #[inline]
    pub(in crate::pool) fn history_free(&self, slot: u32, stream: u64) {
        if let Some(h) = &self.history {
            let m = st_free(self, slot);
            h.write(&super::free_pair(m.0, m.1, stream, m.2));
        }
    }
}

impl State {
    /// A live allocation of a tag that sleeps (`asleep`) or wakes, when the history
    /// is on: memory_viz has no sleep, so a sleep shows as the allocation freed (and
    /// a whole mapping's memory unmapped), a wake as mapped and allocated again at the
    /// same address. A segment's handles are written by [`State::history_handle`].
    pub(in crate::pool) fn history_sleep(&self, slot: u32, asleep: bool) {
        let Some(h) = &self.history else { return };
        let (ptr, requested, tag) = st_free(self, slot);
        let m = self.mref(slot);
        let (size, block) = (m.size(), m.is_block());
        let stream = if block {
            self.segs
                .segs
                .get(m.seg as usize)
                .map_or(0, |s| heap_stream(self, s.key))
        } else {
            0
        };
        let [fr, fc] = super::free_pair(ptr, requested, stream, tag);
        let map = super::segment(!asleep, ptr, size, 0, tag);
        let alloc = What::new(super::HistoryAction::Alloc, ptr, requested, stream, tag);
        match (asleep, block) {
            (true, true) => h.write(&[fr, fc]),
            (true, false) => h.write(&[fr, fc, map]),
            (false, true) => h.write(&[alloc]),
            (false, false) => h.write(&[map, alloc]),
        }
    }
}

/// A live slot's address, requested bytes and tag.
fn st_free(st: &State, slot: u32) -> (DevicePtr, u64, u32) {
    let m = st.mref(slot);
    let tag = if m.is_block() {
        st.segs.segs.get(m.seg as usize).map_or(0, |s| s.tag)
    } else {
        m.tag
    };
    (m.ptr(), m.requested, tag)
}
