//! Review of the stream-ordered API (issue 11), as a new user: each test is one
//! finding and FAILS on the reviewed commit (4c55246). Each expectation is quoted
//! from the README, the rustdoc or the issue, not taken from the code's output.
//! Run: `cargo test --release --test review_streams`.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use common::{check, no_faults, stream, MIB};
use flare_package::driver::sim::CaptureMode;
use flare_package::{
    CrossStreamReuse, CuResult, Pool, PoolConfig, ReusePolicy, SimConfig, SimDriver,
};
use std::sync::Arc;

const G: u64 = 2 * MIB;

fn sim_pool(cross: CrossStreamReuse, threshold: u64, capacity: u64) -> (Pool, Arc<SimDriver>) {
    let config = PoolConfig {
        cross_stream_reuse: cross,
        release_threshold_bytes: threshold,
        ..PoolConfig::default()
    };
    common::simulated_pool(capacity, config)
}

/// A simulated driver whose next call of one kind can be held at a gate, to stop a
/// release half-way (outside the pool's lock) while the test acts on another thread.
mod gate {
    use flare_package::driver::{CaptureMode, Event, MemInfo, PhysicalHandle, Reservation};
    use flare_package::{DevicePtr, Driver, DriverError, SimDriver, Stream};
    use std::sync::mpsc;
    use std::sync::{Arc, Condvar, Mutex};

    #[derive(Clone, Copy, PartialEq, Eq)]
    pub enum Call {
        EventSynchronize,
        FreeReservation,
    }

    #[derive(Default)]
    struct State {
        armed: Option<Call>,
        open: bool,
        started: Option<mpsc::Sender<()>>,
    }

    pub struct Gated {
        pub sim: Arc<SimDriver>,
        state: Mutex<State>,
        opened: Condvar,
    }

    impl Gated {
        pub fn new(sim: Arc<SimDriver>) -> Arc<Gated> {
            Arc::new(Gated {
                sim,
                state: Mutex::new(State::default()),
                opened: Condvar::new(),
            })
        }
        /// Holds the next `call`; the receiver hears when it is held.
        pub fn arm(&self, call: Call) -> mpsc::Receiver<()> {
            let (tx, rx) = mpsc::channel();
            *self.state.lock().unwrap() = State {
                armed: Some(call),
                open: false,
                started: Some(tx),
            };
            rx
        }
        pub fn open(&self) {
            self.state.lock().unwrap().open = true;
            self.opened.notify_all();
        }
        fn hold(&self, call: Call) {
            let mut g = self.state.lock().unwrap();
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

    impl Driver for Gated {
        fn granularity(&self) -> Result<u64, DriverError> {
            self.sim.granularity()
        }
        fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
            self.sim.create(size)
        }
        fn release(&self, h: PhysicalHandle) -> Result<(), DriverError> {
            self.sim.release(h)
        }
        fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
            self.sim.reserve(size)
        }
        fn free_reservation(&self, r: Reservation) -> Result<(), DriverError> {
            self.hold(Call::FreeReservation);
            self.sim.free_reservation(r)
        }
        fn map(&self, ptr: DevicePtr, h: PhysicalHandle) -> Result<(), DriverError> {
            self.sim.map(ptr, h)
        }
        fn set_access(&self, ptr: DevicePtr, size: u64, d: &[i32]) -> Result<(), DriverError> {
            self.sim.set_access(ptr, size, d)
        }
        fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> {
            self.sim.unmap(ptr, size)
        }
        fn synchronize(&self, device: i32) -> Result<(), DriverError> {
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
            Driver::event_record(&*self.sim, e, s)
        }
        fn event_query(&self, e: Event) -> Result<bool, DriverError> {
            Driver::event_query(&*self.sim, e)
        }
        fn event_synchronize(&self, e: Event) -> Result<(), DriverError> {
            self.hold(Call::EventSynchronize);
            Driver::event_synchronize(&*self.sim, e)
        }
        fn stream_wait_event(&self, s: Stream, e: Event) -> Result<(), DriverError> {
            Driver::stream_wait_event(&*self.sim, s, e)
        }
        fn stream_capture(&self, s: Stream) -> Result<Option<u64>, DriverError> {
            self.sim.stream_capture(s)
        }
        fn exchange_capture_mode(&self, m: CaptureMode) -> Result<CaptureMode, DriverError> {
            self.sim.exchange_capture_mode(m)
        }
        fn stream_create_blocking(&self) -> Result<Stream, DriverError> {
            self.sim.stream_create_blocking()
        }
        fn stream_destroy(&self, s: Stream) -> Result<(), DriverError> {
            Driver::stream_destroy(&*self.sim, s)
        }
        fn note_handoff(&self, s: Stream, ptr: DevicePtr, size: u64) {
            Driver::note_handoff(&*self.sim, s, ptr, size)
        }
    }
}

