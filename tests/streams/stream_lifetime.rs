//! A stream's end (issue 34, item 6; RAPIDS RMM issue 2251): the CUDA driver may hand
//! a destroyed stream's handle value to the next stream created, and a pool that keys
//! streams by handle then takes the new stream for the old one. The simulated driver
//! hands handles out again (the most recently destroyed first), and
//! `Pool::forget_stream`, called before the destroy, makes the pool forget everything
//! keyed by the handle: the new stream inherits no memory, fences, heap or pending
//! release of the old one's, while the old one's memory stays safe until its fence
//! completes.
//!
//! Every expected value comes from the contract: the simulated driver's 2 MiB
//! granularity, one whole mapping per allocation of at most 2 MiB (best-fit), blocks
//! rounded to 512 bytes carved from one 2 MiB handle per heap (segments).

use crate::common;

use std::sync::Arc;

use common::{check, no_faults, stream, MIB};
use flare_package::driver::sim::{CaptureMode, SimFault, SimStreamCall};
use flare_package::{CuResult, Error, Pool, PoolConfig, ReusePolicy, SimDriver, Stream};

const G: u64 = 2 * MIB;
const OK: CuResult = CuResult::SUCCESS;
const INVALID_HANDLE: CuResult = flare_package::driver::sim::CUDA_ERROR_INVALID_HANDLE;

/// A pool on a fresh simulated device that keeps what is freed cached (release
/// threshold `u64::MAX`: no free polls or releases, so only the calls under test
/// move memory), with `policy`.
fn cached_pool(policy: ReusePolicy) -> (Pool, Arc<SimDriver>) {
    common::simulated_pool(
        64 * G,
        PoolConfig {
            reuse_policy: policy,
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default()
        },
    )
}

/// Allocates `bytes` on `s`.
fn alloc(pool: &Pool, bytes: u64, s: Stream) -> u64 {
    pool.allocate_async_raw(bytes, s).expect("allocate_async")
}

/// Frees `p` on `s`.
fn free(pool: &Pool, p: u64, s: Stream) {
    pool.free_async_raw(p, s).expect("free_async");
}

/// Destroys `s` on the simulated driver and creates the next stream, which gets
/// `s`'s handle again.
fn destroy_and_recreate(sim: &SimDriver, s: Stream) -> Stream {
    assert_eq!(sim.stream_destroy(s.0), OK);
    let t = stream(sim);
    assert_eq!(
        t, s,
        "the simulated driver hands the destroyed handle out again"
    );
    t
}

// ---------------------------------------------------------------- the simulated driver

/// `cuStreamDestroy` frees the handle for the next `cuStreamCreate`, the most
/// recently destroyed first; with none free, a handle never handed out.
#[test]
fn a_destroyed_streams_handle_goes_to_the_next_created_stream() {
    let d = SimDriver::new(Default::default());
    let (s1, s2) = (stream(&d), stream(&d));
    assert_eq!(d.stream_destroy(s1.0), OK);
    assert_eq!(d.stream_destroy(s2.0), OK);
    assert_eq!(stream(&d), s2);
    assert_eq!(stream(&d), s1);
    let fresh = stream(&d);
    assert!(fresh != s1 && fresh != s2);
}

