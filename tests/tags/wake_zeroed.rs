//! The zeroing wake (issue 34) on the simulated driver: after a discard sleep,
//! `Pool::wake_zeroed` sets exactly the requested bytes of each live allocation of
//! the tag to zero (whole mappings and segment blocks; not the rest of a mapping, a
//! block's rounding, nor the heap's free space), with one `cuMemsetD8Async` each on
//! the caller's stream, counted in the census; a wake from an offload sleep zeroes
//! nothing; a refused memset leaves the tag awake with the error; a bad stream or a
//! tag that does not sleep is refused with nothing done.
//!
//! The simulated device hands out new physical memory holding stale bytes
//! (`SIM_STALE_BYTE`, 0xFF), as a GPU may (NVIDIA documents no initial contents), so
//! a zeroing wake that did not zero reads 0xFF here and fails these tests.

use crate::common;

use common::{check, no_faults, simulated_pool, GIB, MIB};
use flare_package::driver::sim::{SimDriver, CU_STREAM_DEFAULT, SIM_STALE_BYTE};
use flare_package::{
    CaptureMode, CuResult, DevicePtr, DriverCall, DriverError, Error, Pool, PoolConfig,
    ReusePolicy, SleepMode, Stream,
};

const G: u64 = 2 * MIB;

/// A byte pattern with no zero and no 0xFF byte, different per seed.
fn pattern(seed: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((seed * 31 + i * 7) % 250) as u8 + 1)
        .collect()
}

fn fill(sim: &SimDriver, ptr: DevicePtr, seed: u64, len: u64) {
    assert_eq!(sim.write(ptr, &pattern(seed, len)), CuResult::SUCCESS);
}

/// Whether every byte of `[ptr, ptr + len)` is `value`.
#[track_caller]
fn all(sim: &SimDriver, ptr: DevicePtr, len: u64, value: u8) -> bool {
    sim.read(ptr, len)
        .expect("mapped with access")
        .iter()
        .all(|&b| b == value)
}

fn best_fit() -> (Pool, std::sync::Arc<SimDriver>) {
    simulated_pool(GIB, PoolConfig::default().with_policy(ReusePolicy::BestFit))
}

fn segments() -> (Pool, std::sync::Arc<SimDriver>) {
    simulated_pool(
        GIB,
        PoolConfig::default().with_policy(ReusePolicy::Segments),
    )
}

/// A created (non-blocking) stream of the simulated device.
fn stream(sim: &SimDriver) -> Stream {
    Stream(sim.stream_create().expect("a stream"))
}

/// Tag 5 holds three whole mappings (3 MiB + 100 bytes maps 4 MiB; 1000 bytes and
/// 2 MiB map 2 MiB each), each filled with a pattern over its whole mapping; tag 6
/// holds one. After a discard sleep and a zeroing wake on a stream: each requested
/// byte of tag 5 reads 0; the rest of each mapping (new memory nobody wrote) reads
/// stale; one memset per allocation is queued on that stream, over exactly its
/// requested bytes; the census counts them; tag 6 is untouched. A second round adds
/// as much.
#[test]
fn a_zeroing_wake_zeroes_the_requested_bytes_of_each_whole_mapping() {
    let (pool, sim) = best_fit();
    let sizes = [3 * MIB + 100, 1000, 2 * MIB];
    let mapped = [4 * MIB, G, G];
    let ptrs: Vec<DevicePtr> = sizes
        .iter()
        .map(|&n| pool.allocate_tagged_raw(n, None, 5).unwrap())
        .collect();
    let other = pool.allocate_tagged_raw(MIB, None, 6).unwrap();
    fill(&sim, other, 60, G);
    let requested: u64 = sizes.iter().sum();
    for round in 1..=2u64 {
        for (i, &p) in ptrs.iter().enumerate() {
            fill(&sim, p, i as u64, mapped[i]);
        }
        pool.sleep(5, SleepMode::Discard).unwrap();
        let s = stream(&sim);
        pool.wake_zeroed(5, s).unwrap();
        for (i, &p) in ptrs.iter().enumerate() {
            assert!(all(&sim, p, sizes[i], 0), "round {round}: allocation {i}");
            let tail = mapped[i] - sizes[i];
            assert!(
                all(&sim, p + sizes[i], tail, SIM_STALE_BYTE),
                "round {round}: past the request of allocation {i}: not zeroed"
            );
        }
        // Queued on the caller's stream, one per allocation, over its request.
        let mut work: Vec<(u64, DevicePtr, u64)> = sim
            .queued_work()
            .iter()
            .map(|w| (w.stream, w.ptr, w.bytes))
            .collect();
        work.sort();
        let mut want: Vec<(u64, DevicePtr, u64)> = ptrs
            .iter()
            .zip(&sizes)
            .map(|(&p, &n)| (s.0, p, n))
            .collect();
        want.sort();
        assert_eq!(work, want, "round {round}");
        assert_eq!(sim.call_count(DriverCall::MemsetD8Async), 3 * round);
        let c = pool.tag_census(5);
        assert!(!c.sleeping);
        assert_eq!(c.zeroed_bytes, round * requested);
        assert_eq!(c.zero_memsets, round * 3);
        assert_eq!(sim.stream_complete(s.0), CuResult::SUCCESS);
    }
    let c6 = pool.tag_census(6);
    assert_eq!((c6.zeroed_bytes, c6.zero_memsets), (0, 0));
    assert!(
        sim.read(other, G).unwrap() == pattern(60, G),
        "tag 6 changed"
    );
    check(&pool);
    no_faults(&sim);
}

