//! Stream order through the C ABI (`src/ffi/stream.rs`): issue 11 through the C
//! functions. The ABI's shape (NULL arguments, statuses, outputs written only on
//! success) is checked first; then the semantics of the issue on the simulated
//! backend, each ending with no contract fault.

use crate::driver::sim::SimStreamCall;
use crate::{CrossStreamReuse, DriverCall};

use super::*;

#[test]
fn stream_calls_refuse_null_arguments_and_write_nothing() {
    let pool = create(&config());
    let s = stream_create(pool);
    let live = allocate_on(pool, MIB as usize, s);
    let before = snap(pool);
    let null = ptr::null_mut::<FlarePool>();
    let sentinel = 0x5e5e as *mut c_void;
    let mut out = sentinel;
    let mut stream_out = sentinel;
    let mut valid: std::ffi::c_int = 7;
    let mut n = 77_u64;
    // SAFETY: NULL pools and outputs are refused before anything is read; the
    // non-NULL outputs are writable locals.
    unsafe {
        let refused = [
            flare_package_allocate_async(null, 1, s, &mut out),
            flare_package_free_async(null, live, s),
            flare_package_free_async(null, ptr::null_mut(), s),
            flare_package_record_stream(null, live, s),
            flare_sim_stream_create(null, &mut stream_out),
            flare_sim_launch(null, s, live, 1),
            flare_sim_stream_complete(null, s),
            flare_sim_begin_capture(null, s),
            flare_sim_end_capture(null, s, &mut valid),
            flare_sim_faults(null, &mut n),
        ];
        for (i, st) in refused.into_iter().enumerate() {
            assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT, "call {i}");
        }
        assert!(last_error().contains("flare_sim_faults: invalid argument: pool is NULL"));
        // NULL outputs.
        let st = flare_package_allocate_async(pool, 1, s, ptr::null_mut());
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("out_ptr is NULL"), "{}", last_error());
        let st = flare_sim_stream_create(pool, ptr::null_mut());
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("out_stream is NULL"));
        let st = flare_sim_end_capture(pool, s, ptr::null_mut());
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("out_valid is NULL"));
        let st = flare_sim_faults(pool, ptr::null_mut());
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("out_faults is NULL"));
        // A misaligned output is refused too, not written.
        let mut words = [0xabab_u64; 2];
        let odd = words.as_mut_ptr().cast::<u8>().add(1).cast::<u64>();
        let st = flare_sim_faults(pool, odd);
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("out_faults is misaligned"));
        assert_eq!(words, [0xabab; 2]);
        // NULL pointers to free or record: no-ops, as for flare_package_free.
        ok(flare_package_free_async(pool, ptr::null_mut(), s));
        ok(flare_package_free_async(
            pool,
            ptr::null_mut(),
            ptr::null_mut(),
        ));
        ok(flare_package_record_stream(pool, ptr::null_mut(), s));
        // Sizes: 0 is refused, and so is one beyond the device; nothing written.
        let (st, p) = allocate_async(pool, 0, s);
        assert_eq!(
            (st, p),
            (FlareStatus::FLARE_STATUS_INVALID_ARGUMENT, sentinel)
        );
        assert!(last_error().contains("0 bytes"), "{}", last_error());
        let (st, p) = allocate_async(pool, usize::MAX, s);
        assert_eq!(
            (st, p),
            (FlareStatus::FLARE_STATUS_INVALID_ARGUMENT, sentinel)
        );
        // Pointers: unknown, interior.
        let interior = live.cast::<u8>().add(4096).cast::<c_void>();
        for bad in [0x1234 as *mut c_void, interior] {
            let st = flare_package_free_async(pool, bad, s);
            assert_eq!(st, FlareStatus::FLARE_STATUS_UNKNOWN_POINTER);
            let st = flare_package_record_stream(pool, bad, s);
            assert_eq!(st, FlareStatus::FLARE_STATUS_UNKNOWN_POINTER);
        }
        assert!(last_error().starts_with("flare_package_record_stream: unknown pointer"));
    }
    assert_eq!(
        (out, stream_out, valid, n),
        (sentinel, sentinel, 7, 77),
        "outputs only on success"
    );
    assert_eq!(snap(pool), before, "nothing changed");
    // The legacy stream (NULL) is a stream like another for the calls that take one.
    // SAFETY: `pool` is live, `live` its allocation.
    ok(unsafe { flare_package_record_stream(pool, live, ptr::null_mut()) });
    free_on(pool, live, s);
    complete(pool, s);
    complete(pool, ptr::null_mut());
    // A second free is an unknown pointer.
    // SAFETY: `pool` is live.
    let st = unsafe { flare_package_free_async(pool, live, s) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_UNKNOWN_POINTER);
    trim_check_destroy(pool);
}

