//! Wake: a sleeping tag's memory mapped again at the same addresses.

use super::sleeping_segments::{SegSleep, SleepingHandle};
use super::{Piece2, SleepMode};
use crate::driver::{DevicePtr, DriverError, HostBuffer, PhysicalHandle, Stream};
use crate::error::{Error, Result};
use crate::pool::books::State;
use crate::pool::release::Batch;
use crate::pool::undo::{undo_all, Steps};
use crate::pool::Pool;
use crate::sync::lock;

impl Pool {
    /// Wakes tag `tag`: for every allocation put to sleep, a new handle
    /// (`cuMemCreate`; a handle the driver kept at sleep is reused) is mapped at the
    /// same address (`cuMemMap`) with the same access (`cuMemSetAccess`, the device
    /// and every peer), and in [`SleepMode::Offload`] its bytes copied back
    /// (`cuMemcpyHtoD`); then the host buffer is kept for the next offload sleep of
    /// the same size (a sleep/wake loop offloads the same allocations each time, and
    /// pinning 10 GiB took 5.7 s of a 5.9 s sleep on the H200); the one kept before
    /// is freed (`cuMemFreeHost`; a refusal leaves it to the driver, the wake still
    /// succeeds), and [`Pool::trim`] frees the kept one. Every pointer of the tag is
    /// valid again: same bytes (offload) or unspecified contents (discard: on the GPU,
    /// whatever an earlier owner of the memory left; [`Pool::wake_zeroed`] zeroes
    /// them).
    ///
    /// First, what the pool holds pending (a release refused part-way, or what an
    /// earlier wake's undo could not undo) is released again (`cuMemUnmap`,
    /// `cuMemRelease`, `cuMemAddressFree`; no synchronize), as at a release point.
    ///
    /// Failures: any step refused (the device full: `cuMemCreate` out of memory)
    /// undoes what this wake mapped and created, in reverse, and returns the error;
    /// the tag stays asleep, its host copy kept, and a later wake can succeed. A
    /// mapping whose undo the driver refuses stays mapped (awake, counted), and the
    /// next wake skips it (when that mapping is the one whose copy was refused, its
    /// contents are unspecified: two refusals in a row on one mapping).
    ///
    /// Concurrency: as [`Pool::sleep`], the wake takes the tag exclusively (its calls
    /// are refused until the wake returns, and a wake racing a free or an allocation
    /// of the tag either refuses it or comes wholly before it).
    ///
    /// Errors: [`Error::TagState`] when the tag does not sleep, or a sleep or wake of
    /// it runs on another thread (nothing done, pending kept);
    /// [`Error::OutOfMemory`] when the device is full (nothing released to make
    /// room: free memory or trim, then wake again); [`Error::Driver`] for another
    /// refused call.
    pub fn wake(&self, tag: u32) -> Result<()> {
        self.wake_zeroing(tag, None)
    }

    /// [`Pool::wake`]; with `zero`, what a discard sleep dropped is zeroed on that
    /// stream ([`Pool::wake_zeroed`]). Recorded once the tag is awake (a failed
    /// memset leaves it awake).
    pub(in crate::pool) fn wake_zeroing(&self, tag: u32, zero: Option<Stream>) -> Result<()> {
        let _order = self.record_order();
        let (woken, zeroed) = self.wake_unrecorded(tag, zero);
        if let (Some(rec), Ok(())) = (&self.rec, &woken) {
            rec.line(&format!("wake {tag}"));
        }
        woken.and(zeroed)
    }

