//! The books: every mapping's state, the slot table, the pointer map, the reuse
//! index and the counters, all under the pool's one lock ([`State`]). Nothing here
//! calls the driver; the release engine (`release.rs`) and mapping creation
//! (`create.rs`) book what their driver calls did through these methods.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use super::index::ReuseIndex;
use super::segments::Segments;
use super::{ReusePolicy, Snapshot};
use crate::driver::{DevicePtr, Event, PhysicalHandle, Reservation, Stream};

/// The bucket of memory any caller may take at once: freed on a stream whose work up
/// to the free is known complete (a fence completed). Released with no synchronize.
pub(super) const ANY: u32 = 0;

/// The bucket of memory freed with the synchronous `free`: work the caller queued
/// before it may still run (the synchronous API's contract: a release synchronizes
/// the device first), so only the synchronous `allocate` takes it (as before stream
/// order existed), and it is released only after a device synchronize.
pub(super) const SYNC_FREED: u32 = 2;

/// The bucket of memory nobody may take: freed on a stream whose order the pool
/// could not track (a stream or event call failed). Released only after a device
/// synchronize, at trim, finish, destroy or an out-of-memory release.
pub(super) const HELD: u32 = 1;

/// Who may take the idle mappings of a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BucketKind {
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
    /// synchronous `free` do. Their bytes are counted by the heap (`tags.rs`).
    TagBlocks(u32),
    /// Freed during the capture with this id: reused only by allocations in it;
    /// `epoch` is the retention scope open when it was first seen (0: none), whose
    /// close releases it.
    Capture { id: u64, epoch: u64 },
}

/// An event recorded on a bucket's stream after its first `covers` frees.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fence {
    pub(super) event: Event,
    pub(super) covers: u64,
}

/// A bucket's stream-order state (see [`BucketKind`]).
#[derive(Debug)]
pub(super) struct Bucket {
    pub(super) kind: BucketKind,
    /// Frees made on the stream so far (each free's mark is this count after it;
    /// `record_stream` bumps it too, for the fence it needs).
    pub(super) marks: u64,
    /// Marks covered by a recorded fence.
    pub(super) fenced: u64,
    /// A stream call used this bucket's stream since the last release point that may
    /// synchronize the device (trim, finish): its stream may be capturing now, so
    /// such a release point asks it first. Cleared there for buckets left empty, so
    /// a stream destroyed after a trim is never passed to the driver again.
    pub(super) active: bool,
    /// `marks` at the previous fence poll of a free: memory freed after it is too
    /// fresh for a free's poll to fence (see `streams.rs`).
    pub(super) polled_marks: u64,
    /// Marks whose stream work is known complete.
    pub(super) completed: u64,
    /// Fences recorded and not yet seen complete, oldest first.
    pub(super) fences: VecDeque<Fence>,
    /// The caller said its stream is about to be destroyed
    /// ([`Pool::forget_stream`](super::Pool::forget_stream)): no longer in `by_stream`
    /// (a new stream with the same handle gets a bucket of its own), and its stream is
    /// never passed to the driver again. Its memory and fences drain as any stream
    /// bucket's; `marks` no longer grows, so a fence never needs recording.
    pub(super) forgotten: bool,
}

