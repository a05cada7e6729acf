//! Loom models of segment mode (issue 12): blocks of one handle freed
//! concurrently, growths racing frees, trims, finishes, a failed release and each
//! other, and the stream-order release of a stream's heap. They also check the
//! books against the simulated driver object by object (`books_match_driver`).

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::books::{books_config, drop_and_check_empty, invariants, model, no_failures, KIB, MIB};
use flare_package::{
    CuResult, DevicePtr, DriverCall, Pool, PoolConfig, ReusePolicy, SimDriver, Snapshot,
};
use loom::sync::Arc;
use loom::thread;

// Segment mode (issue 12): the same races where blocks of one handle, growths of
// one segment and handle releases meet. Sizes above 1 MiB go to a heap's large
// segment, smaller ones to its small segment; every segment here is the synchronous
// API's. A fresh segment's first growth maps one handle of the rounded need; a later
// growth maps the need less the free block at the segment's end, rounded to the
// granularity (2 MiB), or an eighth of what the segment maps when that is more (never
// here: an eighth of at most 8 MiB rounds to one granule).

/// A segment-mode pool on the simulated driver (an H200's 140 GiB, each segment
/// reserving all of it) with release threshold `threshold` bytes.
fn seg_pool(threshold: u64) -> (Arc<Pool>, std::sync::Arc<SimDriver>) {
    let pool = Pool::new(PoolConfig {
        reuse_policy: ReusePolicy::Segments,
        release_threshold_bytes: threshold,
        ..books_config()
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap().clone();
    (Arc::new(pool), sim)
}

/// Quiet (nothing in flight, nothing pending): the books against the simulated
/// driver, object by object. Each whole mapping holds a handle, a mapping and a
/// reservation; each handle mapped in a segment a handle and a mapping, and a lent
/// one a second (retired) mapping; each segment a reservation.
#[track_caller]
fn books_match_driver(s: &Snapshot, sim: &SimDriver) {
    assert_eq!(s.pending_count, 0, "{s:#?}");
    let whole = s.live_count - s.block_live_count + s.idle_count;
    let d = sim.state();
    assert_eq!(
        (d.handles, d.mappings, d.reservations),
        (
            whole + s.segment_handles,
            whole + s.segment_handles + s.segment_handles_lent,
            whole + s.segment_count
        ),
        "driver objects vs books\n{s:#?}\n{d:#?}"
    );
    assert_eq!(
        (d.physical_bytes, d.reserved_bytes),
        (s.physical_bytes, s.reserved_bytes),
        "{d:#?}"
    );
}

/// Prints how many of a model's executions reached each of its outcomes, and fails
/// unless every one was reached (a model whose interleavings never reach an outcome
/// does not test it).
#[track_caller]
pub(crate) fn all_seen(model: &str, seen: &[AtomicUsize], names: &[&str]) {
    let counts: Vec<usize> = seen.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let line: Vec<String> = names
        .iter()
        .zip(&counts)
        .map(|(n, c)| format!("{n}: {c}"))
        .collect();
    println!("loom model {model}: outcomes {}", line.join(", "));
    assert!(
        counts.iter().all(|&c| c > 0),
        "{model}: an outcome was never reached"
    );
}

/// (a) Segments: two threads free the two blocks of one handle outside a scope
/// (threshold 0: a free that leaves the handle wholly free releases it). The handle
/// is released exactly once (one synchronize, unmap and release: memory freed with
/// the synchronous `free` needs a device synchronize), and only after both frees:
/// each block is still mapped, with access, right before its own free.
#[test]
fn seg_frees_of_one_handle_release_it_once() {
    model("seg_frees_of_one_handle_release_it_once", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let a = pool.allocate_raw(KIB).unwrap();
        let b = pool.allocate_raw(KIB).unwrap();
        assert_eq!(b, a + KIB, "both carved from the one 2 MiB handle");
        let free = |ptr: DevicePtr| {
            let (pool, sim) = (pool.clone(), sim.clone());
            thread::spawn(move || {
                assert_eq!(
                    sim.touch(ptr, KIB, 0),
                    CuResult::SUCCESS,
                    "the handle was released while {ptr:#x} was live"
                );
                pool.free_raw(ptr).unwrap();
            })
        };
        let ta = free(a);
        let tb = free(b);
        invariants(&pool.snapshot());
        ta.join().unwrap();
        tb.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.allocations, s.frees, s.live_count), (2, 2, 0));
        assert_eq!(
            (s.physical_bytes, s.segment_handles, s.block_free_bytes),
            (0, 0, 0),
            "{s:#?}"
        );
        assert_eq!((s.mappings_created, s.mappings_released), (1, 1));
        assert_eq!(s.segment_count, 1, "the reservation is kept");
        for (call, n) in [
            (DriverCall::Synchronize, 1),
            (DriverCall::Unmap, 1),
            (DriverCall::Release, 1),
            (DriverCall::FreeReservation, 0),
        ] {
            assert_eq!(sim.call_count(call), n, "{call:?}");
        }
        books_match_driver(&s, &sim);
        drop_and_check_empty(pool, sim);
    });
}

