//! The simulated driver's `cuMemsetD8Async` (issue 34) and the content model's stale
//! bytes: new physical memory reads `SIM_STALE_BYTE`, not zeros; a memset sets
//! exactly its range, as stream work (an unmap before that work completes is a
//! fault), and follows the rows of `docs/vmm-semantics.md`, "Memset", and the
//! stream rules of `SimDriver::launch` (captures, the legacy stream). Expected values
//! come from the document and the call's documentation.

use flare_package::driver::sim::{
    SimConfig, SimDriver, SimFault, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
    CU_STREAM_DEFAULT, SIM_LEGACY_STREAM, SIM_STALE_BYTE,
};
use flare_package::driver::{CaptureMode, CuResult, DevicePtr, Driver, DriverCall, Stream};

const G: u64 = 2 << 20;
const OK: CuResult = CuResult::SUCCESS;
const INVALID: CuResult = CuResult::INVALID_VALUE;

fn sim() -> SimDriver {
    SimDriver::new(SimConfig::default())
}

/// A new handle of `size` bytes mapped at the start of a reservation of `res` bytes;
/// access for device 0 when `access`.
fn mapped(d: &SimDriver, size: u64, res: u64, access: bool) -> DevicePtr {
    let va = d.mem_address_reserve(res, 0).unwrap();
    let h = d.mem_create(size).unwrap();
    assert_eq!(d.mem_map(va, size, 0, h), OK);
    if access {
        assert_eq!(d.mem_set_access(va, size, &[0]), OK);
    }
    va
}

/// New physical memory holds stale bytes: a fresh handle reads `SIM_STALE_BYTE`
/// (0xFF) throughout, and so does a new handle mapped where a written one was
/// unmapped and released (its bytes went with it).
#[test]
fn new_physical_memory_reads_stale_bytes() {
    let d = sim();
    let va = mapped(&d, G, G, true);
    assert_eq!(SIM_STALE_BYTE, 0xFF);
    assert_eq!(d.read(va, G).unwrap(), vec![SIM_STALE_BYTE; G as usize]);
    assert_eq!(d.write(va, &[0; 4096]), OK);
    assert_eq!(d.mem_unmap(va, G), OK);
    let h = d.mem_create(G).unwrap();
    assert_eq!(d.mem_map(va, G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, G, &[0]), OK);
    assert_eq!(d.read(va, 4096).unwrap(), vec![SIM_STALE_BYTE; 4096]);
}

/// Row "`cuMemsetD8Async` on a mapped range with access": exactly `[ptr, ptr +
/// size)` takes the value (here from inside one 4 KiB page of the model to inside
/// another, and a whole 2 MiB handle beside), the bytes around keep theirs; the memset is
/// queued on its stream over its range and counted; an unmap before the stream's
/// work completes is a fault, after it none.
#[test]
fn row_memset_on_a_mapped_range_with_access_sets_exactly_it() {
    let d = sim();
    let va = mapped(&d, G, 2 * G, true);
    let h2 = d.mem_create(G).unwrap();
    assert_eq!(d.mem_map(va + G, G, 0, h2), OK);
    assert_eq!(d.mem_set_access(va + G, G, &[0]), OK);
    let s = d.stream_create().unwrap();
    assert_eq!(d.write(va, &[7; 20_000]), OK);
    assert_eq!(d.memset_d8_async(va + 100, 0, 10_000, s), OK);
    let got = d.read(va, 20_000).unwrap();
    let want: Vec<u8> = (0..20_000)
        .map(|i| if (100..10_100).contains(&i) { 0 } else { 7 })
        .collect();
    assert!(got == want, "only the range is set");
    assert_eq!(d.memset_d8_async(va + G, 0x5A, G, s), OK);
    assert_eq!(d.read(va + G, G).unwrap(), vec![0x5A; G as usize]);
    assert_eq!(d.read(va + G - 1, 1).unwrap(), vec![SIM_STALE_BYTE]);
    let work: Vec<(u64, DevicePtr, u64)> = d
        .queued_work()
        .iter()
        .map(|w| (w.stream, w.ptr, w.bytes))
        .collect();
    assert_eq!(work, [(s, va + 100, 10_000), (s, va + G, G)]);
    assert_eq!(d.call_count(DriverCall::MemsetD8Async), 2);
    // Through the trait, the same call.
    assert_eq!(Driver::memset_async(&d, va, 1, 1, Stream(s)), Ok(()));
    assert_eq!(d.read(va, 1).unwrap(), [1]);
    assert_eq!(d.call_count(DriverCall::MemsetD8Async), 3);
    assert_eq!(d.mem_unmap(va + G, G), OK);
    assert!(
        matches!(d.faults()[..], [SimFault::UnmapWhileQueued { stream, .. }] if stream == s),
        "{:?}",
        d.faults()
    );
    assert_eq!(d.stream_complete(s), OK);
    assert!(d.queued_work().is_empty());
    assert_eq!(d.mem_unmap(va, G), OK);
    assert_eq!(d.faults().len(), 1, "no new fault once the work completed");
}

