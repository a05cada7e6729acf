//! PyTorch's allocator seams (issue 14), the safe half: one [`TorchAllocator`] holds,
//! per device, the pools behind `torch.cuda.memory.CUDAPluggableAllocator`. The C
//! functions PyTorch calls (`flare_torch_alloc`, `flare_torch_free` and the hooks) are
//! in `ffi/torch.rs`, over one process-wide allocator configured from the
//! environment ([`TorchConfig::from_env`]).
//!
//! Per device, created on first use, sharing one driver (one CUDA context, or one
//! simulated device whose streams every pool knows):
//! - the **tensor pool**: per-tensor mode (`change_current_allocator`); every tensor
//!   PyTorch allocates outside a graph pool; [`ReusePolicy::Segments`] by default, so
//!   small tensors share handles; stream-ordered (`allocate_async` on the tensor's
//!   stream, `free_async` on it: PyTorch passes the allocation's stream to the free);
//! - the **mempool pool**: pool mode (`torch.cuda.MemPool`), where PyTorch's caching
//!   allocator sub-allocates and asks us for its segments (2 MiB multiples); whole
//!   mappings of exactly the rounded size ([`ReusePolicy::Exact`]) and a release at
//!   each free once its stream's work is done, so that our physical bytes are the
//!   pool's reserved bytes;
//! - **graph pools**, one per PyTorch `MempoolId_t` given to the graph-pool hooks
//!   (`beginAllocateToPool` / `endAllocateToPool` / `releasePool`, called by
//!   `torch.cuda.graph` around each capture in per-tensor mode). Each is a [`Pool`] of
//!   its own with a retention scope open for its whole life: what a graph pool
//!   hands out, whenever it is freed (during the capture, or after it: a graph's
//!   output freed later), goes back to that pool only, is reused only by that pool's
//!   allocations, and is released only when PyTorch has released the pool and
//!   nothing allocated from it is live (after a device synchronize: replays run on
//!   streams the pool never sees).
//!
//! Which allocation goes to a graph pool: PyTorch's filter (a `std::function` the
//! hook receives) cannot be called from Rust, so we decide as it does: an allocation
//! on a stream that is being captured (`cuStreamGetCaptureInfo`) while a graph pool
//! is between begin and end on that device. PyTorch calls begin before
//! `cudaStreamBeginCapture`, on the capturing thread, so the capture id is bound to
//! a pool at its first allocation: the pool begun by the calling thread (most recent
//! first), else the most recently begun pool not bound yet. A capture with no pool
//! begun (raw CUDA capture) uses the tensor pool, whose own capture rules keep memory
//! freed in it for its graph.
//!
//! Frees find their pool by pointer: the allocations of graph pools are kept in a
//! map (looked up only while a graph pool exists), everything else is the tensor
//! pool's.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;

use crate::driver::sim::SimConfig;
use crate::driver::{DevicePtr, Driver, Stream};
use crate::error::{Error, Result};
use crate::pool::{Backend, CrossStreamReuse, Pool, PoolConfig, ReusePolicy, Snapshot};

/// The most devices the allocator serves (ordinals `0..MAX_DEVICES`); a larger
/// ordinal is an invalid argument.
pub const MAX_DEVICES: usize = 64;

/// A PyTorch memory pool id (`c10::cuda::MempoolId_t`, a pair of `CaptureId_t`:
/// unsigned 64-bit integers): `(n, 0)` for a graph's own pool, `(0, n)` for one made
/// by `torch.cuda.graph_pool_handle()` or a `MemPool`.
pub type MempoolId = (u64, u64);

