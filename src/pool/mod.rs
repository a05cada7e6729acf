//! The pool: whole mappings handed out, retained, reused and released.
//!
//! - [`Pool`]: allocate, free, retention scope, trim, snapshot; `Send + Sync`.
//! - [`Allocation`], [`RetentionScope`]: guards that free / abort on drop.
//! - [`ReusePolicy`], [`PoolConfig`], [`Backend`]: configuration.
//! - [`Snapshot`]: the counters, copied atomically.
//!
//! Every mapping is in exactly one state: live, idle (retained or cached; a mapping
//! being released by another thread is still idle in the books, but out of the reuse
//! index) or pending (a release step failed; kept and retried). The books sit under
//! one lock, which is never held across a driver call that creates or releases
//! memory.

mod config;
mod index;
mod snapshot;

pub use config::{Backend, PoolConfig, ReusePolicy, DEFAULT_BEST_FIT_MAX_WASTE_PERCENT};
pub use snapshot::Snapshot;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::driver::cuda::CudaDriver;
use crate::driver::sim::{SimConfig, SimDriver};
use crate::driver::{DevicePtr, Driver, DriverCall, DriverError, PhysicalHandle, Reservation};
use crate::error::{Error, Result};
use crate::sync::{lock, Mutex};
use index::ReuseIndex;
use std::sync::Arc;

/// Where a mapping is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MappingState {
    /// Handed out to a caller.
    Live,
    /// Retained or cached; reusable while in the reuse index.
    Idle,
    /// Idle in the books, taken out of the reuse index by a thread that is
    /// releasing it outside the lock.
    Releasing,
    /// A release step failed; what is left is kept and retried.
    Pending,
}

/// One mapping: a reservation with one whole handle mapped in it and access granted.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    reservation: Reservation,
    handle: PhysicalHandle,
    /// Bytes the caller asked for while live.
    requested: u64,
    state: MappingState,
    /// Idle after a failed synchronize or unmap: release again at the next release
    /// point.
    retry: bool,
    /// While live: which allocation this is (the value of `allocations` when it was
    /// handed out), so that a guard frees only its own allocation.
    alloc_id: u64,
    /// Counted in `mappings_created` (false for what a failed creation left
    /// behind), so that its final release counts in `mappings_released`.
    created: bool,
    /// Pending: what the driver still holds.
    mapped: bool,
    handle_live: bool,
    reservation_live: bool,
}

impl Mapping {
    fn size(&self) -> u64 {
        self.handle.size
    }
}

/// Hashes granularity-aligned device pointers: one multiply, no per-call state.
#[derive(Default)]
struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // Pointers are multiples of the granularity: fold the high bits down so the
        // table's low bits vary.
        let x = (v ^ (v >> 21)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 32);
    }
}

type PtrMap = HashMap<u64, u32, BuildHasherDefault<PtrHasher>>;

/// The books, under the pool's one lock.
struct State {
    slots: Vec<Option<Mapping>>,
    free_slots: Vec<u32>,
    live: PtrMap,
    idle: ReuseIndex,
    /// Idle slots marked `retry` (may hold stale entries: checked on use).
    retry: Vec<u32>,
    /// Pending slots.
    pending: Vec<u32>,
    counters: Snapshot,
    /// Incremented by every `retention_begin`: names the open scope, so that a
    /// [`RetentionScope`] guard closes only the scope it opened.
    scope_epoch: u64,
}

/// What one release step left behind, applied to the books under the lock.
#[derive(Clone, Copy)]
enum Outcome {
    /// The synchronize or the unmap failed: the mapping is whole, back to idle.
    StillMapped,
    /// Unmapped; these parts are still held by the driver.
    Unmapped {
        handle_live: bool,
        reservation_live: bool,
    },
}

/// A batch of work for [`Pool::release_batch`], collected under the lock.
#[derive(Default)]
struct Batch {
    /// Idle mappings marked Releasing: synchronize, then unmap, release, free.
    mappings: Vec<(u32, Mapping)>,
    /// Pending mappings: the steps left.
    pending: Vec<(u32, Mapping)>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.mappings.is_empty() && self.pending.is_empty()
    }
}

fn count_failure(c: &mut Snapshot, call: DriverCall) {
    match call {
        DriverCall::Create => c.create_failures += 1,
        DriverCall::Reserve => c.reserve_failures += 1,
        DriverCall::Map => c.map_failures += 1,
        DriverCall::SetAccess => c.access_failures += 1,
        DriverCall::Unmap => c.unmap_failures += 1,
        DriverCall::Release => c.release_failures += 1,
        DriverCall::FreeReservation => c.reservation_free_failures += 1,
        DriverCall::Synchronize => c.sync_failures += 1,
        DriverCall::Granularity | DriverCall::MemGetInfo | DriverCall::Init => {}
    }
}

