//! Issue 16, segment mode (`src/pool/segments.rs`): contracts of the segment tier a
//! mutation run found unpinned. Each test names the rule it checks (a doc comment,
//! or `docs/ARCHITECTURE.md`, section "Segments"); the expected values are reasoned
//! from there and from the simulated driver's documented behaviour (2 MiB
//! granularity, handles mapped back to back from a segment's start), not copied
//! from a run.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use common::{assert_driver_empty, check, simulated_pool, MIB};
use flare_package::driver::sim::SimStreamCall;
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

/// A segment-mode pool on a 1 GiB simulated device with release threshold
/// `threshold` (not `u64::MAX`: thread caches stay closed outside a scope).
fn seg_pool(threshold: u64) -> (Pool, Arc<SimDriver>) {
    simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: threshold,
            ..PoolConfig::default()
        },
    )
}

use common::hooked;

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

/// Two 2 MiB growths (each maps the need: an eighth of what is mapped is less than
/// the granularity): handles A and B, back to back, each one live block. B's handle
/// is wholly free at its free: released at once (threshold 0), the growing end comes
/// back to A's end, and the next 2 MiB is a handle regrown at B's address. Returns
/// (A, the regrown block).
fn regrown_after_a_retreat(pool: &Pool) -> (u64, u64) {
    let a = pool.allocate_raw(G).unwrap();
    let b = pool.allocate_raw(G).unwrap();
    assert_eq!(b - a, G);
    pool.free_raw(b).unwrap();
    let s = check(pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (1, G));
    let c = pool.allocate_raw(G).unwrap();
    assert_eq!(c, b, "regrown at the same address");
    (a, c)
}

/// Segment mode, "Release" (`docs/ARCHITECTURE.md`): "the segment's growing end
/// comes back down to its highest mapping left (so a heap that frees and regrows its
/// top handles above long-lived blocks maps them at the same addresses again)", and
/// "Blocks": "a block returning to its heap coalesces with its free neighbours". A
/// handle regrown at the end right after a long-lived block is that block's
/// neighbour: once both are free they are one free block, and a request of their
/// total size is served from it (at the long-lived block's address) with no driver
/// call and nothing lent.
#[test]
fn a_handle_regrown_after_a_retreat_coalesces_with_the_block_below() {
    let (pool, sim) = seg_pool(0);
    let (a, c) = regrown_after_a_retreat(&pool);
    // Inside a scope nothing is released.
    pool.retention_begin().unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(c).unwrap();
    let s = check(&pool);
    assert_eq!((s.block_free_bytes, s.physical_bytes), (2 * G, 2 * G));
    let (maps, creates) = (
        sim.call_count(DriverCall::Map),
        sim.call_count(DriverCall::Create),
    );
    let d = pool.allocate_raw(2 * G).unwrap();
    assert_eq!(d, a, "served from the coalesced free block at A");
    let s = check(&pool);
    assert_eq!(
        (
            sim.call_count(DriverCall::Map),
            sim.call_count(DriverCall::Create)
        ),
        (maps, creates),
        "no driver call"
    );
    assert_eq!((s.segment_handles_lent, s.physical_bytes), (0, 2 * G));
    pool.free_raw(d).unwrap();
    pool.retention_finish().unwrap();
    assert_driver_empty(&pool);
}

/// Segment mode, "Growth": "a miss maps one new whole handle at the segment's end,
/// counting the free block already there", and "Lending": a growth lends only
/// handles whose free block is exactly their range, "not the block at the segment's
/// end, which the growth extends anyway" (`lend_handles`). After a release brought
/// the growing end back down to a live block's handle and a handle was regrown
/// right after it ("Release"), that regrown handle is the segment's end: freed, it
/// is the free block a 4 MiB request extends by one new 2 MiB handle (taking the
/// block's address), and nothing is lent.
#[test]
fn a_handle_regrown_after_a_retreat_is_the_end_block_a_growth_extends() {
    let (pool, sim) = seg_pool(0);
    let (a, c) = regrown_after_a_retreat(&pool);
    pool.retention_begin().unwrap();
    pool.free_raw(c).unwrap();
    let (maps, creates) = (
        sim.call_count(DriverCall::Map),
        sim.call_count(DriverCall::Create),
    );
    let d = pool.allocate_raw(2 * G).unwrap();
    assert_eq!(d, c, "the free end block, extended");
    let s = check(&pool);
    assert_eq!(
        (
            sim.call_count(DriverCall::Map),
            sim.call_count(DriverCall::Create)
        ),
        (maps + 1, creates + 1),
        "one new 2 MiB handle"
    );
    assert_eq!(
        (s.segment_handles, s.segment_handles_lent, s.physical_bytes),
        (3, 0, 3 * G)
    );
    pool.free_raw(a).unwrap();
    pool.free_raw(d).unwrap();
    pool.retention_finish().unwrap();
    assert_driver_empty(&pool);
}

