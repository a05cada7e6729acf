//! The check every allocation makes before anything else: a request larger than the
//! whole device is [`Error::RequestTooLarge`] at once (issue 34).

use super::segments::round_up;
use super::Pool;
use crate::error::{Error, Result};

impl Pool {
    /// The block size of a request of `bytes` ([`Pool::block_size`]: `Some` in
    /// segment mode up to the whole-mapping threshold, `None` for a whole mapping),
    /// once the request is known to fit the device: when the memory it needs (a
    /// whole mapping, or the growth of a heap by whole handles for a block), rounded
    /// up to the granularity, is more than the device's total memory,
    /// [`Error::RequestTooLarge`], before any reuse attempt or cache drain: no driver
    /// call, nothing released, nothing counted (the contract of
    /// [`Pool::allocate_raw`] and the C ABI's `FLARE_STATUS_REQUEST_TOO_LARGE`). No
    /// idle memory could serve such a request either: the pool never holds more
    /// than the device, in whole granules.
    ///
    /// Errors: those of [`Pool::block_size`] and of the rounding (0 bytes, a size
    /// whose rounding overflows: [`Error::InvalidArgument`]); then
    /// [`Error::RequestTooLarge`].
    pub(super) fn checked_request(&self, bytes: u64) -> Result<Option<u64>> {
        let block = self.block_size(bytes)?;
        let rounded = match block {
            // `block_size` checked that this rounding does not overflow.
            Some(size) => round_up(size, self.granularity).unwrap_or(u64::MAX),
            None => self.rounded(bytes)?,
        };
        if rounded > self.device_total {
            return Err(Error::RequestTooLarge {
                requested: rounded,
                device_total: self.device_total,
            });
        }
        Ok(block)
    }
}
