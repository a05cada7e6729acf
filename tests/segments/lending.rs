//! Issue 16: tests for pool code that no other test reached (a coverage run of the
//! CPU suite found these lines never executed, so every cargo-mutants mutant on them
//! survived). Each test names the contract it checks (a doc comment of `Pool`,
//! `PoolConfig`, `Snapshot`, `Error`, `docs/ARCHITECTURE.md`, or the simulated
//! driver's documented behaviour); the expected values are reasoned from there, not
//! copied from a run.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use common::{assert_driver_empty, check, no_faults, segment_pool, simulated_pool, MIB};
use flare_package::driver::sim::SimStreamCall;
use flare_package::{
    CrossStreamReuse, CuResult, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SimConfig,
    SleepMode, Stream,
};
use std::path::PathBuf;

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A code no call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

/// A fresh path in the temporary directory for `name`.
fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flare-cover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir.join(name)
}

// ---------------------------------------------------------------- segments.rs

/// `Pool::allocate_raw`: "[`Error::InvalidArgument`] for 0 bytes or a size whose
/// rounding overflows". In segment mode a request is rounded to a 512-byte block
/// (then its handle to the granularity) before anything else: 0 bytes, and sizes
/// within 512 bytes (or within the granularity) of `u64::MAX`, are refused on every
/// entry point (synchronous, stream-ordered, tagged), and nothing reaches the driver.
#[test]
fn segment_mode_refuses_zero_and_overflowing_sizes() {
    let (pool, sim) = segment_pool(1 << 30, 0);
    let s = common::stream(&sim);
    // u64::MAX: its 512-byte rounding overflows. u64::MAX - 1023: rounds to
    // u64::MAX - 511 (a multiple of 512), whose granularity rounding overflows.
    for bytes in [0, u64::MAX, u64::MAX - 1023] {
        for (what, r) in [
            ("sync", pool.allocate_raw(bytes)),
            ("async", pool.allocate_async_raw(bytes, s)),
            ("tagged", pool.allocate_tagged_raw(bytes, None, 3)),
        ] {
            match r {
                Err(Error::InvalidArgument(msg)) => {
                    if bytes == 0 {
                        assert!(msg.contains("0 bytes"), "{what} {bytes}: {msg}");
                    } else {
                        assert!(msg.contains("overflows"), "{what} {bytes}: {msg}");
                    }
                }
                other => panic!("{what} {bytes}: want InvalidArgument, got {other:?}"),
            }
        }
    }
    let snap = check(&pool);
    assert_eq!((snap.live_count, snap.allocations), (0, 0));
    assert_eq!(sim.call_count(DriverCall::Create), 0);
    assert_eq!(sim.call_count(DriverCall::Reserve), 0);
    // The largest size that rounds within range is not refused as invalid: it is
    // above the device's total, `Error::RequestTooLarge`.
    assert!(matches!(
        pool.allocate_raw(u64::MAX - (G - 1) - 511),
        Err(Error::RequestTooLarge { .. })
    ));
    // A small request still works.
    let p = pool.allocate_raw(1).unwrap();
    pool.free_raw(p).unwrap();
    check(&pool);
}

// ---------------------------------------------------------------- mod.rs (trim)

/// `Pool::trim`: "frees the pinned host buffer an offload's wake kept for the next
/// offload sleep"; "Errors: [`Error::Driver`] with the first step the driver
/// refused". `Snapshot::host_kept_bytes`: the buffer a wake kept, which trim frees.
/// When `cuMemFreeHost` refuses it, trim answers `Error::Driver` for that call with
/// the buffer's size, and the pool no longer counts it (left to the driver).
#[test]
fn trim_reports_a_refused_host_buffer_free() {
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let p = pool.allocate_tagged_raw(3 * MIB, None, 5).unwrap();
    assert_eq!(sim.write(p, &[9; 64]), CuResult::SUCCESS);
    pool.sleep(5, SleepMode::Offload).unwrap();
    let asleep = check(&pool);
    // `Pool::sleep`: one pinned buffer "receives every live allocation's requested
    // bytes".
    assert_eq!(asleep.offloaded_bytes, 3 * MIB);
    pool.wake(5).unwrap();
    assert_eq!(sim.read(p, 64).unwrap(), vec![9; 64]);
    let awake = check(&pool);
    assert_eq!((awake.offloaded_bytes, awake.host_kept_bytes), (0, 3 * MIB));
    pool.free_raw(p).unwrap();

    let frees = sim.call_count(DriverCall::HostFree);
    sim.inject_failure(DriverCall::HostFree, 1, FAIL);
    match pool.trim() {
        Err(Error::Driver { source, bytes }) => {
            assert_eq!(source.call, DriverCall::HostFree);
            assert_eq!(source.code, FAIL);
            assert_eq!(bytes, 3 * MIB, "the kept buffer's size");
        }
        other => panic!("want the host free's error, got {other:?}"),
    }
    assert_eq!(sim.call_count(DriverCall::HostFree), frees + 1);
    let after = check(&pool);
    assert_eq!(after.host_kept_bytes, 0, "the buffer is the driver's now");
    // The device memory was released all the same (the release ran first).
    assert_eq!((after.physical_bytes, after.idle_bytes), (0, 0));
    assert_driver_empty(&pool);
    // Nothing left to free: the next trim succeeds without a host free.
    pool.trim().unwrap();
    assert_eq!(sim.call_count(DriverCall::HostFree), frees + 1);
}

// ---------------------------------------------------------------- books.rs

