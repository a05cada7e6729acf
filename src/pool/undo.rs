//! Driver steps with undo. The steps that make a mapping (create a handle, reserve a
//! range, map the handle, set access), each outside the lock, are recorded as they
//! succeed ([`Steps`]); when one fails, the steps done are undone in reverse: unmap,
//! free the reservation, release the handle. A refused unmap stops the undo there
//! (the mapping stays whole: its reservation must not be freed, nor its handle
//! released). The steps of several mappings made one after another are undone
//! together, latest first ([`undo_all`]). What the driver refuses to undo ([`Left`]) is kept pending in the books
//! ([`State::keep_pending`]) and retried at the next release point, as is a
//! reservation whose free the driver refuses ([`Pool::free_reservation_or_keep`]).

use super::books::{Mapping, MappingState, State};
use super::Pool;
use crate::driver::{DevicePtr, Driver, DriverCall, DriverError, PhysicalHandle, Reservation};
use crate::sync::lock;

/// The driver steps of one mapping done so far, for their undo.
pub(super) struct Steps<'d> {
    driver: &'d dyn Driver,
    /// A handle these steps created (an undo releases it).
    handle: Option<PhysicalHandle>,
    /// A range these steps reserved (an undo frees it).
    reservation: Option<Reservation>,
    /// Where these steps mapped a handle, and its size (an undo unmaps it).
    mapped: Option<(DevicePtr, u64)>,
}

/// What an undo left with the driver: the caller keeps it pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Left {
    /// The handle is still mapped (its unmap refused; it never had access granted,
    /// so no work can touch it).
    pub(super) mapped: bool,
    /// The handle these steps created is still held.
    pub(super) handle_live: bool,
    /// The range these steps reserved is still held.
    pub(super) reservation_live: bool,
}

impl<'d> Steps<'d> {
    /// No step done yet, on `driver`.
    pub(super) fn new(driver: &'d dyn Driver) -> Steps<'d> {
        Steps {
            driver,
            handle: None,
            reservation: None,
            mapped: None,
        }
    }

    /// Steps done earlier in the same call: `handle` (created by them when
    /// `created`) mapped at `ptr`. For the undo of several mappings made one after
    /// another ([`undo_all`]).
    pub(super) fn mapped(
        driver: &'d dyn Driver,
        ptr: DevicePtr,
        handle: PhysicalHandle,
        created: bool,
    ) -> Steps<'d> {
        Steps {
            driver,
            handle: created.then_some(handle),
            reservation: None,
            mapped: Some((ptr, handle.size)),
        }
    }

    /// `cuMemCreate` of `size` bytes.
    pub(super) fn create(&mut self, size: u64) -> Result<PhysicalHandle, DriverError> {
        let handle = self.driver.create(size)?;
        self.handle = Some(handle);
        Ok(handle)
    }

    /// `cuMemAddressReserve` of `size` bytes.
    pub(super) fn reserve(&mut self, size: u64) -> Result<Reservation, DriverError> {
        let reservation = self.driver.reserve(size)?;
        self.reservation = Some(reservation);
        Ok(reservation)
    }

    /// `cuMemMap` of `handle` (created by these steps or not: an undo releases only
    /// what [`Steps::create`] made) at `ptr`.
    pub(super) fn map(
        &mut self,
        ptr: DevicePtr,
        handle: PhysicalHandle,
    ) -> Result<(), DriverError> {
        self.driver.map(ptr, handle)?;
        self.mapped = Some((ptr, handle.size));
        Ok(())
    }

    /// `cuMemSetAccess` of `size` bytes at `ptr` for `devices` (nothing to undo: an
    /// unmap removes the access).
    pub(super) fn set_access(
        &mut self,
        ptr: DevicePtr,
        size: u64,
        devices: &[i32],
    ) -> Result<(), DriverError> {
        self.driver.set_access(ptr, size, devices)
    }

    /// The handle [`Steps::create`] made, if it did.
    pub(super) fn handle(&self) -> Option<PhysicalHandle> {
        self.handle
    }