/// The environment variables [`TorchConfig::from_env`] reads, with what each sets.
pub const ENV_VARS: [(&str, &str); 10] = [
    (
        "FLARE_TORCH_BACKEND",
        "`cuda` (default) or `sim` (the simulated driver: no GPU, for tests)",
    ),
    (
        "FLARE_TORCH_SIM_CAPACITY",
        "with `sim`: each simulated device's memory, bytes or a number with K/M/G/T \
         (powers of 1024); default 140G",
    ),
    (
        "FLARE_TORCH_SIM_DEVICES",
        "with `sim`: the number of simulated devices, default 2",
    ),
    (
        "FLARE_TORCH_POLICY",
        "the tensor pool's reuse policy: `segments` (default), `best-fit`, `exact`, `none`",
    ),
    (
        "FLARE_TORCH_GRAPH_POLICY",
        "the graph pools' reuse policy, same names, default `segments`",
    ),
    (
        "FLARE_TORCH_MEMPOOL_POLICY",
        "the mempool pool's reuse policy, same names, default `exact`",
    ),
    (
        "FLARE_TORCH_RELEASE_THRESHOLD",
        "the tensor pool's release threshold: `max` (default: freed memory stays \
         cached until `torch.cuda.empty_cache()` or an out-of-memory, as with \
         PyTorch's own allocator) or bytes (with K/M/G/T)",
    ),
    (
        "FLARE_TORCH_CROSS_STREAM",
        "`when-complete` (default), `wait` or `never` (see `CrossStreamReuse`)",
    ),
    (
        "FLARE_TORCH_PEERS",
        "comma-separated device ordinals every pool also grants access to (for \
         peer copies and kernels reading another device's tensors); default none",
    ),
    (
        "FLARE_TORCH_RECORD",
        "record every pool's calls as flare-trace v1 (`docs/trace-format.md`, \
         \"Recorded traces\"), one file per pool named from this path: \
         `PATH.devN.tensor.trace`, `PATH.devN.mempool.trace`, \
         `PATH.devN.graph-K.trace` (the K-th graph pool of device N, from 1); \
         replay one with `flare-replay --as-recorded`; default none",
    ),
];

/// How a [`TorchAllocator`] makes its pools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchConfig {
    /// `Backend::Cuda`, or the simulated driver (each device its own, with
    /// `device_count` devices so that peers can be named).
    pub backend: Backend,
    /// The tensor pool's policy (default [`ReusePolicy::Segments`]).
    pub tensor_policy: ReusePolicy,
    /// The graph pools' policy (default [`ReusePolicy::Segments`]).
    pub graph_policy: ReusePolicy,
    /// The mempool pool's policy (default [`ReusePolicy::Exact`]: PyTorch's segments
    /// are 2 MiB multiples, so each is one mapping of exactly its size).
    pub mempool_policy: ReusePolicy,
    /// The tensor pool's release threshold, bytes (default `u64::MAX`: nothing is
    /// released but by [`TorchAllocator::reset`] or an out-of-memory).
    pub release_threshold_bytes: u64,
    /// Cross-stream reuse of every pool (default when-complete).
    pub cross_stream_reuse: CrossStreamReuse,
    /// Devices every pool grants access to besides its own.
    pub peer_devices: Vec<i32>,
    /// Record every pool's calls (`FLARE_TORCH_RECORD`; default `None`): each pool
    /// writes its own file, this path with `.devN.tensor.trace`,
    /// `.devN.mempool.trace` or `.devN.graph-K.trace` appended (the K-th graph pool
    /// made on device N, from 1), as [`PoolConfig::record_path`] says.
    pub record_path: Option<std::path::PathBuf>,
}

impl Default for TorchConfig {
    fn default() -> Self {
        TorchConfig {
            backend: Backend::Cuda,
            tensor_policy: ReusePolicy::Segments,
            graph_policy: ReusePolicy::Segments,
            mempool_policy: ReusePolicy::Exact,
            release_threshold_bytes: u64::MAX,
            cross_stream_reuse: CrossStreamReuse::WhenComplete,
            peer_devices: Vec::new(),
            record_path: None,
        }
    }
}

impl TorchConfig {
    /// The recording file of a pool of device `device` named `what` (`tensor`,
    /// `mempool`, `graph-K`): `record_path` with `.devN.WHAT.trace` appended, `None`
    /// when not recording.
    pub fn record_file(&self, device: i32, what: &str) -> Option<std::path::PathBuf> {
        self.record_path.as_ref().map(|p| {
            let mut s = p.clone().into_os_string();
            s.push(format!(".dev{device}.{what}.trace"));
            s.into()
        })
    }
}