/// `Allocation` (guards.rs): "dropping the guard frees the pointer only while it is
/// still this allocation (not after a `free_raw` of it and a later allocation that
/// reused the address)". Without thread caches (the books' path): a guard whose
/// address was freed with `free_raw` and handed out again frees nothing on drop; the
/// new allocation stays live and is freed once, by its owner.
#[test]
fn a_stale_guard_does_not_free_the_reused_address() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            thread_cache_entries: 0,
            thread_cache_bytes: 0,
            // Idle memory is kept (not released at the free), so the address is
            // reused.
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let a = pool.allocate(3 * MIB).unwrap();
    let p = a.ptr();
    pool.free_raw(p).unwrap();
    // Best fit reuses the idle mapping of the same size: the same address.
    let b = pool.allocate_raw(3 * MIB).unwrap();
    assert_eq!(b, p);
    assert_eq!(pool.snapshot().reuse_hits, 1);
    drop(a);
    let s = check(&pool);
    assert_eq!(
        (s.live_count, s.frees),
        (1, 1),
        "the stale drop freed nothing"
    );
    assert_eq!(s.live_mapped_bytes, 2 * G);
    // Still live: its owner frees it, once.
    pool.free_raw(b).unwrap();
    assert!(matches!(
        pool.free_raw(b),
        Err(Error::UnknownPointer { ptr }) if ptr == b
    ));
    let s = check(&pool);
    assert_eq!((s.live_count, s.frees), (0, 2));
    assert_eq!(sim.call_count(DriverCall::Create), 1);
}

// ---------------------------------------------------------------- streams.rs

/// `Pool::record_stream` and `free_async_raw`: memory used on a recorded stream is
/// released only after a fence on that stream. After the legacy stream, the fence
/// is recorded on the pool's own blocking stream, created on first use
/// (`cuStreamCreate`). When that creation fails, the stream order of the recorded
/// use cannot be tracked: the free is held for a device synchronize instead (no
/// fence, nothing waiting on events), the failure is counted in
/// `Snapshot::stream_call_failures`, and the mapping is not reused on the freeing
/// stream. A later free creates the fence stream then.
#[test]
fn a_failed_fence_stream_creation_holds_the_free() {
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let s = common::stream(&sim);
    let created = sim.stream_call_count(SimStreamCall::StreamCreate);
    let p = pool.allocate_async_raw(3 * MIB, s).unwrap();
    pool.record_stream(p, Stream::LEGACY).unwrap();
    sim.inject_stream_failure(SimStreamCall::StreamCreate, 1, FAIL);
    pool.free_async_raw(p, s).unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamCreate),
        created + 1,
        "the fence stream's creation was tried once"
    );
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1);
    // No fence recorded; the held mapping is counted in `event_wait_bytes` (idle,
    // "reusable ... for release only after" its order is known: here a synchronize).
    assert_eq!(snap.events_outstanding, 0);
    assert_eq!((snap.idle_bytes, snap.event_wait_bytes), (2 * G, 2 * G));
    // Held: not reused on its stream (a new mapping instead).
    let q = pool.allocate_async_raw(3 * MIB, s).unwrap();
    assert_ne!(q, p);
    assert_eq!(pool.snapshot().mappings_created, 2);

    // The next recorded legacy use: the fence stream is created now, and the free
    // waits on a fence recorded there.
    pool.record_stream(q, Stream::LEGACY).unwrap();
    pool.free_async_raw(q, s).unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamCreate),
        created + 2
    );
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1);
    assert_eq!(snap.events_outstanding, 1);
    pool.trim().unwrap();
    check(&pool);
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// `CrossStreamReuse::Wait`: memory freed on one stream serves another stream after
/// `cuStreamWaitEvent` on its fence (`Snapshot::cross_stream_waits`). When the wait
/// is refused, the mapping is not handed out (no order is established): the
/// allocation takes new memory, the failure is counted in `stream_call_failures`,
/// and no wait is counted.
#[test]
fn a_refused_cross_stream_wait_hands_nothing_out() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            cross_stream_reuse: CrossStreamReuse::Wait,
            ..PoolConfig::default()
        },
    );
    let (s1, s2) = (common::stream(&sim), common::stream(&sim));
    let p = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    // Work queued on s1 that the free orders before reuse: the fence stays pending.
    assert_eq!(sim.launch(s1.0, p, 3 * MIB), CuResult::SUCCESS);
    pool.free_async_raw(p, s1).unwrap();
    sim.inject_stream_failure(SimStreamCall::StreamWaitEvent, 1, FAIL);
    let waits = sim.stream_call_count(SimStreamCall::StreamWaitEvent);
    let q = pool.allocate_async_raw(3 * MIB, s2).unwrap();
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamWaitEvent),
        waits + 1
    );
    assert_ne!(q, p, "the refused wait hands nothing out");
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1);
    assert_eq!((snap.cross_stream_waits, snap.cross_stream_hits), (0, 0));
    assert_eq!(snap.mappings_created, 2);
    // Without a failure the next one waits and takes it.
    let r = pool.allocate_async_raw(3 * MIB, s2).unwrap();
    assert_eq!(r, p);
    let snap = check(&pool);
    assert_eq!(snap.cross_stream_waits, 1);
    assert_eq!(snap.mappings_created, 2);
    no_faults(&sim);
}

// ---------------------------------------------------------------- cache.rs

