//! Regression tests for the faults found by review (issue 9): the retention scope as
//! a barrier against releases already running, an idle mapping that serves a request
//! before any out-of-memory, and releases that wait for every device with access.
//! Each expected value follows from the driver's behaviour (`docs/vmm-semantics.md`)
//! or the pool's contract, not from the code's output.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use common::{check, GIB, MIB};
use flare_package::driver::{MemInfo, PhysicalHandle, Reservation};
use flare_package::{
    Backend, CuResult, DevicePtr, Driver, DriverCall, DriverError, Error, Pool, PoolConfig,
    ReusePolicy, SimConfig, SimDriver,
};

/// A simulated driver whose synchronize (or create) can be held: once armed, the
/// next such call tells the test it has started and then waits until the test opens
/// the gate, before it reaches the simulated driver. That holds a release mid-way
/// (between the pool's unlock and its synchronize), or a miss at its create, for as
/// long as the test likes.
struct Gated {
    sim: Arc<SimDriver>,
    gate: Mutex<GateState>,
    opened: Condvar,
}

#[derive(Default)]
struct GateState {
    armed: Option<DriverCall>,
    open: bool,
    started: Option<mpsc::Sender<()>>,
}

impl Gated {
    fn new(sim: SimConfig) -> Arc<Gated> {
        Arc::new(Gated {
            sim: Arc::new(SimDriver::new(sim)),
            gate: Mutex::new(GateState::default()),
            opened: Condvar::new(),
        })
    }

    /// Arms the gate for the next synchronize; the receiver hears when it started.
    fn arm(&self) -> mpsc::Receiver<()> {
        self.arm_for(DriverCall::Synchronize)
    }

