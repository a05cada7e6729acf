//! Mapping creation and its undo: create, reserve, map, set access, each outside the
//! lock; a failed step undoes the earlier ones in reverse, and whatever the driver
//! refuses to undo is booked pending and retried at the next release point.

use super::books::{Mapping, MappingState};
use super::Pool;
use crate::driver::{DevicePtr, DriverCall, DriverError, PhysicalHandle, Reservation};
use crate::sync::lock;

impl Pool {
    /// Creates one mapping of `size` bytes and books it live. On failure, undoes the
    /// steps done in reverse; whatever the driver refuses to undo is kept pending.
    pub(super) fn create_mapping(
        &self,
        size: u64,
        requested: u64,
    ) -> Result<DevicePtr, DriverError> {
        let d = &*self.driver;
        let mut failures: [Option<DriverCall>; 4] = [None; 4];
        let mut nfail = 0;
        let mut fail = |call: DriverCall| {
            failures[nfail] = Some(call);
            nfail += 1;
        };
        let result = (|| {
            let handle = d.create(size).map_err(|e| (e, None, None, false))?;
            let reservation = match d.reserve(size) {
                Ok(r) => r,
                Err(e) => return Err((e, Some(handle), None, false)),
            };
            if let Err(e) = d.map(reservation.ptr, handle) {
                return Err((e, Some(handle), Some(reservation), false));
            }
            if let Err(e) = d.set_access(reservation.ptr, size, &self.access_devices) {
                return Err((e, Some(handle), Some(reservation), true));
            }
            Ok((handle, reservation))
        })();
        match result {
            Ok((handle, reservation)) => {
                let mut st = lock(&self.state);
                st.counters.mappings_created += 1;
                st.add_physical(size, size);
                let slot = st.add_slot(Mapping::created(reservation, handle, requested));
                Ok(st.make_live(slot, requested))
            }
            Err((err, handle, reservation, mapped)) => {
                fail(err.call);
                // Undo in reverse: unmap, free the reservation, release the handle.
                let mut still_mapped = false;
                if let (true, Some(r), Some(h)) = (mapped, reservation, handle) {
                    if d.unmap(r.ptr, h.size).is_err() {
                        fail(DriverCall::Unmap);
                        still_mapped = true;
                    }
                }
                let mut reservation_live = false;
                if let Some(r) = reservation {
                    if still_mapped {
                        reservation_live = true;
                    } else if d.free_reservation(r).is_err() {
                        fail(DriverCall::FreeReservation);
                        reservation_live = true;
                    }
                }
                let mut handle_live = false;
                if let Some(h) = handle {
                    if still_mapped {
                        handle_live = true;
                    } else if d.release(h).is_err() {
                        fail(DriverCall::Release);
                        handle_live = true;
                    }
                }
                let mut st = lock(&self.state);
                for call in failures.iter().flatten() {
                    st.counters.count_failure(*call);
                }
                if handle_live || reservation_live {
                    // Keep what the driver still holds; retried at the next release
                    // point. A still-mapped leftover never had access granted, so no
                    // work can touch it.
                    let h = handle.unwrap_or(PhysicalHandle { raw: 0, size });
                    let r = reservation.unwrap_or(Reservation { ptr: 0, size: 0 });
                    st.add_physical(
                        if handle_live { h.size } else { 0 },
                        if reservation_live { r.size } else { 0 },
                    );
                    let c = &mut st.counters;
                    c.pending_count += 1;
                    if handle_live {
                        c.pending_bytes += h.size;
                    }
                    let slot = st.add_slot(Mapping {
                        requested: 0,
                        state: MappingState::Pending,
                        created: false,
                        mapped: still_mapped,
                        handle_live,
                        reservation_live,
                        ..Mapping::created(r, h, 0)
                    });
                    st.pending.push(slot);
                }
                Err(err)
            }
        }
    }
}
