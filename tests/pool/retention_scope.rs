//! The retention scope: `retention_begin` is a barrier against the releases already
//! running (a free outside a scope, `retention_finish`, `trim`, the out-of-memory
//! release), nothing is released while a scope is open, and `abort` returns the
//! errors of its release.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::gated::{sim_config, Gated};
use common::hooked::hooked_pool;
use common::{assert_driver_empty, check, simulated_pool, MIB};
use flare_package::{CuResult, DriverCall, DriverError, Error, Pool, PoolConfig, ReusePolicy};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A code no memory call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

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

/// `Pool::retention_begin` is the scope barrier (`docs/ARCHITECTURE.md`): "when
/// begin returns, no release that began before it ... is still running, because
/// begin waits for the batches already collected (a count of running batches under
/// the lock, and a condition variable)". A begin made on another thread while a trim
/// is inside its device synchronize waits (it has opened the scope: `scope_open`);
/// the trim's end lets it through at once, not some later release.
#[test]
fn a_scope_begun_during_a_trim_opens_when_the_trim_ends() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};
    let (pool, driver, sim) = hooked_pool(PoolConfig {
        // The free caches its memory, for the trim to release.
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::default()
    });
    let p = pool.allocate_raw(G).unwrap();
    pool.free_raw(p).unwrap();
    assert_eq!(pool.snapshot().idle_bytes, G);
    let (tx, rx) = mpsc::channel();
    // Set by the begin's thread when the begin returns.
    let returned = Arc::new(AtomicBool::new(false));
    // Whether it had returned while the trim was still in its synchronize.
    let early = Arc::new(AtomicBool::new(false));
    let weak = Arc::downgrade(&pool);
    let (ret, ret_seen, seen) = (returned.clone(), returned.clone(), early.clone());
    driver.arm(DriverCall::Synchronize, None, move || {
        let pool = weak.upgrade().expect("the pool");
        let begin = pool.clone();
        std::thread::spawn(move || {
            let r = begin.retention_begin();
            ret.store(true, Ordering::SeqCst);
            let _ = tx.send(r);
        });
        // The begin sets `scope_open` and waits under one hold of the lock: once a
        // snapshot (which takes the lock) shows the scope open, it is waiting.
        let start = Instant::now();
        while !pool.snapshot().scope_open {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the begin never ran"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        seen.store(ret_seen.load(Ordering::SeqCst), Ordering::SeqCst);
    });
    pool.trim().unwrap();
    assert!(
        !early.load(Ordering::SeqCst),
        "the begin returned during the trim"
    );
    let begun = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the begin returns once the trim is done");
    assert!(begun.is_ok(), "{begun:?}");
    assert!(returned.load(Ordering::SeqCst));
    let s = pool.snapshot();
    assert!(s.scope_open);
    assert_eq!(
        (s.physical_bytes, s.idle_bytes),
        (0, 0),
        "the trim released it"
    );
    pool.retention_finish().unwrap();
    assert_eq!(sim.state().physical_bytes, 0);
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

/// `RetentionScope::abort`: "Errors: as [`Pool::retention_abort`]", that is
/// "[`Error::Driver`] with the first release step the driver refused (the scope is
/// closed all the same, and what was refused is kept and retried at the next release
/// point)".
#[test]
fn retention_scope_abort_returns_the_errors_of_its_release() {
    // A refused unmap: the mapping stays whole and idle, retried by trim.
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let scope = pool.retention_scope().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    assert_eq!(check(&pool).idle_bytes, 4 * MIB, "retained in the scope");
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    let err = scope.abort().unwrap_err();
    assert_eq!(
        err.driver_error(),
        Some(DriverError::new(DriverCall::Unmap, FAIL)),
        "{err:?}"
    );
    assert!(
        matches!(err, Error::Driver { bytes, .. } if bytes == 4 * MIB),
        "{err:?}"
    );
    let s = check(&pool);
    assert!(!s.scope_open, "closed all the same");
    assert_eq!(
        (s.scopes_aborted, s.scopes_finished, s.unmap_failures),
        (1, 0, 1)
    );
    assert_eq!(
        (s.idle_count, s.idle_bytes, s.physical_bytes),
        (1, 4 * MIB, 4 * MIB)
    );
    pool.trim().unwrap();
    assert_eq!(check(&pool).mappings_released, 1);
    assert_driver_empty(&pool);

    // A refused handle release: unmapped, the handle pending, retried by trim.
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let scope = pool.retention_scope().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    sim.inject_failure(DriverCall::Release, 1, FAIL);
    let err = scope.abort().unwrap_err();
    assert_eq!(
        err.driver_error(),
        Some(DriverError::new(DriverCall::Release, FAIL))
    );
    let s = check(&pool);
    assert_eq!(
        (
            s.scopes_aborted,
            s.release_failures,
            s.pending_count,
            s.pending_bytes
        ),
        (1, 1, 1, 4 * MIB)
    );
    assert_eq!((s.idle_count, s.physical_bytes), (0, 4 * MIB));
    pool.trim().unwrap();
    assert_driver_empty(&pool);

    // Nothing refused: Ok, and the idle mapping released.
    let (pool, _sim) = simulated_pool(1 << 30, PoolConfig::default());
    let scope = pool.retention_scope().unwrap();
    let a = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(a).unwrap();
    scope.abort().unwrap();
    let s = check(&pool);
    assert_eq!((s.scopes_aborted, s.mappings_released), (1, 1));
    assert_driver_empty(&pool);
}