// ---- the semantics (they need the stream-ordered engine of issue 11)

/// Issue 11: "memory whose last free was on S is handed out at once (stream order
/// makes it safe)", and "no host synchronization, ever, on this path", with the
/// default release threshold (0) and work still queued on the memory.
#[test]
fn free_async_then_allocate_async_on_the_same_stream_reuses_at_once() {
    let pool = stream_pool(0, 0);
    let sim = snap_sim(pool);
    let s = stream_create(pool);
    let p = allocate_on(pool, 3 * MIB as usize, s);
    launch(pool, s, p, 3 * MIB);
    free_on(pool, p, s);
    let after_free = snap(pool);
    assert_eq!(
        (
            after_free.live_count,
            after_free.idle_bytes,
            after_free.physical_bytes
        ),
        (0, 4 * MIB, 4 * MIB),
        "kept idle, not released, while S's work touches it"
    );
    assert_eq!(
        after_free.event_wait_bytes,
        4 * MIB,
        "S's work up to the free is not complete"
    );
    let q = allocate_on(pool, 3 * MIB as usize, s);
    assert_eq!(q, p, "the same stream gets it back at once");
    let s2 = snap(pool);
    assert_eq!((s2.reuse_hits, s2.cross_stream_hits), (1, 0));
    assert_eq!(faults(pool), 0);
    assert_eq!(sim.queued_work().len(), 1, "the launch is still queued");
    // No host synchronization on these paths: no device, stream or event synchronize.
    assert_eq!(sim.call_count(DriverCall::Synchronize), 0);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventSynchronize), 0);
    assert_eq!(sim.stream_call_count(SimStreamCall::StreamSynchronize), 0);
    free_on(pool, q, s);
    complete(pool, s);
    trim_check_destroy(pool);
}

/// Issue 11, `cross_stream_reuse` "when complete" (the default): memory freed on S is
/// handed to another stream T only once S's work up to the free has completed. A
/// release threshold keeps the completed memory cached, so that T can get it.
#[test]
fn another_stream_gets_freed_memory_only_after_the_free_completes() {
    let pool = stream_pool(64 * MIB, 0);
    let s = stream_create(pool);
    let t = stream_create(pool);
    let p = allocate_on(pool, 2 * MIB as usize, s);
    launch(pool, s, p, 2 * MIB);
    free_on(pool, p, s);
    let r = allocate_on(pool, 2 * MIB as usize, t);
    assert_ne!(r, p, "T must not get memory S's queued work still touches");
    assert_eq!(faults(pool), 0);
    assert_eq!(snap(pool).cross_stream_hits, 0);
    complete(pool, s);
    let u = allocate_on(pool, 2 * MIB as usize, t);
    assert_eq!(u, p, "S's work completed: T gets it");
    let st = snap(pool);
    assert_eq!((st.cross_stream_hits, st.cross_stream_waits), (1, 0));
    assert_eq!(faults(pool), 0);
    free_on(pool, r, t);
    free_on(pool, u, t);
    trim_check_destroy(pool);
}

