//! The simulated driver: a deterministic software model of the CUDA virtual-memory
//! calls that the pool makes, reproducing every measured row of
//! `docs/vmm-semantics.md` with the same `CUresult` codes.
//!
//! It is a shipped backend, not a test mock: an engine can run its CI and its memory
//! planning against it. It enforces a capacity, tracks every handle, reservation,
//! mapping and access grant, counts every call per kind, can be told to fail the
//! n-th future call of any kind with any code, models work in flight (a range marked
//! busy on one device until the next synchronize of that device) and a global-mode
//! stream capture.
//!
//! Two layers:
//!
//! - raw, CUDA-shaped inherent methods ([`SimDriver::mem_create`],
//!   [`SimDriver::mem_map`], ...) that take the same arguments as the driver calls
//!   (a map has an offset and a size) and return the raw [`CuResult`];
//! - the [`Driver`] trait implementation, which delegates to them and wraps a failure
//!   as a [`DriverError`] naming the call.
//!
//! All state sits behind one [`crate::sync::Mutex`], so the driver is `Send + Sync`
//! and every call is atomic with respect to the others. Nothing is random and no
//! address or handle value is ever reused.
//!
//! Addresses are unique per process, as on the real driver (one virtual address space
//! per process): every simulated driver reserves from its own windows of
//! [`SIM_VA_WINDOW`] bytes, handed out by one process-wide counter starting at
//! [`SIM_VA_BASE`], so no two drivers (no two pools) ever hand out the same address,
//! and a pointer freed on the wrong pool is an unknown pointer there. Reproducibility:
//! a driver's first window is taken when it is created, so the addresses a driver
//! hands out are the same from run to run as long as drivers are created in the same
//! order (the k-th driver of a process starts at `SIM_VA_BASE + k * SIM_VA_WINDOW`)
//! and a driver reserves less than a window (1 TiB) in its lifetime; past that it
//! takes the next free window, whose place depends on what other drivers took.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    CuResult, DevicePtr, Driver, DriverCall, DriverError, MemInfo, PhysicalHandle, Reservation,
};
use crate::sync::{lock, Mutex};

/// First virtual address the simulated reservations of a process are handed out
/// from: high and far from zero, like the driver's own VA space. The first simulated
/// driver of a process reserves from here; each later one from its own window above
/// (see [`SIM_VA_WINDOW`]).
pub const SIM_VA_BASE: DevicePtr = 0x7f00_0000_0000;

/// Size of the address window each simulated driver reserves from, bytes (1 TiB, a
/// multiple of every granularity up to 1 TiB; [`SIM_VA_BASE`] is a multiple of it).
/// Windows come from one process-wide counter, so the drivers of a process never
/// share an address. A driver that has used up its window (reservations are never
/// reused) takes the next free one, and a reservation larger than a window takes as
/// many whole windows as it needs. About 16 million windows fit below 2^64; when they
/// are gone, a reservation fails with `CUDA_ERROR_OUT_OF_MEMORY`, as the driver's
/// does when its address space is exhausted.
pub const SIM_VA_WINDOW: u64 = 1 << 40;

/// Start of the next free address window, shared by every simulated driver of the
/// process. A plain std atomic, also under loom: it only hands out disjoint ranges
/// and orders nothing else.
static NEXT_VA_WINDOW: AtomicU64 = AtomicU64::new(SIM_VA_BASE);

/// Takes whole windows from the process-wide counter: `[start, end)` with `start` a
/// multiple of `align` (at least [`SIM_VA_WINDOW`]) and at least `size` bytes (at
/// least one window). `None` when the 64-bit address space is exhausted.
fn claim_va_window(size: u64, align: u64) -> Option<(DevicePtr, DevicePtr)> {
    let align = align.max(SIM_VA_WINDOW);
    let mut claimed = None;
    NEXT_VA_WINDOW
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
            let start = align_up(next, align)?;
            let end = align_up(start.checked_add(size.max(1))?, SIM_VA_WINDOW)?;
            claimed = Some((start, end));
            Some(end)
        })
        .ok()?;
    claimed
}

/// `CUDA_ERROR_ILLEGAL_STATE` (401): what [`SimDriver::begin_capture`] returns while a
/// capture is already open and [`SimDriver::end_capture`] returns with none open, as
/// `cuStreamBeginCapture` / `cuStreamEndCapture` do.
pub const CUDA_ERROR_ILLEGAL_STATE: CuResult = CuResult(401);

