//! The release engine: batches of idle and pending mappings collected under the lock
//! ([`Batch`]), their driver calls run outside it (a synchronize of every device
//! with access when a mapping in the batch needs one, then unmap, release the
//! handle, free the reservation, in that order), and the outcomes booked back
//! ([`Outcome`]): what a refused step leaves is kept idle-for-retry or pending and
//! retried at the next release point. Mappings whose stream work is known complete
//! (a fence event completed, `streams/fences.rs`) need no synchronize.

use super::books::{BucketKind, Mapping, MappingState, Piece, State, ANY, HELD, SYNC_FREED};
use super::Pool;
use crate::driver::{DriverCall, DriverError};
use crate::error::{Error, Result};
use crate::sync::lock;

/// What one release step left behind, applied to the books under the lock.
#[derive(Clone, Copy)]
pub(super) enum Outcome {
    /// The synchronize or the unmap failed: the mapping is whole, back to idle.
    StillMapped,
    /// A lent handle's retired mapping was unmapped, then its unmap failed: still
    /// mapped (at its segment address only), back to its segment.
    AliasUnmapped,
    /// Unmapped; these parts are still held by the driver.
    Unmapped {
        handle_live: bool,
        reservation_live: bool,
    },
}

/// A batch of work for [`Pool::release_batch`], collected under the lock.
#[derive(Default)]
pub(super) struct Batch {
    /// Idle mappings marked Releasing: synchronize, then unmap, release, free.
    pub(super) mappings: Vec<(u32, Mapping)>,
    /// Pending mappings: the steps left.
    pub(super) pending: Vec<(u32, Mapping)>,
    /// The number of the device synchronize this batch runs first (`State::
    /// sync_ticket` when it was registered), 0 when it needs none.
    pub(super) sync_ticket: u64,
}

impl Batch {
    pub(super) fn is_empty(&self) -> bool {
        self.mappings.is_empty() && self.pending.is_empty()
    }
}

/// Which capture buckets a release point releases (memory freed during a capture is
/// kept for its graph until then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Captures {
    /// None (an out-of-memory release, a free over the threshold).
    Keep,
    /// Those first seen while the retention scope with this epoch was open (its
    /// finish or abort).
    OfScope(u64),
    /// All (trim, destroy).
    All,
}

impl State {
    /// Registers `batch` as a release about to run outside the lock (when it has
    /// anything to release): [`Pool::release_batch`] books it and unregisters it.
    pub(super) fn start_release(&mut self, batch: &mut Batch) {
        if !batch.is_empty() {
            self.releases_running += 1;
        }
        if batch.mappings.iter().any(|(_, m)| m.needs_sync) {
            self.sync_ticket += 1;
            batch.sync_ticket = self.sync_ticket;
        }
    }

    /// Takes `slot` (idle, indexed) out of the reuse index for release.
    pub(super) fn mark_releasing(&mut self, slot: u32, batch: &mut Batch) {
        self.index_remove(slot);
        let m = self.mapping_mut(slot);
        m.state = MappingState::Releasing;
        batch.mappings.push((slot, *m));
        if m.piece == Piece::Whole {
            self.history_whole(slot, false);
        }
    }

    /// Every idle mapping any caller could take, the synchronous API's, and those
    /// nobody may take ([`ANY`], [`SYNC_FREED`], [`HELD`]),
    /// those of the capture buckets `captures` names, and every pending one, for a
    /// release point. Memory still waiting on a stream's fence is left alone; without
    /// `may_sync`, so is memory whose release needs a device synchronize.
    pub(super) fn collect_all(&mut self, batch: &mut Batch, captures: Captures, may_sync: bool) {
        let mut buckets = vec![ANY, HELD, SYNC_FREED];
        for (i, b) in self.buckets.iter().enumerate() {
            if let BucketKind::Tag(_) | BucketKind::TagBlocks(_) = b.kind {
                buckets.push(i as u32);
            }
            if let BucketKind::Capture { epoch, .. } = b.kind {
                let take = match captures {
                    Captures::Keep => false,
                    Captures::OfScope(e) => e == epoch,
                    Captures::All => true,
                };
                if take {
                    buckets.push(i as u32);
                }
            }
        }
        for bucket in buckets {
            for slot in self.idle.slots_in(bucket) {
                if may_sync || !self.mapping(slot).needs_sync {
                    self.mark_releasing(slot, batch);
                }
            }
        }
        if may_sync {
            self.retry.clear();
        }
        self.collect_pending(batch);
    }

    pub(super) fn collect_pending(&mut self, batch: &mut Batch) {
        for slot in std::mem::take(&mut self.pending) {
            batch.pending.push((slot, self.mapping(slot)));
        }
    }

    /// Idle mappings marked for retry, and the pending ones.
    /// Without `may_sync` (a stream-ordered free), those needing a device
    /// synchronize stay marked for a later release point.
    pub(super) fn collect_retries(&mut self, batch: &mut Batch, may_sync: bool) {
        for slot in std::mem::take(&mut self.retry) {
            let m = match self.slots.get(slot as usize) {
                Some(Some(m)) if m.state == MappingState::Idle && m.retry => *m,
                _ => continue,
            };
            if may_sync || !m.needs_sync {
                self.mark_releasing(slot, batch);
            } else {
                self.retry.push(slot);
            }
        }
        self.collect_pending(batch);
    }

