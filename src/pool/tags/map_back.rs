//! Undoing an unmap: a mapping mapped again with the pool's access (a sleep's or a
//! wake's failure).

use crate::driver::{DevicePtr, HostBuffer, PhysicalHandle};
use crate::pool::undo::Steps;
use crate::pool::Pool;

impl Pool {
    /// Maps `handle` at `ptr` again with the pool's access (undoing an unmap);
    /// refused calls go to `failed`. Returns whether it is mapped (false: unmapped,
    /// its handle still held). A refused set-access is undone by an unmap; when that
    /// is refused too, the set-access is tried twice more (the mapping stays either
    /// way, and is booked awake).
    pub(super) fn map_back(
        &self,
        ptr: DevicePtr,
        handle: PhysicalHandle,
        failed: &mut Vec<crate::driver::DriverCall>,
    ) -> bool {
        // A handle these steps did not create: the undo only unmaps.
        let mut steps = Steps::new(&*self.driver);
        if let Err(e) = steps.map(ptr, handle) {
            failed.push(e.call);
            return false;
        }
        match steps.set_access(ptr, handle.size, &self.access_devices) {
            Ok(()) => true,
            Err(e) => {
                failed.push(e.call);
                if steps.undo(failed).mapped {
                    self.grant_again(ptr, handle.size, None, failed);
                    true
                } else {
                    false
                }
            }
        }
    }

    /// A mapping that must stay (its undo was refused): grants access again (and
    /// copies its bytes back, with `copy`), twice at most; refusals go to `failed`.
    pub(super) fn grant_again(
        &self,
        ptr: DevicePtr,
        size: u64,
        copy: Option<(HostBuffer, u64, u64)>,
        failed: &mut Vec<crate::driver::DriverCall>,
    ) {
        let d = &*self.driver;
        for _ in 0..2 {
            let r = d
                .set_access(ptr, size, &self.access_devices)
                .and_then(|()| match copy {
                    Some((buf, off, n)) => d.copy_to_device(ptr, buf, off, n),
                    None => Ok(()),
                });
            match r {
                Ok(()) => return,
                Err(e) => failed.push(e.call),
            }
        }
    }
}