/// `docs/ARCHITECTURE.md`, "Threads": "A cache is registered on a thread's first
/// call (at most 256 per pool; further threads use the books". With 256 threads
/// holding caches, a 257th thread's free of an address a cached thread allocated
/// goes to the books: it is counted (frees, live bytes) and the memory becomes idle
/// in the books, reused by that thread's next allocation of the size.
#[test]
fn a_thread_beyond_the_cache_registry_frees_through_the_books() {
    use std::sync::{Arc, Barrier};
    let (pool, _sim) = simulated_pool(
        64 << 30,
        PoolConfig {
            // Freed memory stays idle (below the threshold), to be seen and reused.
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let pool = Arc::new(pool);
    // The caches serve inside a retention scope.
    pool.retention_begin().unwrap();
    const N: usize = 256;
    let registered = Arc::new(Barrier::new(N + 1));
    let done = Arc::new(Barrier::new(N + 1));
    let mut threads = Vec::new();
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..N {
        let (pool, registered, done, tx) = (
            Arc::clone(&pool),
            Arc::clone(&registered),
            Arc::clone(&done),
            tx.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let p = pool.allocate_raw(MIB).unwrap();
            tx.send(p).unwrap();
            registered.wait();
            // Alive (its cache held) until the extra thread is done.
            done.wait();
        }));
    }
    registered.wait();
    let ptrs: Vec<u64> = rx.iter().take(N).collect();
    let before = check(&pool);
    assert_eq!(before.live_count, N as u64);
    let extra = {
        let pool = Arc::clone(&pool);
        let victim = ptrs[0];
        std::thread::spawn(move || {
            pool.free_raw(victim).unwrap();
            let s = check(&pool);
            assert_eq!(s.live_count, N as u64 - 1);
            assert_eq!(s.frees, 1);
            assert_eq!(s.live_mapped_bytes, (N as u64 - 1) * G);
            assert_eq!(s.idle_bytes, G, "idle in the books");
            // Not a cache's entry: nothing was cached.
            assert_eq!(s.thread_cache_count, 0);
            // Freed again: refused, it is no longer live.
            assert!(matches!(
                pool.free_raw(victim),
                Err(Error::UnknownPointer { .. })
            ));
            let again = pool.allocate_raw(MIB).unwrap();
            assert_eq!(again, victim, "the idle mapping is reused");
            pool.free_raw(again).unwrap();
        })
    };
    extra.join().unwrap();
    done.wait();
    for t in threads {
        t.join().unwrap();
    }
    for p in &ptrs[1..] {
        pool.free_raw(*p).unwrap();
    }
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!(s.live_count, 0);
    assert_eq!(s.frees, N as u64 + 1);
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

// ---------------------------------------------------------------- record.rs

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

// ---------------------------------------------------------------- segments.rs (lends)

/// A segment-mode pool on a 1 GiB simulated device that releases nothing at a free
/// (release threshold 1 GiB; trim releases), and its driver.
fn keeping_segments() -> (Pool, std::sync::Arc<flare_package::SimDriver>) {
    simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    )
}

/// Four 2 MiB blocks and a 4 MiB one, one handle each (a growth maps the need, or an
/// eighth of what is mapped when that is more: never more here);
/// blocks 0 and 2 freed, so their handles are wholly free and alone in their free
/// blocks (their neighbours live): what a 4 MiB growth lends (stitching,
/// `docs/ARCHITECTURE.md`, "Segments"). Returns the live blocks 1, 3 and the 4 MiB.
fn two_lendable_handles(pool: &Pool) -> Vec<u64> {
    let w: Vec<_> = (0..4).map(|_| pool.allocate_raw(G).unwrap()).collect();
    let n1 = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(w[0]).unwrap();
    pool.free_raw(w[2]).unwrap();
    vec![w[1], w[3], n1]
}

