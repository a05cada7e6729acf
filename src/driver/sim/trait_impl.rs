//! The [`Driver`] trait over the simulated driver's raw calls: each method delegates
//! and wraps a failure as a [`DriverError`] naming the call.

use super::SimDriver;
use super::{CaptureStatus, CUDA_ERROR_NOT_READY};
use crate::driver::{
    CaptureMode, CuResult, DevicePtr, Driver, DriverCall, DriverError, Event, HostBuffer, MemInfo,
    PhysicalHandle, Reservation, Stream,
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

    /// [`SimDriver::mem_host_alloc`].
    fn host_alloc(&self, size: u64) -> Result<HostBuffer, DriverError> {
        self.mem_host_alloc(size)
            .map(|raw| HostBuffer { raw, size })
            .map_err(|c| DriverError::new(DriverCall::HostAlloc, c))
    }

    /// [`SimDriver::mem_free_host`].
    fn host_free(&self, buffer: HostBuffer) -> Result<(), DriverError> {
        wrap(DriverCall::HostFree, self.mem_free_host(buffer.raw))
    }

    /// [`SimDriver::memcpy_dtoh`].
    fn copy_to_host(
        &self,
        dst: HostBuffer,
        offset: u64,
        src: DevicePtr,
        size: u64,
    ) -> Result<(), DriverError> {
        wrap(
            DriverCall::MemcpyDtoH,
            self.memcpy_dtoh(dst.raw, offset, src, size),
        )
    }

    /// [`SimDriver::memcpy_htod`].
    fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: HostBuffer,
        offset: u64,
        size: u64,
    ) -> Result<(), DriverError> {
        wrap(
            DriverCall::MemcpyHtoD,
            self.memcpy_htod(dst, src.raw, offset, size),
        )
    }

    /// [`SimDriver::memset_d8_async`].
    fn memset_async(
        &self,
        ptr: DevicePtr,
        value: u8,
        size: u64,
        stream: Stream,
    ) -> Result<(), DriverError> {
        wrap(
            DriverCall::MemsetD8Async,
            self.memset_d8_async(ptr, value, size, stream.0),
        )
    }

    /// [`SimDriver::event_create`].
    fn event_create(&self) -> Result<Event, DriverError> {
        SimDriver::event_create(self).map_err(|c| DriverError::new(DriverCall::EventCreate, c))
    }

    /// [`SimDriver::event_destroy`].
    fn event_destroy(&self, event: Event) -> Result<(), DriverError> {
        wrap(
            DriverCall::EventDestroy,
            SimDriver::event_destroy(self, event),
        )
    }

    /// [`SimDriver::event_record`].
    fn event_record(&self, event: Event, stream: Stream) -> Result<(), DriverError> {
        wrap(
            DriverCall::EventRecord,
            SimDriver::event_record(self, event, stream.0),
        )
    }

    /// [`SimDriver::event_query`]: `CUDA_ERROR_NOT_READY` is `Ok(false)`.
    fn event_query(&self, event: Event) -> Result<bool, DriverError> {
        match SimDriver::event_query(self, event) {
            c if c.is_success() => Ok(true),
            c if c == CUDA_ERROR_NOT_READY => Ok(false),
            c => Err(DriverError::new(DriverCall::EventQuery, c)),
        }
    }

    /// [`SimDriver::event_synchronize`].
    fn event_synchronize(&self, event: Event) -> Result<(), DriverError> {
        wrap(
            DriverCall::EventSynchronize,
            SimDriver::event_synchronize(self, event),
        )
    }

    /// [`SimDriver::stream_wait_event`].
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<(), DriverError> {
        wrap(
            DriverCall::StreamWaitEvent,
            SimDriver::stream_wait_event(self, stream.0, event),
        )
    }

    /// [`SimDriver::stream_get_capture_info`]: the capture's id while active or
    /// invalidated.
    fn stream_capture(&self, stream: Stream) -> Result<Option<u64>, DriverError> {
        match self.stream_get_capture_info(stream.0) {
            Ok(i) if i.status == CaptureStatus::None => Ok(None),
            Ok(i) => Ok(Some(i.id)),
            Err(c) => Err(DriverError::new(DriverCall::StreamGetCaptureInfo, c)),
        }
    }

    /// [`SimDriver::thread_exchange_capture_mode`] (never fails).
    fn exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode, DriverError> {
        Ok(self.thread_exchange_capture_mode(mode))
    }

    /// [`SimDriver::stream_create_with_flags`] with `CU_STREAM_DEFAULT` (0).
    fn stream_create_blocking(&self) -> Result<Stream, DriverError> {
        self.stream_create_with_flags(0)
            .map(Stream)
            .map_err(|c| DriverError::new(DriverCall::StreamCreate, c))
    }

    /// [`SimDriver::stream_destroy`].
    fn stream_destroy(&self, stream: Stream) -> Result<(), DriverError> {
        wrap(
            DriverCall::StreamDestroy,
            SimDriver::stream_destroy(self, stream.0),
        )
    }

    /// [`SimDriver::note_handoff`] (a fault is recorded in the driver, not returned).
    fn note_handoff(&self, stream: Stream, ptr: DevicePtr, size: u64) {
        let _ = SimDriver::note_handoff(self, stream.0, ptr, size);
    }

    /// [`SimDriver::mem_get_info`].
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.mem_get_info()
            .map_err(|c| DriverError::new(DriverCall::MemGetInfo, c))
    }
}
