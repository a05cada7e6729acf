//! The C types' layouts, their prefix rule and their conversions.

use super::*;
use crate::driver::DriverCall;
use crate::pool::{CrossStreamReuse, ReusePolicy, Snapshot};
use std::ffi::CStr;
use std::mem::offset_of;

/// `struct_prefix` of `T` for each `(struct_size, prefix)`; `None`: refused.
fn check_prefixes<T>(ends: &[usize], cases: &[(u32, Option<usize>)]) {
    for &(size, want) in cases {
        assert_eq!(
            struct_prefix::<T>("s", size, ends).ok(),
            want,
            "struct_size {size}"
        );
    }
}

#[test]
fn struct_prefix_rounds_down_to_field_boundaries() {
    assert_eq!(
        FlareSnapshot::FIELD_ENDS.last().copied(),
        Some(size_of::<FlareSnapshot>())
    );
    check_prefixes::<FlareSnapshot>(
        &FlareSnapshot::FIELD_ENDS,
        &[
            (0, None),
            (7, None),
            (4097, None),
            (8, Some(8)),
            (23, Some(16)),
            // A caller compiled before reuse_forced_hits (240 bytes) gets the
            // fields up to reserve_failures.
            (240, Some(240)),
            (247, Some(240)),
            // A caller compiled before the segment counters (304 bytes, up to
            // stream_call_failures): not one of them.
            (304, Some(304)),
            (311, Some(304)),
            // Ending inside block_free_bytes (344..352): the fields before it.
            (351, Some(344)),
            (352, Some(352)),
            // Ending inside segment_lent_bytes (360..368).
            (367, Some(360)),
            // A caller compiled before the thread-cache counters (368 bytes, up to
            // segment_lent_bytes): not one of them.
            (368, Some(368)),
            (375, Some(368)),
            // Ending inside thread_cache_hits (384..392): the fields before it.
            (391, Some(384)),
            (392, Some(392)),
            // A caller compiled before the sleep counters (400 bytes, up to
            // remote_frees, issue 13): not one of them.
            (400, Some(400)),
            (407, Some(400)),
            // Ending inside offloaded_bytes (440..448): the fields before it.
            (447, Some(440)),
            // A caller compiled before the sleeping block counters (448 bytes, up
            // to offloaded_bytes): not one of them.
            (448, Some(448)),
            (455, Some(448)),
            // Ending inside sleeping_block_bytes (456..464).
            (463, Some(456)),
            // A caller compiled before the kept host buffer (464 bytes, up to
            // sleeping_block_bytes): not it.
            (464, Some(464)),
            (471, Some(464)),
            // This header's 472 bytes, and a newer caller's larger struct: all.
            (472, Some(472)),
            (4096, Some(472)),
        ],
    );
    // best_fit_max_waste_percent (4 bytes at 60) filled what was the tail
    // padding; cross_stream_reuse (4 bytes at 64) grew the struct to 72, with 4
    // bytes of tail padding; segment_whole_threshold_bytes (a u64, 8-aligned:
    // at 72, after those 4 bytes, now interior padding) grew it to 80, no tail
    // padding; thread_cache_entries (4 bytes at 80) and thread_cache_bytes (a
    // u64: at 88, after 4 bytes of interior padding) grew it to 96.
    assert_eq!(offset_of!(FlarePoolConfig, best_fit_max_waste_percent), 60);
    assert_eq!(offset_of!(FlarePoolConfig, cross_stream_reuse), 64);
    assert_eq!(
        offset_of!(FlarePoolConfig, segment_whole_threshold_bytes),
        72
    );
    assert_eq!(offset_of!(FlarePoolConfig, thread_cache_entries), 80);
    assert_eq!(offset_of!(FlarePoolConfig, thread_cache_bytes), 88);
    // record_path (a pointer at 96) grew it to 104.
    assert_eq!(offset_of!(FlarePoolConfig, record_path), 96);
    // history_events (a u64 at 104, issue 38) grew it to 112.
    assert_eq!(offset_of!(FlarePoolConfig, history_events), 104);
    assert_eq!(FlarePoolConfig::FIELD_ENDS.last().copied(), Some(112));
    assert_eq!(size_of::<FlarePoolConfig>(), 112);
    check_prefixes::<FlarePoolConfig>(
        &FlarePoolConfig::FIELD_ENDS,
        &[
            (112, Some(112)),
            (4096, Some(112)),
            // A caller compiled before history_events (sizeof 104): every field up
            // to record_path, not history_events (read as 0: off).
            (104, Some(104)),
            (111, Some(104)),
            // A caller compiled before record_path (sizeof 96): every field up to
            // thread_cache_bytes, not record_path (read as NULL).
            (96, Some(96)),
            (103, Some(96)),
            // A caller compiled before the thread-cache fields (sizeof 80): up to
            // segment_whole_threshold_bytes, neither of them.
            (80, Some(80)),
            (83, Some(80)),
            // Covering thread_cache_entries but not thread_cache_bytes: the padding
            // at 84..88 is no field, so up to 95 the prefix ends at 84.
            (84, Some(84)),
            (88, Some(84)),
            (95, Some(84)),
            // A caller compiled before segment_whole_threshold_bytes (sizeof 72):
            // up to cross_stream_reuse; the padding after it is no field.
            (72, Some(68)),
            (79, Some(68)),
            // A caller compiled before cross_stream_reuse (sizeof 64): every field
            // up to best_fit_max_waste_percent, not the new one.
            (64, Some(64)),
            (67, Some(64)),
            (68, Some(68)),
            // An older caller whose struct ended with sim_device_count (at 60).
            (60, Some(60)),
            // peer_device_count ends at 36; 40 has padding, then
            // sim_capacity_bytes.
            (40, Some(36)),
        ],
    );
    assert_eq!(FlareDestroyReport::FIELD_ENDS, [4, 8, 16, 24, 32, 40]);
}

