//! The synchronous free: through the thread caches, or in the books, where a freed
//! mapping is retained, cached or released by the release threshold.

use crate::driver::DevicePtr;
use crate::error::Result;
use crate::pool::books::{MappingState, State, SYNC_FREED};
use crate::pool::release::Batch;
use crate::pool::{cache, Pool};
use crate::sync::{lock, MutexGuard};

impl Pool {
    /// Frees an allocation made by this pool, given its exact address.
    ///
    /// Inside a retention scope the mapping is retained idle (no driver call).
    /// Outside, it stays cached while the pool's idle bytes stay at or under the
    /// release threshold, else it is released (synchronize, unmap, release the
    /// handle, free the reservation). A release step that fails keeps the memory and
    /// is retried at the next release point; it is counted in the snapshot and does
    /// not fail the free.
    ///
    /// Concurrency: the free runs wholly before or wholly after each sleep and wake
    /// of the pointer's tag (`docs/ARCHITECTURE.md`, "Tags: sleep and wake"): its
    /// tag is looked up and checked in one step.
    ///
    /// Errors: [`Error::UnknownPointer`] for a pointer this pool did not hand out, an
    /// interior pointer, or a second free; [`Error::TagState`] while the pointer's tag
    /// (0 for the untagged functions' memory) is asleep or a sleep or wake of it runs;
    /// nothing changes then.
    ///
    /// [`Error::UnknownPointer`]: crate::Error::UnknownPointer
    /// [`Error::TagState`]: crate::Error::TagState
    pub fn free_raw(&self, ptr: DevicePtr) -> Result<()> {
        self.free_inner(ptr, None)
    }

    /// Frees `ptr` if it is live, and, with `id`, only if it is that allocation:
    /// through the thread caches when they handed it out or may hold it, else in
    /// the books.
    pub(super) fn free_inner(&self, ptr: DevicePtr, id: Option<u64>) -> Result<()> {
        let _order = self.record_order();
        // Tag 0's memory through the caches: they check its gate under their mutex.
        let gate = &self.gate;
        if let Some(freed) = self.caches.free(
            ptr,
            id,
            &self.state,
            self.rec.as_deref(),
            self.history.as_deref(),
            gate,
        ) {
            return self.after_cache_free(freed?);
        }
        let mut st = lock(&self.state);
        // The pointer's tag is entered in the hold that frees it (`tag_gate.rs`).
        let entry = self.enter_live(&mut st, ptr)?;
        let r = self.free_books(st, ptr, id);
        self.leave(entry);
        r
    }

    /// The synchronous free of `ptr` in the books (held as `st`; its tag entered).
    fn free_books(
        &self,
        mut st: MutexGuard<'_, State>,
        ptr: DevicePtr,
        id: Option<u64>,
    ) -> Result<()> {
        // Streams from `record_stream` do not matter here: the release synchronizes
        // every device.
        let (slot, _recorded) = st.free_live(ptr, id, None)?;
        if let Some(rec) = &self.rec {
            rec.free(ptr, None);
        }
        self.after_free(st, slot)
    }

    fn after_cache_free(&self, freed: cache::Freed<'_>) -> Result<()> {
        match freed {
            cache::Freed::Done => Ok(()),
            cache::Freed::Books(st, slot) => self.after_free(st, slot),
        }
    }

    /// The rest of a synchronous free in the books: idle `slot` (not yet indexed)
    /// is indexed, kept or released by the threshold.
    fn after_free(&self, st: MutexGuard<'_, State>, slot: u32) -> Result<()> {
        let mut batch = Batch::default();
        {
            // Dropped at the end of this block, before the release's driver calls.
            let mut st = st;
            let (block, seg) = {
                let m = st.mref(slot);
                (m.is_block(), m.seg)
            };
            if block {
                // Back to its heap (the synchronous heap's own), or kept whole for the
                // synchronous API (a stream heap's block); then, over the threshold,
                // its heap's handles left wholly free are released.
                st.index_insert(slot, SYNC_FREED);
                if st.counters.scope_open || st.cached_bytes() <= self.release_threshold {
                    return Ok(());
                }
                if st.mref(slot).state == MappingState::Idle {
                    // A stream heap's block, kept whole for the synchronous API (work
                    // queued before this free may still touch it): back to its heap
                    // after this release's synchronize, then its heap's free handles
                    // are released as below.
                    st.mark_releasing(slot, &mut batch);
                    st.start_release(&mut batch);
                    drop(st);
                    let _ = self.release_batch(std::mem::take(&mut batch));
                    st = lock(&self.state);
                    if st.counters.scope_open || st.cached_bytes() <= self.release_threshold {
                        return Ok(());
                    }
                }
                st.collect_heap_of(seg, &mut batch, true, Some(self.release_threshold));
                st.collect_retries(&mut batch, true);
                st.start_release(&mut batch);
                drop(st);
                let _ = self.release_batch(batch);
                return Ok(());
            }
            if st.counters.scope_open || st.cached_bytes() <= self.release_threshold {
                st.index_insert(slot, SYNC_FREED);
                return Ok(());
            }
            let m = st.mapping_mut(slot);
            m.state = MappingState::Releasing;
            batch.mappings.push((slot, *m));
            st.history_whole(slot, false);
            st.collect_retries(&mut batch, true);
            st.start_release(&mut batch);
        }
        let _ = self.release_batch(batch);
        Ok(())
    }
}
