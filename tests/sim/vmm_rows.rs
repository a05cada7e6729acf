//! The simulated driver reproduces every row of `docs/vmm-semantics.md`, with the
//! `CUresult` codes the document gives (measured on an H200): sizes and granularity,
//! mapping, access, unmap, release and free, the VMM calls during a capture. One
//! concern in one file: one test per measured row. Its own contract (capacity,
//! counts, the `Driver` trait, fault injection, work in flight) has modules of its
//! own.
//!
//! Each test names the document row it checks. Expected values come from the
//! document, not from running the simulator.

use flare_package::driver::sim::{SimConfig, SimDriver, SimState};
use flare_package::driver::{CuResult, DevicePtr, Driver, DriverCall, DriverError};

pub(crate) const G: u64 = 2 << 20;

pub(crate) const OK: CuResult = CuResult::SUCCESS;

pub(crate) const INVALID: CuResult = CuResult::INVALID_VALUE;

pub(crate) fn sim() -> SimDriver {
    SimDriver::new(SimConfig::default())
}

pub(crate) fn sim_devices(n: u32) -> SimDriver {
    SimDriver::new(SimConfig {
        device_count: n,
        ..SimConfig::default()
    })
}

/// A handle of `size` bytes mapped at the start of a fresh reservation of `res`
/// bytes, with access for device 0. Returns (reservation start, handle).
pub(crate) fn mapped(d: &SimDriver, size: u64, res: u64) -> (DevicePtr, u64) {
    let va = d.mem_address_reserve(res, 0).unwrap();
    let h = d.mem_create(size).unwrap();
    assert_eq!(d.mem_map(va, size, 0, h), OK);
    assert_eq!(d.mem_set_access(va, size, &[0]), OK);
    (va, h)
}

// ---------------------------------------------------------------- sizes, granularity

#[test]
fn row_granularity_minimum_and_recommended_are_both_2_mib() {
    let d = sim();
    assert_eq!(d.granularity_minimum(), Ok(2_097_152));
    assert_eq!(d.granularity_recommended(), Ok(2_097_152));
    assert_eq!(Driver::granularity(&d).unwrap(), 2_097_152);
    assert_eq!(d.call_count(DriverCall::Granularity), 3);
}

#[test]
fn row_create_size_zero_is_invalid_value() {
    let d = sim();
    assert_eq!(d.mem_create(0), Err(INVALID));
    assert_eq!(d.state(), SimState::default());
}

#[test]
fn row_create_size_not_multiple_of_granularity_is_invalid_value() {
    let d = sim();
    assert_eq!(d.mem_create(G + 1), Err(INVALID));
    assert_eq!(d.state().handles, 0);
}

#[test]
fn row_create_one_tib_is_out_of_memory() {
    let d = sim();
    assert_eq!(d.mem_create(1 << 40), Err(CuResult::OUT_OF_MEMORY));
    assert_eq!(d.state().physical_bytes, 0);
    let e = Driver::create(&d, 1 << 40).unwrap_err();
    assert_eq!(
        e,
        DriverError::new(DriverCall::Create, CuResult::OUT_OF_MEMORY)
    );
    assert!(e.is_out_of_memory());
}

#[test]
fn row_reserve_size_zero_or_not_multiple_is_invalid_value() {
    let d = sim();
    assert_eq!(d.mem_address_reserve(0, 0), Err(INVALID));
    assert_eq!(d.mem_address_reserve(G + 1, 0), Err(INVALID));
    assert_eq!(d.mem_address_reserve(G / 2, 0), Err(INVALID));
    assert_eq!(d.state().reservations, 0);
}

// ---------------------------------------------------------------- mapping

#[test]
fn row_map_prefix_of_handle_is_not_supported() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(4 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), CuResult::NOT_SUPPORTED);
    assert_eq!(d.state().mappings, 0);
}

#[test]
fn row_map_at_offset_is_not_supported() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(4 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, G, h), CuResult::NOT_SUPPORTED);
    assert_eq!(d.state().mappings, 0);
}

#[test]
fn row_map_whole_handle_succeeds() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(4 * G).unwrap();
    assert_eq!(d.mem_map(va, 4 * G, 0, h), OK);
    let s = d.state();
    assert_eq!((s.mappings, s.mapped_bytes), (1, 4 * G));
}

