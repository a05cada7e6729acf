//! Issue 16: rows of the simulated driver that a mutation run found unpinned. Each
//! test names the row of `docs/vmm-semantics.md` or the sentence of the simulator's
//! doc comments (`src/driver/sim/`) it checks; every expected `CUresult` comes from
//! there, not from running the simulator.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use common::mapped_for;

use flare_package::driver::sim::{SimConfig, SimDriver, SimState, SimStreamCall, SIM_MAX_DEVICES};
use flare_package::driver::{CuResult, Driver, DriverCall};

/// The simulator's default granularity (2 MiB, as measured on an H200).
const G: u64 = 2 << 20;
const OK: CuResult = CuResult::SUCCESS;
const INVALID: CuResult = CuResult::INVALID_VALUE;

fn sim() -> SimDriver {
    SimDriver::new(SimConfig::default())
}

// ---------------------------------------------------------------- cuMemMap

/// `mem_map`: "a handle never created or already released" is
/// `CUDA_ERROR_INVALID_VALUE`, also when the released handle still lives on through
/// a mapping (row "cuMemRelease while the handle is still mapped: success; memory
/// stays usable through the mapping"): its memory is usable through that mapping,
/// but the handle value no longer names anything that can be mapped again.
#[test]
fn map_of_a_handle_released_while_mapped_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(8 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), OK);
    // Released while mapped: success, the memory stays usable.
    assert_eq!(d.mem_release(h), OK);
    assert_eq!(d.touch(va, 2 * G, 0), OK);
    // Mapping it again (an alias at another address) is refused: it is released.
    assert_eq!(d.mem_map(va + 4 * G, 2 * G, 0, h), INVALID);
    let want = SimState {
        handles: 1,
        physical_bytes: 2 * G,
        reservations: 1,
        reserved_bytes: 8 * G,
        mappings: 1,
        mapped_bytes: 2 * G,
        access_grants: 1,
    };
    assert_eq!(d.state(), want, "the refused map changed nothing");
    // Row "cuMemRelease of an already released handle": INVALID_VALUE, even while
    // it is still mapped.
    assert_eq!(d.mem_release(h), INVALID);
    // A reference taken back from the mapping (row "cuMemRetainAllocationHandle
    // from an interior address: success, same handle value") makes it mappable
    // again: the alias row ("map the same handle a second time at another VA").
    assert_eq!(d.mem_retain_allocation_handle(va + G), Ok(h));
    assert_eq!(d.mem_map(va + 4 * G, 2 * G, 0, h), OK);
    let s = d.state();
    assert_eq!((s.mappings, s.physical_bytes), (2, 2 * G));
    // Last reference and last unmaps: everything freed.
    assert_eq!(d.mem_release(h), OK);
    assert_eq!(d.mem_unmap(va, 8 * G), OK);
    assert_eq!(
        d.state(),
        SimState {
            reservations: 1,
            reserved_bytes: 8 * G,
            ..SimState::default()
        }
    );
}

/// `mem_map`: "`offset + size` past the handle's end" is `CUDA_ERROR_INVALID_VALUE`,
/// checked before the whole-handle rule that makes a part of a handle
/// `CUDA_ERROR_NOT_SUPPORTED` (rows "map a 2G prefix of a 4G handle", "map 2G of a
/// 4G handle at offset G": a part *inside* the handle is NOT_SUPPORTED).
#[test]
fn map_past_the_end_of_a_handle_is_invalid_value_not_not_supported() {
    let d = sim();
    let va = d.mem_address_reserve(8 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    // Larger than the handle, from offset 0.
    assert_eq!(d.mem_map(va, 4 * G, 0, h), INVALID);
    // The handle's size, but from an offset: its tail is past the end.
    assert_eq!(d.mem_map(va, 2 * G, G, h), INVALID);
    assert_eq!(d.mem_map(va, 2 * G, 2 * G, h), INVALID);
    // Starting past the end.
    assert_eq!(d.mem_map(va, G, 4 * G, h), INVALID);
    // An offset so large that offset + size wraps around 2^64.
    assert_eq!(d.mem_map(va, 2 * G, u64::MAX - G + 1, h), INVALID);
    // Inside the handle but not all of it: NOT_SUPPORTED, as the rows say.
    assert_eq!(d.mem_map(va, G, 0, h), CuResult::NOT_SUPPORTED);
    assert_eq!(d.mem_map(va, G, G, h), CuResult::NOT_SUPPORTED);
    assert_eq!(d.state().mappings, 0, "nothing was mapped");
    // The whole handle maps.
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.state().mapped_bytes, 2 * G);
}