/// (b) Segments: a growth of the heap races a free that leaves the segment's only
/// handle wholly free (threshold 0: released). The 4 MiB handle holds `x` (3 MiB)
/// and a free 1 MiB block at the segment's end, which a 5 MiB request counts: it
/// maps 4 MiB more after it. The outcomes, by where the free falls:
/// - before the growth claims its range: the handle is released, the segment left
///   empty and reset, and the growth maps 6 MiB at the segment's start (`y == x`);
/// - after the growth is booked: `y` takes the end block and the new handle
///   (`x + 3 MiB`), and the first handle is not wholly free, so nothing is released;
/// - in between (the release in flight, or done, while the growth maps): the growth
///   lies at `x + 4 MiB`, after the released handle's hole, with 6 MiB mapped:
///   one 6 MiB handle (claimed once the end block was gone), or 4 MiB then 2 MiB
///   (the end block was released under it, so it grew again).
///
/// Whatever the order, freeing `y` leaves the segment empty with nothing in flight,
/// so it resets: the next request is carved from its start again.
#[test]
fn seg_growth_races_a_releasing_free() {
    static SEEN: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];
    model("seg_growth_races_a_releasing_free", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let x = pool.allocate_raw(3 * MIB).unwrap();
        let s = pool.snapshot();
        assert_eq!((s.physical_bytes, s.block_free_bytes), (4 * MIB, MIB));
        let tf = {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(x).unwrap())
        };
        let tg = {
            let pool = pool.clone();
            thread::spawn(move || pool.allocate_raw(5 * MIB).unwrap())
        };
        invariants(&pool.snapshot());
        tf.join().unwrap();
        let y = tg.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.live_count, s.block_live_bytes), (1, 5 * MIB));
        let got = (
            s.physical_bytes,
            s.segment_handles,
            s.mappings_created,
            s.mappings_released,
            s.block_free_bytes,
        );
        let outcome = if y == x {
            assert_eq!(got, (6 * MIB, 1, 2, 1, MIB), "{s:#?}");
            0
        } else if y == x + 3 * MIB {
            assert_eq!(got, (8 * MIB, 2, 2, 0, 3 * MIB), "{s:#?}");
            1
        } else {
            assert_eq!(y, x + 4 * MIB, "{s:#?}");
            if got == (6 * MIB, 1, 2, 1, MIB) {
                2
            } else {
                assert_eq!(got, (6 * MIB, 2, 3, 1, MIB), "{s:#?}");
                3
            }
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        assert_eq!(s.segment_count, 1);
        books_match_driver(&s, &sim);
        assert_eq!(sim.touch(y, 5 * MIB, 0), CuResult::SUCCESS);
        pool.free_raw(y).unwrap();
        let s = pool.snapshot();
        assert_eq!((s.physical_bytes, s.segment_handles), (0, 0), "{s:#?}");
        assert_eq!(s.mappings_created, s.mappings_released);
        let z = pool.allocate_raw(3 * MIB).unwrap();
        assert_eq!(
            z, x,
            "an empty segment with nothing in flight regrows at its start"
        );
        pool.free_raw(z).unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        books_match_driver(&s, &sim);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_growth_races_a_releasing_free",
        &SEEN,
        &[
            "reset",
            "no release",
            "after the hole",
            "after the hole, grown twice",
        ],
    );
}