#[test]
fn snapshot_layout_keeps_its_order_and_adds_at_the_end() {
    // The offsets of the C struct as 0.1.0's first header had them, by hand: the
    // new field goes after them, nothing moves.
    assert_eq!(offset_of!(FlareSnapshot, scope_open), 4);
    assert_eq!(offset_of!(FlareSnapshot, granularity_bytes), 8);
    assert_eq!(offset_of!(FlareSnapshot, oom_retries), 8 + 18 * 8);
    assert_eq!(offset_of!(FlareSnapshot, map_failures), 8 + 19 * 8);
    assert_eq!(offset_of!(FlareSnapshot, scopes_aborted), 8 + 26 * 8);
    assert_eq!(offset_of!(FlareSnapshot, create_failures), 224);
    assert_eq!(offset_of!(FlareSnapshot, reserve_failures), 232);
    assert_eq!(offset_of!(FlareSnapshot, reuse_forced_hits), 240);
    // The stream-order counters (issue 11), after it: 8 at 248, the last of 7
    // ending at 304 (0.1.0's second header).
    assert_eq!(offset_of!(FlareSnapshot, events_outstanding), 248);
    assert_eq!(offset_of!(FlareSnapshot, stream_call_failures), 296);
    // The eight segment counters (issue 12), after those: 304 to 368.
    assert_eq!(offset_of!(FlareSnapshot, segment_count), 304);
    assert_eq!(offset_of!(FlareSnapshot, segment_handles), 312);
    assert_eq!(offset_of!(FlareSnapshot, segment_mapped_bytes), 320);
    assert_eq!(offset_of!(FlareSnapshot, block_live_count), 328);
    assert_eq!(offset_of!(FlareSnapshot, block_live_bytes), 336);
    assert_eq!(offset_of!(FlareSnapshot, block_free_bytes), 344);
    assert_eq!(offset_of!(FlareSnapshot, segment_handles_lent), 352);
    assert_eq!(offset_of!(FlareSnapshot, segment_lent_bytes), 360);
    // The four thread-cache counters (issue 13), after those: 368 to 400.
    assert_eq!(offset_of!(FlareSnapshot, thread_cache_count), 368);
    assert_eq!(offset_of!(FlareSnapshot, thread_cache_bytes), 376);
    assert_eq!(offset_of!(FlareSnapshot, thread_cache_hits), 384);
    assert_eq!(offset_of!(FlareSnapshot, remote_frees), 392);
    // The six sleep counters (issue 15), after those: 400 to 448.
    assert_eq!(offset_of!(FlareSnapshot, tags_sleeping), 400);
    assert_eq!(offset_of!(FlareSnapshot, sleeping_count), 408);
    assert_eq!(offset_of!(FlareSnapshot, sleeping_bytes), 416);
    assert_eq!(offset_of!(FlareSnapshot, sleeping_held_count), 424);
    assert_eq!(offset_of!(FlareSnapshot, sleeping_held_bytes), 432);
    assert_eq!(offset_of!(FlareSnapshot, offloaded_bytes), 440);
    // The two sleeping block counters (segments per tag), after those: 448 to 464.
    assert_eq!(offset_of!(FlareSnapshot, sleeping_block_count), 448);
    assert_eq!(offset_of!(FlareSnapshot, sleeping_block_bytes), 456);
    // The kept host buffer's bytes (issue 15), after those: 464 to 472.
    assert_eq!(offset_of!(FlareSnapshot, host_kept_bytes), 464);
    assert_eq!(size_of::<FlareSnapshot>(), 472);
    // The tag census: two u32, six u64; then the zeroing wake's two (issue 34).
    assert_eq!(offset_of!(FlareTagCensus, live_count), 8);
    assert_eq!(offset_of!(FlareTagCensus, offloaded_bytes), 48);
    assert_eq!(offset_of!(FlareTagCensus, zeroed_bytes), 56);
    assert_eq!(offset_of!(FlareTagCensus, zero_memsets), 64);
    assert_eq!(size_of::<FlareTagCensus>(), 72);
}

