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

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use super::books::{MappingState, State, SYNC_FREED};
use super::segments::home_of;
use super::table::{self, Entry, Table, Tlb, IDLE, LIVE};
use super::tag_gate::TagGate;
use super::{Snapshot, SEGMENT_SMALL_MAX_BYTES};
use crate::driver::DevicePtr;
use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::sync::{lock, thread_local, Mutex, MutexGuard};

/// Thread caches per pool: threads beyond this many at once use the books.
#[cfg(not(flare_loom))]
pub(super) const MAX_CACHES: usize = 256;
#[cfg(flare_loom)]
pub(super) const MAX_CACHES: usize = 4;

/// Set in the allocation key a guard holds for memory handed out by a cache (the
/// books' keys are allocation counts, far below it): the two never collide.
pub(super) const TIER_KEY: u64 = 1 << 63;

macro_rules! deltas {
    ($($f:ident),* $(,)?) => {
        /// Changes to the snapshot's counters made by one cache's hand-outs and frees
        /// (wrapping: one cache may free what another handed out; only the sum over
        /// every cache, added to the books' counters, is meaningful).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub(super) struct Deltas {
            $(pub(super) $f: u64,)*
        }

        impl Deltas {
            /// Adds these changes to `c`.
            pub(super) fn add_to(&self, c: &mut Snapshot) {
                $(c.$f = c.$f.wrapping_add(self.$f);)*
            }

            /// Moves `other`'s changes into these; `other` is zeroed.
            fn take_from(&mut self, other: &mut Deltas) {
                $(self.$f = self.$f.wrapping_add(other.$f);)*
                *other = Deltas::default();
            }
        }
    };
}

deltas!(
    allocations,
    frees,
    reuse_hits,
    reuse_exact_hits,
    live_count,
    live_requested_bytes,
    live_mapped_bytes,
    idle_count,
    idle_bytes,
    block_live_count,
    block_live_bytes,
    block_free_bytes,
    thread_cache_count,
    thread_cache_bytes,
    thread_cache_hits,
    remote_frees,
);

fn add(v: &mut u64, x: u64) {
    *v = v.wrapping_add(x);
}

fn sub(v: &mut u64, x: u64) {
    *v = v.wrapping_sub(x);
}

impl Deltas {
    /// An idle allocation of `size` bytes made live for a caller asking `requested`.
    fn handed_out(&mut self, size: u64, requested: u64, block: bool, exact: bool) {
        add(&mut self.allocations, 1);
        add(&mut self.reuse_hits, 1);
        add(&mut self.thread_cache_hits, 1);
        add(&mut self.reuse_exact_hits, u64::from(exact));
        self.made_live(size, requested, block);
    }

    /// An idle allocation made live (counted here; the books count it idle).
    fn made_live(&mut self, size: u64, requested: u64, block: bool) {
        add(&mut self.live_count, 1);
        add(&mut self.live_requested_bytes, requested);
        if block {
            add(&mut self.block_live_count, 1);
            add(&mut self.block_live_bytes, size);
            sub(&mut self.block_free_bytes, size);
        } else {
            add(&mut self.live_mapped_bytes, size);
            sub(&mut self.idle_count, 1);
            sub(&mut self.idle_bytes, size);
        }
    }

    /// A live allocation freed: the reverse of [`Deltas::handed_out`].
    fn freed(&mut self, size: u64, requested: u64, block: bool) {
        add(&mut self.frees, 1);
        sub(&mut self.live_count, 1);
        sub(&mut self.live_requested_bytes, requested);
        if block {
            sub(&mut self.block_live_count, 1);
            sub(&mut self.block_live_bytes, size);
            add(&mut self.block_free_bytes, size);
        } else {
            sub(&mut self.live_mapped_bytes, size);
            add(&mut self.idle_count, 1);
            add(&mut self.idle_bytes, size);
        }
    }