    /// Applies what releasing an idle mapping did.
    pub(super) fn apply_release(&mut self, slot: u32, outcome: Outcome) {
        let mut m = self.mapping(slot);
        let size = m.size();
        match (m.piece, outcome) {
            // A block "released" is a block back in its heap, after the synchronize
            // its batch ran (if it needed one): safe for the heap's home.
            (Piece::Block, Outcome::Unmapped { .. }) => {
                self.mapping_mut(slot).state = MappingState::Idle;
                self.merge_free(slot);
                return;
            }
            (Piece::Handle, Outcome::StillMapped) => {
                self.handle_still_mapped(slot);
                return;
            }
            (Piece::Handle, Outcome::AliasUnmapped) => {
                self.mapping_mut(slot).alias = 0;
                self.counters.segment_handles_lent -= 1;
                self.counters.segment_lent_bytes -= size;
                self.handle_still_mapped(slot);
                return;
            }
            (Piece::Handle, Outcome::Unmapped { .. }) => {
                // Released or pending: no longer its tag's.
                self.tag_handle_bytes(m.seg, size, false);
                if m.alias != 0 {
                    self.counters.segment_handles_lent -= 1;
                    self.counters.segment_lent_bytes -= size;
                }
                self.handle_unmapped(m.seg);
            }
            _ => {}
        }
        match outcome {
            Outcome::StillMapped | Outcome::AliasUnmapped => {
                m.state = MappingState::Idle;
                m.retry = true;
                *self.mapping_mut(slot) = m;
                if m.piece == Piece::Whole {
                    self.history_whole(slot, true);
                }
                self.index_insert(slot, m.bucket);
                self.retry.push(slot);
            }
            Outcome::Unmapped {
                handle_live,
                reservation_live,
            } => {
                let c = &mut self.counters;
                c.idle_count -= 1;
                c.idle_bytes -= size;
                self.settle(slot, m, handle_live, reservation_live, false);
            }
        }
    }

    /// Books an unmapped mapping that was `was_pending` (or idle): released parts
    /// leave the counters; what is left stays pending.
    pub(super) fn settle(
        &mut self,
        slot: u32,
        mut m: Mapping,
        handle_live: bool,
        reservation_live: bool,
        was_pending: bool,
    ) {
        let size = m.size();
        let c = &mut self.counters;
        let handle_was_live = !was_pending || m.handle_live;
        let reservation_was_live = !was_pending || m.reservation_live;
        if handle_was_live && !handle_live {
            c.physical_bytes -= size;
            if was_pending {
                c.pending_bytes -= size;
            }
        } else if handle_live && !was_pending {
            c.pending_bytes += size;
        }
        if reservation_was_live && !reservation_live {
            c.reserved_bytes -= m.reservation.size;
        }
        if !handle_live && !reservation_live {
            if was_pending {
                c.pending_count -= 1;
            }
            if m.created {
                c.mappings_released += 1;
            }
            self.remove_slot(slot);
        } else {
            if !was_pending {
                c.pending_count += 1;
            }
            m.state = MappingState::Pending;
            m.mapped = false;
            m.handle_live = handle_live;
            m.reservation_live = reservation_live;
            *self.mapping_mut(slot) = m;
            self.pending.push(slot);
        }
    }
}

impl Pool {
    /// Releases what is idle now (trim, and the out-of-memory release): waits on the
    /// fences of memory freed on streams first (`cuEventSynchronize`, in relaxed
    /// capture mode).
    pub(super) fn release_idle(&self, scope_is_error: bool) -> Result<()> {
        if lock(&self.state).counters.scope_open {
            return if scope_is_error {
                Err(Error::ScopeState(
                    "trim inside a retention scope: finish the scope instead",
                ))
            } else {
                Ok(())
            };
        }
        let captures = if scope_is_error {
            Captures::All
        } else {
            Captures::Keep
        };
        self.release_now(captures, true, false, false)
    }

