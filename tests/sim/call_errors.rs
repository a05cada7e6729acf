//! The simulated driver's calls refused as their documentation says: `cuMemMap`,
//! `cuMemSetAccess` and `cuMemUnmap` of size 0, past a handle's end or unaligned; handle
//! values never 0 and never reused; a synchronize or a touch of a device the machine
//! lacks. Every expected `CUresult` comes from the row of `docs/vmm-semantics.md` or
//! the sentence of the simulator's doc comments (`src/driver/sim/`) a test names, not
//! from running the simulator.

use crate::common;
use crate::vmm_rows::{sim, G, INVALID, OK};
use common::mapped_for;
use flare_package::driver::sim::{SimConfig, SimDriver, SimState};
use flare_package::driver::{CuResult, Driver, DriverCall};

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
