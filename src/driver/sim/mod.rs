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
//! - the [`Driver`](crate::driver::Driver) trait implementation, which delegates to them and wraps a failure
//!   as a [`DriverError`](crate::driver::DriverError) naming the call.
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

use std::fmt;

use super::{CuResult, DevicePtr};
use crate::sync::Mutex;

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

mod calls;
mod control;
mod model;
mod trait_impl;

use model::Inner;