#[test]
fn row_map_same_handle_twice_alias_succeeds_and_counts_once() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.mem_map(va + 2 * G, 2 * G, 0, h), OK);
    let s = d.state();
    assert_eq!(s.handles, 1);
    assert_eq!(s.physical_bytes, 2 * G);
    assert_eq!((s.mappings, s.mapped_bytes), (2, 4 * G));
    // Both VAs reach the same physical handle.
    let a = d.mem_retain_allocation_handle(va).unwrap();
    let b = d.mem_retain_allocation_handle(va + 3 * G).unwrap();
    assert_eq!((a, b), (h, h));
    assert_eq!(d.mem_release(a), OK);
    assert_eq!(d.mem_release(b), OK);
}

#[test]
fn row_map_at_unaligned_va_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(G).unwrap();
    assert_eq!(d.mem_map(va + 4096, G, 0, h), INVALID);
    assert_eq!(d.mem_map(va + G / 2, G, 0, h), INVALID);
    assert_eq!(d.state().mappings, 0);
}

#[test]
fn row_map_at_unreserved_va_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(2 * G, 0).unwrap();
    let h = d.mem_create(G).unwrap();
    let h2 = d.mem_create(2 * G).unwrap();
    // Past the reservation's end.
    assert_eq!(d.mem_map(va + 2 * G, G, 0, h), INVALID);
    // Below it.
    assert_eq!(d.mem_map(va - 16 * G, G, 0, h), INVALID);
    // Starting inside but sticking out.
    assert_eq!(d.mem_map(va + G, 2 * G, 0, h2), INVALID);
    // After the reservation is freed.
    assert_eq!(d.mem_address_free(va, 2 * G), OK);
    assert_eq!(d.mem_map(va, G, 0, h), INVALID);
    assert_eq!(d.state().mappings, 0);
}

#[test]
fn row_map_over_mapped_va_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(8 * G, 0).unwrap();
    let a = d.mem_create(4 * G).unwrap();
    let b = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va + 2 * G, 4 * G, 0, a), OK);
    // Same start.
    assert_eq!(d.mem_map(va + 2 * G, 2 * G, 0, b), INVALID);
    // Overlapping the head, the middle, the tail.
    assert_eq!(d.mem_map(va + G, 2 * G, 0, b), INVALID);
    assert_eq!(d.mem_map(va + 3 * G, 2 * G, 0, b), INVALID);
    assert_eq!(d.mem_map(va + 5 * G, 2 * G, 0, b), INVALID);
    assert_eq!(d.state().mappings, 1);
    // Right next to it is fine.
    assert_eq!(d.mem_map(va + 6 * G, 2 * G, 0, b), OK);
}

#[test]
fn map_unknown_or_released_handle_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    assert_eq!(d.mem_map(va, G, 0, 0xdead_beef), INVALID);
    let h = d.mem_create(G).unwrap();
    assert_eq!(d.mem_release(h), OK);
    assert_eq!(d.mem_map(va, G, 0, h), INVALID);
    assert_eq!(
        d.state(),
        SimState {
            reservations: 1,
            reserved_bytes: 4 * G,
            ..SimState::default()
        }
    );
}

// ---------------------------------------------------------------- access

#[test]
fn row_access_before_set_access_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(2 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.touch(va, 4096, 0), INVALID);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), OK);
    assert_eq!(d.touch(va, 2 * G, 0), OK);
    // Past the mapping: unmapped bytes.
    assert_eq!(d.touch(va + G, 2 * G, 0), INVALID);
}

#[test]
fn row_set_access_on_unmapped_or_partly_unmapped_range_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    // Nothing mapped at all.
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), INVALID);
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    // Mapped head, unmapped tail.
    assert_eq!(d.mem_set_access(va, 4 * G, &[0]), INVALID);
    // Unmapped head, mapped tail.
    assert_eq!(d.mem_set_access(va + 2 * G, 2 * G, &[0]), INVALID);
    assert_eq!(d.state().access_grants, 0);
}