/// A gated pool on a simulated device of `capacity` bytes.
fn gated_pool(capacity: u64, threshold: u64) -> (Pool, Arc<SimDriver>, Arc<gate::Gated>) {
    let config = SimConfig {
        capacity_bytes: capacity,
        ..SimConfig::default()
    };
    let sim = Arc::new(SimDriver::new(config));
    let gated = gate::Gated::new(sim.clone());
    let pool = Pool::with_driver(
        PoolConfig {
            release_threshold_bytes: threshold,
            ..PoolConfig::simulated(config)
        },
        gated.clone(),
    )
    .unwrap();
    (pool, sim, gated)
}

/// Which release point races `retention_begin`.
#[derive(Clone, Copy, Debug)]
enum Releaser {
    Finish,
    Trim,
}

/// The release point runs on another thread and is held while it waits on a fence
/// (`cuEventSynchronize`, outside the lock); meanwhile this thread opens a scope and
/// begins a capture, as `Pool::retention_begin` invites.
fn begin_races(releaser: Releaser) {
    let (pool, sim, gated) = gated_pool(140 << 30, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    if let Releaser::Finish = releaser {
        pool.retention_begin().unwrap();
    }
    // Stream memory with a kernel queued (the release waits on its fence) and memory
    // of the synchronous free (its release synchronizes the device).
    let p = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(sim.launch(s.0, p, G), CuResult::SUCCESS);
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_raw(G).unwrap();
    pool.free_raw(q).unwrap();
    let held = gated.arm(gate::Call::EventSynchronize);
    let (begun_tx, begun_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let ended = std::thread::scope(|sc| {
        let releasing = sc.spawn(|| match releaser {
            Releaser::Finish => pool.retention_finish(),
            Releaser::Trim => pool.trim(),
        });
        held.recv().unwrap();
        // The releaser is waiting on S's fence. By the barrier, this begin must wait
        // for its release (a correct pool makes it block until the gate opens).
        let (pool, sim) = (&pool, &sim);
        let beginner = sc.spawn(move || {
            pool.retention_begin().unwrap();
            let r = sim.stream_begin_capture(t.0, CaptureMode::Global);
            let _ = begun_tx.send(());
            done_rx.recv().unwrap();
            (r, sim.stream_end_capture(t.0))
        });
        let early = begun_rx
            .recv_timeout(std::time::Duration::from_millis(500))
            .is_ok();
        gated.open();
        let _ = releasing.join().unwrap();
        done_tx.send(()).unwrap();
        let (begun, ended) = beginner.join().unwrap();
        assert_eq!(begun, CuResult::SUCCESS);
        eprintln!("{releaser:?}: begin returned while the release was held: {early}");
        ended
    });
    check_allowing_faults(&pool, &sim);
    assert_eq!(
        ended,
        CuResult::SUCCESS,
        "{releaser:?}: the capture begun inside the new scope was invalidated: {:?}",
        sim.faults()
    );
    no_faults(&sim);
}

/// The snapshot invariants and the books against the driver, without `check`'s
/// no-fault assertion (the test asserts the fault itself, with a message).
fn check_allowing_faults(pool: &Pool, sim: &SimDriver) -> flare_package::Snapshot {
    let s = pool.snapshot();
    s.check_invariants().unwrap();
    let d = sim.state();
    assert_eq!(s.physical_bytes, d.physical_bytes);
    s
}

/// FINDING 1 (the failing loom model `begin_races_finish` of `scripts/test.sh`, made
/// deterministic). `Pool::retention_begin`: "The scope is a barrier: when this
/// returns, no release step that began before it (a free outside a scope, `finish`,
/// `trim`, the out-of-memory release) is still running (this call waits for them;
/// their synchronize would break a capture begun after it ...), and none starts while
/// the scope is open." Since stream order, `close_scope` unlocks before `release_now`
/// collects its batch (and `release_now` waits on fences between two lock sections),
/// so begin returns at once and the finish's `cuCtxSynchronize` then invalidates the
/// capture begun in the new scope.
#[test]
fn scope_begin_waits_for_a_finish_that_waits_on_a_fence() {
    begin_races(Releaser::Finish);
}

/// FINDING 1, the same through `trim` (which checks `scope_open`, unlocks, then runs
/// `release_now`, which never looks at `scope_open` again).
#[test]
fn scope_begin_waits_for_a_trim_that_waits_on_a_fence() {
    begin_races(Releaser::Trim);
}

/// FINDING 2 (resolved as a documented contract). Freeing on a stream and then
/// destroying the stream: the pool records fences lazily, so it passes the stream to
/// the driver after the free. `free_async_raw`'s documentation now says to trim
/// before destroying such a stream. Done so, the memory is released, the pool never
/// touches the destroyed stream again, and another stream allocates.
#[test]
fn memory_freed_on_a_destroyed_stream_serves_another_stream() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, G);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    pool.trim().unwrap();
    assert_eq!(sim.stream_destroy(s.0), CuResult::SUCCESS);
    let q = pool.allocate_async_raw(G, t).unwrap();
    pool.free_async_raw(q, t).unwrap();
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.stream_call_failures, snap.physical_bytes), (0, 0));
    no_faults(&sim);
}