/// (b) Segments, stitching: a growth that lends a wholly free handle to the
/// segment's end races a trim that would release that handle (threshold: keep
/// everything cached). Handles H0 (free, where `x` was) and H1 (`y`, live) hold
/// 2 MiB each; a 4 MiB request either lends H0 (mapped again after H1, its old
/// mapping kept, plus a new 2 MiB handle) and the trim finds nothing wholly free, or
/// the trim releases H0 first and the growth maps one new 4 MiB handle. Either way
/// the request lies right after H1, 6 MiB are held, and the handle is taken by
/// exactly one of the two.
#[test]
fn seg_lending_growth_races_trim() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    model("seg_lending_growth_races_trim", Some(4), || {
        let (pool, sim) = seg_pool(u64::MAX);
        let x = pool.allocate_raw(2 * MIB).unwrap();
        let y = pool.allocate_raw(2 * MIB).unwrap();
        assert_eq!(y, x + 2 * MIB);
        pool.free_raw(x).unwrap();
        let tg = {
            let pool = pool.clone();
            thread::spawn(move || pool.allocate_raw(4 * MIB).unwrap())
        };
        let tt = {
            let pool = pool.clone();
            thread::spawn(move || pool.trim().unwrap())
        };
        invariants(&pool.snapshot());
        let z = tg.join().unwrap();
        tt.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!(z, x + 4 * MIB, "after H1, the segment's end");
        assert_eq!(
            (s.physical_bytes, s.block_live_bytes, s.mappings_created),
            (6 * MIB, 6 * MIB, 3)
        );
        let lent = s.segment_handles_lent;
        SEEN[lent.min(1) as usize].fetch_add(1, Ordering::Relaxed);
        if lent == 1 {
            // H0 lent: H1, H0 again, and a new 2 MiB handle; nothing released, no
            // synchronize (the trim's batch was empty).
            assert_eq!((s.segment_handles, s.segment_lent_bytes), (3, 2 * MIB));
            assert_eq!(s.mappings_released, 0, "{s:#?}");
            assert_eq!(sim.call_count(DriverCall::Synchronize), 0);
        } else {
            assert_eq!((lent, s.segment_handles), (0, 2), "{s:#?}");
            assert_eq!(s.mappings_released, 1, "{s:#?}");
            assert_eq!(sim.call_count(DriverCall::Synchronize), 1);
        }
        books_match_driver(&s, &sim);
        assert_eq!(sim.touch(z, 4 * MIB, 0), CuResult::SUCCESS);
        pool.free_raw(y).unwrap();
        pool.free_raw(z).unwrap();
        pool.trim().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.physical_bytes, s.segment_handles), (0, 0), "{s:#?}");
        assert_eq!((s.segment_handles_lent, s.mappings_released), (0, 3));
        // Every mapping unmapped once: the lent handle's retired one too.
        assert_eq!(sim.call_count(DriverCall::Unmap), 3 + lent);
        assert_eq!(sim.call_count(DriverCall::Release), 3);
        books_match_driver(&s, &sim);
        assert_eq!(
            pool.allocate_raw(2 * MIB).unwrap(),
            x,
            "reset: regrown at its start"
        );
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_lending_growth_races_trim",
        &SEEN,
        &["trim released H0", "H0 lent"],
    );
}

/// (c) Segments: two threads free the two blocks of one handle inside a scope while
/// a third finishes it. A block freed inside is retained; one freed after the finish
/// is freed outside (threshold 0). Whatever the order, the handle is released
/// exactly once, when its last block is free outside the scope (by the finish, or
/// by the later free), never while a block is live.
#[test]
fn seg_frees_race_finish() {
    model("seg_frees_race_finish", Some(4), || {
        let (pool, sim) = seg_pool(0);
        pool.retention_begin().unwrap();
        let a = pool.allocate_raw(KIB).unwrap();
        let b = pool.allocate_raw(4 * KIB).unwrap();
        assert_eq!(b, a + KIB);
        let free = |ptr: DevicePtr, bytes: u64| {
            let (pool, sim) = (pool.clone(), sim.clone());
            thread::spawn(move || {
                assert_eq!(sim.touch(ptr, bytes, 0), CuResult::SUCCESS);
                pool.free_raw(ptr).unwrap();
            })
        };
        let ta = free(a, KIB);
        let tb = free(b, 4 * KIB);
        let tf = {
            let pool = pool.clone();
            thread::spawn(move || pool.retention_finish().unwrap())
        };
        invariants(&pool.snapshot());
        ta.join().unwrap();
        tb.join().unwrap();
        tf.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert!(!s.scope_open);
        assert_eq!((s.allocations, s.frees, s.live_count), (2, 2, 0));
        assert_eq!(
            (s.physical_bytes, s.segment_handles, s.block_free_bytes),
            (0, 0, 0),
            "{s:#?}"
        );
        assert_eq!((s.mappings_created, s.mappings_released), (1, 1));
        assert_eq!(sim.call_count(DriverCall::Release), 1);
        assert_eq!(s.scopes_finished, 1);
        books_match_driver(&s, &sim);
        drop_and_check_empty(pool, sim);
    });
}

