//! Lending (stitching): a growth lends the heap's lone wholly free handles, largest
//! first while they fit its need; a lend refused part-way is undone or kept as the
//! handle's alias, and a lent handle is released in steps, its retired mapping first
//! (`docs/ARCHITECTURE.md`, "Segments").
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::pools::seg_pool;
use common::{assert_driver_empty, check, no_faults, simulated_pool, MIB};
use flare_package::{CuResult, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SimDriver};
use std::sync::Arc;

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A code no call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

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

/// A segment-mode pool on the default simulator (1 GiB), in a retention scope.
fn seg_pool_in_scope() -> (Pool, Arc<SimDriver>) {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            ..PoolConfig::default()
        },
    );
    pool.retention_begin().unwrap();
    (pool, sim)
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

/// Stitching (`lend_handles`: "largest first while they fit in need"): a 4 MiB
/// growth whose segment has two free 2 MiB handles, each alone in its free block
/// (its neighbours live), lends both and creates no handle: the peak stays at the
/// 12 MiB the four 2 MiB and one 4 MiB allocations made.
#[test]
fn a_growth_lends_every_lone_free_handle_it_needs() {
    let (pool, sim) = seg_pool_in_scope();
    let w: Vec<_> = (0..4)
        .map(|_| pool.allocate_raw(2 * MIB).unwrap())
        .collect();
    let n1 = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(w[0]).unwrap();
    pool.free_raw(w[2]).unwrap();
    let created = sim.call_count(DriverCall::Create);
    let n2 = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!(sim.call_count(DriverCall::Create), created, "no new handle");
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (2, 4 * MIB));
    assert_eq!(s.peak_physical_bytes, 12 * MIB);
    for p in [w[1], w[3], n1, n2] {
        pool.free_raw(p).unwrap();
    }
    pool.retention_finish().unwrap();
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

/// Segment mode, "Growth" (`docs/ARCHITECTURE.md`): "a miss maps one new whole handle
/// at the segment's end, counting the free block already there", and a lend takes
/// only handles "not the block at the segment's end, which the growth extends anyway"
/// (`lend_handles`). A growth whose lend the driver refused leaves the lent range
/// claimed above the segment's highest handle; the next release brings the growing
/// end back down to that handle ("Release": "the segment's growing end comes back
/// down to its highest mapping left"). After it, the block at the end (live then,
/// freed later) is still the one a growth extends: a 4 MiB request over a free
/// 2 MiB end block maps one 2 MiB handle after it and takes the block's address,
/// lending nothing.
#[test]
fn after_a_refused_lend_the_next_growth_still_extends_the_end_block() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            reuse_policy: ReusePolicy::Segments,
            // Nothing released by a free (and no thread cache: the threshold is not
            // u64::MAX); trim releases.
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    // Three 2 MiB growths, one 2 MiB handle each (a growth maps the need, or an
    // eighth of what is mapped rounded up to the granularity when that is more: here
    // never more than 2 MiB): handles A, B, C in address order, each wholly one live
    // block.
    let a = pool.allocate_raw(G).unwrap();
    let b = pool.allocate_raw(G).unwrap();
    let c = pool.allocate_raw(G).unwrap();
    assert_eq!((b - a, c - b), (G, G), "mapped back to back");
    // A is free and alone in its free block (B live after it): lendable.
    pool.free_raw(a).unwrap();
    // 4 MiB fits no free block: the growth lends A to the end (2 MiB) and claims a
    // new 2 MiB handle after it; mapping A again is refused, so the growth fails
    // and A goes back to its place.
    sim.inject_failure(DriverCall::Map, 1, FAIL);
    match pool.allocate_raw(4 * MIB) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::Map),
        other => panic!("{other:?}"),
    }
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.segment_handles_lent), (3, 0));
    assert_eq!(s.physical_bytes, 6 * MIB);
    // Trim releases A (wholly free); B and C stay.
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!((s.segment_handles, s.physical_bytes), (2, 4 * MIB));
    // C's block is the segment's end block; freed, it is a free 2 MiB block there.
    pool.free_raw(c).unwrap();
    let created = sim.call_count(DriverCall::Create);
    let d = pool.allocate_raw(4 * MIB).unwrap();
    let s = check(&pool);
    assert_eq!(d, c, "the growth extends the free block at the end");
    assert_eq!(sim.call_count(DriverCall::Create), created + 1);
    assert_eq!(
        (
            s.segment_handles,
            s.segment_handles_lent,
            s.segment_lent_bytes
        ),
        (3, 0, 0),
        "nothing lent: the end block is extended, not moved"
    );
    assert_eq!(s.physical_bytes, 6 * MIB, "B, C and one new 2 MiB handle");
    pool.free_raw(b).unwrap();
    pool.free_raw(d).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
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

