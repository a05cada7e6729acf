//! One slot of the books: a whole mapping, a segment's block or a segment's handle,
//! and where it is in its life.

use super::SYNC_FREED;
use crate::driver::{DevicePtr, PhysicalHandle, Reservation};

/// Where a mapping is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::pool) enum MappingState {
    /// Handed out to a caller.
    Live,
    /// Retained or cached; reusable while in the reuse index.
    Idle,
    /// Idle in the books, taken out of the reuse index by a thread that is
    /// releasing it outside the lock.
    Releasing,
    /// A release step failed; what is left is kept and retried.
    Pending,
    /// A block's range in its heap's free space (segment mode): indexed in
    /// [`Segments::free`](crate::pool::segments::Segments), coalesced with free neighbours.
    HeapFree,
    /// A handle mapped in its segment (segment mode): its bytes are blocks, live or
    /// free.
    InSegment,
    /// Held by the thread caches (`cache/`): idle in a cache, or live through
    /// one. Counted as idle (a free block) in the books' counters; what the caches
    /// did with it is in their deltas.
    Cached,
}

/// What a slot of the books holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::pool) enum Piece {
    /// A whole mapping: its own reservation, one handle mapped in it.
    Whole,
    /// A block of a segment (live, idle in a bucket, or free in its heap):
    /// `reservation.ptr` is its address, `handle.size` its size (a multiple of 512
    /// bytes); it owns no driver object.
    Block,
    /// A physical handle mapped in a segment at `reservation.ptr`
    /// (`reservation.size` 0: the reservation is the segment's).
    Handle,
}

/// One mapping: a reservation with one whole handle mapped in it and access granted.
#[derive(Clone, Copy, Debug)]
pub(in crate::pool) struct Mapping {
    pub(in crate::pool) reservation: Reservation,
    pub(in crate::pool) handle: PhysicalHandle,
    /// Bytes the caller asked for while live.
    pub(in crate::pool) requested: u64,
    pub(in crate::pool) state: MappingState,
    /// Idle after a failed synchronize or unmap: release again at the next release
    /// point.
    pub(in crate::pool) retry: bool,
    /// While live: which allocation this is (the value of `allocations` when it was
    /// handed out), so that a guard frees only its own allocation.
    pub(in crate::pool) alloc_id: u64,
    /// Counted in `mappings_created` (false for what a failed creation left
    /// behind), so that its final release counts in `mappings_released`.
    pub(in crate::pool) created: bool,
    /// Pending: what the driver still holds.
    pub(in crate::pool) mapped: bool,
    pub(in crate::pool) handle_live: bool,
    pub(in crate::pool) reservation_live: bool,
    /// While idle: the bucket it is (or, deferred, will be) indexed in.
    pub(in crate::pool) bucket: u32,
    /// While idle in a stream bucket: its free's mark on that stream.
    pub(in crate::pool) mark: u64,
    /// Its release must synchronize every device with access first (freed with the
    /// synchronous `free`, during a capture, or live at destroy); false when its
    /// stream work is known complete.
    pub(in crate::pool) needs_sync: bool,
    /// The bucket of the stream of its last free (`None`: the synchronous `free`):
    /// by bucket, so that a stream with a forgotten stream's handle is another one
    /// (only counted in `cross_stream_hits`: a drained forgotten bucket given to a
    /// new stream makes a reuse of such memory by it uncounted).
    pub(in crate::pool) freed_on: Option<u32>,
    /// What the slot holds.
    pub(in crate::pool) piece: Piece,
    /// Blocks and handles: the segment (`NO_SEGMENT` for a whole mapping).
    pub(in crate::pool) seg: u32,
    /// Blocks: the slots of the blocks just below and just above in address, in
    /// the same mapped run of the segment (`NIL` at a run's edge).
    pub(in crate::pool) prev: u32,
    pub(in crate::pool) next: u32,
    /// Handles: a second, retired mapping of the handle at this address (0: none).
    /// A handle lent to a segment's growing end keeps its old mapping (queued work
    /// may still touch the old address: unmapping it inside a scope could fault
    /// that work) until its release unmaps both.
    pub(in crate::pool) alias: DevicePtr,
    /// The tag of the allocation while live (0: untagged), or of the tag bucket it
    /// idles in. Whole mappings only: blocks are always tag 0's.
    pub(in crate::pool) tag: u32,
    /// Live, of a sleeping tag: unmapped (`handle_live`: the driver refused to
    /// release its handle, mapped again at wake), its reservation kept.
    pub(in crate::pool) asleep: bool,
    /// While live: its sequence number and the steps when it was made (the growth
    /// report, `steps.rs`).
    pub(in crate::pool) stamp: crate::pool::steps::Stamp,
}

impl Mapping {
    /// A live mapping just created.
    pub(in crate::pool) fn created(
        reservation: Reservation,
        handle: PhysicalHandle,
        requested: u64,
    ) -> Self {
        Mapping {
            reservation,
            handle,
            requested,
            state: MappingState::Live,
            retry: false,
            alloc_id: 0,
            created: true,
            mapped: true,
            handle_live: true,
            reservation_live: true,
            bucket: SYNC_FREED,
            mark: 0,
            needs_sync: true,
            freed_on: None,
            piece: Piece::Whole,
            seg: NO_SEGMENT,
            prev: NIL,
            next: NIL,
            alias: 0,
            tag: 0,
            asleep: false,
            stamp: crate::pool::steps::Stamp { seq: 0, steps: 0 },
        }
    }

    /// A block of segment `seg` at `ptr`, `size` bytes, in `state`.
    pub(in crate::pool) fn block(seg: u32, ptr: DevicePtr, size: u64, state: MappingState) -> Self {
        Mapping {
            state,
            created: false,
            mapped: false,
            handle_live: false,
            reservation_live: false,
            piece: Piece::Block,
            seg,
            ..Mapping::created(
                Reservation { ptr, size: 0 },
                PhysicalHandle { raw: 0, size },
                0,
            )
        }
    }

    pub(in crate::pool) fn size(&self) -> u64 {
        self.handle.size
    }

    /// The address of a block, a handle or a whole mapping.
    pub(in crate::pool) fn ptr(&self) -> DevicePtr {
        self.reservation.ptr
    }

    pub(in crate::pool) fn is_block(&self) -> bool {
        self.piece == Piece::Block
    }
}

/// No slot (an address neighbour at a run's edge, a segment's unknown tail).
pub(in crate::pool) const NIL: u32 = u32::MAX;

/// The segment of a whole mapping: none.
pub(in crate::pool) const NO_SEGMENT: u32 = u32::MAX;

#[cold]
pub(in crate::pool) fn unreachable_slot(slot: u32) -> ! {
    // Not reachable through the public API: the books only name occupied slots.
    panic!("flare-package: internal error: slot {slot} is empty")
}
