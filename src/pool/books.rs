//! The books: every mapping's state, the slot table, the pointer map, the reuse
//! index and the counters, all under the pool's one lock ([`State`]). Nothing here
//! calls the driver; the release engine (`release.rs`) and mapping creation
//! (`create.rs`) book what their driver calls did through these methods.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::index::ReuseIndex;
use super::{ReusePolicy, Snapshot};
use crate::driver::{DevicePtr, PhysicalHandle, Reservation};

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
}

impl Mapping {
    pub(super) fn size(&self) -> u64 {
        self.handle.size
    }
}

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
    /// Release batches collected and not yet booked: their driver calls (a
    /// synchronize, unmaps, releases) may be running outside the lock. A retention
    /// scope's `begin` waits for this to reach 0 (the scope barrier).
    pub(super) releases_running: u32,
}

impl State {
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
        }
    }

    pub(super) fn mapping(&self, slot: u32) -> Mapping {
        match self.slots.get(slot as usize) {
            Some(Some(m)) => *m,
            // Every slot in the books' sets is occupied; this is unreachable unless
            // the books are corrupt, which the invariant tests rule out.
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

    /// Makes `slot` live for a caller who asked for `requested` bytes; returns its
    /// pointer.
    pub(super) fn make_live(&mut self, slot: u32, requested: u64) -> DevicePtr {
        let m = self.mapping_mut(slot);
        m.state = MappingState::Live;
        m.requested = requested;
        m.retry = false;
        let (ptr, size) = (m.reservation.ptr, m.size());
        self.live.insert(ptr, slot);
        let c = &mut self.counters;
        c.live_count += 1;
        c.live_requested_bytes += requested;
        c.live_mapped_bytes += size;
        c.peak_live_mapped_bytes = c.peak_live_mapped_bytes.max(c.live_mapped_bytes);
        c.allocations += 1;
        let id = c.allocations;
        self.mapping_mut(slot).alloc_id = id;
        ptr
    }

    /// Takes an idle mapping that fits `rounded` bytes under `policy`, makes it live.
    pub(super) fn take_idle(
        &mut self,
        rounded: u64,
        requested: u64,
        policy: ReusePolicy,
        max_size: u64,
    ) -> Option<DevicePtr> {
        let (slot, size) = match policy {
            ReusePolicy::None => return None,
            ReusePolicy::Exact => (self.idle.take_exact(rounded)?, rounded),
            ReusePolicy::BestFit => self.idle.take_best_fit(rounded, max_size)?,
        };
        let c = &mut self.counters;
        c.idle_count -= 1;
        c.idle_bytes -= size;
        c.reuse_hits += 1;
        if size == rounded {
            c.reuse_exact_hits += 1;
        }
        Some(self.make_live(slot, requested))
    }

    /// Takes the smallest idle mapping of at least `rounded` bytes, whatever its
    /// size, and makes it live: what the pool does before failing with (or releasing
    /// memory because of) an out-of-memory, because the policy's bound chooses
    /// between idle mappings and is no reason to fail while one would serve.
    pub(super) fn take_forced(&mut self, rounded: u64, requested: u64) -> Option<DevicePtr> {
        let (slot, size) = self.idle.take_best_fit(rounded, u64::MAX)?;
        let c = &mut self.counters;
        c.idle_count -= 1;
        c.idle_bytes -= size;
        c.reuse_hits += 1;
        c.reuse_forced_hits += 1;
        if size == rounded {
            c.reuse_exact_hits += 1;
        }
        Some(self.make_live(slot, requested))
    }
}

#[cold]
pub(super) fn unreachable_slot(slot: u32) -> ! {
    // Not reachable through the public API: the books only name occupied slots.
    panic!("flare-package: internal error: slot {slot} is empty")
}