/// Stitching (`lend_handles`: handles "whose free block is exactly their range ...
/// largest first while they fit in `need`"; `docs/ARCHITECTURE.md`, "Lending"): a
/// growth whose need is exactly one lone free handle's size lends that handle and
/// creates none. Inside a scope, handles A, B, C (2 MiB each, one block each); A is
/// freed (B live after it: alone in its free block) and C, the end block, too. A
/// 4 MiB request counts C's 2 MiB at the end, needs 2 MiB more: A is lent behind C,
/// no `cuMemCreate`, and the request takes C's address.
#[test]
fn a_growth_lends_a_lone_free_handle_of_exactly_its_need() {
    let (pool, sim) = seg_pool(0);
    pool.retention_begin().unwrap();
    let a = pool.allocate_raw(G).unwrap();
    let b = pool.allocate_raw(G).unwrap();
    let c = pool.allocate_raw(G).unwrap();
    assert_eq!((b - a, c - b), (G, G));
    pool.free_raw(a).unwrap();
    pool.free_raw(c).unwrap();
    let created = sim.call_count(DriverCall::Create);
    let d = pool.allocate_raw(2 * G).unwrap();
    let s = check(&pool);
    assert_eq!(sim.call_count(DriverCall::Create), created, "no new handle");
    assert_eq!(d, c, "C's free end block, extended by A");
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (1, G));
    assert_eq!(s.physical_bytes, 3 * G);
    pool.free_raw(b).unwrap();
    pool.free_raw(d).unwrap();
    pool.retention_finish().unwrap();
    assert_driver_empty(&pool);
}

/// Segment mode, "Growth" and "Release" (`docs/ARCHITECTURE.md`): after a release
/// the growing end comes back down to the highest mapping left, and the free block
/// that ends there is the end block the next growth counts ("counting the free block
/// already there") and extends rather than lends (`lend_handles`: "not the block at
/// the segment's end"). Handles X, A, B; B released (the end comes back to A's end,
/// A's block live). X freed, then a 4 MiB growth whose lend of X the driver refuses
/// leaves 2 MiB claimed above A. A freed: X and A one free block; the free's release
/// (threshold 2 MiB) takes X only, and the end comes back to A's end, A's free block
/// the end block. A 4 MiB request then extends it by one new handle (taking A's
/// address), lending nothing.
#[test]
fn after_a_retreat_the_free_block_at_the_new_end_is_the_end_block() {
    let (pool, sim) = seg_pool(G);
    let x = pool.allocate_raw(G).unwrap();
    let a = pool.allocate_raw(G).unwrap();
    let b = pool.allocate_raw(G).unwrap();
    assert_eq!((a - x, b - a), (G, G));
    // B's handle is wholly free (cached: 2 MiB, not over the threshold); trim
    // releases it, the end comes back to A's end.
    pool.free_raw(b).unwrap();
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (2, 2 * G));
    // X alone in its free block (A live after it): lendable.
    pool.free_raw(x).unwrap();
    sim.inject_failure(DriverCall::Map, 1, FAIL);
    match pool.allocate_raw(2 * G) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Map),
        other => panic!("expected the refused map, got {other:?}"),
    }
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.segment_handles_lent), (2, 0));
    // A freed: 4 MiB cached, over 2 MiB: X's handle (the first) is released.
    pool.free_raw(a).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.segment_handles, s.physical_bytes, s.block_free_bytes),
        (1, G, G)
    );
    let (maps, creates) = (
        sim.call_count(DriverCall::Map),
        sim.call_count(DriverCall::Create),
    );
    pool.retention_begin().unwrap();
    let d = pool.allocate_raw(2 * G).unwrap();
    assert_eq!(d, a, "A's free end block, extended");
    let s = check(&pool);
    assert_eq!(
        (
            sim.call_count(DriverCall::Map),
            sim.call_count(DriverCall::Create)
        ),
        (maps + 1, creates + 1),
        "one new 2 MiB handle"
    );
    assert_eq!(
        (s.segment_handles, s.segment_handles_lent, s.physical_bytes),
        (2, 0, 2 * G)
    );
    pool.free_raw(d).unwrap();
    pool.retention_finish().unwrap();
    assert_driver_empty(&pool);
}

/// `State::hold_heaps`: when a stream's fence cannot be recorded at a release
/// point, "memory freed on its stream into its heaps that no completed fence covers
/// is released after a device synchronize instead"; memory of its heaps that was
/// never freed on it (freed on another stream, whose fence completed) needs no
/// synchronize ("Release": a segment's release "needs a device synchronize when its
/// segment merged memory that needs one ... and otherwise only the home stream's
/// fence through the last free merged into it"). S's large heap holds X's handle,
/// X freed on T; S's small heap holds two 4 KiB blocks, one freed on S. A trim whose
/// `cuEventRecord` on S is refused releases X's handle (T's fence completed) with no
/// device synchronize: the one handle that would need it (S's small heap's) is not
/// wholly free.
#[test]
fn a_failed_fence_does_not_hold_a_heap_segment_freed_on_another_stream() {
    // Nothing released by a free (no poll on the free's path either).
    let (pool, sim) = seg_pool(1 << 30);
    let (s, t) = (common::stream(&sim), common::stream(&sim));
    let x = pool.allocate_async_raw(G, s).unwrap();
    pool.free_async_raw(x, t).unwrap();
    let y1 = pool.allocate_async_raw(4096, s).unwrap();
    let y2 = pool.allocate_async_raw(4096, s).unwrap();
    pool.free_async_raw(y1, s).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.segment_handles, snap.physical_bytes), (2, 2 * G));
    // S is the pool's first stream: its fence is the trim's first record.
    sim.inject_stream_failure(SimStreamCall::EventRecord, 1, FAIL);
    let syncs = sim.call_count(DriverCall::Synchronize);
    pool.trim().unwrap();
    let snap = check(&pool);
    assert_eq!(snap.stream_call_failures, 1, "S's fence refused");
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        syncs,
        "no device synchronize"
    );
    assert_eq!(
        (snap.segment_handles, snap.physical_bytes),
        (1, G),
        "X's handle released, S's small heap's kept"
    );
    pool.free_async_raw(y2, s).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    common::no_faults(&sim);
}