    /// An idle entry of `size` bytes joins (`joins`) or leaves the caches.
    fn held(&mut self, size: u64, joins: bool) {
        if joins {
            add(&mut self.thread_cache_count, 1);
            add(&mut self.thread_cache_bytes, size);
        } else {
            sub(&mut self.thread_cache_count, 1);
            sub(&mut self.thread_cache_bytes, size);
        }
    }
}

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
    /// thread (0: empty), linked through [`Entry::next`].
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

    /// The cache registered with index `id` (1-based).
    fn cache(&self, id: u16) -> Option<&ThreadCache> {
        self.slots
            .get(usize::from(id).checked_sub(1)?)?
            .get()
            .map(|c| &**c)
    }

    /// The registered caches, in index order.
    fn all(&self) -> impl Iterator<Item = &ThreadCache> {
        let used = self.used.load(Ordering::SeqCst).min(self.slots.len());
        self.slots[..used]
            .iter()
            .filter_map(|s| s.get().map(|c| &**c))
    }

    /// Runs `f` on the calling thread's cache (registered or adopted on first use);
    /// `None` when the thread has none (every index is taken, or its thread-locals
    /// are being destroyed).
    fn with_local<R>(&self, state: &Mutex<State>, f: impl FnOnce(&ThreadCache) -> R) -> Option<R> {
        LOCAL
            .try_with(|l| {
                {
                    let held = l.try_borrow().ok()?;
                    // `f` runs with the borrow held (it never touches `LOCAL`): no
                    // reference count is touched on the hot path.
                    if let Some((_, c)) = held.iter().find(|(id, _)| *id == self.id) {
                        return Some(f(&c.0));
                    }
                }
                let c = self.register(state)?;
                let mut held = l.try_borrow_mut().ok()?;
                held.retain(|(_, c)| !c.0.dead.load(Ordering::Relaxed));
                held.push((self.id, Local(Arc::clone(&c))));
                drop(held);
                Some(f(&c))
            })
            .ok()
            .flatten()
    }

    /// A cache for the calling thread: an orphan adopted (what its exited thread
    /// left goes back to the books first: the new thread may need other sizes), or
    /// a new one.
    fn register(&self, state: &Mutex<State>) -> Option<Arc<ThreadCache>> {
        if self.used.load(Ordering::Acquire) == MAX_CACHES
            && self.orphans.load(Ordering::Acquire) == 0
        {
            return None;
        }
        let _registry = lock(&self.registry);
        for c in self.slots.iter().filter_map(OnceLock::get) {
            if c.orphan.load(Ordering::Relaxed)
                && c.orphan
                    .compare_exchange(true, false, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                self.orphans.fetch_sub(1, Ordering::Relaxed);
                let mut g = lock(&c.inner);
                if !g.entries.is_empty() || c.remote.load(Ordering::Relaxed) != 0 {
                    self.drain_into(c, &mut g, &mut lock(state));
                }
                drop(g);
                return Some(Arc::clone(c));
            }
        }
        for (i, s) in self.slots.iter().enumerate() {
            if s.get().is_some() {
                continue;
            }
            let c = Arc::new(ThreadCache {
                id: u16::try_from(i + 1).ok()?,
                inner: Mutex::new(Inner::default()),
                remote: AtomicU64::new(0),
                remote_len: AtomicUsize::new(0),
                remote_bytes: AtomicU64::new(0),
                orphan: AtomicBool::new(false),
                orphans: Arc::clone(&self.orphans),
                dead: AtomicBool::new(false),
            });
            if s.set(Arc::clone(&c)).is_ok() {
                self.used.fetch_max(i + 1, Ordering::SeqCst);
                return Some(c);
            }
        }
        None
    }

    /// An allocation from the calling thread's cache: its address and the guard's
    /// key. No driver call, no lock but the cache's own. None while tag 0 is closed
    /// (`gate`, read under the cache's mutex: `tag_gate.rs`).
    pub(super) fn pop(
        &self,
        w: &Want,
        state: &Mutex<State>,
        gate: &TagGate,
    ) -> Option<(DevicePtr, u64)> {
        if !self.is_open() {
            return None;
        }
        self.with_local(state, |c| {
            let mut g = lock(&c.inner);
            if !self.is_open() || gate.tag0_closed() {
                return None;
            }
            // What other threads freed comes back first (a list left there would
            // grow while this thread hits its own entries).
            if c.remote.load(Ordering::Relaxed) != 0 {
                self.take_remote(c, &mut g, state);
            }
            let i = g.find(w)?;
            let e = *g.entries.get(i)?;
            let inner = &mut *g;
            let generation = inner.tlb.with(&self.table, e.ptr, true, |entry| {
                let word = entry.word.load(Ordering::Relaxed);
                let generation = table::next_generation(word);
                entry.requested.store(w.requested, Ordering::Relaxed);
                entry
                    .word
                    .store(table::pack(LIVE, c.id, generation), Ordering::Release);
                generation
            });
            inner.entries.swap_remove(i);
            inner.bytes -= e.size;
            inner.d.held(e.size, false);
            let Some(generation) = generation else {
                // Every cached address has its entry (made when it joined); keep the
                // books consistent all the same.
                let mut st = lock(state);
                to_books(&mut st, e.slot);
                st.index_insert(e.slot, SYNC_FREED);
                return None;
            };
            inner
                .d
                .handed_out(e.size, w.requested, e.block, e.size == w.rounded);
            Some((e.ptr, generation | TIER_KEY))
        })
        .flatten()
    }

    /// Makes `ptr`, just handed out by the books to the calling thread, live through
    /// its cache (when the caches are open and it may be held there): a free by any
    /// thread then brings it back to this thread's cache (its remote list), so the
    /// memory a thread allocates stays its own. Returns the guard's key. The books
    /// count it idle (`Cached`) and this cache's deltas live: the sum is unchanged.
    pub(super) fn adopt_live(&self, ptr: DevicePtr, state: &Mutex<State>) -> Option<u64> {
        self.with_local(state, |c| {
            let mut g = lock(&c.inner);
            if !self.is_open() {
                return None;
            }
            let mut st = lock(state);
            let slot = *st.live.get(&ptr)?;
            let m = st.mref(slot);
            let (size, requested, block) = (m.size(), m.requested, m.is_block());
            if block
                && (size > SEGMENT_SMALL_MAX_BYTES
                    || home_of(st.segs.segs[m.seg as usize].key) != SYNC_FREED)
            {
                return None;
            }
            let entry = self.table.get_or_make(ptr)?;
            st.live.remove(&ptr);
            st.count_no_longer_live(size, requested, block);
            let m = st.mapping_mut(slot);
            m.state = MappingState::Cached;
            m.requested = 0;
            st.tier_slots += 1;
            entry.set_slot(slot, block, size);
            let generation = table::next_generation(entry.word.load(Ordering::Relaxed));
            entry.requested.store(requested, Ordering::Relaxed);
            entry
                .word
                .store(table::pack(LIVE, c.id, generation), Ordering::Release);
            g.d.made_live(size, requested, block);
            Some(generation | TIER_KEY)
        })
        .flatten()
    }

    /// Moves the remote list of `c` (held as `g`) into its entries; what does not
    /// fit its bounds goes to the books.
    fn take_remote(&self, c: &ThreadCache, g: &mut Inner, state: &Mutex<State>) {
        let mut spill = Vec::new();
        for e in self.take_remote_list(c) {
            if self.fits(g, e.size) {
                g.push(e);
            } else {
                spill.push(e);
            }
        }
        if !spill.is_empty() {
            let mut st = lock(state);
            for e in spill {
                g.d.held(e.size, false);
                to_books(&mut st, e.slot);
                st.index_insert(e.slot, SYNC_FREED);
            }
        }
    }

    fn fits(&self, g: &Inner, size: u64) -> bool {
        g.entries.len() < self.max_entries && g.bytes.saturating_add(size) <= self.max_bytes
    }

    /// Whether the caches may hold a free now (a hint, read again under the cache's
    /// mutex).
    pub(super) fn may_hold(&self) -> bool {
        self.enabled && self.is_open()
    }

    /// A synchronous free through the caches. Memory a cache handed out goes to the
    /// caller's cache, its owner's remote list (another thread's), or (caches closed
    /// or full) back to the books; memory the books handed out goes to the caller's
    /// cache when the caches are open, it fits and it may be held there (a whole
    /// mapping, or a block of at most 1 MiB of the synchronous API's heap, with no
    /// stream recorded). `None`: the caches did not take it (the books free it;
    /// memory of another tag than 0 always); `Some(Err)`: not live, or (live through
    /// a cache) refused while tag 0 is closed (`gate`, read under the cache's mutex or
    /// the books' lock: `tag_gate.rs`); nothing changed then.
    pub(super) fn free<'a>(
        &self,
        ptr: DevicePtr,
        id: Option<u64>,
        state: &'a Mutex<State>,
        rec: Option<&super::record::Recorder>,
        gate: &TagGate,
    ) -> Option<crate::Result<Freed<'a>>> {
        if !self.enabled || (self.used.load(Ordering::Relaxed) == 0 && !self.is_open()) {
            return None;
        }
        let on_cache = self.with_local(state, |c| {
            let mut g = lock(&c.inner);
            if gate.tag0_closed() {
                return self.refuse_closed(ptr, id);
            }
            let open = self.is_open();
            let inner = &mut *g;
            let claimed = inner
                .tlb
                .with(&self.table, ptr, false, |entry| {
                    let (e, owner) = claim(entry, ptr, id)?;
                    // Recorded before the memory can be handed out again.
                    if let Some(r) = rec {
                        r.free(ptr, None);
                    }
                    let requested = entry.requested.load(Ordering::Relaxed);
                    let remote = if open && owner != c.id {
                        self.cache(owner).filter(|o| self.reserve_remote(o, e.size))
                    } else {
                        None
                    };
                    if let Some(o) = remote {
                        push_remote(o, entry, ptr);
                    }
                    Some((e, requested, remote.is_some()))
                })
                .flatten();
            let Some((e, requested, pushed)) = claimed else {
                return if open {
                    self.free_into(c, inner, ptr, id, state, rec)
                } else {
                    None
                };
            };
            inner.d.freed(e.size, requested, e.block);
            if pushed {
                inner.d.held(e.size, true);
                add(&mut inner.d.remote_frees, 1);
                return Some(Ok(Freed::Done));
            }
            if open && self.fits(inner, e.size) {
                inner.d.held(e.size, true);
                inner.push(e);
                return Some(Ok(Freed::Done));
            }
            let mut st = lock(state);
            to_books(&mut st, e.slot);
            Some(Ok(Freed::Books(st, e.slot)))
        });
        match on_cache {
            Some(r) => r,
            // No cache for this thread: the books hold its deltas.
            None => {
                let entry = self.table.get(ptr)?;
                let mut st = lock(state);
                if gate.tag0_closed() {
                    return self.refuse_closed(ptr, id);
                }
                let (e, _) = claim(entry, ptr, id)?;
                if let Some(r) = rec {
                    r.free(ptr, None);
                }
                let requested = entry.requested.load(Ordering::Relaxed);
                st.tier_deltas.freed(e.size, requested, e.block);
                to_books(&mut st, e.slot);
                Some(Ok(Freed::Books(st, e.slot)))
            }
        }
    }

    /// A free of `ptr` while tag 0 is closed: refused when a cache handed it out and
    /// it is live (tag 0's memory; `id`, if any, its key), else left to the books
    /// (`None`), which check its tag.
    fn refuse_closed<'a>(
        &self,
        ptr: DevicePtr,
        id: Option<u64>,
    ) -> Option<crate::Result<Freed<'a>>> {
        let key = self.key_of(ptr)?;
        if id.is_some_and(|id| id != key) {
            return None;
        }
        Some(Err(super::tag_gate::refused0()))
    }

    /// Frees books-live `ptr` into cache `c` (held as `g`; the caches are open) if
    /// it fits and may be held there, else leaves it idle for the books' tail. Memory
    /// of a tag other than 0, or not live, is left to the books' free (`None`), which
    /// enters its tag (`tag_gate.rs`) or answers that it is unknown.
    fn free_into<'a>(
        &self,
        c: &ThreadCache,
        g: &mut Inner,
        ptr: DevicePtr,
        id: Option<u64>,
        state: &'a Mutex<State>,
        rec: Option<&super::record::Recorder>,
    ) -> Option<crate::Result<Freed<'a>>> {
        let st = lock(state);
        let tag = st.live.get(&ptr).map(|&slot| st.mref(slot).tag);
        if tag != Some(0) {
            return None;
        }
        Some(self.free_into_books_live(c, g, ptr, id, st, rec))
    }

    /// [`Caches::free_into`] of tag 0's books-live `ptr` (the books held as `st`).
    fn free_into_books_live<'a>(
        &self,
        c: &ThreadCache,
        g: &mut Inner,
        ptr: DevicePtr,
        id: Option<u64>,
        mut st: MutexGuard<'a, State>,
        rec: Option<&super::record::Recorder>,
    ) -> crate::Result<Freed<'a>> {
        let (slot, recorded) = st.free_live(ptr, id)?;
        if let Some(r) = rec {
            r.free(ptr, None);
        }
        let m = st.mref(slot);
        let (size, block) = (m.size(), m.is_block());
        // A tagged mapping (issue 15) never enters a cache: its tag's books count it.
        let eligible = recorded.is_none()
            && m.tag == 0
            && (!block
                || (size <= SEGMENT_SMALL_MAX_BYTES
                    && home_of(st.segs.segs[m.seg as usize].key) == SYNC_FREED))
            && self.fits(g, size);
        if !eligible {
            return Ok(Freed::Books(st, slot));
        }
        let Some(entry) = self.table.get_or_make(ptr) else {
            return Ok(Freed::Books(st, slot));
        };
        let word = entry.word.load(Ordering::Relaxed);
        entry.set_slot(slot, block, size);
        entry.word.store(
            table::pack(IDLE, c.id, table::generation(word)),
            Ordering::Release,
        );
        st.mapping_mut(slot).state = MappingState::Cached;
        st.tier_slots += 1;
        g.d.held(size, true);
        g.push(Held {
            ptr,
            slot,
            size,
            block,
        });
        Ok(Freed::Done)
    }

    /// On a miss of the calling thread: its cache (remote list included) goes back
    /// to the books, then `retake` runs under the books' lock; when that did not
    /// serve, every cache goes back and `retake` runs again.
    pub(super) fn drain_own<T>(
        &self,
        w: &Want,
        state: &Mutex<State>,
        mut retake: impl FnMut(&mut State) -> Option<T>,
    ) -> Option<T> {
        let own = self
            .with_local(state, |c| {
                let mut g = lock(&c.inner);
                if g.entries.is_empty() && c.remote.load(Ordering::Relaxed) == 0 {
                    return None;
                }
                let mut st = lock(state);
                self.drain_into(c, &mut g, &mut st);
                retake(&mut st)
            })
            .flatten();
        if own.is_some() {
            return own;
        }
        // Then what every cache holds that fits (before the pool creates memory,
        // which costs a driver call anyway); the other entries stay where they are.
        // For a block of the small class (cached blocks are all of it), every
        // cached block: blocks too small one by one coalesce in their heap into a fit (a review: 512 blocks of 4 KiB freed by another
        // thread made a 1 MiB request grow the heap by a handle).
        let (_registry, mut guards) = self.lock_all();
        let mut st = lock(state);
        let mut moved = false;
        for (c, g) in &mut guards {
            self.take_remote_all(c, g);
            let mut i = 0;
            while i < g.entries.len() {
                let e = g.entries[i];
                if g.fits_want(&e, w)
                    || (w.block && e.block && w.rounded <= SEGMENT_SMALL_MAX_BYTES)
                {
                    g.entries.swap_remove(i);
                    g.bytes -= e.size;
                    g.d.held(e.size, false);
                    to_books(&mut st, e.slot);
                    st.index_insert(e.slot, SYNC_FREED);
                    moved = true;
                } else {
                    i += 1;
                }
            }
        }
        if !moved {
            return None;
        }
        retake(&mut st)
    }

    /// Moves the remote list of `c` (held as `g`) into its entries, whatever its
    /// bounds (they are drained next).
    fn take_remote_all(&self, c: &ThreadCache, g: &mut Inner) {
        for e in self.take_remote_list(c) {
            g.push(e);
        }
    }

    /// Takes the whole remote list of `c` (one swap) and lowers its counts by what
    /// it held.
    fn take_remote_list(&self, c: &ThreadCache) -> Vec<Held> {
        let mut p = c.remote.swap(0, Ordering::Acquire);
        let mut out = Vec::new();
        let mut bytes = 0u64;
        while p != 0 {
            let Some(entry) = self.table.get(p) else {
                break;
            };
            let next = entry.next.load(Ordering::Relaxed);
            let (slot, block) = entry.slot();
            let size = entry.size.load(Ordering::Relaxed);
            bytes += size;
            out.push(Held {
                ptr: p,
                slot,
                size,
                block,
            });
            p = next;
        }
        c.remote_len.fetch_sub(out.len(), Ordering::Relaxed);
        c.remote_bytes.fetch_sub(bytes, Ordering::Relaxed);
        out
    }

    /// Reserves room for one entry of `size` bytes on the remote list of `o`
    /// within the cache's bounds; false (nothing reserved) when it is full.
    fn reserve_remote(&self, o: &ThreadCache, size: u64) -> bool {
        let n = o.remote_len.fetch_add(1, Ordering::Relaxed);
        let b = o.remote_bytes.fetch_add(size, Ordering::Relaxed);
        if n < self.max_entries && b.saturating_add(size) <= self.max_bytes {
            return true;
        }
        o.remote_len.fetch_sub(1, Ordering::Relaxed);
        o.remote_bytes.fetch_sub(size, Ordering::Relaxed);
        false
    }

    /// Moves every idle entry of `c` (held as `g`), remote list included, to the
    /// books' index.
    fn drain_into(&self, c: &ThreadCache, g: &mut Inner, st: &mut State) {
        self.take_remote_all(c, g);
        for e in std::mem::take(&mut g.entries) {
            debug_assert_eq!(
                st.mref(e.slot).state,
                MappingState::Cached,
                "drain of {e:?}"
            );
            g.d.held(e.size, false);
            to_books(st, e.slot);
            st.index_insert(e.slot, SYNC_FREED);
        }
        g.bytes = 0;
    }

    /// Locks the registry, then every cache, in index order.
    fn lock_all(
        &self,
    ) -> (
        MutexGuard<'_, ()>,
        Vec<(&ThreadCache, MutexGuard<'_, Inner>)>,
    ) {
        let registry = lock(&self.registry);
        let caches = self.all().map(|c| (c, lock(&c.inner))).collect();
        (registry, caches)
    }

    /// A snapshot: the books' counters plus every cache's deltas, taken with every
    /// cache's mutex and then the books' held, so it is exact while threads run.
    pub(super) fn snapshot(&self, state: &Mutex<State>) -> Snapshot {
        let (_registry, guards) = self.lock_all();
        let mut st = lock(state);
        let mut c = st.counters;
        st.tier_deltas.add_to(&mut c);
        for (_, g) in &guards {
            g.d.add_to(&mut c);
        }
        // The peak of live mapped bytes as seen here (a hand-out by a cache between
        // two snapshots is seen at the next one).
        c.peak_live_mapped_bytes = c.peak_live_mapped_bytes.max(c.live_mapped_bytes);
        st.counters.peak_live_mapped_bytes = c.peak_live_mapped_bytes;
        c
    }

    /// Empties every cache into the books and hands the books what is still live
    /// through the caches; the deltas are folded into the books' counters. Called
    /// at every release point (a scope's end, trim, out-of-memory, destroy) and when
    /// a stream call needs a cached allocation in the books.
    pub(super) fn settle(&self, state: &Mutex<State>) {
        if !self.enabled || self.used.load(Ordering::SeqCst) == 0 {
            return;
        }
        let (_registry, mut guards) = self.lock_all();
        let mut st = lock(state);
        for (c, g) in &mut guards {
            self.drain_into(c, g, &mut st);
        }
        // What is still `Cached` is live through the caches: now books-live.
        let cached: Vec<u32> = if st.tier_slots == 0 {
            Vec::new()
        } else {
            st.slots
                .iter()
                .enumerate()
                .filter_map(|(i, m)| match m {
                    Some(m) if m.state == MappingState::Cached => Some(i as u32),
                    _ => None,
                })
                .collect()
        };
        st.tier_slots -= cached.len();
        for slot in cached {
            let ptr = st.mref(slot).ptr();
            debug_assert!(!st.live.contains_key(&ptr), "adoption of live {ptr:#x}");
            let (requested, key) = match self.table.get(ptr) {
                Some(entry) => {
                    let w = entry.word.load(Ordering::Relaxed);
                    entry.word.store(
                        table::pack(IDLE, 0, table::generation(w)),
                        Ordering::Release,
                    );
                    (
                        entry.requested.load(Ordering::Relaxed),
                        table::generation(w) | TIER_KEY,
                    )
                }
                None => (0, 0),
            };
            let m = st.mapping_mut(slot);
            m.state = MappingState::Live;
            m.requested = requested;
            m.retry = false;
            m.alloc_id = key;
            st.live.insert(ptr, slot);
        }
        let mut total = Deltas::default();
        for (_, g) in &mut guards {
            total.take_from(&mut g.d);
        }
        total.take_from(&mut st.tier_deltas);
        total.add_to(&mut st.counters);
        let c = &mut st.counters;
        c.peak_live_mapped_bytes = c.peak_live_mapped_bytes.max(c.live_mapped_bytes);
    }

    /// The pool is gone: thread-locals let go of its caches.
    pub(super) fn retire(&self) {
        self.set_open(false);
        for c in self.all() {
            c.dead.store(true, Ordering::Relaxed);
            lock(&c.inner).tlb.clear();
        }
    }

    /// The allocation key of `ptr` if a cache handed it out and it is live.
    pub(super) fn key_of(&self, ptr: DevicePtr) -> Option<u64> {
        let w = self.table.get(ptr)?.word.load(Ordering::Acquire);
        (table::state(w) == LIVE).then_some(table::generation(w) | TIER_KEY)
    }
}