impl State {
    fn new(granularity: u64) -> Self {
        State {
            slots: Vec::new(),
            free_slots: Vec::new(),
            live: PtrMap::default(),
            idle: ReuseIndex::default(),
            retry: Vec::new(),
            pending: Vec::new(),
            counters: Snapshot {
                granularity_bytes: granularity,
                ..Snapshot::default()
            },
            scope_epoch: 0,
        }
    }

    fn mapping(&self, slot: u32) -> Mapping {
        match self.slots.get(slot as usize) {
            Some(Some(m)) => *m,
            // Every slot in the books' sets is occupied; this is unreachable unless
            // the books are corrupt, which the invariant tests rule out.
            _ => unreachable_slot(slot),
        }
    }

    fn mapping_mut(&mut self, slot: u32) -> &mut Mapping {
        match self.slots.get_mut(slot as usize) {
            Some(Some(m)) => m,
            _ => unreachable_slot(slot),
        }
    }

    fn add_slot(&mut self, m: Mapping) -> u32 {
        if let Some(s) = self.free_slots.pop() {
            self.slots[s as usize] = Some(m);
            s
        } else {
            self.slots.push(Some(m));
            (self.slots.len() - 1) as u32
        }
    }

    fn remove_slot(&mut self, slot: u32) {
        self.slots[slot as usize] = None;
        self.free_slots.push(slot);
    }

    fn add_physical(&mut self, handle_bytes: u64, reserved_bytes: u64) {
        let c = &mut self.counters;
        c.physical_bytes += handle_bytes;
        c.reserved_bytes += reserved_bytes;
        c.peak_physical_bytes = c.peak_physical_bytes.max(c.physical_bytes);
    }

    /// Makes `slot` live for a caller who asked for `requested` bytes; returns its
    /// pointer.
    fn make_live(&mut self, slot: u32, requested: u64) -> DevicePtr {
        let m = self.mapping_mut(slot);
        m.state = MappingState::Live;
        m.requested = requested;
        m.retry = false;
        let (ptr, size) = (m.reservation.ptr, m.size());
        self.live.insert(ptr, slot);
        let c = &mut self.counters;
        c.live_count += 1;
        c.live_requested_bytes += requested;
        c.live_mapped_bytes += size;
        c.peak_live_mapped_bytes = c.peak_live_mapped_bytes.max(c.live_mapped_bytes);
        c.allocations += 1;
        let id = c.allocations;
        self.mapping_mut(slot).alloc_id = id;
        ptr
    }

    /// Takes an idle mapping that fits `rounded` bytes under `policy`, makes it live.
    fn take_idle(
        &mut self,
        rounded: u64,
        requested: u64,
        policy: ReusePolicy,
        max_size: u64,
    ) -> Option<DevicePtr> {
        let (slot, size) = match policy {
            ReusePolicy::None => return None,
            ReusePolicy::Exact => (self.idle.take_exact(rounded)?, rounded),
            ReusePolicy::BestFit => self.idle.take_best_fit(rounded, max_size)?,
        };
        let c = &mut self.counters;
        c.idle_count -= 1;
        c.idle_bytes -= size;
        c.reuse_hits += 1;
        if size == rounded {
            c.reuse_exact_hits += 1;
        }
        Some(self.make_live(slot, requested))
    }

    /// Takes `slot` (idle, indexed) out of the reuse index for release.
    fn mark_releasing(&mut self, slot: u32, batch: &mut Batch) {
        self.idle.remove(slot);
        let m = self.mapping_mut(slot);
        m.state = MappingState::Releasing;
        batch.mappings.push((slot, *m));
    }

    /// Every idle mapping and every pending one, for a release point.
    fn collect_all(&mut self, batch: &mut Batch) {
        for slot in self.idle.drain() {
            let m = self.mapping_mut(slot);
            m.state = MappingState::Releasing;
            batch.mappings.push((slot, *m));
        }
        self.retry.clear();
        self.collect_pending(batch);
    }

    fn collect_pending(&mut self, batch: &mut Batch) {
        for slot in std::mem::take(&mut self.pending) {
            batch.pending.push((slot, self.mapping(slot)));
        }
    }

    /// Idle mappings marked for retry, and the pending ones.
    fn collect_retries(&mut self, batch: &mut Batch) {
        for slot in std::mem::take(&mut self.retry) {
            let ok = matches!(
                self.slots.get(slot as usize),
                Some(Some(m)) if m.state == MappingState::Idle && m.retry
            );
            if ok {
                self.mark_releasing(slot, batch);
            }
        }
        self.collect_pending(batch);
    }

