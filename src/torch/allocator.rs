//! [`TorchAllocator`]: the pools behind PyTorch's allocator hooks, one set per
//! device, and the hooks' operations.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::device::{lock, Device, GraphPool, Graphs, Pending};
use super::{MempoolId, TorchConfig, MAX_DEVICES};
use crate::driver::{DevicePtr, Driver, Stream};
use crate::error::{Error, Result};
use crate::pool::{Backend, Pool, PoolConfig, Snapshot, StepClock};

/// Which of a device's pools an operation or a snapshot is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// The tensor pool (per-tensor mode, outside graph pools).
    Tensor,
    /// The mempool pool (pool mode: PyTorch's segments).
    Mempool,
}

/// Bytes of the pool behind an out-of-memory message: live and idle as the
/// [`Error::OutOfMemory`] counts them.
fn live_idle(s: &Snapshot) -> (u64, u64) {
    (
        s.live_mapped_bytes + s.block_live_bytes,
        s.idle_bytes + s.block_free_bytes,
    )
}

/// The pools behind PyTorch's allocator hooks, one set per device (see the module's
/// documentation). `Send + Sync`; every method may be called from any thread.
pub struct TorchAllocator {
    pub(super) config: TorchConfig,
    devices: [OnceLock<Device>; MAX_DEVICES],
    /// Serializes device creation (a device is created once).
    creating: Mutex<()>,
    /// The step clock every pool of every device stamps its allocations from
    /// (`growth.rs`): one step marker counts for them all.
    pub(super) clock: Arc<StepClock>,
}

