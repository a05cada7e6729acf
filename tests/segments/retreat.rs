//! The growing end's retreat: after a release the segment's growing end comes back
//! down to its highest mapping left, a handle regrown there coalesces with the block
//! below, and the free block at the new end is the end block the next growth counts
//! (`docs/ARCHITECTURE.md`, "Segments": "Growth", "Release").
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::pools::{seg_pool, seg_pool_on_device};
use common::{assert_driver_empty, check, MIB};
use flare_package::{CuResult, DriverCall, Error, Pool};

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A code no memory call returns by itself and that is not out-of-memory.
const FAIL: CuResult = CuResult::UNKNOWN;

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

/// `docs/ARCHITECTURE.md`, "Growth": "A miss maps one new whole handle at the
/// segment's end, counting the free block already there". Once a released top handle
/// brought the growing end back down, the free block ending there was not counted:
/// the next growth mapped the whole request rounded up. Here a 3 MiB block holds a
/// 4 MiB handle (1 MiB free at its end); a 2 MiB block grows a second handle and is
/// freed, which releases that handle; a 2.5 MiB request then needs 1.5 MiB beyond the
/// free 1 MiB, one 2 MiB handle (6 MiB in all), and mapped 4 MiB (8 MiB).
#[test]
fn a_growth_after_a_released_top_handle_counts_the_free_end() {
    let (pool, _sim) = seg_pool_on_device(140 << 30, 0);
    let x = pool.allocate_raw(3 * MIB).unwrap();
    let y = pool.allocate_raw(G).unwrap();
    assert_eq!(
        y,
        x + 3 * MIB,
        "carved from the 1 MiB free and a new handle"
    );
    pool.free_raw(y).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.physical_bytes, s.block_free_bytes),
        (2 * G, MIB),
        "{s:#?}"
    );
    let z = pool.allocate_raw(5 * MIB / 2).unwrap();
    assert_eq!(z, x + 3 * MIB, "the free end first");
    let s = check(&pool);
    assert_eq!(s.physical_bytes, 3 * G, "one 2 MiB handle more: {s:#?}");
    pool.free_raw(z).unwrap();
    pool.free_raw(x).unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}
