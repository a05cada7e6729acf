//! The simulated driver through the `Driver` trait: whole handles mapped, errors that
//! name the call and keep the code, `Send + Sync` and usable as `dyn Driver`.

use crate::vmm_rows::{sim, G, INVALID, OK};
use flare_package::driver::sim::{SimDriver, SimState};
use flare_package::driver::{
    CuResult, Driver, DriverCall, DriverError, PhysicalHandle, Reservation,
};

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