/// 2 MiB: the granularity measured on an H200 (MINIMUM and RECOMMENDED alike).
const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// Settings of a simulated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Physical capacity, bytes (default: an H200, 140 GiB). [`SimDriver::mem_create`]
    /// fails with `CUDA_ERROR_OUT_OF_MEMORY` when the physical bytes held plus the
    /// new size would exceed it.
    pub capacity_bytes: u64,
    /// Allocation granularity, bytes (default 2 MiB, as measured on an H200). Both
    /// MINIMUM and RECOMMENDED report it. A value of 0 is taken as 2 MiB.
    pub granularity_bytes: u64,
    /// Number of simulated devices (ordinals 0..device_count), default 1. Access can
    /// be granted to these ordinals only. At most [`SIM_MAX_DEVICES`]; a larger
    /// value is taken as that.
    pub device_count: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            capacity_bytes: 140 << 30,
            granularity_bytes: DEFAULT_GRANULARITY,
            device_count: 1,
        }
    }
}

/// What the simulated driver holds right now (not cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimState {
    /// Handles created and not yet freed (released handles still mapped count).
    pub handles: u64,
    /// Physical bytes held by those handles (an aliased handle counts once).
    pub physical_bytes: u64,
    /// Live reservations.
    pub reservations: u64,
    /// Bytes of live reservations.
    pub reserved_bytes: u64,
    /// Live mappings.
    pub mappings: u64,
    /// Bytes of live mappings (an aliased handle counts once per mapping).
    pub mapped_bytes: u64,
    /// Access grants (mapping, device) pairs.
    pub access_grants: u64,
}

/// A contract violation the simulated driver recorded (the real driver would not
/// report it at the call, but work in flight would fault later).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimFault {
    /// A range marked busy (work in flight, [`SimDriver::mark_busy`]) was unmapped
    /// before a successful synchronize. On the real driver the unmap succeeds and the
    /// kernel then faults with an illegal address (sticky; "In-flight work: unmap does
    /// not wait" in `vmm-semantics.md`).
    UnmapWhileBusy {
        /// Start of the unmapped range (the `cuMemUnmap` argument), bytes.
        ptr: DevicePtr,
        /// Size of the unmapped range (the `cuMemUnmap` argument), bytes.
        size: u64,
    },
}

/// The most devices a simulated machine has (128: a set of device ordinals is one
/// 128-bit word, so that granting access allocates nothing).
pub const SIM_MAX_DEVICES: u32 = 128;

/// A set of device ordinals below [`SIM_MAX_DEVICES`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct DeviceSet(u128);

impl DeviceSet {
    fn insert(&mut self, device: i32) {
        self.0 |= 1u128 << (device as u32 % SIM_MAX_DEVICES);
    }
    fn contains(&self, device: i32) -> bool {
        (0..SIM_MAX_DEVICES as i32).contains(&device) && self.0 & (1u128 << device) != 0
    }
    fn len(&self) -> u64 {
        u64::from(self.0.count_ones())
    }
    fn iter(self) -> impl Iterator<Item = i32> {
        (0..SIM_MAX_DEVICES as i32).filter(move |&d| self.0 & (1u128 << d) != 0)
    }
}

/// A physical allocation the simulated driver holds.
#[derive(Clone, Copy, Debug)]
struct HandleRec {
    /// Size, bytes.
    size: u64,
    /// References: 1 at create, +1 per retain, −1 per release. 0 means released
    /// (the handle lives on only while mapped).
    refs: u64,
    /// Live mappings of this handle.
    maps: u64,
}

/// A live mapping.
#[derive(Clone, Debug)]
struct MappingRec {
    /// Size, bytes (always the whole handle).
    size: u64,
    /// Raw handle mapped there.
    handle: u64,
    /// Device ordinals granted read/write access.
    access: DeviceSet,
}

/// An open stream capture.
#[derive(Clone, Copy, Debug)]
struct Capture {
    /// Whether a synchronize invalidated it.
    invalidated: bool,
}

/// Everything behind the lock.
#[derive(Debug)]
struct Inner {
    config: SimConfig,
    next_handle: u64,
    /// The next address to reserve from, in the current window `..va_end`.
    next_va: u64,
    /// End of this driver's current address window (exclusive).
    va_end: u64,
    handles: BTreeMap<u64, HandleRec>,
    reservations: BTreeMap<DevicePtr, u64>,
    mappings: BTreeMap<DevicePtr, MappingRec>,
    physical_bytes: u64,
    calls: [u64; DriverCall::ALL.len()],
    /// Pending injections: (call, absolute call number that fails, code).
    injections: Vec<(DriverCall, u64, CuResult)>,
    /// Work in flight: (device, ptr, size).
    busy: Vec<(i32, DevicePtr, u64)>,
    faults: Vec<SimFault>,
    capture: Option<Capture>,
}