/// Wins the free of live `ptr` (with `id`, only if it is that allocation): one
/// compare-and-swap on its word, so of two racing frees one wins and the other
/// finds it not live. Returns the entry as held and its owner.
fn claim(entry: &Entry, ptr: DevicePtr, id: Option<u64>) -> Option<(Held, u16)> {
    let w = entry.word.load(Ordering::Acquire);
    if table::state(w) != LIVE || id.is_some_and(|id| id != table::generation(w) | TIER_KEY) {
        return None;
    }
    let idle = table::pack(IDLE, table::owner(w), table::generation(w));
    entry
        .word
        .compare_exchange(w, idle, Ordering::AcqRel, Ordering::Acquire)
        .ok()?;
    let (slot, block) = entry.slot();
    let held = Held {
        ptr,
        slot,
        size: entry.size.load(Ordering::Relaxed),
        block,
    };
    Some((held, table::owner(w)))
}

/// Pushes `ptr` (its entry `entry`) on `o`'s remote list. Pushes and the owner's
/// take-all swap are the only operations, so the stack has no ABA problem.
fn push_remote(o: &ThreadCache, entry: &Entry, ptr: DevicePtr) {
    let mut head = o.remote.load(Ordering::Relaxed);
    loop {
        entry.next.store(head, Ordering::Relaxed);
        match o
            .remote
            .compare_exchange_weak(head, ptr, Ordering::Release, Ordering::Relaxed)
        {
            Ok(_) => return,
            Err(h) => head = h,
        }
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