    /// The range [`Steps::reserve`] reserved, if it did.
    pub(super) fn reservation(&self) -> Option<Reservation> {
        self.reservation
    }

    /// Undoes the steps done, in reverse: unmap, free the reservation, release the
    /// handle. A refused unmap leaves all three as they are. The calls the driver
    /// refuses go to `failed`; what it still holds is returned.
    pub(super) fn undo(&self, failed: &mut Vec<DriverCall>) -> Left {
        let d = self.driver;
        let mut still_mapped = false;
        if let Some((ptr, size)) = self.mapped {
            if let Err(e) = d.unmap(ptr, size) {
                failed.push(e.call);
                still_mapped = true;
            }
        }
        let mut reservation_live = false;
        if let Some(r) = self.reservation {
            if still_mapped {
                reservation_live = true;
            } else if let Err(e) = d.free_reservation(r) {
                failed.push(e.call);
                reservation_live = true;
            }
        }
        let mut handle_live = false;
        if let Some(h) = self.handle {
            if still_mapped {
                handle_live = true;
            } else if let Err(e) = d.release(h) {
                failed.push(e.call);
                handle_live = true;
            }
        }
        Left {
            mapped: still_mapped,
            handle_live,
            reservation_live,
        }
    }
}

/// Undoes the steps of several mappings (`steps`, in the order they were done)
/// together, latest first, each as [`Steps::undo`]: the calls the driver refuses go
/// to `failed`. Returns what each left with the driver, in the order of `steps`.
pub(super) fn undo_all<'a, 'd: 'a>(
    steps: impl DoubleEndedIterator<Item = &'a Steps<'d>>,
    failed: &mut Vec<DriverCall>,
) -> Vec<Left> {
    let mut left: Vec<Left> = steps.rev().map(|s| s.undo(failed)).collect();
    left.reverse();
    left
}

impl State {
    /// Keeps what the driver still holds of `reservation` and `handle` (`left`)
    /// pending: retried at the next release point. Returns the pending record's
    /// slot.
    pub(super) fn keep_pending(
        &mut self,
        reservation: Reservation,
        handle: PhysicalHandle,
        left: Left,
    ) -> u32 {
        self.add_physical(
            if left.handle_live { handle.size } else { 0 },
            if left.reservation_live {
                reservation.size
            } else {
                0
            },
        );
        let c = &mut self.counters;
        c.pending_count += 1;
        if left.handle_live {
            c.pending_bytes += handle.size;
        }
        let slot = self.add_slot(Mapping {
            requested: 0,
            state: MappingState::Pending,
            created: false,
            mapped: left.mapped,
            handle_live: left.handle_live,
            reservation_live: left.reservation_live,
            ..Mapping::created(reservation, handle, 0)
        });
        self.pending.push(slot);
        slot
    }

    /// Keeps what an undo left with the driver (a handle, mapped at `ptr` or not: a
    /// failed growth's or wake's, or a sleep's refused unmap or release) pending: retried at the next release point. Returns the
    /// pending record's slot.
    pub(super) fn keep_pending_handle(
        &mut self,
        ptr: DevicePtr,
        handle: PhysicalHandle,
        mapped: bool,
    ) -> u32 {
        let left = Left {
            mapped,
            handle_live: true,
            reservation_live: false,
        };
        self.keep_pending(Reservation { ptr, size: 0 }, handle, left)
    }
}

impl Pool {
    /// Frees reservation `r`. A refusal is counted and `r` kept pending (counted in
    /// `reserved_bytes`; retried at the next release point), and returned.
    pub(super) fn free_reservation_or_keep(&self, r: Reservation) -> Result<(), DriverError> {
        let Err(e) = self.driver.free_reservation(r) else {
            return Ok(());
        };
        let mut st = lock(&self.state);
        st.counters.count_failure(e.call);
        let left = Left {
            mapped: false,
            handle_live: false,
            reservation_live: true,
        };
        st.keep_pending(r, PhysicalHandle { raw: 0, size: 0 }, left);
        Err(e)
    }
}
