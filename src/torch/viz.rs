//! One memory_viz snapshot of every pool of the allocator (issue 38): PyTorch's own
//! `torch.cuda.memory._snapshot()` does not show a pluggable allocator's memory.

use std::path::Path;

use super::device::lock;
use super::TorchAllocator;
use crate::error::Result;
use crate::viz::{snapshot_pickle, SnapshotPool};

impl TorchAllocator {
    /// The memory_viz snapshot of every device made so far (`crate::viz` documents
    /// the format): the tensor pool's segments (`segment_pool_id` `(0, 0)`), the
    /// mempool pool's (also `(0, 0)`: whole mappings, not expandable) and each graph
    /// pool's (its `MempoolId`), and with `FLARE_TORCH_HISTORY` set, every pool's
    /// recent events merged in the order they happened, one list per device.
    ///
    /// Errors: as [`crate::viz::snapshot_pickle`].
    pub fn snapshot_pickle(&self) -> Result<Vec<u8>> {
        let devices: Vec<_> = self.created().collect();
        // Each device's graph pools stay locked while the snapshot is taken (the
        // order every allocation into a graph pool takes: graphs, then the pool).
        let guards: Vec<_> = devices.iter().map(|d| lock(&d.graphs)).collect();
        let mut pools = Vec::new();
        for (d, g) in devices.iter().zip(&guards) {
            pools.push(SnapshotPool {
                pool: &d.tensor,
                pool_id: (0, 0),
            });
            pools.push(SnapshotPool {
                pool: &d.mempool,
                pool_id: (0, 0),
            });
            let mut ids: Vec<_> = g.pools.keys().copied().collect();
            ids.sort_unstable();
            for id in ids {
                if let Some(gp) = g.pools.get(&id) {
                    pools.push(SnapshotPool {
                        pool: &gp.pool,
                        pool_id: id,
                    });
                }
            }
        }
        snapshot_pickle(&pools)
    }

    /// Writes [`TorchAllocator::snapshot_pickle`] to `path` (created or truncated).
    ///
    /// Errors: [`crate::Error::Io`] when the file cannot be written.
    pub fn dump_snapshot(&self, path: &Path) -> Result<()> {
        let bytes = self.snapshot_pickle()?;
        std::fs::write(path, bytes).map_err(|e| crate::Error::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }
}
