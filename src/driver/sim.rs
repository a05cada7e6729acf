//! STUB: the simulated driver. To be replaced by the full implementation.
#![allow(missing_docs, unused_variables)]

use super::{CuResult, DevicePtr, Driver, DriverCall, DriverError, MemInfo, PhysicalHandle, Reservation};

/// Settings of a simulated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Physical capacity, bytes (default: an H200, 140 GiB).
    pub capacity_bytes: u64,
    /// Allocation granularity, bytes (default 2 MiB, as measured on an H200).
    pub granularity_bytes: u64,
    /// Number of simulated devices (ordinals 0..device_count), default 1.
    pub device_count: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { capacity_bytes: 140 << 30, granularity_bytes: 2 << 20, device_count: 1 }
    }
}

/// What the simulated driver holds right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimState {
    /// Handles created and not yet freed (released handles still mapped count).
    pub handles: u64,
    /// Physical bytes held by those handles.
    pub physical_bytes: u64,
    /// Live reservations.
    pub reservations: u64,
    /// Bytes of live reservations.
    pub reserved_bytes: u64,
    /// Live mappings.
    pub mappings: u64,
    /// Bytes of live mappings.
    pub mapped_bytes: u64,
    /// Access grants (mapping, device) pairs.
    pub access_grants: u64,
}

/// A contract violation the simulated driver recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimFault {
    /// A range marked busy (work in flight) was unmapped before a synchronize.
    UnmapWhileBusy { ptr: DevicePtr, size: u64 },
}

/// The simulated driver.
pub struct SimDriver {}

impl SimDriver {
    pub fn new(config: SimConfig) -> SimDriver { unimplemented!() }
    pub fn config(&self) -> SimConfig { unimplemented!() }
    pub fn inject_failure(&self, call: DriverCall, nth: u32, code: CuResult) { unimplemented!() }
    pub fn clear_failures(&self) { unimplemented!() }
    pub fn mark_busy(&self, ptr: DevicePtr, size: u64) { unimplemented!() }
    pub fn faults(&self) -> Vec<SimFault> { unimplemented!() }
    pub fn state(&self) -> SimState { unimplemented!() }
    pub fn call_count(&self, call: DriverCall) -> u64 { unimplemented!() }
}

impl Driver for SimDriver {
    fn granularity(&self) -> Result<u64, DriverError> { unimplemented!() }
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> { unimplemented!() }
    fn release(&self, handle: PhysicalHandle) -> Result<(), DriverError> { unimplemented!() }
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError> { unimplemented!() }
    fn free_reservation(&self, reservation: Reservation) -> Result<(), DriverError> { unimplemented!() }
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DriverError> { unimplemented!() }
    fn set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> Result<(), DriverError> { unimplemented!() }
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> { unimplemented!() }
    fn synchronize(&self) -> Result<(), DriverError> { unimplemented!() }
    fn mem_info(&self) -> Result<MemInfo, DriverError> { unimplemented!() }
}