/// (c) Segments: the scope barrier. A free that leaves a handle wholly free outside
/// a scope (threshold 0: a release, with a synchronize) races a `retention_begin`
/// whose thread then captures. The capture stays valid: the release ran before
/// `begin` returned, or the block was freed inside the scope and its handle retained.
#[test]
fn seg_begin_races_a_releasing_free() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    model("seg_begin_races_a_releasing_free", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let a = pool.allocate_raw(KIB).unwrap();
        let tf = {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(a).unwrap())
        };
        let tb = {
            let pool = pool.clone();
            let sim = sim.clone();
            thread::spawn(move || {
                pool.retention_begin().unwrap();
                assert_eq!(sim.begin_capture(), CuResult::SUCCESS);
                let valid = sim.end_capture();
                assert_eq!(valid, CuResult::SUCCESS, "a release ran inside the scope");
            })
        };
        tf.join().unwrap();
        tb.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert!(s.scope_open);
        // Released before the scope, or retained in it: exactly one of the two.
        assert_eq!(s.mappings_released + s.segment_handles, 1, "{s:#?}");
        assert_eq!(s.physical_bytes, s.segment_handles * 2 * MIB);
        SEEN[s.segment_handles as usize].fetch_add(1, Ordering::Relaxed);
        books_match_driver(&s, &sim);
        pool.retention_finish().unwrap();
        let s = pool.snapshot();
        assert_eq!((s.physical_bytes, s.mappings_released), (0, 1));
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_begin_races_a_releasing_free",
        &SEEN,
        &["released before the scope", "retained in it"],
    );
}

/// (d) Segments: two allocations that both miss grow the same segment at once, each
/// claiming its own range under the lock and mapping it outside. Both succeed, each
/// with a new 2 MiB handle right after `x`'s, in either order; the blocks do not
/// overlap and the books match the driver. The three handles are one mapped run:
/// once all three blocks are freed (inside the scope: nothing released), a 6 MiB
/// request takes their coalesced range at `x` with no new handle, whichever growth
/// was booked first.
#[test]
fn seg_concurrent_growths_of_one_segment() {
    static SEEN: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
    model("seg_concurrent_growths_of_one_segment", Some(4), || {
        let (pool, sim) = seg_pool(0);
        pool.retention_begin().unwrap();
        let x = pool.allocate_raw(2 * MIB).unwrap();
        let grow = || {
            let pool = pool.clone();
            thread::spawn(move || pool.allocate_raw(2 * MIB).unwrap())
        };
        let t1 = grow();
        let t2 = grow();
        invariants(&pool.snapshot());
        let p1 = t1.join().unwrap();
        let p2 = t2.join().unwrap();
        let mut got = [p1, p2];
        got.sort_unstable();
        assert_eq!(got, [x + 2 * MIB, x + 4 * MIB], "x {x:#x}");
        SEEN[usize::from(p2 < p1)].fetch_add(1, Ordering::Relaxed);
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!(
            (s.segment_count, s.segment_handles, s.mappings_created),
            (1, 3, 3)
        );
        assert_eq!(
            (s.physical_bytes, s.block_live_bytes, s.block_free_bytes),
            (6 * MIB, 6 * MIB, 0)
        );
        assert_eq!(s.reuse_hits, 0);
        books_match_driver(&s, &sim);
        for p in [x, p1, p2] {
            assert_eq!(sim.touch(p, 2 * MIB, 0), CuResult::SUCCESS);
        }
        for p in [p1, x, p2] {
            pool.free_raw(p).unwrap();
        }
        let w = pool.allocate_raw(6 * MIB).unwrap();
        let s = pool.snapshot();
        assert_eq!(w, x, "the three free blocks coalesce\n{s:#?}");
        assert_eq!((s.mappings_created, s.physical_bytes), (3, 6 * MIB));
        assert_eq!(s.reuse_hits, 1);
        pool.free_raw(w).unwrap();
        pool.retention_finish().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.physical_bytes, s.mappings_released), (0, 3));
        books_match_driver(&s, &sim);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_concurrent_growths_of_one_segment",
        &SEEN,
        &["first thread grew first", "second thread grew first"],
    );
}