fn align_up(v: u64, align: u64) -> Option<u64> {
    if align == 0 {
        return Some(v);
    }
    let rem = v % align;
    if rem == 0 {
        Some(v)
    } else {
        v.checked_add(align - rem)
    }
}

fn overlaps(a: DevicePtr, a_size: u64, b: DevicePtr, b_size: u64) -> bool {
    a < b.saturating_add(b_size) && b < a.saturating_add(a_size)
}

impl Inner {
    fn gran(&self) -> u64 {
        self.config.granularity_bytes
    }

    /// Counts one call of `call` and returns the injected failure, if this call is
    /// the one an injection targets.
    fn begin(&mut self, call: DriverCall) -> Option<CuResult> {
        let idx = call as usize;
        let n = match self.calls.get_mut(idx) {
            Some(c) => {
                *c += 1;
                *c
            }
            None => return None,
        };
        let pos = self
            .injections
            .iter()
            .position(|&(c, at, _)| c == call && at == n)?;
        let (_, _, code) = self.injections.remove(pos);
        Some(code)
    }

    fn is_aligned(&self, v: u64) -> bool {
        v.is_multiple_of(self.gran())
    }

    /// The mapping containing address `p`, if any.
    fn mapping_at(&self, p: DevicePtr) -> Option<(DevicePtr, &MappingRec)> {
        let (&start, m) = self.mappings.range(..=p).next_back()?;
        if p < start.saturating_add(m.size) {
            Some((start, m))
        } else {
            None
        }
    }

    /// Whether the whole mappings exactly tile `[ptr, ptr + size)`: no byte unmapped,
    /// no mapping sticking out at either end.
    fn exactly_tiled(&self, ptr: DevicePtr, size: u64) -> bool {
        let Some(end) = ptr.checked_add(size) else {
            return false;
        };
        let mut cursor = ptr;
        while cursor < end {
            match self
                .mappings
                .get(&cursor)
                .and_then(|m| cursor.checked_add(m.size))
            {
                Some(next) => cursor = next,
                None => return false,
            }
        }
        cursor == end
    }

    /// Drops a mapping, and its handle when that was released and this was its last
    /// mapping (the physical bytes are freed then).
    fn remove_mapping(&mut self, start: DevicePtr) {
        let Some(m) = self.mappings.remove(&start) else {
            return;
        };
        let mut free = None;
        if let Some(h) = self.handles.get_mut(&m.handle) {
            h.maps = h.maps.saturating_sub(1);
            if h.maps == 0 && h.refs == 0 {
                free = Some(h.size);
            }
        }
        if let Some(bytes) = free {
            self.handles.remove(&m.handle);
            self.physical_bytes = self.physical_bytes.saturating_sub(bytes);
        }
    }
}

/// The simulated driver. See the module documentation.
pub struct SimDriver {
    inner: Mutex<Inner>,
}

impl fmt::Debug for SimDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimDriver")
            .field("config", &self.config())
            .field("state", &self.state())
            .finish()
    }
}

impl Default for SimDriver {
    /// A simulated H200 ([`SimConfig::default`]).
    fn default() -> Self {
        SimDriver::new(SimConfig::default())
    }
}

fn status(r: Result<(), CuResult>) -> CuResult {
    match r {
        Ok(()) => CuResult::SUCCESS,
        Err(code) => code,
    }
}

impl SimDriver {
    /// A fresh simulated device with `config`: nothing created, reserved or mapped,
    /// every call count 0, no injection pending, no capture open. A granularity of 0
    /// is taken as 2 MiB.
    pub fn new(config: SimConfig) -> SimDriver {
        let mut config = config;
        if config.granularity_bytes == 0 {
            config.granularity_bytes = DEFAULT_GRANULARITY;
        }
        config.device_count = config.device_count.min(SIM_MAX_DEVICES);
        // The first window is taken now, so that a driver's addresses depend only on
        // the order drivers are created in. With the address space exhausted (16
        // million drivers), the window is empty and every reservation fails.
        let (next_va, va_end) =
            claim_va_window(SIM_VA_WINDOW, config.granularity_bytes).unwrap_or((0, 0));
        SimDriver {
            inner: Mutex::new(Inner {
                config,
                next_handle: 1,
                next_va,
                va_end,
                handles: BTreeMap::new(),
                reservations: BTreeMap::new(),
                mappings: BTreeMap::new(),
                physical_bytes: 0,
                calls: [0; DriverCall::ALL.len()],
                injections: Vec::new(),
                busy: Vec::new(),
                faults: Vec::new(),
                capture: None,
            }),
        }
    }

