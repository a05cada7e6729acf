//! Sleep: a tag's physical memory given back to the device, every reservation kept.

use super::sleeping_segments::SegPlan;
use super::{Piece2, SleepMode};
use crate::driver::{CuResult, DevicePtr, HostBuffer, PhysicalHandle, Stream};
use crate::error::{Error, Result};
use crate::pool::books::{MappingState, Piece, State};
use crate::pool::release::Batch;
use crate::pool::Pool;
use crate::sync::lock;

impl Pool {
    /// Puts tag `tag` to sleep: its physical memory goes back to the device, every
    /// reservation (every pointer) stays.
    ///
    /// Steps: every device with access is synchronized (`cuCtxSynchronize`: the work
    /// that may touch the tag's memory, on any stream, completes); the tag's idle
    /// memory is released (tag 0: the thread caches are settled and everything idle
    /// released, as [`Pool::trim`]; another tag: its bucket and, in segment mode, the
    /// handles of its heaps left wholly free); in [`SleepMode::Offload`] one pinned
    /// host buffer (`cuMemHostAlloc`, or the one an earlier wake kept when it is of
    /// the same size: no pinning) receives every live allocation's requested bytes
    /// (`cuMemcpyDtoH`; in segment mode each live block's, not the free space); then
    /// every live whole mapping of the tag is unmapped (`cuMemUnmap`), then every
    /// handle of its segments (segment mode: the tag's own heaps; for tag 0 the
    /// synchronous API's and the streams' heaps), and every handle released
    /// (`cuMemRelease`). The segments' reservations stay, so [`Pool::wake`] maps new
    /// handles at the same addresses. Allocating or freeing with the tag is refused
    /// until [`Pool::wake`]; other tags are untouched.
    ///
    /// Concurrency (`docs/ARCHITECTURE.md`, "Tags: sleep and wake"): every call on
    /// the tag's memory from another thread runs wholly before or wholly after the
    /// sleep. The sleep first marks the tag busy (calls of it are refused with
    /// [`Error::TagState`] from then on) and waits until the calls of the tag in
    /// flight have returned; so a free of the tag's allocation racing the sleep either
    /// ran first or is refused (the allocation sleeps), and an allocation either ran
    /// first (it sleeps with the tag) or is refused. Another sleep or wake of the tag
    /// meanwhile is refused.
    ///
    /// Failures: a failed synchronize, idle release, host allocation or copy changes
    /// nothing (the host buffer is freed); a failed unmap maps what was already
    /// unmapped back (the handles are still held) and returns the error, the tag
    /// awake and usable. If a map-back is refused too: a whole mapping's handle is
    /// kept and the tag sleeps with it ([`Pool::wake`] maps it again); a segment's
    /// handle makes the sleep go on for every segment of the tag (a handle whose
    /// unmap the driver refuses is left pending, released at the next release point
    /// or wake, and a new one mapped at wake), the tag asleep, and the error
    /// returned (so does a whole mapping's refused map-back when segments were
    /// unmapped too: the segments sleep with it). A
    /// handle the driver refuses to release is kept: a whole mapping's counted in
    /// `sleeping_held_bytes` (and the census's physical bytes) and mapped again at
    /// wake; a segment's left pending (the pool's, retried at the next release
    /// point); the sleep succeeds.
    ///
    /// Errors: [`Error::ScopeState`] inside a retention scope, while one of the
    /// pool's streams is being captured, or while a blocking stream of the context
    /// is being captured (the legacy stream's `cuStreamGetCaptureInfo` answers
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`; the capture is left valid); nothing
    /// changed then. A capture of a non-blocking stream the pool has never seen
    /// cannot be detected (no driver call reports it without breaking it): sleeping
    /// during one makes the device synchronize fail (`Error::Driver`, the tag awake)
    /// and invalidates that capture, so an engine must not sleep while it captures.
    /// [`Error::TagState`] when the tag already sleeps or a sleep or wake of it runs
    /// on another thread, or (segment mode) when its segments' memory is in flight
    /// without a call of the tag (a release point on another thread, a trim or an
    /// out-of-memory retry, releasing a handle of its heaps; or blocks waiting on
    /// stream work that the release could not release: trim, then sleep again);
    /// nothing changed then. [`Error::Driver`] as above.
    pub fn sleep(&self, tag: u32, mode: SleepMode) -> Result<()> {
        let _order = self.record_order();
        // Before anything: a device synchronize during a capture would break it.
        self.refuse_during_foreign_capture()?;
        {
            let mut st = lock(&self.state);
            if st.counters.scope_open {
                return Err(Error::ScopeState(
                    "sleep inside a retention scope: finish the scope first",
                ));
            }
            st.tag_usable(tag).map_err(|_| Error::TagState {
                tag,
                reason: "the tag already sleeps (or a sleep or wake of it runs)",
            })?;
            self.refuse_sleep(&st)?;
            // The tag's calls in flight end first; none enters from now on.
            st = self.close_tag(st, tag);
            // A scope or a capture may have begun while this sleep waited.
            if let Err(e) = self.refuse_sleep(&st) {
                self.open_tag(&mut st, tag);
                return Err(e);
            }
        }
        let result = self.sleep_steps(tag, mode);
        if let (Some(rec), Ok(())) = (&self.rec, &result) {
            let mode = match mode {
                SleepMode::Offload => "offload",
                SleepMode::Discard => "discard",
            };
            rec.line(&format!("sleep {tag} {mode}"));
        }
        self.open_tag(&mut lock(&self.state), tag);
        result
    }

    /// [`Error::ScopeState`] inside a retention scope and while one of the pool's
    /// streams is being captured (a sleep's device synchronize would break it).
    fn refuse_sleep(&self, st: &State) -> Result<()> {
        if st.counters.scope_open {
            return Err(Error::ScopeState(
                "sleep inside a retention scope: finish the scope first",
            ));
        }
        if !self.open_captures(st).is_empty() {
            return Err(Error::ScopeState(
                "sleep while one of the pool's streams is being captured",
            ));
        }
        Ok(())
    }

    /// [`Error::ScopeState`] while a blocking stream of the pool's context is being
    /// captured, whether or not the pool has seen it: the legacy stream's capture
    /// query (`cuStreamGetCaptureInfo`, legal during any capture) then answers
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (documented by NVIDIA for
    /// `cuStreamIsCapturing` / `cuStreamGetCaptureInfo` on `CU_STREAM_LEGACY`: "the
    /// blocking stream capture is not invalidated"). Any other failure of the query
    /// (a backend without streams) is no answer, and the sleep goes on.
    fn refuse_during_foreign_capture(&self) -> Result<()> {
        match self.driver.stream_capture(Stream::LEGACY) {
            Ok(Some(_)) => Err(Error::ScopeState(
                "sleep while the legacy stream is being captured",
            )),
            Err(e) if e.code == CuResult::STREAM_CAPTURE_IMPLICIT => Err(Error::ScopeState(
                "sleep while a blocking stream is being captured (the legacy stream's \
                 capture query answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT): end the \
                 capture first",
            )),
            _ => Ok(()),
        }
    }

    fn sleep_steps(&self, tag: u32, mode: SleepMode) -> Result<()> {
        let d = &*self.driver;
        // The work that may touch the tag's memory, on any stream, completes.
        for &device in &self.access_devices {
            if let Err(source) = d.synchronize(device) {
                lock(&self.state).counters.count_failure(source.call);
                return Err(Error::Driver { source, bytes: 0 });
            }
        }
        // The tag's idle memory is released as a release point does (tag 0: as
        // trim); a refusal fails the sleep, the tag awake (what was refused is kept
        // and retried at the next release point, as always).
        if tag == 0 {
            self.release_idle(true)?;
        } else {
            let mut batch = Batch::default();
            {
                let mut st = lock(&self.state);
                // Blocks of its heap freed on streams: their fences completed with
                // the synchronize; back to the heap.
                if !st.deferred.is_empty() {
                    let _ = self.poll(&mut st, &[], false);
                    self.settle_deferred(&mut st);
                }
                let b = st.tag_bucket(tag);
                let blocks = st.tag_blocks_bucket(tag);
                for slot in st
                    .idle
                    .slots_in(b)
                    .into_iter()
                    .chain(st.idle.slots_in(blocks))
                {
                    st.mark_releasing(slot, &mut batch);
                }
                st.start_release(&mut batch);
            }
            self.release_batch(batch)?;
            // Then (those blocks back in their heap) the handles of its heaps left
            // wholly free.
            let mut batch = Batch::default();
            {
                let mut st = lock(&self.state);
                let b = st.tag_bucket(tag);
                for k in [b << 1, (b << 1) | 1] {
                    if let Some(&sid) = st.segs.by_key.get(&k).and_then(|v| v.first()) {
                        st.collect_heap_of(sid, &mut batch, true, None);
                    }
                }
                st.start_release(&mut batch);
            }
            self.release_batch(batch)?;
        }
        let (pieces, plan) = {
            let mut st = lock(&self.state);
            let mut v: Vec<Piece2> = st
                .live
                .values()
                .map(|&slot| (slot, st.mref(slot)))
                .filter(|(_, m)| {
                    m.tag == tag
                        && m.piece == Piece::Whole
                        && m.state == MappingState::Live
                        && !m.asleep
                })
                .map(|(slot, m)| Piece2 {
                    slot,
                    ptr: m.ptr(),
                    handle: m.handle,
                    requested: m.requested,
                    handle_live: true,
                })
                .collect();
            v.sort_by_key(|p| p.ptr);
            let plan = if self.segments {
                st.merge_idle_blocks(tag);
                let plan = st
                    .seg_sleep_plan(tag)
                    .map_err(|reason| Error::TagState { tag, reason })?;
                // Out of the free index from now on: no carve, lend or release (a
                // trim on another thread) touches the handles this sleep unmaps.
                for &slot in &plan.free {
                    st.segs.free.remove(slot);
                }
                plan
            } else {
                SegPlan::default()
            };
            (v, plan)
        };
        // Every return below that leaves the segments awake puts their free blocks
        // back first.
        let restore = |st: &mut State| st.seg_restore_free(&plan);
        // Offload: one pinned buffer, each allocation's requested bytes at its
        // offset: the whole mappings', then the live blocks'.
        let mut host = None;
        let mut offsets = vec![u64::MAX; pieces.len()];
        let mut block_offsets = vec![u64::MAX; plan.live.len()];
        if mode == SleepMode::Offload {
            let total: u64 = pieces.iter().map(|p| p.requested).sum::<u64>()
                + plan.live.iter().map(|l| l.2).sum::<u64>();
            if total > 0 {
                // The buffer an earlier wake kept, when it is of this size.
                let spare = lock(&self.state).take_spare_host(|h| h.size == total);
                let buf = match spare {
                    Some(buf) => buf,
                    None => d.host_alloc(total).map_err(|source| {
                        let mut st = lock(&self.state);
                        st.counters.count_failure(source.call);
                        restore(&mut st);
                        Error::Driver {
                            source,
                            bytes: total,
                        }
                    })?,
                };
                let mut at = 0;
                let copies = pieces
                    .iter()
                    .map(|p| (p.ptr, p.requested))
                    .chain(plan.live.iter().map(|l| (l.1, l.2)));
                for (i, (ptr, n)) in copies.enumerate() {
                    if n > 0 {
                        if let Err(source) = d.copy_to_host(buf, at, ptr, n) {
                            let _ = d.host_free(buf);
                            restore(&mut lock(&self.state));
                            return Err(Error::Driver { source, bytes: n });
                        }
                    }
                    match offsets.get_mut(i) {
                        Some(o) => *o = at,
                        None => block_offsets[i - pieces.len()] = at,
                    }
                    at += n;
                }
                host = Some(buf);
            }
        }
        // Unmap every whole mapping; on a refusal, map back what was unmapped.
        for (i, p) in pieces.iter().enumerate() {
            if let Err(e) = d.unmap(p.ptr, p.handle.size) {
                let mut failed = vec![e.call];
                let kept = self.map_back_pieces(&pieces[..i], &mut failed);
                let mut st = lock(&self.state);
                restore(&mut st);
                self.fail_awake(&mut st, tag, mode, host, &failed, &kept, &pieces, &offsets);
                return Err(Error::Driver {
                    source: e,
                    bytes: p.handle.size,
                });
            }
        }
        // Then every handle of the tag's segments (a lent one's retired mapping
        // first).
        let mut failed: Vec<crate::driver::DriverCall> = Vec::new();
        // (address, handle, still mapped, retired mapping still mapped)
        let mut pending: Vec<(DevicePtr, PhysicalHandle, bool, DevicePtr)> = Vec::new();
        let mut unmapped = vec![true; plan.handles.len()];
        let mut seg_error = None;
        // The whole mappings unmapped now (indices in `pieces`).
        let mut asleep_pieces: Vec<usize> = (0..pieces.len()).collect();
        for (i, &(h, _, alias)) in plan.handles.iter().enumerate() {
            let mut alias_gone = false;
            let r = if alias != 0 {
                d.unmap(alias, h.size)
            } else {
                Ok(())
            }
            .and_then(|()| {
                alias_gone = alias != 0;
                d.unmap(h.ptr, h.size)
            });
            let Err(e) = r else { continue };
            failed.push(e.call);
            // Undo: map back, latest first, what this loop unmapped (a lent
            // handle's retired mapping is not mapped again: it is gone).
            let mut lost = false;
            for j in (0..i).rev() {
                let (hj, handle_j, _) = plan.handles[j];
                if self.map_back(hj.ptr, handle_j, &mut failed) {
                    unmapped[j] = false;
                } else {
                    lost = true;
                    break;
                }
            }
            if !lost {
                // Undone: the whole mappings too, the tag awake.
                let kept = self.map_back_pieces(&pieces, &mut failed);
                if kept.is_empty() {
                    let mut st = lock(&self.state);
                    restore(&mut st);
                    for (j, &(hj, _, alias_j)) in plan.handles.iter().enumerate() {
                        if alias_j != 0 && (j < i || (j == i && alias_gone)) {
                            st.mapping_mut(hj.slot).alias = 0;
                            st.counters.segment_handles_lent -= 1;
                            st.counters.segment_lent_bytes -= hj.size;
                        }
                    }
                    self.fail_awake(&mut st, tag, mode, host, &failed, &kept, &pieces, &offsets);
                    return Err(Error::Driver {
                        source: e,
                        bytes: h.size,
                    });
                }
                // A whole mapping could not be mapped back: the tag sleeps with it
                // (and those like it); its segments sleep too, as below.
                asleep_pieces.retain(|&k| kept.iter().any(|q| q.slot == pieces[k].slot));
            }
            // The undo was refused as well: the segments go to sleep after all.
            // Unmap again what was mapped back, and what is left from `i` on; a
            // refusal leaves that handle pending, still mapped (released at the next
            // release point; the wake maps a new handle once it is).
            seg_error = Some((e, h.size));
            for (k, &(hk, handle_k, alias_k)) in plan.handles.iter().enumerate() {
                if k < i && unmapped[k] {
                    continue;
                }
                let alias_left = if k > i || (k == i && !alias_gone) {
                    alias_k
                } else {
                    0
                };
                if alias_left != 0 {
                    if let Err(u) = d.unmap(alias_left, hk.size) {
                        failed.push(u.call);
                        unmapped[k] = false;
                        pending.push((hk.ptr, handle_k, true, alias_left));
                        continue;
                    }
                }
                match d.unmap(hk.ptr, hk.size) {
                    Ok(()) => unmapped[k] = true,
                    Err(u) => {
                        failed.push(u.call);
                        unmapped[k] = false;
                        pending.push((hk.ptr, handle_k, true, 0));
                    }
                }
            }
            break;
        }
        // Release every handle; a refused release keeps a whole mapping's handle
        // (mapped again at wake) and leaves a segment's pending.
        let mut entries = Vec::with_capacity(asleep_pieces.len());
        for &i in &asleep_pieces {
            let p = &pieces[i];
            let mut q = *p;
            if let Err(e) = d.release(p.handle) {
                failed.push(e.call);
                q.handle_live = true;
            } else {
                q.handle_live = false;
            }
            entries.push((q, offsets[i]));
        }
        for (k, &(h, handle, _)) in plan.handles.iter().enumerate() {
            if !unmapped[k] {
                continue;
            }
            if let Err(e) = d.release(handle) {
                failed.push(e.call);
                pending.push((h.ptr, handle, false, 0));
            }
        }
        let mut st = lock(&self.state);
        for call in failed {
            st.counters.count_failure(call);
        }
        st.book_seg_asleep(tag, &plan, &block_offsets, &pending);
        self.book_asleep(&mut st, tag, mode, host, &entries);
        match seg_error {
            Some((source, bytes)) => Err(Error::Driver { source, bytes }),
            None => Ok(()),
        }
    }

    /// Maps back every whole mapping of `pieces` (unmapped, handles held); returns
    /// those the driver refused (still unmapped).
    fn map_back_pieces(
        &self,
        pieces: &[Piece2],
        failed: &mut Vec<crate::driver::DriverCall>,
    ) -> Vec<Piece2> {
        pieces
            .iter()
            .filter(|q| !self.map_back(q.ptr, q.handle, failed))
            .copied()
            .collect()
    }

    /// A sleep undone: counts `failed`; with nothing `kept` unmapped, frees the host
    /// buffer (the tag awake), else books the kept whole mappings asleep (the tag
    /// sleeps with them: [`Pool::wake`] maps them again).
    #[allow(clippy::too_many_arguments)]
    fn fail_awake(
        &self,
        st: &mut State,
        tag: u32,
        mode: SleepMode,
        host: Option<HostBuffer>,
        failed: &[crate::driver::DriverCall],
        kept: &[Piece2],
        pieces: &[Piece2],
        offsets: &[u64],
    ) {
        for &call in failed {
            st.counters.count_failure(call);
        }
        if kept.is_empty() {
            if let Some(buf) = host {
                let _ = self.driver.host_free(buf);
            }
            return;
        }
        let entries = kept
            .iter()
            .map(|q| {
                let j = pieces.iter().position(|p| p.slot == q.slot);
                (*q, j.map_or(u64::MAX, |j| offsets[j]))
            })
            .collect::<Vec<_>>();
        self.book_asleep(st, tag, mode, host, &entries);
    }

    /// Books `entries` (unmapped; each with its handle kept or not, and its offset
    /// in `host`) asleep, and the tag sleeping.
    fn book_asleep(
        &self,
        st: &mut State,
        tag: u32,
        mode: SleepMode,
        host: Option<HostBuffer>,
        entries: &[(Piece2, u64)],
    ) {
        let mut list = Vec::with_capacity(entries.len());
        for (q, off) in entries {
            let size = q.handle.size;
            st.history_sleep(q.slot, true);
            {
                let m = st.mapping_mut(q.slot);
                m.asleep = true;
                m.mapped = false;
                m.handle_live = q.handle_live;
            }
            let c = &mut st.counters;
            c.live_mapped_bytes -= size;
            c.sleeping_count += 1;
            if q.handle_live {
                c.sleeping_held_count += 1;
                c.sleeping_held_bytes += size;
            } else {
                c.sleeping_bytes += size;
                c.physical_bytes -= size;
            }
            if !q.handle_live {
                if let Some(t) = st.tags.get_mut(&tag) {
                    t.live_physical = t.live_physical.saturating_sub(size);
                }
            }
            list.push((q.slot, *off));
        }
        st.counters.tags_sleeping += 1;
        if let Some(h) = host {
            st.counters.offloaded_bytes += h.size;
        }
        let t = st.tags.entry(tag).or_default();
        t.sleeping = Some(mode);
        t.host = host;
        t.asleep = list;
    }
}
