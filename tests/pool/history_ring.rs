//! The history ring (issue 38): the events a known sequence of calls writes, in
//! order, with their addresses, sizes, streams, tags and frames; the ring bounded;
//! off by default.

use crate::common::{config, On, GIB, MIB};
use flare_package::{
    set_history_frame, HistoryAction, HistoryEvent, Pool, PoolConfig, ReusePolicy, SimConfig,
    Stream,
};

use HistoryAction::*;

fn pool_with(policy: ReusePolicy, events: usize) -> Pool {
    Pool::new(PoolConfig {
        history_events: events,
        ..config(On::Sim, policy)
    })
    .unwrap()
}

fn actions(events: &[HistoryEvent]) -> Vec<(HistoryAction, u64, u64)> {
    events.iter().map(|e| (e.action, e.addr, e.size)).collect()
}

/// Whole mappings outside a scope (release threshold 0): an allocation maps a
/// mapping of the rounded size and hands out the bytes asked; a free is requested and
/// completed, then its mapping is released at once.
#[test]
fn whole_mappings_write_map_alloc_free_unmap() {
    let pool = pool_with(ReusePolicy::BestFit, 64);
    let a = pool.allocate_raw(3 * MIB).unwrap();
    let b = pool.allocate_raw(MIB).unwrap();
    pool.free_raw(a).unwrap();
    let (events, dropped) = pool.history();
    assert_eq!(dropped, 0);
    assert_eq!(
        actions(&events),
        vec![
            (SegmentMap, a, 4 * MIB),
            (Alloc, a, 3 * MIB),
            (SegmentMap, b, 2 * MIB),
            (Alloc, b, MIB),
            (FreeRequested, a, 3 * MIB),
            (FreeCompleted, a, 3 * MIB),
            (SegmentUnmap, a, 4 * MIB),
        ]
    );
    assert!(events.iter().all(|e| e.stream == 0 && e.tag == 0));
    assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(events.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    pool.free_raw(b).unwrap();
}

/// Inside a retention scope a freed mapping is retained and reused: no unmap until
/// the scope finishes, and the reuse is a second `alloc` at the same address.
#[test]
fn a_scope_retains_and_reuses_then_unmaps_at_finish() {
    let pool = pool_with(ReusePolicy::BestFit, 64);
    let scope = pool.retention_scope().unwrap();
    let a = pool.allocate_raw(GIB).unwrap();
    pool.free_raw(a).unwrap();
    let b = pool.allocate_raw(GIB - MIB).unwrap();
    assert_eq!(a, b);
    pool.free_raw(b).unwrap();
    scope.finish().unwrap();
    let (events, _) = pool.history();
    assert_eq!(
        actions(&events),
        vec![
            (SegmentMap, a, GIB),
            (Alloc, a, GIB),
            (FreeRequested, a, GIB),
            (FreeCompleted, a, GIB),
            (Alloc, a, GIB - MIB),
            (FreeRequested, a, GIB - MIB),
            (FreeCompleted, a, GIB - MIB),
            (SegmentUnmap, a, GIB),
        ]
    );
}

/// An allocation the device has no room for: an `oom` event with the bytes asked and
/// the device's free bytes, and no `alloc`.
#[test]
fn a_refused_allocation_writes_oom_with_the_free_bytes() {
    let pool = Pool::new(PoolConfig {
        history_events: 16,
        ..PoolConfig::simulated(SimConfig {
            capacity_bytes: 64 * MIB,
            ..SimConfig::default()
        })
    })
    .unwrap();
    let a = pool.allocate_raw(40 * MIB).unwrap();
    assert!(pool.allocate_raw(40 * MIB).is_err());
    let (events, _) = pool.history();
    assert_eq!(
        actions(&events),
        vec![
            (SegmentMap, a, 40 * MIB),
            (Alloc, a, 40 * MIB),
            (Oom, 0, 40 * MIB)
        ]
    );
    assert_eq!(events[2].device_free, 24 * MIB);
    assert_eq!(events[0].device_free, 0);
}

/// Segment mode: the first block maps a handle (the segment grows), the next block
/// of the heap maps nothing; the stream of a stream-ordered allocation is its own.
#[test]
fn segments_map_handles_and_blocks_carry_their_stream() {
    let pool = pool_with(ReusePolicy::Segments, 64);
    let sim = pool.sim_driver().unwrap();
    let s = Stream(sim.stream_create().unwrap());
    let a = pool.allocate_raw(1000).unwrap();
    let b = pool.allocate_raw(3000).unwrap();
    let c = pool.allocate_async_raw(5000, s).unwrap();
    pool.free_async_raw(c, s).unwrap();
    let (events, _) = pool.history();
    let got: Vec<(HistoryAction, u64, u64)> = actions(&events);
    // The synchronous heap's small segment, a block of 1024 bytes then one of 3072
    // right after it; the stream's heap a segment of its own.
    assert_eq!(got[0].0, SegmentMap);
    assert_eq!(got[0].1, a);
    assert_eq!(got[0].2, 2 * MIB);
    assert_eq!(got[1], (Alloc, a, 1000));
    assert_eq!(got[2], (Alloc, b, 3000));
    assert_eq!(b, a + 1024);
    assert_eq!((got[3].0, got[3].1), (SegmentMap, c));
    assert_eq!(events[3].stream, s.raw());
    assert_eq!(
        got[4..],
        [
            (Alloc, c, 5000),
            (FreeRequested, c, 5000),
            (FreeCompleted, c, 5000)
        ]
    );
    assert!(events[4..].iter().all(|e| e.stream == s.raw()));
    assert!(events[..3].iter().all(|e| e.stream == 0));
}

/// A tagged allocation's events carry its tag; a thread's frame goes with its events
/// until cleared.
#[test]
fn tags_and_frames_go_with_the_events() {
    let pool = pool_with(ReusePolicy::BestFit, 64);
    set_history_frame(Some("layer 7"));
    let a = pool.allocate_tagged_raw(MIB, None, 3).unwrap();
    set_history_frame(None);
    pool.free_raw(a).unwrap();
    let (events, _) = pool.history();
    assert_eq!(
        events.iter().map(|e| e.action).collect::<Vec<_>>(),
        vec![
            SegmentMap,
            Alloc,
            FreeRequested,
            FreeCompleted,
            SegmentUnmap
        ]
    );
    assert_eq!(events[1].tag, 3);
    assert_eq!(events[2].tag, 3);
    assert_eq!(events[1].frame.as_deref(), Some("layer 7"));
    assert_eq!(events[2].frame, None);
}

/// The ring keeps the last events only, and nothing when it is off (the default).
#[test]
fn the_ring_is_bounded_and_off_by_default() {
    let pool = pool_with(ReusePolicy::BestFit, 4);
    for _ in 0..5 {
        let a = pool.allocate_raw(MIB).unwrap();
        pool.free_raw(a).unwrap();
    }
    let (events, dropped) = pool.history();
    // 5 x (map, alloc, free requested, free completed, unmap) = 25 events.
    assert_eq!(dropped, 21);
    assert_eq!(
        events.iter().map(|e| e.action).collect::<Vec<_>>(),
        vec![Alloc, FreeRequested, FreeCompleted, SegmentUnmap]
    );
    let off = Pool::new(config(On::Sim, ReusePolicy::BestFit)).unwrap();
    assert!(!off.history_on());
    let a = off.allocate_raw(MIB).unwrap();
    off.free_raw(a).unwrap();
    assert_eq!(off.history(), (Vec::new(), 0));
}