impl Bucket {
    pub(super) fn new(kind: BucketKind) -> Bucket {
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
pub(super) struct Deferred {
    pub(super) slot: u32,
    /// (bucket of a recorded stream, mark its fence must complete).
    pub(super) needs: Vec<(u32, u64)>,
}

/// Where a mapping is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MappingState {
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
    /// [`Segments::free`](super::segments::Segments), coalesced with free neighbours.
    HeapFree,
    /// A handle mapped in its segment (segment mode): its bytes are blocks, live or
    /// free.
    InSegment,
    /// Held by the thread caches (`cache.rs`): idle in a cache, or live through
    /// one. Counted as idle (a free block) in the books' counters; what the caches
    /// did with it is in their deltas.
    Cached,
}

/// What a slot of the books holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Piece {
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
pub(super) struct Mapping {
    pub(super) reservation: Reservation,
    pub(super) handle: PhysicalHandle,
    /// Bytes the caller asked for while live.
    pub(super) requested: u64,
    pub(super) state: MappingState,
    /// Idle after a failed synchronize or unmap: release again at the next release
    /// point.
    pub(super) retry: bool,
    /// While live: which allocation this is (the value of `allocations` when it was
    /// handed out), so that a guard frees only its own allocation.
    pub(super) alloc_id: u64,
    /// Counted in `mappings_created` (false for what a failed creation left
    /// behind), so that its final release counts in `mappings_released`.
    pub(super) created: bool,
    /// Pending: what the driver still holds.
    pub(super) mapped: bool,
    pub(super) handle_live: bool,
    pub(super) reservation_live: bool,
    /// While idle: the bucket it is (or, deferred, will be) indexed in.
    pub(super) bucket: u32,
    /// While idle in a stream bucket: its free's mark on that stream.
    pub(super) mark: u64,
    /// Its release must synchronize every device with access first (freed with the
    /// synchronous `free`, during a capture, or live at destroy); false when its
    /// stream work is known complete.
    pub(super) needs_sync: bool,
    /// The bucket of the stream of its last free (`None`: the synchronous `free`):
    /// by bucket, so that a stream with a forgotten stream's handle is another one
    /// (only counted in `cross_stream_hits`: a drained forgotten bucket given to a
    /// new stream makes a reuse of such memory by it uncounted).
    pub(super) freed_on: Option<u32>,
    /// What the slot holds.
    pub(super) piece: Piece,
    /// Blocks and handles: the segment (`NO_SEGMENT` for a whole mapping).
    pub(super) seg: u32,
    /// Blocks: the slots of the blocks just below and just above in address, in
    /// the same mapped run of the segment (`NIL` at a run's edge).
    pub(super) prev: u32,
    pub(super) next: u32,
    /// Handles: a second, retired mapping of the handle at this address (0: none).
    /// A handle lent to a segment's growing end keeps its old mapping (queued work
    /// may still touch the old address: unmapping it inside a scope could fault
    /// that work) until its release unmaps both.
    pub(super) alias: DevicePtr,
    /// The tag of the allocation while live (0: untagged), or of the tag bucket it
    /// idles in. Whole mappings only: blocks are always tag 0's.
    pub(super) tag: u32,
    /// Live, of a sleeping tag: unmapped (`handle_live`: the driver refused to
    /// release its handle, mapped again at wake), its reservation kept.
    pub(super) asleep: bool,
}

impl Mapping {
    /// A live mapping just created.
    pub(super) fn created(
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
        }
    }

    /// A block of segment `seg` at `ptr`, `size` bytes, in `state`.
    pub(super) fn block(seg: u32, ptr: DevicePtr, size: u64, state: MappingState) -> Self {
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

    pub(super) fn size(&self) -> u64 {
        self.handle.size
    }

    /// The address of a block, a handle or a whole mapping.
    pub(super) fn ptr(&self) -> DevicePtr {
        self.reservation.ptr
    }

    pub(super) fn is_block(&self) -> bool {
        self.piece == Piece::Block
    }
}

/// No slot (an address neighbour at a run's edge, a segment's unknown tail).
pub(super) const NIL: u32 = u32::MAX;

/// The segment of a whole mapping: none.
pub(super) const NO_SEGMENT: u32 = u32::MAX;

/// Hashes granularity-aligned device pointers: one multiply, no per-call state.
#[derive(Default)]
pub(super) struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // Pointers are multiples of the granularity: fold the high bits down so the
        // table's low bits vary.
        let x = (v ^ (v >> 21)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 32);
    }
}

/// The key of `stream` in [`State::by_stream`]: its handle, the legacy stream's two
/// (0 and `CU_STREAM_LEGACY`, 1) as 0.
pub(super) fn stream_key(stream: Stream) -> u64 {
    if stream.is_legacy() {
        0
    } else {
        stream.0
    }
}

pub(super) type PtrMap = HashMap<u64, u32, BuildHasherDefault<PtrHasher>>;