/// Segment mode: tag 3's blocks of 3000, 100 000 and 40 000 bytes (sizes 3072,
/// 100 352 and 40 448) in one 2 MiB handle of its heap; the middle one freed. The
/// whole handle is filled with a pattern. After a discard sleep and a zeroing wake:
/// the live blocks' requested bytes read 0; their rounding tails, the freed block
/// and the rest of the handle read stale (no caller owns them); two memsets.
#[test]
fn a_zeroing_wake_zeroes_each_live_block_and_not_the_free_space() {
    let (pool, sim) = segments();
    let sizes = [3000u64, 100_000, 40_000];
    let ptrs: Vec<DevicePtr> = sizes
        .iter()
        .map(|&n| pool.allocate_tagged_raw(n, None, 3).unwrap())
        .collect();
    assert_eq!(ptrs[1], ptrs[0] + 3072);
    assert_eq!(ptrs[2], ptrs[1] + 100_352);
    assert_eq!(pool.tag_census(3).physical_bytes, G);
    let base = ptrs[0];
    fill(&sim, base, 9, G);
    pool.free_raw(ptrs[1]).unwrap();
    pool.sleep(3, SleepMode::Discard).unwrap();
    pool.wake_zeroed(3, Stream::LEGACY).unwrap();
    let got = sim.read(base, G).unwrap();
    let live = |a: u64| {
        [0usize, 2]
            .iter()
            .any(|&i| (ptrs[i]..ptrs[i] + sizes[i]).contains(&(base + a)))
    };
    let wrong = (0..G).find(|&a| got[a as usize] != if live(a) { 0 } else { SIM_STALE_BYTE });
    assert_eq!(wrong, None, "byte at offset {wrong:?} of the handle");
    let c = pool.tag_census(3);
    assert_eq!((c.zeroed_bytes, c.zero_memsets), (43_000, 2));
    assert_eq!(sim.call_count(DriverCall::MemsetD8Async), 2);
    assert!(
        sim.queued_work().iter().all(|w| w.stream == 0),
        "on the legacy stream"
    );
    check(&pool);
    for i in [0, 2] {
        pool.free_raw(ptrs[i]).unwrap();
    }
    no_faults(&sim);
}

