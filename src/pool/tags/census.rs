//! The census of a tag: what it holds, from its books (tag 0: the rest of the pool).

use super::books::TagBooks;
use super::TagCensus;
use crate::pool::Pool;
use crate::sync::lock;

impl Pool {
    /// The census of tag `tag`: exact (under the lock, with every thread cache's
    /// deltas for tag 0), O(number of tags), no walk over allocations. A tag never
    /// used reads all zeros.
    pub fn tag_census(&self, tag: u32) -> TagCensus {
        let snap = self.snapshot();
        let mut st = lock(&self.state);
        // Segment mode: the tag's heaps' handles hold its live blocks; the rest of
        // them (free blocks, a handle being released) is idle.
        let own = |t: &TagBooks| TagCensus {
            sleeping: t.sleeping.is_some(),
            live_count: t.live_count,
            live_bytes: t.live_bytes,
            peak_live_bytes: t.peak_live_bytes,
            idle_bytes: t.idle_bytes + t.seg_physical.saturating_sub(t.seg_live),
            physical_bytes: t.live_physical + t.idle_bytes + t.seg_physical,
            offloaded_bytes: t.host.map_or(0, |h| h.size),
            zeroed_bytes: t.zeroed.bytes,
            zero_memsets: t.zeroed.memsets,
        };
        if tag != 0 {
            return st.tags.get(&tag).map(own).unwrap_or_default();
        }
        let mut c = TagCensus {
            live_count: snap.live_count,
            live_bytes: snap.live_mapped_bytes
                + snap.block_live_bytes
                + snap.sleeping_bytes
                + snap.sleeping_held_bytes,
            idle_bytes: snap.idle_bytes + snap.block_free_bytes,
            physical_bytes: snap.physical_bytes - snap.pending_bytes,
            ..TagCensus::default()
        };
        for (&t, b) in st.tags.iter().filter(|(&t, _)| t != 0) {
            let _ = t;
            let o = own(b);
            c.live_count = c.live_count.saturating_sub(o.live_count);
            c.live_bytes = c.live_bytes.saturating_sub(o.live_bytes);
            c.idle_bytes = c.idle_bytes.saturating_sub(o.idle_bytes);
            c.physical_bytes = c.physical_bytes.saturating_sub(o.physical_bytes);
        }
        let zero = st.tags.entry(0).or_default();
        zero.peak_live_bytes = zero.peak_live_bytes.max(c.live_bytes);
        c.peak_live_bytes = zero.peak_live_bytes;
        c.sleeping = zero.sleeping.is_some();
        c.offloaded_bytes = zero.host.map_or(0, |h| h.size);
        c.zeroed_bytes = zero.zeroed.bytes;
        c.zero_memsets = zero.zeroed.memsets;
        c
    }
}
