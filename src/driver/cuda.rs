//! STUB: the CUDA driver backend. To be replaced by the full implementation.
#![allow(missing_docs, unused_variables)]

use super::{DevicePtr, Driver, DriverError, MemInfo, PhysicalHandle, Reservation};

/// The real CUDA driver for one device.
pub struct CudaDriver {}

impl CudaDriver {
    /// Loads libcuda, initialises it and retains `device`'s primary context.
    pub fn new(device: i32) -> Result<CudaDriver, DriverError> { unimplemented!() }
    /// Whether libcuda can be loaded on this machine.
    pub fn is_available() -> bool { unimplemented!() }
    pub fn device(&self) -> i32 { unimplemented!() }
}

impl Driver for CudaDriver {
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