/// Tag 0 in segment mode (the untagged functions' blocks) sleeps and wakes zeroed
/// like any tag; its census counts it.
#[test]
fn tag_0_wakes_zeroed_in_segment_mode() {
    let (pool, sim) = segments();
    let a = pool.allocate_raw(5000).unwrap();
    let b = pool.allocate_raw(3 * MIB).unwrap();
    fill(&sim, a, 1, 5000);
    fill(&sim, b, 2, 3 * MIB);
    pool.sleep(0, SleepMode::Discard).unwrap();
    pool.wake_zeroed(0, Stream::LEGACY).unwrap();
    assert!(all(&sim, a, 5000, 0) && all(&sim, b, 3 * MIB, 0));
    let c = pool.tag_census(0);
    assert_eq!((c.zeroed_bytes, c.zero_memsets), (5000 + 3 * MIB, 2));
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    check(&pool);
}

/// What the zeroing wake is for: a plain wake after a discard sleep gives the new
/// memory's stale bytes (here 0xFF, a NaN in every float format), and counts no
/// zeroing; a wake from an offload sleep restores the bytes, zeroing or not, and
/// queues no memset.
#[test]
fn a_plain_wake_gives_stale_bytes_and_offload_needs_no_zeroing() {
    let (pool, sim) = best_fit();
    let p = pool.allocate_tagged_raw(MIB, None, 2).unwrap();
    fill(&sim, p, 4, MIB);
    pool.sleep(2, SleepMode::Discard).unwrap();
    pool.wake(2).unwrap();
    assert!(all(&sim, p, MIB, SIM_STALE_BYTE));
    fill(&sim, p, 5, MIB);
    pool.sleep(2, SleepMode::Offload).unwrap();
    pool.wake_zeroed(2, stream(&sim)).unwrap();
    assert!(
        sim.read(p, MIB).unwrap() == pattern(5, MIB),
        "offload restores"
    );
    let c = pool.tag_census(2);
    assert_eq!((c.zeroed_bytes, c.zero_memsets), (0, 0));
    assert_eq!(sim.call_count(DriverCall::MemsetD8Async), 0);
    pool.free_raw(p).unwrap();
    check(&pool);
}

/// The second of three memsets refused: the wake itself succeeded, so the tag is
/// awake and usable (allocate, free), the error names `cuMemsetD8Async` and the
/// allocation's requested bytes; the first allocation is zero and counted, the
/// second and third (not queued) are not zero and not counted. The wake is recorded.
#[test]
fn a_refused_memset_leaves_the_tag_awake_with_the_error() {
    let path = std::env::temp_dir().join(format!("flare-wake-zeroed-{}.trace", std::process::id()));
    let (pool, sim) = simulated_pool(
        GIB,
        PoolConfig {
            record_path: Some(path.clone()),
            ..PoolConfig::default().with_policy(ReusePolicy::BestFit)
        },
    );
    let sizes = [MIB, 2 * MIB, 300];
    let ptrs: Vec<DevicePtr> = sizes
        .iter()
        .map(|&n| pool.allocate_tagged_raw(n, None, 8).unwrap())
        .collect();
    pool.sleep(8, SleepMode::Discard).unwrap();
    sim.inject_failure(DriverCall::MemsetD8Async, 2, CuResult::UNKNOWN);
    let r = pool.wake_zeroed(8, Stream::LEGACY);
    assert_eq!(
        r,
        Err(Error::Driver {
            source: DriverError::new(DriverCall::MemsetD8Async, CuResult::UNKNOWN),
            bytes: 2 * MIB,
        })
    );
    let c = pool.tag_census(8);
    assert!(!c.sleeping, "awake");
    assert_eq!((c.zeroed_bytes, c.zero_memsets), (MIB, 1));
    assert!(all(&sim, ptrs[0], MIB, 0));
    assert!(all(&sim, ptrs[1], 2 * MIB, SIM_STALE_BYTE));
    assert!(all(&sim, ptrs[2], 300, SIM_STALE_BYTE));
    assert_eq!(sim.call_count(DriverCall::MemsetD8Async), 2);
    check(&pool);
    let q = pool.allocate_tagged_raw(MIB, None, 8).unwrap();
    for p in ptrs.into_iter().chain([q]) {
        pool.free_raw(p).unwrap();
    }
    pool.record_flush();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(text.lines().any(|l| l == "wake 8"), "{text}");
    no_faults(&sim);
}

