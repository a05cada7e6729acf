//! Destroy: what sleeping tags hold becomes pending releases.

use crate::driver::HostBuffer;
use crate::pool::books::{MappingState, State};
use crate::pool::Pool;
use crate::sync::lock;

impl Pool {
    /// Destroy: every sleeping allocation becomes a pending release of what is left
    /// (its reservation, and a handle the driver kept); host buffers are freed.
    pub(in crate::pool) fn drop_sleeping(&self) {
        let hosts: Vec<HostBuffer> = {
            let mut st = lock(&self.state);
            st.drop_sleeping_segments();
            let asleep: Vec<u32> = st
                .live
                .values()
                .copied()
                .filter(|&s| st.mref(s).asleep)
                .collect();
            for slot in asleep {
                let m = st.mapping(slot);
                st.live.remove(&m.ptr());
                let size = m.size();
                let c = &mut st.counters;
                c.live_count -= 1;
                c.live_requested_bytes -= m.requested;
                c.frees += 1;
                c.sleeping_count -= 1;
                if m.handle_live {
                    c.sleeping_held_count -= 1;
                    c.sleeping_held_bytes -= size;
                    c.pending_bytes += size;
                } else {
                    c.sleeping_bytes -= size;
                }
                c.pending_count += 1;
                let mm = st.mapping_mut(slot);
                mm.asleep = false;
                mm.state = MappingState::Pending;
                mm.mapped = false;
                mm.requested = 0;
                st.pending.push(slot);
            }
            let mut hosts = Vec::new();
            for t in st.tags.values_mut() {
                t.sleeping = None;
                if let Some(h) = t.host.take() {
                    hosts.push(h);
                }
                t.asleep.clear();
            }
            st.counters.tags_sleeping = 0;
            st.counters.offloaded_bytes = 0;
            hosts.extend(st.take_spare_host(|_| true));
            self.reset_gate();
            hosts
        };
        for h in hosts {
            let _ = self.driver.host_free(h);
        }
    }
}

impl State {
    /// Destroy: every sleeping segment's blocks are forgotten (its live blocks
    /// counted as freed), its handle slots removed, the segment emptied (its
    /// reservation is freed with the empty segments).
    fn drop_sleeping_segments(&mut self) {
        let tags: Vec<u32> = self
            .tags
            .iter()
            .filter(|(_, t)| !t.seg_sleep.segs.is_empty())
            .map(|(&k, _)| k)
            .collect();
        for tag in tags {
            let ss = match self.tags.get_mut(&tag) {
                Some(t) => std::mem::take(&mut t.seg_sleep),
                None => continue,
            };
            for &(slot, _) in &ss.live {
                let m = self.mapping(slot);
                self.live.remove(&m.ptr());
                let size = m.size();
                let c = &mut self.counters;
                c.live_count -= 1;
                c.live_requested_bytes -= m.requested;
                c.frees += 1;
                c.sleeping_count -= 1;
                c.sleeping_bytes -= size;
                c.sleeping_block_count -= 1;
                c.sleeping_block_bytes -= size;
                self.remove_slot(slot);
            }
            for &slot in &ss.free {
                self.remove_slot(slot);
            }
            for h in &ss.handles {
                self.remove_slot(h.slot);
            }
            for &sid in &ss.segs {
                let seg = &mut self.segs.segs[sid as usize];
                seg.asleep = false;
                seg.busy -= 1;
                seg.claimed = 0;
                seg.tail = crate::pool::books::NIL;
                seg.tail_end = seg.reservation.ptr;
            }
        }
    }
}