/// A growth lends handles in turn, mapping each again at the segment's end
/// (`cuMemMap`, then `cuMemSetAccess`). Once one lend is refused the growth fails
/// with that error (`Pool::allocate_raw`: "[`Error::Driver`] with the step the driver
/// refused"), and the lends after it are not tried: exactly one map call, no handle
/// created, nothing left lent. Both handles stay where they were, so the next 4 MiB
/// request lends both and creates nothing.
#[test]
fn after_a_refused_lend_the_next_lends_are_not_tried() {
    let (pool, sim) = keeping_segments();
    let live = two_lendable_handles(&pool);
    let (maps, creates) = (
        sim.call_count(DriverCall::Map),
        sim.call_count(DriverCall::Create),
    );
    sim.inject_failure(DriverCall::Map, 1, FAIL);
    match pool.allocate_raw(4 * MIB) {
        Err(Error::Driver { source, .. }) => {
            assert_eq!((source.call, source.code), (DriverCall::Map, FAIL))
        }
        other => panic!("want the map's error, got {other:?}"),
    }
    assert_eq!(sim.call_count(DriverCall::Map), maps + 1, "one lend tried");
    assert_eq!(sim.call_count(DriverCall::Create), creates);
    let s = check(&pool);
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (0, 0));
    // One handle per growth, each the need (4 MiB for the 4 MiB block).
    assert_eq!((s.segment_handles, s.physical_bytes), (5, 12 * MIB));
    assert_eq!(s.block_free_bytes, 2 * G);
    // Nothing was lost: the retry lends both handles.
    let n2 = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!(sim.call_count(DriverCall::Create), creates, "no new handle");
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (2, 4 * MIB));
    assert_eq!(s.physical_bytes, 12 * MIB);
    for p in live.into_iter().chain([n2]) {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// A lend whose access grant is refused (`cuMemSetAccess`) is undone: the new
/// mapping never had access, so it is unmapped at once (one `cuMemUnmap`), and the
/// handle is not lent (`segment_handles_lent` 0: only a retired mapping the driver
/// refused to unmap would count). The growth fails with the set-access error; the
/// handle is lendable again.
#[test]
fn a_lend_refused_access_is_unmapped_and_not_lent() {
    let (pool, sim) = keeping_segments();
    let w1 = pool.allocate_raw(G).unwrap();
    let w2 = pool.allocate_raw(G).unwrap();
    let n1 = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(w1).unwrap();
    let (unmaps, access) = (
        sim.call_count(DriverCall::Unmap),
        sim.call_count(DriverCall::SetAccess),
    );
    sim.inject_failure(DriverCall::SetAccess, 1, FAIL);
    match pool.allocate_raw(4 * MIB) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::SetAccess),
        other => panic!("want the set-access error, got {other:?}"),
    }
    assert_eq!(sim.call_count(DriverCall::SetAccess), access + 1);
    assert_eq!(
        sim.call_count(DriverCall::Unmap),
        unmaps + 1,
        "the lend undone"
    );
    let s = check(&pool);
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (0, 0));
    assert_eq!(sim.state().mappings, 3, "the handles of w1, w2 and n1");
    // The retry lends w1's handle and maps one new 2 MiB handle after it.
    let n2 = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (1, G));
    for p in [w2, n1, n2] {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// `docs/ARCHITECTURE.md`, "Segments": a lent handle keeps its old mapping,
/// retired, "until the handle's release"; at release a wholly free handle is
/// "unmapped (its retired mapping first), released". `Pool::trim`: "Errors:
/// [`Error::Driver`] with the first step the driver refused"; what was refused stays
/// held and is retried by the next release point. With the two lent handles of a
/// stitched 4 MiB block wholly free:
/// - the first unmap refused is a retired mapping's: that handle stays whole (both
///   mappings, still lent); the other lent handle is released (two unmaps);
/// - at the next trim its retired mapping is unmapped and its own mapping refused:
///   it is no longer lent, still mapped once;
/// - the trim after unmaps only its own mapping (one call: the retired one is gone)
///   and releases it. Nothing faults and the books match the driver throughout.
#[test]
fn a_lent_handle_whose_unmaps_are_refused_is_released_in_steps() {
    let (pool, sim) = keeping_segments();
    let live = two_lendable_handles(&pool);
    let n2 = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.segment_handles_lent), (5, 2));
    pool.free_raw(n2).unwrap();

    let u = sim.call_count(DriverCall::Unmap);
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    match pool.trim() {
        Err(Error::Driver { source, bytes }) => {
            assert_eq!((source.call, bytes), (DriverCall::Unmap, G))
        }
        other => panic!("want the unmap's error, got {other:?}"),
    }
    assert_eq!(sim.call_count(DriverCall::Unmap), u + 3);
    let s = check(&pool);
    assert_eq!(
        (
            s.segment_handles,
            s.segment_handles_lent,
            s.segment_lent_bytes
        ),
        (4, 1, G)
    );
    assert_eq!((s.physical_bytes, s.block_free_bytes), (10 * MIB, G));
    assert_eq!(s.unmap_failures, 1);
    // Three live handles, and the lent one at both addresses.
    assert_eq!(sim.state().mappings, 5);

    let u = sim.call_count(DriverCall::Unmap);
    sim.inject_failure(DriverCall::Unmap, 2, FAIL);
    assert!(matches!(
        pool.trim(),
        Err(Error::Driver { source, .. }) if source.call == DriverCall::Unmap
    ));
    assert_eq!(sim.call_count(DriverCall::Unmap), u + 2);
    let s = check(&pool);
    assert_eq!(
        (
            s.segment_handles,
            s.segment_handles_lent,
            s.segment_lent_bytes
        ),
        (4, 0, 0)
    );
    assert_eq!((s.physical_bytes, s.unmap_failures), (10 * MIB, 2));
    assert_eq!(sim.state().mappings, 4);

    let u = sim.call_count(DriverCall::Unmap);
    pool.trim().unwrap();
    assert_eq!(sim.call_count(DriverCall::Unmap), u + 1);
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (3, 8 * MIB));
    assert_eq!(s.block_free_bytes, 0);
    for p in live {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    check(&pool);
    assert_driver_empty(&pool);
    no_faults(&sim);
}

// ---------------------------------------------------------------- release.rs (pending)

/// A failed growth's undo that the driver refuses is kept pending (`Snapshot`:
/// `pending_count`, `pending_bytes`: "a pending leftover that is still mapped
/// always still holds its handle") and retried at each release point (`release.rs`:
/// "what a refused step leaves is kept ... pending and retried at the next release
/// point"). A retry whose unmap is refused again keeps it pending, and `Pool::trim`
/// reports the unmap; the next trim releases it and the driver holds nothing.
#[test]
fn a_pending_leftover_refused_again_stays_pending() {
    let (pool, sim) = keeping_segments();
    // The growth's new handle: mapped, access refused, unmap refused.
    sim.inject_failure(DriverCall::SetAccess, 1, FAIL);
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    match pool.allocate_raw(G) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::SetAccess),
        other => panic!("want the set-access error, got {other:?}"),
    }
    let s = check(&pool);
    assert_eq!((s.pending_count, s.pending_bytes), (1, G));
    assert_eq!((s.live_count, s.physical_bytes), (0, G));
    assert_eq!(sim.state().mappings, 1);

    let u = sim.call_count(DriverCall::Unmap);
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    match pool.trim() {
        Err(Error::Driver { source, bytes }) => {
            assert_eq!((source.call, bytes), (DriverCall::Unmap, G))
        }
        other => panic!("want the unmap's error, got {other:?}"),
    }
    assert_eq!(sim.call_count(DriverCall::Unmap), u + 1);
    let s = check(&pool);
    assert_eq!((s.pending_count, s.pending_bytes), (1, G), "still pending");
    assert_eq!(sim.state().mappings, 1);

    pool.trim().unwrap();
    assert_eq!(sim.call_count(DriverCall::Unmap), u + 2);
    let s = check(&pool);
    assert_eq!(
        (s.pending_count, s.pending_bytes, s.physical_bytes),
        (0, 0, 0)
    );
    assert_driver_empty(&pool);
    no_faults(&sim);
}