/// `mem_map`: "size 0" is `CUDA_ERROR_INVALID_VALUE` (first in the doc's order of
/// errors), not the NOT_SUPPORTED of a map that is not the whole handle.
#[test]
fn map_of_size_zero_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(2 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 0, 0, h), INVALID);
    assert_eq!(d.state().mappings, 0);
}

// ---------------------------------------------------------------- cuMemSetAccess

/// `mem_set_access`: "`CUDA_ERROR_INVALID_VALUE` for size 0, no device". Neither
/// grants anything.
#[test]
fn set_access_with_size_zero_or_no_device_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(2 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, 0, &[0]), INVALID, "size 0");
    assert_eq!(d.mem_set_access(va, 2 * G, &[]), INVALID, "no device");
    assert_eq!(d.mem_set_access(va, 0, &[]), INVALID, "both");
    assert_eq!(d.state().access_grants, 0);
    // Row "any access before cuMemSetAccess on a new mapping": still none.
    assert_eq!(d.touch(va, G, 0), INVALID);
    // Row "cuMemSetAccess on exactly the mapped range: success".
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), OK);
    assert_eq!(d.touch(va, 2 * G, 0), OK);
    assert_eq!(d.state().access_grants, 1);
    // Each failure above was a counted call.
    assert_eq!(d.call_count(DriverCall::SetAccess), 4);
}

// ---------------------------------------------------------------- cuMemUnmap

/// `mem_unmap`: "`CUDA_ERROR_INVALID_VALUE` for size 0, `ptr` or `size` not a
/// multiple of the granularity" — also where the range holds no mapping at all, which
/// would otherwise succeed (row "unmap a range that is already unmapped: success").
#[test]
fn unmap_with_size_zero_or_an_unaligned_address_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), OK);
    // Size 0 at the mapping's start.
    assert_eq!(d.mem_unmap(va, 0), INVALID);
    // Size 0 where nothing is mapped.
    assert_eq!(d.mem_unmap(va + 2 * G, 0), INVALID);
    // An address that is not a multiple of G, over bytes that are not mapped (the
    // same range, aligned, would be the "already unmapped: success" row).
    assert_eq!(d.mem_unmap(va + 2 * G, 2 * G), OK);
    assert_eq!(d.mem_unmap(va + 2 * G + 4096, 2 * G), INVALID);
    assert_eq!(d.mem_unmap(va + 2 * G + G / 2, G), INVALID);
    // A range whose end wraps around 2^64 (aligned start and size).
    assert_eq!(d.mem_unmap(u64::MAX - G + 1, 2 * G), INVALID);
    // The mapping is untouched.
    let s = d.state();
    assert_eq!((s.mappings, s.mapped_bytes, s.access_grants), (1, 2 * G, 1));
    assert_eq!(d.touch(va, 2 * G, 0), OK);
    // The whole mapping unmaps.
    assert_eq!(d.mem_unmap(va, 2 * G), OK);
    assert_eq!(d.state().mappings, 0);
}

// ---------------------------------------------------------------- handles, config

