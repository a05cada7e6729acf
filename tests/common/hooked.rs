//! A simulated driver with a one-shot hook, to act while the pool is inside a driver
//! call (outside its lock, as every memory, synchronize and event wait call is): the
//! first call of the armed kind runs the hook first (what another thread does
//! meanwhile), then returns the simulated call's result, or the armed failure
//! instead.

use flare_package::driver::{CaptureMode, Event, MemInfo, PhysicalHandle, Reservation};
use flare_package::{
    CuResult, DevicePtr, Driver, DriverCall, DriverError, Pool, PoolConfig, SimConfig, SimDriver,
    Stream,
};
use std::sync::{Arc, Mutex};

type Hook = Box<dyn FnOnce() + Send>;

pub struct Hooked {
    pub sim: Arc<SimDriver>,
    armed: Mutex<Option<(DriverCall, Hook, Option<CuResult>)>>,
    /// Run at the next [`Driver::note_handoff`] (the pool's last step of a
    /// stream-ordered allocation, after its locked section).
    handoff: Mutex<Option<Hook>>,
}

impl Hooked {
    pub fn new(sim: Arc<SimDriver>) -> Arc<Hooked> {
        Arc::new(Hooked {
            sim,
            armed: Mutex::new(None),
            handoff: Mutex::new(None),
        })
    }

    /// Runs `hook` at the next call of kind `call`; that call then fails with
    /// `fail` (unmade), or is made.
    pub fn arm(
        &self,
        call: DriverCall,
        fail: Option<CuResult>,
        hook: impl FnOnce() + Send + 'static,
    ) {
        *self.armed.lock().unwrap() = Some((call, Box::new(hook), fail));
    }

    /// Runs `hook` at the next [`Driver::note_handoff`].
    pub fn arm_handoff(&self, hook: impl FnOnce() + Send + 'static) {
        *self.handoff.lock().unwrap() = Some(Box::new(hook));
    }

    fn at(&self, call: DriverCall) -> Result<(), DriverError> {
        let armed = {
            let mut g = self.armed.lock().unwrap();
            match g.as_ref() {
                Some((c, _, _)) if *c == call => g.take(),
                _ => None,
            }
        };
        if let Some((_, hook, fail)) = armed {
            hook();
            if let Some(code) = fail {
                return Err(DriverError::new(call, code));
            }
        }
        Ok(())
    }
}

impl Driver for Hooked {
    fn granularity(&self) -> Result<u64, DriverError> {
        self.sim.granularity()
    }
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
        self.at(DriverCall::Create)?;
        self.sim.create(size)
    }
    fn release(&self, h: PhysicalHandle) -> Result<(), DriverError> {
        self.at(DriverCall::Release)?;
        self.sim.release(h)
    }
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
        self.at(DriverCall::Reserve)?;
        self.sim.reserve(size)
    }
    fn free_reservation(&self, r: Reservation) -> Result<(), DriverError> {
        self.at(DriverCall::FreeReservation)?;
        self.sim.free_reservation(r)
    }
    fn map(&self, ptr: DevicePtr, h: PhysicalHandle) -> Result<(), DriverError> {
        self.at(DriverCall::Map)?;
        self.sim.map(ptr, h)
    }
    fn set_access(&self, ptr: DevicePtr, size: u64, d: &[i32]) -> Result<(), DriverError> {
        self.at(DriverCall::SetAccess)?;
        self.sim.set_access(ptr, size, d)
    }
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> {
        self.at(DriverCall::Unmap)?;
        self.sim.unmap(ptr, size)
    }
    fn synchronize(&self, device: i32) -> Result<(), DriverError> {
        self.at(DriverCall::Synchronize)?;
        self.sim.synchronize(device)
    }
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.sim.mem_info()
    }
    fn event_create(&self) -> Result<Event, DriverError> {
        Driver::event_create(&*self.sim)
    }
    fn event_destroy(&self, e: Event) -> Result<(), DriverError> {
        Driver::event_destroy(&*self.sim, e)
    }
    fn event_record(&self, e: Event, s: Stream) -> Result<(), DriverError> {
        self.at(DriverCall::EventRecord)?;
        Driver::event_record(&*self.sim, e, s)
    }
    fn event_query(&self, e: Event) -> Result<bool, DriverError> {
        self.at(DriverCall::EventQuery)?;
        Driver::event_query(&*self.sim, e)
    }
    fn event_synchronize(&self, e: Event) -> Result<(), DriverError> {
        self.at(DriverCall::EventSynchronize)?;
        Driver::event_synchronize(&*self.sim, e)
    }
    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<(), DriverError> {
        Driver::stream_wait_event(&*self.sim, s, e)
    }
    fn stream_capture(&self, s: Stream) -> Result<Option<u64>, DriverError> {
        Driver::stream_capture(&*self.sim, s)
    }
    fn exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode, DriverError> {
        Driver::exchange_capture_mode(&*self.sim, mode)
    }
    fn stream_create_blocking(&self) -> Result<Stream, DriverError> {
        Driver::stream_create_blocking(&*self.sim)
    }
    fn stream_destroy(&self, s: Stream) -> Result<(), DriverError> {
        Driver::stream_destroy(&*self.sim, s)
    }
    fn note_handoff(&self, stream: Stream, ptr: DevicePtr, size: u64) {
        let hook = self.handoff.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        Driver::note_handoff(&*self.sim, stream, ptr, size);
    }
}

/// A pool of `config` on a [`Hooked`] default simulated driver, shared (the
/// hooks act on it from another thread).
pub fn hooked_pool(config: PoolConfig) -> (Arc<Pool>, Arc<Hooked>, Arc<SimDriver>) {
    let sim = Arc::new(SimDriver::new(SimConfig::default()));
    let driver = Hooked::new(sim.clone());
    let pool = Pool::with_driver(config, driver.clone()).expect("a pool on the hooked driver");
    (Arc::new(pool), driver, sim)
}