#[test]
fn row_set_access_naming_missing_device_is_invalid_value() {
    let d = sim_devices(2);
    let va = d.mem_address_reserve(2 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, 2 * G, &[2]), INVALID);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0, 7]), INVALID);
    assert_eq!(d.mem_set_access(va, 2 * G, &[-1]), INVALID);
    assert_eq!(d.state().access_grants, 0);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0, 1]), OK);
    assert_eq!(d.state().access_grants, 2);
    assert_eq!(d.touch(va, G, 1), OK);
}

#[test]
fn row_set_access_on_exactly_mapped_range_succeeds() {
    let d = sim();
    let va = d.mem_address_reserve(2 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), OK);
    assert_eq!(d.state().access_grants, 1);
    assert_eq!(d.access_of(va + G), vec![0]);
}

#[test]
fn set_access_over_several_adjacent_whole_mappings_succeeds() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let a = d.mem_create(G).unwrap();
    let b = d.mem_create(3 * G).unwrap();
    assert_eq!(d.mem_map(va, G, 0, a), OK);
    assert_eq!(d.mem_map(va + G, 3 * G, 0, b), OK);
    assert_eq!(d.mem_set_access(va, 4 * G, &[0]), OK);
    assert_eq!(d.state().access_grants, 2);
    assert_eq!(d.touch(va, 4 * G, 0), OK);
}

#[test]
fn peer_device_needs_its_own_grant() {
    let d = sim_devices(2);
    let (va, _) = mapped(&d, 2 * G, 2 * G);
    assert_eq!(d.touch(va, G, 0), OK);
    assert_eq!(d.touch(va, G, 1), INVALID);
}

// ---------------------------------------------------------------- unmap, release, free

#[test]
fn row_unmap_part_of_one_mapping_is_invalid_value() {
    let d = sim();
    let (va, _) = mapped(&d, 4 * G, 4 * G);
    assert_eq!(d.mem_unmap(va, 2 * G), INVALID);
    assert_eq!(d.mem_unmap(va + 2 * G, 2 * G), INVALID);
    assert_eq!(d.state().mappings, 1);
    assert_eq!(d.touch(va, 4 * G, 0), OK);
}

#[test]
fn row_unmap_size_not_multiple_of_granularity_is_invalid_value() {
    let d = sim();
    let (va, _) = mapped(&d, 2 * G, 2 * G);
    assert_eq!(d.mem_unmap(va, 2 * G + 1), INVALID);
    assert_eq!(d.mem_unmap(va, G + 4096), INVALID);
    assert_eq!(d.state().mappings, 1);
}

#[test]
fn row_unmap_one_range_over_two_adjacent_mappings_succeeds() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let a = d.mem_create(2 * G).unwrap();
    let b = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, a), OK);
    assert_eq!(d.mem_map(va + 2 * G, 2 * G, 0, b), OK);
    assert_eq!(d.mem_unmap(va, 4 * G), OK);
    let s = d.state();
    assert_eq!((s.mappings, s.mapped_bytes), (0, 0));
    assert_eq!(s.handles, 2);
}

#[test]
fn row_unmap_already_unmapped_or_tail_unmapped_succeeds() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    // Never mapped.
    assert_eq!(d.mem_unmap(va, 4 * G), OK);
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    // The tail of the range is unmapped.
    assert_eq!(d.mem_unmap(va, 4 * G), OK);
    assert_eq!(d.state().mappings, 0);
    // Again, already unmapped.
    assert_eq!(d.mem_unmap(va, 2 * G), OK);
}

#[test]
fn row_release_while_mapped_succeeds_and_frees_at_last_unmap() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.mem_map(va + 2 * G, 2 * G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, 4 * G, &[0]), OK);
    assert_eq!(d.mem_release(h), OK);
    // Still usable through the mappings, bytes still held.
    assert_eq!(d.touch(va, 4 * G, 0), OK);
    assert_eq!(d.state().physical_bytes, 2 * G);
    assert_eq!(d.state().handles, 1);
    assert_eq!(d.mem_unmap(va, 2 * G), OK);
    assert_eq!(d.state().physical_bytes, 2 * G);
    // The last unmap frees it.
    assert_eq!(d.mem_unmap(va + 2 * G, 2 * G), OK);
    assert_eq!(d.state().physical_bytes, 0);
    assert_eq!(d.state().handles, 0);
    assert_eq!(d.mem_get_info().unwrap().free, d.config().capacity_bytes);
}

