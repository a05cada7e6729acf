//! Recording (issue 17) when the file fails: an unwritable path or a full disk never
//! fails an allocation and is reported once, an empty record path is refused at
//! creation, and a file that takes no sync closes quietly.

use crate::common;

use crate::recording_replays::temp_path;
use common::MIB;
use flare_package::{Error, Pool, PoolConfig, SimConfig, SimDriver};
use std::path::PathBuf;
use std::sync::Arc;

/// A path in a directory that does not exist: the pool is created and allocates;
/// the error is kept (and printed once on stderr).
#[test]
fn unwritable_path_never_fails_an_allocation() {
    let path = temp_path("no-such-dir").join("x.trace");
    let (pool, _sim) = common::simulated_pool(
        SimConfig::default().capacity_bytes,
        PoolConfig {
            record_path: Some(path.clone()),
            ..PoolConfig::default()
        },
    );
    let e = pool.record_error().expect("the error is kept");
    assert!(e.contains("cannot create"), "{e}");
    for _ in 0..100 {
        let p = pool.allocate_raw(MIB).unwrap();
        pool.free_raw(p).unwrap();
    }
    pool.record_flush();
    assert_eq!(pool.record_error(), Some(e));
    assert!(!path.exists());
}

/// An empty path names no file (issue 34): a mistake refused at creation with
/// `InvalidArgument` by both constructors, as `flare_pool_create` refuses an empty
/// C string; unlike a file that cannot be created, which only stops the recording.
/// (Before the fix `Pool::new` made a pool whose recording had stopped at once.)
#[test]
fn an_empty_record_path_is_refused_at_creation() {
    let config = PoolConfig {
        record_path: Some(PathBuf::new()),
        ..PoolConfig::default()
    };
    match Pool::new(config.clone()) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("record_path is empty"), "{m}"),
        other => panic!("Pool::new: {other:?}"),
    }
    let sim = Arc::new(SimDriver::new(SimConfig::default()));
    match Pool::with_driver(config, sim.clone()) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("record_path is empty"), "{m}"),
        other => panic!("Pool::with_driver: {other:?}"),
    }
    // Nothing was made on the driver.
    let m = flare_package::Driver::mem_info(&*sim).unwrap();
    assert_eq!(m.free, m.total);
}

/// A full disk (`/dev/full`: every write fails with ENOSPC): allocations go on, the
/// first error is kept and recording stops.
#[cfg(target_os = "linux")]
#[test]
fn full_disk_stops_the_recording_and_nothing_else() {
    let (pool, _sim) = common::simulated_pool(
        SimConfig::default().capacity_bytes,
        PoolConfig {
            record_path: Some("/dev/full".into()),
            ..PoolConfig::default()
        },
    );
    assert_eq!(pool.record_error(), None, "/dev/full opens");
    pool.retention_begin().unwrap();
    // Enough lines to fill the buffer several times over.
    for _ in 0..40_000 {
        let p = pool.allocate_raw(MIB).unwrap();
        pool.free_raw(p).unwrap();
    }
    pool.retention_finish().unwrap();
    pool.record_flush();
    let e = pool.record_error().expect("the write error is kept");
    assert!(
        e.contains("No space left") || e.contains("os error 28"),
        "{e}"
    );
    let p = pool.allocate_raw(MIB).unwrap();
    pool.free_raw(p).unwrap();
}

/// A recording to a file that cannot be synced (`/dev/null`: `fdatasync` answers
/// EINVAL there, as for a pipe or any character device) closes quietly: EINVAL from
/// the final sync says the file takes no sync, not that a byte was lost, so nothing
/// is reported. That sync runs when the pool is dropped, after which only stderr
/// can show a report: the test runs itself in a child process (this one test, by
/// its exact name) and reads the child's stderr.
#[cfg(target_os = "linux")]
#[test]
fn a_recording_to_a_file_that_takes_no_sync_closes_quietly() {
    const CHILD: &str = "FLARE_TEST_RECORD_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let (pool, _sim) = common::simulated_pool(
            SimConfig::default().capacity_bytes,
            PoolConfig {
                record_path: Some("/dev/null".into()),
                ..PoolConfig::default()
            },
        );
        let p = pool.allocate_raw(MIB).unwrap();
        pool.free_raw(p).unwrap();
        pool.record_flush();
        assert_eq!(pool.record_error(), None, "/dev/null takes every write");
        drop(pool);
        return;
    }
    // The name as the harness knows it: the module path less the crate's name.
    let name = "a_recording_to_a_file_that_takes_no_sync_closes_quietly";
    let name = match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    };
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "the child ran the test: {stdout}"
    );
    assert!(
        !stderr.contains("recording to /dev/null stopped"),
        "{stderr}"
    );
}