/// The books, under the pool's one lock.
pub(super) struct State {
    pub(super) slots: Vec<Option<Mapping>>,
    pub(super) free_slots: Vec<u32>,
    pub(super) live: PtrMap,
    pub(super) idle: ReuseIndex,
    /// Idle slots marked `retry` (may hold stale entries: checked on use).
    pub(super) retry: Vec<u32>,
    /// Pending slots.
    pub(super) pending: Vec<u32>,
    pub(super) counters: Snapshot,
    /// Incremented by every `retention_begin`: names the open scope, so that a
    /// [`RetentionScope`] guard closes only the scope it opened.
    pub(super) scope_epoch: u64,
    /// Stream-order buckets, indexed by bucket number ([`ANY`], [`HELD`],
    /// [`SYNC_FREED`], then
    /// streams and captures as first seen).
    pub(super) buckets: Vec<Bucket>,
    /// Bucket of each stream seen (by raw handle; the legacy stream as 0), hashed
    /// like pointers (stream handles are driver pointers): on every stream call.
    pub(super) by_stream: PtrMap,
    /// Bucket of each capture seen.
    pub(super) by_capture: HashMap<u64, u32>,
    /// The buckets of the streams given to `record_stream`, by live slot: by bucket,
    /// not handle, so that a stream forgotten since (`Pool::forget_stream`) is
    /// still the one waited on, not a new stream that got its handle.
    pub(super) recorded: HashMap<u32, Vec<u32>>,
    /// Mappings waiting on recorded streams' fences.
    pub(super) deferred: Vec<Deferred>,
    /// Events whose fence completed, for reuse.
    pub(super) spare_events: Vec<Event>,
    /// The pinned host buffer of the last offloaded tag's wake, kept for the next
    /// offload sleep of the same size (a sleep/wake loop offloads the same
    /// allocations each time: pinning them again cost 5.7 of a 5.9 s sleep of 10 GiB
    /// on the H200). [`Pool::trim`](super::Pool::trim) and destroy free it.
    pub(super) spare_host: Option<crate::driver::HostBuffer>,
    /// The pool's blocking stream, for fences after frees on the legacy stream.
    pub(super) fence_stream: Option<Stream>,
    /// Captures open on the pool's streams when the open scope began: their memory
    /// is not the scope's.
    pub(super) pre_scope_captures: Vec<u64>,
    /// Frees over the release threshold until the next event poll.
    pub(super) poll_countdown: u32,
    /// Frees between event polls (doubles up to a bound while polls find nothing).
    pub(super) poll_interval: u32,
    /// Release batches collected and not yet booked: their driver calls (a
    /// synchronize, unmaps, releases) may be running outside the lock. A retention
    /// scope's `begin` waits for this to reach 0 (the scope barrier).
    pub(super) releases_running: u32,
    /// Segment mode's heaps and segments (empty otherwise).
    pub(super) segs: Segments,
    /// Device synchronizes started by release batches (each batch that runs one
    /// takes the next number).
    pub(super) sync_ticket: u64,
    /// The highest such number whose synchronize completed: memory merged into a
    /// heap while fewer had started is covered by it.
    pub(super) synced: u64,
    /// The thread caches' counter changes made by threads that have no cache (see
    /// `cache.rs`).
    pub(super) tier_deltas: super::cache::Deltas,
    /// Slots in the `Cached` state.
    pub(super) tier_slots: usize,
    /// Per-tag books (issue 15, `tags.rs`): tags other than 0 as first used, and 0
    /// once it is slept or counted.
    pub(super) tags: HashMap<u32, super::tags::TagBooks>,
    /// Recorded lines held back for the line of the call whose locked section
    /// learnt them ([`super::record::Held`]).
    pub(super) rec_held: super::record::Held,
}

impl State {
    /// Takes the kept host buffer ([`State::spare_host`]) when `keep(buffer)` says
    /// so, keeping `host_kept_bytes` in step.
    pub(super) fn take_spare_host(
        &mut self,
        keep: impl FnOnce(&crate::driver::HostBuffer) -> bool,
    ) -> Option<crate::driver::HostBuffer> {
        let h = self.spare_host.take_if(|h| keep(h))?;
        self.counters.host_kept_bytes -= h.size;
        Some(h)
    }