/// `mem_create`: "returns its raw value (never 0, never reused)". The pool books a
/// missing handle as raw 0, so a real one must never be 0; and 0 names no handle:
/// releasing or mapping it is "a handle never created" (INVALID_VALUE).
#[test]
fn handle_values_are_never_zero_and_never_reused() {
    let d = sim();
    assert_eq!(d.mem_release(0), INVALID, "0 names no handle");
    let va = d.mem_address_reserve(2 * G, 0).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, 0), INVALID);
    let first = d.mem_create(2 * G).unwrap();
    assert_ne!(first, 0, "the first handle of a fresh driver");
    let mut seen = vec![first];
    assert_eq!(d.mem_release(first), OK);
    for _ in 0..16 {
        let h = d.mem_create(G).unwrap();
        assert_ne!(h, 0);
        assert!(!seen.contains(&h), "handle {h} reused");
        seen.push(h);
        assert_eq!(d.mem_release(h), OK);
    }
    // Through the Driver trait too.
    let e = SimDriver::new(SimConfig::default());
    let h = Driver::create(&e, G).unwrap();
    assert_ne!(h.raw, 0);
    assert_eq!(h.size, G);
    assert_eq!(d.mem_release(0), INVALID);
}

/// `SimDriver::config`: "the configuration this device runs with (granularity
/// normalised)": a granularity of 0 is taken as 2 MiB (`SimConfig::granularity_bytes`)
/// and a device count above `SIM_MAX_DEVICES` is taken as that
/// (`SimConfig::device_count`); the capacity is kept as given. The device behaves as
/// its config says.
#[test]
fn config_reads_back_the_normalised_settings() {
    let d = SimDriver::new(SimConfig {
        capacity_bytes: 6 << 30,
        granularity_bytes: 0,
        device_count: 1000,
    });
    assert_eq!(
        d.config(),
        SimConfig {
            capacity_bytes: 6 << 30,
            granularity_bytes: 2 << 20,
            device_count: SIM_MAX_DEVICES,
        }
    );
    assert_eq!(d.granularity_minimum(), Ok(2 << 20));
    assert_eq!(d.mem_info().unwrap().total, 6 << 30);
    let va = d.mem_address_reserve(G, 0).unwrap();
    let h = d.mem_create(G).unwrap();
    assert_eq!(d.mem_map(va, G, 0, h), OK);
    let last = (SIM_MAX_DEVICES - 1) as i32;
    assert_eq!(d.mem_set_access(va, G, &[last + 1]), INVALID);
    assert_eq!(d.mem_set_access(va, G, &[0, last]), OK);
    assert_eq!(d.access_of(va), vec![0, last]);

    // Settings that need no normalising read back as given.
    let given = SimConfig {
        capacity_bytes: 10 << 30,
        granularity_bytes: 4 << 20,
        device_count: 3,
    };
    let d = SimDriver::new(given);
    assert_eq!(d.config(), given);
    assert_eq!(d.granularity_recommended(), Ok(4 << 20));
    assert_eq!(
        d.mem_create(2 << 20),
        Err(INVALID),
        "not a multiple of 4 MiB"
    );
    // The default is an H200: 140 GiB, 2 MiB, one device.
    assert_eq!(sim().config(), SimConfig::default());
    assert_eq!(
        SimConfig::default(),
        SimConfig {
            capacity_bytes: 140 << 30,
            granularity_bytes: 2 << 20,
            device_count: 1,
        }
    );
}

/// `SimDriver`'s `Debug` shows its configuration and its state (what a failing test
/// prints when it formats the driver): a handle of one granule shows as one handle
/// of 2 MiB, and the default capacity as 140 GiB (`SimConfig::default`, an H200).
#[test]
fn debug_shows_the_configuration_and_the_state() {
    let d = sim();
    let _h = d.mem_create(G).unwrap();
    let text = format!("{d:?}");
    assert!(
        text.starts_with("SimDriver { config: SimConfig {"),
        "{text}"
    );
    assert!(
        text.contains(&format!("capacity_bytes: {}", 140u64 << 30)),
        "{text}"
    );
    assert!(
        text.contains("state: SimState { handles: 1, physical_bytes: 2097152,"),
        "{text}"
    );
}

