//! The stream-order buckets: who may take an idle mapping (any caller, one stream,
//! one capture, one tag, nobody), each bucket's fences, and mappings deferred on
//! recorded streams.

#[cfg(doc)]
use super::State;
use crate::driver::{Event, Stream};
use std::collections::VecDeque;

/// The bucket of memory any caller may take at once: freed on a stream whose work up
/// to the free is known complete (a fence completed). Released with no synchronize.
pub(in crate::pool) const ANY: u32 = 0;

/// The bucket of memory freed with the synchronous `free`: work the caller queued
/// before it may still run (the synchronous API's contract: a release synchronizes
/// the device first), so only the synchronous `allocate` takes it (as before stream
/// order existed), and it is released only after a device synchronize.
pub(in crate::pool) const SYNC_FREED: u32 = 2;

/// The bucket of memory nobody may take: freed on a stream whose order the pool
/// could not track (a stream or event call failed). Released only after a device
/// synchronize, at trim, finish, destroy or an out-of-memory release.
pub(in crate::pool) const HELD: u32 = 1;

/// Who may take the idle mappings of a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::pool) enum BucketKind {
    /// [`ANY`].
    Any,
    /// [`HELD`].
    Held,
    /// [`SYNC_FREED`].
    SyncFreed,
    /// Freed on this stream (`free_async`), not yet known complete: reusable on the
    /// stream at once, elsewhere after a fence.
    Stream(Stream),
    /// Freed with the synchronous `free` by tag `t` (not 0, issue 15): taken only by
    /// that tag's synchronous allocations, released after a device synchronize (as
    /// [`SYNC_FREED`]), and at the tag's sleep.
    Tag(u32),
    /// Blocks of tag `t`'s own heap (segment mode) freed with the synchronous `free`:
    /// work queued before the free may still run, so they stay whole here, taken only
    /// by the tag's synchronous allocations, and go back to the heap after a device
    /// synchronize (a release point), as a stream heap's blocks freed with the
    /// synchronous `free` do. Their bytes are counted by the heap (`tags/`).
    TagBlocks(u32),
    /// Freed during the capture with this id: reused only by allocations in it;
    /// `epoch` is the retention scope open when it was first seen (0: none), whose
    /// close releases it.
    Capture { id: u64, epoch: u64 },
}

/// An event recorded on a bucket's stream after its first `covers` frees.
#[derive(Clone, Copy, Debug)]
pub(in crate::pool) struct Fence {
    pub(in crate::pool) event: Event,
    pub(in crate::pool) covers: u64,
}

/// A bucket's stream-order state (see [`BucketKind`]).
#[derive(Debug)]
pub(in crate::pool) struct Bucket {
    pub(in crate::pool) kind: BucketKind,
    /// Frees made on the stream so far (each free's mark is this count after it;
    /// `record_stream` bumps it too, for the fence it needs).
    pub(in crate::pool) marks: u64,
    /// Marks covered by a recorded fence.
    pub(in crate::pool) fenced: u64,
    /// A stream call used this bucket's stream since the last release point that may
    /// synchronize the device (trim, finish): its stream may be capturing now, so
    /// such a release point asks it first. Cleared there for buckets left empty, so
    /// a stream destroyed after a trim is never passed to the driver again.
    pub(in crate::pool) active: bool,
    /// `marks` at the previous fence poll of a free: memory freed after it is too
    /// fresh for a free's poll to fence (see `streams/`).
    pub(in crate::pool) polled_marks: u64,
    /// Marks whose stream work is known complete.
    pub(in crate::pool) completed: u64,
    /// Fences recorded and not yet seen complete, oldest first.
    pub(in crate::pool) fences: VecDeque<Fence>,
    /// The caller said its stream is about to be destroyed
    /// ([`Pool::forget_stream`](crate::pool::Pool::forget_stream)): no longer in `by_stream`
    /// (a new stream with the same handle gets a bucket of its own), and its stream is
    /// never passed to the driver again. Its memory and fences drain as any stream
    /// bucket's; `marks` no longer grows, so a fence never needs recording.
    pub(in crate::pool) forgotten: bool,
}

impl Bucket {
    pub(in crate::pool) fn new(kind: BucketKind) -> Bucket {
        Bucket {
            kind,
            marks: 0,
            fenced: 0,
            active: false,
            polled_marks: 0,
            completed: 0,
            fences: VecDeque::new(),
            forgotten: false,
        }
    }
}

/// A mapping freed with streams from `record_stream`: idle, out of the index until
/// the fences on those streams complete, then indexed in `bucket`.
#[derive(Debug)]
pub(in crate::pool) struct Deferred {
    pub(in crate::pool) slot: u32,
    /// (bucket of a recorded stream, mark its fence must complete).
    pub(in crate::pool) needs: Vec<(u32, u64)>,
}

/// The key of `stream` in [`State::by_stream`]: its handle, the legacy stream's two
/// (0 and `CU_STREAM_LEGACY`, 1) as 0.
pub(in crate::pool) fn stream_key(stream: Stream) -> u64 {
    if stream.is_legacy() {
        0
    } else {
        stream.0
    }
}