    /// Keeps `h` as the host buffer for the next offload; returns the one kept
    /// before (for the caller to free).
    pub(super) fn keep_spare_host(
        &mut self,
        h: crate::driver::HostBuffer,
    ) -> Option<crate::driver::HostBuffer> {
        let old = self.take_spare_host(|_| true);
        self.counters.host_kept_bytes += h.size;
        self.spare_host = Some(h);
        old
    }

    pub(super) fn new(granularity: u64) -> Self {
        State {
            slots: Vec::new(),
            free_slots: Vec::new(),
            live: PtrMap::default(),
            idle: ReuseIndex::default(),
            retry: Vec::new(),
            pending: Vec::new(),
            counters: Snapshot {
                granularity_bytes: granularity,
                ..Snapshot::default()
            },
            scope_epoch: 0,
            releases_running: 0,
            buckets: vec![
                Bucket::new(BucketKind::Any),
                Bucket::new(BucketKind::Held),
                Bucket::new(BucketKind::SyncFreed),
            ],
            by_stream: PtrMap::default(),
            by_capture: HashMap::new(),
            recorded: HashMap::new(),
            deferred: Vec::new(),
            spare_events: Vec::new(),
            spare_host: None,
            fence_stream: None,
            pre_scope_captures: Vec::new(),
            poll_countdown: 1,
            poll_interval: 1,
            segs: Segments::default(),
            sync_ticket: 0,
            synced: 0,
            tier_deltas: super::cache::Deltas::default(),
            tier_slots: 0,
            tags: HashMap::new(),
            rec_held: super::record::Held::default(),
        }
    }

    /// Indexes idle `slot` in `bucket`, counting its bytes where the bucket's kind
    /// says.
    ///
    /// A block whose bucket makes it safe for its heap's own stream (the heap's home
    /// bucket, or [`ANY`]) goes back to its heap's free space instead, coalesced.
    pub(super) fn index_insert(&mut self, slot: u32, bucket: u32) {
        let bucket = self.tag_bucket_for(slot, bucket);
        let m = self.mapping_mut(slot);
        m.bucket = bucket;
        let size = m.size();
        if m.piece == Piece::Block && self.block_to_heap(slot, bucket) {
            return;
        }
        self.idle.insert(slot, bucket, size);
        self.bucket_bytes(bucket, size, true);
    }

    /// Takes `slot` out of the index if it is there; returns whether it was.
    pub(super) fn index_remove(&mut self, slot: u32) -> bool {
        match self.idle.bucket_of(slot) {
            Some(bucket) => {
                self.idle.remove(slot);
                let size = self.mapping(slot).size();
                self.bucket_bytes(bucket, size, false);
                true
            }
            None => false,
        }
    }

    /// Adds (or removes) `size` bytes of `bucket` to (from) the snapshot's counter
    /// for its kind.
    pub(super) fn bucket_bytes(&mut self, bucket: u32, size: u64, add: bool) {
        let kind = self.buckets.get(bucket as usize).map(|b| b.kind);
        if let Some(BucketKind::Tag(t)) = kind {
            self.tag_idle_bytes(t, size, add);
            return;
        }
        let c = &mut self.counters;
        let counter = match kind {
            Some(BucketKind::Tag(_) | BucketKind::TagBlocks(_)) => return,
            Some(BucketKind::Stream(_) | BucketKind::Held) => &mut c.event_wait_bytes,
            Some(BucketKind::Capture { .. }) => &mut c.capture_held_bytes,
            Some(BucketKind::Any | BucketKind::SyncFreed) | None => return,
        };
        if add {
            *counter += size;
        } else {
            *counter -= size;
        }
    }

    /// The bucket of `stream` (the legacy stream's handles 0 and 1 share one),
    /// made on first use, and marked used ([`Bucket::active`]).
    pub(super) fn stream_bucket(&mut self, stream: Stream) -> u32 {
        let b = self.stream_bucket_unmarked(stream);
        self.buckets[b as usize].active = true;
        b
    }

    /// The bucket of `stream`, made on first use (a drained forgotten stream's bucket
    /// again when there is one, `stream_forget.rs`), not marked used: `record_stream`
    /// names a stream no call of the pool's runs on.
    pub(super) fn stream_bucket_unmarked(&mut self, stream: Stream) -> u32 {
        let key = stream_key(stream);
        if let Some(&b) = self.by_stream.get(&key) {
            return b;
        }
        let kind = BucketKind::Stream(Stream(key));
        let b = match self.drained_forgotten_bucket() {
            Some(b) => {
                self.reuse_forgotten_bucket(b, kind);
                b
            }
            None => {
                self.buckets.push(Bucket::new(kind));
                (self.buckets.len() - 1) as u32
            }
        };
        self.by_stream.insert(key, b);
        b
    }