    /// Applies what releasing an idle mapping did.
    fn apply_release(&mut self, slot: u32, outcome: Outcome) {
        let mut m = self.mapping(slot);
        let size = m.size();
        match outcome {
            Outcome::StillMapped => {
                m.state = MappingState::Idle;
                m.retry = true;
                *self.mapping_mut(slot) = m;
                self.idle.insert(slot, size);
                self.retry.push(slot);
            }
            Outcome::Unmapped {
                handle_live,
                reservation_live,
            } => {
                let c = &mut self.counters;
                c.idle_count -= 1;
                c.idle_bytes -= size;
                self.settle(slot, m, handle_live, reservation_live, false);
            }
        }
    }

    /// Books an unmapped mapping that was `was_pending` (or idle): released parts
    /// leave the counters; what is left stays pending.
    fn settle(
        &mut self,
        slot: u32,
        mut m: Mapping,
        handle_live: bool,
        reservation_live: bool,
        was_pending: bool,
    ) {
        let size = m.size();
        let c = &mut self.counters;
        let handle_was_live = !was_pending || m.handle_live;
        let reservation_was_live = !was_pending || m.reservation_live;
        if handle_was_live && !handle_live {
            c.physical_bytes -= size;
            if was_pending {
                c.pending_bytes -= size;
            }
        } else if handle_live && !was_pending {
            c.pending_bytes += size;
        }
        if reservation_was_live && !reservation_live {
            c.reserved_bytes -= m.reservation.size;
        }
        if !handle_live && !reservation_live {
            if was_pending {
                c.pending_count -= 1;
            }
            if m.created {
                c.mappings_released += 1;
            }
            self.remove_slot(slot);
        } else {
            if !was_pending {
                c.pending_count += 1;
            }
            m.state = MappingState::Pending;
            m.mapped = false;
            m.handle_live = handle_live;
            m.reservation_live = reservation_live;
            *self.mapping_mut(slot) = m;
            self.pending.push(slot);
        }
    }
}

#[cold]
fn unreachable_slot(slot: u32) -> ! {
    // Not reachable through the public API: the books only name occupied slots.
    panic!("flare-package: internal error: slot {slot} is empty")
}

/// A pool of whole CUDA virtual-memory mappings on one device.
///
/// `Send + Sync`: every method may be called from any thread. A reuse hit takes the
/// lock once and makes no driver call; a miss creates a mapping (create, reserve,
/// map, set access; tens of microseconds on an H200) outside the lock.
pub struct Pool {
    driver: Arc<dyn Driver>,
    sim: Option<Arc<SimDriver>>,
    policy: ReusePolicy,
    granularity: u64,
    release_threshold: u64,
    max_waste_percent: u64,
    access_devices: Vec<i32>,
    /// The device's total memory, bytes (`cuMemGetInfo` at creation; `u64::MAX`
    /// when the query failed): a request above it cannot succeed however much is
    /// released, so it fails at once.
    device_total: u64,
    state: Mutex<State>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("policy", &self.policy)
            .field("granularity", &self.granularity)
            .field("simulated", &self.sim.is_some())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Creates a pool on the backend named in `config`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a negative device or peer ordinal;
    /// [`Error::NoDriver`] when the CUDA backend is asked for and libcuda cannot be
    /// loaded or initialised; [`Error::Driver`] when the granularity query fails.
    pub fn new(config: PoolConfig) -> Result<Pool> {
        // Before any driver is touched, so a bad ordinal is the same error whether or
        // not libcuda loads.
        validate_devices(&config)?;
        match config.backend {
            Backend::Cuda => {
                if !CudaDriver::is_available() {
                    return Err(Error::NoDriver(
                        "libcuda.so.1 could not be loaded: no NVIDIA driver on this machine \
                         (the simulated backend needs none)"
                            .into(),
                    ));
                }
                let driver = CudaDriver::new(config.device).map_err(|e| {
                    if e.call == DriverCall::Init {
                        Error::NoDriver(format!(
                            "{} failed with {} ({}) for device {}",
                            e.call,
                            e.code.name(),
                            e.code.0,
                            config.device
                        ))
                    } else {
                        Error::Driver {
                            source: e,
                            bytes: 0,
                        }
                    }
                })?;
                Pool::with_driver(config, Arc::new(driver))
            }
            Backend::Simulated(sim) => {
                validate_sim(&config, &sim)?;
                let driver = Arc::new(SimDriver::new(sim));
                let mut pool = Pool::with_driver(config, driver.clone())?;
                pool.sim = Some(driver);
                Ok(pool)
            }
        }
    }