/// Parses a byte count: digits, optionally followed by `K`, `M`, `G` or `T` (powers
/// of 1024, an optional `iB` or `B` after it).
fn parse_bytes(name: &str, s: &str) -> Result<u64> {
    let bad = || Error::InvalidArgument(format!("{name}={s:?}: not a byte count"));
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('T' | 't') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

fn parse_policy(name: &str, s: &str) -> Result<ReusePolicy> {
    ReusePolicy::ALL
        .into_iter()
        .find(|p| p.name() == s.trim())
        .ok_or_else(|| {
            let names: Vec<&str> = ReusePolicy::ALL.iter().map(|p| p.name()).collect();
            Error::InvalidArgument(format!(
                "{name}={s:?}: not a reuse policy ({})",
                names.join(", ")
            ))
        })
}

impl TorchConfig {
    /// The configuration the environment variables of [`ENV_VARS`] give (an unset
    /// or empty variable keeps its default).
    ///
    /// Errors: [`Error::InvalidArgument`] naming the variable and its value.
    pub fn from_env() -> Result<TorchConfig> {
        TorchConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`TorchConfig::from_env`] with `get` reading the variables.
    ///
    /// Errors: as [`TorchConfig::from_env`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<TorchConfig> {
        let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let mut c = TorchConfig::default();
        match var("FLARE_TORCH_BACKEND").as_deref().map(str::trim) {
            None | Some("cuda") => {}
            Some("sim") => {
                let mut sim = SimConfig {
                    device_count: 2,
                    ..SimConfig::default()
                };
                if let Some(v) = var("FLARE_TORCH_SIM_CAPACITY") {
                    sim.capacity_bytes = parse_bytes("FLARE_TORCH_SIM_CAPACITY", &v)?;
                }
                if let Some(v) = var("FLARE_TORCH_SIM_DEVICES") {
                    sim.device_count = v.trim().parse().map_err(|_| {
                        Error::InvalidArgument(format!(
                            "FLARE_TORCH_SIM_DEVICES={v:?}: not a device count"
                        ))
                    })?;
                }
                crate::backend::validate_sim_machine(&sim).map_err(|e| match e {
                    Error::InvalidArgument(m) => Error::InvalidArgument(format!(
                        "FLARE_TORCH_SIM_CAPACITY / FLARE_TORCH_SIM_DEVICES: {m}"
                    )),
                    e => e,
                })?;
                c.backend = Backend::Simulated(sim);
            }
            Some(other) => {
                return Err(Error::InvalidArgument(format!(
                    "FLARE_TORCH_BACKEND={other:?}: not `cuda` or `sim`"
                )))
            }
        }
        if let Some(v) = var("FLARE_TORCH_POLICY") {
            c.tensor_policy = parse_policy("FLARE_TORCH_POLICY", &v)?;
        }
        if let Some(v) = var("FLARE_TORCH_GRAPH_POLICY") {
            c.graph_policy = parse_policy("FLARE_TORCH_GRAPH_POLICY", &v)?;
        }
        if let Some(v) = var("FLARE_TORCH_MEMPOOL_POLICY") {
            c.mempool_policy = parse_policy("FLARE_TORCH_MEMPOOL_POLICY", &v)?;
        }
        if let Some(v) = var("FLARE_TORCH_RELEASE_THRESHOLD") {
            c.release_threshold_bytes = match v.trim() {
                "max" => u64::MAX,
                _ => parse_bytes("FLARE_TORCH_RELEASE_THRESHOLD", &v)?,
            };
        }
        if let Some(v) = var("FLARE_TORCH_CROSS_STREAM") {
            c.cross_stream_reuse = v
                .trim()
                .parse()
                .map_err(|e| Error::InvalidArgument(format!("FLARE_TORCH_CROSS_STREAM: {e}")))?;
        }
        if let Some(v) = var("FLARE_TORCH_PEERS") {
            for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let d: i32 = p.parse().map_err(|_| {
                    Error::InvalidArgument(format!(
                        "FLARE_TORCH_PEERS={v:?}: {p:?} is not a device ordinal"
                    ))
                })?;
                c.peer_devices.push(d);
            }
        }
        if let Some(v) = get("FLARE_TORCH_RECORD").filter(|v| !v.is_empty()) {
            // A prefix of file names: `/tmp` would write `/tmp.dev0.tensor.trace` in
            // `/`, and `dir/` names no file; both are mistakes, refused here.
            let path = std::path::PathBuf::from(&v);
            if v.ends_with('/') || path.is_dir() {
                return Err(Error::InvalidArgument(format!(
                    "FLARE_TORCH_RECORD={v:?} is a directory: give a prefix of file names \
                     in it, e.g. {:?}",
                    path.join("run")
                )));
            }
            c.record_path = Some(path);
        }
        Ok(c)
    }
}

