//! Fault-injection property test: random sequences of pool operations with random
//! driver failures injected into every kind of call the pool makes, on the simulated
//! driver. After every step the snapshot invariants hold, the books equal what the
//! driver holds, every failure the pool counted is one that was injected (a
//! reservation freed under a live mapping, a handle released twice or a partial
//! unmap would show up as a failure nobody injected), no busy range was unmapped, and
//! every error is typed and names the call. At the end, with the failures cleared,
//! dropping the pool leaves the driver holding nothing.
//!
//! Stream order (issue 11) is in the same sequences: stream-ordered allocations and
//! frees on three non-blocking streams and the legacy stream, kernels launched on
//! them (with `record_stream` when on another stream), streams completing, captures
//! begun and ended (global mode, no scope needed), and failures injected into the
//! stream and event calls. After every step the simulated driver has seen no contract
//! fault (no unmap of memory queued work touches, no hand-off to a stream while
//! another stream's unordered work touches it, no broken capture), and every capture
//! ends valid.
//!
//! Cases: 2000 by default (about a minute or less in a debug build); set
//! `FLARE_PROPTEST_CASES` for more.

use crate::common;

use common::GIB;
use flare_package::driver::sim::CaptureMode;
use flare_package::{
    CuResult, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SimConfig, SimDriver, SleepMode,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

mod model;
mod operations;

use crate::random_failures::model::Model;
use crate::random_failures::operations::{op, setup, Op, Setup};

/// An error is typed and names the call, its code (name and number) and a size.
fn assert_names_call(e: &Error, allowed: &[DriverCall]) {
    let msg = e.to_string();
    let src = e
        .driver_error()
        .unwrap_or_else(|| panic!("not a driver error: {e:?}"));
    assert!(allowed.contains(&src.call), "unexpected call in {e:?}");
    if let Error::Driver { .. } = e {
        assert!(msg.contains(src.call.cuda_name()), "{msg}");
        assert!(msg.contains(src.code.name()), "{msg}");
        assert!(msg.contains(&format!("({})", src.code.0)), "{msg}");
    }
}

const CREATE_STEPS: [DriverCall; 4] = [
    DriverCall::Create,
    DriverCall::Reserve,
    DriverCall::Map,
    DriverCall::SetAccess,
];

const RELEASE_STEPS: [DriverCall; 4] = [
    DriverCall::Synchronize,
    DriverCall::Unmap,
    DriverCall::Release,
    DriverCall::FreeReservation,
];

fn run(setup: Setup, ops: Vec<Op>) {
    let capacity = if setup.small_device {
        24 * GIB
    } else {
        1 << 50
    };
    let pool = Pool::new(PoolConfig {
        reuse_policy: setup.policy,
        release_threshold_bytes: setup.release_threshold,
        peer_devices: if setup.peer { vec![1] } else { vec![] },
        cross_stream_reuse: setup.cross,
        segment_whole_threshold_bytes: setup.whole_threshold,
        ..PoolConfig::simulated(SimConfig {
            capacity_bytes: capacity,
            device_count: 2,
            ..SimConfig::default()
        })
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap().clone();
    let created = [(); 3].map(|_| sim.stream_create().unwrap());
    let mut m = Model {
        sim: sim.clone(),
        setup,
        granularity: pool.granularity(),
        live: Vec::new(),
        tagged: Vec::new(),
        tagged_on: Vec::new(),
        asleep: [false; 3],
        scope: false,
        streams: [created[0], created[1], created[2], 0],
        capture: None,
        used_streams: false,
        stream_targets: Vec::new(),
        allocations: 0,
        frees: 0,
        finished: 0,
        aborted: 0,
        targets: Vec::new(),
    };
    for op in &ops {
        let fired_before = m.fired_total();
        let fired_all_before = m.fired_all();
        let stream_fired_before = m.stream_fired();
        // While a capture is open the caller uses stream-ordered calls only: the
        // synchronous release points synchronize the device (their contract).
        let sync_op = matches!(
            op,
            Op::Alloc(_)
                | Op::Free(_)
                | Op::Finish
                | Op::Abort
                | Op::Trim
                | Op::AllocTagged(..)
                | Op::FreeTagged(_)
                | Op::Sleep(..)
                | Op::Wake(_)
        );
        if sync_op && m.capture.is_some() {
            continue;
        }
        // While tag 0 sleeps, the untagged allocations are refused (nothing changes)
        // and its memory is neither freed nor touched.
        if m.asleep[0] {
            let refused = match *op {
                Op::Alloc(bytes) => Some(pool.allocate_raw(bytes)),
                Op::AllocAsync(si, bytes) => {
                    Some(pool.allocate_async_raw(bytes, m.stream(usize::from(si) % 4)))
                }
                _ => None,
            };
            if let Some(r) = refused {
                assert!(
                    matches!(r, Err(Error::TagState { tag: 0, .. })),
                    "{op:?} while tag 0 sleeps: {r:?}"
                );
                m.check(&pool, op);
                continue;
            }
            if matches!(op, Op::Free(_) | Op::FreeAsync(_) | Op::Launch(..)) {
                continue;
            }
        }
        match *op {
            Op::Alloc(bytes) => match pool.allocate_raw(bytes) {
                Ok(ptr) => {
                    assert_eq!(ptr % m.align(bytes), 0);
                    assert!(
                        m.live.iter().all(|&(p, _, _)| p != ptr),
                        "{op:?}: {ptr:#x} handed out twice"
                    );
                    // Work in flight reads it until the next synchronize.
                    sim.mark_busy(ptr, bytes);
                    m.live.push((ptr, bytes, None));
                    m.allocations += 1;
                }
                Err(e) => {
                    match &e {
                        Error::OutOfMemory {
                            requested,
                            in_scope,
                            source,
                            ..
                        } => {
                            assert_eq!(*requested, m.rounded(bytes), "{e:?}");
                            assert_eq!(*in_scope, m.scope, "{e:?}");
                            let src = source.expect("the driver's out-of-memory");
                            assert!(src.is_out_of_memory(), "{e:?}");
                        }
                        Error::Driver { bytes: b, .. } => {
                            assert_eq!(*b, m.rounded(bytes), "{e:?}");
                        }
                        _ => panic!("{op:?}: untyped error {e:?}"),
                    }
                    assert_names_call(&e, &CREATE_STEPS);
                }
            },
            Op::Free(i) => {
                if m.live.is_empty() {
                    assert!(matches!(
                        pool.free_raw(0x1000),
                        Err(Error::UnknownPointer { .. })
                    ));
                } else {
                    let (ptr, _, on) = m.live.swap_remove(i % m.live.len());
                    if on.is_some() {
                        // The caller synchronized the device before a synchronous
                        // free of stream-ordered memory.
                        for s in m.streams {
                            sim.stream_complete(s);
                        }
                    }
                    pool.free_raw(ptr).unwrap();
                    m.frees += 1;
                    let s = pool.snapshot();
                    // Threshold 0 outside a scope: a free is a release point, and
                    // with no failure on the way everything idle or pending goes
                    // (memory freed on streams waits on fences instead).
                    if !m.scope
                        && !m.used_streams
                        && m.setup.release_threshold == 0
                        && m.fired_total() == fired_before
                    {
                        assert_eq!((s.idle_count, s.pending_count), (0, 0), "{op:?}\n{s:#?}");
                    }
                }
            }
            Op::Begin => {
                let r = pool.retention_begin();
                assert_eq!(r.is_ok(), !m.scope, "{r:?}");
                m.scope = true;
            }
            Op::Finish | Op::Abort | Op::Trim => {
                let r = match op {
                    Op::Finish => pool.retention_finish(),
                    Op::Abort => pool.retention_abort(),
                    _ => pool.trim(),
                };
                let scope_error = match op {
                    Op::Trim => m.scope,
                    _ => !m.scope,
                };
                if scope_error {
                    assert!(matches!(r, Err(Error::ScopeState(_))), "{op:?}: {r:?}");
                } else {
                    if m.scope {
                        // Finish and abort close the scope even when a release step
                        // fails.
                        match op {
                            Op::Finish => m.finished += 1,
                            Op::Abort => m.aborted += 1,
                            _ => {}
                        }
                    }
                    m.scope = false;
                    match r {
                        Ok(()) => {
                            let s = pool.snapshot();
                            assert_eq!(m.fired_total(), fired_before, "{op:?}: Ok with failures");
                            // Everything idle goes, memory freed on streams too (its
                            // fences waited on); a finish keeps what captures made
                            // outside its scope.
                            let kept = match op {
                                Op::Trim => 0,
                                _ => s.capture_held_bytes,
                            };
                            if m.setup.policy == ReusePolicy::Segments {
                                // Capture-held blocks are free bytes of their
                                // segments, capture-held whole mappings idle ones.
                                assert!(
                                    s.idle_bytes <= kept
                                        && s.idle_bytes + s.block_free_bytes >= kept
                                        && s.pending_count == 0,
                                    "{op:?}\n{s:#?}"
                                );
                            } else {
                                assert_eq!(
                                    (s.idle_bytes, s.pending_count),
                                    (kept, 0),
                                    "{op:?}\n{s:#?}"
                                );
                            }
                        }
                        Err(e) => {
                            let stream_fired = m.stream_fired() > stream_fired_before;
                            assert!(
                                m.fired_total() > fired_before || stream_fired,
                                "{op:?}: {e:?} not injected"
                            );
                            let mut allowed = RELEASE_STEPS.to_vec();
                            allowed.push(DriverCall::StreamGetCaptureInfo);
                            assert_names_call(&e, &allowed);
                        }
                    }
                }
            }
            Op::Snapshot => {
                // The snapshot against what is known without it: the model's own
                // counts of what succeeded, and what the simulated driver holds; and
                // taking it makes no driver call.
                let calls = |sim: &SimDriver| DriverCall::ALL.map(|c| sim.call_count(c));
                let calls_before = calls(&sim);
                let s = pool.snapshot();
                assert_eq!(calls(&sim), calls_before, "a snapshot calls the driver");
                let d = sim.state();
                assert_eq!(
                    (s.allocations, s.frees, s.live_count),
                    (m.allocations, m.frees, m.live_count()),
                    "allocations, frees, live: snapshot vs model"
                );
                assert_eq!(
                    (s.scopes_finished, s.scopes_aborted, s.scope_open),
                    (m.finished, m.aborted, m.scope),
                    "scopes: snapshot vs model"
                );
                assert_eq!(s.granularity_bytes, m.granularity);
                assert_eq!(
                    (s.physical_bytes, s.reserved_bytes),
                    (d.physical_bytes, d.reserved_bytes),
                    "physical and reserved bytes: snapshot vs driver"
                );
                // Every live allocation is mapped whole in the driver, and the live
                // mapped bytes cover the rounded requests.
                // Every live allocation holds at least its request rounded (to 512
                // bytes for a block, to the granularity for a whole mapping); idle
                // memory freed whole into a bucket may serve either kind of request,
                // so the two are checked together.
                let rounded: u64 = m
                    .live
                    .iter()
                    .map(|&(_, b, _)| {
                        if m.is_block(b) {
                            b.div_ceil(512) * 512
                        } else {
                            m.rounded(b)
                        }
                    })
                    .sum();
                // (While tag 0 sleeps its allocations are sleeping bytes.)
                let asleep0 = if m.asleep[0] {
                    s.sleeping_bytes + s.sleeping_held_bytes
                } else {
                    0
                };
                assert!(
                    s.live_mapped_bytes + s.block_live_bytes + asleep0 >= rounded,
                    "{s:#?}"
                );
                assert!(d.mapped_bytes >= s.live_mapped_bytes, "{s:#?}\n{d:#?}");
            }
            Op::AllocTagged(t, bytes) => {
                let tag = 1 + u32::from(t % 2);
                let on = (t & 4 != 0).then_some(usize::from(t >> 3) % 4);
                if on.is_some() {
                    m.used_streams = true;
                }
                match pool.allocate_tagged_raw(bytes, on.map(|si| m.stream(si)), tag) {
                    Ok(ptr) => {
                        assert!(!m.asleep[tag as usize], "{op:?}: allocated while asleep");
                        // A whole mapping, or in segment mode a block of the tag's
                        // own heap.
                        assert_eq!(ptr % m.align(bytes), 0, "{op:?}: {ptr:#x}");
                        assert!(
                            m.live.iter().all(|&(p, _, _)| p != ptr)
                                && m.tagged.iter().all(|&(p, _, _)| p != ptr),
                            "{op:?}: {ptr:#x} handed out twice"
                        );
                        // Synchronous: work in flight reads it until the next
                        // synchronize. (Stream-ordered: its stream's work, none here.)
                        if on.is_none() {
                            sim.mark_busy(ptr, bytes);
                        }
                        m.tagged.push((ptr, bytes, tag));
                        m.tagged_on.push(on);
                        m.allocations += 1;
                    }
                    Err(Error::TagState { tag: t2, .. }) => {
                        assert!(m.asleep[tag as usize] && t2 == tag, "{op:?}");
                    }
                    Err(e) => {
                        assert!(!m.asleep[tag as usize], "{op:?}: {e:?}");
                        match &e {
                            Error::OutOfMemory { requested, .. } => {
                                assert_eq!(*requested, m.rounded(bytes), "{e:?}")
                            }
                            Error::Driver { .. } => {}
                            _ => panic!("{op:?}: untyped error {e:?}"),
                        }
                        let mut allowed = CREATE_STEPS.to_vec();
                        if on.is_some() {
                            allowed.push(DriverCall::StreamGetCaptureInfo);
                        }
                        assert_names_call(&e, &allowed);
                    }
                }
            }
            Op::FreeTagged(i) => {
                if !m.tagged.is_empty() {
                    let k = i % m.tagged.len();
                    let (ptr, _, tag) = m.tagged[k];
                    let freed = match m.tagged_on[k] {
                        Some(si) => pool.free_async_raw(ptr, m.stream(si)),
                        None => pool.free_raw(ptr),
                    };
                    match freed {
                        Ok(()) => {
                            assert!(!m.asleep[tag as usize], "{op:?}: freed while asleep");
                            m.tagged.swap_remove(k);
                            m.tagged_on.swap_remove(k);
                            m.frees += 1;
                        }
                        Err(e) => {
                            assert!(
                                m.asleep[tag as usize]
                                    && matches!(e, Error::TagState { tag: t, .. } if t == tag),
                                "{op:?}: {e:?}"
                            );
                        }
                    }
                }
            }
            Op::Sleep(t, offload) => {
                let tag = u32::from(t % 3);
                let mode = if offload {
                    SleepMode::Offload
                } else {
                    SleepMode::Discard
                };
                let physical_before = pool.tag_census(tag).physical_bytes;
                let r = pool.sleep(tag, mode);
                if m.scope {
                    assert!(matches!(r, Err(Error::ScopeState(_))), "{op:?}: {r:?}");
                } else if m.asleep[tag as usize] {
                    assert!(matches!(r, Err(Error::TagState { .. })), "{op:?}: {r:?}");
                } else {
                    match r {
                        Ok(()) => {
                            m.asleep[tag as usize] = true;
                            let c = pool.tag_census(tag);
                            let s = pool.snapshot();
                            // Only handles the driver refused to release stay.
                            assert!(c.physical_bytes <= s.sleeping_held_bytes, "{op:?}");
                            assert!(c.physical_bytes <= physical_before, "{op:?}");
                            if m.fired_total() == fired_before {
                                assert_eq!(c.physical_bytes, 0, "{op:?}");
                            }
                            if offload {
                                let asked: u64 = if tag == 0 {
                                    m.live.iter().map(|x| x.1).sum()
                                } else {
                                    m.tagged.iter().filter(|x| x.2 == tag).map(|x| x.1).sum()
                                };
                                assert_eq!(c.offloaded_bytes, asked, "{op:?}");
                            }
                        }
                        Err(e) => {
                            assert!(e.driver_error().is_some(), "{op:?}: {e:?}");
                            // A memory call, or (tag 0's sleep releases what is idle
                            // as trim does) a stream or event call.
                            assert!(
                                m.fired_all() > fired_all_before
                                    || (tag == 0 && m.stream_fired() > stream_fired_before),
                                "{op:?}: {e:?} not injected"
                            );
                            // Awake, unless undoing the failure failed too.
                            m.asleep[tag as usize] = pool.tag_census(tag).sleeping;
                            if m.asleep[tag as usize] {
                                assert!(m.fired_all() >= fired_all_before + 2, "{op:?}");
                            }
                        }
                    }
                }
            }
            Op::Wake(t) => {
                let tag = u32::from(t % 3);
                let r = pool.wake(tag);
                if !m.asleep[tag as usize] {
                    assert!(matches!(r, Err(Error::TagState { .. })), "{op:?}: {r:?}");
                } else {
                    match r {
                        Ok(()) => {
                            m.asleep[tag as usize] = false;
                            let mine = m
                                .tagged
                                .iter()
                                .filter(|x| x.2 == tag)
                                .map(|x| (x.0, x.1))
                                .chain(m.live.iter().filter(|_| tag == 0).map(|x| (x.0, x.1)));
                            for (p, b) in mine {
                                assert_eq!(sim.touch(p, b, 0), CuResult::SUCCESS, "{op:?}");
                            }
                        }
                        Err(e) => {
                            assert!(
                                m.fired_all() > fired_all_before,
                                "{op:?}: {e:?} not injected"
                            );
                            assert!(pool.tag_census(tag).sleeping, "{op:?}: {e:?}");
                            assert!(
                                matches!(e, Error::OutOfMemory { .. })
                                    || e.driver_error().is_some(),
                                "{op:?}: {e:?}"
                            );
                        }
                    }
                }
            }
            Op::Fail(call, nth, code) => m.inject(call, nth, code),
            Op::FailStream(call, nth, code) => m.inject_stream(call, nth, code),
            Op::AllocAsync(si, bytes) => {
                let si = usize::from(si) % 4;
                m.used_streams = true;
                match pool.allocate_async_raw(bytes, m.stream(si)) {
                    Ok(ptr) => {
                        assert_eq!(ptr % m.align(bytes), 0);
                        assert!(
                            m.live.iter().all(|&(p, _, _)| p != ptr),
                            "{op:?}: {ptr:#x} handed out twice"
                        );
                        m.live.push((ptr, bytes, Some(si)));
                        m.allocations += 1;
                    }
                    Err(e) => {
                        match &e {
                            Error::OutOfMemory {
                                requested,
                                in_scope,
                                ..
                            } => {
                                assert_eq!(*requested, m.rounded(bytes), "{e:?}");
                                assert_eq!(*in_scope, m.scope, "{e:?}");
                            }
                            Error::Driver { .. } => {}
                            _ => panic!("{op:?}: untyped error {e:?}"),
                        }
                        let mut allowed = CREATE_STEPS.to_vec();
                        allowed.push(DriverCall::StreamGetCaptureInfo);
                        assert_names_call(&e, &allowed);
                    }
                }
            }
            Op::FreeAsync(i) => {
                let stream_live: Vec<usize> = (0..m.live.len())
                    .filter(|&k| m.live[k].2.is_some())
                    .collect();
                if !stream_live.is_empty() {
                    let k = stream_live[i % stream_live.len()];
                    let (ptr, _, on) = m.live.swap_remove(k);
                    let si = on.unwrap_or(0);
                    pool.free_async_raw(ptr, m.stream(si)).unwrap();
                    m.frees += 1;
                }
            }
            Op::Launch(i, t) => {
                let stream_live: Vec<usize> = (0..m.live.len())
                    .filter(|&k| m.live[k].2.is_some())
                    .collect();
                if !stream_live.is_empty() {
                    let (ptr, bytes, on) = m.live[stream_live[i % stream_live.len()]];
                    let t = usize::from(t) % 4;
                    if Some(t) != on {
                        pool.record_stream(ptr, m.stream(t)).unwrap();
                    }
                    assert_eq!(sim.launch(m.stream(t).0, ptr, bytes), CuResult::SUCCESS);
                }
            }
            Op::Complete(si) => {
                let s = m.stream(usize::from(si) % 4);
                assert_eq!(sim.stream_complete(s.0), CuResult::SUCCESS);
            }
            Op::Capture(si) => match m.capture.take() {
                Some(c) => {
                    assert_eq!(
                        sim.stream_end_capture(m.stream(c).0),
                        CuResult::SUCCESS,
                        "the capture ends valid"
                    );
                }
                None => {
                    let c = usize::from(si) % 3;
                    assert_eq!(
                        sim.stream_begin_capture(m.stream(c).0, CaptureMode::Global),
                        CuResult::SUCCESS
                    );
                    m.capture = Some(c);
                }
            },
        }
        m.check(&pool, op);
    }
    if let Some(c) = m.capture {
        assert_eq!(sim.stream_end_capture(m.stream(c).0), CuResult::SUCCESS);
    }
    sim.clear_failures();
    drop(pool);
    assert_eq!(sim.host_bytes(), 0, "pinned host memory left after drop");
    let d = sim.state();
    assert_eq!(
        (d.handles, d.physical_bytes, d.reservations, d.mappings),
        (0, 0, 0, 0),
        "the driver still holds {d:?} after drop"
    );
    assert!(sim.faults().is_empty(), "faults: {:?}", sim.faults());
}

fn cases() -> u32 {
    std::env::var("FLARE_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 20_000,
        // The seeds of past failures beside this file
        // (`random_failures.proptest-regressions`): proptest's default looks in
        // `tests/proptest-regressions/` once the folder has a `main.rs`.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_operations_with_random_driver_failures(
        setup in setup(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(setup, ops);
    }
}