/// `ctx_synchronize`: "`CUDA_ERROR_INVALID_DEVICE` for an ordinal that is not one of
/// the simulated devices", below the first and past the last alike; the devices in
/// between synchronize.
#[test]
fn synchronize_of_a_device_the_machine_lacks_is_invalid_device() {
    let d = SimDriver::new(SimConfig {
        device_count: 2,
        ..SimConfig::default()
    });
    assert_eq!(d.ctx_synchronize(-1), CuResult::INVALID_DEVICE);
    assert_eq!(d.ctx_synchronize(2), CuResult::INVALID_DEVICE);
    assert_eq!(d.ctx_synchronize(0), OK);
    assert_eq!(d.ctx_synchronize(1), OK);
}

// ---------------------------------------------------------------- content (copies)

/// `cuMemcpyDtoH` / `cuMemcpyHtoD` copy exactly `size` bytes between the given
/// offsets, across page boundaries and at offsets inside pages (the content model's
/// 4096-byte pages are the simulator's own, invisible to a caller): the bytes before
/// and after the destination range are untouched, and host bytes never written read
/// as zeros ("a page never written reads as zeros"), also where they land over
/// written device bytes.
#[test]
fn copies_move_exactly_their_range() {
    const PAGE: usize = 4096;
    let d = sim();
    let va = mapped_for(&d, G, &[0]);
    let a: Vec<u8> = (0..3 * PAGE).map(|i| (i % 251) as u8 + 1).collect();
    assert_eq!(d.write(va, &a), OK);
    let r2 = va + (1 << 20);
    assert_eq!(d.write(r2, &[0xee; 4 * PAGE]), OK);
    let host = d.mem_host_alloc(4 * PAGE as u64).unwrap();
    // Host bytes [100, 5100) get a[3000..8000); the rest of the buffer is never written.
    assert_eq!(d.memcpy_dtoh(host, 100, va + 3000, 5000), OK);
    // Host [0, 6000) to r2 + 50: zeros, a[3000..8000), zeros.
    assert_eq!(d.memcpy_htod(r2 + 50, host, 0, 6000), OK);
    // Host [2 pages + 10, + 3000), never written, to r2 + 9000: zeros.
    assert_eq!(
        d.memcpy_htod(r2 + 9000, host, 2 * PAGE as u64 + 10, 3000),
        OK
    );
    let mut want = vec![0xee; 4 * PAGE];
    want[50..150].fill(0);
    want[150..5150].copy_from_slice(&a[3000..8000]);
    want[5150..6050].fill(0);
    want[9000..12000].fill(0);
    let got = d.read(r2, 4 * PAGE as u64).unwrap();
    let first_diff = got.iter().zip(&want).position(|(x, y)| x != y);
    assert_eq!(first_diff, None, "r2 differs from byte {first_diff:?} on");
    // The source range is unchanged by the copy out of it.
    assert_eq!(d.read(va, 3 * PAGE as u64).unwrap(), a);
}