    /// The configuration this device runs with (granularity normalised).
    pub fn config(&self) -> SimConfig {
        lock(&self.inner).config
    }

    /// Makes the `nth` future call of kind `call` fail with `code` (`nth` = 1: the
    /// next one; 0 is taken as 1). The failing call is counted in
    /// [`SimDriver::call_count`] but changes nothing else. Several injections may be
    /// pending for the same or different kinds; each targets one call, counted from
    /// the calls made when it is injected. An injection aimed at a call another one
    /// already targets moves to the next untargeted call of that kind, so two
    /// injections with `nth` = 1 fail the next two calls, in injection order.
    pub fn inject_failure(&self, call: DriverCall, nth: u32, code: CuResult) {
        let mut st = lock(&self.inner);
        let done = st.calls.get(call as usize).copied().unwrap_or(0);
        let mut at = done + u64::from(nth.max(1));
        while st.injections.iter().any(|&(c, a, _)| c == call && a == at) {
            at += 1;
        }
        st.injections.push((call, at, code));
    }

    /// Drops every pending injection.
    pub fn clear_failures(&self) {
        lock(&self.inner).injections.clear();
    }

    /// Number of injections still pending, all kinds together.
    pub fn pending_failures(&self) -> usize {
        lock(&self.inner).injections.len()
    }

    /// Marks `[ptr, ptr + size)` busy on device 0: [`SimDriver::mark_busy_on`] with
    /// device 0.
    pub fn mark_busy(&self, ptr: DevicePtr, size: u64) {
        self.mark_busy_on(0, ptr, size);
    }

    /// Marks `[ptr, ptr + size)` busy on `device`: work queued on that device (a
    /// kernel of a peer reading this memory, say) touches it until the next
    /// successful [`SimDriver::ctx_synchronize`] of that same device; a synchronize of
    /// another device does not clear it, as `cuCtxSynchronize` waits only for its own
    /// context's work. An unmap overlapping a busy range still succeeds, as the real
    /// driver's does, but is recorded as [`SimFault::UnmapWhileBusy`]. A `size` of 0
    /// marks nothing.
    pub fn mark_busy_on(&self, device: i32, ptr: DevicePtr, size: u64) {
        if size == 0 {
            return;
        }
        lock(&self.inner).busy.push((device, ptr, size));
    }

    /// The ranges currently marked busy, `(ptr, size)` in bytes, in marking order,
    /// every device together.
    pub fn busy_ranges(&self) -> Vec<(DevicePtr, u64)> {
        lock(&self.inner)
            .busy
            .iter()
            .map(|&(_, p, s)| (p, s))
            .collect()
    }

    /// Every fault recorded so far, oldest first. Tests of a correct pool assert this
    /// stays empty.
    pub fn faults(&self) -> Vec<SimFault> {
        lock(&self.inner).faults.clone()
    }

    /// What the driver holds right now: handles, physical bytes, reservations,
    /// mappings and access grants.
    pub fn state(&self) -> SimState {
        let st = lock(&self.inner);
        SimState {
            handles: st.handles.len() as u64,
            physical_bytes: st.physical_bytes,
            reservations: st.reservations.len() as u64,
            reserved_bytes: st.reservations.values().sum(),
            mappings: st.mappings.len() as u64,
            mapped_bytes: st.mappings.values().map(|m| m.size).sum(),
            access_grants: st.mappings.values().map(|m| m.access.len()).sum(),
        }
    }

    /// How many calls of kind `call` were made so far, failed ones (injected or not)
    /// included. [`DriverCall::Init`] is never called on the simulator and stays 0.
    pub fn call_count(&self, call: DriverCall) -> u64 {
        lock(&self.inner)
            .calls
            .get(call as usize)
            .copied()
            .unwrap_or(0)
    }