    /// Arms the gate for the next call of kind `call`.
    fn arm_for(&self, call: DriverCall) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel();
        let mut g = self.gate.lock().unwrap();
        g.armed = Some(call);
        g.open = false;
        g.started = Some(tx);
        rx
    }

    fn open(&self) {
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

fn sim_config(capacity: u64) -> SimConfig {
    SimConfig {
        capacity_bytes: capacity,
        ..SimConfig::default()
    }
}

/// How the release that is held mid-way was started.
#[derive(Clone, Copy, Debug)]
enum Release {
    /// A free outside a scope, release threshold 0.
    Free,
    /// `retention_finish` of a scope retaining one idle mapping.
    Finish,
    /// `trim` with one idle mapping cached.
    Trim,
    /// An out-of-memory outside a scope: the idle mapping is released to retry.
    OutOfMemory,
}

/// Holds a release of one 2 MiB mapping at its synchronize, then, from another
/// thread, opens a retention scope and begins a capture right after `begin`
/// returns. The scope is a barrier: `begin` returns only once the held release is
/// booked (so one mapping is released by then, counted before the capture starts),
/// and the capture stays valid because the release's synchronize ran before it.
fn begin_waits_for(release: Release) {
    let gated = Gated::new(sim_config(4 * MIB));
    let threshold = match release {
        Release::Free => 0,
        _ => u64::MAX,
    };
    let config = PoolConfig {
        reuse_policy: ReusePolicy::Exact,
        release_threshold_bytes: threshold,
        ..PoolConfig::default()
    };
    let pool = Arc::new(Pool::with_driver(config, gated.clone()).unwrap());
    if let Release::Finish = release {
        pool.retention_begin().unwrap();
    }
    let p = pool.allocate_raw(2 * MIB).unwrap();
    if !matches!(release, Release::Free) {
        // Retained (scope) or cached (threshold): idle, nothing released yet.
        pool.free_raw(p).unwrap();
        assert_eq!(pool.snapshot().idle_bytes, 2 * MIB);
    }
    let started = gated.arm();
    let releaser = {
        let pool = pool.clone();
        thread::spawn(move || match release {
            Release::Free => pool.free_raw(p).map(|_| ()),
            Release::Finish => pool.retention_finish(),
            Release::Trim => pool.trim(),
            // 4 MiB on a 4 MiB device holding 2 MiB idle: the create fails, the idle
            // 2 MiB cannot serve it, so it is released and the create retried.
            Release::OutOfMemory => pool.allocate_raw(4 * MIB).map(|_| ()),
        })
    };
    started
        .recv_timeout(Duration::from_secs(10))
        .expect("the release reached its synchronize");
    let (began_tx, began_rx) = mpsc::channel();
    let opener = {
        let pool = pool.clone();
        let sim = gated.sim.clone();
        thread::spawn(move || {
            pool.retention_begin().unwrap();
            // What the books say the moment begin returns, before anything else.
            let released = pool.snapshot().mappings_released;
            assert_eq!(sim.begin_capture(), CuResult::SUCCESS);
            let _ = began_tx.send(());
            released
        })
    };
    // Give begin every chance to return early (it must not): a broken barrier
    // returns at once and begins the capture while the release is held.
    let early = began_rx.recv_timeout(Duration::from_millis(300)).is_ok();
    gated.open();
    releaser.join().unwrap().unwrap();
    let released_at_begin = opener.join().unwrap();
    let capture = gated.sim.end_capture();
    assert!(
        !early,
        "{release:?}: begin returned while a release was still running"
    );
    assert_eq!(
        released_at_begin, 1,
        "{release:?}: the release running before begin is booked when begin returns"
    );
    assert_eq!(
        capture,
        CuResult::SUCCESS,
        "{release:?}: the release's synchronize invalidated a capture begun after begin"
    );
    let s = pool.snapshot();
    assert_eq!(s.sync_failures, 0);
    assert!(s.scope_open);
    assert!(gated.sim.faults().is_empty());
    pool.retention_finish().unwrap();
}

#[test]
fn scope_begin_waits_for_a_releasing_free() {
    begin_waits_for(Release::Free);
}

#[test]
fn scope_begin_waits_for_finish() {
    begin_waits_for(Release::Finish);
}

#[test]
fn scope_begin_waits_for_trim() {
    begin_waits_for(Release::Trim);
}

#[test]
fn scope_begin_waits_for_the_out_of_memory_release() {
    begin_waits_for(Release::OutOfMemory);
}

/// While a scope is open no release starts: frees retain, trim refuses, and the
/// simulated driver sees no synchronize at all while a capture is open.
#[test]
fn nothing_is_released_while_the_scope_is_open() {
    let pool = Pool::new(PoolConfig::default()).unwrap();
    let sim = pool.sim_driver().unwrap().clone();
    pool.retention_begin().unwrap();
    assert_eq!(sim.begin_capture(), CuResult::SUCCESS);
    let syncs = sim.call_count(DriverCall::Synchronize);
    for _ in 0..4 {
        let a = pool.allocate_raw(6 * MIB).unwrap();
        let b = pool.allocate_raw(2 * MIB).unwrap();
        pool.free_raw(a).unwrap();
        pool.free_raw(b).unwrap();
    }
    assert!(matches!(pool.trim(), Err(Error::ScopeState(_))));
    assert_eq!(sim.call_count(DriverCall::Synchronize), syncs);
    assert_eq!(sim.end_capture(), CuResult::SUCCESS);
    assert_eq!(pool.snapshot().mappings_released, 0);
    pool.retention_finish().unwrap();
    assert_eq!(pool.snapshot().mappings_released, 2);
}

fn sim_pool(capacity: u64, policy: ReusePolicy, threshold: u64) -> Pool {
    Pool::new(PoolConfig {
        backend: Backend::Simulated(sim_config(capacity)),
        reuse_policy: policy,
        release_threshold_bytes: threshold,
        ..PoolConfig::default()
    })
    .unwrap()
}

/// Inside a scope, a 4 MiB device with 4 MiB retained idle serves a 2 MiB request
/// from that mapping: creating 2 MiB more cannot fit (4 + 2 > 4), and the idle
/// mapping is the only memory there is. The exact policy and best-fit's 30% bound
/// (2 MiB * 1.3 < 4 MiB) would both pass it by; before issue 9 the request failed
/// with "0 B live, 4.0 MiB retained idle".
#[test]
fn a_full_device_reuses_a_larger_idle_mapping_inside_a_scope() {
    for policy in [ReusePolicy::Exact, ReusePolicy::BestFit] {
        let pool = sim_pool(4 * MIB, policy, 0);
        pool.retention_begin().unwrap();
        let x = pool.allocate_raw(4 * MIB).unwrap();
        pool.free_raw(x).unwrap();
        let y = pool
            .allocate_raw(2 * MIB)
            .unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        assert_eq!(y, x, "{policy:?}: the idle mapping is the one reused");
        let s = check(&pool);
        assert_eq!(s.reuse_hits, 1);
        assert_eq!(s.reuse_forced_hits, 1);
        assert_eq!(s.reuse_exact_hits, 0);
        assert_eq!(s.mappings_created, 1);
        assert_eq!(s.peak_physical_bytes, 4 * MIB);
        assert_eq!(s.live_mapped_bytes, 4 * MIB);
        assert_eq!(s.live_requested_bytes, 2 * MIB);
        assert_eq!(s.create_failures, 1, "{policy:?}: one create was refused");
        pool.free_raw(y).unwrap();
        pool.retention_finish().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0);
    }
}

