//! An allocation served by the calling thread's cache, and memory the books hand
//! out made live through it.

use super::{to_books, Caches, Inner, ThreadCache, Want, TIER_KEY};
use crate::driver::DevicePtr;
use crate::pool::books::{MappingState, State, SYNC_FREED};
use crate::pool::segments::home_of;
use crate::pool::steps::StepClock;
use crate::pool::table::LIVE;
use crate::pool::tag_gate::TagGate;
use crate::pool::{table, SEGMENT_SMALL_MAX_BYTES};
use crate::sync::atomic::Ordering;
use crate::sync::{lock, Mutex};

impl Caches {
    /// An allocation from the calling thread's cache: its address and the guard's
    /// key. No driver call, no lock but the cache's own. None while tag 0 is closed
    /// (`gate`, read under the cache's mutex: `tag_gate.rs`).
    pub(in crate::pool) fn pop(
        &self,
        w: &Want,
        state: &Mutex<State>,
        gate: &TagGate,
        clock: &StepClock,
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
            let stamp = g.stamp(clock);
            let inner = &mut *g;
            let generation = inner.tlb.with(&self.table, e.ptr, true, |entry| {
                let word = entry.word.load(Ordering::Relaxed);
                let generation = table::next_generation(word);
                entry.requested.store(w.requested, Ordering::Relaxed);
                entry.seq.store(stamp.seq, Ordering::Relaxed);
                entry.steps.store(stamp.steps, Ordering::Relaxed);
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
    pub(in crate::pool) fn adopt_live(&self, ptr: DevicePtr, state: &Mutex<State>) -> Option<u64> {
        self.with_local(state, |c| {
            let mut g = lock(&c.inner);
            if !self.is_open() {
                return None;
            }
            let mut st = lock(state);
            let slot = *st.live.get(&ptr)?;
            let m = st.mref(slot);
            let (size, requested, block, stamp) = (m.size(), m.requested, m.is_block(), m.stamp);
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
            entry.seq.store(stamp.seq, Ordering::Relaxed);
            entry.steps.store(stamp.steps, Ordering::Relaxed);
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
}