    /// `cuMemGetAllocationGranularity` with `CU_MEM_ALLOC_GRANULARITY_MINIMUM`, bytes
    /// (row "granularity MINIMUM and RECOMMENDED: both 2 MiB"). Counts as
    /// [`DriverCall::Granularity`]; fails only when injected.
    pub fn granularity_minimum(&self) -> Result<u64, CuResult> {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Granularity) {
            return Err(code);
        }
        Ok(st.gran())
    }

    /// `cuMemGetAllocationGranularity` with `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`,
    /// bytes; the same value as the minimum, as measured. Counts as
    /// [`DriverCall::Granularity`]; fails only when injected.
    pub fn granularity_recommended(&self) -> Result<u64, CuResult> {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Granularity) {
            return Err(code);
        }
        Ok(st.gran())
    }

    /// `cuMemCreate`: a physical handle of `size` bytes; returns its raw value (never
    /// 0, never reused). Counts as [`DriverCall::Create`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for size 0 or a size that is not a multiple
    /// of the granularity (rows "cuMemCreate size 0", "size not a multiple");
    /// `CUDA_ERROR_OUT_OF_MEMORY` when the physical bytes held plus `size` exceed the
    /// capacity (row "cuMemCreate of 1 TiB").
    pub fn mem_create(&self, size: u64) -> Result<u64, CuResult> {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Create) {
            return Err(code);
        }
        if size == 0 || !st.is_aligned(size) {
            return Err(CuResult::INVALID_VALUE);
        }
        match st.physical_bytes.checked_add(size) {
            Some(total) if total <= st.config.capacity_bytes => {
                let raw = st.next_handle;
                st.next_handle += 1;
                st.handles.insert(
                    raw,
                    HandleRec {
                        size,
                        refs: 1,
                        maps: 0,
                    },
                );
                st.physical_bytes = total;
                Ok(raw)
            }
            _ => Err(CuResult::OUT_OF_MEMORY),
        }
    }

    /// `cuMemRelease`: drops one reference to handle `raw`. When the last reference
    /// goes and the handle is not mapped, its physical bytes are freed; a handle still
    /// mapped stays usable and is freed at its last unmap (row "cuMemRelease while the
    /// handle is still mapped: success"). Counts as [`DriverCall::Release`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for a handle that was never created or whose
    /// references are all released already (row "cuMemRelease of an already released
    /// handle").
    pub fn mem_release(&self, raw: u64) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Release) {
            return code;
        }
        let Some(h) = st.handles.get_mut(&raw) else {
            return CuResult::INVALID_VALUE;
        };
        if h.refs == 0 {
            return CuResult::INVALID_VALUE;
        }
        h.refs -= 1;
        if h.refs == 0 && h.maps == 0 {
            let size = h.size;
            st.handles.remove(&raw);
            st.physical_bytes = st.physical_bytes.saturating_sub(size);
        }
        CuResult::SUCCESS
    }

    /// `cuMemRetainAllocationHandle`: the handle mapped at `ptr` (any address inside
    /// a mapping, not only its start), with one more reference that a
    /// [`SimDriver::mem_release`] must drop (row "cuMemRetainAllocationHandle from an
    /// interior address: same handle value"). Not a [`DriverCall`] kind: not counted,
    /// never injected.
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` when `ptr` is not mapped.
    pub fn mem_retain_allocation_handle(&self, ptr: DevicePtr) -> Result<u64, CuResult> {
        let mut st = lock(&self.inner);
        let raw = match st.mapping_at(ptr) {
            Some((_, m)) => m.handle,
            None => return Err(CuResult::INVALID_VALUE),
        };
        match st.handles.get_mut(&raw) {
            Some(h) => {
                h.refs += 1;
                Ok(raw)
            }
            None => Err(CuResult::INVALID_VALUE),
        }
    }

    /// `cuMemAddressReserve`: `size` bytes of virtual addresses aligned to
    /// max(`alignment`, granularity) (`alignment` 0: the granularity). Addresses come
    /// from a bump allocator in this driver's own windows (from [`SIM_VA_BASE`] up,
    /// [`SIM_VA_WINDOW`] bytes each, never another driver's) and are never reused.
    /// Counts as [`DriverCall::Reserve`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for size 0, a size that is not a multiple of
    /// the granularity (row "cuMemAddressReserve size 0, or not a multiple of G") or
    /// an alignment that is not a power of two; `CUDA_ERROR_OUT_OF_MEMORY` when the
    /// 64-bit address space is exhausted.
    pub fn mem_address_reserve(&self, size: u64, alignment: u64) -> Result<DevicePtr, CuResult> {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Reserve) {
            return Err(code);
        }
        if size == 0 || !st.is_aligned(size) {
            return Err(CuResult::INVALID_VALUE);
        }
        if alignment != 0 && !alignment.is_power_of_two() {
            return Err(CuResult::INVALID_VALUE);
        }
        let align = alignment.max(st.gran());
        let in_window = align_up(st.next_va, align)
            .and_then(|ptr| Some((ptr, ptr.checked_add(size)?)))
            .filter(|&(_, end)| end <= st.va_end);
        let (ptr, next) = match in_window {
            Some(range) => range,
            None => {
                // This window is used up: take fresh ones, never another driver's.
                let Some((start, end)) = claim_va_window(size, align) else {
                    return Err(CuResult::OUT_OF_MEMORY);
                };
                st.va_end = end;
                (start, start + size)
            }
        };
        st.next_va = next;
        st.reservations.insert(ptr, size);
        Ok(ptr)
    }

    /// `cuMemAddressFree`: frees the whole reservation `[ptr, ptr + size)`. Counts as
    /// [`DriverCall::FreeReservation`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` when `(ptr, size)` is not exactly a live
    /// reservation (rows "of part of a reservation", "of an already freed
    /// reservation") or while any mapping inside it is live (row "while any mapping
    /// inside it is live").
    pub fn mem_address_free(&self, ptr: DevicePtr, size: u64) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::FreeReservation) {
            return code;
        }
        if st.reservations.get(&ptr) != Some(&size) {
            return CuResult::INVALID_VALUE;
        }
        let end = ptr.saturating_add(size);
        if st.mappings.range(ptr..end).next().is_some() {
            return CuResult::INVALID_VALUE;
        }
        st.reservations.remove(&ptr);
        CuResult::SUCCESS
    }

    /// `cuMemMap`: maps `size` bytes of handle `raw`, from byte `offset` of the
    /// handle, at `ptr`. Only the whole handle can be mapped. The new mapping has no
    /// access until [`SimDriver::mem_set_access`]. Mapping a handle that is already
    /// mapped elsewhere (an alias) succeeds and holds no more physical bytes (row
    /// "map the same handle a second time at another VA"). Counts as
    /// [`DriverCall::Map`].
    ///
    /// Errors, in this order:
    /// - `CUDA_ERROR_INVALID_VALUE`: size 0, `ptr` or `size` not a multiple of the
    ///   granularity (row "map at a VA that is not a multiple of G"), a handle never
    ///   created or already released, or `offset + size` past the handle's end;
    /// - `CUDA_ERROR_NOT_SUPPORTED`: `offset` ≠ 0 or `size` ≠ the handle's size (rows
    ///   "map a 2G prefix of a 4G handle", "map 2G of a 4G handle at offset G");
    /// - `CUDA_ERROR_INVALID_VALUE`: the range is not inside one live reservation (row
    ///   "map at a VA that is not reserved") or overlaps a live mapping (row "map over
    ///   a VA that is already mapped").
    pub fn mem_map(&self, ptr: DevicePtr, size: u64, offset: u64, raw: u64) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Map) {
            return code;
        }
        status(Self::map_locked(&mut st, ptr, size, offset, raw))
    }

    fn map_locked(
        st: &mut Inner,
        ptr: DevicePtr,
        size: u64,
        offset: u64,
        raw: u64,
    ) -> Result<(), CuResult> {
        let invalid = Err(CuResult::INVALID_VALUE);
        if size == 0 || !st.is_aligned(ptr) || !st.is_aligned(size) {
            return invalid;
        }
        let Some(end) = ptr.checked_add(size) else {
            return invalid;
        };
        let hsize = match st.handles.get(&raw) {
            Some(h) if h.refs > 0 => h.size,
            _ => return invalid,
        };
        match offset.checked_add(size) {
            Some(e) if e <= hsize => {}
            _ => return invalid,
        }
        if offset != 0 || size != hsize {
            return Err(CuResult::NOT_SUPPORTED);
        }
        match st.reservations.range(..=ptr).next_back() {
            Some((&r, &rsize)) if end <= r.saturating_add(rsize) => {}
            _ => return invalid,
        }
        if let Some((&m, rec)) = st.mappings.range(..end).next_back() {
            if overlaps(m, rec.size, ptr, size) {
                return invalid;
            }
        }
        st.mappings.insert(
            ptr,
            MappingRec {
                size,
                handle: raw,
                access: DeviceSet::default(),
            },
        );
        if let Some(h) = st.handles.get_mut(&raw) {
            h.maps += 1;
        }
        Ok(())
    }

    /// `cuMemSetAccess`: grants read/write access to `[ptr, ptr + size)` for each
    /// device ordinal in `devices` (one descriptor each). The range must be exactly
    /// tiled by whole live mappings (one mapping, or several adjacent ones covered
    /// fully; row "cuMemSetAccess on exactly the mapped range: success"). Granting a
    /// device twice is harmless. Counts as [`DriverCall::SetAccess`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for size 0, no device, a device ordinal
    /// `< 0` or `>= device_count` (row "naming a device ordinal that does not exist"),
    /// or a range that is unmapped, partly unmapped or cuts a mapping (row "on an
    /// unmapped range, or on a range that is partly unmapped").
    pub fn mem_set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::SetAccess) {
            return code;
        }
        if size == 0 || devices.is_empty() {
            return CuResult::INVALID_VALUE;
        }
        let count = i64::from(st.config.device_count);
        if devices.iter().any(|&d| d < 0 || i64::from(d) >= count) {
            return CuResult::INVALID_VALUE;
        }
        if !st.exactly_tiled(ptr, size) {
            return CuResult::INVALID_VALUE;
        }
        for (_, m) in st.mappings.range_mut(ptr..ptr + size) {
            for &d in devices {
                m.access.insert(d);
            }
        }
        CuResult::SUCCESS
    }

    /// `cuMemUnmap`: unmaps every whole mapping inside `[ptr, ptr + size)`; their
    /// access grants go with them, and a released handle's physical bytes are freed at
    /// its last unmap. Bytes of the range that are not mapped are ignored (row "unmap
    /// a range that is already unmapped, or whose tail is unmapped: success"); one
    /// call may cover several adjacent mappings (row "one range covering two adjacent
    /// whole mappings: success"). Does not wait for work in flight: overlapping a
    /// range marked busy still succeeds but records [`SimFault::UnmapWhileBusy`].
    /// Counts as [`DriverCall::Unmap`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for size 0, `ptr` or `size` not a multiple
    /// of the granularity (row "unmap with a size that is not a multiple of G"), or a
    /// range that cuts a live mapping (row "unmap part of one mapping").
    pub fn mem_unmap(&self, ptr: DevicePtr, size: u64) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Unmap) {
            return code;
        }
        if size == 0 || !st.is_aligned(ptr) || !st.is_aligned(size) {
            return CuResult::INVALID_VALUE;
        }
        let Some(end) = ptr.checked_add(size) else {
            return CuResult::INVALID_VALUE;
        };
        // A mapping starting before `ptr` that reaches into the range is cut.
        if let Some((s, _)) = st.mapping_at(ptr) {
            if s != ptr {
                return CuResult::INVALID_VALUE;
            }
        }
        if st
            .mappings
            .range(ptr..end)
            .any(|(&s, m)| s.saturating_add(m.size) > end)
        {
            return CuResult::INVALID_VALUE;
        }
        if st.busy.iter().any(|&(_, b, bs)| overlaps(b, bs, ptr, size)) {
            st.faults.push(SimFault::UnmapWhileBusy { ptr, size });
        }
        while let Some((&s, _)) = st.mappings.range(ptr..end).next() {
            st.remove_mapping(s);
        }
        CuResult::SUCCESS
    }

    /// `cuCtxSynchronize` with `device`'s primary context current: waits for all the
    /// work of that device, which clears its busy marks and no other device's.
    /// Counts as [`DriverCall::Synchronize`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_DEVICE` for an ordinal that is not one of the
    /// simulated devices; `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` while a capture is
    /// open: the capture is then invalidated and busy marks stay (row
    /// "cuCtxSynchronize during a global-mode stream capture").
    pub fn ctx_synchronize(&self, device: i32) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Synchronize) {
            return code;
        }
        if device < 0 || i64::from(device) >= i64::from(st.config.device_count) {
            return CuResult::INVALID_DEVICE;
        }
        if let Some(c) = st.capture.as_mut() {
            c.invalidated = true;
            return CuResult::STREAM_CAPTURE_UNSUPPORTED;
        }
        st.busy.retain(|&(d, _, _)| d != device);
        CuResult::SUCCESS
    }

    /// `cuMemGetInfo`: free = capacity − physical bytes held, total = capacity, bytes.
    /// Counts as [`DriverCall::MemGetInfo`]; fails only when injected.
    pub fn mem_get_info(&self) -> Result<MemInfo, CuResult> {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::MemGetInfo) {
            return Err(code);
        }
        let total = st.config.capacity_bytes;
        Ok(MemInfo {
            free: total.saturating_sub(st.physical_bytes),
            total,
        })
    }

    /// Models a kernel or memset on device `device` reading and writing
    /// `[ptr, ptr + size)`. Not a driver call: not counted, never injected.
    ///
    /// Returns `CUDA_SUCCESS` when every byte is mapped with access granted to
    /// `device` (a size of 0 touches nothing), else `CUDA_ERROR_INVALID_VALUE` (row
    /// "any access before cuMemSetAccess on a new mapping").
    pub fn touch(&self, ptr: DevicePtr, size: u64, device: i32) -> CuResult {
        let st = lock(&self.inner);
        if device < 0 || i64::from(device) >= i64::from(st.config.device_count) {
            return CuResult::INVALID_VALUE;
        }
        let Some(end) = ptr.checked_add(size) else {
            return CuResult::INVALID_VALUE;
        };
        let mut cursor = ptr;
        while cursor < end {
            match st.mapping_at(cursor) {
                Some((s, m)) if m.access.contains(device) => {
                    cursor = s.saturating_add(m.size);
                }
                _ => return CuResult::INVALID_VALUE,
            }
        }
        CuResult::SUCCESS
    }

    /// Opens a global-mode stream capture (`cuStreamBeginCapture`). While it is open
    /// every VMM call behaves as outside one; [`SimDriver::ctx_synchronize`] fails
    /// and invalidates it. Not counted.
    ///
    /// Returns `CUDA_SUCCESS`, or [`CUDA_ERROR_ILLEGAL_STATE`] when a capture is
    /// already open.
    pub fn begin_capture(&self) -> CuResult {
        let mut st = lock(&self.inner);
        if st.capture.is_some() {
            return CUDA_ERROR_ILLEGAL_STATE;
        }
        st.capture = Some(Capture { invalidated: false });
        CuResult::SUCCESS
    }

    /// Closes the capture (`cuStreamEndCapture`). Not counted.
    ///
    /// Returns `CUDA_SUCCESS` when no synchronize happened during it (row "all
    /// succeed; the capture ends fine"), `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when
    /// one did, [`CUDA_ERROR_ILLEGAL_STATE`] when no capture is open.
    pub fn end_capture(&self) -> CuResult {
        match lock(&self.inner).capture.take() {
            None => CUDA_ERROR_ILLEGAL_STATE,
            Some(c) if c.invalidated => CuResult::STREAM_CAPTURE_INVALIDATED,
            Some(_) => CuResult::SUCCESS,
        }
    }

    /// Whether a capture is open.
    pub fn is_capturing(&self) -> bool {
        lock(&self.inner).capture.is_some()
    }

    /// Device ordinals granted access on the mapping containing `ptr`, ascending;
    /// empty when `ptr` is not mapped. A query of the model, not a driver call.
    pub fn access_of(&self, ptr: DevicePtr) -> Vec<i32> {
        let st = lock(&self.inner);
        match st.mapping_at(ptr) {
            Some((_, m)) => m.access.iter().collect(),
            None => Vec::new(),
        }
    }
}

