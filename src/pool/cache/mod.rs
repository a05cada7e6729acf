//! Thread caches (issue 13): the tier in front of the books that lets reuse scale
//! with cores.
//!
//! Each thread that uses a pool gets a cache: a bounded list (entries and bytes) of
//! idle allocations freed with the synchronous `free`. An `allocate` pops a fitting
//! entry from the caller's cache and a `free` pushes to it, under the cache's own
//! mutex, which only its thread takes on those paths (a snapshot or a drain takes
//! it too, rarely): no lock and no counter shared between threads is touched. The
//! pointer is found through the lock-free [`Table`]; a free of memory that another
//! thread's cache handed out goes on that cache's remote list (a lock-free stack of
//! addresses linked through the table), which its owner takes whole on a miss.
//!
//! # Accounting
//! A slot held by the caches is `Cached` in the books, which count it as idle (a
//! free block, in segment mode) whatever the caches did with it since: the books'
//! counters stay consistent with the books' states, so a books step never
//! underflows a counter. What the caches did (hand-outs and frees, entries held) is
//! kept as [`Deltas`] per cache; a snapshot takes every cache's mutex, then the
//! books', and adds the deltas to the books' counters: exact while threads run.
//! [`Caches::settle`] (a scope's end, trim, out-of-memory, destroy) drains every
//! cache into the books, gives the books the allocations still live through the
//! caches, and folds the deltas in: the books' counters are then exact on their own.
//!
//! # When caches hold memory
//! Only while nothing would be released anyway: a retention scope is open, or the
//! release threshold is `u64::MAX` (the `open` flag, read under the cache's mutex).
//! Closing the flag (a scope's end) and then settling, with every cache's mutex
//! held, leaves nothing in a cache: a free that saw the flag open pushed before the
//! settle took its cache's mutex, and one after it sees the flag closed.
//!
//! Lock order: the registry, caches in index order, then the books. A thread holds
//! at most its own cache's mutex when it takes the books'; the registry is taken
//! only to register a cache (a thread's first call) and by snapshots and settles.

mod allocate;
mod deltas;
mod drain;
mod free;
mod live;
mod registry;

pub(in crate::pool) use deltas::Deltas;

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use super::books::{MappingState, State};
use super::steps::{Stamp, StepClock};
use super::table::{self, Table, Tlb, LIVE};
use crate::driver::DevicePtr;
use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::sync::{thread_local, Mutex, MutexGuard};

/// Thread caches per pool: threads beyond this many at once use the books.
#[cfg(not(flare_loom))]
pub(super) const MAX_CACHES: usize = 256;
#[cfg(flare_loom)]
pub(super) const MAX_CACHES: usize = 4;

/// Set in the allocation key a guard holds for memory handed out by a cache (the
/// books' keys are allocation counts, far below it): the two never collide.
pub(super) const TIER_KEY: u64 = 1 << 63;

/// An idle allocation in a cache.
#[derive(Clone, Copy, Debug)]
struct Held {
    ptr: DevicePtr,
    slot: u32,
    size: u64,
    block: bool,
}

/// What an allocation asks of a cache.
#[derive(Clone, Copy, Debug)]
pub(super) struct Want {
    /// A block (segment mode) or a whole mapping.
    pub(super) block: bool,
    /// The rounded size, bytes: the smallest entry that serves.
    pub(super) rounded: u64,
    /// The policy's waste bound, percent of `rounded` (`None`: exactly `rounded`);
    /// the largest entry taken is computed only when a larger one is met.
    pub(super) waste_percent: Option<u64>,
    /// Bytes asked.
    pub(super) requested: u64,
}

/// A cache's contents, under its mutex.
#[derive(Default)]
struct Inner {
    entries: Vec<Held>,
    bytes: u64,
    d: Deltas,
    /// The leaf of the table this thread used last.
    tlb: Tlb,
    /// Sequence numbers reserved for this cache's hand-outs (`steps.rs`): the next,
    /// and the end of the reservation.
    seq_next: u64,
    seq_end: u64,
}

impl Inner {
    /// Whether entry `e` serves `w` (its kind, at least the rounded size, within the
    /// policy's bound).
    fn fits_want(&self, e: &Held, w: &Want) -> bool {
        e.block == w.block
            && e.size >= w.rounded
            && (e.size == w.rounded
                || w.waste_percent
                    .is_some_and(|pct| e.size <= super::max_fit(w.rounded, pct)))
    }

    /// The entry that serves `w`: one of exactly the rounded size (the most recently
    /// freed), else the smallest within the policy's bound.
    fn find(&self, w: &Want) -> Option<usize> {
        let mut best: Option<(usize, u64)> = None;
        let mut max = None;
        for (i, e) in self.entries.iter().enumerate().rev() {
            if e.block != w.block || e.size < w.rounded {
                continue;
            }
            if e.size == w.rounded {
                return Some(i);
            }
            // No bound (exact, blocks): only an entry of the exact size serves, and
            // one may come later in the list.
            let Some(pct) = w.waste_percent else {
                continue;
            };
            if e.size > *max.get_or_insert_with(|| super::max_fit(w.rounded, pct)) {
                continue;
            }
            if best.is_none_or(|(_, s)| e.size < s) {
                best = Some((i, e.size));
            }
        }
        best.map(|(i, _)| i)
    }

