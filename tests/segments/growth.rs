//! A heap's growth: the reservation of a segment, a growth failing for another reason
//! than memory, a range left mapped, and growths racing on two threads.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::pools::seg_pool;
use common::{assert_driver_empty, check, hooked, no_faults, simulated_pool, MIB};
use flare_package::{
    CuResult, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SimConfig, SimDriver,
};
use std::sync::Arc;

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A code no memory call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

/// 1 MiB: the largest request of a heap's small class.
const SEGMENT_HALF: u64 = flare_package::pool::SEGMENT_SMALL_MAX_BYTES;

/// ARCHITECTURE.md, "Segments": "The reservation is the device's total memory
/// rounded to the granularity (capped at 1 TiB), so a heap class never needs a
/// second segment for lack of address space while the device has memory". On a
/// 1 GiB device the first block reserves 1 GiB (one reservation call), and a second
/// growth (a 4 MiB block after a 2 MiB one filled the first handle) maps in the same
/// segment: one segment, no second reservation.
#[test]
fn a_segment_reserves_the_devices_total_memory() {
    let (pool, sim) = seg_pool(u64::MAX);
    let a = pool.allocate_raw(2 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_count, s.reserved_bytes), (1, 1 << 30));
    let b = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_count, s.reserved_bytes), (1, 1 << 30));
    assert_eq!(s.segment_mapped_bytes, 6 * MIB);
    assert_eq!(sim.call_count(DriverCall::Reserve), 1);
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// A segment-mode pool on a [`hooked::Hooked`] default simulated driver, shared (the
/// hook acts on it from inside a driver call).
fn hooked_seg_pool() -> (Arc<Pool>, Arc<hooked::Hooked>, Arc<SimDriver>) {
    let sim = Arc::new(SimDriver::new(SimConfig::default()));
    let driver = hooked::Hooked::new(sim.clone());
    let pool = Pool::with_driver(
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            ..PoolConfig::default()
        },
        driver.clone(),
    )
    .expect("a pool on the hooked driver");
    (Arc::new(pool), driver, sim)
}

/// `Pool::allocate_raw`: "[`Error::Driver`] for any other failed driver call" (other
/// than out-of-memory), and `Pool::block_miss`: blocks idle in thread caches go back
/// to their heaps when a growth runs *out of memory* (so that a scope's forced reuse
/// sees them), not on any failure. Inside a scope (thread caches open), the
/// synchronous heap's 2 MiB handle is wholly live (two 1 MiB blocks); a third 1 MiB
/// request grows the heap, and while the growth's `cuMemCreate` runs (outside the
/// pool's lock) the same thread frees the first block, which goes to its thread
/// cache. The create then fails with a code that is not out-of-memory: the request
/// fails with that driver error, and the freed block stays in the cache.
#[test]
fn a_growth_failing_not_out_of_memory_does_not_settle_the_thread_caches() {
    let (pool, driver, sim) = hooked_seg_pool();
    pool.retention_begin().unwrap();
    let half = SEGMENT_HALF;
    let a = pool.allocate_raw(half).unwrap();
    let b = pool.allocate_raw(half).unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.block_free_bytes), (1, 0), "{s:#?}");
    let weak = Arc::downgrade(&pool);
    driver.arm(DriverCall::Create, Some(FAIL), move || {
        let pool = weak.upgrade().expect("the pool");
        pool.free_raw(a).expect("a is live");
    });
    let created = sim.call_count(DriverCall::Create);
    match pool.allocate_raw(half) {
        Err(Error::Driver { source, .. }) => {
            assert_eq!((source.call, source.code), (DriverCall::Create, FAIL))
        }
        other => panic!("expected the create's error, got {other:?}"),
    }
    assert_eq!(
        sim.call_count(DriverCall::Create),
        created,
        "the hook's call"
    );
    let s = check(&pool);
    assert_eq!(s.live_count, 1, "b only");
    assert_eq!(
        (s.thread_cache_bytes, s.physical_bytes),
        (half, G),
        "a waits in the thread cache; no new handle"
    );
    pool.free_raw(b).unwrap();
    pool.retention_finish().unwrap();
    assert_driver_empty(&pool);
}

/// Segment mode: a growth whose `cuMemSetAccess` fails and whose undoing unmap fails
/// too leaves its range mapped with no access (`map_fresh`: "the claimed range now
/// holds a mapping that cannot be removed"). That range must stay claimed: the next
/// growth maps its new handle past it, not over it (the driver refuses to map over
/// a mapped range), so the next allocation succeeds on memory it may touch.
#[test]
fn a_growth_range_left_mapped_stays_claimed() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            ..PoolConfig::default()
        },
    );
    sim.inject_failure(DriverCall::SetAccess, 1, FAIL);
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    assert!(pool.allocate_raw(4096).is_err());
    let p = pool
        .allocate_raw(4096)
        .expect("the next growth maps past the lost range");
    assert_eq!(sim.touch(p, 4096, 0), CuResult::SUCCESS);
    assert!(sim.faults().is_empty(), "{:?}", sim.faults());
    pool.free_raw(p).unwrap();
    // The trim releases both handles: the failed growth's (kept pending, never
    // created: its set-access failed) is counted in neither `mappings_created` nor
    // `mappings_released`, the second growth's in both.
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.mappings_created, s.mappings_released), (1, 1));
    assert_eq!((s.physical_bytes, s.pending_count), (0, 0));
}

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