/// Which of a device's pools an operation or a snapshot is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// The tensor pool (per-tensor mode, outside graph pools).
    Tensor,
    /// The mempool pool (pool mode: PyTorch's segments).
    Mempool,
}

/// One graph pool: its [`Pool`] (a retention scope open for its whole life) and who
/// still holds it.
struct GraphPool {
    pool: Pool,
    /// Begins minus releases (PyTorch calls `releasePool` once per graph that began
    /// allocating to it).
    refs: u64,
    /// Allocations of this pool not yet freed.
    live: u64,
}

/// A graph pool between `beginAllocateToPool` and `endAllocateToPool`.
struct Pending {
    id: MempoolId,
    thread: ThreadId,
    /// The capture bound to it at its first allocation on a capturing stream.
    capture: Option<u64>,
}

#[derive(Default)]
struct Graphs {
    pools: HashMap<MempoolId, GraphPool>,
    /// Live allocations of graph pools: address -> pool.
    owner: HashMap<DevicePtr, MempoolId>,
    pending: Vec<Pending>,
    /// Capture id -> graph pool, for the captures bound so far.
    captures: HashMap<u64, MempoolId>,
    /// Graph pools made so far on this device (numbers their recordings).
    made: u64,
}

/// Everything of one device.
struct Device {
    index: i32,
    driver: Arc<dyn Driver>,
    tensor: Pool,
    mempool: Pool,
    graphs: Mutex<Graphs>,
    /// `graphs.pools.len()`, read with no lock: frees look at the owner map only when
    /// it is above 0.
    graph_pools: AtomicUsize,
    /// `graphs.pending.len()`: allocations ask whether their stream is captured only
    /// when it is above 0.
    pending: AtomicUsize,
}