/// Row "`cuMemsetD8Async` on a range not mapped with access": reserved but not
/// mapped, mapped without `cuMemSetAccess` (row "any access before cuMemSetAccess on
/// a new mapping"), and a range running past its mapping's end are all
/// `CUDA_ERROR_INVALID_VALUE`, counted, with nothing written or queued. A stream
/// that is not live is `CUDA_ERROR_INVALID_HANDLE`.
#[test]
fn row_memset_on_a_range_not_mapped_with_access_is_invalid_value() {
    let d = sim();
    let va = mapped(&d, G, 4 * G, true);
    let bare = d.mem_create(G).unwrap();
    assert_eq!(d.mem_map(va + 2 * G, G, 0, bare), OK);
    let s = d.stream_create().unwrap();
    assert_eq!(
        d.memset_d8_async(va + G, 0, 4096, s),
        INVALID,
        "reserved only"
    );
    assert_eq!(
        d.memset_d8_async(va + 2 * G, 0, 4096, s),
        INVALID,
        "no access"
    );
    assert_eq!(
        d.memset_d8_async(va + G - 4096, 0, 8192, s),
        INVALID,
        "across"
    );
    assert_eq!(
        d.memset_d8_async(va, 0, 4096, 0xdead_0000),
        CUDA_ERROR_INVALID_HANDLE
    );
    assert_eq!(
        d.read(va + G - 4096, 4096).unwrap(),
        vec![SIM_STALE_BYTE; 4096]
    );
    assert!(d.queued_work().is_empty());
    assert_eq!(d.call_count(DriverCall::MemsetD8Async), 4);
    assert!(d.faults().is_empty());
}

/// Fault injection takes the memset like every call: the injected code is returned,
/// the call counted, nothing written or queued; the next call works.
#[test]
fn an_injected_memset_failure_changes_nothing() {
    let d = sim();
    let va = mapped(&d, G, G, true);
    d.inject_failure(DriverCall::MemsetD8Async, 1, CuResult::UNKNOWN);
    assert_eq!(
        Driver::memset_async(&d, va, 0, G, Stream::LEGACY).map_err(|e| (e.call, e.code)),
        Err((DriverCall::MemsetD8Async, CuResult::UNKNOWN))
    );
    assert_eq!(d.read(va, 4096).unwrap(), vec![SIM_STALE_BYTE; 4096]);
    assert!(d.queued_work().is_empty());
    assert_eq!(d.memset_d8_async(va, 0, G, SIM_LEGACY_STREAM), OK);
    assert_eq!(d.read(va, G).unwrap(), vec![0; G as usize]);
    assert_eq!(d.call_count(DriverCall::MemsetD8Async), 2);
}

/// Stream rules, as for a launch: on a stream being captured the memset is a graph
/// node (nothing runs now: nothing written or queued; the capture stays valid); on
/// the legacy stream while a blocking stream is captured it is
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` and that capture is invalidated; on a stream
/// whose capture is invalidated, `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
#[test]
fn memsets_follow_the_capture_rules_of_launches() {
    let d = sim();
    let va = mapped(&d, G, G, true);
    let s = d.stream_create().unwrap();
    assert_eq!(d.stream_begin_capture(s, CaptureMode::Global), OK);
    assert_eq!(d.memset_d8_async(va, 0, 4096, s), OK);
    assert_eq!(d.read(va, 4096).unwrap(), vec![SIM_STALE_BYTE; 4096]);
    assert!(d.queued_work().is_empty());
    assert_eq!(d.stream_end_capture(s), OK);
    let blocking = d.stream_create_with_flags(CU_STREAM_DEFAULT).unwrap();
    assert_eq!(d.stream_begin_capture(blocking, CaptureMode::Global), OK);
    assert_eq!(
        d.memset_d8_async(va, 0, 4096, SIM_LEGACY_STREAM),
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    );
    assert_eq!(
        d.memset_d8_async(va, 0, 4096, blocking),
        CuResult::STREAM_CAPTURE_INVALIDATED
    );
    assert_eq!(
        d.stream_end_capture(blocking),
        CuResult::STREAM_CAPTURE_INVALIDATED
    );
    assert_eq!(d.read(va, 4096).unwrap(), vec![SIM_STALE_BYTE; 4096]);
    assert!(matches!(
        d.faults()[..],
        [SimFault::CaptureBroken {
            call: "cuMemsetD8Async",
            ..
        }]
    ));
}

/// A memset of a whole large handle keeps one byte per 4 KiB page, not the bytes:
/// 1 GiB set to 0 reads back 0 at its ends (a content model holding the bytes would
/// need 1 GiB of host memory here), and a copy of zeroed pages out and back keeps
/// them zero.
#[test]
fn a_large_memset_is_cheap() {
    let big = 1u64 << 30;
    let d = SimDriver::new(SimConfig {
        capacity_bytes: 2 * big,
        ..SimConfig::default()
    });
    let va = mapped(&d, big, big, true);
    assert_eq!(d.memset_d8_async(va, 0, big, SIM_LEGACY_STREAM), OK);
    assert_eq!(d.read(va, 8192).unwrap(), vec![0; 8192]);
    assert_eq!(d.read(va + big - 8192, 8192).unwrap(), vec![0; 8192]);
    // A copy out of the zeroed memory and back keeps the zeros.
    let host = d.mem_host_alloc(G).unwrap();
    assert_eq!(d.memcpy_dtoh(host, 0, va + G, G), OK);
    let other = mapped(&d, G, G, true);
    assert_eq!(d.memcpy_htod(other, host, 0, G), OK);
    assert_eq!(d.read(other, G).unwrap(), vec![0; G as usize]);
}
