//! A [`Driver`] that counts the calls the pool makes through it, by kind, and
//! delegates each to the driver it wraps: for the GPU tests that check which driver
//! calls a path makes (no `cuCtxSynchronize` on the stream-ordered paths). Only the
//! pool's calls go through it; a test's own launches, memsets and copies go to the
//! wrapped driver directly and are not counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flare_package::driver::{
    CaptureMode, DevicePtr, Driver, DriverCall, DriverError, Event, MemInfo, PhysicalHandle,
    Reservation, Stream,
};

/// Counts every call by [`DriverCall`] kind (made, whether or not it succeeded).
pub struct Counting<D> {
    pub inner: Arc<D>,
    counts: [AtomicU64; DriverCall::ALL.len()],
}

impl<D: Driver> Counting<D> {
    pub fn new(inner: Arc<D>) -> Self {
        Counting {
            inner,
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Calls of kind `call` made so far.
    pub fn count(&self, call: DriverCall) -> u64 {
        self.counts[call as usize].load(Ordering::SeqCst)
    }

    fn bump(&self, call: DriverCall) {
        self.counts[call as usize].fetch_add(1, Ordering::SeqCst);
    }
}

impl<D: Driver> Driver for Counting<D> {
    fn granularity(&self) -> Result<u64, DriverError> {
        self.bump(DriverCall::Granularity);
        self.inner.granularity()
    }
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
        self.bump(DriverCall::Create);
        self.inner.create(size)
    }
    fn release(&self, handle: PhysicalHandle) -> Result<(), DriverError> {
        self.bump(DriverCall::Release);
        self.inner.release(handle)
    }
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
        self.bump(DriverCall::Reserve);
        self.inner.reserve(size)
    }
    fn free_reservation(&self, reservation: Reservation) -> Result<(), DriverError> {
        self.bump(DriverCall::FreeReservation);
        self.inner.free_reservation(reservation)
    }
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DriverError> {
        self.bump(DriverCall::Map);
        self.inner.map(ptr, handle)
    }
    fn set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> Result<(), DriverError> {
        self.bump(DriverCall::SetAccess);
        self.inner.set_access(ptr, size, devices)
    }
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> {
        self.bump(DriverCall::Unmap);
        self.inner.unmap(ptr, size)
    }
    fn synchronize(&self, device: i32) -> Result<(), DriverError> {
        self.bump(DriverCall::Synchronize);
        self.inner.synchronize(device)
    }
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.bump(DriverCall::MemGetInfo);
        self.inner.mem_info()
    }
    fn event_create(&self) -> Result<Event, DriverError> {
        self.bump(DriverCall::EventCreate);
        self.inner.event_create()
    }
    fn event_destroy(&self, event: Event) -> Result<(), DriverError> {
        self.bump(DriverCall::EventDestroy);
        self.inner.event_destroy(event)
    }
    fn event_record(&self, event: Event, stream: Stream) -> Result<(), DriverError> {
        self.bump(DriverCall::EventRecord);
        self.inner.event_record(event, stream)
    }
    fn event_query(&self, event: Event) -> Result<bool, DriverError> {
        self.bump(DriverCall::EventQuery);
        self.inner.event_query(event)
    }
    fn event_synchronize(&self, event: Event) -> Result<(), DriverError> {
        self.bump(DriverCall::EventSynchronize);
        self.inner.event_synchronize(event)
    }
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<(), DriverError> {
        self.bump(DriverCall::StreamWaitEvent);
        self.inner.stream_wait_event(stream, event)
    }
    fn stream_capture(&self, stream: Stream) -> Result<Option<u64>, DriverError> {
        self.bump(DriverCall::StreamGetCaptureInfo);
        self.inner.stream_capture(stream)
    }
    fn exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode, DriverError> {
        self.bump(DriverCall::ThreadExchangeCaptureMode);
        self.inner.exchange_capture_mode(mode)
    }
    fn stream_create_blocking(&self) -> Result<Stream, DriverError> {
        self.bump(DriverCall::StreamCreate);
        self.inner.stream_create_blocking()
    }
    fn stream_destroy(&self, stream: Stream) -> Result<(), DriverError> {
        self.bump(DriverCall::StreamDestroy);
        self.inner.stream_destroy(stream)
    }
    fn note_handoff(&self, stream: Stream, ptr: DevicePtr, size: u64) {
        self.inner.note_handoff(stream, ptr, size);
    }
}