/// Refusals before anything is done: the tag stays asleep, no handle is created, no
/// memset queued, and a later zeroing wake works. A stream being captured
/// (`Error::ScopeState`; the capture stays valid); the legacy stream while a
/// blocking stream is captured (`Error::ScopeState`); a stream that is not live
/// (`Error::Driver`, `CUDA_ERROR_INVALID_HANDLE`). Then a tag that does not sleep, or
/// was never used: `Error::TagState`.
#[test]
fn a_bad_stream_or_a_tag_awake_is_refused_with_nothing_done() {
    let (pool, sim) = best_fit();
    let p = pool.allocate_tagged_raw(MIB, None, 4).unwrap();
    pool.sleep(4, SleepMode::Discard).unwrap();
    let created = sim.call_count(DriverCall::Create);
    let captured = sim.stream_create().unwrap();
    assert_eq!(
        sim.stream_begin_capture(captured, CaptureMode::Global),
        CuResult::SUCCESS
    );
    let blocking = sim.stream_create_with_flags(CU_STREAM_DEFAULT).unwrap();
    let unchanged = |pool: &Pool| {
        assert!(pool.tag_census(4).sleeping);
        assert_eq!(sim.call_count(DriverCall::Create), created);
        assert_eq!(sim.call_count(DriverCall::MemsetD8Async), 0);
    };
    let r = pool.wake_zeroed(4, Stream(captured));
    assert!(matches!(r, Err(Error::ScopeState(_))), "{r:?}");
    unchanged(&pool);
    assert_eq!(
        sim.stream_end_capture(captured),
        CuResult::SUCCESS,
        "still valid"
    );
    assert_eq!(
        sim.stream_begin_capture(blocking, CaptureMode::Global),
        CuResult::SUCCESS
    );
    let r = pool.wake_zeroed(4, Stream::LEGACY);
    assert!(matches!(r, Err(Error::ScopeState(_))), "{r:?}");
    unchanged(&pool);
    assert_eq!(sim.stream_end_capture(blocking), CuResult::SUCCESS);
    let r = pool.wake_zeroed(4, Stream(0xdead_0000));
    assert_eq!(
        r.map_err(|e| e.driver_error().map(|d| (d.call, d.code))),
        Err(Some((
            DriverCall::StreamGetCaptureInfo,
            CuResult::INVALID_HANDLE
        )))
    );
    unchanged(&pool);
    pool.wake_zeroed(4, Stream(captured)).unwrap();
    assert!(all(&sim, p, MIB, 0));
    for tag in [4, 99] {
        let r = pool.wake_zeroed(tag, Stream::LEGACY);
        assert!(matches!(r, Err(Error::TagState { .. })), "{r:?}");
    }
    assert_eq!(sim.call_count(DriverCall::MemsetD8Async), 1);
    assert_eq!(pool.tag_census(99), Default::default());
    pool.free_raw(p).unwrap();
    check(&pool);
}

/// A zeroing wake whose map-back fails (the device full) is the failed wake of
/// `Pool::wake`: the tag asleep, nothing zeroed or counted; once memory is freed it
/// wakes zeroed.
#[test]
fn a_wake_that_does_not_fit_zeroes_nothing() {
    let (pool, sim) = simulated_pool(
        64 * MIB,
        PoolConfig::default().with_policy(ReusePolicy::BestFit),
    );
    let t = pool.allocate_tagged_raw(32 * MIB, None, 7).unwrap();
    pool.sleep(7, SleepMode::Discard).unwrap();
    let filler = pool.allocate_raw(48 * MIB).unwrap();
    let r = pool.wake_zeroed(7, Stream::LEGACY);
    assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");
    assert!(pool.tag_census(7).sleeping);
    assert_eq!(pool.tag_census(7).zeroed_bytes, 0);
    assert_eq!(sim.call_count(DriverCall::MemsetD8Async), 0);
    pool.free_raw(filler).unwrap();
    pool.wake_zeroed(7, Stream::LEGACY).unwrap();
    assert!(all(&sim, t, 32 * MIB, 0));
    assert_eq!(pool.tag_census(7).zeroed_bytes, 32 * MIB);
    pool.free_raw(t).unwrap();
    check(&pool);
}