// ---------------------------------------------------------------- mod.rs (miss)

/// `Pool::allocate_raw` on out-of-memory (the miss path): a forced reuse of idle
/// memory the caller may take, then "a release of what is idle, `retake` under the
/// lock, and `create` once more". Memory freed on a stream whose work is still
/// queued cannot serve the synchronous caller before the release point's device
/// synchronize; when that release's unmap is refused, the mapping stays idle (its
/// work now complete) and the retake hands it out: the allocation succeeds with it,
/// one out-of-memory retry counted, no second mapping.
#[test]
fn an_oom_retry_takes_what_the_release_could_not_release() {
    let (pool, sim) = simulated_pool(
        6 * MIB,
        PoolConfig {
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let s = common::stream(&sim);
    let p = pool.allocate_async_raw(4 * MIB, s).unwrap();
    assert_eq!(sim.launch(s.0, p, 4 * MIB), CuResult::SUCCESS);
    pool.free_async_raw(p, s).unwrap();
    // 4 + 4 MiB do not fit in 6: the create is out of memory; the release point
    // synchronizes the device, then its unmap of p is refused.
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    let q = pool.allocate_raw(4 * MIB).expect("the retake serves it");
    assert_eq!(q, p);
    let snap = check(&pool);
    assert_eq!(snap.oom_retries, 1);
    assert_eq!((snap.mappings_created, snap.unmap_failures), (1, 1));
    assert_eq!((snap.live_count, snap.idle_count), (1, 0));
    pool.free_raw(q).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

// ---------------------------------------------------------------- release.rs (retries)

/// `Pool::free_async_raw`: "No host synchronization, ever"; `Pool::free_raw`'s
/// release synchronizes the device. A synchronous free whose release was refused
/// (`cuMemUnmap`) leaves its mapping idle for a retry at the next release point
/// (`release.rs`: "kept idle-for-retry ... and retried at the next release point").
/// Its release needs a device synchronize, so the stream-ordered frees' release
/// points (which release what their fences say is complete) keep it for later,
/// without synchronizing; the next synchronous free's release retries it: two
/// unmaps (its own mapping and the retried one) after one synchronize.
#[test]
fn a_refused_synchronous_release_waits_for_a_synchronizing_release_point() {
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let a = pool.allocate_raw(3 * MIB).unwrap();
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    pool.free_raw(a).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.idle_count, snap.idle_bytes), (1, 2 * G));
    assert_eq!(snap.unmap_failures, 1);

    // Stream-ordered frees, the device completing the stream's work between them:
    // their fences complete, and their release points release that memory.
    let s = common::stream(&sim);
    let syncs = sim.call_count(DriverCall::Synchronize);
    let released = snap.mappings_released;
    let bs: Vec<_> = (0..8)
        .map(|_| pool.allocate_async_raw(5 * MIB, s).unwrap())
        .collect();
    for b in bs {
        pool.free_async_raw(b, s).unwrap();
        assert_eq!(sim.stream_complete(s.0), CuResult::SUCCESS);
    }
    let snap = check(&pool);
    assert!(
        snap.mappings_released > released,
        "a stream-ordered release point ran: {snap:#?}"
    );
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        syncs,
        "no device synchronize for a stream-ordered free"
    );
    // `a`'s 4 MiB mapping is still idle (the streams' mappings are 6 MiB).
    assert_eq!(snap.idle_bytes % (6 * MIB), 2 * G, "{snap:#?}");

    let c = pool.allocate_raw(MIB).unwrap();
    let unmaps = sim.call_count(DriverCall::Unmap);
    pool.free_raw(c).unwrap();
    assert_eq!(sim.call_count(DriverCall::Synchronize), syncs + 1);
    assert_eq!(
        sim.call_count(DriverCall::Unmap),
        unmaps + 2,
        "c's mapping and the retried one"
    );
    let snap = check(&pool);
    assert_eq!(snap.idle_bytes % (6 * MIB), 0, "{snap:#?}");
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

// ---------------------------------------------------------------- streams.rs (fences)

/// `CrossStreamReuse::Wait`: a mapping freed on another stream is taken after
/// `cuStreamWaitEvent` on a fence covering its free, recorded then if none does
/// yet. When that fence cannot be recorded (`cuEventRecord` refused), nothing can
/// order the new stream after the free: the mapping is not handed out (its work is
/// still queued), the allocation takes new memory, and the failure is counted in
/// `stream_call_failures`. The next allocation waits on a fence and takes it.
#[test]
fn a_cross_stream_wait_without_a_fence_hands_nothing_out() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            cross_stream_reuse: CrossStreamReuse::Wait,
            // No release at a free, so no free's poll records a fence first.
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let (s1, s2) = (common::stream(&sim), common::stream(&sim));
    let p = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    // Queued work the free orders before reuse (so no poll finds it complete).
    assert_eq!(sim.launch(s1.0, p, 3 * MIB), CuResult::SUCCESS);
    pool.free_async_raw(p, s1).unwrap();
    assert_eq!(pool.snapshot().events_outstanding, 0, "no fence yet");
    let records = sim.stream_call_count(SimStreamCall::EventRecord);
    sim.inject_stream_failure(SimStreamCall::EventRecord, 1, FAIL);
    let q = pool.allocate_async_raw(3 * MIB, s2).unwrap();
    assert!(sim.stream_call_count(SimStreamCall::EventRecord) > records);
    assert_ne!(q, p, "not handed out without a fence");
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1);
    assert_eq!((snap.cross_stream_waits, snap.cross_stream_hits), (0, 0));
    assert_eq!(snap.mappings_created, 2);
    let r = pool.allocate_async_raw(3 * MIB, s2).unwrap();
    assert_eq!(r, p);
    let snap = check(&pool);
    assert_eq!((snap.cross_stream_waits, snap.mappings_created), (1, 2));
    no_faults(&sim);
}

