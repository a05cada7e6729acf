//! The release of stream-freed memory on fences (issue 11): a release, a trim and an
//! out-of-memory retry wait on the fences (events), never on the device; in-flight
//! frees are polled with backoff, down to the release threshold. The simulated driver
//! counts every contract fault: every test ends with none.

use crate::common;

use crate::stream_order::{pool_with, small_device, syncs, G};
use common::{check, no_faults, stream, MIB};
use flare_package::driver::sim::{CaptureMode, SimStreamCall};
use flare_package::{CrossStreamReuse, CuResult, DriverCall};
use std::sync::Arc;

/// Outside a scope with threshold 0, freeing memory that a queued kernel touches
/// neither synchronizes nor unmaps; the release comes at a later release point,
/// after the fence completed, with no synchronize.
#[test]
fn release_waits_for_the_fence_never_for_the_device() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    sim.launch(s.0, p, G);
    pool.free_async_raw(p, s).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, G, "still mapped: the kernel reads it");
    assert_eq!(
        snap.events_outstanding, 0,
        "the first free polls, but nothing was idle at an earlier poll: no fence"
    );
    assert_eq!(sim.call_count(DriverCall::Unmap), 0);
    sim.stream_complete(s.0);
    // Polls come at frees 1, 3, 7 (the countdown doubles while polls find nothing).
    // Free 3's poll finds p idle since free 1's poll and records a fence (covering
    // every free so far); free 7's poll queries it, complete: p is released. The
    // 4 MiB mapping, freed again at every pair, is never old enough to fence.
    for free in 2..=7 {
        let q = pool.allocate_async_raw(4 * MIB, s).unwrap();
        pool.free_async_raw(q, s).unwrap();
        let snap = check(&pool);
        let want = u64::from(free == 7);
        assert_eq!(snap.mappings_released, want, "after free {free}\n{snap:#?}");
        assert_eq!(
            snap.events_outstanding,
            u64::from((3..7).contains(&free)),
            "after free {free}"
        );
    }
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, 4 * MIB, "{snap:#?}");
    assert_eq!(syncs(&sim), 0, "no cuCtxSynchronize on the stream path");
    assert_eq!(sim.stream_call_count(SimStreamCall::EventSynchronize), 0);
    no_faults(&sim);
}

/// trim (and finish, and the out-of-memory release) wait on the fences alone
/// (`cuEventSynchronize`), never on the device, then release.
#[test]
fn trim_waits_on_events_not_the_device() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    let other = pool.allocate_async_raw(G, t).unwrap();
    sim.launch(s.0, p, G);
    sim.launch(t.0, other, G);
    pool.free_async_raw(p, s).unwrap();
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, G, "p released, the live one kept");
    assert_eq!(syncs(&sim), 0);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventSynchronize), 1);
    assert_eq!(
        sim.queued_work().len(),
        1,
        "waiting on S's fence completed S's work only"
    );
    no_faults(&sim);
}

/// An out-of-memory on a stream waits on the fences of idle memory, releases it and
/// retries: the device never fills up with memory freed on streams.
#[test]
fn out_of_memory_waits_on_fences_then_retries() {
    let (pool, sim) = small_device(8 * MIB);
    let s = stream(&sim);
    let mut ptrs = Vec::new();
    for _ in 0..4 {
        let p = pool.allocate_async_raw(G, s).unwrap();
        sim.launch(s.0, p, G);
        ptrs.push(p);
    }
    for p in ptrs {
        pool.free_async_raw(p, s).unwrap();
    }
    let t = stream(&sim);
    let big = pool.allocate_async_raw(8 * MIB, t).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.physical_bytes, 8 * MIB);
    assert_eq!((snap.oom_retries, snap.mappings_released), (1, 4));
    assert_eq!(syncs(&sim), 0);
    pool.free_async_raw(big, t).unwrap();
    no_faults(&sim);
}

/// A failed fence record keeps the memory from every other stream (its order is
/// unknown) and counts the failure; trim releases it after a device synchronize.
#[test]
fn a_failed_event_record_holds_the_memory() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    sim.launch(s.0, p, G);
    pool.free_async_raw(p, s).unwrap();
    sim.inject_stream_failure(SimStreamCall::EventRecord, 1, CuResult::UNKNOWN);
    let q = pool.allocate_async_raw(G, t).unwrap();
    assert_ne!(q, p);
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1);
    // Still S's: S's own order is known.
    assert_eq!(pool.allocate_async_raw(G, s).unwrap(), p);
    // A failed fence wait at trim: what it guards is released after a device
    // synchronize instead (counted, not an error).
    pool.free_async_raw(p, s).unwrap();
    pool.free_async_raw(q, t).unwrap();
    sim.inject_stream_failure(SimStreamCall::EventSynchronize, 1, CuResult::UNKNOWN);
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.physical_bytes, snap.stream_call_failures), (0, 2));
    assert_eq!(syncs(&sim), 1, "the fallback synchronize");
    no_faults(&sim);
}

/// 1,000 frees of buffers still in flight poll the fences about log2(1000) + 1000/64
/// times, not 1,000 (the cost target: at most 2x `cuMemFreeAsync` each).
#[test]
fn in_flight_frees_poll_with_backoff() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let ptrs: Vec<u64> = (0..1000)
        .map(|_| pool.allocate_async_raw(G, s).unwrap())
        .collect();
    sim.launch(s.0, ptrs[0], G);
    // The kernel reads the first buffer: its fence never completes here.
    for p in ptrs {
        pool.free_async_raw(p, s).unwrap();
    }
    let queries = sim.stream_call_count(SimStreamCall::EventQuery);
    // Polls at frees 1, 3, 7, ..., 127 (7 polls: the countdown doubles from 1 to 64
    // while polls find nothing), then every 64: (1000 - 127) / 64 = 13 more. The
    // first two have no fence to query: the first finds nothing idle since an earlier
    // poll, the second records the fence (after its queries).
    assert_eq!(queries, 7 + 13 - 2, "queries");
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), 1);
    assert_eq!(
        check(&pool).physical_bytes,
        1000 * G,
        "nothing released yet"
    );
    assert_eq!(syncs(&sim), 0);
    no_faults(&sim);
}