    /// Creates a pool on `driver` (any [`Driver`]; `config.backend` is ignored).
    ///
    /// Errors: [`Error::InvalidArgument`] for a negative device or peer ordinal or a
    /// granularity that is not a power of two; [`Error::Driver`] when the granularity query fails.
    pub fn with_driver(config: PoolConfig, driver: Arc<dyn Driver>) -> Result<Pool> {
        validate_devices(&config)?;
        let granularity = driver
            .granularity()
            .map_err(|source| Error::Driver { source, bytes: 0 })?;
        if !granularity.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "the driver reports a granularity of {granularity} bytes, not a power of two"
            )));
        }
        let mut access_devices = vec![config.device];
        for &p in &config.peer_devices {
            if !access_devices.contains(&p) {
                access_devices.push(p);
            }
        }
        let device_total = driver.mem_info().map_or(u64::MAX, |m| m.total);
        Ok(Pool {
            driver,
            sim: None,
            policy: config.reuse_policy,
            granularity,
            release_threshold: config.release_threshold_bytes,
            max_waste_percent: u64::from(config.best_fit_max_waste_percent),
            access_devices,
            device_total,
            state: Mutex::new(State::new(granularity)),
        })
    }

    /// The simulated driver under this pool, when it was created with
    /// [`Backend::Simulated`]: for fault injection and for comparing the books with
    /// what the driver holds.
    pub fn sim_driver(&self) -> Option<&Arc<SimDriver>> {
        self.sim.as_ref()
    }

    /// The driver under this pool.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// The allocation granularity, bytes (2 MiB on an H200): every mapping's size is
    /// a multiple of it.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// The reuse policy.
    pub fn policy(&self) -> ReusePolicy {
        self.policy
    }

    /// Rounds `bytes` up to the granularity; `None` on overflow.
    fn round(&self, bytes: u64) -> Option<u64> {
        let g = self.granularity;
        bytes.checked_add(g - 1).map(|b| b / g * g)
    }

    fn max_fit(&self, rounded: u64) -> u64 {
        let waste = (u128::from(rounded) * u128::from(self.max_waste_percent) / 100) as u64;
        rounded.saturating_add(waste)
    }

    /// Allocates `bytes` of device memory; returns a guard that frees it on drop.
    /// See [`Pool::allocate_raw`] for the rules and errors.
    pub fn allocate(&self, bytes: u64) -> Result<Allocation<'_>> {
        let ptr = self.allocate_raw(bytes)?;
        let st = lock(&self.state);
        let id = st
            .live
            .get(&ptr)
            .map_or(0, |&slot| st.mapping(slot).alloc_id);
        Ok(Allocation {
            pool: self,
            ptr,
            bytes,
            id,
        })
    }

    /// Allocates `bytes` of device memory and returns its device address, aligned to
    /// the granularity. The caller frees it with [`Pool::free_raw`].
    ///
    /// The size is rounded up to the granularity. An idle mapping that fits under the
    /// reuse policy is taken with no driver call; otherwise a new mapping is created
    /// (create, reserve, map, set access for the device and every peer), and a failed
    /// step undoes the earlier ones in reverse.
    ///
    /// Errors: [`Error::InvalidArgument`] for 0 bytes or a size whose rounding
    /// overflows; [`Error::RequestTooLarge`] when the rounded size is above the
    /// device's total memory (at once: no driver call, nothing counted);
    /// [`Error::OutOfMemory`] when the device is full (outside a scope,
    /// after releasing idle mappings and retrying once; inside one, with nothing
    /// retained released); [`Error::Driver`] for any other failed driver call.
    pub fn allocate_raw(&self, bytes: u64) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(Error::InvalidArgument("allocation of 0 bytes".into()));
        }
        let rounded = self.round(bytes).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "allocation of {bytes} bytes overflows when rounded to the granularity"
            ))
        })?;
        let max_size = self.max_fit(rounded);
        if let Some(ptr) = lock(&self.state).take_idle(rounded, bytes, self.policy, max_size) {
            return Ok(ptr);
        }
        self.allocate_miss(bytes, rounded, max_size)
    }

    #[cold]
    fn allocate_miss(&self, bytes: u64, rounded: u64, max_size: u64) -> Result<DevicePtr> {
        if rounded > self.device_total {
            // Beyond the whole device: no driver call, nothing released, nothing
            // counted.
            return Err(Error::RequestTooLarge {
                requested: rounded,
                device_total: self.device_total,
            });
        }
        let err = match self.create_mapping(rounded, bytes) {
            Ok(ptr) => return Ok(ptr),
            Err(e) => e,
        };
        if !err.is_out_of_memory() {
            return Err(Error::Driver {
                source: err,
                bytes: rounded,
            });
        }
        {
            let mut st = lock(&self.state);
            if st.counters.scope_open {
                return Err(self.oom_error(&st, rounded, Some(err)));
            }
            st.counters.oom_retries += 1;
        }
        // Outside a scope: release what is idle, look again, retry once. A failed
        // release (a synchronize refused during a capture, say) is already counted
        // and its mappings kept; the retry then reports the out-of-memory.
        let _ = self.release_idle(false);
        if let Some(ptr) = lock(&self.state).take_idle(rounded, bytes, self.policy, max_size) {
            return Ok(ptr);
        }
        match self.create_mapping(rounded, bytes) {
            Ok(ptr) => Ok(ptr),
            Err(e) if e.is_out_of_memory() => {
                let st = lock(&self.state);
                Err(self.oom_error(&st, rounded, Some(e)))
            }
            Err(e) => Err(Error::Driver {
                source: e,
                bytes: rounded,
            }),
        }
    }

    fn oom_error(&self, st: &State, rounded: u64, source: Option<DriverError>) -> Error {
        Error::OutOfMemory {
            requested: rounded,
            live: st.counters.live_mapped_bytes,
            idle: st.counters.idle_bytes,
            in_scope: st.counters.scope_open,
            source,
        }
    }

    /// Creates one mapping of `size` bytes and books it live. On failure, undoes the
    /// steps done in reverse; whatever the driver refuses to undo is kept pending.
    fn create_mapping(&self, size: u64, requested: u64) -> Result<DevicePtr, DriverError> {
        let d = &*self.driver;
        let mut failures: [Option<DriverCall>; 4] = [None; 4];
        let mut nfail = 0;
        let mut fail = |call: DriverCall| {
            failures[nfail] = Some(call);
            nfail += 1;
        };
        let result = (|| {
            let handle = d.create(size).map_err(|e| (e, None, None, false))?;
            let reservation = match d.reserve(size) {
                Ok(r) => r,
                Err(e) => return Err((e, Some(handle), None, false)),
            };
            if let Err(e) = d.map(reservation.ptr, handle) {
                return Err((e, Some(handle), Some(reservation), false));
            }
            if let Err(e) = d.set_access(reservation.ptr, size, &self.access_devices) {
                return Err((e, Some(handle), Some(reservation), true));
            }
            Ok((handle, reservation))
        })();
        match result {
            Ok((handle, reservation)) => {
                let mut st = lock(&self.state);
                st.counters.mappings_created += 1;
                st.add_physical(size, size);
                let slot = st.add_slot(Mapping {
                    reservation,
                    handle,
                    requested,
                    state: MappingState::Live,
                    retry: false,
                    alloc_id: 0,
                    created: true,
                    mapped: true,
                    handle_live: true,
                    reservation_live: true,
                });
                Ok(st.make_live(slot, requested))
            }
            Err((err, handle, reservation, mapped)) => {
                fail(err.call);
                // Undo in reverse: unmap, free the reservation, release the handle.
                let mut still_mapped = false;
                if let (true, Some(r), Some(h)) = (mapped, reservation, handle) {
                    if d.unmap(r.ptr, h.size).is_err() {
                        fail(DriverCall::Unmap);
                        still_mapped = true;
                    }
                }
                let mut reservation_live = false;
                if let Some(r) = reservation {
                    if still_mapped {
                        reservation_live = true;
                    } else if d.free_reservation(r).is_err() {
                        fail(DriverCall::FreeReservation);
                        reservation_live = true;
                    }
                }
                let mut handle_live = false;
                if let Some(h) = handle {
                    if still_mapped {
                        handle_live = true;
                    } else if d.release(h).is_err() {
                        fail(DriverCall::Release);
                        handle_live = true;
                    }
                }
                let mut st = lock(&self.state);
                for call in failures.iter().flatten() {
                    count_failure(&mut st.counters, *call);
                }
                if handle_live || reservation_live {
                    // Keep what the driver still holds; retried at the next release
                    // point. A still-mapped leftover never had access granted, so no
                    // work can touch it.
                    let h = handle.unwrap_or(PhysicalHandle { raw: 0, size });
                    let r = reservation.unwrap_or(Reservation { ptr: 0, size: 0 });
                    st.add_physical(
                        if handle_live { h.size } else { 0 },
                        if reservation_live { r.size } else { 0 },
                    );
                    let c = &mut st.counters;
                    c.pending_count += 1;
                    if handle_live {
                        c.pending_bytes += h.size;
                    }
                    let slot = st.add_slot(Mapping {
                        reservation: r,
                        handle: h,
                        requested: 0,
                        state: MappingState::Pending,
                        retry: false,
                        alloc_id: 0,
                        created: false,
                        mapped: still_mapped,
                        handle_live,
                        reservation_live,
                    });
                    st.pending.push(slot);
                }
                Err(err)
            }
        }
    }

    /// Frees an allocation made by this pool, given its exact address.
    ///
    /// Inside a retention scope the mapping is retained idle (no driver call).
    /// Outside, it stays cached while the pool's idle bytes stay at or under the
    /// release threshold, else it is released (synchronize, unmap, release the
    /// handle, free the reservation). A release step that fails keeps the memory and
    /// is retried at the next release point; it is counted in the snapshot and does
    /// not fail the free.
    ///
    /// Errors: [`Error::UnknownPointer`] for a pointer this pool did not hand out, an
    /// interior pointer, or a second free; nothing changes then.
    pub fn free_raw(&self, ptr: DevicePtr) -> Result<()> {
        self.free_inner(ptr, None)
    }

    /// Frees `ptr` if it is live, and, with `id`, only if it is that allocation.
    fn free_inner(&self, ptr: DevicePtr, id: Option<u64>) -> Result<()> {
        let mut batch = Batch::default();
        {
            let mut st = lock(&self.state);
            let slot = *st.live.get(&ptr).ok_or(Error::UnknownPointer { ptr })?;
            if id.is_some_and(|id| st.mapping(slot).alloc_id != id) {
                return Err(Error::UnknownPointer { ptr });
            }
            st.live.remove(&ptr);
            let m = st.mapping_mut(slot);
            m.state = MappingState::Idle;
            let (size, requested) = (m.size(), m.requested);
            m.requested = 0;
            let c = &mut st.counters;
            c.live_count -= 1;
            c.live_requested_bytes -= requested;
            c.live_mapped_bytes -= size;
            c.frees += 1;
            c.idle_count += 1;
            c.idle_bytes += size;
            if st.counters.scope_open || st.counters.idle_bytes <= self.release_threshold {
                st.idle.insert(slot, size);
                return Ok(());
            }
            let m = st.mapping_mut(slot);
            m.state = MappingState::Releasing;
            batch.mappings.push((slot, *m));
            st.collect_retries(&mut batch);
        }
        let _ = self.release_batch(batch);
        Ok(())
    }

    /// Opens the pool's retention scope: until it closes, freed mappings are retained
    /// idle (reusable by later allocations) and nothing is released, so no unmap can
    /// race work that is queued or captured. Open it around warmup and graph capture.
    ///
    /// Errors: [`Error::ScopeState`] when a scope is already open (scopes do not nest).
    pub fn retention_begin(&self) -> Result<()> {
        self.begin_scope().map(|_| ())
    }

    /// Opens the scope; returns its epoch.
    fn begin_scope(&self) -> Result<u64> {
        let mut st = lock(&self.state);
        if st.counters.scope_open {
            return Err(Error::ScopeState("a retention scope is already open"));
        }
        st.counters.scope_open = true;
        st.scope_epoch += 1;
        Ok(st.scope_epoch)
    }

    /// Opens a retention scope and returns a guard: [`RetentionScope::finish`]
    /// finishes it; dropping the guard without finishing aborts it.
    ///
    /// Errors: as [`Pool::retention_begin`].
    pub fn retention_scope(&self) -> Result<RetentionScope<'_>> {
        let epoch = self.begin_scope()?;
        Ok(RetentionScope {
            pool: self,
            epoch,
            open: true,
        })
    }

    /// Closes the scope and releases every idle mapping (one synchronize, then
    /// unmap, release, free each). Live allocations stay live.
    ///
    /// Errors: [`Error::ScopeState`] with no scope open; [`Error::Driver`] with the
    /// first release step the driver refused (the scope is closed all the same, and
    /// what was refused is kept and retried at the next release point).
    pub fn retention_finish(&self) -> Result<()> {
        self.close_scope(false, None)
    }

    /// Closes the scope as failed: the same release as [`Pool::retention_finish`],
    /// counted in `scopes_aborted`.
    ///
    /// Errors: as [`Pool::retention_finish`].
    pub fn retention_abort(&self) -> Result<()> {
        self.close_scope(true, None)
    }

    /// Closes the open scope; with `epoch`, only if it is that scope.
    fn close_scope(&self, aborted: bool, epoch: Option<u64>) -> Result<()> {
        let mut batch = Batch::default();
        {
            let mut st = lock(&self.state);
            if !st.counters.scope_open {
                return Err(Error::ScopeState("no retention scope is open"));
            }
            if epoch.is_some_and(|e| e != st.scope_epoch) {
                return Err(Error::ScopeState(
                    "this guard's retention scope was already closed; another one is open",
                ));
            }
            st.counters.scope_open = false;
            if aborted {
                st.counters.scopes_aborted += 1;
            } else {
                st.counters.scopes_finished += 1;
            }
            st.collect_all(&mut batch);
        }
        self.release_batch(batch)
    }

    /// Releases every idle (cached) mapping now, and retries pending releases.
    ///
    /// Errors: [`Error::ScopeState`] inside a retention scope (nothing retained is
    /// released there); [`Error::Driver`] with the first step the driver refused.
    pub fn trim(&self) -> Result<()> {
        self.release_idle(true)
    }

    fn release_idle(&self, scope_is_error: bool) -> Result<()> {
        let mut batch = Batch::default();
        {
            let mut st = lock(&self.state);
            if st.counters.scope_open {
                return if scope_is_error {
                    Err(Error::ScopeState(
                        "trim inside a retention scope: finish the scope instead",
                    ))
                } else {
                    Ok(())
                };
            }
            st.collect_all(&mut batch);
        }
        self.release_batch(batch)
    }

    /// Runs a batch's driver calls outside the lock, then books the outcomes.
    /// Returns the first failure.
    fn release_batch(&self, batch: Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let d = &*self.driver;
        let mut first: Option<Error> = None;
        let mut failed: Vec<DriverCall> = Vec::new();
        let mut note = |e: DriverError, bytes: u64, failed: &mut Vec<DriverCall>| {
            failed.push(e.call);
            if first.is_none() {
                first = Some(Error::Driver { source: e, bytes });
            }
        };
        let mut outcomes: Vec<(u32, Outcome)> = Vec::with_capacity(batch.mappings.len());
        if !batch.mappings.is_empty() {
            match d.synchronize() {
                Err(e) => {
                    note(e, 0, &mut failed);
                    outcomes.extend(
                        batch
                            .mappings
                            .iter()
                            .map(|(s, _)| (*s, Outcome::StillMapped)),
                    );
                }
                Ok(()) => {
                    for (slot, m) in &batch.mappings {
                        let outcome = self.release_steps(m, true, true, true, &mut |e| {
                            note(e, m.size(), &mut failed)
                        });
                        outcomes.push((*slot, outcome));
                    }
                }
            }
        }
        let mut pending_outcomes: Vec<(u32, Outcome)> = Vec::with_capacity(batch.pending.len());
        for (slot, m) in &batch.pending {
            let outcome =
                self.release_steps(m, m.mapped, m.handle_live, m.reservation_live, &mut |e| {
                    note(e, m.size(), &mut failed)
                });
            pending_outcomes.push((*slot, outcome));
        }
        let mut st = lock(&self.state);
        for call in failed {
            count_failure(&mut st.counters, call);
        }
        for (slot, outcome) in outcomes {
            st.apply_release(slot, outcome);
        }
        for (slot, outcome) in pending_outcomes {
            let m = st.mapping(slot);
            match outcome {
                Outcome::StillMapped => st.pending.push(slot),
                Outcome::Unmapped {
                    handle_live,
                    reservation_live,
                } => {
                    st.settle(slot, m, handle_live, reservation_live, true);
                    // settle() re-pushed it when something is left.
                }
            }
        }
        drop(st);
        first.map_or(Ok(()), Err)
    }

    /// Unmap (if `mapped`), release the handle (if live), free the reservation (if
    /// live), in that order. A failed unmap stops there (the mapping stays whole and
    /// its reservation must not be freed).
    fn release_steps(
        &self,
        m: &Mapping,
        mapped: bool,
        handle_live: bool,
        reservation_live: bool,
        note: &mut dyn FnMut(DriverError),
    ) -> Outcome {
        let d = &*self.driver;
        if mapped {
            if let Err(e) = d.unmap(m.reservation.ptr, m.size()) {
                note(e);
                return Outcome::StillMapped;
            }
        }
        let mut failed = |r: Result<(), DriverError>| match r {
            Ok(()) => false,
            Err(e) => {
                note(e);
                true
            }
        };
        let handle_live = handle_live && failed(d.release(m.handle));
        let reservation_live = reservation_live && failed(d.free_reservation(m.reservation));
        Outcome::Unmapped {
            handle_live,
            reservation_live,
        }
    }

    /// A consistent copy of the counters, taken under the lock.
    pub fn snapshot(&self) -> Snapshot {
        lock(&self.state).counters
    }

    /// Releases everything the pool holds, live allocations included, after one
    /// synchronize, and retries every refused step once.
    ///
    /// Errors: [`Error::Driver`] with the first step the driver still refused after
    /// the retry; that memory is left to the driver (a reservation is never freed
    /// while a mapping in it is live).
    pub fn destroy(mut self) -> Result<()> {
        let result = self.release_everything();
        // What the driver still refuses is left to it, as reported: forget it in the
        // books so that `Drop` (which runs next) does not release it a third and
        // fourth time behind the error just returned (found by
        // failure_classes::drop_retries_once_and_leaves_refused_memory_in_order).
        *lock(&self.state) = State::new(self.granularity);
        result
    }

    fn release_everything(&mut self) -> Result<()> {
        let mut last = Ok(());
        for _attempt in 0..2 {
            let mut batch = Batch::default();
            {
                let mut st = lock(&self.state);
                st.counters.scope_open = false;
                let live: Vec<u32> = st.live.drain().map(|(_, s)| s).collect();
                for slot in live {
                    let m = st.mapping_mut(slot);
                    m.state = MappingState::Idle;
                    let (size, requested) = (m.size(), m.requested);
                    let c = &mut st.counters;
                    c.live_count -= 1;
                    c.live_requested_bytes -= requested;
                    c.live_mapped_bytes -= size;
                    c.idle_count += 1;
                    c.idle_bytes += size;
                    st.idle.insert(slot, size);
                }
                // A pending leftover that is still mapped is retried with the rest.
                st.collect_all(&mut batch);
            }
            if batch.is_empty() {
                return last;
            }
            last = self.release_batch(batch);
            if last.is_ok() {
                let st = lock(&self.state);
                if st.idle.len() == 0 && st.pending.is_empty() {
                    return Ok(());
                }
            }
        }
        last
    }
}

