//! A miss: new memory (a mapping, or a heap's growth); on out-of-memory, the one
//! policy every allocation follows: a forced reuse of idle memory, then (outside a
//! retention scope) a release of what is idle and one retry.

use crate::driver::{DevicePtr, DriverError, Stream};
use crate::error::{Error, Result};
use crate::pool::books::{State, ANY, SYNC_FREED};
use crate::pool::{Pool, ReusePolicy};
use crate::sync::lock;

/// What a miss ([`Pool::miss_with`]) does when the driver ran out of memory, before
/// and for its one retry.
pub(in crate::pool) struct OnOom<F> {
    /// The thread caches are settled before `take_forced` (what other threads'
    /// caches hold idle may serve; a tag other than 0 never goes through them).
    pub(in crate::pool) settle_caches: bool,
    /// Takes idle memory under the lock, whatever the policy's bound (not called
    /// under `none`).
    pub(in crate::pool) take_forced: F,
    /// The release before the retry may synchronize the device (the synchronous
    /// API; a stream-ordered allocation releases only memory whose fences
    /// completed).
    pub(in crate::pool) may_sync: bool,
}

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
        let on_oom = OnOom {
            settle_caches: true,
            take_forced: |st: &mut State| match on {
                Some((s, capture)) => {
                    self.take_forced_for_stream(st, s, capture, forced_size, bytes)
                }
                None => st
                    .take_forced(SYNC_FREED, forced_size, bytes)
                    .or_else(|| st.take_forced(ANY, forced_size, bytes)),
            },
            may_sync: on.is_none(),
        };
        self.miss_with(rounded, on_oom, create, retake)
    }

    /// [`Pool::miss`] with what it does on out-of-memory given by `on_oom`: the
    /// untagged API's (above), or a tag's (`tags/`), whose memory is its own.
    pub(in crate::pool) fn miss_with(
        &self,
        rounded: u64,
        on_oom: OnOom<impl FnOnce(&mut State) -> Option<DevicePtr>>,
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
            Err(e) if e.is_out_of_memory() => self.noted_oom(e),
            Err(e) => return Err(driver_error(e)),
        };
        let OnOom {
            settle_caches,
            take_forced,
            may_sync,
        } = on_oom;
        if let Some(ptr) = self.after_oom(settle_caches, take_forced, rounded, err)? {
            return Ok(ptr);
        }
        self.release_for_retry(may_sync);
        if let Some(ptr) = retake(&mut lock(&self.state)) {
            return Ok(ptr);
        }
        match create() {
            Ok(ptr) => Ok(ptr),
            Err(e) if e.is_out_of_memory() => {
                let st = lock(&self.state);
                Err(self.oom_error(&st, rounded, Some(self.noted_oom(e))))
            }
            Err(e) => Err(driver_error(e)),
        }
    }

    /// What an allocation does when the driver ran out of memory before releasing
    /// anything: the idle memory `take_forced` takes under the lock (the untagged
    /// API: the smallest idle mapping, or block freed whole into a bucket, of at
    /// least the size asked that the caller may take), whatever its size, because
    /// the policy's bound chooses between idle memory and is no reason to fail while
    /// some would serve (not under `none`); with `settle_caches`, after the thread
    /// caches are settled; inside a scope, the out-of-memory error (`rounded` bytes
    /// asked, with the driver's `err`); outside one, `Ok(None)`, counted in
    /// `oom_retries`: the caller releases what is idle and retries once.
    pub(super) fn after_oom(
        &self,
        settle_caches: bool,
        take_forced: impl FnOnce(&mut State) -> Option<DevicePtr>,
        rounded: u64,
        err: DriverError,
    ) -> Result<Option<DevicePtr>> {
        if settle_caches {
            // What other threads' caches hold idle may serve.
            self.caches.settle(&self.state);
        }
        let mut st = lock(&self.state);
        if self.policy != ReusePolicy::None {
            let forced = take_forced(&mut st);
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
