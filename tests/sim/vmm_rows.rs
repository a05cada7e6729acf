//! The simulated driver reproduces every row of `docs/vmm-semantics.md`, with the
//! `CUresult` codes the document gives (measured on an H200), plus its own contract:
//! capacity, counts, fault injection, work in flight. One concern in one file: one
//! test per measured row.
//!
//! Each test names the document row it checks. Expected values come from the
//! document, not from running the simulator.

use flare_package::driver::sim::{
    SimConfig, SimDriver, SimFault, SimState, SIM_VA_BASE, SIM_VA_WINDOW,
};
use flare_package::driver::{
    CuResult, DevicePtr, Driver, DriverCall, DriverError, MemInfo, PhysicalHandle, Reservation,
};

const G: u64 = 2 << 20;
const OK: CuResult = CuResult::SUCCESS;
const INVALID: CuResult = CuResult::INVALID_VALUE;

fn sim() -> SimDriver {
    SimDriver::new(SimConfig::default())
}

fn sim_devices(n: u32) -> SimDriver {
    SimDriver::new(SimConfig {
        device_count: n,
        ..SimConfig::default()
    })
}

/// A handle of `size` bytes mapped at the start of a fresh reservation of `res`
/// bytes, with access for device 0. Returns (reservation start, handle).
fn mapped(d: &SimDriver, size: u64, res: u64) -> (DevicePtr, u64) {
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

// ---------------------------------------------------------------- capacity, mem_info

#[test]
fn capacity_is_enforced_on_physical_bytes_held() {
    let d = SimDriver::new(SimConfig {
        capacity_bytes: 8 * G,
        ..SimConfig::default()
    });
    let a = d.mem_create(6 * G).unwrap();
    assert_eq!(d.mem_create(4 * G), Err(CuResult::OUT_OF_MEMORY));
    let b = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_create(G * 2), Err(CuResult::OUT_OF_MEMORY));
    assert_eq!(d.state().physical_bytes, 8 * G);
    assert_eq!(
        d.mem_get_info(),
        Ok(MemInfo {
            free: 0,
            total: 8 * G
        })
    );
    assert_eq!(d.mem_release(a), OK);
    assert_eq!(
        d.mem_get_info(),
        Ok(MemInfo {
            free: 6 * G,
            total: 8 * G
        })
    );
    assert!(d.mem_create(6 * G).is_ok());
    assert_eq!(d.mem_release(b), OK);
}

#[test]
fn mem_info_reports_capacity_minus_physical_bytes() {
    let d = sim();
    let cap = 140u64 << 30;
    assert_eq!(
        Driver::mem_info(&d).unwrap(),
        MemInfo {
            free: cap,
            total: cap
        }
    );
    let _h = d.mem_create(10 * G).unwrap();
    assert_eq!(
        d.mem_get_info().unwrap(),
        MemInfo {
            free: cap - 10 * G,
            total: cap
        }
    );
    assert_eq!(d.call_count(DriverCall::MemGetInfo), 2);
}

// ---------------------------------------------------------------- reservations

#[test]
fn reservations_are_aligned_high_and_never_reused() {
    let d = sim();
    let a = d.mem_address_reserve(2 * G, 0).unwrap();
    assert!(a >= 0x7f00_0000_0000);
    assert_eq!(a % G, 0);
    assert_eq!(d.mem_address_free(a, 2 * G), OK);
    let b = d.mem_address_reserve(2 * G, 0).unwrap();
    assert_ne!(a, b);
    assert!(b >= a + 2 * G);
    let c = d.mem_address_reserve(2 * G, 1 << 30).unwrap();
    assert_eq!(c % (1 << 30), 0);
    assert!(c >= b + 2 * G);
    // Alignment smaller than G still yields G-aligned addresses.
    let e = d.mem_address_reserve(G, 4096).unwrap();
    assert_eq!(e % G, 0);
}