/// `Pool::free_async_raw` during a capture, of memory also used (`record_stream`) on
/// a stream that another capture is capturing: "Used by a graph being captured on
/// `s`: the graph may replay into it, so it becomes that capture's memory" (kept
/// for that capture: `Snapshot::capture_held_bytes`, a second capture seen). It
/// waits on no fence of the freeing capture's (no stream) bucket: nothing is counted
/// in `event_wait_bytes` and no event is recorded. Once both captures ended, trim
/// releases it.
#[test]
fn a_free_recorded_on_another_capture_becomes_that_captures_memory() {
    use flare_package::driver::sim::CaptureMode;
    let (pool, sim) = simulated_pool(1 << 30, PoolConfig::default());
    let (s1, s2) = (common::stream(&sim), common::stream(&sim));
    let p = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    pool.record_stream(p, s2).unwrap();
    for s in [s1, s2] {
        assert_eq!(
            sim.stream_begin_capture(s.0, CaptureMode::Relaxed),
            CuResult::SUCCESS
        );
    }
    let records = sim.stream_call_count(SimStreamCall::EventRecord);
    pool.free_async_raw(p, s1).unwrap();
    assert_eq!(sim.stream_call_count(SimStreamCall::EventRecord), records);
    let snap = check(&pool);
    assert_eq!(snap.captures_seen, 2, "both captures seen");
    assert_eq!((snap.capture_held_bytes, snap.event_wait_bytes), (2 * G, 0));
    assert_eq!((snap.idle_bytes, snap.events_outstanding), (2 * G, 0));
    // Kept for s2's capture: an allocation on s1 (its own capture) does not take it.
    let q = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    assert_ne!(q, p);
    pool.free_async_raw(q, s1).unwrap();
    for s in [s1, s2] {
        assert!(sim.stream_end_capture(s.0).is_success());
    }
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.capture_held_bytes, snap.physical_bytes), (0, 0));
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// Memory freed during a capture while also used (`record_stream`) on another,
/// uncaptured stream is the capture's, reused by it only once that stream's fence
/// completes. A release point whose wait on that fence fails
/// (`cuEventSynchronize` refused) cannot confirm it; memory of a capture "stays its
/// capture's (its graph may replay into it), released with that capture's memory
/// after a device synchronize". The out-of-memory release keeps captures' memory
/// (`Pool::allocate_raw`: the release before the retry; `docs/ARCHITECTURE.md`:
/// capture-held memory is released at the scope's close, trim or destroy): so the
/// allocation that needed it fails with `Error::OutOfMemory`, the memory counted in
/// `capture_held_bytes`, and trim (after the capture) releases it.
#[test]
fn an_unconfirmed_free_of_a_capture_stays_the_captures() {
    use flare_package::driver::sim::CaptureMode;
    let (pool, sim) = simulated_pool(
        8 * MIB,
        PoolConfig {
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let (s1, s2) = (common::stream(&sim), common::stream(&sim));
    let p = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    pool.record_stream(p, s2).unwrap();
    // Work on s2 still queued: no query finds its fence complete.
    assert_eq!(sim.launch(s2.0, p, 3 * MIB), CuResult::SUCCESS);
    assert_eq!(
        sim.stream_begin_capture(s1.0, CaptureMode::Relaxed),
        CuResult::SUCCESS
    );
    pool.free_async_raw(p, s1).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.captures_seen, 1);
    assert_eq!(snap.event_wait_bytes, 2 * G, "waiting on s2's fence");
    assert!(sim.stream_end_capture(s1.0).is_success());

    sim.inject_stream_failure(SimStreamCall::EventSynchronize, 1, FAIL);
    match pool.allocate_raw(6 * MIB) {
        Err(Error::OutOfMemory { .. }) => {}
        other => panic!("want out-of-memory, got {other:?}"),
    }
    let snap = check(&pool);
    assert_eq!(snap.oom_retries, 1);
    assert_eq!(snap.stream_call_failures, 1);
    assert_eq!((snap.capture_held_bytes, snap.event_wait_bytes), (2 * G, 0));
    assert_eq!((snap.idle_bytes, snap.physical_bytes), (2 * G, 2 * G));

    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.capture_held_bytes, snap.physical_bytes), (0, 0));
    // Now it fits.
    let q = pool.allocate_raw(6 * MIB).unwrap();
    pool.free_raw(q).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// Stitching lends free handles "largest first while they fit in `need`"
