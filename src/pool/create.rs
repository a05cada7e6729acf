//! Mapping creation and its undo: create, reserve, map, set access, each outside the
//! lock; a failed step undoes the earlier ones in reverse, and whatever the driver
//! refuses to undo is booked pending and retried at the next release point.

use super::books::Mapping;
use super::undo::Steps;
use super::Pool;
use crate::driver::{DevicePtr, DriverError, PhysicalHandle, Reservation};
use crate::sync::lock;

impl Pool {
    /// Creates one mapping of `size` bytes and books it live. On failure, undoes the
    /// steps done in reverse; whatever the driver refuses to undo is kept pending.
    pub(super) fn create_mapping(
        &self,
        size: u64,
        requested: u64,
    ) -> Result<DevicePtr, DriverError> {
        let mut steps = Steps::new(&*self.driver);
        let result: Result<_, DriverError> = (|| {
            let handle = steps.create(size)?;
            let reservation = steps.reserve(size)?;
            steps.map(reservation.ptr, handle)?;
            steps.set_access(reservation.ptr, size, &self.access_devices)?;
            Ok((handle, reservation))
        })();
        match result {
            Ok((handle, reservation)) => {
                let mut st = lock(&self.state);
                st.counters.mappings_created += 1;
                st.add_physical(size, size);
                let slot = st.add_slot(Mapping::created(reservation, handle, requested));
                st.history_whole(slot, true);
                Ok(st.make_live(slot, requested))
            }
            Err(err) => {
                let mut failures = vec![err.call];
                // Undo in reverse: unmap, free the reservation, release the handle.
                let left = steps.undo(&mut failures);
                let mut st = lock(&self.state);
                for call in failures {
                    st.counters.count_failure(call);
                }
                if left.handle_live || left.reservation_live {
                    // Keep what the driver still holds; retried at the next release
                    // point. A still-mapped leftover never had access granted, so no
                    // work can touch it.
                    let h = steps.handle().unwrap_or(PhysicalHandle { raw: 0, size });
                    let r = steps
                        .reservation()
                        .unwrap_or(Reservation { ptr: 0, size: 0 });
                    st.keep_pending(r, h, left);
                }
                Err(err)
            }
        }
    }
}