#[test]
fn two_drivers_reserve_disjoint_addresses() {
    // One virtual address space per process on the real driver: no two simulated
    // drivers may hand out the same range (issue 9 item 3).
    let a = sim();
    let b = sim();
    let a0 = a.mem_address_reserve(2 * G, 0).unwrap();
    let b0 = b.mem_address_reserve(2 * G, 0).unwrap();
    // Each starts a window of its own: window-aligned, different windows.
    assert_eq!(a0 % SIM_VA_WINDOW, 0);
    assert_eq!(b0 % SIM_VA_WINDOW, 0);
    assert_ne!(a0, b0);
    assert!(a0 >= SIM_VA_BASE && b0 >= SIM_VA_BASE);
    // A driver that outgrows its window (1 TiB reserved, never reused) takes a fresh
    // one: still nothing of b's.
    let big = a.mem_address_reserve(SIM_VA_WINDOW, 0).unwrap();
    let b1 = b.mem_address_reserve(2 * G, 0).unwrap();
    let overlaps = |p: u64, ps: u64, q: u64, qs: u64| p < q + qs && q < p + ps;
    for (q, qs) in [(b0, SIM_VA_WINDOW), (b1, 2 * G)] {
        assert!(!overlaps(big, SIM_VA_WINDOW, q, qs), "{big:#x} vs {q:#x}");
    }
    assert!(!overlaps(a0, 2 * G, big, SIM_VA_WINDOW));
    // Larger than a window: whole windows, aligned as asked.
    let huge = b.mem_address_reserve(3 * SIM_VA_WINDOW, 1 << 41).unwrap();
    assert_eq!(huge % (1 << 41), 0);
    for (q, qs) in [(a0, 2 * G), (big, SIM_VA_WINDOW), (b0, 2 * G), (b1, 2 * G)] {
        assert!(
            !overlaps(huge, 3 * SIM_VA_WINDOW, q, qs),
            "{huge:#x} vs {q:#x}"
        );
    }
    // A handle of one driver cannot be mapped at another driver's address: the
    // address is not reserved there.
    let h = b.mem_create(G).unwrap();
    assert_eq!(b.mem_map(a0, G, 0, h), INVALID);
}

// ---------------------------------------------------------------- state, counts

#[test]
fn state_counts_what_is_held_right_now() {
    let d = sim_devices(2);
    assert_eq!(d.state(), SimState::default());
    let va = d.mem_address_reserve(8 * G, 0).unwrap();
    let a = d.mem_create(2 * G).unwrap();
    let b = d.mem_create(4 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, a), OK);
    assert_eq!(d.mem_map(va + 2 * G, 4 * G, 0, b), OK);
    assert_eq!(d.mem_map(va + 6 * G, 2 * G, 0, a), OK);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0, 1]), OK);
    assert_eq!(d.mem_set_access(va + 2 * G, 4 * G, &[0]), OK);
    assert_eq!(
        d.state(),
        SimState {
            handles: 2,
            physical_bytes: 6 * G,
            reservations: 1,
            reserved_bytes: 8 * G,
            mappings: 3,
            mapped_bytes: 8 * G,
            access_grants: 3,
        }
    );
    assert_eq!(d.mem_unmap(va, 8 * G), OK);
    assert_eq!(d.mem_release(a), OK);
    assert_eq!(d.mem_release(b), OK);
    assert_eq!(d.mem_address_free(va, 8 * G), OK);
    assert_eq!(d.state(), SimState::default());
}

#[test]
fn call_count_counts_every_call_including_failures() {
    let d = sim();
    let _ = d.mem_create(0);
    let h = d.mem_create(G).unwrap();
    let _ = d.mem_address_reserve(0, 0);
    let va = d.mem_address_reserve(G, 0).unwrap();
    let _ = d.mem_map(va, G, 0, 9999);
    assert_eq!(d.mem_map(va, G, 0, h), OK);
    let _ = d.mem_set_access(va, G, &[5]);
    assert_eq!(d.mem_set_access(va, G, &[0]), OK);
    let _ = d.mem_unmap(va, 1);
    assert_eq!(d.mem_unmap(va, G), OK);
    assert_eq!(d.mem_release(h), OK);
    let _ = d.mem_release(h);
    assert_eq!(d.mem_address_free(va, G), OK);
    assert_eq!(d.ctx_synchronize(0), OK);
    let _ = d.mem_retain_allocation_handle(va);
    let _ = d.touch(va, G, 0);
    assert_eq!(d.call_count(DriverCall::Create), 2);
    assert_eq!(d.call_count(DriverCall::Reserve), 2);
    assert_eq!(d.call_count(DriverCall::Map), 2);
    assert_eq!(d.call_count(DriverCall::SetAccess), 2);
    assert_eq!(d.call_count(DriverCall::Unmap), 2);
    assert_eq!(d.call_count(DriverCall::Release), 2);
    assert_eq!(d.call_count(DriverCall::FreeReservation), 1);
    assert_eq!(d.call_count(DriverCall::Synchronize), 1);
    assert_eq!(d.call_count(DriverCall::Granularity), 0);
    assert_eq!(d.call_count(DriverCall::MemGetInfo), 0);
    assert_eq!(d.call_count(DriverCall::Init), 0);
}

// ---------------------------------------------------------------- the Driver trait

