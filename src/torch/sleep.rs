//! Sleep and wake of a device's tensor pool (issues 15 and 34), for Python's
//! `sleep()`, `wake()` and `census()`: the memory of every tensor PyTorch allocated
//! through the per-tensor allocator is tag 0 of the device's tensor pool, so putting
//! tag 0 to sleep gives that memory back to the device with every tensor's address
//! kept (vLLM's sleep mode), and waking maps it again, with the bytes restored
//! (offload) or, for a discard sleep, zeroed on request ([`Pool::wake_zeroed`]). The
//! mempool and graph pools are not touched.

use super::TorchAllocator;
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::pool::{Pool, SleepMode, TagCensus};

impl TorchAllocator {
    /// Puts `device`'s tensor pool (tag 0: every tensor of the per-tensor allocator,
    /// outside graph pools) to sleep in `mode` ([`Pool::sleep`]): a device
    /// synchronize, then its physical memory is released (offload: its tensors'
    /// bytes copied to pinned host memory first), every address kept. Until
    /// [`TorchAllocator::wake`], allocating or freeing a tensor on that device's
    /// tensor pool fails (PyTorch sees an allocation error; a free is a hook failure).
    ///
    /// Errors: [`Error::InvalidArgument`] for a device outside `0..MAX_DEVICES` (or,
    /// simulated, one the machine does not have); [`Error::TagState`] when it already
    /// sleeps or the device was never used (nothing to put to sleep); otherwise as
    /// [`Pool::sleep`] (a retention scope open: [`Error::ScopeState`]).
    pub fn sleep(&self, device: i32, mode: SleepMode) -> Result<()> {
        self.tensor_pool(device)?.sleep(0, mode)
    }

    /// Wakes `device`'s tensor pool ([`Pool::wake`]); with `zero`, a zeroing wake on
    /// that stream ([`Pool::wake_zeroed`]: after a discard sleep, every tensor's
    /// requested bytes are set to zero by memsets queued on the stream).
    ///
    /// Errors: [`Error::InvalidArgument`] for a bad device; [`Error::TagState`] when
    /// it does not sleep (or was never used); otherwise as [`Pool::wake`] and
    /// [`Pool::wake_zeroed`] (a refused memset: the pool awake, the error returned).
    pub fn wake(&self, device: i32, zero: Option<Stream>) -> Result<()> {
        let pool = self.tensor_pool(device)?;
        let Some(stream) = zero else {
            return pool.wake(0);
        };
        // The simulated driver's legacy stream is the calling thread's current
        // device's (`SimDriver::ctx_set_current`): made this device's for the call, as
        // the CUDA backend pushes the device's context around its memsets.
        let sim = pool.sim_driver();
        let previous = sim
            .as_ref()
            .map(|s| (s.ctx_get_device(), s.ctx_set_current(device)));
        let result = pool.wake_zeroed(0, stream);
        if let (Some(s), Some((before, switched))) = (&sim, previous) {
            if switched.is_success() {
                let _ = s.ctx_set_current(before);
            }
        }
        result
    }

    /// The census of `device`'s tensor pool (tag 0, [`Pool::tag_census`]); `None`
    /// when the device was never used.
    ///
    /// Errors: [`Error::InvalidArgument`] for a bad device.
    pub fn census(&self, device: i32) -> Result<Option<TagCensus>> {
        Ok(self.known(device)?.get().map(|d| d.tensor.tag_census(0)))
    }

    /// [`TorchAllocator::census`] as one JSON object (`census()` in Python):
    /// `device`, `created` (false: nothing else), and each census field by name
    /// (`sleeping` as a boolean). A bad device gives `{"error": "..."}`.
    pub fn census_json(&self, device: i32) -> String {
        let c = match self.census(device) {
            Ok(Some(c)) => c,
            Ok(None) => return format!("{{\"device\":{device},\"created\":false}}"),
            Err(e) => return format!("{{\"error\":{:?}}}", e.to_string()),
        };
        format!(
            "{{\"device\":{device},\"created\":true,\"sleeping\":{},\"live_count\":{},\
             \"live_bytes\":{},\"peak_live_bytes\":{},\"idle_bytes\":{},\
             \"physical_bytes\":{},\"offloaded_bytes\":{},\"zeroed_bytes\":{},\
             \"zero_memsets\":{}}}",
            c.sleeping,
            c.live_count,
            c.live_bytes,
            c.peak_live_bytes,
            c.idle_bytes,
            c.physical_bytes,
            c.offloaded_bytes,
            c.zeroed_bytes,
            c.zero_memsets
        )
    }

    /// The tensor pool of a device that exists and was used.
    fn tensor_pool(&self, device: i32) -> Result<&Pool> {
        self.known(device)?
            .get()
            .map(|d| &d.tensor)
            .ok_or(Error::TagState {
                tag: 0,
                reason: "the device's tensor pool was never used: nothing sleeps",
            })
    }
}
