//! The caches back to the books: a thread's miss drains its own cache (then what
//! fits from every cache), a release point settles them all, a snapshot adds their
//! deltas.

use super::deltas::Deltas;
use super::{to_books, Caches, Held, Inner, ThreadCache, Want, TIER_KEY};
use crate::pool::books::{MappingState, State, SYNC_FREED};
use crate::pool::steps::Stamp;
use crate::pool::table::IDLE;
use crate::pool::{table, Snapshot, SEGMENT_SMALL_MAX_BYTES};
use crate::sync::atomic::Ordering;
use crate::sync::{lock, Mutex};

impl Caches {
    /// On a miss of the calling thread: its cache (remote list included) goes back
    /// to the books, then `retake` runs under the books' lock; when that did not
    /// serve, every cache goes back and `retake` runs again.
    pub(in crate::pool) fn drain_own<T>(
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
    pub(super) fn take_remote_list(&self, c: &ThreadCache) -> Vec<Held> {
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

    /// Moves every idle entry of `c` (held as `g`), remote list included, to the
    /// books' index.
    pub(super) fn drain_into(&self, c: &ThreadCache, g: &mut Inner, st: &mut State) {
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

    /// A snapshot: the books' counters plus every cache's deltas, taken with every
    /// cache's mutex and then the books' held, so it is exact while threads run.
    pub(in crate::pool) fn snapshot(&self, state: &Mutex<State>) -> Snapshot {
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
    pub(in crate::pool) fn settle(&self, state: &Mutex<State>) {
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
            let (requested, key, stamp) = match self.table.get(ptr) {
                Some(entry) => {
                    let w = entry.word.load(Ordering::Relaxed);
                    entry.word.store(
                        table::pack(IDLE, 0, table::generation(w)),
                        Ordering::Release,
                    );
                    (
                        entry.requested.load(Ordering::Relaxed),
                        table::generation(w) | TIER_KEY,
                        Stamp {
                            seq: entry.seq.load(Ordering::Relaxed),
                            steps: entry.steps.load(Ordering::Relaxed),
                        },
                    )
                }
                None => (0, 0, Stamp::default()),
            };
            let m = st.mapping_mut(slot);
            m.stamp = stamp;
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
}