/// Issue 11, `cross_stream_reuse` "wait": memory freed on S is handed to T at once,
/// after making T wait on a fence recorded on S (`cuStreamWaitEvent`), so the hand-off
/// is ordered and no fault is seen.
#[test]
fn cross_stream_wait_hands_memory_over_at_once_with_a_wait() {
    let pool = stream_pool(0, CrossStreamReuse::Wait as u32);
    let sim = snap_sim(pool);
    let s = stream_create(pool);
    let t = stream_create(pool);
    let p = allocate_on(pool, 2 * MIB as usize, s);
    launch(pool, s, p, 2 * MIB);
    free_on(pool, p, s);
    let r = allocate_on(pool, 2 * MIB as usize, t);
    assert_eq!(r, p, "handed over at once");
    let st = snap(pool);
    assert_eq!((st.cross_stream_hits, st.cross_stream_waits), (1, 1));
    assert!(sim.stream_call_count(SimStreamCall::StreamWaitEvent) >= 1);
    assert_eq!(faults(pool), 0);
    free_on(pool, r, t);
    complete(pool, t); // T's work, and S's work it waits on
    trim_check_destroy(pool);
}

/// Issue 11: "a free never synchronizes, never unmaps and records nothing that breaks
/// the capture; memory freed during the capture is reused only by later allocations
/// on the same capture, and afterwards is kept ... with none open, until trim or
/// destroy". No retention scope anywhere, release threshold 0.
#[test]
fn a_free_async_during_a_capture_leaves_it_valid_without_a_scope() {
    let pool = stream_pool(0, 0);
    let s = stream_create(pool);
    let t = stream_create(pool);
    let before = allocate_on(pool, 2 * MIB as usize, s);
    // SAFETY: `pool` is live.
    ok(unsafe { flare_sim_begin_capture(pool, s) });
    let inside = allocate_on(pool, 2 * MIB as usize, s);
    launch(pool, s, inside, 2 * MIB);
    free_on(pool, inside, s);
    free_on(pool, before, s);
    let again = allocate_on(pool, 2 * MIB as usize, s);
    free_on(pool, again, s);
    assert_eq!(faults(pool), 0, "nothing broke the capture");
    assert!(end_capture(pool, s), "the capture ended valid");
    let st = snap(pool);
    assert_eq!(st.live_count, 0);
    assert!(st.physical_bytes >= 4 * MIB, "{st:?}");
    assert_eq!(
        st.capture_held_bytes, st.physical_bytes,
        "everything freed in the capture is kept for the graph"
    );
    assert!(st.captures_seen >= 1);
    // After the capture, neither another stream nor the capturing one gets it.
    let on_t = allocate_on(pool, 2 * MIB as usize, t);
    let on_s = allocate_on(pool, 2 * MIB as usize, s);
    for p in [on_t, on_s] {
        assert!(
            p != before && p != inside && p != again,
            "memory a graph may replay into was handed out"
        );
    }
    free_on(pool, on_t, t);
    free_on(pool, on_s, s);
    assert_eq!(faults(pool), 0);
    // Trim releases what the capture held (no scope was open).
    trim_check_destroy(pool);
}

/// Issue 11: after `record_stream(p, T)`, a free of p on S waits for T's work too: p
/// is not handed back, even on S, while T's queued work touches it.
#[test]
fn record_stream_keeps_memory_from_reuse_while_the_recorded_stream_uses_it() {
    let pool = stream_pool(64 * MIB, 0);
    let s = stream_create(pool);
    let t = stream_create(pool);
    let p = allocate_on(pool, 2 * MIB as usize, s);
    // SAFETY: `pool` is live, `p` its allocation.
    ok(unsafe { flare_package_record_stream(pool, p, t) });
    launch(pool, t, p, 2 * MIB);
    free_on(pool, p, s);
    let q = allocate_on(pool, 2 * MIB as usize, s);
    assert_ne!(q, p, "T's queued work still touches p");
    assert_eq!(faults(pool), 0);
    complete(pool, t);
    free_on(pool, q, s);
    trim_check_destroy(pool);
}