/// A destroyed stream's handle is refused (a launch, an event record, a capture
/// query: `CUDA_ERROR_INVALID_HANDLE`, nothing queued) until a new stream has it; the
/// new stream is not ordered after the old one's queued work: handing it memory that
/// work touches is a contract fault, completing it does not complete the old work,
/// while an event recorded on the old stream before its destroy does.
#[test]
fn a_stream_with_a_reused_handle_is_not_ordered_after_the_old_streams_work() {
    let d = SimDriver::new(Default::default());
    let buf = common::mapped_for(&d, G, &[0]);
    let s = stream(&d);
    let e = d.event_create().unwrap();
    assert_eq!(d.launch(s.0, buf, G), OK);
    assert_eq!(d.event_record(e, s.0), OK);
    assert_eq!(d.stream_destroy(s.0), OK);
    assert_eq!(d.launch(s.0, buf, G), INVALID_HANDLE);
    assert_eq!(d.event_record(e, s.0), INVALID_HANDLE);
    assert_eq!(d.stream_get_capture_info(s.0).unwrap_err(), INVALID_HANDLE);
    assert_eq!(
        d.queued_work().len(),
        1,
        "the refused launch queued nothing"
    );
    let t = stream(&d);
    assert_eq!(t, s);
    assert_eq!(d.launch(t.0, buf, 0), OK);
    assert_eq!(d.stream_complete(t.0), OK);
    let old = d.queued_work();
    assert_eq!((old.len(), old[0].stream, old[0].ptr), (1, s.0, buf));
    assert_eq!(d.note_handoff(t.0, buf, G), OK);
    assert_eq!(
        d.faults(),
        vec![SimFault::HandoffWhileQueued {
            stream: t.0,
            ptr: buf,
            size: G,
            other: s.0,
        }]
    );
    assert_eq!(d.event_synchronize(e), OK);
    assert!(d.queued_work().is_empty());
}

// ---------------------------------------------------------------- the pool

/// The hazard the call exists for: without `forget_stream`, the new stream with the
/// old handle is taken for the old stream, and gets the memory freed on it at once
/// while the old stream's kernel still uses it (the simulated driver records the
/// hand-off). This is the documented misuse; the tests below make the call.
#[test]
fn without_forgetting_a_new_stream_with_the_old_handle_takes_memory_still_in_use() {
    let (pool, sim) = cached_pool(ReusePolicy::BestFit);
    let s = stream(&sim);
    let p = alloc(&pool, G, s);
    assert_eq!(sim.launch(s.0, p, G), OK);
    free(&pool, p, s);
    let t = destroy_and_recreate(&sim, s);
    assert_eq!(alloc(&pool, G, t), p);
    assert_eq!(
        sim.faults(),
        vec![SimFault::HandoffWhileQueued {
            stream: t.0,
            ptr: p,
            size: G,
            other: s.0,
        }]
    );
}

/// With `forget_stream` before the destroy: the new stream gets a new mapping (the
/// old one waits on the forget's fence: idle, waiting on an event), no fault; once
/// the old stream's work is done, its memory serves another stream (a cross-stream
/// hit), and trim releases everything.
#[test]
fn forgetting_before_destroy_gives_the_new_stream_none_of_the_old_streams_memory() {
    let (pool, sim) = cached_pool(ReusePolicy::BestFit);
    let s = stream(&sim);
    let p = alloc(&pool, G, s);
    assert_eq!(sim.launch(s.0, p, G), OK);
    free(&pool, p, s);
    let records = sim.stream_call_count(SimStreamCall::EventRecord);
    pool.forget_stream(s).unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::EventRecord),
        records + 1,
        "one fence, after the old stream's work"
    );
    let t = destroy_and_recreate(&sim, s);
    let q = alloc(&pool, G, t);
    assert_ne!(q, p);
    no_faults(&sim);
    let snap = check(&pool);
    assert_eq!(
        (
            snap.physical_bytes,
            snap.live_mapped_bytes,
            snap.idle_bytes,
            snap.event_wait_bytes,
            snap.events_outstanding,
            snap.mappings_created,
        ),
        (2 * G, G, G, G, 1, 2)
    );
    // The device finishes the old stream's kernel: the forget's fence completes, and
    // the next miss on `t` takes p from the old stream's memory.
    assert_eq!(sim.ctx_synchronize(0), OK);
    assert_eq!(alloc(&pool, G, t), p);
    let snap = check(&pool);
    assert_eq!(
        (
            snap.cross_stream_hits,
            snap.mappings_created,
            snap.events_outstanding
        ),
        (1, 2, 0)
    );
    free(&pool, p, t);
    free(&pool, q, t);
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.physical_bytes, snap.stream_call_failures), (0, 0));
    no_faults(&sim);
    pool.destroy().unwrap();
    let d = sim.state();
    assert_eq!((d.physical_bytes, d.reserved_bytes), (0, 0), "{d:#?}");
    no_faults(&sim);
}

