//! The books: every mapping's state, the slot table, the pointer map, the reuse
//! index and the counters, all under the pool's one lock ([`State`]). Nothing here
//! calls the driver; the release engine (`release.rs`) and mapping creation
//! (`create.rs`) book what their driver calls did through these methods.

mod buckets;
mod mapping;

pub(super) use buckets::{stream_key, Bucket, BucketKind, Deferred, Fence, ANY, HELD, SYNC_FREED};
pub(super) use mapping::{unreachable_slot, Mapping, MappingState, Piece, NIL, NO_SEGMENT};

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::index::ReuseIndex;
use super::segments::Segments;
use super::{ReusePolicy, Snapshot};
use crate::driver::{DevicePtr, Event, Stream};

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
    /// `cache/`).
    pub(super) tier_deltas: super::cache::Deltas,
    /// Slots in the `Cached` state.
    pub(super) tier_slots: usize,
    /// Per-tag books (issue 15, `tags/books.rs`): tags other than 0 as first used,
    /// and 0 once it is slept or counted.
    pub(super) tags: HashMap<u32, super::tags::TagBooks>,
    /// Recorded lines held back for the line of the call whose locked section
    /// learnt them ([`super::record::Held`]).
    pub(super) rec_held: super::record::Held,
    /// The pool's history ring (`history/`), `None` when off.
    pub(super) history: Option<std::sync::Arc<super::history::History>>,
    /// The pool's step clock: [`State::make_live`] stamps each allocation from it
    /// (`steps.rs`).
    pub(super) clock: std::sync::Arc<super::steps::StepClock>,
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

    pub(super) fn new(granularity: u64, clock: std::sync::Arc<super::steps::StepClock>) -> Self {
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
            history: None,
            clock,
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
    /// `record_stream` gave it; the free (on `stream`, `None` for the synchronous
    /// `free`) goes to the history ring, when on. Errors: [`Error::UnknownPointer`](crate::Error::UnknownPointer),
    /// nothing changed.
    pub(super) fn free_live(
        &mut self,
        ptr: DevicePtr,
        id: Option<u64>,
        stream: Option<Stream>,
    ) -> crate::Result<(u32, Option<Vec<u32>>)> {
        let unknown = crate::Error::UnknownPointer { ptr };
        // One hash lookup on the common path: removed first, put back on a mismatch.
        let slot = self.live.remove(&ptr).ok_or(unknown)?;
        if id.is_some_and(|id| self.mref(slot).alloc_id != id) {
            self.live.insert(ptr, slot);
            return Err(crate::Error::UnknownPointer { ptr });
        }
        // Before the memory can be handed out again (the lock is held).
        self.history_free(slot, super::history::raw(stream));
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
        let stamp = self.clock.stamp();
        let m = self.mapping_mut(slot);
        m.stamp = stamp;
        // Tag 0's until a tagged allocation claims it (`tags/alloc.rs`).
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