/// A lend whose new mapping cannot be undone (`cuMemSetAccess` refused, then the
/// unmap too) keeps that mapping, retired, as the handle's alias (`lend_failed`):
/// the handle counts as lent, its 2 MiB in `segment_lent_bytes`, and the growth
/// fails with the set-access error.
#[test]
fn a_lend_left_mapped_counts_as_lent() {
    let (pool, sim) = seg_pool_in_scope();
    let w1 = pool.allocate_raw(2 * MIB).unwrap();
    let w2 = pool.allocate_raw(2 * MIB).unwrap();
    let n1 = pool.allocate_raw(4 * MIB).unwrap();
    pool.free_raw(w1).unwrap();
    sim.inject_failure(DriverCall::SetAccess, 1, FAIL);
    sim.inject_failure(DriverCall::Unmap, 1, FAIL);
    match pool.allocate_raw(4 * MIB) {
        Err(Error::Driver { source, .. }) => assert_eq!(source.call, DriverCall::SetAccess),
        other => panic!("{other:?}"),
    }
    let s = check(&pool);
    assert_eq!((s.segment_handles_lent, s.segment_lent_bytes), (1, 2 * MIB));
    for p in [w2, n1] {
        pool.free_raw(p).unwrap();
    }
    pool.retention_finish().unwrap();
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

/// Releasing a lent handle (stitching's: its retired mapping first, then its own):
/// with the own unmap refused after the retired mapping is gone, the handle is no
/// longer lent (`segment_handles_lent` and `segment_lent_bytes` count handles with
/// a retired mapping still mapped) and goes back to its segment, mapped (a free
/// block, released at the next release point); with the retired mapping's unmap
/// refused, it stays lent, its own unmap not tried (the retired mapping goes
/// first). Either way the other lent handle is released, and a trim then releases
/// the one kept.
#[test]
fn a_lent_handles_refused_release_keeps_it_and_counts_it_lent_only_while_its_alias_lives() {
    // (the unmap refused, unmaps made, handles lent after the release point)
    for (nth, unmapped, lent_after) in [(2, 4, 0), (1, 3, 1)] {
        let (pool, sim) = seg_pool_in_scope();
        let w: Vec<_> = (0..4)
            .map(|_| pool.allocate_raw(2 * MIB).unwrap())
            .collect();
        let n1 = pool.allocate_raw(4 * MIB).unwrap();
        pool.free_raw(w[0]).unwrap();
        pool.free_raw(w[2]).unwrap();
        let n2 = pool.allocate_raw(4 * MIB).unwrap();
        let s = check(&pool);
        assert_eq!((s.segment_handles, s.segment_handles_lent), (5, 2));
        // n2 freed: the two lent handles at the segment's end are wholly free; the
        // scope's finish releases them, each with two unmaps (retired, own).
        pool.free_raw(n2).unwrap();
        sim.inject_failure(DriverCall::Unmap, nth, FAIL);
        let unmaps = sim.call_count(DriverCall::Unmap);
        let _ = pool.retention_finish();
        sim.clear_failures();
        assert_eq!(
            sim.call_count(DriverCall::Unmap) - unmaps,
            unmapped,
            "nth {nth}"
        );
        let s = check(&pool);
        // w1, w3 and n1's handles, and the one kept.
        assert_eq!(s.segment_handles, 4, "nth {nth}");
        assert_eq!(s.physical_bytes, 10 * MIB, "nth {nth}");
        assert_eq!(
            (s.segment_handles_lent, s.segment_lent_bytes),
            (lent_after, lent_after * 2 * MIB),
            "nth {nth}"
        );
        pool.trim().unwrap();
        let s = check(&pool);
        assert_eq!(
            (s.segment_handles, s.segment_handles_lent),
            (3, 0),
            "nth {nth}"
        );
        assert_eq!(s.physical_bytes, 8 * MIB, "nth {nth}");
        for p in [w[1], w[3], n1] {
            pool.free_raw(p).unwrap();
        }
        pool.trim().unwrap();
        assert_driver_empty(&pool);
    }
}

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