#[test]
fn trait_round_trip_maps_whole_handles() {
    let d = sim();
    let g = d.granularity().unwrap();
    let r: Reservation = d.reserve(4 * g).unwrap();
    assert_eq!(r.size, 4 * g);
    let h: PhysicalHandle = d.create(2 * g).unwrap();
    assert_eq!(h.size, 2 * g);
    d.map(r.ptr, h).unwrap();
    d.map(r.ptr + 2 * g, h).unwrap();
    d.set_access(r.ptr, 4 * g, &[0]).unwrap();
    assert_eq!(d.touch(r.ptr, 4 * g, 0), OK);
    d.synchronize(0).unwrap();
    d.unmap(r.ptr, 4 * g).unwrap();
    d.release(h).unwrap();
    d.free_reservation(r).unwrap();
    assert_eq!(d.state(), SimState::default());
}

#[test]
fn trait_errors_name_the_call_and_keep_the_code() {
    let d = sim();
    let r = d.reserve(4 * G).unwrap();
    let h = d.create(G).unwrap();
    assert_eq!(
        d.reserve(0).unwrap_err(),
        DriverError::new(DriverCall::Reserve, INVALID)
    );
    assert_eq!(
        d.map(r.ptr + 1, h).unwrap_err(),
        DriverError::new(DriverCall::Map, INVALID)
    );
    // A handle value whose size understates the real handle is a partial map.
    let big = d.create(2 * G).unwrap();
    let short = PhysicalHandle {
        raw: big.raw,
        size: G,
    };
    assert_eq!(
        d.map(r.ptr, short).unwrap_err(),
        DriverError::new(DriverCall::Map, CuResult::NOT_SUPPORTED)
    );
    d.release(big).unwrap();
    assert_eq!(
        d.set_access(r.ptr, G, &[0]).unwrap_err(),
        DriverError::new(DriverCall::SetAccess, INVALID)
    );
    assert_eq!(
        d.unmap(r.ptr, 3).unwrap_err(),
        DriverError::new(DriverCall::Unmap, INVALID)
    );
    d.release(h).unwrap();
    assert_eq!(
        d.release(h).unwrap_err(),
        DriverError::new(DriverCall::Release, INVALID)
    );
    d.free_reservation(r).unwrap();
    assert_eq!(
        d.free_reservation(r).unwrap_err(),
        DriverError::new(DriverCall::FreeReservation, INVALID)
    );
}

#[test]
fn sim_driver_is_send_sync_and_usable_as_dyn_driver() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SimDriver>();
    let d: std::sync::Arc<dyn Driver> = std::sync::Arc::new(sim());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let d = d.clone();
            std::thread::spawn(move || {
                for _ in 0..25 {
                    let h = d.create(G).unwrap();
                    let r = d.reserve(G).unwrap();
                    d.map(r.ptr, h).unwrap();
                    d.set_access(r.ptr, G, &[0]).unwrap();
                    d.unmap(r.ptr, G).unwrap();
                    d.release(h).unwrap();
                    d.free_reservation(r).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(d.mem_info().unwrap().free, 140 << 30);
}

// ---------------------------------------------------------------- fault injection

#[test]
fn injection_fails_exactly_the_nth_call() {
    let d = sim();
    d.inject_failure(DriverCall::Create, 3, CuResult::OUT_OF_MEMORY);
    assert!(d.mem_create(G).is_ok());
    assert!(d.mem_create(G).is_ok());
    assert_eq!(d.mem_create(G), Err(CuResult::OUT_OF_MEMORY));
    assert!(d.mem_create(G).is_ok());
    assert_eq!(d.call_count(DriverCall::Create), 4);
    assert_eq!(d.state().handles, 3);
    assert_eq!(d.pending_failures(), 0);
}

#[test]
fn injection_counts_from_the_calls_already_made() {
    let d = sim();
    for _ in 0..5 {
        let _ = d.mem_address_reserve(G, 0).unwrap();
    }
    d.inject_failure(DriverCall::Reserve, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_address_reserve(G, 0), Err(CuResult::UNKNOWN));
    assert!(d.mem_address_reserve(G, 0).is_ok());
}

#[test]
fn injected_failure_changes_nothing() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let h = d.mem_create(2 * G).unwrap();
    let before = d.state();

    d.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    assert_eq!(d.mem_create(2 * G), Err(CuResult::OUT_OF_MEMORY));
    d.inject_failure(DriverCall::Reserve, 1, CuResult::OUT_OF_MEMORY);
    assert_eq!(
        d.mem_address_reserve(2 * G, 0),
        Err(CuResult::OUT_OF_MEMORY)
    );
    d.inject_failure(DriverCall::Map, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_map(va, 2 * G, 0, h), CuResult::UNKNOWN);
    assert_eq!(d.state(), before);

    assert_eq!(d.mem_map(va, 2 * G, 0, h), OK);
    let before = d.state();
    d.inject_failure(DriverCall::SetAccess, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), CuResult::UNKNOWN);
    assert_eq!(d.touch(va, G, 0), INVALID);
    assert_eq!(d.mem_set_access(va, 2 * G, &[0]), OK);
    let before_unmap = d.state();
    assert_ne!(before, before_unmap);
    d.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_unmap(va, 2 * G), CuResult::UNKNOWN);
    assert_eq!(d.state(), before_unmap);
    assert_eq!(d.touch(va, G, 0), OK);
    assert_eq!(d.mem_unmap(va, 2 * G), OK);

    d.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_release(h), CuResult::UNKNOWN);
    assert_eq!(d.state().handles, 1);
    assert_eq!(d.mem_release(h), OK);
    d.inject_failure(DriverCall::FreeReservation, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_address_free(va, 4 * G), CuResult::UNKNOWN);
    assert_eq!(d.state().reservations, 1);
    assert_eq!(d.mem_address_free(va, 4 * G), OK);
    assert_eq!(d.state(), SimState::default());
}

