//! A simulated driver whose synchronize (or create) can be held at a gate, for the
//! tests that race a release or a miss held mid-way.

use flare_package::driver::{MemInfo, PhysicalHandle, Reservation};
use flare_package::{DevicePtr, Driver, DriverCall, DriverError, SimConfig, SimDriver};
use std::sync::{mpsc, Arc, Condvar, Mutex};

/// A simulated driver whose synchronize (or create) can be held: once armed, the
/// next such call tells the test it has started and then waits until the test opens
/// the gate, before it reaches the simulated driver. That holds a release mid-way
/// (between the pool's unlock and its synchronize), or a miss at its create, for as
/// long as the test likes.
pub(crate) struct Gated {
    pub(crate) sim: Arc<SimDriver>,
    gate: Mutex<GateState>,
    opened: Condvar,
}

#[derive(Default)]
pub(crate) struct GateState {
    armed: Option<DriverCall>,
    open: bool,
    started: Option<mpsc::Sender<()>>,
}

impl Gated {
    pub(crate) fn new(sim: SimConfig) -> Arc<Gated> {
        Arc::new(Gated {
            sim: Arc::new(SimDriver::new(sim)),
            gate: Mutex::new(GateState::default()),
            opened: Condvar::new(),
        })
    }

    /// Arms the gate for the next synchronize; the receiver hears when it started.
    pub(crate) fn arm(&self) -> mpsc::Receiver<()> {
        self.arm_for(DriverCall::Synchronize)
    }

    /// Arms the gate for the next call of kind `call`.
    pub(crate) fn arm_for(&self, call: DriverCall) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel();
        let mut g = self.gate.lock().unwrap();
        g.armed = Some(call);
        g.open = false;
        g.started = Some(tx);
        rx
    }

    pub(crate) fn open(&self) {
        self.gate.lock().unwrap().open = true;
        self.opened.notify_all();
    }
}

impl Driver for Gated {
    fn granularity(&self) -> Result<u64, DriverError> {
        self.sim.granularity()
    }
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
        self.hold(DriverCall::Create);
        self.sim.create(size)
    }
    fn release(&self, handle: PhysicalHandle) -> Result<(), DriverError> {
        self.sim.release(handle)
    }
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
        self.sim.reserve(size)
    }
    fn free_reservation(&self, reservation: Reservation) -> Result<(), DriverError> {
        self.sim.free_reservation(reservation)
    }
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DriverError> {
        self.sim.map(ptr, handle)
    }
    fn set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> Result<(), DriverError> {
        self.sim.set_access(ptr, size, devices)
    }
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> {
        self.sim.unmap(ptr, size)
    }
    fn synchronize(&self, device: i32) -> Result<(), DriverError> {
        self.hold(DriverCall::Synchronize);
        self.sim.synchronize(device)
    }
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.sim.mem_info()
    }
}

impl Gated {
    /// Waits at the gate if it is armed for `call`.
    fn hold(&self, call: DriverCall) {
        let mut g = self.gate.lock().unwrap();
        if g.armed == Some(call) {
            g.armed = None;
            if let Some(tx) = g.started.take() {
                let _ = tx.send(());
            }
            while !g.open {
                g = self.opened.wait(g).unwrap();
            }
        }
    }
}

pub(crate) fn sim_config(capacity: u64) -> SimConfig {
    SimConfig {
        capacity_bytes: capacity,
        ..SimConfig::default()
    }
}