/// (`docs/ARCHITECTURE.md`, "Segments": a growth lends the heap's free handles whose
/// free block is exactly their range; a request larger than any free block is
/// served partly by memory already held, "with a new handle for the rest"). A
/// 6 MiB request over two lone free 4 MiB handles lends one (4 MiB fits in 6); the
/// other does not fit in the 2 MiB left and is skipped; one new 2 MiB handle
/// covers the rest: one handle created, one lent, 2 MiB more physical memory.
#[test]
fn a_lend_skips_a_handle_larger_than_what_is_left() {
    let (pool, sim) = keeping_segments();
    // One handle per growth, each the request's size (never less than an eighth of
    // what is mapped): 4, 2, 4, 2 MiB back to back.
    let x1 = pool.allocate_raw(4 * MIB).unwrap();
    let y1 = pool.allocate_raw(G).unwrap();
    let x2 = pool.allocate_raw(4 * MIB).unwrap();
    let y2 = pool.allocate_raw(G).unwrap();
    assert_eq!(check(&pool).segment_handles, 4);
    pool.free_raw(x1).unwrap();
    pool.free_raw(x2).unwrap();
    let created = sim.call_count(DriverCall::Create);
    let n = pool.allocate_raw(6 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!(sim.call_count(DriverCall::Create), created + 1);
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (1, 4 * MIB));
    assert_eq!((s.segment_handles, s.physical_bytes), (5, 14 * MIB));
    // The other 4 MiB handle is still a free block.
    assert_eq!(s.block_free_bytes, 4 * MIB);
    for p in [y1, y2, n] {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

// ---------------------------------------------------------------- segments.rs (races)

use common::hooked;

/// A segment-mode pool on a [`hooked::Hooked`] default simulated driver, shared.
fn hooked_segments() -> (
    std::sync::Arc<Pool>,
    std::sync::Arc<hooked::Hooked>,
    std::sync::Arc<flare_package::SimDriver>,
) {
    use std::sync::Arc;
    let sim = Arc::new(flare_package::SimDriver::new(SimConfig::default()));
    let driver = hooked::Hooked::new(sim.clone());
    let pool = Pool::with_driver(
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
        driver.clone(),
    )
    .expect("a pool on the hooked driver");
    (Arc::new(pool), driver, sim)
}

/// Segment growth (`docs/ARCHITECTURE.md`, "Segments": a heap's blocks are carved
/// from reserved ranges, a new segment reserved only when the heap has no room).
/// Two threads' first allocations of the synchronous heap race: both see no
/// segment; the second reserves one and grows first, while the first is inside its
/// `cuMemAddressReserve`. The first then finds room in the second's segment, uses
/// it, and gives its own reservation back (`cuMemAddressFree`): one segment, one
/// reservation with the driver. When that free is refused, the reservation is kept
/// pending (`pending_count`, its bytes in `reserved_bytes`), and trim frees it.
#[test]
fn a_reservation_made_while_another_growth_made_room_is_given_back() {
    for refuse in [false, true] {
        let (pool, driver, sim) = hooked_segments();
        let weak = std::sync::Arc::downgrade(&pool);
        let other = std::sync::Arc::new(std::sync::Mutex::new(None));
        let got = other.clone();
        driver.arm(DriverCall::Reserve, None, move || {
            let pool = weak.upgrade().expect("the pool");
            let p = std::thread::spawn(move || pool.allocate_raw(G).unwrap())
                .join()
                .unwrap();
            *got.lock().unwrap() = Some(p);
        });
        if refuse {
            sim.inject_failure(DriverCall::FreeReservation, 1, FAIL);
        }
        let a = pool.allocate_raw(G).unwrap();
        let b = other.lock().unwrap().take().expect("the other thread's");
        assert_ne!(a, b);
        assert_eq!(sim.call_count(DriverCall::Reserve), 2, "both reserved");
        assert_eq!(sim.call_count(DriverCall::FreeReservation), 1);
        let s = check(&pool);
        assert_eq!((s.segment_count, s.live_count), (1, 2));
        let reserve = sim.mem_get_info().unwrap().total;
        if refuse {
            assert_eq!((s.pending_count, s.pending_bytes), (1, 0), "{s:#?}");
            assert_eq!(s.reserved_bytes, 2 * reserve);
            assert_eq!(sim.state().reservations, 2);
            pool.trim().unwrap();
            assert_eq!(sim.call_count(DriverCall::FreeReservation), 2);
        }
        let s = check(&pool);
        assert_eq!((s.pending_count, s.reserved_bytes), (0, reserve));
        assert_eq!(sim.state().reservations, 1);
        pool.free_raw(a).unwrap();
        pool.free_raw(b).unwrap();
        pool.trim().unwrap();
        assert_driver_empty(&pool);
        no_faults(&sim);
    }
}

/// Segment growth, "counting the free block already there" (`docs/ARCHITECTURE.md`,
/// "Segments": a miss maps one new whole handle at the segment's end, counting the
/// free block at the end). When another thread carves that end block while the
/// growth creates its handle, the growth's memory no longer covers the request
/// (the new handle stays, free); after two such losses the third growth maps the
/// whole request by itself. Here (blocks above 1 MiB, so all in the synchronous
/// API's heap) a 3.5 MiB request over a 1.5 MiB end block maps 2 MiB, loses the end
/// block, maps 2 MiB more over the first growth's block, loses that too, and then
/// maps 4 MiB (3.5 MiB rounded to the granularity) alone: three handles, 12 MiB
/// mapped in all.
#[test]
fn a_growth_that_loses_its_end_block_twice_grows_alone() {
    use std::sync::Arc;
    const K: u64 = 1024;
    let (pool, driver, sim) = hooked_segments();
    // Handle [0, 4) MiB: block x = [0, 2.5), free [2.5, 4).
    let x = pool.allocate_raw(2 * MIB + 512 * K).unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.block_free_bytes), (1, MIB + 512 * K));
    let taken = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (weak, got, d2) = (Arc::downgrade(&pool), taken.clone(), driver.clone());
    driver.arm(DriverCall::Create, None, move || {
        let pool = weak.upgrade().expect("the pool");
        let (p1, got1) = (pool.clone(), got.clone());
        // Carves the 1.5 MiB end block the first growth counted on.
        let t1 = std::thread::spawn(move || p1.allocate_raw(MIB + 512 * K).unwrap())
            .join()
            .unwrap();
        got1.lock().unwrap().push(t1);
        let weak = Arc::downgrade(&pool);
        d2.arm(DriverCall::Create, None, move || {
            let pool = weak.upgrade().expect("the pool");
            // Carves the first growth's 2 MiB block the second growth counted on.
            let t2 = std::thread::spawn(move || pool.allocate_raw(G).unwrap())
                .join()
                .unwrap();
            got.lock().unwrap().push(t2);
        });
    });
    let creates = sim.call_count(DriverCall::Create);
    let n = pool.allocate_raw(3 * MIB + 512 * K).unwrap();
    let others = taken.lock().unwrap().clone();
    assert_eq!(others.len(), 2, "both hooks ran");
    assert_eq!(others[0], x + 2 * MIB + 512 * K, "the end block");
    assert_eq!(others[1], x + 4 * MIB, "the first growth's block");
    assert_eq!(sim.call_count(DriverCall::Create), creates + 3);
    // The third growth's handle [8, 12) coalesces with the free [6, 8) before it:
    // the carve takes the start of that 6 MiB free block.
    assert_eq!(n, x + 6 * MIB);
    let s = check(&pool);
    assert_eq!(s.segment_handles, 4);
    // 4 + 2 + 2 + 4 MiB mapped; live 2.5 + 1.5 + 2 + 3.5 MiB; free: [9.5, 12).
    assert_eq!(s.physical_bytes, 12 * MIB);
    assert_eq!(s.live_count, 4);
    assert_eq!(s.block_free_bytes, 2 * MIB + 512 * K);
    for p in [x, n].into_iter().chain(others) {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// `CrossStreamReuse::Wait` takes a mapping freed on another stream "after
/// `cuStreamWaitEvent` on its fence"; a fence the pool has already seen complete
/// orders nothing (`Snapshot::events_outstanding` no longer counts it): the mapping
/// is handed out with no wait (`cross_stream_hits`, not `cross_stream_waits`).
/// Here s1's fence is recorded for memory freed on s3 that was used on s1
/// (`record_stream`), and seen complete by an allocation on s2 that waited for
/// nothing of s1 (it fit nothing there); s1's own freed mapping is then taken by s2
/// without a `cuStreamWaitEvent`.
#[test]
fn a_cross_stream_take_after_a_completed_fence_does_not_wait() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            cross_stream_reuse: CrossStreamReuse::Wait,
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let (s1, s2, s3) = (
        common::stream(&sim),
        common::stream(&sim),
        common::stream(&sim),
    );
    let p = pool.allocate_async_raw(3 * MIB, s1).unwrap();
    pool.free_async_raw(p, s1).unwrap();
    let d = pool.allocate_async_raw(7 * MIB, s3).unwrap();
    pool.record_stream(d, s1).unwrap();
    pool.free_async_raw(d, s3).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.events_outstanding, 1, "s1's fence, for d");
    // Fits neither p nor d: polls d's fence (complete: no work was queued).
    let big = pool.allocate_async_raw(20 * MIB, s2).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.events_outstanding, 0, "s1's fence seen complete");
    let waits = sim.stream_call_count(SimStreamCall::StreamWaitEvent);
    let r = pool.allocate_async_raw(3 * MIB, s2).unwrap();
    assert_eq!(r, p);
    assert_eq!(
        sim.stream_call_count(SimStreamCall::StreamWaitEvent),
        waits,
        "no wait"
    );
    let snap = check(&pool);
    assert_eq!((snap.cross_stream_waits, snap.cross_stream_hits), (0, 1));
    for (q, s) in [(r, s2), (big, s2)] {
        pool.free_async_raw(q, s).unwrap();
    }
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}

