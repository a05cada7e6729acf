//! `Snapshot::check_invariants` catches each invariant of the `Snapshot`
//! documentation broken alone.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use common::MIB;
use flare_package::{Pool, PoolConfig, Snapshot};

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// A snapshot that satisfies every invariant of `Snapshot`'s documentation, with
/// each inequality at its boundary (equal), so that breaking any one by a little
/// breaks only that one.
fn valid() -> Snapshot {
    Snapshot {
        granularity_bytes: G,
        // Two whole mappings and one block live.
        live_count: 3,
        live_mapped_bytes: 2 * G,
        block_live_count: 1,
        block_live_bytes: 1024,
        // = live mapped + live blocks (+ sleeping, none).
        live_requested_bytes: 2 * G + 1024,
        idle_count: 1,
        idle_bytes: G,
        pending_count: 1,
        pending_bytes: G,
        segment_count: 1,
        segment_handles: 1,
        segment_mapped_bytes: G,
        block_free_bytes: G - 1024,
        segment_handles_lent: 1,
        // = segment mapped + idle.
        segment_lent_bytes: 2 * G,
        // = live mapped + idle + pending + segment mapped.
        physical_bytes: 5 * G,
        peak_physical_bytes: 5 * G,
        peak_live_mapped_bytes: 2 * G,
        reserved_bytes: 8 * G,
        allocations: 10,
        frees: 7,
        reuse_hits: 4,
        reuse_exact_hits: 4,
        reuse_forced_hits: 4,
        thread_cache_hits: 4,
        cross_stream_hits: 4,
        cross_stream_waits: 4,
        thread_cache_count: 2,
        // = idle + free blocks.
        thread_cache_bytes: 2 * G - 1024,
        event_wait_bytes: G,
        capture_held_bytes: G - 1024,
        ..Snapshot::default()
    }
}

/// [`valid`] with a tag asleep: three sleeping allocations (all blocks, all held),
/// again at every boundary.
fn valid_sleeping() -> Snapshot {
    let s = valid();
    Snapshot {
        tags_sleeping: 1,
        sleeping_count: 3,
        sleeping_held_count: 3,
        sleeping_bytes: 1024,
        sleeping_held_bytes: G,
        sleeping_block_count: 3,
        sleeping_block_bytes: 1024,
        offloaded_bytes: 1024,
        physical_bytes: s.physical_bytes + G,
        peak_physical_bytes: s.physical_bytes + G,
        live_requested_bytes: s.live_requested_bytes + 1024 + G,
        ..s
    }
}

