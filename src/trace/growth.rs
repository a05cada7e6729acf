//! [`Trace::growth_report`]: the growth report of a trace's own lines (no replay, no
//! pool: the same for every policy), as a live pool stamps its allocations.

use super::{Event, Trace};
use crate::growth::{self, GrowthOptions, GrowthReport, LiveAllocation, StepCounts};

impl Trace {
    /// The growth report of this trace at its end (`crate::growth`): the
    /// allocations still live after its last line, each stamped with its place among
    /// the `a` lines (its sequence number), the `step` lines and the `begin` lines
    /// before it. What a pool that made these calls reports
    /// ([`Pool::growth_report`](crate::Pool::growth_report)) after them, except that a
    /// replay's implicit retention scope (a trace without scope lines) is a scope
    /// begun for the pool, and none here. `x` lines allocate nothing.
    pub fn growth_report(&self, options: &GrowthOptions) -> GrowthReport {
        let (live, counts) = self.growth_records();
        growth::analyze(&live, counts, options)
    }

    /// The allocations live at the trace's end with their stamps, and the counts
    /// at the end.
    pub fn growth_records(&self) -> (Vec<LiveAllocation>, StepCounts) {
        let mut live: Vec<Option<LiveAllocation>> = vec![None; self.id_count()];
        let mut c = StepCounts::default();
        for e in &self.events {
            let (id, bytes, tag) = match *e {
                Event::Alloc { id, bytes } => (id, bytes, 0),
                Event::AllocTagged { id, bytes, tag }
                | Event::AllocAsync { id, bytes, tag, .. } => (id, bytes, tag),
                Event::Free { id } | Event::FreeAsync { id, .. } => {
                    if let Some(slot) = live.get_mut(id as usize) {
                        *slot = None;
                    }
                    continue;
                }
                Event::Step => {
                    c.markers += 1;
                    continue;
                }
                Event::Begin => {
                    c.scopes += 1;
                    continue;
                }
                _ => continue,
            };
            if let Some(slot) = live.get_mut(id as usize) {
                *slot = Some(LiveAllocation {
                    bytes,
                    tag,
                    seq: c.allocations,
                    markers: c.markers,
                    scopes: c.scopes,
                });
            }
            c.allocations += 1;
        }
        (live.into_iter().flatten().collect(), c)
    }
}