/// `docs/ARCHITECTURE.md`, "Segments": a segment reserves the device's total (so a
/// heap's growth never runs out of address range while the device has memory),
/// and "a heap has more than one segment when ... one ran out of room"
/// (`collect_heap_of`). On an 8 MiB device: four 2 MiB blocks fill the first
/// segment; the first block's handle released by trim leaves a hole below the live
/// top block, so the growing end stays at the top and the next 2 MiB growth
/// reserves a second segment. Trim then releases the wholly free handles of both
/// segments, each from its own segment, and keeps both reservations (they stay for
/// regrowth until destroy).
#[test]
fn a_heap_of_two_segments_releases_the_free_handles_of_both() {
    let (pool, sim) = simulated_pool(
        8 * MIB,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let w: Vec<_> = (0..4).map(|_| pool.allocate_raw(G).unwrap()).collect();
    assert_eq!(check(&pool).segment_count, 1);
    pool.free_raw(w[0]).unwrap();
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (3, 6 * MIB));
    let e = pool.allocate_raw(G).unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_count, s.segment_handles), (2, 4));
    assert_eq!(sim.state().reservations, 2);
    assert!(e < w[0] || e >= w[3] + G, "outside the first segment");
    // One free handle in each segment.
    pool.free_raw(w[1]).unwrap();
    pool.free_raw(e).unwrap();
    let unmaps = sim.call_count(DriverCall::Unmap);
    pool.trim().unwrap();
    assert_eq!(sim.call_count(DriverCall::Unmap), unmaps + 2);
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (2, 4 * MIB));
    assert_eq!((s.segment_count, s.block_free_bytes), (2, 0));
    pool.free_raw(w[2]).unwrap();
    pool.free_raw(w[3]).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    no_faults(&sim);
}