/// Segment mode: blocks freed on S return to S's heap at once. Forgotten, that heap
/// serves nobody: the new stream's block comes from a heap of its own (a second
/// 2 MiB handle), not from the old one, which S's kernel still uses; trim releases
/// the old heap's handle after the forget's fence.
#[test]
fn a_forgotten_streams_heap_is_not_carved_for_the_new_stream() {
    let (pool, sim) = cached_pool(ReusePolicy::Segments);
    let s = stream(&sim);
    let b = alloc(&pool, 4096, s);
    assert_eq!(sim.launch(s.0, b, 4096), OK);
    free(&pool, b, s);
    pool.forget_stream(s).unwrap();
    let t = destroy_and_recreate(&sim, s);
    let c = alloc(&pool, 4096, t);
    assert!(
        c.abs_diff(b) >= G,
        "{c:#x} is in the old heap's handle at {b:#x}"
    );
    no_faults(&sim);
    let snap = check(&pool);
    assert_eq!(
        (
            snap.segment_handles,
            snap.segment_mapped_bytes,
            snap.block_live_bytes,
            snap.block_free_bytes
        ),
        (2, 2 * G, 4096, 2 * G - 4096)
    );
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(
        (
            snap.segment_handles,
            snap.physical_bytes,
            snap.block_live_bytes
        ),
        (1, G, 4096)
    );
    free(&pool, c, t);
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}

/// A live allocation used on S too (`record_stream`), freed on its own stream after
/// S was forgotten, destroyed and its handle reused: the free waits on the old S's
/// work (the forget's fence), not on the new stream's. The new stream's work
/// completing does not make it reusable; the old work's completing does.
#[test]
fn a_recorded_forgotten_stream_is_waited_on_not_the_new_stream_with_its_handle() {
    let (pool, sim) = cached_pool(ReusePolicy::BestFit);
    let (a, s) = (stream(&sim), stream(&sim));
    let p = alloc(&pool, G, a);
    pool.record_stream(p, s).unwrap();
    assert_eq!(sim.launch(s.0, p, G), OK);
    pool.forget_stream(s).unwrap();
    let t = destroy_and_recreate(&sim, s);
    free(&pool, p, a);
    assert_eq!(
        check(&pool).event_wait_bytes,
        G,
        "waiting on the old stream"
    );
    assert_eq!(sim.launch(t.0, 0, 0), OK);
    assert_eq!(sim.stream_complete(t.0), OK);
    let q = alloc(&pool, G, a);
    assert_ne!(q, p, "the old stream's kernel still uses p");
    no_faults(&sim);
    assert_eq!(sim.ctx_synchronize(0), OK);
    assert_eq!(alloc(&pool, G, a), p);
    no_faults(&sim);
    let snap = check(&pool);
    assert_eq!((snap.live_count, snap.idle_bytes), (2, 0));
}

/// Live allocations made on a forgotten stream stay valid: freed on the new stream
/// with the old handle, each acts as a free on a new stream (reused by it at once,
/// stream order), whole mapping or block.
#[test]
fn live_allocations_of_a_forgotten_stream_stay_valid() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, sim) = cached_pool(policy);
        let s = stream(&sim);
        let p = alloc(&pool, 4096, s);
        pool.forget_stream(s).unwrap();
        let t = destroy_and_recreate(&sim, s);
        free(&pool, p, t);
        assert_eq!(alloc(&pool, 4096, t), p, "{policy:?}");
        free(&pool, p, t);
        pool.trim().unwrap();
        assert_eq!(check(&pool).physical_bytes, 0, "{policy:?}");
        no_faults(&sim);
    }
}