#[test]
fn row_release_twice_is_invalid_value() {
    let d = sim();
    let h = d.mem_create(G).unwrap();
    assert_eq!(d.mem_release(h), OK);
    assert_eq!(d.mem_release(h), INVALID);
    // Also while the released handle is still mapped.
    let (va, h2) = mapped(&d, G, G);
    assert_eq!(d.mem_release(h2), OK);
    assert_eq!(d.mem_release(h2), INVALID);
    assert_eq!(d.mem_unmap(va, G), OK);
    assert_eq!(d.state().handles, 0);
}

#[test]
fn row_address_free_while_mapping_live_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(G).unwrap();
    assert_eq!(d.mem_map(va + 3 * G, G, 0, h), OK);
    assert_eq!(d.mem_address_free(va, 4 * G), INVALID);
    assert_eq!(d.state().reservations, 1);
    assert_eq!(d.mem_unmap(va + 3 * G, G), OK);
    assert_eq!(d.mem_address_free(va, 4 * G), OK);
}

#[test]
fn row_address_free_of_part_of_reservation_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    assert_eq!(d.mem_address_free(va, 2 * G), INVALID);
    assert_eq!(d.mem_address_free(va + 2 * G, 2 * G), INVALID);
    assert_eq!(d.mem_address_free(va, 8 * G), INVALID);
    assert_eq!(d.state().reservations, 1);
}

#[test]
fn row_address_free_twice_is_invalid_value() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    assert_eq!(d.mem_address_free(va, 4 * G), OK);
    assert_eq!(d.mem_address_free(va, 4 * G), INVALID);
    assert_eq!(d.state().reservations, 0);
}

#[test]
fn row_retain_allocation_handle_from_interior_address_returns_same_handle() {
    let d = sim();
    let (va, h) = mapped(&d, 4 * G, 4 * G);
    let r = d.mem_retain_allocation_handle(va + G + 12345).unwrap();
    assert_eq!(r, h);
    // The retain is a reference: two releases now, the third is one too many.
    assert_eq!(d.mem_release(r), OK);
    assert_eq!(d.mem_release(h), OK);
    assert_eq!(d.mem_release(h), INVALID);
    assert_eq!(d.mem_retain_allocation_handle(va + 4 * G), Err(INVALID));
}

// ---------------------------------------------------------------- stream capture

#[test]
fn row_capture_vmm_calls_all_succeed_and_capture_ends_fine() {
    let d = sim();
    assert_eq!(d.begin_capture(), OK);
    assert!(d.is_capturing());
    let h = d.mem_create(2 * G).unwrap();
    let va = d.mem_address_reserve(2 * G, 0).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), OK);
    assert_eq!(d.mem_unmap(va, 2 * G), OK);
    assert_eq!(d.mem_release(h), OK);
    assert_eq!(d.mem_address_free(va, 2 * G), OK);
    assert_eq!(d.end_capture(), OK);
    assert!(!d.is_capturing());
    assert_eq!(d.state(), SimState::default());
}

#[test]
fn row_capture_synchronize_is_unsupported_and_invalidates() {
    let d = sim();
    assert_eq!(d.begin_capture(), OK);
    assert_eq!(d.ctx_synchronize(0), CuResult::STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(
        Driver::synchronize(&d, 0).unwrap_err(),
        DriverError::new(
            DriverCall::Synchronize,
            CuResult::STREAM_CAPTURE_UNSUPPORTED
        )
    );
    assert_eq!(d.end_capture(), CuResult::STREAM_CAPTURE_INVALIDATED);
    // Outside a capture it works again.
    assert_eq!(d.ctx_synchronize(0), OK);
}

#[test]
fn synchronize_during_capture_keeps_busy_marks() {
    let d = sim();
    d.mark_busy(0x1000, G);
    assert_eq!(d.begin_capture(), OK);
    assert_eq!(d.ctx_synchronize(0), CuResult::STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(d.busy_ranges(), vec![(0x1000, G)]);
    let _ = d.end_capture();
    assert_eq!(d.ctx_synchronize(0), OK);
    assert!(d.busy_ranges().is_empty());
}