    /// The bucket of capture `id`, made (and counted in `captures_seen`) on first
    /// use, with the retention scope open now (none if the capture was already open
    /// on one of the pool's streams when that scope began).
    pub(super) fn capture_bucket(&mut self, id: u64) -> u32 {
        if let Some(&b) = self.by_capture.get(&id) {
            return b;
        }
        let epoch = if self.counters.scope_open && !self.pre_scope_captures.contains(&id) {
            self.scope_epoch
        } else {
            0
        };
        let b = self.buckets.len() as u32;
        self.buckets
            .push(Bucket::new(BucketKind::Capture { id, epoch }));
        self.by_capture.insert(id, b);
        self.counters.captures_seen += 1;
        b
    }

    pub(super) fn mapping(&self, slot: u32) -> Mapping {
        match self.slots.get(slot as usize) {
            Some(Some(m)) => *m,
            // Every slot in the books' sets is occupied; this is unreachable unless
            // the books are corrupt, which the invariant tests rule out.
            _ => unreachable_slot(slot),
        }
    }

    /// The mapping in `slot`, borrowed (no copy of the whole record).
    pub(super) fn mref(&self, slot: u32) -> &Mapping {
        match self.slots.get(slot as usize) {
            Some(Some(m)) => m,
            _ => unreachable_slot(slot),
        }
    }

    pub(super) fn mapping_mut(&mut self, slot: u32) -> &mut Mapping {
        match self.slots.get_mut(slot as usize) {
            Some(Some(m)) => m,
            _ => unreachable_slot(slot),
        }
    }

    pub(super) fn add_slot(&mut self, m: Mapping) -> u32 {
        if let Some(s) = self.free_slots.pop() {
            self.slots[s as usize] = Some(m);
            s
        } else {
            self.slots.push(Some(m));
            (self.slots.len() - 1) as u32
        }
    }

    pub(super) fn remove_slot(&mut self, slot: u32) {
        self.slots[slot as usize] = None;
        self.free_slots.push(slot);
    }

    pub(super) fn add_physical(&mut self, handle_bytes: u64, reserved_bytes: u64) {
        let c = &mut self.counters;
        c.physical_bytes += handle_bytes;
        c.reserved_bytes += reserved_bytes;
        c.peak_physical_bytes = c.peak_physical_bytes.max(c.physical_bytes);
    }

    /// Frees live `ptr` (with `id`, only if it is that allocation): makes its slot
    /// idle ([`State::make_idle`]) and returns it with the buckets of the streams
    /// `record_stream` gave it. Errors: [`Error::UnknownPointer`](crate::Error::UnknownPointer),
    /// nothing changed.
    pub(super) fn free_live(
        &mut self,
        ptr: DevicePtr,
        id: Option<u64>,
    ) -> crate::Result<(u32, Option<Vec<u32>>)> {
        let unknown = crate::Error::UnknownPointer { ptr };
        // One hash lookup on the common path: removed first, put back on a mismatch.
        let slot = self.live.remove(&ptr).ok_or(unknown)?;
        if id.is_some_and(|id| self.mref(slot).alloc_id != id) {
            self.live.insert(ptr, slot);
            return Err(crate::Error::UnknownPointer { ptr });
        }
        self.make_idle(slot);
        let recorded = if self.recorded.is_empty() {
            None
        } else {
            self.recorded.remove(&slot)
        };
        Ok((slot, recorded))
    }

    /// Makes live `slot`, already taken out of the pointer map, idle (not yet
    /// indexed): counted as
    /// freed, needing a device synchronize before release until a stream free says
    /// otherwise.
    pub(super) fn make_idle(&mut self, slot: u32) {
        self.untag_live(slot);
        let m = self.mapping_mut(slot);
        m.state = MappingState::Idle;
        m.needs_sync = true;
        m.freed_on = None;
        let (size, requested, block) = (m.size(), m.requested, m.is_block());
        m.requested = 0;
        self.counters.frees += 1;
        self.count_no_longer_live(size, requested, block);
    }