/// Segments: a handle release that fails (its unmap refused) races a growth of the
/// same segment. H1 (`y`'s, at the segment's end) is wholly free once `y` is freed
/// outside a scope (threshold 0), so it is released, but the unmap fails: it goes
/// back to its segment, free, between `x`'s handle and anything grown after it.
/// Meanwhile a 2 MiB request either takes H1's range once it is back (a reuse) or
/// grows the segment after H1 (H1's hole, or H1 itself, below it), and is carved
/// from a free 2 MiB block then (H1's, if back by then). Either way the
/// handle is unmapped once more by the next release point, and every block links
/// to its neighbours: after all are freed, everything is released and the empty
/// segment regrows at its start.
#[test]
fn seg_failed_release_races_growth() {
    static SEEN: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];
    model("seg_failed_release_races_growth", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let x = pool.allocate_raw(2 * MIB).unwrap();
        let y = pool.allocate_raw(2 * MIB).unwrap();
        assert_eq!(y, x + 2 * MIB);
        sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
        let tf = {
            let pool = pool.clone();
            thread::spawn(move || pool.free_raw(y).unwrap())
        };
        let tg = {
            let pool = pool.clone();
            thread::spawn(move || pool.allocate_raw(2 * MIB).unwrap())
        };
        invariants(&pool.snapshot());
        tf.join().unwrap();
        let z = tg.join().unwrap();
        let s = pool.snapshot();
        invariants(&s);
        assert_eq!((s.unmap_failures, s.driver_failures()), (1, 1), "{s:#?}");
        assert_eq!((s.pending_count, s.mappings_released), (0, 0));
        let got = (s.physical_bytes, s.segment_handles, s.mappings_created);
        let grown = (6 * MIB, 3, 3);
        let outcome = if got == grown {
            // Grown after H1; the carve takes a free 2 MiB block: H1's range (if
            // back by then) or the new one.
            assert!(z == y || z == x + 4 * MIB, "{s:#?}");
            assert_eq!((s.block_live_bytes, s.block_free_bytes), (4 * MIB, 2 * MIB));
            if z == y {
                1
            } else {
                2
            }
        } else {
            // H1 back, then reused.
            assert_eq!((z, got), (y, (4 * MIB, 2, 2)), "{s:#?}");
            assert_eq!((s.block_live_bytes, s.block_free_bytes), (4 * MIB, 0));
            0
        };
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        books_match_driver(&s, &sim);
        assert_eq!(sim.touch(z, 2 * MIB, 0), CuResult::SUCCESS);
        pool.free_raw(z).unwrap();
        pool.free_raw(x).unwrap();
        let s = pool.snapshot();
        invariants(&s);
        assert_eq!((s.physical_bytes, s.segment_handles), (0, 0), "{s:#?}");
        assert_eq!(s.mappings_released, s.mappings_created);
        assert_eq!(sim.call_count(DriverCall::Unmap), s.mappings_created + 1);
        books_match_driver(&s, &sim);
        let w = pool.allocate_raw(6 * MIB).unwrap();
        assert_eq!(
            w, x,
            "an empty segment with nothing in flight regrows at its start"
        );
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_failed_release_races_growth",
        &SEEN,
        &[
            "H1 back, reused",
            "grown, H1 back and carved",
            "grown, carved",
        ],
    );
}

