//! The simulated driver's contract faults (issue 11): an unmap of memory queued work
//! touches, a hand-off of memory another stream's unordered work touches, the legacy
//! stream's implicit order; every kind counted and listed.

use crate::common;

use common::mapped_for;

use std::thread;

use crate::capture_queries::{
    mapped, queued_streams, sim, sim_devices, G, INVALIDATED, LEGACY, OK, UNSUPPORTED,
};
use flare_package::driver::sim::{
    CaptureMode, SimFault, SimWork, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_READY,
    CU_STREAM_DEFAULT, CU_STREAM_NON_BLOCKING,
};

// ====================================================================== contract faults

/// Section "In-flight work: unmap does not wait": unmapping memory that queued work
/// still touches succeeds at once (the kernel would then fault) and is a contract
/// fault; after the work completed it is none. Releasing a handle that is still mapped
/// is none (row "cuMemRelease while the handle is still mapped: memory stays usable");
/// the unmap that then frees it is.
#[test]
fn unmapping_memory_queued_work_touches_is_a_fault() {
    let d = sim();
    let s = d.stream_create().unwrap();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), OK);
    assert_eq!(d.launch(s, va + G, 1), OK);
    assert_eq!(d.mem_release(h), OK);
    assert_eq!(d.contract_faults(), 0, "release of a mapped handle");
    assert_eq!(d.mem_unmap(va, 2 * G), OK);
    assert_eq!(
        d.faults(),
        vec![SimFault::UnmapWhileQueued {
            ptr: va,
            size: 2 * G,
            stream: s
        }]
    );
    assert_eq!(d.contract_faults(), 1);
    // The same after the work completed: no fault.
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va + 2 * G, 2 * G, 0, h), OK);
    assert_eq!(d.mem_set_access(va + 2 * G, 2 * G, &[0]), OK);
    assert_eq!(d.launch(LEGACY, va + 2 * G, 2 * G), OK);
    assert_eq!(d.stream_complete(LEGACY), OK);
    assert_eq!(d.mem_unmap(va + 2 * G, 2 * G), OK);
    assert_eq!(d.mem_release(h), OK);
    assert_eq!(d.contract_faults(), 1);
    // Both handles were freed at their last unmap, the faulting one included.
    assert_eq!(d.state().physical_bytes, 0);
}

/// Work queued on a legacy stream, and work on another range, are found the same way:
/// an unmap faults only where a queued launch overlaps it.
#[test]
fn unmap_faults_only_where_queued_work_overlaps() {
    let d = sim();
    let buf = mapped(&d, 2 * G);
    let other = mapped(&d, 2 * G);
    assert_eq!(d.launch(LEGACY, buf, 2 * G), OK);
    assert_eq!(d.mem_unmap(other, 2 * G), OK);
    assert_eq!(d.contract_faults(), 0);
    assert_eq!(d.mem_unmap(buf, 2 * G), OK);
    assert_eq!(
        d.faults(),
        vec![SimFault::UnmapWhileQueued {
            ptr: buf,
            size: 2 * G,
            stream: LEGACY
        }]
    );
}

/// Handing memory to stream S while another stream T's queued work still touches it
/// is a fault unless that work is ordered before S's next work: completed, or covered
/// by an event S waited on. S's own work is in stream order.
#[test]
fn handoff_while_another_streams_unordered_work_touches_it_is_a_fault() {
    let d = sim();
    let buf = mapped(&d, 2 * G);
    let (s, t) = (d.stream_create().unwrap(), d.stream_create().unwrap());
    // S's own work: stream order.
    assert_eq!(d.launch(s, buf, G), OK);
    assert_eq!(d.note_handoff(s, buf, G), OK);
    assert_eq!(d.contract_faults(), 0);
    // T's work, unordered with S.
    assert_eq!(d.note_handoff(t, buf, 2 * G), OK);
    assert_eq!(
        d.faults(),
        vec![SimFault::HandoffWhileQueued {
            stream: t,
            ptr: buf,
            size: 2 * G,
            other: s
        }]
    );
    // An event recorded before S's work does not cover it.
    let early = d.event_create().unwrap();
    let s2 = d.stream_create().unwrap();
    assert_eq!(d.event_record(early, s2), OK);
    assert_eq!(d.launch(s2, buf + G, G), OK);
    assert_eq!(d.stream_wait_event(t, early), OK);
    assert_eq!(d.note_handoff(t, buf + G, G), OK);
    assert_eq!(d.contract_faults(), 2);
    // T waits on an event recorded after the work: ordered.
    let e = d.event_create().unwrap();
    assert_eq!(d.event_record(e, s2), OK);
    assert_eq!(d.stream_wait_event(t, e), OK);
    assert_eq!(d.note_handoff(t, buf + G, G), OK);
    assert_eq!(d.contract_faults(), 2);
    // Completed work is no obstacle.
    assert_eq!(d.stream_complete(s), OK);
    assert_eq!(d.note_handoff(t, buf, G), OK);
    assert_eq!(d.contract_faults(), 2);
    // No work on the range at all.
    let u = d.stream_create().unwrap();
    assert_eq!(d.note_handoff(u, buf, G), OK);
    assert_eq!(d.contract_faults(), 2);
    assert_eq!(d.note_handoff(0x1234, buf, G), CUDA_ERROR_INVALID_HANDLE);
}

