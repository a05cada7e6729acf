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

mod alloc;
mod books;
mod census;
mod destroy;
mod map_back;
mod sleep;
mod sleeping_segments;
pub(in crate::pool) mod tag_gate;
mod wake;
mod wake_zero;

pub(in crate::pool) use books::TagBooks;

// The items the docs name.
#[cfg(doc)]
use super::books::{BucketKind, State, ANY};
#[cfg(doc)]
use super::Pool;
use crate::driver::{DevicePtr, PhysicalHandle};

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

/// A live mapping a sleep or wake works on: slot, address, handle, requested bytes.
#[derive(Clone, Copy, Debug)]
struct Piece2 {
    slot: u32,
    ptr: DevicePtr,
    handle: PhysicalHandle,
    requested: u64,
    handle_live: bool,
}