    /// Runs a batch's driver calls outside the lock, then books the outcomes.
    /// Returns the first failure.
    pub(super) fn release_batch(&self, batch: Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let d = &*self.driver;
        let mut first: Option<Error> = None;
        let mut failed: Vec<DriverCall> = Vec::new();
        let mut note = |e: DriverError, bytes: u64, failed: &mut Vec<DriverCall>| {
            failed.push(e.call);
            if first.is_none() {
                first = Some(Error::Driver { source: e, bytes });
            }
        };
        let mut outcomes: Vec<(u32, Outcome)> = Vec::with_capacity(batch.mappings.len());
        if !batch.mappings.is_empty() {
            // Every device with access may have work queued on the memory: wait for
            // each (a peer's kernel can be reading it), unless every mapping's stream
            // work is known complete (its fence completed).
            let synced = if batch.mappings.iter().any(|(_, m)| m.needs_sync) {
                self.access_devices
                    .iter()
                    .try_for_each(|&device| d.synchronize(device))
            } else {
                Ok(())
            };
            match synced {
                Err(e) => {
                    note(e, 0, &mut failed);
                    outcomes.extend(
                        batch
                            .mappings
                            .iter()
                            .map(|(s, _)| (*s, Outcome::StillMapped)),
                    );
                }
                Ok(()) => {
                    for (slot, m) in &batch.mappings {
                        let outcome = if m.piece == Piece::Block {
                            // A block owns no driver object.
                            Outcome::Unmapped {
                                handle_live: false,
                                reservation_live: false,
                            }
                        } else {
                            // A segment's handle leaves the reservation to its segment.
                            self.release_steps(m, true, true, m.reservation_live, &mut |e| {
                                note(e, m.size(), &mut failed)
                            })
                        };
                        outcomes.push((*slot, outcome));
                    }
                }
            }
        }
        let mut pending_outcomes: Vec<(u32, Outcome)> = Vec::with_capacity(batch.pending.len());
        for (slot, m) in &batch.pending {
            let outcome =
                self.release_steps(m, m.mapped, m.handle_live, m.reservation_live, &mut |e| {
                    note(e, m.size(), &mut failed)
                });
            pending_outcomes.push((*slot, outcome));
        }
        let mut st = lock(&self.state);
        st.releases_running -= 1;
        if st.releases_running == 0 {
            self.releases_done.notify_all();
        }
        if batch.sync_ticket > 0 && !failed.contains(&DriverCall::Synchronize) {
            st.synced = st.synced.max(batch.sync_ticket);
        }
        for call in failed {
            st.counters.count_failure(call);
        }
        for (slot, outcome) in outcomes {
            st.apply_release(slot, outcome);
        }
        for (slot, outcome) in pending_outcomes {
            let m = st.mapping(slot);
            match outcome {
                Outcome::StillMapped | Outcome::AliasUnmapped => st.pending.push(slot),
                Outcome::Unmapped {
                    handle_live,
                    reservation_live,
                } => {
                    st.settle(slot, m, handle_live, reservation_live, true);
                    // settle() re-pushed it when something is left.
                }
            }
        }
        drop(st);
        first.map_or(Ok(()), Err)
    }

    /// Unmap (if `mapped`), release the handle (if live), free the reservation (if
    /// live), in that order. A failed unmap stops there (the mapping stays whole and
    /// its reservation must not be freed).
    pub(super) fn release_steps(
        &self,
        m: &Mapping,
        mapped: bool,
        handle_live: bool,
        reservation_live: bool,
        note: &mut dyn FnMut(DriverError),
    ) -> Outcome {
        let d = &*self.driver;
        if mapped {
            if m.alias != 0 {
                if let Err(e) = d.unmap(m.alias, m.size()) {
                    note(e);
                    return Outcome::StillMapped;
                }
            }
            if let Err(e) = d.unmap(m.reservation.ptr, m.size()) {
                note(e);
                return if m.alias != 0 {
                    Outcome::AliasUnmapped
                } else {
                    Outcome::StillMapped
                };
            }
        }
        let mut failed = |r: Result<(), DriverError>| match r {
            Ok(()) => false,
            Err(e) => {
                note(e);
                true
            }
        };
        let handle_live = handle_live && failed(d.release(m.handle));
        let reservation_live = reservation_live && failed(d.free_reservation(m.reservation));
        Outcome::Unmapped {
            handle_live,
            reservation_live,
        }
    }

    pub(super) fn release_everything(&mut self) -> Result<()> {
        let mut last = Ok(());
        // Sleeping allocations: what is left of them (their reservations) is pending.
        self.drop_sleeping();
        // The thread caches close for good; what they hold goes back to the books.
        self.caches.set_open(false);
        for _attempt in 0..2 {
            self.caches.settle(&self.state);
            {
                let mut st = lock(&self.state);
                st.counters.scope_open = false;
                let live: Vec<u32> = st.live.drain().map(|(_, s)| s).collect();
                st.recorded.clear();
                for slot in live {
                    let m = st.mapping_mut(slot);
                    m.state = MappingState::Idle;
                    m.needs_sync = true;
                    let (size, requested, block) = (m.size(), m.requested, m.is_block());
                    st.count_no_longer_live(size, requested, block);
                    st.index_insert(slot, SYNC_FREED);
                }
            }
            last = self.release_now(Captures::All, true, true, false);
            let st = lock(&self.state);
            if st.idle.len() == 0
                && st.pending.is_empty()
                && st.deferred.is_empty()
                && st.segments_empty()
            {
                drop(st);
                // Nothing a refused step left is held (a segment's handle refused
                // once is released by the same release point's second pass): the
                // segments' reservations last, a refused free retried once.
                return match self.free_empty_segments() {
                    Ok(()) => Ok(()),
                    Err(_) => self.release_now(Captures::All, true, true, false),
                };
            }
        }
        let freed = self.free_empty_segments();
        last.and(freed)
    }
}