fn wrap(call: DriverCall, code: CuResult) -> Result<(), DriverError> {
    super::check(call, code)
}

impl Driver for SimDriver {
    /// [`SimDriver::granularity_recommended`].
    fn granularity(&self) -> Result<u64, DriverError> {
        self.granularity_recommended()
            .map_err(|c| DriverError::new(DriverCall::Granularity, c))
    }

    /// [`SimDriver::mem_create`].
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
        self.mem_create(size)
            .map(|raw| PhysicalHandle { raw, size })
            .map_err(|c| DriverError::new(DriverCall::Create, c))
    }

    /// [`SimDriver::mem_release`] of `handle.raw`.
    fn release(&self, handle: PhysicalHandle) -> Result<(), DriverError> {
        wrap(DriverCall::Release, self.mem_release(handle.raw))
    }

    /// [`SimDriver::mem_address_reserve`] with the granularity as alignment.
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
        self.mem_address_reserve(size, 0)
            .map(|ptr| Reservation { ptr, size })
            .map_err(|c| DriverError::new(DriverCall::Reserve, c))
    }

    /// [`SimDriver::mem_address_free`].
    fn free_reservation(&self, reservation: Reservation) -> Result<(), DriverError> {
        wrap(
            DriverCall::FreeReservation,
            self.mem_address_free(reservation.ptr, reservation.size),
        )
    }

    /// [`SimDriver::mem_map`] of the whole handle (offset 0, size = `handle.size`).
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DriverError> {
        wrap(
            DriverCall::Map,
            self.mem_map(ptr, handle.size, 0, handle.raw),
        )
    }

    /// [`SimDriver::mem_set_access`].
    fn set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> Result<(), DriverError> {
        wrap(
            DriverCall::SetAccess,
            self.mem_set_access(ptr, size, devices),
        )
    }

    /// [`SimDriver::mem_unmap`].
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> {
        wrap(DriverCall::Unmap, self.mem_unmap(ptr, size))
    }

    /// [`SimDriver::ctx_synchronize`] of `device`.
    fn synchronize(&self, device: i32) -> Result<(), DriverError> {
        wrap(DriverCall::Synchronize, self.ctx_synchronize(device))
    }

    /// [`SimDriver::mem_get_info`].
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.mem_get_info()
            .map_err(|c| DriverError::new(DriverCall::MemGetInfo, c))
    }
}