/// Refused while the stream is being captured: `Error::StreamState` naming it,
/// nothing changed (no event recorded, the snapshot the same, the stream still
/// takes its memory back at once), and the capture stays valid. After the capture,
/// the same call succeeds.
#[test]
fn forgetting_a_capturing_stream_is_refused_and_changes_nothing() {
    let (pool, sim) = cached_pool(ReusePolicy::BestFit);
    let s = stream(&sim);
    let p = alloc(&pool, G, s);
    free(&pool, p, s);
    assert_eq!(sim.stream_begin_capture(s.0, CaptureMode::Global), OK);
    let before = check(&pool);
    let records = sim.stream_call_count(SimStreamCall::EventRecord);
    match pool.forget_stream(s) {
        Err(Error::StreamState { stream, .. }) => assert_eq!(stream, s.0),
        other => panic!("expected a stream-state refusal: {other:?}"),
    }
    assert_eq!(check(&pool), before);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), records);
    assert_eq!(sim.stream_end_capture(s.0), OK, "the capture stayed valid");
    assert_eq!(alloc(&pool, G, s), p);
    free(&pool, p, s);
    pool.forget_stream(s).unwrap();
    no_faults(&sim);
}

/// A second forget, and a forget of a handle the pool never saw, change nothing and
/// make no driver call; the default streams (0, `CU_STREAM_LEGACY`,
/// `CU_STREAM_PER_THREAD`) are never destroyed: an invalid argument.
#[test]
fn forgetting_twice_or_an_unknown_stream_does_nothing() {
    let (pool, sim) = cached_pool(ReusePolicy::BestFit);
    let s = stream(&sim);
    let p = alloc(&pool, G, s);
    free(&pool, p, s);
    pool.forget_stream(s).unwrap();
    let calls = |sim: &SimDriver| {
        SimStreamCall::ALL
            .iter()
            .map(|&c| sim.stream_call_count(c))
            .sum::<u64>()
    };
    let (before, n) = (check(&pool), calls(&sim));
    pool.forget_stream(s).unwrap();
    pool.forget_stream(Stream(0xdead)).unwrap();
    assert_eq!((check(&pool), calls(&sim)), (before, n));
    for default in [0, 1, 2] {
        assert!(matches!(
            pool.forget_stream(Stream(default)),
            Err(Error::InvalidArgument(_))
        ));
    }
    assert_eq!((check(&pool), calls(&sim)), (before, n));
}

/// The misuse, forgetting after the destroy: no fence can be recorded (the capture
/// query is refused, counted), so the memory is kept from every stream (not taken by
/// the new stream with the handle, nor by another) until trim's device synchronize
/// releases it; no fault.
#[test]
fn forgetting_after_the_destroy_holds_the_memory_until_a_synchronize() {
    let (pool, sim) = cached_pool(ReusePolicy::BestFit);
    let s = stream(&sim);
    let p = alloc(&pool, G, s);
    assert_eq!(sim.launch(s.0, p, G), OK);
    free(&pool, p, s);
    assert_eq!(sim.stream_destroy(s.0), OK);
    pool.forget_stream(s).unwrap();
    assert_eq!(check(&pool).stream_call_failures, 1);
    let t = stream(&sim);
    assert_eq!(t, s);
    let u = stream(&sim);
    let (q, r) = (alloc(&pool, G, t), alloc(&pool, G, u));
    assert!(q != p && r != p);
    no_faults(&sim);
    let syncs = sim.call_count(flare_package::DriverCall::Synchronize);
    pool.trim().unwrap();
    assert_eq!(
        sim.call_count(flare_package::DriverCall::Synchronize),
        syncs + 1
    );
    let snap = check(&pool);
    assert_eq!((snap.physical_bytes, snap.idle_bytes), (2 * G, 0));
    no_faults(&sim);
}