/// The simulated machine must be one a real engine could run on: a capacity, a
/// power-of-two granularity (as every CUDA granularity is), and the device and every
/// peer among its devices.
fn validate_sim(config: &PoolConfig, sim: &SimConfig) -> Result<()> {
    if sim.capacity_bytes == 0 {
        return Err(Error::InvalidArgument(
            "the simulated device's capacity is 0 bytes".into(),
        ));
    }
    if sim.granularity_bytes != 0 && !sim.granularity_bytes.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "the simulated granularity {} bytes is not a power of two",
            sim.granularity_bytes
        )));
    }
    let count = sim.device_count.min(crate::driver::sim::SIM_MAX_DEVICES);
    let missing = std::iter::once(("device", config.device))
        .chain(config.peer_devices.iter().map(|&p| ("peer device", p)))
        .find(|&(_, d)| d as u32 >= count);
    if let Some((what, d)) = missing {
        return Err(Error::InvalidArgument(format!(
            "{what} {d} does not exist: the simulated machine has {count} device(s) \
             (SimConfig::device_count)"
        )));
    }
    Ok(())
}

fn validate_devices(config: &PoolConfig) -> Result<()> {
    if config.device < 0 {
        return Err(Error::InvalidArgument(format!(
            "device ordinal {} is negative",
            config.device
        )));
    }
    if let Some(p) = config.peer_devices.iter().find(|&&p| p < 0) {
        return Err(Error::InvalidArgument(format!(
            "peer device ordinal {p} is negative"
        )));
    }
    Ok(())
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = self.release_everything();
    }
}