/// The misuse (destroyed first), on the simulated driver, where a destroyed handle
/// is refused with `CUDA_ERROR_INVALID_HANDLE`: the memory is held, named by the
/// out-of-memory error, and released by trim.
#[test]
fn memory_freed_on_a_stream_destroyed_first_is_held_until_trim() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, G);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(sim.stream_destroy(s.0), CuResult::SUCCESS);
    match pool.allocate_async_raw(G, t) {
        Err(flare_package::Error::OutOfMemory { idle, live, .. }) => {
            assert_eq!((idle, live), (G, 0))
        }
        other => panic!("expected an out-of-memory naming the held memory: {other:?}"),
    }
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, 0, "{snap:#?}");
    assert!(snap.stream_call_failures >= 1, "{snap:#?}");
    assert!(pool.allocate_async_raw(G, t).is_ok());
    no_faults(&sim);
}

/// FINDING 3. A graph was captured earlier on S (allocating and freeing inside the
/// capture with no scope, as the README allows); now a capture is open on T, and
/// another thread trims. `trim` releases the earlier capture's memory after a
/// `cuCtxSynchronize`, which invalidates T's capture, although T's capture has
/// nothing to do with that memory and the pool knows a capture may be open (it
/// skips device synchronizes for a capturing stream's own bucket). README: "Event
/// queries run with the thread in relaxed capture mode, so a CUDA graph captured on
/// any stream stays valid"; issue: "cuCtxSynchronize and legacy-stream events are
/// never used on these paths"; `tests/pool_streams.rs`
/// `event_polls_elsewhere_leave_a_global_capture_valid` asserts exactly this for a
/// trim on another thread, but only when no capture memory is held.
#[test]
fn trim_on_another_thread_leaves_an_open_capture_valid() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, 140 << 30);
    let (s, t) = (stream(&sim), stream(&sim));
    // T is one of the pool's streams (it allocated before): the pool checks every
    // stream it has seen for an open capture before a release that would
    // synchronize the device. A capture on a stream the pool never saw is the
    // caller's to keep clear of trim and finish (documented on `Pool::trim`).
    let warm = pool.allocate_async_raw(G, t).unwrap();
    pool.free_async_raw(warm, t).unwrap();
    sim.stream_begin_capture(s.0, CaptureMode::Global);
    let a = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(a, s).unwrap();
    assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    assert_eq!(check(&pool).capture_held_bytes, G);
    assert_eq!(
        sim.stream_begin_capture(t.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    let trimmed = std::thread::scope(|sc| sc.spawn(|| pool.trim()).join().unwrap());
    assert_eq!(
        sim.stream_end_capture(t.0),
        CuResult::SUCCESS,
        "trim ({trimmed:?}) invalidated a capture open elsewhere: {:?}",
        sim.faults()
    );
    assert_eq!(
        check(&pool).capture_held_bytes,
        G,
        "kept: releasing it needs a synchronize"
    );
    pool.trim().unwrap();
    assert_eq!(
        check(&pool).capture_held_bytes,
        0,
        "released once no capture is open"
    );
    no_faults(&sim);
}

/// FINDING 4a (resolved: capture memory). `record_stream(p, T)` while T is being
/// captured (a tensor used by the graph being captured), then the stream-ordered free
/// on S: the graph may replay into p, so p is that capture's memory: kept after the
/// capture (counted in `capture_held_bytes`, not handed to anyone) until trim, as
/// for memory freed during a capture; then it serves again. (The finding: it went to
/// a bucket only a device synchronize released, outside the capture contract.)
#[test]
fn memory_recorded_on_a_capturing_stream_is_reusable_after_the_capture() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, G);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(
        sim.stream_begin_capture(t.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    pool.record_stream(p, t).unwrap();
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(sim.stream_end_capture(t.0), CuResult::SUCCESS);
    assert!(sim.queued_work().is_empty());
    let snap = check(&pool);
    assert_eq!((snap.capture_held_bytes, snap.captures_seen), (G, 1));
    assert!(pool.allocate_async_raw(G, s).is_err(), "kept for the graph");
    pool.trim().unwrap();
    let q = pool.allocate_async_raw(G, s);
    assert!(q.is_ok(), "after trim: {q:?}");
    no_faults(&sim);
}

/// FINDING 4b. The same held memory, with T's capture still open: a trim releases it
/// after a `cuCtxSynchronize`, which invalidates T's capture (the same
/// root as finding 3: the release engine's "a stream being captured now: a device
/// synchronize would invalidate its capture" check looks only at the idle memory of
/// stream buckets, not at memory held for a capturing stream or capture).
#[test]
fn trim_leaves_a_capture_valid_after_record_stream_on_it() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, 140 << 30);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(
        sim.stream_begin_capture(t.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    pool.record_stream(p, t).unwrap();
    pool.free_async_raw(p, s).unwrap();
    let trimmed = pool.trim();
    assert_eq!(
        sim.stream_end_capture(t.0),
        CuResult::SUCCESS,
        "trim ({trimmed:?}) invalidated T's capture: {:?}",
        sim.faults()
    );
    no_faults(&sim);
}

/// FINDING 5. `CrossStreamReuse::Wait` ignores `ReusePolicy::Exact`: T takes a 24
/// MiB mapping freed on S for a 20 MiB request (`take_with_wait` uses best fit
/// whatever the policy). README: "`exact` | the mapping has exactly the request's
/// size, rounded up to the granularity". With `WhenComplete` the same request is
/// (correctly) not served from it.
#[test]
fn wait_mode_respects_the_exact_policy() {
    let pool = Pool::new(PoolConfig {
        cross_stream_reuse: CrossStreamReuse::Wait,
        reuse_policy: ReusePolicy::Exact,
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::simulated(SimConfig::default())
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap();
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(12 * G, s).unwrap();
    pool.free_async_raw(p, s).unwrap();
    let q = pool.allocate_async_raw(10 * G, t).unwrap();
    let snap = check(&pool);
    assert_ne!(
        q, p,
        "exact policy: a {} MiB mapping served a {} MiB request (reuse hits {}, exact {})",
        24, 20, snap.reuse_hits, snap.reuse_exact_hits
    );
}

/// FINDING 6. README: "memory freed in a capture is reused only by that capture and
/// kept for its graph until the scope open at capture time finishes, or, with none,
/// until trim or destroy". Here no scope is open when the capture begins; a scope
/// opened afterwards (during the capture) takes the capture's memory with it at its
/// finish: the pool stamps a capture with the scope open when it first *sees* the
/// capture, not the one open at capture time. The graph then replays into memory
/// that was unmapped.
#[test]
fn capture_memory_outlives_a_scope_opened_after_the_capture_began() {
    let (pool, sim) = sim_pool(CrossStreamReuse::WhenComplete, 0, 140 << 30);
    let s = stream(&sim);
    // S is one of the pool's streams before the capture (a scope's begin asks each
    // stream it has seen which capture is open; a capture on a stream the pool never
    // saw, first met inside the scope, is taken as the scope's: documented on
    // `Pool::retention_begin`).
    let warm = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(warm, s).unwrap();
    assert_eq!(
        sim.stream_begin_capture(s.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    let scope = pool.retention_scope().unwrap();
    let a = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(a, s).unwrap();
    assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    scope.finish().unwrap();
    let snap = check(&pool);
    assert_eq!(
        snap.capture_held_bytes, G,
        "the graph's memory was released by a scope that opened after its capture began"
    );
    no_faults(&sim);
}