#[test]
fn snapshot_conversion_copies_each_counter_to_its_own_field() {
    // Counters of each kind set to distinct values, the others left 0.
    let s = Snapshot {
        scope_open: true,
        granularity_bytes: 2 << 20,
        live_count: 3,
        live_requested_bytes: 5,
        reuse_hits: 7,
        reuse_exact_hits: 11,
        map_failures: 13,
        reserve_failures: 17,
        reuse_forced_hits: 19,
        segment_count: 23,
        segment_handles: 29,
        segment_mapped_bytes: 31,
        block_live_count: 37,
        block_live_bytes: 41,
        block_free_bytes: 43,
        segment_handles_lent: 47,
        segment_lent_bytes: 53,
        thread_cache_count: 59,
        thread_cache_bytes: 61,
        thread_cache_hits: 67,
        remote_frees: 71,
        tags_sleeping: 73,
        sleeping_count: 79,
        sleeping_bytes: 83,
        sleeping_held_count: 89,
        sleeping_held_bytes: 97,
        offloaded_bytes: 101,
        sleeping_block_count: 103,
        sleeping_block_bytes: 107,
        host_kept_bytes: 109,
        ..Snapshot::default()
    };
    let c = FlareSnapshot::from_snapshot(&s);
    assert_eq!((c.struct_size, c.scope_open), (472, 1));
    assert_eq!((c.sleeping_block_count, c.sleeping_block_bytes), (103, 107));
    assert_eq!(c.host_kept_bytes, 109);
    assert_eq!(
        (
            c.tags_sleeping,
            c.sleeping_count,
            c.sleeping_bytes,
            c.sleeping_held_count,
            c.sleeping_held_bytes,
            c.offloaded_bytes
        ),
        (73, 79, 83, 89, 97, 101)
    );
    assert_eq!(
        (c.granularity_bytes, c.live_count, c.live_requested_bytes),
        (2 << 20, 3, 5)
    );
    assert_eq!(
        (c.reuse_hits, c.reuse_exact_hits, c.reuse_forced_hits),
        (7, 11, 19)
    );
    assert_eq!((c.map_failures, c.reserve_failures), (13, 17));
    assert_eq!(
        (c.segment_count, c.segment_handles, c.segment_mapped_bytes),
        (23, 29, 31)
    );
    assert_eq!(
        (c.block_live_count, c.block_live_bytes, c.block_free_bytes),
        (37, 41, 43)
    );
    assert_eq!((c.segment_handles_lent, c.segment_lent_bytes), (47, 53));
    assert_eq!(
        (
            c.thread_cache_count,
            c.thread_cache_bytes,
            c.thread_cache_hits
        ),
        (59, 61, 67)
    );
    assert_eq!(c.remote_frees, 71);
    assert_eq!((c.frees, c.sync_failures, c.create_failures), (0, 0, 0));
    assert_eq!((c.stream_call_failures, c.capture_held_bytes), (0, 0));
}