    /// [`Pool::wake_zeroing`], not recorded: the wake's result, and the zeroing's
    /// (`Ok` when not asked for or nothing to do).
    fn wake_unrecorded(&self, tag: u32, zero: Option<Stream>) -> (Result<()>, Result<()>) {
        // What a release or an earlier wake's undo left pending is retried first
        // (no synchronize: a pending leftover's work is done): a leftover still
        // mapped at one of the tag's addresses would make this wake's map fail.
        let mut batch = Batch::default();
        {
            let mut st = lock(&self.state);
            if st
                .tags
                .get(&tag)
                .is_some_and(|t| !t.busy && t.sleeping.is_some())
                && !st.pending.is_empty()
            {
                st.collect_pending(&mut batch);
                st.start_release(&mut batch);
            }
        }
        let _ = self.release_batch(batch);
        let (mode, host, pieces, seg, blocks, dropped) = {
            let mut st = lock(&self.state);
            let t = st.tags.entry(tag).or_default();
            if t.busy || t.sleeping.is_none() {
                let e = Error::TagState {
                    tag,
                    reason: "the tag does not sleep (or a sleep or wake of it runs)",
                };
                return (Err(e), Ok(()));
            }
            // Calls of a sleeping tag are refused; those refused a moment ago leave.
            st = self.close_tag(st, tag);
            let t = st.tags.entry(tag).or_default();
            let (mode, host, list) = (t.sleeping, t.host, t.asleep.clone());
            let st = &*st;
            let pieces: Vec<(Piece2, u64)> = list
                .iter()
                .filter_map(|&(slot, off)| {
                    let m = st.mref(slot);
                    m.asleep.then_some((
                        Piece2 {
                            slot,
                            ptr: m.ptr(),
                            handle: m.handle,
                            requested: m.requested,
                            handle_live: m.handle_live,
                        },
                        off,
                    ))
                })
                .collect();
            let seg = st
                .tags
                .get(&tag)
                .map(|t| t.seg_sleep.clone())
                .unwrap_or_default();
            // Each live block asleep: address, requested bytes, offset in `host`.
            let blocks: Vec<(DevicePtr, u64, u64)> = seg
                .live
                .iter()
                .map(|&(slot, off)| {
                    let m = st.mref(slot);
                    (m.ptr(), m.requested, off)
                })
                .collect();
            // A zeroing wake of a discard sleep: what the sleep dropped.
            let dropped = match (zero, mode) {
                (Some(_), Some(SleepMode::Discard)) => st.dropped_ranges(&list, &blocks),
                _ => Vec::new(),
            };
            (mode, host, pieces, seg, blocks, dropped)
        };
        // The segments first (new handles at the same addresses, the live blocks'
        // bytes copied back), then the whole mappings; a failure of the latter undoes
        // the former.
        let result = self
            .wake_segments(mode, host, &seg, &blocks)
            .and_then(|woken| {
                let r = self.wake_steps(tag, mode, host, &pieces, &woken);
                if r.is_err() {
                    let mut failed = Vec::new();
                    let mut pending = Vec::new();
                    let d = &*self.driver;
                    let steps: Vec<(DevicePtr, Steps<'_>)> = woken
                        .iter()
                        .map(|&(h, handle)| (h.ptr, Steps::mapped(d, h.ptr, handle, true)))
                        .collect();
                    self.undo_seg_wake(&steps, &mut failed, &mut pending);
                    lock(&self.state).book_wake_leftovers(&failed, &pending);
                }
                r
            });
        // Still busy: no allocation or free of the tag moves what is zeroed.
        let zeroed = match (zero, &result) {
            (Some(stream), Ok(())) => self.zero_dropped(tag, stream, &dropped),
            _ => Ok(()),
        };
        self.open_tag(&mut lock(&self.state), tag);
        (result, zeroed)
    }

    /// Wakes the segments of a sleep (`ss`): for each handle, `cuMemCreate`,
    /// `cuMemMap` at its address, `cuMemSetAccess`; then in offload mode each live
    /// block's bytes (`blocks`: address, requested bytes, offset in `host`) copied
    /// back. Returns the handles mapped (booked by [`Pool::finish_wake`]). A refused
    /// step undoes, in reverse, what this wake mapped and created (what the driver
    /// refuses to undo is left pending) and returns the error (out-of-memory when
    /// the device is full), the segments asleep.
    fn wake_segments(
        &self,
        mode: Option<SleepMode>,
        host: Option<HostBuffer>,
        ss: &SegSleep,
        blocks: &[(DevicePtr, u64, u64)],
    ) -> Result<Vec<(SleepingHandle, PhysicalHandle)>> {
        let d = &*self.driver;
        let mut done = Vec::with_capacity(ss.handles.len());
        // Each handle's steps (address, steps), the latest last: a refused map
        // leaves a created handle to release.
        let mut steps = Vec::with_capacity(ss.handles.len());
        let mut err: Option<(DriverError, u64)> = None;
        for &h in &ss.handles {
            let mut s = Steps::new(d);
            let r = s.create(h.size).and_then(|handle| {
                s.map(h.ptr, handle)?;
                done.push((h, handle));
                s.set_access(h.ptr, h.size, &self.access_devices)
            });
            steps.push((h.ptr, s));
            if let Err(e) = r {
                err = Some((e, h.size));
                break;
            }
        }
        if let (None, Some(SleepMode::Offload), Some(buf)) = (err, mode, host) {
            for &(ptr, n, off) in blocks {
                if off == u64::MAX || n == 0 {
                    continue;
                }
                if let Err(e) = d.copy_to_device(ptr, buf, off, n) {
                    err = Some((e, n));
                    break;
                }
            }
        }
        let Some((e, bytes)) = err else {
            return Ok(done);
        };
        let mut failed = vec![e.call];
        let mut pending = Vec::new();
        self.undo_seg_wake(&steps, &mut failed, &mut pending);
        let mut st = lock(&self.state);
        st.book_wake_leftovers(&failed, &pending);
        Err(if e.is_out_of_memory() {
            self.oom_error(&st, bytes, Some(e))
        } else {
            Error::Driver { source: e, bytes }
        })
    }

    /// Undoes, latest first, the steps of a wake of segments (`steps`: address,
    /// steps): unmap, release. Refused calls go to `failed`; what the driver keeps
    /// goes to `pending` (address, handle, still mapped).
    fn undo_seg_wake(
        &self,
        steps: &[(DevicePtr, Steps<'_>)],
        failed: &mut Vec<crate::driver::DriverCall>,
        pending: &mut Vec<(DevicePtr, PhysicalHandle, bool)>,
    ) {
        let left = undo_all(steps.iter().map(|(_, s)| s), failed);
        for ((ptr, s), left) in steps.iter().zip(left).rev() {
            if let (Some(handle), true) = (s.handle(), left.handle_live) {
                pending.push((*ptr, handle, left.mapped));
            }
        }
    }

    fn wake_steps(
        &self,
        tag: u32,
        mode: Option<SleepMode>,
        host: Option<HostBuffer>,
        pieces: &[(Piece2, u64)],
        seg: &[(SleepingHandle, PhysicalHandle)],
    ) -> Result<()> {
        let d = &*self.driver;
        // (piece, new handle, created now)
        let mut done: Vec<(Piece2, PhysicalHandle, bool)> = Vec::with_capacity(pieces.len());
        let mut failure: Option<(DriverError, u64)> = None;
        let mut calls = Vec::new();
        for &(p, off) in pieces {
            let size = p.handle.size;
            // A handle the driver kept at sleep is mapped again, not created: the
            // undo releases only what these steps created.
            let mut steps = Steps::new(d);
            let created = !p.handle_live;
            let handle = if created {
                match steps.create(size) {
                    Ok(h) => h,
                    Err(e) => {
                        failure = Some((e, size));
                        break;
                    }
                }
            } else {
                p.handle
            };
            let step = (|| {
                steps.map(p.ptr, handle)?;
                steps.set_access(p.ptr, size, &self.access_devices)?;
                if mode == Some(SleepMode::Offload) && off != u64::MAX && p.requested > 0 {
                    if let Some(buf) = host {
                        d.copy_to_device(p.ptr, buf, off, p.requested)?;
                    }
                }
                Ok(())
            })();
            match step {
                Ok(()) => done.push((p, handle, created)),
                Err(e) => {
                    // Undo this piece.
                    let left = steps.undo(&mut calls);
                    if left.mapped {
                        let copy = match (mode, host) {
                            (Some(SleepMode::Offload), Some(buf))
                                if off != u64::MAX && p.requested > 0 =>
                            {
                                Some((buf, off, p.requested))
                            }
                            _ => None,
                        };
                        self.grant_again(p.ptr, size, copy, &mut calls);
                        done.push((p, handle, created));
                        failure = Some((e, size));
                        // Keep it awake; undo the others below.
                        let keep = done.pop();
                        self.undo_wake(&mut done, &mut calls);
                        if let Some(k) = keep {
                            done.push(k);
                        }
                        return self.finish_wake(tag, host, &done, &calls, failure, false, seg);
                    }
                    if left.handle_live {
                        // The driver keeps it: book it as the sleeping
                        // allocation's kept handle.
                        let mut q = p;
                        q.handle = handle;
                        let mut st = lock(&self.state);
                        let m = st.mapping_mut(q.slot);
                        m.handle = handle;
                        m.handle_live = true;
                        book_kept_handle(&mut st, tag, size);
                    }
                    failure = Some((e, size));
                    break;
                }
            }
        }
        if failure.is_some() {
            self.undo_wake(&mut done, &mut calls);
            return self.finish_wake(tag, host, &done, &calls, failure, false, seg);
        }
        self.finish_wake(tag, host, &done, &calls, None, true, seg)
    }

    /// Undoes the pieces of `done` (mapped this wake): unmap, release what was
    /// created. What the driver refuses to unmap stays in `done` (awake).
    fn undo_wake(
        &self,
        done: &mut Vec<(Piece2, PhysicalHandle, bool)>,
        calls: &mut Vec<crate::driver::DriverCall>,
    ) {
        let d = &*self.driver;
        let steps: Vec<Steps<'_>> = done
            .iter()
            .map(|&(p, handle, created)| Steps::mapped(d, p.ptr, handle, created))
            .collect();
        let left = undo_all(steps.iter(), calls);
        let mut kept = Vec::new();
        let mut held = Vec::new();
        for (&(p, handle, created), left) in done.iter().zip(left).rev() {
            if left.mapped {
                kept.push((p, handle, created));
            } else if left.handle_live {
                held.push((p, handle));
            }
        }
        // Handles created now and kept by the driver: the sleeping allocation's.
        if !held.is_empty() {
            let mut st = lock(&self.state);
            for (p, handle) in held {
                let size = handle.size;
                let tag = {
                    let m = st.mapping_mut(p.slot);
                    m.handle = handle;
                    m.handle_live = true;
                    m.tag
                };
                book_kept_handle(&mut st, tag, size);
            }
        }
        *done = kept;
    }

    /// Books the pieces of `done` awake; with `all`, the tag awake (its segments'
    /// handles `seg` booked mapped, its host buffer freed); else returns `failure`'s
    /// error, the tag asleep.
    #[allow(clippy::too_many_arguments)]
    fn finish_wake(
        &self,
        tag: u32,
        host: Option<HostBuffer>,
        done: &[(Piece2, PhysicalHandle, bool)],
        calls: &[crate::driver::DriverCall],
        failure: Option<(DriverError, u64)>,
        all: bool,
        seg: &[(SleepingHandle, PhysicalHandle)],
    ) -> Result<()> {
        let mut st = lock(&self.state);
        if let Some((e, _)) = failure {
            st.counters.count_failure(e.call);
        }
        for &call in calls {
            st.counters.count_failure(call);
        }
        for (p, handle, created) in done {
            let size = handle.size;
            let was_held = {
                let m = st.mapping_mut(p.slot);
                let was_held = m.handle_live;
                m.asleep = false;
                m.mapped = true;
                m.handle_live = true;
                m.handle = *handle;
                was_held && !created
            };
            st.history_sleep(p.slot, false);
            let c = &mut st.counters;
            c.live_mapped_bytes += size;
            c.peak_live_mapped_bytes = c.peak_live_mapped_bytes.max(c.live_mapped_bytes);
            c.sleeping_count -= 1;
            if was_held {
                c.sleeping_held_count -= 1;
                c.sleeping_held_bytes -= size;
            } else {
                c.sleeping_bytes -= size;
                c.physical_bytes += size;
                c.peak_physical_bytes = c.peak_physical_bytes.max(c.physical_bytes);
                if let Some(t) = st.tags.get_mut(&tag) {
                    t.live_physical += size;
                }
            }
        }
        if !all {
            drop(st);
            return Err(match failure {
                Some((e, size)) if e.is_out_of_memory() => {
                    let st = lock(&self.state);
                    self.oom_error(&st, size, Some(e))
                }
                Some((source, bytes)) => Error::Driver { source, bytes },
                None => Error::TagState {
                    tag,
                    reason: "wake undone",
                },
            });
        }
        st.book_seg_awake(tag, seg);
        st.counters.tags_sleeping -= 1;
        if let Some(h) = host {
            st.counters.offloaded_bytes -= h.size;
        }
        let t = st.tags.entry(tag).or_default();
        t.sleeping = None;
        t.host = None;
        t.asleep.clear();
        // The buffer is kept for the next offload of its size; the one kept before
        // is freed.
        let old = host.and_then(|h| st.keep_spare_host(h));
        drop(st);
        if let Some(h) = old {
            // A refusal leaves the buffer to the driver; the tag is awake either way.
            let _ = self.driver.host_free(h);
        }
        Ok(())
    }
}

impl State {
    /// Counts the refused calls of a wake's undo (`failed`) and keeps what the driver
    /// kept (`pending`: address, handle, still mapped) pending, retried at the next
    /// release point.
    fn book_wake_leftovers(
        &mut self,
        failed: &[crate::driver::DriverCall],
        pending: &[(DevicePtr, PhysicalHandle, bool)],
    ) {
        for &call in failed {
            self.counters.count_failure(call);
        }
        for &(ptr, handle, mapped) in pending {
            self.keep_pending_handle(ptr, handle, mapped);
        }
    }
}

/// A sleeping allocation of `tag` (`size` bytes) whose wake could not release the new
/// handle it mapped keeps that handle: it is counted as held while asleep
/// (`sleeping_held_*`, no longer in `sleeping_bytes`), and in the physical bytes, the
/// peak and the tag's live physical bytes, as the handle is the driver's memory.
fn book_kept_handle(st: &mut State, tag: u32, size: u64) {
    let c = &mut st.counters;
    c.sleeping_held_count += 1;
    c.sleeping_bytes -= size;
    c.sleeping_held_bytes += size;
    c.physical_bytes += size;
    c.peak_physical_bytes = c.peak_physical_bytes.max(c.physical_bytes);
    if let Some(t) = st.tags.get_mut(&tag) {
        t.live_physical += size;
    }
}
