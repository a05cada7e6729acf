//! Snapshot accounting.

use crate::driver::DriverCall;

/// The snapshot's counters, one row each: `/// doc`, the field, and for a failure
/// counter `counts Call`, the [`DriverCall`] whose failures it counts.
///
/// Written once: the Rust [`Snapshot`] (here), the C ABI's `FlareSnapshot` (its
/// `struct_size` and `scope_open`, then these fields in this order), the conversion
/// between them, the C struct's field offsets (`ffi/types/snapshot.rs`) and
/// [`Snapshot::count_failure`] are generated from it. The order is the C struct's
/// layout: a new counter goes at the end only.
///
/// `snapshot_counters!(generator! { head })` expands to `generator! { head rows }`.
macro_rules! snapshot_counters {
    ($gen:ident! { $($head:tt)* }) => {
        $gen! {
            $($head)*
            /// The driver's allocation granularity, bytes; every mapping is a multiple.
            granularity_bytes,
            /// Live allocations (handed out, not yet freed).
            live_count,
            /// Bytes the callers asked for, summed over live allocations (not rounded).
            live_requested_bytes,
            /// Bytes mapped for live allocations (rounded to the mappings' sizes):
            /// whole mappings only; live blocks of segments are in `block_live_bytes`.
            live_mapped_bytes,
            /// Idle mappings: retained in a scope or cached; mapped and reusable.
            idle_count,
            /// Bytes of idle mappings.
            idle_bytes,
            /// Mappings whose release failed part-way and will be retried.
            pending_count,
            /// Physical bytes of pending mappings whose handle is not yet released.
            pending_bytes,
            /// Physical bytes the pool holds on the device.
            physical_bytes,
            /// Bytes of virtual address space the pool holds reserved.
            reserved_bytes,
            /// High watermark of `physical_bytes`.
            peak_physical_bytes,
            /// High watermark of `live_mapped_bytes` (whole mappings only: live blocks
            /// are not in it).
            peak_live_mapped_bytes,
            /// Successful allocations.
            allocations,
            /// Successful frees.
            frees,
            /// Allocations served from an idle mapping (no driver call).
            reuse_hits,
            /// Of `reuse_hits`, those whose mapping had exactly the rounded size.
            reuse_exact_hits,
            /// Mappings created (create, reserve, map, set access all succeeded).
            mappings_created,
            /// Mappings fully released (unmapped, handle released, reservation freed).
            mappings_released,
            /// Out-of-memory failures outside a scope answered by releasing idle mappings and
            /// retrying once.
            oom_retries,
            /// Failed `cuMemMap` calls.
            map_failures counts Map,
            /// Failed `cuMemSetAccess` calls.
            access_failures counts SetAccess,
            /// Failed `cuMemUnmap` calls.
            unmap_failures counts Unmap,
            /// Failed `cuMemRelease` calls.
            release_failures counts Release,
            /// Failed `cuMemAddressFree` calls.
            reservation_free_failures counts FreeReservation,
            /// Failed `cuCtxSynchronize` calls (a capture in progress, a lost context).
            sync_failures counts Synchronize,
            /// Retention scopes closed with finish.
            scopes_finished,
            /// Retention scopes closed with abort.
            scopes_aborted,
            /// Failed `cuMemCreate` calls (out of memory included).
            create_failures counts Create,
            /// Failed `cuMemAddressReserve` calls.
            reserve_failures counts Reserve,
            /// Of `reuse_hits`, those forced by an out-of-memory: no idle mapping fitted
            /// under the policy (exact size, or the best-fit waste bound), the device was
            /// full, and the smallest idle mapping that fits was taken whatever its size
            /// rather than failing or releasing memory.
            reuse_forced_hits,
            /// Fence events recorded (after frees on a stream, `cuEventRecord`) and not
            /// yet seen complete.
            events_outstanding,
            /// Bytes of idle mappings freed on a stream (`free_async`) whose stream work
            /// up to the free is not yet known complete: reusable on that stream at once,
            /// by another stream or for release only after a fence event completes.
            /// Includes mappings freed with streams from `record_stream`, which wait for
            /// those streams first.
            event_wait_bytes,
            /// Cross-stream reuses made by ordering the new stream after a fence
            /// (`cuStreamWaitEvent`, [`CrossStreamReuse::Wait`](crate::CrossStreamReuse::Wait)).
            cross_stream_waits,
            /// Of `reuse_hits`, those handed to a stream other than the one the memory
            /// was last freed on (after its fence completed, or with a wait).
            cross_stream_hits,
            /// Stream captures the pool saw an allocation or a free in.
            captures_seen,
            /// Bytes of idle mappings freed during a stream capture: reused only by
            /// later allocations in the same capture, kept (a graph may replay into
            /// them) until the retention scope open at capture time closes, or with none
            /// open until trim or destroy.
            capture_held_bytes,
            /// Failed stream and event calls (`cuEventRecord`, `cuEventQuery`,
            /// `cuEventSynchronize`, `cuStreamWaitEvent`, `cuStreamGetCaptureInfo`,
            /// `cuEventCreate`, `cuStreamCreate`): the memory involved is kept and waited
            /// for with a device synchronize at the next release point that may
            /// synchronize (trim, finish, destroy, out-of-memory).
            stream_call_failures,
            /// Segments held (segment mode): reserved address ranges, each kept until
            /// destroy once made, so that a heap regrows into it.
            segment_count,
            /// Physical handles mapped in segments.
            segment_handles,
            /// Bytes of the handles mapped in segments: `block_live_bytes +
            /// block_free_bytes`.
            segment_mapped_bytes,
            /// Live blocks (segment mode; also counted in `live_count`).
            block_live_count,
            /// Bytes of live blocks, each rounded to 512 bytes.
            block_live_bytes,
            /// Bytes inside mapped handles that no live block holds: free in a heap,
            /// or freed and waiting (on a fence, a capture, a synchronize) before they
            /// return to it (fragmentation, from the device's point of view).
            block_free_bytes,
            /// Handles lent within their segment: a handle whose whole range was free
            /// was mapped again at the segment's growing end (instead of creating a new
            /// handle), its old address left mapped and unused until its release.
            /// Each such handle holds two mappings; its bytes count once.
            segment_handles_lent,
            /// Bytes of the lent handles (each mapped twice, counted once in
            /// `physical_bytes` and `segment_mapped_bytes`).
            segment_lent_bytes,
            /// Idle allocations held in thread caches (issue 13), remote lists
            /// included: reused by their thread with no lock; drained to the books by
            /// scopes, trim, out-of-memory, destroy, a miss of their own thread, and a
            /// cache over its bounds. Counted in `idle_count` (whole mappings) or as
            /// free blocks.
            thread_cache_count,
            /// Bytes of those: part of `idle_bytes` (whole mappings) and
            /// `block_free_bytes` (blocks).
            thread_cache_bytes,
            /// Allocations served from a thread cache (no lock, no driver call); also
            /// counted in `reuse_hits`.
            thread_cache_hits,
            /// Frees of memory that another thread's cache handed out, passed back to
            /// that thread through its lock-free remote list.
            remote_frees,
            /// Tags asleep (issue 15: `Pool::sleep`).
            tags_sleeping,
            /// Live allocations of sleeping tags (unmapped, reservations kept),
            /// `sleeping_held_count` included.
            sleeping_count,
            /// Bytes of live allocations of sleeping tags whose physical handle was
            /// released (their reservations kept): counted in `live_count`, not in
            /// `live_mapped_bytes` nor `physical_bytes`.
            sleeping_bytes,
            /// Of `sleeping_count`, those whose handle the driver refused to release.
            sleeping_held_count,
            /// Bytes of live allocations of sleeping tags that are unmapped but whose
            /// handle the driver refused to release (kept, mapped again at wake): part
            /// of `physical_bytes`.
            sleeping_held_bytes,
            /// Bytes of pinned host memory holding sleeping tags' contents
            /// (`SleepMode::Offload`).
            offloaded_bytes,
            /// Of `sleeping_count`, the blocks of segments (segment mode): their
            /// handles released, their segment's reservation kept (a block holds no
            /// reservation of its own).
            sleeping_block_count,
            /// Bytes of those blocks (512-byte multiples), part of `sleeping_bytes`.
            sleeping_block_bytes,
            /// Bytes of pinned host memory a wake kept for the next offload sleep of
            /// the same size (`Pool::wake`; `Pool::trim` and destroy free it): host
            /// memory the pool holds apart from `offloaded_bytes`.
            host_kept_bytes,
        }
    };
}
pub(crate) use snapshot_counters;