/// A range over two adjacent mappings of two handles is one range to a kernel and
/// to `cuMemcpyDtoH` / `cuMemcpyHtoD` (row "unmap one range covering two adjacent
/// whole mappings of two handles: success": the VA is contiguous): bytes written
/// across the boundary read back whole, each handle holding its part, and a copy
/// out of and back into such ranges moves them exactly; device bytes never written
/// read as stale bytes (`SIM_STALE_BYTE`: new physical memory is not zeroed), at the
/// right length.
#[test]
fn ranges_across_two_mappings_are_contiguous() {
    let d = sim();
    let va = d.mem_address_reserve(2 * G, 0).unwrap();
    let (h1, h2) = (d.mem_create(G).unwrap(), d.mem_create(G).unwrap());
    assert_eq!(d.mem_map(va, G, 0, h1), OK);
    assert_eq!(d.mem_map(va + G, G, 0, h2), OK);
    assert_eq!(d.mem_set_access(va, G, &[0]), OK);
    assert_eq!(d.mem_set_access(va + G, G, &[0]), OK);
    // 5000 bytes on each side of the boundary (more than one 4096-byte page each).
    let p: Vec<u8> = (0..10_000).map(|i| (i % 241) as u8 + 7).collect();
    let at = va + G - 5000;
    assert_eq!(d.write(at, &p), OK);
    assert_eq!(d.read(at, 10_000).unwrap(), p);
    assert_eq!(d.read(va + G, 5000).unwrap(), &p[5000..]);
    assert_eq!(d.read(va + G - 5000, 5000).unwrap(), &p[..5000]);
    // A never-written stretch reads as stale bytes, its length exact.
    let stale = flare_package::driver::sim::SIM_STALE_BYTE;
    assert_eq!(d.read(va + 4096 + 10, 9000).unwrap(), vec![stale; 9000]);
    // Out to the host and back in at another place across the boundary.
    let host = d.mem_host_alloc(16_384).unwrap();
    assert_eq!(d.memcpy_dtoh(host, 100, at, 10_000), OK);
    let back = va + G - 7000;
    assert_eq!(d.memcpy_htod(back, host, 100, 10_000), OK);
    assert_eq!(d.read(back, 10_000).unwrap(), p);
}

/// `cuMemcpyDtoH` / `cuMemcpyHtoD`: "`CUDA_ERROR_INVALID_VALUE` (nothing copied)
/// when ... the host range is not inside a live buffer": a range ending exactly at
/// the buffer's end is inside it; one byte further is not, nor is a freed buffer.
#[test]
fn a_host_range_may_end_at_its_buffers_end_and_no_further() {
    let d = sim();
    let va = mapped_for(&d, G, &[0]);
    let host = d.mem_host_alloc(8192).unwrap();
    assert_eq!(d.memcpy_dtoh(host, 8192 - 6000, va, 6000), OK);
    assert_eq!(d.memcpy_htod(va, host, 8192 - 6000, 6000), OK);
    assert_eq!(d.memcpy_dtoh(host, 8192 - 5999, va, 6000), INVALID);
    assert_eq!(d.memcpy_htod(va, host, 8192 - 5999, 6000), INVALID);
    assert_eq!(d.mem_free_host(host), OK);
    assert_eq!(d.memcpy_dtoh(host, 0, va, 4096), INVALID);
}

/// `cuMemHostAlloc`: "returns its address (never 0, never reused)"; "Errors:
/// `CUDA_ERROR_INVALID_VALUE` for 0 bytes"; `host_bytes`: bytes allocated and not
/// yet freed. `cuMemFreeHost`: `CUDA_ERROR_INVALID_VALUE` for an address that is
/// not a live host buffer (one freed already).
#[test]
fn host_buffers_are_distinct_nonzero_and_counted() {
    let d = sim();
    assert_eq!(d.mem_host_alloc(0), Err(INVALID));
    let a = d.mem_host_alloc(1000).unwrap();
    let b = d.mem_host_alloc(3000).unwrap();
    assert!(a != 0 && b != 0 && a != b, "{a:#x} {b:#x}");
    assert_eq!(d.host_bytes(), 4000);
    assert_eq!(d.mem_free_host(a), OK);
    assert_eq!(d.host_bytes(), 3000);
    assert_eq!(d.mem_free_host(a), INVALID);
    let c = d.mem_host_alloc(10).unwrap();
    assert!(c != 0 && c != a && c != b, "reused {c:#x}");
    assert_eq!(d.mem_free_host(b), OK);
    assert_eq!(d.mem_free_host(c), OK);
    assert_eq!(d.host_bytes(), 0);
}

// ---------------------------------------------------------------- captures

