//! Segment mode ([`ReusePolicy::Segments`](super::ReusePolicy::Segments)): blocks
//! carved from segments.
//!
//! - A **heap** per home: the synchronous API's (home
//!   [`SYNC_FREED`](super::books::SYNC_FREED)) and one per stream (home: the
//!   stream's bucket). Each heap has a small class (requests up to
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
//!   `books/`), or free in its heap (`HeapFree`, indexed by (heap key, size) in
//!   [`Segments::free`]). Blocks of one mapped run are linked in address order;
//!   a block returning to its heap coalesces with free neighbours at once.
//!
//! Memory enters a heap's free space only when its home may use it at once: freed on
//! the heap's own stream (or with the synchronous `free` for the synchronous heap),
//! or known complete (bucket [`ANY`](super::books::ANY)), or after a device
//! synchronize (a release point). Everything else stays a whole block in the bucket
//! stream order put it in.
//!
//! A handle whose whole range is free is released (outside a retention scope, while
//! the pool's cached bytes are over the release threshold): unmapped and released,
//! the segment's reservation kept. Its release needs a device synchronize unless its
//! segment's memory is known complete: a stream heap's frees fenced
//! (`Segment::mark`) and nothing merged that needs one since the last synchronize
//! (`Segment::dirty_at`).

mod allocate;
mod growth;
mod heap;
mod lending;
mod release;

use std::collections::HashMap;

use super::books::NO_SEGMENT;
use super::config::SEGMENT_SMALL_MAX_BYTES;
use super::fit::FreeIndex;
use crate::driver::{DevicePtr, PhysicalHandle, Reservation};

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
    /// [`NIL`](super::books::NIL): a growth right after it links to it.
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
    /// [`BucketKind::Tag`](super::books::BucketKind::Tag)) hold only its blocks; every
    /// other heap is tag 0's.
    pub(super) tag: u32,
    /// Its tag sleeps: its handles are released (`tags/`), its blocks kept in the
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

/// `v` rounded up to a multiple of `g` (a power of two); `None` on overflow.
pub(super) fn round_up(v: u64, g: u64) -> Option<u64> {
    v.checked_add(g - 1).map(|x| x & !(g - 1))
}

/// A block's segment id is never [`NO_SEGMENT`].
#[allow(dead_code)]
const _: () = assert!(NO_SEGMENT == u32::MAX);