/// The second case: a 10 GiB device, 8 GiB retained idle, a 3 GiB request.
/// 8 + 3 > 10, so nothing new fits; the 8 GiB mapping serves.
#[test]
fn ten_gib_device_eight_idle_three_requested() {
    for policy in [ReusePolicy::Exact, ReusePolicy::BestFit] {
        let pool = sim_pool(10 * GIB, policy, 0);
        pool.retention_begin().unwrap();
        let x = pool.allocate_raw(8 * GIB).unwrap();
        pool.free_raw(x).unwrap();
        assert_eq!(pool.allocate_raw(3 * GIB).unwrap(), x, "{policy:?}");
        let s = check(&pool);
        assert_eq!((s.reuse_hits, s.reuse_forced_hits), (1, 1));
        assert_eq!(s.physical_bytes, 8 * GIB);
    }
}

/// The smallest idle mapping that fits is the one forced, not merely any: with 4 and
/// 8 MiB idle on a full 12 MiB device under the exact policy, 2 MiB takes the 4 MiB
/// mapping, 6 MiB the 8 MiB one, and a third request, which nothing idle can serve,
/// fails.
#[test]
fn the_forced_mapping_is_the_smallest_that_fits() {
    let pool = sim_pool(12 * MIB, ReusePolicy::Exact, 0);
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    let b = pool.allocate_raw(8 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    // 2 MiB: exact finds no 2 MiB mapping, the device is full (12 of 12): the
    // smallest that fits is the 4 MiB one.
    assert_eq!(pool.allocate_raw(2 * MIB).unwrap(), a);
    // 6 MiB: exact finds none, full: only the 8 MiB one fits.
    assert_eq!(pool.allocate_raw(6 * MIB).unwrap(), b);
    // 2 MiB more: nothing idle, nothing fits: out of memory inside the scope.
    match pool.allocate_raw(2 * MIB) {
        Err(Error::OutOfMemory { in_scope: true, .. }) => {}
        other => panic!("expected out of memory in the scope, got {other:?}"),
    }
    let s = check(&pool);
    assert_eq!((s.reuse_hits, s.reuse_forced_hits), (2, 2));
}

/// Outside a scope the forced reuse comes before releasing anything: a 4 MiB device
/// caching 4 MiB idle (threshold above it) serves 2 MiB from the cache with no
/// synchronize and no release. The no-reuse policy does not reuse: it releases the
/// idle mapping and creates a new one.
#[test]
fn outside_a_scope_forced_reuse_comes_before_any_release() {
    let pool = sim_pool(4 * MIB, ReusePolicy::BestFit, u64::MAX);
    let sim = pool.sim_driver().unwrap().clone();
    let x = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(x).unwrap();
    assert_eq!(pool.allocate_raw(2 * MIB).unwrap(), x);
    let s = check(&pool);
    assert_eq!((s.reuse_hits, s.reuse_forced_hits), (1, 1));
    assert_eq!(s.mappings_released, 0);
    assert_eq!(s.oom_retries, 0, "nothing was released to retry");
    assert_eq!(sim.call_count(DriverCall::Synchronize), 0);

    let pool = sim_pool(4 * MIB, ReusePolicy::None, u64::MAX);
    let x = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(x).unwrap();
    pool.allocate_raw(2 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.reuse_hits, s.reuse_forced_hits), (0, 0));
    assert_eq!((s.mappings_created, s.mappings_released), (2, 1));
    assert_eq!(s.oom_retries, 1);
}