/// `cuStreamWaitEvent`: `CUDA_ERROR_STREAM_CAPTURE_MERGE` only "when a stream in one
/// capture waits on an event of another". NVIDIA's cross-stream capture forks and
/// joins inside one capture: s2 waits on an event s1 recorded in the capture (s2
/// joins it), s1 then waits on an event s2 recorded in that same capture (the join),
/// which is legal, and the capture ends fine; a stream in another capture waiting
/// on s1's event is the merge error.
#[test]
fn a_wait_inside_one_capture_is_legal() {
    use flare_package::driver::sim::{CaptureMode, CUDA_ERROR_STREAM_CAPTURE_MERGE};
    let d = sim();
    let flags = flare_package::driver::sim::CU_STREAM_NON_BLOCKING;
    let (s1, s2, s3) = (
        d.stream_create_with_flags(flags).unwrap(),
        d.stream_create_with_flags(flags).unwrap(),
        d.stream_create_with_flags(flags).unwrap(),
    );
    let (fork, join) = (d.event_create().unwrap(), d.event_create().unwrap());
    assert_eq!(d.stream_begin_capture(s1, CaptureMode::Global), OK);
    assert_eq!(d.event_record(fork, s1), OK);
    assert_eq!(d.stream_wait_event(s2, fork), OK, "s2 joins the capture");
    assert_eq!(d.event_record(join, s2), OK);
    assert_eq!(
        d.stream_wait_event(s1, join),
        OK,
        "the join, in one capture"
    );
    assert_eq!(d.stream_wait_event(s1, fork), OK, "its own event");
    assert_eq!(d.stream_begin_capture(s3, CaptureMode::Global), OK);
    assert_eq!(
        d.stream_wait_event(s3, fork),
        CUDA_ERROR_STREAM_CAPTURE_MERGE
    );
    assert_eq!(d.stream_end_capture(s3), OK);
    assert_eq!(d.stream_end_capture(s1), OK);
}

/// `SimStreamCall::cuda_name`: "the CUDA driver function this call stands for", one
/// per call and all distinct: the driver API's own names.
#[test]
fn stream_calls_name_their_cuda_functions() {
    use flare_package::driver::sim::SimStreamCall as C;
    let want = [
        (C::StreamCreate, "cuStreamCreate"),
        (C::StreamDestroy, "cuStreamDestroy"),
        (C::StreamQuery, "cuStreamQuery"),
        (C::StreamSynchronize, "cuStreamSynchronize"),
        (C::StreamWaitEvent, "cuStreamWaitEvent"),
        (C::StreamBeginCapture, "cuStreamBeginCapture"),
        (C::StreamEndCapture, "cuStreamEndCapture"),
        (C::StreamGetCaptureInfo, "cuStreamGetCaptureInfo"),
        (C::EventCreate, "cuEventCreate"),
        (C::EventDestroy, "cuEventDestroy"),
        (C::EventRecord, "cuEventRecord"),
        (C::EventQuery, "cuEventQuery"),
        (C::EventSynchronize, "cuEventSynchronize"),
        (
            C::ThreadExchangeCaptureMode,
            "cuThreadExchangeStreamCaptureMode",
        ),
    ];
    assert_eq!(C::ALL.len(), want.len());
    for (call, name) in want {
        assert!(C::ALL.contains(&call));
        assert_eq!(call.cuda_name(), name);
    }
}

// ---------------------------------------------------------------- stream handles