/// A lock that a panic in another thread cannot make unusable: the data under these
/// locks is left consistent between statements.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Device {
    /// A graph pool's configuration (`number`: the how-many-th graph pool of this
    /// device, for its recording's file name).
    fn pool_config(&self, config: &TorchConfig, policy: ReusePolicy, number: u64) -> PoolConfig {
        PoolConfig {
            backend: config.backend,
            device: self.index,
            reuse_policy: policy,
            peer_devices: config.peer_devices.clone(),
            cross_stream_reuse: config.cross_stream_reuse,
            record_path: config.record_file(self.index, &format!("graph-{number}")),
            ..PoolConfig::default()
        }
    }

    fn graphs(&self) -> MutexGuard<'_, Graphs> {
        lock(&self.graphs)
    }

    /// Updates the lock-free counts from `g` (under its lock).
    fn publish(&self, g: &Graphs) {
        self.graph_pools.store(g.pools.len(), Ordering::Release);
        self.pending.store(g.pending.len(), Ordering::Release);
    }

    /// The graph pool capture `capture` allocates to, binding it to one when it is
    /// not bound yet (see the module's documentation); `None` when no graph pool is
    /// begun.
    fn pool_for_capture(g: &mut Graphs, capture: u64) -> Option<MempoolId> {
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
    fn take_destroyable(g: &mut Graphs) -> Vec<Pool> {
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
    fn destroy(pools: Vec<Pool>) -> Result<()> {
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
    config: TorchConfig,
    devices: [OnceLock<Device>; MAX_DEVICES],
    /// Serializes device creation (a device is created once).
    creating: Mutex<()>,
}

impl TorchAllocator {
    /// An allocator that will make its pools from `config` (nothing is created
    /// before a device is first used).
    pub fn new(config: TorchConfig) -> TorchAllocator {
        TorchAllocator {
            config,
            devices: std::array::from_fn(|_| OnceLock::new()),
            creating: Mutex::new(()),
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
    fn known(&self, device: i32) -> Result<&OnceLock<Device>> {
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
            ..PoolConfig::default()
        };
        let driver = crate::backend::open(&base)?;
        let tensor = Pool::with_driver(
            PoolConfig {
                reuse_policy: self.config.tensor_policy,
                release_threshold_bytes: self.config.release_threshold_bytes,
                cross_stream_reuse: self.config.cross_stream_reuse,
                record_path: self.config.record_file(device, "tensor"),
                ..base.clone()
            },
            driver.clone(),
        )?;
        let mempool = Pool::with_driver(
            PoolConfig {
                reuse_policy: self.config.mempool_policy,
                release_threshold_bytes: 0,
                cross_stream_reuse: self.config.cross_stream_reuse,
                record_path: self.config.record_file(device, "mempool"),
                ..base
            },
            driver.clone(),
        )?;
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
    fn created(&self) -> impl Iterator<Item = &Device> {
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
                let pool = Pool::with_driver(
                    d.pool_config(&self.config, self.config.graph_policy, number),
                    d.driver.clone(),
                )?;
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
    /// device with a graph pool begun (a capture may be open) is skipped.
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
            for r in [d.tensor.trim(), d.mempool.trim(), Device::destroy(dead)] {
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

    /// The stats of `device` as one JSON object (`stats()` in Python): `device`,
    /// `backend` (`"cuda"` / `"sim"`), `created` (false: nothing else), `tensor` and
    /// `mempool` (every snapshot counter by name), `graph_pools` (a list of
    /// `{"id": [a, b], "live": n, "snapshot": {...}}`) and `physical_bytes` (the sum
    /// over all the device's pools). A device outside `0..MAX_DEVICES` (or, simulated,
    /// one the machine does not have) gives `{"error": "..."}`.
    pub fn stats_json(&self, device: i32) -> String {
        let backend = match self.config.backend {
            Backend::Cuda => "cuda",
            Backend::Simulated(_) => "sim",
        };
        let d = match self.known(device).map(OnceLock::get) {
            Ok(Some(d)) => d,
            Ok(None) => {
                return format!(
                    "{{\"device\":{device},\"backend\":\"{backend}\",\"created\":false}}"
                )
            }
            Err(e) => return format!("{{\"error\":{:?}}}", e.to_string()),
        };
        let tensor = d.tensor.snapshot();
        let mempool = d.mempool.snapshot();
        let graphs = self.graph_snapshots(device);
        let physical = tensor.physical_bytes
            + mempool.physical_bytes
            + graphs.iter().map(|(_, _, s)| s.physical_bytes).sum::<u64>();
        let graph_list: Vec<String> = graphs
            .iter()
            .map(|((a, b), live, s)| {
                format!(
                    "{{\"id\":[{a},{b}],\"live\":{live},\"snapshot\":{}}}",
                    snapshot_json(s)
                )
            })
            .collect();
        format!(
            "{{\"device\":{device},\"backend\":\"{backend}\",\"created\":true,\
             \"physical_bytes\":{physical},\"tensor\":{},\"mempool\":{},\"graph_pools\":[{}]}}",
            snapshot_json(&tensor),
            snapshot_json(&mempool),
            graph_list.join(",")
        )
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

/// Every counter of the snapshot, by name, as a JSON object (`scope_open` as a
/// boolean).
pub fn snapshot_json(s: &Snapshot) -> String {
    macro_rules! json_fields {
        ( $( $(#[doc = $fdoc:literal])* $f:ident $(counts $call:ident)?, )* ) => {{
            let mut out = format!("{{\"scope_open\":{}", s.scope_open);
            $( out.push_str(&format!(",\"{}\":{}", stringify!($f), s.$f)); )*
            out.push('}');
            out
        }};
    }
    crate::pool::snapshot_counters!(json_fields! {})
}

mod sleep;
mod stream_forget;

#[cfg(all(test, not(flare_loom)))]
mod tests;