/// A live allocation that frees itself when dropped.
#[derive(Debug)]
pub struct Allocation<'a> {
    pool: &'a Pool,
    ptr: DevicePtr,
    bytes: u64,
    /// Which allocation of the pool this is: dropping the guard frees the pointer
    /// only while it is still this allocation (not after a `free_raw` of it and a
    /// later allocation that reused the address).
    id: u64,
}

impl Allocation<'_> {
    /// The device address, aligned to the granularity.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The size asked for, bytes (the mapping behind it may be larger).
    pub fn size(&self) -> u64 {
        self.bytes
    }

    /// Gives up the guard without freeing; returns the address, to be freed later
    /// with [`Pool::free_raw`].
    pub fn into_raw(self) -> DevicePtr {
        let ptr = self.ptr;
        std::mem::forget(self);
        ptr
    }
}

impl Drop for Allocation<'_> {
    fn drop(&mut self) {
        // Refused only when the caller already freed this allocation with
        // `free_raw`: then there is nothing left to free.
        let _ = self.pool.free_inner(self.ptr, Some(self.id));
    }
}

/// An open retention scope; finish it with [`RetentionScope::finish`]. Dropping it
/// without finishing aborts the scope (the release is the same; the snapshot counts
/// it as aborted).
#[derive(Debug)]
pub struct RetentionScope<'a> {
    pool: &'a Pool,
    /// The scope this guard opened: it never closes another one.
    epoch: u64,
    open: bool,
}

impl RetentionScope<'_> {
    /// Finishes the scope: see [`Pool::retention_finish`].
    ///
    /// Errors: as [`Pool::retention_finish`]; [`Error::ScopeState`] also when this
    /// guard's scope was already closed by a direct `retention_finish` or
    /// `retention_abort` call (a later scope, if one is open, is left alone).
    pub fn finish(mut self) -> Result<()> {
        self.open = false;
        self.pool.close_scope(false, Some(self.epoch))
    }

    /// Aborts the scope: see [`Pool::retention_abort`]. Errors: as
    /// [`RetentionScope::finish`].
    pub fn abort(mut self) -> Result<()> {
        self.open = false;
        self.pool.close_scope(true, Some(self.epoch))
    }
}

impl Drop for RetentionScope<'_> {
    fn drop(&mut self) {
        if self.open {
            // Refused only when this scope was already closed directly.
            let _ = self.pool.close_scope(true, Some(self.epoch));
        }
    }
}