/// A forgotten stream's drained bookkeeping goes to the next stream the pool meets,
/// reset: the old stream's completed fences must not tell the new one that its own
/// work completed. After three frees on S seen complete, S is forgotten and drained
/// (trim); the next stream frees memory its kernel still uses, and another stream
/// must not get it.
#[test]
fn a_new_stream_inherits_no_completion_from_a_drained_forgotten_one() {
    let (pool, sim) = cached_pool(ReusePolicy::BestFit);
    let s = stream(&sim);
    for _ in 0..3 {
        let p = alloc(&pool, G, s);
        free(&pool, p, s);
    }
    pool.trim().unwrap();
    pool.forget_stream(s).unwrap();
    pool.trim().unwrap();
    assert_eq!(sim.stream_destroy(s.0), OK);
    let (u, v) = (stream(&sim), stream(&sim));
    let p = alloc(&pool, G, u);
    assert_eq!(sim.launch(u.0, p, G), OK);
    free(&pool, p, u);
    let q = alloc(&pool, G, v);
    assert_ne!(q, p, "u's kernel still uses p");
    no_faults(&sim);
    let snap = check(&pool);
    assert_eq!((snap.idle_bytes, snap.event_wait_bytes), (G, G));
}

// ---------------------------------------------------------------- recording

/// A recording pool writes `forget STREAM`; the parser gives the name a new index
/// from there on (the new stream with the old handle is another stream), and the
/// replay as recorded calls `forget_stream` too: here (the old stream's kernel still
/// running when the new stream allocates, so no completion of the forgotten stream's
/// fence mattered) it reaches the recorded peak, 16 MiB, with no fault. A default
/// stream cannot be forgotten: such a line is refused.
#[test]
fn a_forget_is_recorded_and_replayed() {
    use flare_package::trace::{self, Event, Problem, TraceError};
    let dir = std::env::temp_dir().join(format!("flare-forget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("forget.trace");
    let (pool, sim) = common::simulated_pool(
        64 * G,
        PoolConfig {
            record_path: Some(path.clone()),
            release_threshold_bytes: u64::MAX,
            ..PoolConfig::default()
        },
    );
    let s = stream(&sim);
    let p = alloc(&pool, 8 * MIB, s);
    assert_eq!(sim.launch(s.0, p, 8 * MIB), OK);
    free(&pool, p, s);
    pool.forget_stream(s).unwrap();
    let t = destroy_and_recreate(&sim, s);
    let q = alloc(&pool, 8 * MIB, t);
    assert_ne!(q, p);
    free(&pool, q, t);
    assert_eq!(alloc(&pool, 8 * MIB, t), q);
    let recorded_peak = pool.snapshot().peak_physical_bytes;
    assert_eq!(recorded_peak, 16 * MIB);
    drop(pool);
    let text = std::fs::read_to_string(&path).unwrap();
    let name = format!("{:#x}", s.0);
    assert!(text.contains(&format!("\nforget {name}\n")), "{text}");
    let parsed = trace::parse(&path).unwrap();
    assert_eq!(parsed.stream_names(), [name.clone(), name.clone()]);
    assert!(parsed.events().contains(&Event::Forget { stream: 0 }));
    let replay_pool = Pool::new(parsed.recorded_config().unwrap().pool_config()).unwrap();
    let report = trace::replay_as_recorded(&replay_pool, &parsed, None).unwrap();
    assert_eq!(report.peak_physical_bytes, recorded_peak);
    no_faults(&replay_pool.sim_driver().unwrap());
    // `forget` is a line of recordings only: the recording's own header comes first.
    let header = text
        .lines()
        .find(|l| l.starts_with("# flare-pool "))
        .unwrap();
    for default in ["0x0", "0x1", "0x2", "2"] {
        match trace::parse_str("t", &format!("{header}\nforget {default}\n")) {
            Err(TraceError::Parse {
                line: 2,
                problem: Problem::ForgetDefaultStream(_),
                ..
            }) => {}
            other => panic!("forget {default}: {other:?}"),
        }
    }
    assert!(matches!(
        trace::parse_str("t", &format!("{header}\nforget\n")),
        Err(TraceError::Parse {
            problem: Problem::Malformed { .. },
            ..
        })
    ));
}
