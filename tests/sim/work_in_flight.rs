//! The simulated driver's work in flight: an unmap of a busy range succeeds but
//! records a fault, a synchronize clears the busy marks, and a release or a failed
//! unmap of a busy range is no fault.

use crate::vmm_rows::{mapped, sim, G, INVALID, OK};
use flare_package::driver::sim::{SimFault, SimState};

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
