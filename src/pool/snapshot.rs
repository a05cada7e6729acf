//! Snapshot accounting.

/// A consistent copy of the pool's counters, taken under the pool's lock.
///
/// Byte fields are bytes; `*_count` fields count mappings; the rest count events
/// since the pool was created. Invariants (checked by the tests after every
/// operation): `physical_bytes == live_mapped_bytes + idle_bytes + pending_bytes`;
/// `physical_bytes <= peak_physical_bytes`; `live_mapped_bytes <= peak_live_mapped_bytes`;
/// `live_requested_bytes <= live_mapped_bytes`;
/// `allocations == frees + live_count`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Whether a retention scope is open.
    pub scope_open: bool,
    /// The driver's allocation granularity, bytes; every mapping is a multiple.
    pub granularity_bytes: u64,
    /// Live allocations (handed out, not yet freed).
    pub live_count: u64,
    /// Bytes the callers asked for, summed over live allocations (not rounded).
    pub live_requested_bytes: u64,
    /// Bytes mapped for live allocations (rounded to mappings' sizes).
    pub live_mapped_bytes: u64,
    /// Idle mappings: retained in a scope or cached, mapped, reusable.
    pub idle_count: u64,
    /// Bytes of idle mappings.
    pub idle_bytes: u64,
    /// Mappings whose release failed part-way and will be retried.
    pub pending_count: u64,
    /// Physical bytes of pending mappings whose handle is not yet released.
    pub pending_bytes: u64,
    /// Physical bytes the pool holds on the device (each handle counted once).
    pub physical_bytes: u64,
    /// Bytes of virtual address space the pool holds reserved.
    pub reserved_bytes: u64,
    /// High watermark of `physical_bytes`.
    pub peak_physical_bytes: u64,
    /// High watermark of `live_mapped_bytes`.
    pub peak_live_mapped_bytes: u64,
    /// Successful allocations.
    pub allocations: u64,
    /// Successful frees.
    pub frees: u64,
    /// Allocations served from an idle mapping (no driver call).
    pub reuse_hits: u64,
    /// Of `reuse_hits`, those whose mapping had exactly the rounded size.
    pub reuse_exact_hits: u64,
    /// Of `reuse_hits`, those forced by an out-of-memory: no idle mapping fitted
    /// under the policy (exact size, or the best-fit waste bound), the device was
    /// full, and the smallest idle mapping that fits was taken whatever its size
    /// rather than failing or releasing memory.
    pub reuse_forced_hits: u64,
    /// Mappings created (create, reserve, map, set access all succeeded).
    pub mappings_created: u64,
    /// Mappings fully released (unmapped, handle released, reservation freed).
    pub mappings_released: u64,
    /// Out-of-memory failures outside a scope answered by releasing idle mappings and
    /// retrying once.
    pub oom_retries: u64,
    /// Failed `cuMemCreate` calls (out of memory included).
    pub create_failures: u64,
    /// Failed `cuMemAddressReserve` calls.
    pub reserve_failures: u64,
    /// Failed `cuMemMap` calls.
    pub map_failures: u64,
    /// Failed `cuMemSetAccess` calls.
    pub access_failures: u64,
    /// Failed `cuMemUnmap` calls.
    pub unmap_failures: u64,
    /// Failed `cuMemRelease` calls.
    pub release_failures: u64,
    /// Failed `cuMemAddressFree` calls.
    pub reservation_free_failures: u64,
    /// Failed `cuCtxSynchronize` calls (a capture in progress, a lost context).
    pub sync_failures: u64,
    /// Retention scopes closed with finish.
    pub scopes_finished: u64,
    /// Retention scopes closed with abort.
    pub scopes_aborted: u64,
}

impl Snapshot {
    /// Checks the accounting invariants; returns a description of the first one
    /// broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.physical_bytes != self.live_mapped_bytes + self.idle_bytes + self.pending_bytes {
            return Err(format!(
                "physical {} != live mapped {} + idle {} + pending {}",
                self.physical_bytes, self.live_mapped_bytes, self.idle_bytes, self.pending_bytes
            ));
        }
        if self.physical_bytes > self.peak_physical_bytes {
            return Err("physical bytes above their peak".into());
        }
        if self.live_mapped_bytes > self.peak_live_mapped_bytes {
            return Err("live mapped bytes above their peak".into());
        }
        if self.live_requested_bytes > self.live_mapped_bytes {
            return Err("live requested bytes above live mapped bytes".into());
        }
        if self.reuse_exact_hits > self.reuse_hits {
            return Err("more exact reuse hits than reuse hits".into());
        }
        if self.reuse_forced_hits > self.reuse_hits {
            return Err("more forced reuse hits than reuse hits".into());
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
        ] {
            if v % g != 0 {
                return Err(format!(
                    "{name} bytes {v} not a multiple of the granularity {g}"
                ));
            }
        }
        if (self.live_count == 0) != (self.live_mapped_bytes == 0) {
            return Err("live count and live mapped bytes disagree".into());
        }
        if (self.idle_count == 0) != (self.idle_bytes == 0) {
            return Err("idle count and idle bytes disagree".into());
        }
        Ok(())
    }
}
