//! A miss: new memory (a mapping, or a heap's growth); on out-of-memory, the one
//! policy every allocation follows: a forced reuse of idle memory, then (outside a
//! retention scope) a release of what is idle and one retry.

use crate::driver::{DevicePtr, DriverError, Stream};
use crate::error::{Error, Result};
use crate::pool::books::{State, ANY, SYNC_FREED};
use crate::pool::{record, Pool, ReusePolicy};
use crate::sync::lock;

impl Pool {
    /// A miss: a new mapping; on out-of-memory, a forced reuse, then (outside a
    /// scope) a release of what is idle and one retry. `on`: the stream (and its
    /// capture) of an `allocate_async`.
    #[cold]
    pub(super) fn allocate_miss(
        &self,
        bytes: u64,
        rounded: u64,
        max_size: u64,
        on: Option<(Stream, Option<u64>)>,
    ) -> Result<DevicePtr> {
        self.miss(
            rounded,
            rounded,
            bytes,
            on,
            || self.create_mapping(rounded, bytes),
            |st| self.take_for(st, on, rounded, bytes, max_size),
        )
    }

    /// The miss path shared by whole mappings and blocks: `create` makes the memory
    /// (a new mapping, or a growth of a heap) for a request of `rounded` bytes
    /// (`bytes` asked). Beyond the whole device: [`Error::RequestTooLarge`] at once,
    /// no driver call, nothing counted. On out-of-memory: [`Pool::after_oom`] (a
    /// forced reuse of idle memory of at least `forced_size` bytes, or the error
    /// inside a scope); outside a scope, a release of what is idle, `retake` under
    /// the lock, and `create` once more. A failed release (a synchronize refused
    /// during a capture, say) is already counted and its memory kept; the retry then
    /// reports the out-of-memory. A stream-ordered allocation (`on`) never
    /// synchronizes the device (a capture may be open on any stream): it releases
    /// only memory whose fences completed; the synchronous `allocate` releases
    /// everything idle, after a device synchronize.
    pub(super) fn miss(
        &self,
        rounded: u64,
        forced_size: u64,
        bytes: u64,
        on: Option<(Stream, Option<u64>)>,
        create: impl Fn() -> Result<DevicePtr, DriverError>,
        retake: impl FnOnce(&mut State) -> Option<DevicePtr>,
    ) -> Result<DevicePtr> {
        if rounded > self.device_total {
            return Err(Error::RequestTooLarge {
                requested: rounded,
                device_total: self.device_total,
            });
        }
        let driver_error = |source| Error::Driver {
            source,
            bytes: rounded,
        };
        self.record_call_start();
        let err = match create() {
            Ok(ptr) => return Ok(ptr),
            Err(e) if e.is_out_of_memory() => e,
            Err(e) => return Err(driver_error(e)),
        };
        if self.rec.is_some() {
            record::note_oom();
        }
        if let Some(ptr) = self.after_oom(on, rounded, forced_size, bytes, err)? {
            return Ok(ptr);
        }
        self.release_for_retry(on.is_none());
        if let Some(ptr) = retake(&mut lock(&self.state)) {
            return Ok(ptr);
        }
        match create() {
            Ok(ptr) => Ok(ptr),
            Err(e) if e.is_out_of_memory() => {
                if self.rec.is_some() {
                    record::note_oom();
                }
                let st = lock(&self.state);
                Err(self.oom_error(&st, rounded, Some(e)))
            }
            Err(e) => Err(driver_error(e)),
        }
    }

    /// What an allocation does when the driver ran out of memory before releasing
    /// anything: the smallest idle mapping (or block freed whole into a bucket) of at
    /// least `size` bytes that the caller may take (`on`: its stream and capture),
    /// whatever its size, because the policy's bound chooses between idle memory and
    /// is no reason to fail while some would serve (not under `none`); inside a scope,
    /// the out-of-memory error (`rounded` bytes asked, with the driver's `err`);
    /// outside one, `Ok(None)`, counted in `oom_retries`: the caller releases what is
    /// idle and retries once.
    pub(super) fn after_oom(
        &self,
        on: Option<(Stream, Option<u64>)>,
        rounded: u64,
        size: u64,
        bytes: u64,
        err: DriverError,
    ) -> Result<Option<DevicePtr>> {
        // What other threads' caches hold idle may serve.
        self.caches.settle(&self.state);
        let mut st = lock(&self.state);
        if self.policy != ReusePolicy::None {
            let forced = match on {
                Some((s, capture)) => self.take_forced_for_stream(&mut st, s, capture, size, bytes),
                None => st
                    .take_forced(SYNC_FREED, size, bytes)
                    .or_else(|| st.take_forced(ANY, size, bytes)),
            };
            if forced.is_some() {
                return Ok(forced);
            }
        }
        if st.counters.scope_open {
            return Err(self.oom_error(&st, rounded, Some(err)));
        }
        st.counters.oom_retries += 1;
        Ok(None)
    }

    pub(super) fn oom_error(&self, st: &State, rounded: u64, source: Option<DriverError>) -> Error {
        Error::OutOfMemory {
            requested: rounded,
            // Segment mode: live blocks are live, free blocks cached.
            live: st.counters.live_mapped_bytes + st.counters.block_live_bytes,
            idle: st.cached_bytes(),
            in_scope: st.counters.scope_open,
            source,
        }
    }
}