/// Segments: the first two requests of a heap race, both missing. Each is served
/// and they do not overlap, by one of two paths: the second carves the first's
/// new handle (one segment, one handle); or it grows the segment the first made,
/// after the first's claim (one segment, two handles). Both may find no segment
/// and reserve one (the first growth of a heap reserves outside the lock); the one
/// that books second then finds the other's segment and gives its own reservation
/// back (`FreeReservation`), so a heap never holds two segments from such a race.
/// Freed outside a scope (threshold 0), every handle is released, the reservation
/// when the pool is dropped.
#[test]
fn seg_first_growths_race() {
    static SEEN: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];
    model("seg_first_growths_race", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let alloc = || {
            let pool = pool.clone();
            thread::spawn(move || pool.allocate_raw(KIB).unwrap())
        };
        let t1 = alloc();
        let t2 = alloc();
        invariants(&pool.snapshot());
        let p1 = t1.join().unwrap();
        let p2 = t2.join().unwrap();
        assert!(p1.abs_diff(p2) >= KIB, "{p1:#x} {p2:#x} overlap");
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        let got = (s.segment_count, s.segment_handles, s.mappings_created);
        let outcome = match got {
            (1, 1, 1) => {
                // (A reuse hit, or a growth that found the free end block enough
                // and mapped nothing.)
                assert_eq!(p1.abs_diff(p2), KIB, "carved from one handle");
                0
            }
            (1, 2, 2) => 1,
            _ => panic!("{s:#?}"),
        };
        // Every reservation but the segment's was given back.
        assert_eq!(
            sim.call_count(DriverCall::Reserve),
            1 + sim.call_count(DriverCall::FreeReservation)
        );
        if sim.call_count(DriverCall::Reserve) == 2 {
            SEEN[2].fetch_add(1, Ordering::Relaxed);
        }
        SEEN[outcome].fetch_add(1, Ordering::Relaxed);
        assert_eq!(s.physical_bytes, s.segment_handles * 2 * MIB);
        books_match_driver(&s, &sim);
        for p in [p1, p2] {
            assert_eq!(sim.touch(p, KIB, 0), CuResult::SUCCESS);
            pool.free_raw(p).unwrap();
        }
        let s = pool.snapshot();
        invariants(&s);
        no_failures(&s);
        assert_eq!((s.physical_bytes, s.segment_handles), (0, 0), "{s:#?}");
        assert_eq!(s.mappings_released, s.mappings_created);
        books_match_driver(&s, &sim);
        drop_and_check_empty(pool, sim);
    });
    all_seen(
        "seg_first_growths_race",
        &SEEN,
        &[
            "one handle",
            "one segment, two handles",
            "both reserved, one given back",
        ],
    );
}

/// Segments, stream order: as `stream_free_races_polling_release`, with the two
/// blocks in stream S's heap (a 2 MiB handle for `p`, a 4 MiB one for `q`). A free
/// on S puts its block back in S's heap at once, marked; its handle is released
/// (threshold 0) only once a fence covering that mark completed (the free's poll,
/// or the trim's fence wait), never with a device synchronize, and never while S's
/// kernel on `p` may run (the simulated driver would record a fault).
#[test]
fn seg_stream_free_races_polling_release() {
    model("seg_stream_free_races_polling_release", Some(4), || {
        let (pool, sim) = seg_pool(0);
        let s = flare_package::Stream(sim.stream_create().unwrap());
        let p = pool.allocate_async_raw(2 * MIB, s).unwrap();
        let q = pool.allocate_async_raw(4 * MIB, s).unwrap();
        assert_eq!(q, p + 2 * MIB, "S's heap grows after p");
        assert_eq!(pool.snapshot().segment_handles, 2);
        assert_eq!(sim.launch(s.0, p, 2 * MIB), CuResult::SUCCESS);
        let t1 = {
            let pool = pool.clone();
            thread::spawn(move || pool.free_async_raw(p, s).unwrap())
        };
        let t2 = {
            let pool = pool.clone();
            thread::spawn(move || pool.trim().unwrap())
        };
        let t3 = {
            let (pool, sim) = (pool.clone(), sim.clone());
            thread::spawn(move || {
                assert_eq!(sim.stream_complete(s.0), CuResult::SUCCESS);
                pool.free_async_raw(q, s).unwrap();
            })
        };
        invariants(&pool.snapshot());
        t1.join().unwrap();
        t2.join().unwrap();
        t3.join().unwrap();
        let s1 = pool.snapshot();
        invariants(&s1);
        no_failures(&s1);
        assert_eq!((s1.live_count, s1.frees), (0, 2));
        assert_eq!(s1.physical_bytes, s1.block_free_bytes, "{s1:#?}");
        books_match_driver(&s1, &sim);
        pool.trim().unwrap();
        let s2 = pool.snapshot();
        invariants(&s2);
        assert_eq!(
            (
                s2.physical_bytes,
                s2.mappings_released,
                s2.events_outstanding
            ),
            (0, 2, 0),
            "{s2:#?}"
        );
        assert_eq!(sim.call_count(DriverCall::Synchronize), 0);
        assert!(sim.faults().is_empty(), "driver faults: {:?}", sim.faults());
        books_match_driver(&s2, &sim);
        drop_and_check_empty(pool, sim);
    });
}