#[test]
fn injected_synchronize_failure_keeps_busy_marks_and_capture() {
    let d = sim();
    d.mark_busy(0x10_0000, G);
    d.inject_failure(DriverCall::Synchronize, 1, CuResult::LAUNCH_FAILED);
    assert_eq!(d.ctx_synchronize(0), CuResult::LAUNCH_FAILED);
    assert_eq!(d.busy_ranges().len(), 1);
    assert_eq!(d.begin_capture(), OK);
    d.inject_failure(DriverCall::Synchronize, 1, CuResult::UNKNOWN);
    assert_eq!(d.ctx_synchronize(0), CuResult::UNKNOWN);
    // The injected failure did not invalidate the capture.
    assert_eq!(d.end_capture(), OK);
    assert_eq!(d.ctx_synchronize(0), OK);
    assert!(d.busy_ranges().is_empty());
}

#[test]
fn multiple_injections_queue_for_same_and_different_kinds() {
    let d = sim();
    d.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    d.inject_failure(DriverCall::Create, 3, CuResult::UNKNOWN);
    d.inject_failure(DriverCall::Reserve, 2, CuResult::INVALID_VALUE);
    d.inject_failure(DriverCall::Granularity, 1, CuResult::NOT_INITIALIZED);
    d.inject_failure(DriverCall::MemGetInfo, 1, CuResult::INVALID_CONTEXT);
    assert_eq!(d.pending_failures(), 5);

    assert_eq!(d.mem_create(G), Err(CuResult::OUT_OF_MEMORY));
    assert!(d.mem_create(G).is_ok());
    assert_eq!(d.mem_create(G), Err(CuResult::UNKNOWN));
    assert!(d.mem_create(G).is_ok());

    assert!(d.mem_address_reserve(G, 0).is_ok());
    assert_eq!(d.mem_address_reserve(G, 0), Err(INVALID));
    assert!(d.mem_address_reserve(G, 0).is_ok());

    assert_eq!(
        d.granularity().unwrap_err(),
        DriverError::new(DriverCall::Granularity, CuResult::NOT_INITIALIZED)
    );
    assert_eq!(d.granularity().unwrap(), G);
    assert_eq!(
        d.mem_info().unwrap_err(),
        DriverError::new(DriverCall::MemGetInfo, CuResult::INVALID_CONTEXT)
    );
    assert!(d.mem_info().is_ok());
    assert_eq!(d.pending_failures(), 0);
}

#[test]
fn two_injections_for_the_same_call_fail_consecutive_calls() {
    let d = sim();
    d.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    d.inject_failure(DriverCall::Create, 1, CuResult::UNKNOWN);
    assert_eq!(d.mem_create(G), Err(CuResult::OUT_OF_MEMORY));
    assert_eq!(d.mem_create(G), Err(CuResult::UNKNOWN));
    assert!(d.mem_create(G).is_ok());
}

#[test]
fn clear_failures_drops_pending_injections() {
    let d = sim();
    d.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    d.inject_failure(DriverCall::Map, 2, CuResult::UNKNOWN);
    d.clear_failures();
    assert_eq!(d.pending_failures(), 0);
    assert!(d.mem_create(G).is_ok());
    let (va, _) = mapped(&d, G, 2 * G);
    let h = d.mem_create(G).unwrap();
    assert_eq!(d.mem_map(va + G, G, 0, h), OK);
}

