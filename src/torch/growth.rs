//! The growth report over a device's per-tensor pools (issue 38): the tensor pool
//! and every graph pool, stamped from one clock ([`TorchAllocator::mark_step`] marks a
//! step for every pool of every device at once).

use super::TorchAllocator;
use crate::error::Result;
use crate::growth::{self, GrowthOptions, GrowthReport};

impl TorchAllocator {
    /// Writes a step marker (Python's `mark_step()`): allocations of every pool of
    /// every device made from now on belong to the next step of
    /// [`TorchAllocator::growth_report`]. A recording pool writes a `step` line.
    pub fn mark_step(&self) {
        self.clock.mark();
        for d in self.created() {
            d.tensor.record_step();
            d.mempool.record_step();
            for g in d.graphs().pools.values() {
                g.pool.record_step();
            }
        }
    }

    /// The growth report of `device`'s per-tensor allocations (`crate::growth`): what
    /// is live in its tensor pool and in every graph pool, grouped by tag, size and
    /// step, the groups that keep growing first. Steps: the markers of
    /// [`TorchAllocator::mark_step`], else the retention scopes begun (a graph pool
    /// begins one when it is made, `retention()` another), else
    /// [`GrowthOptions::step_events`] allocations, counted over every pool of every
    /// device. The mempool pool (PyTorch's segments, not tensors) is left out. A
    /// device not used yet has nothing live.
    ///
    /// Errors: [`crate::Error::InvalidArgument`] for a device outside `0..64` (or
    /// beyond the simulated machine's).
    pub fn growth_report(&self, device: i32, options: &GrowthOptions) -> Result<GrowthReport> {
        let slot = self.known(device)?;
        let mut live = Vec::new();
        if let Some(d) = slot.get() {
            live = d.tensor.growth_records().0;
            for g in d.graphs().pools.values() {
                live.extend(g.pool.growth_records().0);
            }
        }
        Ok(growth::analyze(&live, self.clock.counts(), options))
    }
}

#[cfg(all(test, not(flare_loom)))]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed step is their failure
mod tests {
    use super::super::{TorchAllocator, TorchConfig};
    use crate::growth::{GroupSize, GrowthOptions, StepKind};
    use crate::{Backend, CaptureMode, CuResult, SimConfig, Stream};

    const MIB: u64 = 1 << 20;

    /// One report over the tensor pool and every graph pool of a device, on one
    /// clock: a marker counts once for every pool; a graph's output, kept, is in its
    /// step; graph pools begin scopes, which do not count once markers were written;
    /// the other device's allocations are not in it, its markers are.
    #[test]
    fn the_report_covers_the_tensor_pool_and_the_graph_pools() {
        let a = TorchAllocator::new(TorchConfig {
            backend: Backend::Simulated(SimConfig {
                capacity_bytes: 140 << 30,
                device_count: 2,
                ..SimConfig::default()
            }),
            ..TorchConfig::default()
        });
        let sim = a.sim_driver(0).unwrap();
        let s = Stream(sim.stream_create().unwrap());
        let other = a.alloc(7 * MIB, 1, Stream(0)).unwrap();
        for i in 1..=40u64 {
            a.mark_step();
            // Kept in the tensor pool every step: grows.
            a.alloc(MIB, 0, s).unwrap();
            let t = a.alloc(3 * MIB, 0, s).unwrap();
            a.free(t, 0, s).unwrap();
            if i % 10 == 0 {
                // A graph captured every tenth step; its 2 MiB output kept.
                let id = (i, 0);
                a.begin_allocate_to_pool(0, id).unwrap();
                assert!(sim
                    .stream_begin_capture(s.0, CaptureMode::Global)
                    .is_success());
                a.alloc(2 * MIB, 0, s).unwrap();
                assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
                a.end_allocate_to_pool(0, id).unwrap();
            }
        }
        let r = a.growth_report(0, &GrowthOptions::default()).unwrap();
        assert_eq!(
            (r.step_kind, r.counts.markers, r.steps),
            (StepKind::Markers, 40, 41)
        );
        assert_eq!(r.counts.scopes, 4, "one per graph pool");
        assert_eq!(a.graph_snapshots(0).len(), 4);
        let got: Vec<_> = r
            .groups
            .iter()
            .map(|g| {
                (
                    g.size,
                    g.count,
                    g.first_step,
                    g.last_step,
                    g.distinct_steps,
                    g.grows,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (GroupSize::Bytes(MIB), 40, 1, 40, 40, true),
                (GroupSize::Bytes(2 * MIB), 4, 10, 40, 4, false),
            ]
        );
        // Device 1: its allocation, made before the first marker.
        let r = a.growth_report(1, &GrowthOptions::default()).unwrap();
        assert_eq!((r.live_count, r.steps), (1, 41));
        assert_eq!(r.groups[0].first_step, 0);
        a.free(other, 1, Stream(0)).unwrap();
        // A device the machine lacks is refused.
        assert!(a.growth_report(2, &GrowthOptions::default()).is_err());
    }
}