/// A pool on device 0 of a simulated two-device machine, granting device 1 access.
fn peer_pool() -> (Pool, Arc<SimDriver>) {
    let pool = Pool::new(PoolConfig {
        backend: Backend::Simulated(SimConfig {
            device_count: 2,
            ..SimConfig::default()
        }),
        peer_devices: vec![1],
        ..PoolConfig::default()
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap();
    (pool, sim)
}

/// With a peer, a release waits for both devices: a kernel on device 1 reading a
/// device-0 pool's buffer is cleared only by device 1's synchronize
/// (`cuCtxSynchronize` waits for its own context's work), so a pool that
/// synchronized only device 0 would unmap under it, which the simulated driver
/// records as a fault.
#[test]
fn a_release_synchronizes_every_device_with_access() {
    let (pool, sim) = peer_pool();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    assert_eq!(sim.touch(p, 2 * MIB, 1), CuResult::SUCCESS);
    sim.mark_busy_on(1, p, 2 * MIB);
    pool.free_raw(p).unwrap();
    assert!(sim.faults().is_empty(), "faults: {:?}", sim.faults());
    assert!(sim.busy_ranges().is_empty());
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        2,
        "devices 0 and 1"
    );
    let s = check(&pool);
    assert_eq!(s.mappings_released, 1);
    assert_eq!(s.sync_failures, 0);
}

/// A failed synchronize of the peer keeps the mapping whole (idle, retried later):
/// nothing is unmapped while the peer may still be reading it.
#[test]
fn a_failed_peer_synchronize_keeps_the_mapping() {
    let (pool, sim) = peer_pool();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    sim.mark_busy_on(1, p, 2 * MIB);
    // The pool synchronizes device 0, then device 1: fail the second.
    sim.inject_failure(DriverCall::Synchronize, 2, CuResult::LAUNCH_FAILED);
    pool.free_raw(p).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.idle_count, s.mappings_released, s.sync_failures),
        (1, 0, 1)
    );
    assert_eq!(sim.call_count(DriverCall::Unmap), 0);
    assert!(sim.faults().is_empty());
    pool.trim().unwrap();
    assert_eq!(check(&pool).mappings_released, 1);
    assert!(sim.faults().is_empty());
}

/// A forced reuse that finds a mapping of exactly the rounded size counts it as an
/// exact hit too (`reuse_exact_hits` counts hits whose mapping had exactly the
/// rounded size, however they were found). Single-threaded that cannot happen (the
/// policy would have taken it), so a race makes it: a miss is held at its create
/// while another thread frees a mapping of the same size; the create then finds the
/// device full and the forced reuse takes that mapping.
#[test]
fn a_forced_reuse_of_the_exact_size_is_an_exact_hit() {
    let gated = Gated::new(sim_config(4 * MIB));
    let config = PoolConfig {
        reuse_policy: ReusePolicy::Exact,
        ..PoolConfig::default()
    };
    let pool = Arc::new(Pool::with_driver(config, gated.clone()).unwrap());
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(2 * MIB).unwrap();
    let b = pool.allocate_raw(2 * MIB).unwrap();
    // The device is full (4 of 4 MiB live): a third 2 MiB request misses, and its
    // create is held.
    let started = gated.arm_for(DriverCall::Create);
    let miss = {
        let pool = pool.clone();
        thread::spawn(move || pool.allocate_raw(2 * MIB))
    };
    started
        .recv_timeout(Duration::from_secs(10))
        .expect("the miss reached its create");
    // Meanwhile `b` is freed: retained idle, exactly 2 MiB.
    pool.free_raw(b).unwrap();
    gated.open();
    let c = miss.join().unwrap().unwrap();
    assert_eq!(c, b, "the freed mapping serves the held miss");
    let s = pool.snapshot();
    assert_eq!(
        (s.reuse_hits, s.reuse_forced_hits, s.reuse_exact_hits),
        (1, 1, 1)
    );
    assert_eq!((s.create_failures, s.mappings_created), (1, 2));
    pool.free_raw(a).unwrap();
    pool.free_raw(c).unwrap();
    pool.retention_finish().unwrap();
}