/// `Snapshot::check_invariants`: "checks the accounting invariants; returns a
/// description of the first one broken". Every invariant the `Snapshot`
/// documentation lists (and each further one the check states) is broken alone,
/// from a snapshot that holds them all at their boundaries.
#[test]
fn check_invariants_catches_each_broken_invariant() {
    let g = G;
    // Valid ones first: at every boundary, with and without sleeping tags, empty.
    let fresh = Pool::new(PoolConfig::default()).unwrap().snapshot();
    for (name, s) in [
        ("valid", valid()),
        ("valid sleeping", valid_sleeping()),
        ("fresh pool", fresh),
        (
            "one live",
            Snapshot {
                granularity_bytes: g,
                live_count: 1,
                live_mapped_bytes: g,
                physical_bytes: g,
                peak_physical_bytes: g,
                peak_live_mapped_bytes: g,
                allocations: 1,
                ..Snapshot::default()
            },
        ),
    ] {
        assert_eq!(s.check_invariants(), Ok(()), "{name}: {s:#?}");
    }

    let v = valid();
    let z = valid_sleeping();
    let one_live = Snapshot {
        granularity_bytes: g,
        live_count: 1,
        live_mapped_bytes: g,
        physical_bytes: g,
        peak_physical_bytes: g,
        peak_live_mapped_bytes: g,
        allocations: 1,
        ..Snapshot::default()
    };
    // (what is broken, a word of the description, the snapshot)
    let broken: Vec<(&str, &str, Snapshot)> = vec![
        (
            "physical above the sum of its parts",
            "physical",
            Snapshot {
                physical_bytes: 6 * g,
                peak_physical_bytes: 6 * g,
                ..v
            },
        ),
        (
            "physical below the sum of its parts",
            "physical",
            Snapshot {
                physical_bytes: 4 * g,
                ..v
            },
        ),
        (
            "sleeping held bytes left out of physical",
            "physical",
            Snapshot {
                physical_bytes: v.physical_bytes,
                ..z
            },
        ),
        (
            "sleeping bytes with no tag asleep",
            "asleep",
            Snapshot {
                tags_sleeping: 0,
                ..z
            },
        ),
        (
            // Sleeping bytes not held (offloaded or discarded blocks) alone: their
            // sum with the held and offloaded bytes is not 0, though neither of those
            // is.
            "unheld sleeping bytes with no tag asleep",
            "asleep",
            Snapshot {
                sleeping_count: 1,
                sleeping_bytes: 1024,
                sleeping_block_count: 1,
                sleeping_block_bytes: 1024,
                live_requested_bytes: v.live_requested_bytes + 1024,
                ..v
            },
        ),
        (
            "offloaded bytes with no tag asleep",
            "asleep",
            Snapshot {
                offloaded_bytes: 1024,
                ..v
            },
        ),
        (
            "more held sleeping than sleeping",
            "sleeping counts",
            Snapshot {
                sleeping_held_count: 4,
                ..z
            },
        ),
        (
            "more sleeping than live",
            "sleeping counts",
            Snapshot {
                sleeping_count: 4,
                ..z
            },
        ),
        (
            "sleeping allocations with no sleeping bytes",
            "sleeping counts",
            Snapshot {
                tags_sleeping: 1,
                sleeping_count: 1,
                ..v
            },
        ),
        (
            "sleeping bytes with no sleeping allocation",
            "sleeping counts",
            Snapshot {
                tags_sleeping: 1,
                sleeping_bytes: 1024,
                live_requested_bytes: v.live_requested_bytes + 1024,
                ..v
            },
        ),
        (
            "held sleeping count without held bytes",
            "sleeping counts",
            Snapshot {
                sleeping_held_bytes: 0,
                physical_bytes: z.physical_bytes - g,
                live_requested_bytes: z.live_requested_bytes - g,
                ..z
            },
        ),
        (
            "held sleeping bytes without a held count",
            "sleeping counts",
            Snapshot {
                sleeping_held_count: 0,
                ..z
            },
        ),
        (
            "more sleeping blocks than sleeping allocations",
            "sleeping block",
            Snapshot {
                sleeping_block_count: 4,
                ..z
            },
        ),
        (
            "sleeping block bytes above sleeping bytes",
            "sleeping block",
            Snapshot {
                sleeping_block_bytes: 1536,
                ..z
            },
        ),
        (
            "sleeping blocks without bytes",
            "sleeping block",
            Snapshot {
                sleeping_block_bytes: 0,
                ..z
            },
        ),
        (
            "sleeping block bytes without blocks",
            "sleeping block",
            Snapshot {
                sleeping_block_count: 0,
                ..z
            },
        ),
        (
            "segment mapped below live + free blocks",
            "segment mapped",
            Snapshot {
                block_free_bytes: v.block_free_bytes + 512,
                ..v
            },
        ),
        (
            "more live blocks than live allocations",
            "live blocks",
            Snapshot {
                block_live_count: 4,
                ..v
            },
        ),
        (
            "live block bytes without live blocks",
            "live block count",
            Snapshot {
                block_live_count: 0,
                ..v
            },
        ),
        (
            "live blocks without live block bytes",
            "live block count",
            Snapshot {
                block_live_bytes: 0,
                block_free_bytes: g,
                live_requested_bytes: 2 * g,
                ..v
            },
        ),
        (
            "segment mapped bytes without segment handles",
            "segment handles",
            Snapshot {
                segment_handles: 0,
                ..v
            },
        ),
        (
            "lent bytes without lent handles",
            "lent handles",
            Snapshot {
                segment_handles_lent: 0,
                ..v
            },
        ),
        (
            "lent handles without lent bytes",
            "lent handles",
            Snapshot {
                segment_lent_bytes: 0,
                ..v
            },
        ),
        (
            "lent bytes above segment mapped + idle",
            "lent bytes above",
            Snapshot {
                segment_lent_bytes: 3 * g,
                ..v
            },
        ),
        (
            "live block bytes not a multiple of 512",
            "512",
            Snapshot {
                block_live_bytes: 1280,
                block_free_bytes: g - 1280,
                live_requested_bytes: v.live_requested_bytes + 256,
                thread_cache_bytes: v.thread_cache_bytes - 256,
                capture_held_bytes: v.capture_held_bytes - 256,
                ..v
            },
        ),
        (
            // Free block bytes alone off the 512-byte step (the live ones on it): the
            // segment's mapped bytes, their sum, then off the granularity too, which
            // is checked later and must not be what reports it.
            "free block bytes not a multiple of 512",
            "512",
            Snapshot {
                block_free_bytes: v.block_free_bytes + 256,
                segment_mapped_bytes: v.segment_mapped_bytes + 256,
                physical_bytes: v.physical_bytes + 256,
                peak_physical_bytes: v.peak_physical_bytes + 256,
                ..v
            },
        ),
        (
            "physical above its peak",
            "peak",
            Snapshot {
                peak_physical_bytes: 5 * g - 1,
                ..v
            },
        ),
        (
            "live mapped above its peak",
            "peak",
            Snapshot {
                peak_live_mapped_bytes: 2 * g - 1,
                ..v
            },
        ),
        (
            "live requested above live bytes",
            "live requested",
            Snapshot {
                live_requested_bytes: v.live_requested_bytes + 1,
                ..v
            },
        ),
        (
            "live requested above live bytes (sleeping)",
            "live requested",
            Snapshot {
                live_requested_bytes: z.live_requested_bytes + 1,
                ..z
            },
        ),
        (
            "more thread-cache hits than reuse hits",
            "thread-cache hits",
            Snapshot {
                thread_cache_hits: 5,
                ..v
            },
        ),
        (
            "thread-cache bytes without entries",
            "thread-cache count",
            Snapshot {
                thread_cache_count: 0,
                ..v
            },
        ),
        (
            "thread-cache entries without bytes",
            "thread-cache count",
            Snapshot {
                thread_cache_bytes: 0,
                ..v
            },
        ),
        (
            "thread-cache bytes above idle + free blocks",
            "thread-cache bytes",
            Snapshot {
                thread_cache_bytes: v.thread_cache_bytes + 512,
                ..v
            },
        ),
        (
            "more exact hits than hits",
            "exact",
            Snapshot {
                reuse_exact_hits: 5,
                ..v
            },
        ),
        (
            "more forced hits than hits",
            "forced",
            Snapshot {
                reuse_forced_hits: 5,
                ..v
            },
        ),
        (
            "event-wait + capture-held above idle + free blocks (capture)",
            "event-wait",
            Snapshot {
                capture_held_bytes: v.capture_held_bytes + 512,
                ..v
            },
        ),
        (
            "event-wait + capture-held above idle + free blocks (event)",
            "event-wait",
            Snapshot {
                event_wait_bytes: v.event_wait_bytes + 512,
                ..v
            },
        ),
        (
            "more cross-stream hits than hits",
            "cross-stream hits",
            Snapshot {
                cross_stream_hits: 5,
                ..v
            },
        ),
        (
            "more cross-stream waits than cross-stream hits",
            "cross-stream waits",
            Snapshot {
                cross_stream_waits: 5,
                ..v
            },
        ),
        (
            "allocations above frees + live",
            "allocations",
            Snapshot {
                allocations: 11,
                ..v
            },
        ),
        (
            "allocations below frees + live",
            "allocations",
            Snapshot { frees: 8, ..v },
        ),
        (
            "live mapped not a multiple of the granularity",
            "live mapped bytes",
            Snapshot {
                live_mapped_bytes: v.live_mapped_bytes + 4096,
                peak_live_mapped_bytes: v.live_mapped_bytes + 4096,
                physical_bytes: v.physical_bytes + 4096,
                peak_physical_bytes: v.physical_bytes + 4096,
                ..v
            },
        ),
        (
            "idle not a multiple of the granularity",
            "idle bytes",
            Snapshot {
                idle_bytes: v.idle_bytes + 4096,
                physical_bytes: v.physical_bytes + 4096,
                peak_physical_bytes: v.physical_bytes + 4096,
                ..v
            },
        ),
        (
            "pending not a multiple of the granularity",
            "pending bytes",
            Snapshot {
                pending_bytes: v.pending_bytes + 4096,
                physical_bytes: v.physical_bytes + 4096,
                peak_physical_bytes: v.physical_bytes + 4096,
                ..v
            },
        ),
        (
            "reserved not a multiple of the granularity",
            "reserved bytes",
            Snapshot {
                reserved_bytes: v.reserved_bytes + 4096,
                ..v
            },
        ),
        (
            "segment mapped not a multiple of the granularity",
            "segment mapped bytes",
            Snapshot {
                segment_mapped_bytes: v.segment_mapped_bytes + 4096,
                block_free_bytes: v.block_free_bytes + 4096,
                physical_bytes: v.physical_bytes + 4096,
                peak_physical_bytes: v.physical_bytes + 4096,
                ..v
            },
        ),
        (
            "live bytes with no live allocation",
            "live count",
            Snapshot {
                live_count: 0,
                allocations: 0,
                ..one_live
            },
        ),
        (
            "a live allocation with no live bytes",
            "live count",
            Snapshot {
                live_mapped_bytes: 0,
                physical_bytes: 0,
                ..one_live
            },
        ),
        (
            "idle bytes with no idle mapping",
            "idle count",
            Snapshot { idle_count: 0, ..v },
        ),
        (
            "an idle mapping with no idle bytes",
            "idle count",
            Snapshot {
                granularity_bytes: g,
                idle_count: 1,
                ..Snapshot::default()
            },
        ),
    ];
    for (what, word, s) in broken {
        match s.check_invariants() {
            Ok(()) => panic!("{what}: accepted\n{s:#?}"),
            Err(e) => assert!(e.contains(word), "{what}: reported as {e:?}"),
        }
    }
}