/// The legacy default stream synchronizes with blocking streams (`CU_STREAM_DEFAULT`)
/// and not with non-blocking ones: work on the legacy stream runs after earlier work
/// of blocking streams, and work on a blocking stream after earlier legacy work. So a
/// handoff across that pair is ordered, one to or from a non-blocking stream is a
/// fault, and the device finishing the legacy stream's work has finished the blocking
/// stream's earlier work.
#[test]
fn the_legacy_stream_synchronizes_with_blocking_streams_only() {
    let d = sim();
    let buf = mapped(&d, 4 * G);
    let blocking = d.stream_create_with_flags(CU_STREAM_DEFAULT).unwrap();
    let nb = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    assert_eq!(d.launch(blocking, buf, G), OK);
    assert_eq!(d.launch(nb, buf + G, G), OK);
    assert_eq!(d.note_handoff(LEGACY, buf, G), OK);
    assert_eq!(d.contract_faults(), 0, "legacy after blocking: ordered");
    assert_eq!(d.note_handoff(LEGACY, buf + G, G), OK);
    assert_eq!(d.contract_faults(), 1, "legacy vs non-blocking: unordered");
    assert_eq!(d.launch(LEGACY, buf + 2 * G, G), OK);
    assert_eq!(d.note_handoff(blocking, buf + 2 * G, G), OK);
    assert_eq!(d.contract_faults(), 1, "blocking after legacy: ordered");
    assert_eq!(d.note_handoff(nb, buf + 2 * G, G), OK);
    assert_eq!(d.contract_faults(), 2, "non-blocking vs legacy: unordered");
    // The legacy launch ran after the blocking stream's first launch.
    assert_eq!(d.stream_complete(LEGACY), OK);
    assert_eq!(d.stream_query(blocking), OK);
    assert_eq!(d.stream_query(nb), CUDA_ERROR_NOT_READY);
    // An event recorded on the legacy stream covers blocking streams' earlier work.
    assert_eq!(d.launch(blocking, buf + 3 * G, G), OK);
    let e = d.event_create().unwrap();
    assert_eq!(d.event_record(e, LEGACY), OK);
    assert_eq!(d.event_synchronize(e), OK);
    assert_eq!(queued_streams(&d), vec![nb]);
}

/// The legacy stream is the calling thread's current device's (`cuCtxSetCurrent`):
/// two threads on two devices name different legacy streams with the same handle 0.
#[test]
fn the_legacy_stream_is_the_current_devices() {
    let d = sim_devices(2);
    let buf = mapped_for(&d, G, &[0, 1]);
    thread::scope(|sc| {
        sc.spawn(|| {
            assert_eq!(d.ctx_set_current(1), OK);
            assert_eq!(d.launch(LEGACY, buf, G), OK);
        })
        .join()
        .unwrap();
    });
    assert_eq!(
        d.queued_work(),
        vec![SimWork {
            stream: LEGACY,
            device: 1,
            ptr: buf,
            bytes: G
        }]
    );
    // This thread's legacy stream (device 0) has nothing queued.
    assert_eq!(d.stream_query(LEGACY), OK);
    assert_eq!(d.ctx_synchronize(0), OK);
    assert_eq!(d.queued_work().len(), 1);
    assert_eq!(d.ctx_synchronize(1), OK);
    assert!(d.queued_work().is_empty());
}

/// `contract_faults` counts every kind, and equals the length of `faults()`: an
/// unmap of queued memory, an unordered handoff, a broken stream capture.
#[test]
fn contract_faults_count_every_kind_and_match_the_list() {
    let d = sim();
    let buf = mapped(&d, 2 * G);
    let (s, t, a) = (
        d.stream_create().unwrap(),
        d.stream_create().unwrap(),
        d.stream_create().unwrap(),
    );
    assert_eq!(d.launch(s, buf, G), OK);
    assert_eq!(d.note_handoff(t, buf, G), OK);
    assert_eq!(d.stream_begin_capture(a, CaptureMode::Global), OK);
    assert_eq!(d.stream_query(t), UNSUPPORTED);
    assert_eq!(d.stream_end_capture(a), INVALIDATED);
    assert_eq!(d.mem_unmap(buf, 2 * G), OK);
    d.mark_busy(buf, G);
    assert_eq!(d.contract_faults(), 3);
    assert_eq!(d.faults().len(), 3);
    assert!(matches!(
        d.faults()[..],
        [
            SimFault::HandoffWhileQueued { .. },
            SimFault::CaptureBroken {
                call: "cuStreamQuery",
                capture: 1
            },
            SimFault::UnmapWhileQueued { .. }
        ]
    ));
}
