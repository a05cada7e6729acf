//! `FlareSnapshot`: a consistent copy of a pool's counters.

use super::super::generate::c_snapshot;
use crate::pool::snapshot_counters;

snapshot_counters!(c_snapshot! {
    /// A consistent copy of a pool's counters (taken under the pool's lock).
    ///
    /// Byte fields are bytes; `*_count` fields count mappings (`segment_count`
    /// segments, `block_live_count` blocks); the other counters count events since
    /// the pool was created. These always hold (every physical handle is counted
    /// once: whole mappings live, idle or pending, and the handles mapped in
    /// segments): `physical_bytes == live_mapped_bytes + idle_bytes + pending_bytes +
    /// segment_mapped_bytes`; `segment_mapped_bytes == block_live_bytes +
    /// block_free_bytes`; `allocations == frees + live_count`; `block_live_count <=
    /// live_count`. The segment fields are 0 unless `reuse_policy` is
    /// `FLARE_REUSE_SEGMENTS`; there a live block counts in `live_count` and
    /// `live_requested_bytes` but not in `live_mapped_bytes` (its bytes are in
    /// `block_live_bytes`), and a segment's reservation stays in `reserved_bytes`
    /// and `segment_count` after its last handle is released, until the pool is
    /// destroyed.
    ///
    /// Versioning: the caller sets `struct_size` to `sizeof(FlareSnapshot)` of its
    /// header; only the fields lying wholly inside `struct_size` bytes are written, and
    /// `struct_size` itself is left as it is. It must cover at least `struct_size` and
    /// `scope_open` (8 bytes) and be at most 4096, else `FLARE_STATUS_INVALID_ARGUMENT`.
    /// Fields are only ever added at the end: `reuse_forced_hits` was added in 0.1.0
    /// after `reserve_failures` (an older caller's `struct_size` leaves it out), the
    /// stream counters (`events_outstanding` to `stream_call_failures`) after it
    /// (`sizeof` 304), the segment counters (`segment_count` to `segment_lent_bytes`)
    /// after those (`sizeof` grew from 304 to 368: a caller's `struct_size` of 304
    /// leaves them unwritten), the thread-cache counters (`thread_cache_count` to
    /// `remote_frees`, issue 13) after those (`sizeof` grew from 368 to 400).
    pub struct FlareSnapshot;
});
