//! Lines a recording pool writes (`docs/trace-format.md`, "Recorded traces"): the
//! header's peer devices, lines reaching the file without a flush, a completion
//! recorded once, and no `oom` line left behind by an allocation that unwinds.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use common::hooked::hooked_pool;
use common::{hooked, simulated_pool, MIB};
use flare_package::{CuResult, DriverCall, Pool, PoolConfig, SimConfig, SimDriver};
use std::path::PathBuf;
use std::sync::Arc;

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A fresh path in the temporary directory for `name`.
fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flare-cover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir.join(name)
}

/// `record.rs` header (`docs/trace-format.md`, "Recorded traces"): the pool's
/// configuration is one `# flare-pool` line whose `peers=` lists the peer devices
/// comma-separated (`none` when there are none); `RecordedConfig` reads it back.
#[test]
fn recorded_header_lists_the_peer_devices() {
    let path = temp_path("peers.trace");
    let pool = Pool::new(PoolConfig {
        peer_devices: vec![2, 1],
        record_path: Some(path.clone()),
        ..PoolConfig::simulated(SimConfig {
            device_count: 3,
            ..SimConfig::default()
        })
    })
    .unwrap();
    let p = pool.allocate_raw(MIB).unwrap();
    pool.free_raw(p).unwrap();
    pool.record_flush();
    assert_eq!(pool.record_error(), None);
    let text = std::fs::read_to_string(&path).unwrap();
    let header = text
        .lines()
        .find(|l| l.starts_with("# flare-pool "))
        .expect("the configuration line");
    assert!(
        header.split(' ').any(|f| f == "peers=2,1"),
        "peers in the given order: {header}"
    );
    let t = flare_package::trace::parse(&path).expect("a valid trace");
    assert_eq!(t.recorded_config().unwrap().peers, vec![2, 1]);
    drop(pool);
    let _ = std::fs::remove_file(&path);
}

/// `record.rs` module documentation: "a writer thread takes the buffer when it
/// passes `FLUSH_AT` bytes ... or every `FLUSH_EVERY` [200 ms] otherwise, and writes
/// it to the file". So lines recorded and left alone (no `record_flush`, no drop,
/// far below `FLUSH_AT`) reach the file within a few periods.
#[test]
fn recorded_lines_reach_the_file_without_a_flush() {
    let path = temp_path("timer.trace");
    let (pool, _sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            record_path: Some(path.clone()),
            ..PoolConfig::default()
        },
    );
    let p = pool.allocate_raw(MIB).unwrap();
    pool.free_raw(p).unwrap();
    let want_a = format!("a {p:#x} {}", MIB);
    let want_f = format!("f {p:#x}");
    // Up to 5 s (25 periods) for a loaded machine; one period suffices.
    let mut text = String::new();
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        text = std::fs::read_to_string(&path).unwrap();
        if text.contains(&want_f) {
            break;
        }
    }
    assert!(text.starts_with("# flare-trace v1\n"), "{text:?}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.contains(&want_a.as_str()), "{text}");
    assert!(lines.contains(&want_f.as_str()), "{text}");
    assert_eq!(pool.record_error(), None);
    drop(pool);
    let _ = std::fs::remove_file(&path);
}

/// [`hooked_pool`] recording into `name` in this process's temporary directory:
/// (the recording's path, the pool, the hooked driver, the simulator).
fn recording_hooked_pool(
    name: &str,
) -> (
    std::path::PathBuf,
    Arc<Pool>,
    Arc<hooked::Hooked>,
    Arc<SimDriver>,
) {
    let dir = std::env::temp_dir().join(format!("flare-mutants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let (pool, driver, sim) = hooked_pool(PoolConfig {
        record_path: Some(path.clone()),
        ..PoolConfig::default()
    });
    (path, pool, driver, sim)
}

