//! [`Pool::growth_report`]: the pool's live allocations, each with the stamp it got
//! when it was made (`steps.rs`), analysed by `crate::growth`.

use super::Pool;
use crate::growth::{self, GrowthOptions, GrowthReport, LiveAllocation, StepCounts};

impl Pool {
    /// The growth report of this pool now: its live allocations grouped by tag,
    /// size and the step they were made in, with each group's rate, the groups that
    /// keep growing first (`crate::growth` says how steps are cut, how groups are
    /// made and what grows). Steps are the markers of [`Pool::mark_step`] when one
    /// was written, else the retention scopes begun, else
    /// [`GrowthOptions::step_events`] allocations.
    ///
    /// Takes the books' lock (and every thread cache's) while it copies what is
    /// live, as [`Pool::snapshot`] does: linear in the allocations live. Changes
    /// nothing.
    pub fn growth_report(&self, options: &GrowthOptions) -> GrowthReport {
        let (live, counts) = self.growth_records();
        growth::analyze(&live, counts, options)
    }

    /// The live allocations with their stamps, and the counts after them.
    pub(crate) fn growth_records(&self) -> (Vec<LiveAllocation>, StepCounts) {
        let live = self.caches.with_live(&self.state, |st, cached| {
            let mut out = Vec::with_capacity(st.live.len() + cached.len());
            for &slot in st.live.values() {
                let m = st.mref(slot);
                out.push(record(m.requested, m.tag, m.stamp));
            }
            for &(requested, stamp) in cached {
                out.push(record(requested, 0, stamp));
            }
            out
        });
        // Read after the records: no record's stamp is past the counts (the
        // analysis copes with one that is all the same).
        (live, self.clock.counts())
    }
}

fn record(bytes: u64, tag: u32, stamp: super::steps::Stamp) -> LiveAllocation {
    LiveAllocation {
        bytes,
        tag,
        seq: stamp.seq,
        markers: stamp.markers(),
        scopes: stamp.scopes(),
    }
}