    /// The stamp of a hand-out now: the next reserved sequence number (reserving
    /// more from `clock` when none is left) and the steps.
    fn stamp(&mut self, clock: &StepClock) -> Stamp {
        if self.seq_next == self.seq_end {
            self.seq_next = clock.reserve();
            self.seq_end = self.seq_next.saturating_add(crate::growth::SEQ_SKEW);
        }
        let seq = self.seq_next;
        self.seq_next += 1;
        Stamp {
            seq,
            steps: clock.steps(),
        }
    }

    fn push(&mut self, e: Held) {
        self.bytes += e.size;
        self.entries.push(e);
    }
}

/// One thread's cache.
pub(super) struct ThreadCache {
    /// 1-based index in its pool's registry (the table's owner field).
    id: u16,
    inner: Mutex<Inner>,
    /// Head of the remote list: the address of the latest entry freed by another
    /// thread (0: empty), linked through [`Entry::next`](super::table::Entry::next).
    remote: AtomicU64,
    /// Entries and bytes on the remote list (raised before a push, lowered by the
    /// owner after it took the list): the list is bounded like the cache, so what
    /// other threads free of this thread's memory cannot pile up while it does not
    /// allocate (a review found 2048 entries, 4 GiB, in a cache of 1 entry).
    remote_len: AtomicUsize,
    remote_bytes: AtomicU64,
    /// Its thread exited: the next thread to need a cache adopts it.
    orphan: AtomicBool,
    /// Its pool's count of orphaned caches (raised when this one's thread exits).
    orphans: Arc<AtomicUsize>,
    /// Its pool is gone: thread-locals drop it at their next registration.
    dead: AtomicBool,
}

/// A thread's hold on a cache: marks it orphaned when the thread exits.
struct Local(Arc<ThreadCache>);

impl Drop for Local {
    fn drop(&mut self) {
        self.0.orphan.store(true, Ordering::Release);
        self.0.orphans.fetch_add(1, Ordering::Release);
    }
}

#[cfg(not(flare_loom))]
thread_local! {
    /// This thread's caches, by pool id.
    static LOCAL: RefCell<Vec<(u64, Local)>> = const { RefCell::new(Vec::new()) };
}

// Loom's `thread_local!` takes no `const` initialiser.
#[cfg(flare_loom)]
thread_local! {
    /// This thread's caches, by pool id.
    static LOCAL: RefCell<Vec<(u64, Local)>> = RefCell::new(Vec::new());
}

/// Ids of pools, for the thread-locals (never reused).
static NEXT_POOL_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// What a free did through the caches.
pub(super) enum Freed<'a> {
    /// Held by a cache (the caller's, or the owner's remote list).
    Done,
    /// Freed, out of the caches: the books' tail of a free goes on with `slot`
    /// (idle, not yet indexed), under the books' lock.
    Books(MutexGuard<'a, State>, u32),
}

/// The thread caches of one pool.
pub(super) struct Caches {
    /// Thread caches are used at all (entries above 0, a reusing policy).
    pub(super) enabled: bool,
    max_entries: usize,
    max_bytes: u64,
    /// Caches may hold memory now (see the module's doc).
    open: AtomicBool,
    id: u64,
    slots: Box<[OnceLock<Arc<ThreadCache>>]>,
    /// Registry slots ever filled (a high-water mark).
    used: AtomicUsize,
    /// Caches orphaned and not yet adopted: with every registry slot filled, a
    /// thread without a cache looks for one only when this is not 0 (else each of
    /// its calls would take the registry lock and scan every slot).
    orphans: Arc<AtomicUsize>,
    /// Held while a cache is registered or adopted, and by [`Caches::lock_all`]: a
    /// snapshot or a settle sees every cache that can hold anything.
    registry: Mutex<()>,
    pub(super) table: Table,
}

impl Caches {
    pub(super) fn new(enabled: bool, max_entries: u32, max_bytes: u64) -> Caches {
        Caches {
            enabled,
            max_entries: max_entries as usize,
            max_bytes,
            open: AtomicBool::new(false),
            id: NEXT_POOL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            slots: (0..MAX_CACHES).map(|_| OnceLock::new()).collect(),
            used: AtomicUsize::new(0),
            orphans: Arc::new(AtomicUsize::new(0)),
            registry: Mutex::new(()),
            table: Table::default(),
        }
    }

    /// Opens or closes the caches (a scope began or ended). Closing is followed by a
    /// [`Caches::settle`], which empties them.
    pub(super) fn set_open(&self, open: bool) {
        self.open.store(self.enabled && open, Ordering::SeqCst);
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    fn fits(&self, g: &Inner, size: u64) -> bool {
        g.entries.len() < self.max_entries && g.bytes.saturating_add(size) <= self.max_bytes
    }

    /// Whether the caches may hold a free now (a hint, read again under the cache's
    /// mutex).
    pub(super) fn may_hold(&self) -> bool {
        self.enabled && self.is_open()
    }

    /// The allocation key of `ptr` if a cache handed it out and it is live.
    pub(super) fn key_of(&self, ptr: DevicePtr) -> Option<u64> {
        let w = self.table.get(ptr)?.word.load(Ordering::Acquire);
        (table::state(w) == LIVE).then_some(table::generation(w) | TIER_KEY)
    }
}

/// Makes cached `slot` idle in the books (not yet indexed): its release needs a
/// device synchronize first (freed with the synchronous `free`).
fn to_books(st: &mut State, slot: u32) {
    debug_assert_eq!(
        st.mref(slot).state,
        MappingState::Cached,
        "to_books of slot {slot}"
    );
    st.tier_slots -= 1;
    let m = st.mapping_mut(slot);
    m.state = MappingState::Idle;
    m.needs_sync = true;
    m.freed_on = None;
    m.requested = 0;
}