/// Recording (`docs/trace-format.md`): "`done STREAM MARK`: the pool saw STREAM's
/// work complete through its MARK-th mark ... a stream's `done` marks increase". Two
/// trims that wait on the same fence learn the same completion; it is written once,
/// and the recorded trace parses. A recording pool runs its calls one at a time
/// (`Pool::record_order`, issue 34), so the second trim, started on another thread
/// while the first waits on the fence outside the books' lock, waits for the first
/// (without the order lock, it ran then and learnt the completion too).
#[test]
fn a_completion_two_release_points_learn_is_recorded_once() {
    let (path, pool, driver, sim) = recording_hooked_pool("done-once.trace");
    let s = common::stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    // Idle on S, no fence yet (a free's poll fences only memory idle at the previous
    // poll).
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(pool.snapshot().events_outstanding, 0);
    let weak = Arc::downgrade(&pool);
    let second = Arc::new(std::sync::Mutex::new(None));
    let started = second.clone();
    driver.arm(DriverCall::EventSynchronize, None, move || {
        let other = weak.upgrade().expect("the pool");
        let t = std::thread::spawn(move || other.trim());
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!t.is_finished(), "the second trim ran during the first");
        *started.lock().unwrap() = Some(t);
    });
    pool.trim().unwrap();
    let t = second.lock().unwrap().take().expect("the hook ran");
    t.join().unwrap().expect("the second trim");
    let snap = pool.snapshot();
    assert_eq!((snap.physical_bytes, snap.events_outstanding), (0, 0));
    assert_eq!(pool.record_error(), None);
    drop(pool);
    let t = flare_package::trace::parse(&path).expect("the recorded trace parses");
    let done: Vec<_> = t
        .events()
        .iter()
        .filter(|e| matches!(e, flare_package::trace::Event::Done { .. }))
        .collect();
    assert_eq!(done.len(), 1, "{done:?}");
    let _ = std::fs::remove_file(&path);
}

/// Recording (`docs/trace-format.md`): "`oom N`: during the next `a` (or `x`)
/// line's allocation, the driver answered out-of-memory N times"; the counted
/// answers belong to one allocation call, and a call that ends without a line
/// leaves none behind (`Pool::record_call_start`: "out-of-memory answers counted by
/// an earlier call of this thread that failed are forgotten"). Here the driver
/// answers the first handle creation with out-of-memory (counted) and panics in the
/// retry's creation (a driver of the caller's, through `Pool::with_driver`): the
/// call unwinds with no `a` or `x` line written. The next allocation on the same
/// thread creates its mapping at the first try (the device is empty: no
/// out-of-memory), so its `a` line has no `oom` line before it, and the recording
/// has none at all. Carried over, `oom 1` would make a replay fail that
/// allocation's first creation.
#[test]
fn an_allocation_that_unwinds_leaves_no_oom_for_the_next_one() {
    let (path, pool, driver, _sim) = recording_hooked_pool("unwound-oom.trace");
    let again = Arc::downgrade(&driver);
    // The first creation answers out-of-memory; the retry's creation panics.
    driver.arm(
        DriverCall::Create,
        Some(CuResult::OUT_OF_MEMORY),
        move || {
            again
                .upgrade()
                .expect("the driver")
                .arm(DriverCall::Create, None, || {
                    panic!("a driver that panics in the retry (deliberate)")
                });
        },
    );
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.allocate_raw(G)));
    assert!(unwound.is_err(), "the retry's creation panicked");
    // The first answer was an out-of-memory: the pool released and retried once.
    assert_eq!(pool.snapshot().oom_retries, 1);
    let p = pool.allocate_raw(G).expect("an empty device serves 2 MiB");
    pool.free_raw(p).unwrap();
    assert_eq!(pool.record_error(), None);
    drop(pool);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(&format!("\na {p:#x} {G}\n")),
        "the allocation is recorded: {text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("oom ")),
        "no out-of-memory answer during the recorded allocation: {text}"
    );
    flare_package::trace::parse(&path).expect("the recorded trace parses");
    let _ = std::fs::remove_file(&path);
}