/// A stream that frees and allocates the same size outside a scope (threshold 0)
/// keeps reusing one mapping: a free's poll releases only memory whose fence was
/// recorded at an earlier poll, never the mapping it just freed (the pair would
/// otherwise create and release a mapping every time).
#[test]
fn a_steady_pair_keeps_one_mapping_at_threshold_zero() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    for _ in 0..1000 {
        let p = pool.allocate_async_raw(G, s).unwrap();
        pool.free_async_raw(p, s).unwrap();
    }
    let snap = check(&pool);
    assert_eq!((snap.mappings_created, snap.reuse_hits), (1, 999));
    assert_eq!(
        snap.physical_bytes, G,
        "still cached, waiting for its fence"
    );
    // Once the stream goes quiet, a later release point releases it.
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}

/// The release threshold is "at or under": a free that leaves the idle bytes exactly
/// at the threshold is not over it and does not count down to a poll. With the
/// threshold at one granule and granule-sized frees, the polls come at frees 2 (the
/// first over it; nothing idle since an earlier poll) and 4 (interval 2: the memory
/// idle at free 2's poll is fenced).
#[test]
fn a_free_at_the_threshold_does_not_count_down() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, G);
    let s = stream(&sim);
    let ptrs: Vec<u64> = (0..4)
        .map(|_| pool.allocate_async_raw(G, s).unwrap())
        .collect();
    let records = || sim.stream_call_count(SimStreamCall::EventRecord);
    for (i, p) in ptrs.iter().enumerate() {
        pool.free_async_raw(*p, s).unwrap();
        let want = u64::from(i == 3);
        assert_eq!(records(), want, "after free {}", i + 1);
    }
    no_faults(&sim);
}

/// A free's poll releases completed memory only while the idle bytes are over the
/// threshold: a release never takes them below it ("at or under the threshold stays
/// cached"). Frees of 64 granules on one quiet stream, thresholds of 1 to 8 granules.
#[test]
fn a_polls_release_stops_at_the_threshold() {
    for k in 1..=8u64 {
        let threshold = k * G;
        let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, threshold);
        let s = stream(&sim);
        let ptrs: Vec<u64> = (0..64)
            .map(|_| pool.allocate_async_raw(G, s).unwrap())
            .collect();
        let mut released = 0;
        for p in ptrs {
            pool.free_async_raw(p, s).unwrap();
            let snap = check(&pool);
            if snap.mappings_released > released {
                released = snap.mappings_released;
                assert!(
                    snap.idle_bytes >= threshold,
                    "threshold {k} granules: released down to {} bytes\n{snap:#?}",
                    snap.idle_bytes
                );
            }
        }
        assert!(
            released > 0,
            "threshold {k} granules: a poll released something"
        );
        no_faults(&sim);
    }
}

/// A release made by a free's poll is counted for the scope barrier and uncounted
/// when booked: a scope begun after it returns at once (it would wait forever on a
/// release counted wrongly; the waiting thread is then left behind and the test
/// fails after 10 s).
#[test]
fn a_scope_after_a_polled_release_begins() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let pool = Arc::new(pool);
    let s = stream(&sim);
    let ptrs: Vec<u64> = (0..12)
        .map(|_| pool.allocate_async_raw(G, s).unwrap())
        .collect();
    for p in ptrs {
        pool.free_async_raw(p, s).unwrap();
    }
    assert!(check(&pool).mappings_released > 0, "a poll released memory");
    let (tx, rx) = std::sync::mpsc::channel();
    let p2 = Arc::clone(&pool);
    std::thread::spawn(move || {
        let _ = tx.send(p2.retention_begin().is_ok());
    });
    let begun = rx.recv_timeout(std::time::Duration::from_secs(10));
    assert_eq!(
        begun,
        Ok(true),
        "retention_begin waited for a release that was never booked"
    );
    pool.retention_finish().unwrap();
    no_faults(&sim);
}

/// A stream the pool used stays one it asks about captures until a trim or finish,
/// even when an out-of-memory release (which never synchronizes) took all its
/// memory: a capture begun on it later is then seen by a trim, which keeps what
/// needs a device synchronize instead of breaking the capture.
#[test]
fn an_out_of_memory_release_keeps_a_used_stream_in_view() {
    let (pool, sim) = small_device(4 * MIB);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, t).unwrap();
    pool.free_async_raw(p, t).unwrap();
    // S's 4 MiB finds the device full: T's idle memory is fenced, waited on and
    // released (no synchronize), and the retry succeeds.
    let big = pool.allocate_async_raw(4 * MIB, s).unwrap();
    assert_eq!(check(&pool).oom_retries, 1);
    // Memory freed with the synchronous free: releasing it needs a synchronize.
    sim.stream_complete(s.0);
    pool.free_raw(big).unwrap();
    assert_eq!(
        sim.stream_begin_capture(t.0, CaptureMode::Global),
        CuResult::SUCCESS
    );
    pool.trim().unwrap();
    assert_eq!(
        sim.stream_end_capture(t.0),
        CuResult::SUCCESS,
        "trim synchronized during T's capture: {:?}",
        sim.faults()
    );
    assert_eq!(
        check(&pool).idle_bytes,
        4 * MIB,
        "kept for after the capture"
    );
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    no_faults(&sim);
}
