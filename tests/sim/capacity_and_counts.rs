//! The simulated driver's own contract: capacity enforced on the physical bytes held,
//! `mem_info`, reservations (aligned high, never reused, disjoint between drivers,
//! given back when a driver is dropped), the state and call counts, and the
//! configuration read back normalised and shown by `Debug`.
//!
//! Each test names the document row or rule it checks. Expected values come from the
//! document or the call's contract, not from running the simulator.

use crate::vmm_rows::{sim, sim_devices, G, INVALID, OK};
use flare_package::driver::sim::{
    SimConfig, SimDriver, SimState, SIM_MAX_DEVICES, SIM_VA_BASE, SIM_VA_WINDOW,
};
use flare_package::driver::{CuResult, Driver, DriverCall, MemInfo};

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