/// `Pool::release_other_homes`: before a stream's heap grows, wholly free handles of
/// *other streams'* heaps are released; "nothing is released ... from the
/// synchronous API's heap" (`State::collect_other_homes`: "the heaps of stream homes
/// other than `home`"). The synchronous heap keeps a wholly free handle (its free's
/// release, over the 2 MiB threshold, took the other one and synchronized, so this
/// one needs no further synchronize); T's heap holds a live handle. S's heap grows by
/// 2 MiB: T's handle is live, and the synchronous heap's free handle stays.
#[test]
fn a_streams_growth_releases_nothing_of_the_synchronous_heap() {
    let (pool, sim) = seg_pool(G);
    let (s, t) = (common::stream(&sim), common::stream(&sim));
    let x1 = pool.allocate_raw(G).unwrap();
    let x2 = pool.allocate_raw(G).unwrap();
    pool.free_raw(x1).unwrap();
    // 4 MiB cached, over 2 MiB: one handle released, one kept.
    pool.free_raw(x2).unwrap();
    let snap = check(&pool);
    assert_eq!((snap.segment_handles, snap.block_free_bytes), (1, G));
    let on_t = pool.allocate_async_raw(G, t).unwrap();
    let released = sim.call_count(DriverCall::Release);
    let on_s = pool.allocate_async_raw(G, s).unwrap();
    let snap = check(&pool);
    assert_eq!(
        sim.call_count(DriverCall::Release),
        released,
        "nothing released"
    );
    assert_eq!(
        (snap.segment_handles, snap.physical_bytes),
        (3, 3 * G),
        "the synchronous heap's free handle, T's and S's"
    );
    pool.free_async_raw(on_s, s).unwrap();
    pool.free_async_raw(on_t, t).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    common::no_faults(&sim);
}

/// A release of a segment handle completes (`Pool::free_raw` outside a scope with
/// threshold 0 releases a handle whose whole range is free, `docs/ARCHITECTURE.md`,
/// "Release"): a watchdog (10 s) fails the test where the release never returns.
#[test]
fn releasing_a_segment_handle_returns() {
    use std::sync::mpsc;
    use std::time::Duration;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (pool, _sim) = seg_pool(0);
        let a = pool.allocate_raw(G).unwrap();
        let b = pool.allocate_raw(G).unwrap();
        pool.free_raw(b).unwrap();
        pool.free_raw(a).unwrap();
        let s = check(&pool);
        assert_driver_empty(&pool);
        let _ = tx.send((s.segment_handles, s.physical_bytes));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the releases return");
    assert_eq!(got, (0, 0), "both handles released");
}

/// A device synchronize covers every free made before it: a segment's handle freed
/// before a synchronize (made to release a whole mapping) is released later with
/// no synchronize of its own (the books keep the ticket of the last synchronize
/// made and each segment's last free's: release.rs, segments.rs). Threshold 2 MiB: the freed handle (2 MiB of free blocks) is kept; the
/// whole mapping freed after it goes over the threshold and is released, after one
/// synchronize; the trim then releases the handle with none.
#[test]
fn a_synchronize_covers_a_segment_freed_before_it() {
    let (pool, sim) = simulated_pool(
        SimConfig::default().capacity_bytes,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            release_threshold_bytes: G,
            segment_whole_threshold_bytes: G,
            ..PoolConfig::default()
        },
    );
    let b = pool.allocate_raw(4096).unwrap();
    let w = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_mapped_bytes, s.live_mapped_bytes), (G, 4 * MIB));
    pool.free_raw(b).unwrap();
    assert_eq!(
        check(&pool).block_free_bytes,
        G,
        "kept: 2 MiB, at the threshold"
    );
    assert_eq!(sim.call_count(DriverCall::Synchronize), 0);
    pool.free_raw(w).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.idle_bytes, s.physical_bytes),
        (0, G),
        "the whole mapping released"
    );
    assert_eq!(sim.call_count(DriverCall::Synchronize), 1);
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
    assert_eq!(
        sim.call_count(DriverCall::Synchronize),
        1,
        "the handle's free came before that synchronize"
    );
    assert_driver_empty(&pool);
}

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