    /// Moves an allocation of `size` bytes (`requested` asked) out of the live
    /// counters: a block's bytes to the free block bytes, a whole mapping's to idle.
    pub(super) fn count_no_longer_live(&mut self, size: u64, requested: u64, block: bool) {
        let c = &mut self.counters;
        c.live_count -= 1;
        c.live_requested_bytes -= requested;
        if block {
            c.block_live_count -= 1;
            c.block_live_bytes -= size;
            c.block_free_bytes += size;
        } else {
            c.live_mapped_bytes -= size;
            c.idle_count += 1;
            c.idle_bytes += size;
        }
    }

    /// Makes `slot` live for a caller who asked for `requested` bytes; returns its
    /// pointer.
    pub(super) fn make_live(&mut self, slot: u32, requested: u64) -> DevicePtr {
        let m = self.mapping_mut(slot);
        // Tag 0's until a tagged allocation claims it (`tags.rs`).
        m.tag = 0;
        m.state = MappingState::Live;
        m.requested = requested;
        m.retry = false;
        let (ptr, size, block) = (m.reservation.ptr, m.size(), m.is_block());
        self.live.insert(ptr, slot);
        let c = &mut self.counters;
        c.live_count += 1;
        c.live_requested_bytes += requested;
        if block {
            c.block_live_count += 1;
            c.block_live_bytes += size;
            c.block_free_bytes -= size;
        } else {
            c.live_mapped_bytes += size;
            c.peak_live_mapped_bytes = c.peak_live_mapped_bytes.max(c.live_mapped_bytes);
        }
        c.allocations += 1;
        let id = c.allocations;
        self.mapping_mut(slot).alloc_id = id;
        ptr
    }

    /// Takes an idle mapping of `bucket` that fits `rounded` bytes under `policy`,
    /// makes it live.
    pub(super) fn take_idle(
        &mut self,
        bucket: u32,
        rounded: u64,
        requested: u64,
        policy: ReusePolicy,
        max_size: u64,
    ) -> Option<DevicePtr> {
        let (slot, size) = match policy {
            ReusePolicy::None => return None,
            ReusePolicy::Exact => (self.idle.take_exact(bucket, rounded)?, rounded),
            ReusePolicy::BestFit | ReusePolicy::Segments => {
                self.idle.take_best_fit(bucket, rounded, max_size)?
            }
        };
        Some(self.hand_out(slot, size, rounded, requested, false))
    }

    /// Takes the smallest idle mapping of `bucket` of at least `rounded` bytes,
    /// whatever its size, and makes it live: what the pool does before failing with
    /// (or releasing memory because of) an out-of-memory, because the policy's bound
    /// chooses between idle mappings and is no reason to fail while one would serve.
    pub(super) fn take_forced(
        &mut self,
        bucket: u32,
        rounded: u64,
        requested: u64,
    ) -> Option<DevicePtr> {
        let (slot, size) = self.idle.take_best_fit(bucket, rounded, u64::MAX)?;
        Some(self.hand_out(slot, size, rounded, requested, true))
    }

    /// Books a reuse of `slot` (already out of the index, `size` bytes, from its
    /// bucket) and makes it live.
    pub(super) fn hand_out(
        &mut self,
        slot: u32,
        size: u64,
        rounded: u64,
        requested: u64,
        forced: bool,
    ) -> DevicePtr {
        let m = self.mapping(slot);
        self.bucket_bytes(m.bucket, size, false);
        let c = &mut self.counters;
        if !m.is_block() {
            c.idle_count -= 1;
            c.idle_bytes -= size;
        }
        c.reuse_hits += 1;
        if forced {
            c.reuse_forced_hits += 1;
        }
        if size == rounded {
            c.reuse_exact_hits += 1;
        }
        self.make_live(slot, requested)
    }
}

#[cold]
pub(super) fn unreachable_slot(slot: u32) -> ! {
    // Not reachable through the public API: the books only name occupied slots.
    panic!("flare-package: internal error: slot {slot} is empty")
}