impl TorchAllocator {
    /// An allocator that will make its pools from `config` (nothing is created
    /// before a device is first used).
    pub fn new(config: TorchConfig) -> TorchAllocator {
        TorchAllocator {
            config,
            devices: std::array::from_fn(|_| OnceLock::new()),
            creating: Mutex::new(()),
            clock: Arc::new(StepClock::new()),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &TorchConfig {
        &self.config
    }

    fn slot(&self, device: i32) -> Result<&OnceLock<Device>> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "device ordinal {device} is outside 0..{MAX_DEVICES}"
                ))
            })
    }

    /// [`TorchAllocator::slot`], and on the simulated backend the check that the
    /// machine has the device (the calls that do not create a device, trim, stats and
    /// a scope's finish, refuse a device that does not exist as the ones that create
    /// it do; on CUDA a device that was never used is only known to exist once it is
    /// created: those calls find nothing to do there).
    ///
    /// Errors: [`Error::InvalidArgument`] naming the ordinal.
    pub(super) fn known(&self, device: i32) -> Result<&OnceLock<Device>> {
        let slot = self.slot(device)?;
        if let Backend::Simulated(sim) = &self.config.backend {
            if device as u32 >= sim.device_count {
                return Err(Error::InvalidArgument(format!(
                    "device {device} does not exist: the simulated machine has {} device(s)",
                    sim.device_count
                )));
            }
        }
        Ok(slot)
    }

    /// The device's state, created on first use (its driver, tensor and mempool
    /// pools).
    fn device(&self, device: i32) -> Result<&Device> {
        let slot = self.slot(device)?;
        if let Some(d) = slot.get() {
            return Ok(d);
        }
        let _creating = lock(&self.creating);
        if let Some(d) = slot.get() {
            return Ok(d);
        }
        let base = PoolConfig {
            backend: self.config.backend,
            device,
            peer_devices: self.config.peer_devices.clone(),
            history_events: self.config.history_events,
            ..PoolConfig::default()
        };
        let driver = crate::backend::open(&base)?;
        let mut tensor = Pool::with_driver(
            PoolConfig {
                reuse_policy: self.config.tensor_policy,
                release_threshold_bytes: self.config.release_threshold_bytes,
                cross_stream_reuse: self.config.cross_stream_reuse,
                record_path: self.config.record_file(device, "tensor"),
                ..base.clone()
            },
            driver.clone(),
        )?;
        let mut mempool = Pool::with_driver(
            PoolConfig {
                reuse_policy: self.config.mempool_policy,
                release_threshold_bytes: 0,
                cross_stream_reuse: self.config.cross_stream_reuse,
                record_path: self.config.record_file(device, "mempool"),
                ..base
            },
            driver.clone(),
        )?;
        tensor.use_step_clock(Arc::clone(&self.clock));
        mempool.use_step_clock(Arc::clone(&self.clock));
        let d = Device {
            index: device,
            driver,
            tensor,
            mempool,
            graphs: Mutex::new(Graphs::default()),
            graph_pools: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
        };
        // Cannot fail: the slot is empty and only filled under `creating`.
        let _ = slot.set(d);
        slot.get()
            .ok_or(Error::NotSupported("device state vanished after creation"))
    }

    /// The device's state if it was created.
    fn existing(&self, device: i32) -> Option<&Device> {
        self.slot(device).ok().and_then(OnceLock::get)
    }

    /// The created devices.
    pub(super) fn created(&self) -> impl Iterator<Item = &Device> {
        self.devices.iter().filter_map(OnceLock::get)
    }

    /// The driver of `device` (created on first use): for the simulated backend's
    /// test controls (streams, work, captures).
    ///
    /// Errors: as [`TorchAllocator::alloc`]'s device creation.
    pub fn driver(&self, device: i32) -> Result<Arc<dyn Driver>> {
        Ok(self.device(device)?.driver.clone())
    }

    /// The simulated driver of `device` (created on first use), for the test
    /// controls of the C ABI (`flare_torch_sim_*`).
    ///
    /// Errors: [`Error::NotSupported`] on the CUDA backend; device creation errors.
    pub fn sim_driver(&self, device: i32) -> Result<Arc<crate::SimDriver>> {
        self.device(device)?
            .tensor
            .sim_driver()
            .ok_or(Error::NotSupported(
                "the simulated controls need FLARE_TORCH_BACKEND=sim",
            ))
    }

    /// Per-tensor mode's allocation (`flare_torch_alloc`): `bytes` on `device` for
    /// use on `stream`. From the device's graph pool when `stream` is being captured
    /// while one is begun, else from its tensor pool, stream-ordered.
    ///
    /// Errors: [`Error::InvalidArgument`] for a device outside `0..MAX_DEVICES` or
    /// size 0; [`Error::NoDriver`] when the device's driver cannot be opened;
    /// [`Error::OutOfMemory`] / [`Error::RequestTooLarge`] when it does not fit
    /// (after releasing what may be released); [`Error::Driver`] for another failed
    /// driver call.
    pub fn alloc(&self, bytes: u64, device: i32, stream: Stream) -> Result<DevicePtr> {
        let d = self.device(device)?;
        if d.pending.load(Ordering::Acquire) > 0 {
            let capture = d
                .driver
                .stream_capture(stream)
                .map_err(|source| Error::Driver { source, bytes: 0 })?;
            if let Some(capture) = capture {
                let mut g = d.graphs();
                if let Some(id) = Device::pool_for_capture(&mut g, capture) {
                    return Self::alloc_in_graph(&mut g, id, bytes, stream);
                }
            }
        }
        d.tensor.allocate_async_raw(bytes, stream)
    }

    fn alloc_in_graph(
        g: &mut Graphs,
        id: MempoolId,
        bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        let gp = g
            .pools
            .get_mut(&id)
            .ok_or(Error::NotSupported("a begun graph pool has no pool"))?;
        let ptr = gp.pool.allocate_async_raw(bytes, stream)?;
        gp.live += 1;
        g.owner.insert(ptr, id);
        Ok(ptr)
    }

    /// Per-tensor mode's free (`flare_torch_free`): `ptr`, allocated on `device` for
    /// `stream` (PyTorch passes the allocation's stream), freed stream-ordered on
    /// that stream: no host synchronization; the memory is reused by `stream` at
    /// once, by other streams once `stream`'s work up to now has completed. A graph
    /// pool's allocation goes back to its graph pool; a graph pool that PyTorch
    /// released is destroyed with its last allocation.
    ///
    /// Errors: [`Error::UnknownPointer`] for a pointer no pool of `device` handed
    /// out; [`Error::InvalidArgument`] for a device outside `0..MAX_DEVICES`; a
    /// graph pool's destroy failure ([`Error::Driver`], after the free succeeded).
    pub fn free(&self, ptr: DevicePtr, device: i32, stream: Stream) -> Result<()> {
        self.slot(device)?;
        let d = self.existing(device).ok_or(Error::UnknownPointer { ptr })?;
        if d.graph_pools.load(Ordering::Acquire) > 0 {
            let mut g = d.graphs();
            if let Some(id) = g.owner.remove(&ptr) {
                let gp = g
                    .pools
                    .get_mut(&id)
                    .ok_or(Error::NotSupported("a graph allocation has no pool"))?;
                if let Err(e) = gp.pool.free_async_raw(ptr, stream) {
                    g.owner.insert(ptr, id);
                    return Err(e);
                }
                gp.live -= 1;
                let dead = Device::take_destroyable(&mut g);
                d.publish(&g);
                drop(g);
                return Device::destroy(dead);
            }
        }
        d.tensor.free_async_raw(ptr, stream)
    }

    /// `record_stream` (`flare_torch_record_stream`): `ptr` is used on `stream`
    /// too; its free waits for `stream`'s work up to the free before the memory is
    /// reused or released. PyTorch does not pass the device: every created device's
    /// pools are asked.
    ///
    /// Errors: [`Error::UnknownPointer`] when no pool holds `ptr` live.
    pub fn record_stream(&self, ptr: DevicePtr, stream: Stream) -> Result<()> {
        for d in self.created() {
            if d.graph_pools.load(Ordering::Acquire) > 0 {
                let g = d.graphs();
                if let Some(id) = g.owner.get(&ptr) {
                    if let Some(gp) = g.pools.get(id) {
                        return gp.pool.record_stream(ptr, stream);
                    }
                }
            }
            match d.tensor.record_stream(ptr, stream) {
                Err(Error::UnknownPointer { .. }) => {}
                other => return other,
            }
        }
        Err(Error::UnknownPointer { ptr })
    }

    /// `beginAllocateToPool` (`flare_torch_begin_allocate_to_pool`): from now until
    /// [`TorchAllocator::end_allocate_to_pool`], allocations on a stream being
    /// captured (the capture bound to this call: see the module's documentation) go
    /// to graph pool `id` of `device`, created if it does not exist. Counts one
    /// reference, dropped by [`TorchAllocator::release_pool`].
    ///
    /// Errors: as [`TorchAllocator::alloc`]'s device creation; pool creation errors.
    pub fn begin_allocate_to_pool(&self, device: i32, id: MempoolId) -> Result<()> {
        let d = self.device(device)?;
        let mut g = d.graphs();
        let made = g.made;
        let mut made_now = false;
        match g.pools.entry(id) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().refs += 1,
            std::collections::hash_map::Entry::Vacant(e) => {
                let number = made + 1;
                let mut pool = Pool::with_driver(
                    d.pool_config(&self.config, self.config.graph_policy, number),
                    d.driver.clone(),
                )?;
                pool.use_step_clock(Arc::clone(&self.clock));
                made_now = true;
                pool.dedicate_to_captures();
                pool.retention_begin()?;
                e.insert(GraphPool {
                    pool,
                    refs: 1,
                    live: 0,
                });
            }
        }
        if made_now {
            g.made += 1;
        }
        g.pending.push(Pending {
            id,
            thread: std::thread::current().id(),
            capture: None,
        });
        d.publish(&g);
        Ok(())
    }

    /// `endAllocateToPool` (`flare_torch_end_allocate_to_pool`): graph pool `id` no
    /// longer takes new allocations (its begin on the calling thread, else its most
    /// recent one, ends). Pools released meanwhile are destroyed once no graph pool of
    /// the device is begun.
    ///
    /// Errors: [`Error::InvalidArgument`] when `id` is not begun on `device`; a
    /// deferred destroy's failure.
    pub fn end_allocate_to_pool(&self, device: i32, id: MempoolId) -> Result<()> {
        let d = self.existing(device).ok_or_else(|| not_begun(device, id))?;
        let mut g = d.graphs();
        let me = std::thread::current().id();
        let index = g
            .pending
            .iter()
            .rposition(|p| p.id == id && p.thread == me)
            .or_else(|| g.pending.iter().rposition(|p| p.id == id))
            .ok_or_else(|| not_begun(device, id))?;
        let p = g.pending.remove(index);
        if let Some(capture) = p.capture {
            g.captures.remove(&capture);
        }
        let dead = Device::take_destroyable(&mut g);
        d.publish(&g);
        drop(g);
        Device::destroy(dead)
    }

    /// `releasePool` (`flare_torch_release_pool`): drops one reference to graph pool
    /// `id` (PyTorch calls it when a graph using the pool is reset or destroyed). With
    /// none left and nothing allocated from it live, the pool is destroyed: a device
    /// synchronize (replays may still run), then everything it holds is released;
    /// deferred while a graph pool of the device is begun (a capture may be open),
    /// and until its last allocation is freed.
    ///
    /// Errors: [`Error::InvalidArgument`] for a pool `device` does not have; a
    /// destroy's failure.
    pub fn release_pool(&self, device: i32, id: MempoolId) -> Result<()> {
        let d = self
            .existing(device)
            .ok_or_else(|| unknown_pool(device, id))?;
        let mut g = d.graphs();
        let gp = g
            .pools
            .get_mut(&id)
            .ok_or_else(|| unknown_pool(device, id))?;
        gp.refs = gp.refs.saturating_sub(1);
        let dead = Device::take_destroyable(&mut g);
        d.publish(&g);
        drop(g);
        Device::destroy(dead)
    }

    /// `emptyCache` (`flare_torch_reset`, called by `torch.cuda.empty_cache()`):
    /// trims every device's tensor and mempool pools (releases what is idle; graph
    /// pools keep theirs), and destroys released graph pools with nothing live. A
    /// device with a graph pool begun (a capture may be open) is skipped. A tensor
    /// pool with a retention scope open keeps what it retains, with no error
    /// (`torch.cuda.graph` calls `empty_cache` before each capture, and a scope is
    /// opened around a warmup of captures; its finish releases); unlike
    /// [`TorchAllocator::trim`], which refuses.
    ///
    /// Errors: the first trim or destroy failure; every device is tried.
    pub fn reset(&self) -> Result<()> {
        let mut first = Ok(());
        for d in self.created() {
            let mut g = d.graphs();
            if !g.pending.is_empty() {
                continue;
            }
            let dead = Device::take_destroyable(&mut g);
            d.publish(&g);
            drop(g);
            // Inside the tensor pool's retention scope `empty_cache` releases
            // nothing, and is no failure: the scope retains by design (`torch.cuda.graph`
            // calls `empty_cache` before every capture, and a warmup of captures is
            // what a scope is opened around; the scope's finish releases).
            let tensor = match d.tensor.trim() {
                Err(Error::ScopeState(_)) => Ok(()),
                r => r,
            };
            for r in [tensor, d.mempool.trim(), Device::destroy(dead)] {
                if first.is_ok() {
                    first = r;
                }
            }
        }
        first
    }

    /// Writes what every pool recorded so far to its file (`FLARE_TORCH_RECORD`)
    /// and waits for the writes: the process-wide allocator is never dropped, so the
    /// Python package calls it at exit (`flare_torch_record_flush`). Does nothing
    /// when not recording.
    pub fn record_flush(&self) {
        if self.config.record_path.is_none() {
            return;
        }
        for d in self.created() {
            d.tensor.record_flush();
            d.mempool.record_flush();
            let g = d.graphs();
            for gp in g.pools.values() {
                gp.pool.record_flush();
            }
        }
    }

    /// Trims one device's tensor and mempool pools ([`TorchAllocator::reset`] for
    /// one device). A device never used: nothing to do.
    ///
    /// Errors: [`Error::InvalidArgument`] for a device outside `0..MAX_DEVICES` (or,
    /// simulated, one the machine does not have); [`Error::ScopeState`] while a
    /// retention scope is open on the tensor pool; a trim's driver failure.
    pub fn trim(&self, device: i32) -> Result<()> {
        match self.known(device)?.get() {
            None => Ok(()),
            Some(d) => d.tensor.trim().and(d.mempool.trim()),
        }
    }

    /// Pool mode's allocation (`flare_torch_pool_alloc`): one of PyTorch's segments,
    /// from the device's mempool pool (a whole mapping), stream-ordered on `stream`.
    ///
    /// Errors: as [`TorchAllocator::alloc`].
    pub fn pool_alloc(&self, bytes: u64, device: i32, stream: Stream) -> Result<DevicePtr> {
        self.device(device)?
            .mempool
            .allocate_async_raw(bytes, stream)
    }

    /// Pool mode's free (`flare_torch_pool_free`): PyTorch frees a segment only once
    /// the events of its blocks completed; the mapping is freed on `stream` and,
    /// when `stream` is not being captured, released now (its fence waited for with
    /// `cuEventSynchronize`, no device synchronize), so that the pool's physical
    /// bytes stay the segments PyTorch holds.
    ///
    /// Errors: [`Error::UnknownPointer`] for a pointer the mempool pool did not hand
    /// out; the release's driver failure (the free itself succeeded).
    pub fn pool_free(&self, ptr: DevicePtr, device: i32, stream: Stream) -> Result<()> {
        let d = self.existing(device).ok_or(Error::UnknownPointer { ptr })?;
        d.mempool.free_async_raw(ptr, stream)?;
        match d.driver.stream_capture(stream) {
            Ok(None) => d.mempool.trim(),
            _ => Ok(()),
        }
    }

    /// Opens a retention scope on `device`'s tensor pool (Python's `retention()`):
    /// nothing freed is released until [`TorchAllocator::retention_finish`].
    ///
    /// Errors: [`Error::ScopeState`] when one is open; device creation errors.
    pub fn retention_begin(&self, device: i32) -> Result<()> {
        self.device(device)?.tensor.retention_begin()
    }

    /// Closes the scope [`TorchAllocator::retention_begin`] opened and releases
    /// what is idle (one synchronize). `abort` counts it as aborted.
    ///
    /// Errors: [`Error::InvalidArgument`] for a device that does not exist (as
    /// [`TorchAllocator::trim`]); [`Error::ScopeState`] with none open; the release's
    /// driver failure.
    pub fn retention_finish(&self, device: i32, abort: bool) -> Result<()> {
        let d = self
            .known(device)?
            .get()
            .ok_or(Error::ScopeState("no retention scope is open"))?;
        if abort {
            d.tensor.retention_abort()
        } else {
            d.tensor.retention_finish()
        }
    }

    /// The snapshot of one of `device`'s pools; `None` when the device was never used.
    pub fn snapshot(&self, device: i32, kind: PoolKind) -> Option<Snapshot> {
        self.existing(device).map(|d| match kind {
            PoolKind::Tensor => d.tensor.snapshot(),
            PoolKind::Mempool => d.mempool.snapshot(),
        })
    }

    /// The snapshots of `device`'s graph pools, with their ids and live allocation
    /// counts (empty when the device was never used).
    pub fn graph_snapshots(&self, device: i32) -> Vec<(MempoolId, u64, Snapshot)> {
        let Some(d) = self.existing(device) else {
            return Vec::new();
        };
        let g = d.graphs();
        let mut v: Vec<_> = g
            .pools
            .iter()
            .map(|(&id, p)| (id, p.live, p.pool.snapshot()))
            .collect();
        v.sort_by_key(|(id, _, _)| *id);
        v
    }

    /// Live and idle bytes of `device`'s tensor pool (for an out-of-memory message);
    /// zeros when never used.
    pub fn live_idle_bytes(&self, device: i32) -> (u64, u64) {
        self.snapshot(device, PoolKind::Tensor)
            .map_or((0, 0), |s| live_idle(&s))
    }
}

fn not_begun(device: i32, id: MempoolId) -> Error {
    Error::InvalidArgument(format!(
        "graph pool ({}, {}) is not begun on device {device}",
        id.0, id.1
    ))
}

fn unknown_pool(device: i32, id: MempoolId) -> Error {
    Error::InvalidArgument(format!(
        "device {device} has no graph pool ({}, {})",
        id.0, id.1
    ))
}