/// [`Snapshot`] and [`Snapshot::count_failure`] from the rows of
/// [`snapshot_counters`].
macro_rules! rust_snapshot {
    (
        $(#[doc = $doc:literal])*
        pub struct Snapshot;
        $( $(#[doc = $fdoc:literal])* $f:ident $(counts $call:ident)?, )*
    ) => {
        $(#[doc = $doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Snapshot {
            /// Whether a retention scope is open.
            pub scope_open: bool,
            $( $(#[doc = $fdoc])* pub $f: u64, )*
        }

        impl Snapshot {
            /// Counts a failed driver call of kind `call` in the counter of its kind,
            /// if there is one (for the calls of [`DriverCall::MEMORY_CALLS`]).
            pub(crate) fn count_failure(&mut self, call: DriverCall) {
                let counter = match call {
                    $($( DriverCall::$call => &mut self.$f, )?)*
                    _ => return,
                };
                *counter += 1;
            }

            /// Failed driver calls of every kind the snapshot counts (the sum of the
            /// `*_failures` counters): 0 on a run where the driver refused nothing.
            pub fn driver_failures(&self) -> u64 {
                0 $($( + { let _ = DriverCall::$call; self.$f } )?)*
            }
        }
    };
}

snapshot_counters!(rust_snapshot! {
    /// A consistent copy of the pool's counters, taken under the pool's lock.
    ///
    /// Byte fields are bytes; `*_count` fields count mappings; the rest count events
    /// since the pool was created; `physical_bytes` counts each physical handle once.
    /// Invariants (checked by the tests after every operation):
    /// `physical_bytes == live_mapped_bytes + idle_bytes + pending_bytes +
    /// segment_mapped_bytes + sleeping_held_bytes` (every handle counted once: whole
    /// mappings live, idle or pending, handles in segments, and the handles of
    /// sleeping allocations the driver refused to release); no sleeping or offloaded
    /// bytes while no tag sleeps;
    /// `segment_mapped_bytes == block_live_bytes + block_free_bytes`;
    /// `physical_bytes <= peak_physical_bytes`; `live_mapped_bytes <= peak_live_mapped_bytes`;
    /// `live_requested_bytes <= live_mapped_bytes + block_live_bytes + sleeping_bytes +
    /// sleeping_held_bytes`;
    /// `allocations == frees + live_count`; `block_live_count <= live_count`;
    /// `event_wait_bytes + capture_held_bytes <= idle_bytes + block_free_bytes`;
    /// `cross_stream_waits <= cross_stream_hits <= reuse_hits`.
    pub struct Snapshot;
});

impl Snapshot {
    /// Checks the accounting invariants; returns a description of the first one
    /// broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.physical_bytes
            != self.live_mapped_bytes
                + self.idle_bytes
                + self.pending_bytes
                + self.segment_mapped_bytes
                + self.sleeping_held_bytes
        {
            return Err(format!(
                "physical {} != live mapped {} + idle {} + pending {} + segment mapped {} \
                 + sleeping held {}",
                self.physical_bytes,
                self.live_mapped_bytes,
                self.idle_bytes,
                self.pending_bytes,
                self.segment_mapped_bytes,
                self.sleeping_held_bytes
            ));
        }
        if (self.tags_sleeping == 0)
            && (self.sleeping_bytes + self.sleeping_held_bytes + self.offloaded_bytes != 0)
        {
            return Err("sleeping or offloaded bytes with no tag asleep".into());
        }
        if self.sleeping_held_count > self.sleeping_count
            || self.sleeping_count > self.live_count
            || (self.sleeping_count == 0) != (self.sleeping_bytes + self.sleeping_held_bytes == 0)
            || (self.sleeping_held_count == 0) != (self.sleeping_held_bytes == 0)
        {
            return Err("sleeping counts and bytes disagree".into());
        }
        if self.sleeping_block_count > self.sleeping_count
            || self.sleeping_block_bytes > self.sleeping_bytes
            || (self.sleeping_block_count == 0) != (self.sleeping_block_bytes == 0)
        {
            return Err("sleeping block counts and bytes disagree".into());
        }
        if self.segment_mapped_bytes != self.block_live_bytes + self.block_free_bytes {
            return Err(format!(
                "segment mapped {} != live blocks {} + free blocks {}",
                self.segment_mapped_bytes, self.block_live_bytes, self.block_free_bytes
            ));
        }
        if self.block_live_count > self.live_count {
            return Err("more live blocks than live allocations".into());
        }
        if (self.block_live_count == 0) != (self.block_live_bytes == 0) {
            return Err("live block count and live block bytes disagree".into());
        }
        if (self.segment_handles == 0) != (self.segment_mapped_bytes == 0) {
            return Err("segment handles and segment mapped bytes disagree".into());
        }
        if (self.segment_handles_lent == 0) != (self.segment_lent_bytes == 0) {
            return Err("lent handles and lent bytes disagree".into());
        }
        if self.segment_lent_bytes > self.segment_mapped_bytes + self.idle_bytes {
            return Err("lent bytes above the bytes of handles held".into());
        }
        if !self.block_live_bytes.is_multiple_of(512) || !self.block_free_bytes.is_multiple_of(512)
        {
            return Err("block bytes not a multiple of 512".into());
        }
        if self.physical_bytes > self.peak_physical_bytes {
            return Err("physical bytes above their peak".into());
        }
        if self.live_mapped_bytes > self.peak_live_mapped_bytes {
            return Err("live mapped bytes above their peak".into());
        }
        let live_bytes = self.live_mapped_bytes
            + self.block_live_bytes
            + self.sleeping_bytes
            + self.sleeping_held_bytes;
        if self.live_requested_bytes > live_bytes {
            return Err("live requested bytes above live mapped and live block bytes".into());
        }
        if self.thread_cache_hits > self.reuse_hits {
            return Err("more thread-cache hits than reuse hits".into());
        }
        if (self.thread_cache_count == 0) != (self.thread_cache_bytes == 0) {
            return Err("thread-cache count and thread-cache bytes disagree".into());
        }
        if self.thread_cache_bytes > self.idle_bytes + self.block_free_bytes {
            return Err(format!(
                "thread-cache bytes {} above idle bytes {} + free block bytes {}",
                self.thread_cache_bytes, self.idle_bytes, self.block_free_bytes
            ));
        }
        if self.reuse_exact_hits > self.reuse_hits {
            return Err("more exact reuse hits than reuse hits".into());
        }
        if self.reuse_forced_hits > self.reuse_hits {
            return Err("more forced reuse hits than reuse hits".into());
        }
        if self.event_wait_bytes + self.capture_held_bytes > self.idle_bytes + self.block_free_bytes
        {
            return Err(format!(
                "event-wait bytes {} + capture-held bytes {} above idle bytes {} + free block bytes {}",
                self.event_wait_bytes, self.capture_held_bytes, self.idle_bytes, self.block_free_bytes
            ));
        }
        if self.cross_stream_hits > self.reuse_hits {
            return Err("more cross-stream hits than reuse hits".into());
        }
        if self.cross_stream_waits > self.cross_stream_hits {
            return Err("more cross-stream waits than cross-stream hits".into());
        }
        if self.allocations != self.frees + self.live_count {
            return Err(format!(
                "allocations {} != frees {} + live {}",
                self.allocations, self.frees, self.live_count
            ));
        }
        let g = self.granularity_bytes.max(1);
        for (name, v) in [
            ("live mapped", self.live_mapped_bytes),
            ("idle", self.idle_bytes),
            ("pending", self.pending_bytes),
            ("reserved", self.reserved_bytes),
            ("segment mapped", self.segment_mapped_bytes),
        ] {
            if v % g != 0 {
                return Err(format!(
                    "{name} bytes {v} not a multiple of the granularity {g}"
                ));
            }
        }
        if (self.live_count == 0) != (live_bytes == 0) {
            return Err("live count and live mapped and block bytes disagree".into());
        }
        if (self.idle_count == 0) != (self.idle_bytes == 0) {
            return Err("idle count and idle bytes disagree".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// The sum covers the eight failure counters and nothing else: each set to a
    /// distinct power of two, the other counters to a value that would show.
    #[test]
    fn driver_failures_sums_the_eight_failure_counters() {
        let s = Snapshot {
            create_failures: 1,
            release_failures: 2,
            reserve_failures: 4,
            reservation_free_failures: 8,
            map_failures: 16,
            access_failures: 32,
            unmap_failures: 64,
            sync_failures: 128,
            allocations: 1 << 20,
            oom_retries: 1 << 21,
            reuse_hits: 1 << 22,
            ..Snapshot::default()
        };
        assert_eq!(s.driver_failures(), 255);
    }

    use super::*;

    /// The fields of `s` that are not 0, as `name: value`, from its `Debug` form.
    fn nonzero_fields(s: &Snapshot) -> Vec<String> {
        let text = format!("{s:?}");
        let inner = text
            .trim_start_matches("Snapshot { ")
            .trim_end_matches(" }");
        inner
            .split(", ")
            .filter(|f| !f.ends_with(": 0") && !f.ends_with(": false"))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn each_memory_call_fails_into_its_own_counter() {
        // The counters' names, written out (each field's doc names its call).
        let want = [
            (DriverCall::Create, "create_failures: 1"),
            (DriverCall::Release, "release_failures: 1"),
            (DriverCall::Reserve, "reserve_failures: 1"),
            (DriverCall::FreeReservation, "reservation_free_failures: 1"),
            (DriverCall::Map, "map_failures: 1"),
            (DriverCall::SetAccess, "access_failures: 1"),
            (DriverCall::Unmap, "unmap_failures: 1"),
            (DriverCall::Synchronize, "sync_failures: 1"),
        ];
        for call in DriverCall::ALL {
            let mut s = Snapshot::default();
            s.count_failure(call);
            let moved = nonzero_fields(&s);
            match want.iter().find(|(c, _)| *c == call) {
                Some((_, field)) => assert_eq!(moved, [*field], "{call:?}"),
                None => assert!(moved.is_empty(), "{call:?} is counted nowhere: {moved:?}"),
            }
        }
        assert_eq!(want.map(|(c, _)| c), DriverCall::MEMORY_CALLS);
        // A second failure adds to the first.
        let mut s = Snapshot::default();
        s.count_failure(DriverCall::Unmap);
        s.count_failure(DriverCall::Unmap);
        assert_eq!(nonzero_fields(&s), ["unmap_failures: 2"]);
    }
}