/// "A handle that is not a live stream" is `CUDA_ERROR_INVALID_HANDLE`: a stream
/// destroyed while its work still runs (`cuStreamDestroy`: "the handle is refused
/// from now on"), and a value the driver never handed out, such as the simulator's
/// internal key of a device's legacy stream (`1 << 63`, created streams count up
/// from `1 << 32`), even once that legacy stream exists.
#[test]
fn destroyed_and_unknown_stream_handles_are_refused() {
    use flare_package::driver::sim::{CUDA_ERROR_INVALID_HANDLE, CU_STREAM_NON_BLOCKING};
    let d = sim();
    let va = mapped_for(&d, G, &[0]);
    let s = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    assert_eq!(d.launch(s, va, G), OK);
    assert_eq!(d.stream_destroy(s), OK);
    assert_eq!(d.stream_query(s), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.launch(s, va, G), CUDA_ERROR_INVALID_HANDLE);
    // The legacy stream of device 0 exists once used.
    assert_eq!(d.launch(0, va, G), OK);
    assert_eq!(d.stream_query(1 << 63), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(d.launch(1 << 63, va, G), CUDA_ERROR_INVALID_HANDLE);
}

/// The legacy stream synchronizes with the blocking streams of its own device, on
/// every device: on device 1 (the calling thread's current device, `cuCtxSetCurrent`),
/// work on a blocking stream runs after earlier legacy-stream work, so handing the
/// legacy stream's memory to it is ordered (no contract fault), while a
/// non-blocking stream's hand-off is not.
#[test]
fn the_legacy_stream_orders_blocking_streams_on_device_one_too() {
    use flare_package::driver::sim::{CU_STREAM_DEFAULT, CU_STREAM_NON_BLOCKING};
    let d = SimDriver::new(SimConfig {
        device_count: 2,
        ..SimConfig::default()
    });
    assert_eq!(d.ctx_set_current(1), OK);
    let va = d.mem_address_reserve(G, 0).unwrap();
    let h = d.mem_create(G).unwrap();
    assert_eq!(d.mem_map(va, G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, G, &[0, 1]), OK);
    let blocking = d.stream_create_with_flags(CU_STREAM_DEFAULT).unwrap();
    let nb = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    assert_eq!(d.launch(0, va, G), OK);
    assert_eq!(d.note_handoff(blocking, va, G), OK);
    assert_eq!(d.contract_faults(), 0, "blocking after legacy: ordered");
    assert_eq!(d.note_handoff(nb, va, G), OK);
    assert_eq!(d.contract_faults(), 1, "non-blocking vs legacy: unordered");
}

/// The `Driver` implementation of events (what the pool calls): `event_query` is
/// `Ok(true)` for `CUDA_SUCCESS`, `Ok(false)` for `CUDA_ERROR_NOT_READY`, and every
/// other code an error naming `cuEventQuery`; `event_destroy` destroys (the handle
/// is refused afterwards) and passes a refusal on as an error naming
/// `cuEventDestroy`.
#[test]
fn the_driver_trait_passes_event_errors_on() {
    use flare_package::driver::sim::{CUDA_ERROR_INVALID_HANDLE, CU_STREAM_NON_BLOCKING};
    let d = sim();
    let va = mapped_for(&d, G, &[0]);
    let s = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    let e = Driver::event_create(&d).unwrap();
    assert_eq!(Driver::event_query(&d, e), Ok(true), "never recorded");
    assert_eq!(d.launch(s, va, G), OK);
    assert_eq!(d.event_record(e, s), OK);
    assert_eq!(Driver::event_query(&d, e), Ok(false), "work queued");
    let bogus = e + 1000;
    let err = Driver::event_query(&d, bogus).unwrap_err();
    assert_eq!(
        (err.call, err.code),
        (DriverCall::EventQuery, CUDA_ERROR_INVALID_HANDLE)
    );
    assert_eq!(Driver::event_destroy(&d, e), Ok(()));
    assert_eq!(d.event_query(e), CUDA_ERROR_INVALID_HANDLE, "destroyed");
    let err = Driver::event_destroy(&d, e).unwrap_err();
    assert_eq!(
        (err.call, err.code),
        (DriverCall::EventDestroy, CUDA_ERROR_INVALID_HANDLE)
    );
}

/// `touch`: "a size of 0 touches nothing" on a device of the machine; a device the
/// machine lacks (below 0 or past `device_count`) runs nothing, so even a touch of
/// 0 bytes there is refused (`CUDA_ERROR_INVALID_VALUE`, as a touch of mapped bytes
/// on it is).
#[test]
fn a_touch_on_a_device_the_machine_lacks_is_refused_even_empty() {
    let d = sim();
    let va = mapped_for(&d, G, &[0]);
    assert_eq!(d.touch(va, G, 0), OK);
    assert_eq!(d.touch(va, 0, 0), OK);
    for device in [-1, 1, 2] {
        assert_eq!(d.touch(va, G, device), INVALID, "device {device}");
        assert_eq!(d.touch(va, 0, device), INVALID, "device {device}, 0 bytes");
    }
}

/// The `Driver` implementation's stream calls: `stream_destroy` destroys (the
/// handle is refused afterwards) and passes a refusal on as an error naming
/// `cuStreamDestroy`; `note_handoff` is the simulated driver's own check: a hand-off
/// of memory another stream's unordered queued work touches is a contract fault.
#[test]
fn the_driver_trait_destroys_streams_and_checks_handoffs() {
    use flare_package::driver::sim::{CUDA_ERROR_INVALID_HANDLE, CU_STREAM_NON_BLOCKING};
    use flare_package::driver::Stream;
    let d = sim();
    let va = mapped_for(&d, G, &[0]);
    let busy = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    let other = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    assert_eq!(d.launch(busy, va, G), OK);
    Driver::note_handoff(&d, Stream(other), va, G);
    assert_eq!(d.contract_faults(), 1, "unordered hand-off");
    let s = Driver::stream_create_blocking(&d).unwrap();
    assert_eq!(Driver::stream_destroy(&d, s), Ok(()));
    assert_eq!(d.stream_query(s.0), CUDA_ERROR_INVALID_HANDLE, "destroyed");
    let err = Driver::stream_destroy(&d, s).unwrap_err();
    assert_eq!(
        (err.call, err.code),
        (DriverCall::StreamDestroy, CUDA_ERROR_INVALID_HANDLE)
    );
}

/// `inject_failure` and `call_count` take every [`DriverCall`]: a stream or event
/// kind is the stream call of the same name (`SimStreamCall::of_driver_call`: ten
/// of them, `cuEventCreate` through `cuStreamDestroy`), counted and failed there. An
/// injected `cuEventRecord` failure through `inject_failure` fails the next record
/// (a test author's trap before: it was queued among the memory calls, which never
/// count a record, and never fired); the memory kinds have no stream call.
#[test]
fn stream_kinds_of_driver_call_are_counted_and_failed_as_stream_calls() {
    use flare_package::driver::sim::CU_STREAM_NON_BLOCKING;
    const CUDA_ERROR_INVALID_VALUE: CuResult = CuResult::INVALID_VALUE;
    let stream_kinds = DriverCall::ALL
        .iter()
        .filter(|&&c| SimStreamCall::of_driver_call(c).is_some())
        .count();
    assert_eq!(stream_kinds, 10);
    for c in [
        DriverCall::Create,
        DriverCall::Map,
        DriverCall::Synchronize,
        DriverCall::HostAlloc,
        DriverCall::MemcpyHtoD,
        DriverCall::MemGetInfo,
    ] {
        assert_eq!(SimStreamCall::of_driver_call(c), None, "{c:?}");
    }
    assert_eq!(
        SimStreamCall::of_driver_call(DriverCall::EventRecord),
        Some(SimStreamCall::EventRecord)
    );
    let d = sim();
    let s = d.stream_create_with_flags(CU_STREAM_NON_BLOCKING).unwrap();
    let e = Driver::event_create(&d).unwrap();
    assert_eq!(d.event_record(e, s), OK);
    assert_eq!(d.call_count(DriverCall::EventRecord), 1);
    assert_eq!(d.call_count(DriverCall::EventCreate), 1);
    assert_eq!(d.call_count(DriverCall::StreamCreate), 1);
    d.inject_failure(DriverCall::EventRecord, 1, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(d.event_record(e, s), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(d.event_record(e, s), OK, "one call failed");
    assert_eq!(d.call_count(DriverCall::EventRecord), 3);
    assert_eq!(d.stream_call_count(SimStreamCall::EventRecord), 3);
}
