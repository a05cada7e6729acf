//! One device's state: its driver, tensor and mempool pools, and its graph pools
//! with the captures bound to them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use super::{MempoolId, TorchConfig};
use crate::driver::{DevicePtr, Driver};
use crate::error::Result;
use crate::pool::{Pool, PoolConfig, ReusePolicy};

/// One graph pool: its [`Pool`] (a retention scope open for its whole life) and who
/// still holds it.
pub(super) struct GraphPool {
    pub(super) pool: Pool,
    /// Begins minus releases (PyTorch calls `releasePool` once per graph that began
    /// allocating to it).
    pub(super) refs: u64,
    /// Allocations of this pool not yet freed.
    pub(super) live: u64,
}

/// A graph pool between `beginAllocateToPool` and `endAllocateToPool`.
pub(super) struct Pending {
    pub(super) id: MempoolId,
    pub(super) thread: ThreadId,
    /// The capture bound to it at its first allocation on a capturing stream.
    pub(super) capture: Option<u64>,
}

#[derive(Default)]
pub(super) struct Graphs {
    pub(super) pools: HashMap<MempoolId, GraphPool>,
    /// Live allocations of graph pools: address -> pool.
    pub(super) owner: HashMap<DevicePtr, MempoolId>,
    pub(super) pending: Vec<Pending>,
    /// Capture id -> graph pool, for the captures bound so far.
    pub(super) captures: HashMap<u64, MempoolId>,
    /// Graph pools made so far on this device (numbers their recordings).
    pub(super) made: u64,
}

/// Everything of one device.
pub(super) struct Device {
    pub(super) index: i32,
    pub(super) driver: Arc<dyn Driver>,
    pub(super) tensor: Pool,
    pub(super) mempool: Pool,
    pub(super) graphs: Mutex<Graphs>,
    /// `graphs.pools.len()`, read with no lock: frees look at the owner map only when
    /// it is above 0.
    pub(super) graph_pools: AtomicUsize,
    /// `graphs.pending.len()`: allocations ask whether their stream is captured only
    /// when it is above 0.
    pub(super) pending: AtomicUsize,
}

/// A lock that a panic in another thread cannot make unusable: the data under these
/// locks is left consistent between statements.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Device {
    /// A graph pool's configuration (`number`: the how-many-th graph pool of this
    /// device, for its recording's file name).
    pub(super) fn pool_config(
        &self,
        config: &TorchConfig,
        policy: ReusePolicy,
        number: u64,
    ) -> PoolConfig {
        PoolConfig {
            backend: config.backend,
            device: self.index,
            reuse_policy: policy,
            peer_devices: config.peer_devices.clone(),
            cross_stream_reuse: config.cross_stream_reuse,
            record_path: config.record_file(self.index, &format!("graph-{number}")),
            history_events: config.history_events,
            ..PoolConfig::default()
        }
    }

    pub(super) fn graphs(&self) -> MutexGuard<'_, Graphs> {
        lock(&self.graphs)
    }

    /// Updates the lock-free counts from `g` (under its lock).
    pub(super) fn publish(&self, g: &Graphs) {
        self.graph_pools.store(g.pools.len(), Ordering::Release);
        self.pending.store(g.pending.len(), Ordering::Release);
    }

    /// The graph pool capture `capture` allocates to, binding it to one when it is
    /// not bound yet (see the module's documentation); `None` when no graph pool is
    /// begun.
    pub(super) fn pool_for_capture(g: &mut Graphs, capture: u64) -> Option<MempoolId> {
        if let Some(&id) = g.captures.get(&capture) {
            return Some(id);
        }
        let me = std::thread::current().id();
        let unbound = |p: &&mut Pending| p.capture.is_none();
        let index = g
            .pending
            .iter_mut()
            .enumerate()
            .rev()
            .filter(|(_, p)| unbound(p))
            .find(|(_, p)| p.thread == me)
            .map(|(i, _)| i)
            .or_else(|| g.pending.iter().rposition(|p| p.capture.is_none()))?;
        let p = &mut g.pending[index];
        p.capture = Some(capture);
        g.captures.insert(capture, p.id);
        Some(p.id)
    }

    /// Removes and returns the graph pools that may be destroyed now: released by
    /// PyTorch, nothing live, not begun; none while a graph pool is begun on this
    /// device (a capture may be open: destroying synchronizes the device).
    pub(super) fn take_destroyable(g: &mut Graphs) -> Vec<Pool> {
        if !g.pending.is_empty() {
            return Vec::new();
        }
        let ids: Vec<MempoolId> = g
            .pools
            .iter()
            .filter(|(_, p)| p.refs == 0 && p.live == 0)
            .map(|(&id, _)| id)
            .collect();
        ids.into_iter()
            .filter_map(|id| g.pools.remove(&id).map(|p| p.pool))
            .collect()
    }

    /// Destroys `pools` (outside the graphs lock). The first error is returned; every
    /// pool is destroyed regardless.
    pub(super) fn destroy(pools: Vec<Pool>) -> Result<()> {
        let mut first = Ok(());
        for pool in pools {
            // Destroy releases everything, the scope opened at creation notwithstanding.
            let r = pool.destroy();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}
