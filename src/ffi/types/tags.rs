//! The tag types: `FlareSleepMode` (what a sleep does with the contents) and its
//! integer form, and `FlareTagCensus` (what one tag holds).

use super::super::generate::{c_enum, versioned_struct};

c_enum! {
    /// What `flare_pool_sleep` does with the contents of a tag's live allocations.
    pub enum FlareSleepMode;
    /// Contents are lost: after `flare_pool_wake` every pointer is valid again with
    /// unspecified contents.
    FLARE_SLEEP_DISCARD = 0;
    /// Contents are copied to pinned host memory before the physical memory is
    /// released, and copied back at wake.
    FLARE_SLEEP_OFFLOAD = 1;
}
/// A `FlareSleepMode` as C passes it (see [`RawStatus`]).
///
/// [`RawStatus`]: super::RawStatus
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawSleepMode(pub u32);
versioned_struct! {
    /// What one tag holds (`flare_pool_tag_census`; issue 15). Bytes are the pool's
    /// sizes: a whole mapping's (the request rounded to the granularity), a block's
    /// (rounded to 512 bytes); except `offloaded_bytes`, the requested bytes (what is
    /// copied).
    ///
    /// Versioning: as for `FlareSnapshot`, the caller sets `struct_size` to
    /// `sizeof(FlareTagCensus)`; only the fields lying wholly inside `struct_size`
    /// bytes are written. It must cover at least `struct_size` and `sleeping` (8
    /// bytes) and be at most 4096.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct FlareTagCensus {
        /// `sizeof(FlareTagCensus)`, bytes; set by the caller.
        pub struct_size: u32,
        /// 1 while the tag sleeps (`flare_pool_sleep` succeeded, no wake yet), else 0.
        pub sleeping: u32,
        /// Live allocations of the tag, sleeping ones included.
        pub live_count: u64,
        /// Bytes of those.
        pub live_bytes: u64,
        /// High watermark of `live_bytes` (tag 0: the highest a census saw).
        pub peak_live_bytes: u64,
        /// Idle bytes the tag holds (tag 0: every idle mapping and free block not in
        /// another tag's bucket).
        pub idle_bytes: u64,
        /// Physical bytes the tag holds on the device (0 while it sleeps, unless the
        /// driver refused to release a handle).
        pub physical_bytes: u64,
        /// Bytes of pinned host memory holding the tag's contents while it sleeps in
        /// `FLARE_SLEEP_OFFLOAD`: the sum of its live allocations' requested bytes
        /// (what was asked, not the rounded sizes: only those bytes are copied).
        pub offloaded_bytes: u64,
        /// Bytes the tag's zeroing wakes (`flare_pool_wake_zeroed`) set to zero,
        /// cumulative: each live allocation's requested bytes, per wake from a discard
        /// sleep. Added after `offloaded_bytes`: a caller whose `struct_size` ends
        /// there is not written here.
        pub zeroed_bytes: u64,
        /// Memsets (`cuMemsetD8Async`) those wakes queued, cumulative.
        pub zero_memsets: u64,
    }
}

impl FlareTagCensus {
    /// The C copy of a [`crate::TagCensus`] (`struct_size` set to this header's).
    pub(crate) fn from_census(c: &crate::TagCensus) -> Self {
        FlareTagCensus {
            struct_size: std::mem::size_of::<FlareTagCensus>() as u32,
            sleeping: u32::from(c.sleeping),
            live_count: c.live_count,
            live_bytes: c.live_bytes,
            peak_live_bytes: c.peak_live_bytes,
            idle_bytes: c.idle_bytes,
            physical_bytes: c.physical_bytes,
            offloaded_bytes: c.offloaded_bytes,
            zeroed_bytes: c.zeroed_bytes,
            zero_memsets: c.zero_memsets,
        }
    }
}