#[test]
fn injection_through_the_trait_is_wrapped_with_the_call() {
    let d = sim();
    d.inject_failure(DriverCall::Map, 1, CuResult::NOT_SUPPORTED);
    let r = d.reserve(G).unwrap();
    let h = d.create(G).unwrap();
    assert_eq!(
        d.map(r.ptr, h).unwrap_err(),
        DriverError::new(DriverCall::Map, CuResult::NOT_SUPPORTED)
    );
    assert_eq!(d.state().mappings, 0);
    d.map(r.ptr, h).unwrap();
}

// ---------------------------------------------------------------- work in flight

#[test]
fn unmap_of_busy_range_succeeds_but_records_a_fault() {
    let d = sim();
    let (va, _) = mapped(&d, 4 * G, 4 * G);
    d.mark_busy(va + G, 512 << 20);
    assert_eq!(d.busy_ranges(), vec![(va + G, 512 << 20)]);
    assert!(d.faults().is_empty());
    // As measured: the unmap does not wait and returns success.
    assert_eq!(d.mem_unmap(va, 4 * G), OK);
    assert_eq!(d.state().mappings, 0);
    assert_eq!(
        d.faults(),
        vec![SimFault::UnmapWhileBusy {
            ptr: va,
            size: 4 * G
        }]
    );
}

#[test]
fn synchronize_clears_busy_marks_so_unmap_is_clean() {
    let d = sim();
    let (va, h) = mapped(&d, 2 * G, 4 * G);
    d.mark_busy(va, 2 * G);
    assert_eq!(d.ctx_synchronize(0), OK);
    assert!(d.busy_ranges().is_empty());
    assert_eq!(d.mem_unmap(va, 2 * G), OK);
    assert_eq!(d.mem_release(h), OK);
    assert!(d.faults().is_empty());
}

#[test]
fn unmap_outside_busy_ranges_records_nothing() {
    let d = sim();
    let va = d.mem_address_reserve(4 * G, 0).unwrap();
    let a = d.mem_create(2 * G).unwrap();
    let b = d.mem_create(2 * G).unwrap();
    assert_eq!(d.mem_map(va, 2 * G, 0, a), OK);
    assert_eq!(d.mem_map(va + 2 * G, 2 * G, 0, b), OK);
    d.mark_busy(va + 2 * G, G);
    assert_eq!(d.mem_unmap(va, 2 * G), OK);
    assert!(d.faults().is_empty());
    assert_eq!(d.mem_unmap(va + 2 * G, 2 * G), OK);
    assert_eq!(d.faults().len(), 1);
}

#[test]
fn release_of_busy_mapped_handle_is_not_a_fault_until_unmap() {
    let d = sim();
    let (va, h) = mapped(&d, 2 * G, 2 * G);
    d.mark_busy(va, 2 * G);
    assert_eq!(d.mem_release(h), OK);
    assert!(d.faults().is_empty());
    assert_eq!(d.touch(va, 2 * G, 0), OK);
    assert_eq!(d.ctx_synchronize(0), OK);
    assert_eq!(d.mem_unmap(va, 2 * G), OK);
    assert!(d.faults().is_empty());
    assert_eq!(
        d.state(),
        SimState {
            reservations: 1,
            reserved_bytes: 2 * G,
            ..SimState::default()
        }
    );
}

#[test]
fn failed_unmap_of_busy_range_records_no_fault() {
    let d = sim();
    let (va, _) = mapped(&d, 4 * G, 4 * G);
    d.mark_busy(va, 4 * G);
    assert_eq!(d.mem_unmap(va, 2 * G), INVALID);
    assert!(d.faults().is_empty());
}

/// Dropped drivers give their address windows back: pools made one after another
/// (each replay of `flare-replay`, say) can each reserve a quarter of the 64-bit
/// address space. Before, windows were never given back and the third such driver
/// of a process found the address space exhausted (`2^62`-aligned runs at `2^62`,
/// `2^63`, then past `2^64`).
#[test]
fn dropped_drivers_give_their_addresses_back() {
    for i in 0..4 {
        let d = SimDriver::new(SimConfig::default());
        let p = d
            .mem_address_reserve(1 << 62, 1 << 62)
            .unwrap_or_else(|e| panic!("driver {i}: {e:?}"));
        assert_eq!(p % (1 << 62), 0);
        // Two live drivers still never share: a second one reserving the same
        // amount gets another run.
        let e = SimDriver::new(SimConfig::default());
        if let Ok(q) = e.mem_address_reserve(1 << 62, 1 << 62) {
            assert_ne!(p, q, "driver {i}: two live drivers share an address");
        }
    }
}
