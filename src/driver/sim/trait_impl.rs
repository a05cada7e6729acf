//! The [`Driver`] trait over the simulated driver's raw calls: each method delegates
//! and wraps a failure as a [`DriverError`] naming the call.

use super::SimDriver;
use crate::driver::{
    CuResult, DevicePtr, Driver, DriverCall, DriverError, MemInfo, PhysicalHandle, Reservation,
};

fn wrap(call: DriverCall, code: CuResult) -> Result<(), DriverError> {
    crate::driver::check(call, code)
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
