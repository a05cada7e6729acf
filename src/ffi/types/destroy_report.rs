//! `FlareDestroyReport`: what destroying a pool released.

use std::mem::size_of;

use super::super::generate::versioned_struct;
use crate::pool::Snapshot;

versioned_struct! {
    /// What `flare_pool_destroy_report` released: the allocations that were still live
    /// when the pool was destroyed (a leak on the caller's side, or a deliberate
    /// teardown), and everything the pool held.
    ///
    /// Versioning: as for `FlareSnapshot`, the caller sets `struct_size` to
    /// `sizeof(FlareDestroyReport)`; only the fields lying wholly inside `struct_size`
    /// bytes are written, `struct_size` itself is left as it is. It must cover at least
    /// `struct_size` and `scope_was_open` (8 bytes) and be at most 4096.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct FlareDestroyReport {
        /// `sizeof(FlareDestroyReport)`, bytes; set by the caller.
        pub struct_size: u32,
        /// 1 when a retention scope was still open (the destroy closed it), else 0.
        pub scope_was_open: u32,
        /// Allocations still live, released with the pool.
        pub live_count: u64,
        /// Bytes the callers had asked for, summed over those allocations (not rounded).
        pub live_requested_bytes: u64,
        /// Bytes the pool held for those allocations: each whole mapping's size (the
        /// request rounded to the granularity), and in `FLARE_REUSE_SEGMENTS` each
        /// block's size (the request rounded to 512 bytes); the snapshot's
        /// `live_mapped_bytes + block_live_bytes` (plus, for allocations of a sleeping
        /// tag, `sleeping_bytes + sleeping_held_bytes`: unmapped, still live).
        pub live_mapped_bytes: u64,
        /// Physical bytes the pool held on the device (live, idle, pending and
        /// mapped in segments: the snapshot's `physical_bytes`), all
        /// released, unless the status is `FLARE_STATUS_DRIVER_ERROR`: then what the
        /// driver refused is left to it.
        pub physical_bytes: u64,
    }
}
impl FlareDestroyReport {
    /// What destroying a pool in state `s` releases.
    pub(crate) fn before_destroy(s: &Snapshot) -> Self {
        FlareDestroyReport {
            struct_size: size_of::<FlareDestroyReport>() as u32,
            scope_was_open: u32::from(s.scope_open),
            live_count: s.live_count,
            live_requested_bytes: s.live_requested_bytes,
            // Sleeping allocations (issue 15) are live: their bytes count, mapped
            // or not.
            live_mapped_bytes: s.live_mapped_bytes
                + s.block_live_bytes
                + s.sleeping_bytes
                + s.sleeping_held_bytes,
            physical_bytes: s.physical_bytes,
        }
    }
}