#[test]
fn enums_convert_from_their_numbers() {
    // The contract's numbers, written out.
    use FlareReusePolicy as P;
    assert_eq!(
        FlareBackend::from_raw(1),
        Some(FlareBackend::FLARE_BACKEND_SIMULATED)
    );
    assert_eq!(FlareBackend::from_raw(2), None);
    assert_eq!(P::from_raw(2), Some(P::FLARE_REUSE_NONE));
    assert_eq!(
        ReusePolicy::from(P::FLARE_REUSE_BEST_FIT),
        ReusePolicy::BestFit
    );
    assert_eq!(ReusePolicy::from(P::FLARE_REUSE_EXACT), ReusePolicy::Exact);
    assert_eq!(ReusePolicy::from(P::FLARE_REUSE_NONE), ReusePolicy::None);
    assert_eq!(P::from_raw(3), Some(P::FLARE_REUSE_SEGMENTS));
    assert_eq!(
        ReusePolicy::from(P::FLARE_REUSE_SEGMENTS),
        ReusePolicy::Segments
    );
    assert_eq!(P::FLARE_REUSE_SEGMENTS.name(), c"FLARE_REUSE_SEGMENTS");
    assert_eq!(P::ALL.len(), 4);
    // The cross-stream modes: 0 is the default, so that a zeroed field means it.
    use FlareCrossStreamReuse as X;
    assert_eq!(
        X::from_raw(0).map(CrossStreamReuse::from),
        Some(CrossStreamReuse::default())
    );
    assert_eq!(
        X::from_raw(0).map(CrossStreamReuse::from),
        Some(CrossStreamReuse::WhenComplete)
    );
    assert_eq!(
        X::from_raw(1).map(CrossStreamReuse::from),
        Some(CrossStreamReuse::Never)
    );
    assert_eq!(
        X::from_raw(2).map(CrossStreamReuse::from),
        Some(CrossStreamReuse::Wait)
    );
    assert_eq!(X::from_raw(3), None);
    assert_eq!(
        X::FLARE_CROSS_STREAM_WAIT.name(),
        c"FLARE_CROSS_STREAM_WAIT"
    );
    assert_eq!(
        X::parse(7, "cross_stream_reuse").map_err(|e| e.to_string()),
        Err("invalid argument: cross_stream_reuse 7 is not a FlareCrossStreamReuse (0..2)".into())
    );
    let call = FlareDriverCall::from_raw(4).map(DriverCall::from);
    assert_eq!(call, Some(DriverCall::Map));
    assert_eq!(
        FlareDriverCall::from_raw(8),
        None,
        "granularity is not in C"
    );
    assert_eq!(FlareDriverCall::ALL.len(), DriverCall::MEMORY_CALLS.len());
    assert_eq!(
        P::parse(4, "reuse_policy").map_err(|e| e.to_string()),
        Err("invalid argument: reuse_policy 4 is not a FlareReusePolicy (0..3)".into())
    );
    assert_eq!(
        FlareDriverCall::FLARE_CALL_SYNCHRONIZE.name(),
        c"FLARE_CALL_SYNCHRONIZE"
    );
    let name: &CStr = FlareBackend::FLARE_BACKEND_CUDA.name();
    assert_eq!(name, c"FLARE_BACKEND_CUDA");
}
