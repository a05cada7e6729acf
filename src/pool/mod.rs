//! The pool: whole mappings handed out, retained, reused and released.
//!
//! - [`Pool`]: allocate, free, retention scope, trim, snapshot; `Send + Sync`.
//! - [`Allocation`], [`RetentionScope`]: guards that free / abort on drop.
//! - [`ReusePolicy`], [`PoolConfig`], [`Backend`]: configuration.
//! - [`Snapshot`]: the counters, copied atomically.
//!
//! Every mapping is in exactly one state: live, idle (retained or cached; a mapping
//! being released by another thread is still idle in the books, but out of the reuse
//! index) or pending (a release step failed; kept and retried). The books sit under
//! one lock, which is never held across a driver call that creates or releases
//! memory.
#![forbid(unsafe_code)]

mod books;
mod cache;
mod config;
mod create;
mod fit;
mod guards;
mod index;
mod record;
mod release;
mod segments;
mod snapshot;
mod stream_forget;
mod streams;
mod table;
mod tags;
mod too_large;

pub(crate) use config::cross_stream_modes;
pub(crate) use config::reuse_policies;
pub use config::{
    Backend, CrossStreamReuse, PoolConfig, ReusePolicy, DEFAULT_BEST_FIT_MAX_WASTE_PERCENT,
    DEFAULT_SEGMENT_WHOLE_THRESHOLD_BYTES, DEFAULT_THREAD_CACHE_BYTES,
    DEFAULT_THREAD_CACHE_ENTRIES, SEGMENT_BLOCK_ROUND_BYTES, SEGMENT_SMALL_MAX_BYTES,
};
pub use guards::{Allocation, RetentionScope};
pub(crate) use snapshot::snapshot_counters;
pub use snapshot::Snapshot;
pub(crate) use stream_forget::check_forgettable;
pub use tags::{SleepMode, TagCensus};

use crate::driver::sim::SimDriver;
use crate::driver::{DevicePtr, Driver, DriverError, Stream};
use crate::error::{Error, Result};
use crate::sync::{lock, wait, Condvar, Mutex, MutexGuard};
use books::{MappingState, State, ANY, SYNC_FREED};
use release::{Batch, Captures};
use std::sync::Arc;
use tags::tag_gate;
/// A pool of whole CUDA virtual-memory mappings on one device.
///
/// `Send + Sync`: every method may be called from any thread. A reuse hit takes the
/// lock once and makes no driver call; a miss creates a mapping (create, reserve,
/// map, set access; tens of microseconds on an H200) outside the lock.
pub struct Pool {
    driver: Arc<dyn Driver>,
    policy: ReusePolicy,
    granularity: u64,
    release_threshold: u64,
    max_waste_percent: u64,
    cross_stream: CrossStreamReuse,
    /// Segment mode ([`ReusePolicy::Segments`]).
    segments: bool,
    /// Segment mode: requests above this many bytes take whole mappings.
    whole_threshold: u64,
    /// Segment mode: bytes each segment reserves (the device's total memory, rounded
    /// up to the granularity: a heap class never needs a second segment while the
    /// device has memory, unless holes left by released handles use up its range).
    segment_reserve: u64,
    access_devices: Vec<i32>,
    /// The device's total memory, bytes (`cuMemGetInfo` at creation; `u64::MAX`
    /// when the query failed): a request above it cannot succeed however much is
    /// released, so it fails at once.
    device_total: u64,
    state: Mutex<State>,
    /// The thread caches in front of the books (`cache.rs`).
    caches: cache::Caches,
    /// Signalled when `State::releases_running` falls to 0 (the scope barrier).
    releases_done: Condvar,
    /// The tag gate (`tag_gate.rs`): calls on a tag's memory against its sleep and
    /// wake.
    gate: tag_gate::TagGate,
    /// The recording ([`PoolConfig::record_path`]; `record.rs`), `None` when off.
    rec: Option<Arc<record::Recorder>>,
    /// A pool that only captures allocate from (a PyTorch graph pool,
    /// [`Pool::dedicate_to_captures`]): memory freed during a capture on its own
    /// stream goes back to that stream's heap or bucket at once (coalescing), as a
    /// free outside a capture does, instead of waiting whole in the capture's bucket.
    captures_only: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("policy", &self.policy)
            .field("granularity", &self.granularity)
            .field("simulated", &self.sim_driver().is_some())
            .finish_non_exhaustive()
    }
}
/// What a miss ([`Pool::miss_with`]) does when the driver ran out of memory, before
/// and for its one retry.
struct OnOom<F> {
    /// The thread caches are settled before `take_forced` (what other threads'
    /// caches hold idle may serve; a tag other than 0 never goes through them).
    settle_caches: bool,
    /// Takes idle memory under the lock, whatever the policy's bound (not called
    /// under `none`).
    take_forced: F,
    /// The release before the retry may synchronize the device (the synchronous
    /// API; a stream-ordered allocation releases only memory whose fences
    /// completed).
    may_sync: bool,
}

impl Pool {
    /// Creates a pool on the backend named in `config`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a negative device or peer ordinal, or
    /// an empty [`PoolConfig::record_path`]; [`Error::NoDriver`] when the CUDA
    /// backend is asked for and libcuda cannot be loaded or initialised;
    /// [`Error::Driver`] when the granularity query fails.
    pub fn new(config: PoolConfig) -> Result<Pool> {
        // The configuration is checked before any driver is touched (a negative
        // device is an invalid argument on every backend, not a missing driver).
        validate_config(&config)?;
        let driver = crate::backend::open(&config)?;
        Pool::with_driver(config, driver)
    }

    /// Creates a pool on `driver` (any [`Driver`]; `config.backend` is ignored).
    ///
    /// Errors: [`Error::InvalidArgument`] for a negative device or peer ordinal, an
    /// empty [`PoolConfig::record_path`] or a granularity that is not a power of two;
    /// [`Error::Driver`] when the granularity query fails.
    pub fn with_driver(config: PoolConfig, driver: Arc<dyn Driver>) -> Result<Pool> {
        validate_config(&config)?;
        let granularity = driver
            .granularity()
            .map_err(|source| Error::Driver { source, bytes: 0 })?;
        if !granularity.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "the driver reports a granularity of {granularity} bytes, not a power of two"
            )));
        }
        let mut access_devices = vec![config.device];
        for &p in &config.peer_devices {
            if !access_devices.contains(&p) {
                access_devices.push(p);
            }
        }
        let device_total = driver.mem_info().map_or(u64::MAX, |m| m.total);
        let segment_reserve =
            segments::round_up(device_total.min(1 << 40), granularity).unwrap_or(1 << 40);
        let caches = cache::Caches::new(
            config.thread_cache_entries > 0 && config.reuse_policy != ReusePolicy::None,
            config.thread_cache_entries,
            config.thread_cache_bytes,
        );
        // With no threshold, nothing is released outside a scope either.
        caches.set_open(config.release_threshold_bytes == u64::MAX);
        let rec = config.record_path.as_deref().map(|path| {
            Arc::new(record::Recorder::open(
                path,
                &record::header(&config, granularity, device_total),
            ))
        });
        Ok(Pool {
            rec,
            caches,
            segments: config.reuse_policy.is_segments(),
            whole_threshold: config.segment_whole_threshold_bytes,
            segment_reserve,
            driver,
            policy: config.reuse_policy,
            granularity,
            release_threshold: config.release_threshold_bytes,
            max_waste_percent: u64::from(config.best_fit_max_waste_percent),
            cross_stream: config.cross_stream_reuse,
            access_devices,
            device_total,
            state: Mutex::new(State::new(granularity)),
            releases_done: Condvar::new(),
            gate: tag_gate::TagGate::new(),
            captures_only: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The simulated driver under this pool, when it runs on one (created with
    /// [`Backend::Simulated`], or [`Pool::with_driver`] given a [`SimDriver`]): the
    /// typed handle for fault injection, queued work and captures, and for comparing
    /// the books with what the driver holds. The pool holds the driver once; this is
    /// that same driver, seen as its concrete type.
    pub fn sim_driver(&self) -> Option<Arc<SimDriver>> {
        let any: Arc<dyn std::any::Any + Send + Sync> = self.driver.clone();
        any.downcast::<SimDriver>().ok()
    }

    /// The driver under this pool.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// The allocation granularity, bytes (2 MiB on an H200): every mapping's size is
    /// a multiple of it.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// The reuse policy.
    pub fn policy(&self) -> ReusePolicy {
        self.policy
    }

    /// Rounds `bytes` up to the granularity; `None` on overflow.
    fn round(&self, bytes: u64) -> Option<u64> {
        let g = self.granularity;
        // A power of two (checked at creation): a mask, not a division.
        bytes.checked_add(g - 1).map(|b| b & !(g - 1))
    }

    fn max_fit(&self, rounded: u64) -> u64 {
        max_fit(rounded, self.max_waste_percent)
    }

    /// Allocates `bytes` of device memory; returns a guard that frees it on drop.
    /// See [`Pool::allocate_raw`] for the rules and errors.
    pub fn allocate(&self, bytes: u64) -> Result<Allocation<'_>> {
        let (ptr, key) = self.allocate_sync(bytes)?;
        Ok(match key {
            Some(id) => Allocation {
                pool: self,
                ptr,
                bytes,
                id,
                stream: None,
            },
            None => self.guard(ptr, bytes, None),
        })
    }

    /// Allocates `bytes` of device memory and returns its device address, aligned to
    /// the granularity (in [`ReusePolicy::Segments`], a block's address, aligned to
    /// 512 bytes). The caller frees it with [`Pool::free_raw`].
    ///
    /// In [`ReusePolicy::Segments`] (up to `segment_whole_threshold_bytes`) the size
    /// is rounded up to 512 bytes and carved from the synchronous API's heap, which
    /// grows by whole handles (`docs/ARCHITECTURE.md`, "Segments"); otherwise: the
    /// size is rounded up to the granularity. An idle mapping that fits under the
    /// reuse policy is taken with no driver call (memory freed with [`Pool::free_raw`]
    /// first, then memory freed on a stream whose work is known complete); otherwise,
    /// when memory freed on streams would fit, their fences are polled
    /// (`cuEventQuery`, per [`CrossStreamReuse`]); otherwise a new mapping is created
    /// (create, reserve, map, set access for the device and every peer), and a failed
    /// step undoes the earlier ones in reverse. A pool used only through the
    /// synchronous functions makes no stream or event call.
    ///
    /// Errors: [`Error::InvalidArgument`] for 0 bytes or a size whose rounding
    /// overflows; [`Error::RequestTooLarge`] when the rounded size is above the
    /// device's total memory (at once: no driver call, nothing counted);
    /// [`Error::OutOfMemory`] when the device is full (outside a scope,
    /// after releasing idle mappings and retrying once; inside one, with nothing
    /// retained released); [`Error::Driver`] for any other failed driver call;
    /// [`Error::TagState`] while tag 0 (the untagged functions' tag) is asleep or a
    /// sleep or wake of it runs (nothing done: the allocation runs wholly before or
    /// wholly after each of them).
    pub fn allocate_raw(&self, bytes: u64) -> Result<DevicePtr> {
        self.allocate_sync(bytes).map(|(ptr, _)| ptr)
    }

    /// [`Pool::allocate_raw`]; with the guard's key when a thread cache served it.
    fn allocate_sync(&self, bytes: u64) -> Result<(DevicePtr, Option<u64>)> {
        let _order = self.record_order();
        self.record_call_start();
        let r = self.allocate_sync_inner(bytes);
        match &r {
            Ok((ptr, _)) => {
                if let Some(rec) = &self.rec {
                    rec.alloc(*ptr, bytes, 0, None);
                }
            }
            Err(e) => self.record_failed(e, bytes, 0, None),
        }
        r
    }

    /// [`Pool::allocate_sync`], not recorded.
    fn allocate_sync_inner(&self, bytes: u64) -> Result<(DevicePtr, Option<u64>)> {
        let block = self.checked_request(bytes)?;
        let want = self.want(bytes, block)?;
        // A cache hit checks tag 0's gate under the cache's mutex (`tag_gate.rs`).
        if self.caches.may_hold() {
            if let Some((ptr, key)) = self.caches.pop(&want, &self.state, &self.gate) {
                return Ok((ptr, Some(key)));
            }
        }
        let entry = self.enter_untagged()?;
        let r = self.allocate_sync_books(bytes, block);
        self.leave(entry);
        r
    }

    /// [`Pool::allocate_sync_inner`] in the books (tag 0 entered).
    fn allocate_sync_books(
        &self,
        bytes: u64,
        block: Option<u64>,
    ) -> Result<(DevicePtr, Option<u64>)> {
        let ptr = match block {
            Some(size) => self.allocate_block_sync(size, bytes)?,
            None => self.allocate_whole_sync(bytes)?,
        };
        // Served by the books: live through this thread's cache from now on, so
        // that it comes back here whichever thread frees it.
        if self.caches.may_hold() {
            if let Some(key) = self.caches.adopt_live(ptr, &self.state) {
                return Ok((ptr, Some(key)));
            }
        }
        Ok((ptr, None))
    }

    /// What a synchronous request of `bytes` asks of a thread cache (`block`: its
    /// block size in segment mode).
    fn want(&self, bytes: u64, block: Option<u64>) -> Result<cache::Want> {
        Ok(match block {
            Some(size) => cache::Want {
                block: true,
                rounded: size,
                waste_percent: None,
                requested: bytes,
            },
            None => cache::Want {
                block: false,
                rounded: self.rounded(bytes)?,
                waste_percent: (self.policy != ReusePolicy::Exact)
                    .then_some(self.max_waste_percent),
                requested: bytes,
            },
        })
    }

    /// A whole mapping for the synchronous `allocate`: the books, this thread's
    /// cache given back to them, memory freed on streams, a new mapping.
    fn allocate_whole_sync(&self, bytes: u64) -> Result<DevicePtr> {
        let (rounded, max_size) = self.sizes(bytes)?;
        if let Some(ptr) = self.take_for(&mut lock(&self.state), None, rounded, bytes, max_size) {
            return Ok(ptr);
        }
        if let Some(ptr) = self.refill_from_caches(&self.want(bytes, None)?, |st| {
            self.take_for(st, None, rounded, bytes, max_size)
        }) {
            return Ok(ptr);
        }
        if let Some(p) = self.take_cross_stream(None, None, rounded, bytes, max_size) {
            return Ok(p);
        }
        self.allocate_miss(bytes, rounded, max_size, None)
    }

    /// Before a miss of the synchronous `allocate` (a request `want`): the calling
    /// thread's cache back to the books, then `retake` under the lock; then what
    /// every other cache holds that fits `want`, and `retake` again. A cache never
    /// makes the pool create memory of a size that one holds idle.
    fn refill_from_caches(
        &self,
        want: &cache::Want,
        retake: impl FnMut(&mut State) -> Option<DevicePtr>,
    ) -> Option<DevicePtr> {
        if !self.caches.enabled {
            return None;
        }
        self.caches.drain_own(want, &self.state, retake)
    }

    /// The rounded size of a request of `bytes`, and the largest mapping the policy
    /// takes for it.
    fn sizes(&self, bytes: u64) -> Result<(u64, u64)> {
        let rounded = self.rounded(bytes)?;
        Ok((rounded, self.max_fit(rounded)))
    }

    /// The rounded size of a request of `bytes`.
    fn rounded(&self, bytes: u64) -> Result<u64> {
        if bytes == 0 {
            return Err(Error::InvalidArgument("allocation of 0 bytes".into()));
        }
        self.round(bytes).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "allocation of {bytes} bytes overflows when rounded to the granularity"
            ))
        })
    }

    /// Takes an idle mapping for the caller: on `stream` (with its capture), or,
    /// with `None`, for the synchronous API ([`SYNC_FREED`], then [`ANY`]).
    fn take_for(
        &self,
        st: &mut State,
        on: Option<(Stream, Option<u64>)>,
        rounded: u64,
        bytes: u64,
        max_size: u64,
    ) -> Option<DevicePtr> {
        match on {
            Some((s, capture)) => self.take_for_stream(st, s, capture, rounded, bytes, max_size),
            None => st
                .take_idle(SYNC_FREED, rounded, bytes, self.policy, max_size)
                .or_else(|| st.take_idle(ANY, rounded, bytes, self.policy, max_size)),
        }
    }

    /// A miss: a new mapping; on out-of-memory, a forced reuse, then (outside a
    /// scope) a release of what is idle and one retry. `on`: the stream (and its
    /// capture) of an `allocate_async`.
    #[cold]
    fn allocate_miss(
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
    fn miss(
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
    fn miss_with(
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
    fn after_oom(
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

    fn oom_error(&self, st: &State, rounded: u64, source: Option<DriverError>) -> Error {
        Error::OutOfMemory {
            requested: rounded,
            // Segment mode: live blocks are live, free blocks cached.
            live: st.counters.live_mapped_bytes + st.counters.block_live_bytes,
            idle: st.cached_bytes(),
            in_scope: st.counters.scope_open,
            source,
        }
    }

    /// Frees an allocation made by this pool, given its exact address.
    ///
    /// Inside a retention scope the mapping is retained idle (no driver call).
    /// Outside, it stays cached while the pool's idle bytes stay at or under the
    /// release threshold, else it is released (synchronize, unmap, release the
    /// handle, free the reservation). A release step that fails keeps the memory and
    /// is retried at the next release point; it is counted in the snapshot and does
    /// not fail the free.
    ///
    /// Concurrency: the free runs wholly before or wholly after each sleep and wake
    /// of the pointer's tag (`docs/ARCHITECTURE.md`, "Tags: sleep and wake"): its
    /// tag is looked up and checked in one step.
    ///
    /// Errors: [`Error::UnknownPointer`] for a pointer this pool did not hand out, an
    /// interior pointer, or a second free; [`Error::TagState`] while the pointer's tag
    /// (0 for the untagged functions' memory) is asleep or a sleep or wake of it runs;
    /// nothing changes then.
    pub fn free_raw(&self, ptr: DevicePtr) -> Result<()> {
        self.free_inner(ptr, None)
    }

    /// Frees `ptr` if it is live, and, with `id`, only if it is that allocation:
    /// through the thread caches when they handed it out or may hold it, else in
    /// the books.
    fn free_inner(&self, ptr: DevicePtr, id: Option<u64>) -> Result<()> {
        let _order = self.record_order();
        // Tag 0's memory through the caches: they check its gate under their mutex.
        let gate = &self.gate;
        if let Some(freed) = self
            .caches
            .free(ptr, id, &self.state, self.rec.as_deref(), gate)
        {
            return self.after_cache_free(freed?);
        }
        let mut st = lock(&self.state);
        // The pointer's tag is entered in the hold that frees it (`tag_gate.rs`).
        let entry = self.enter_live(&mut st, ptr)?;
        let r = self.free_books(st, ptr, id);
        self.leave(entry);
        r
    }

    /// The synchronous free of `ptr` in the books (held as `st`; its tag entered).
    fn free_books(
        &self,
        mut st: MutexGuard<'_, State>,
        ptr: DevicePtr,
        id: Option<u64>,
    ) -> Result<()> {
        // Streams from `record_stream` do not matter here: the release synchronizes
        // every device.
        let (slot, _recorded) = st.free_live(ptr, id)?;
        if let Some(rec) = &self.rec {
            rec.free(ptr, None);
        }
        self.after_free(st, slot)
    }

    fn after_cache_free(&self, freed: cache::Freed<'_>) -> Result<()> {
        match freed {
            cache::Freed::Done => Ok(()),
            cache::Freed::Books(st, slot) => self.after_free(st, slot),
        }
    }

    /// The rest of a synchronous free in the books: idle `slot` (not yet indexed)
    /// is indexed, kept or released by the threshold.
    fn after_free(&self, st: MutexGuard<'_, State>, slot: u32) -> Result<()> {
        let mut batch = Batch::default();
        {
            // Dropped at the end of this block, before the release's driver calls.
            let mut st = st;
            let (block, seg) = {
                let m = st.mref(slot);
                (m.is_block(), m.seg)
            };
            if block {
                // Back to its heap (the synchronous heap's own), or kept whole for the
                // synchronous API (a stream heap's block); then, over the threshold,
                // its heap's handles left wholly free are released.
                st.index_insert(slot, SYNC_FREED);
                if st.counters.scope_open || st.cached_bytes() <= self.release_threshold {
                    return Ok(());
                }
                if st.mref(slot).state == MappingState::Idle {
                    // A stream heap's block, kept whole for the synchronous API (work
                    // queued before this free may still touch it): back to its heap
                    // after this release's synchronize, then its heap's free handles
                    // are released as below.
                    st.mark_releasing(slot, &mut batch);
                    st.start_release(&mut batch);
                    drop(st);
                    let _ = self.release_batch(std::mem::take(&mut batch));
                    st = lock(&self.state);
                    if st.counters.scope_open || st.cached_bytes() <= self.release_threshold {
                        return Ok(());
                    }
                }
                st.collect_heap_of(seg, &mut batch, true, Some(self.release_threshold));
                st.collect_retries(&mut batch, true);
                st.start_release(&mut batch);
                drop(st);
                let _ = self.release_batch(batch);
                return Ok(());
            }
            if st.counters.scope_open || st.cached_bytes() <= self.release_threshold {
                st.index_insert(slot, SYNC_FREED);
                return Ok(());
            }
            let m = st.mapping_mut(slot);
            m.state = MappingState::Releasing;
            batch.mappings.push((slot, *m));
            st.collect_retries(&mut batch, true);
            st.start_release(&mut batch);
        }
        let _ = self.release_batch(batch);
        Ok(())
    }

    /// Allocates `bytes` on `stream` (stream-ordered, like `cuMemAllocAsync`);
    /// returns a guard that frees it on the same stream ([`Pool::free_async_raw`])
    /// when dropped. See [`Pool::allocate_async_raw`] for the rules and errors.
    pub fn allocate_async(&self, bytes: u64, stream: Stream) -> Result<Allocation<'_>> {
        let ptr = self.allocate_async_raw(bytes, stream)?;
        Ok(self.guard(ptr, bytes, Some(stream)))
    }

    /// The guard of live `ptr` (`bytes` asked), freeing on `stream` if any.
    fn guard(&self, ptr: DevicePtr, bytes: u64, stream: Option<Stream>) -> Allocation<'_> {
        Allocation {
            pool: self,
            ptr,
            bytes,
            id: self.alloc_id_of(ptr),
            stream,
        }
    }

    /// A stream call on `ptr` finds it in the books: when a thread cache handed it
    /// out, the caches are settled first (rare: memory from the synchronous
    /// `allocate` freed or recorded on a stream).
    fn settle_if_cached(&self, ptr: DevicePtr) {
        if self.caches.key_of(ptr).is_some() {
            self.caches.settle(&self.state);
        }
    }

    /// The allocation id of live `ptr` (0 if not live).
    fn alloc_id_of(&self, ptr: DevicePtr) -> u64 {
        if let Some(key) = self.caches.key_of(ptr) {
            return key;
        }
        let st = lock(&self.state);
        st.live
            .get(&ptr)
            .map_or(0, |&slot| st.mapping(slot).alloc_id)
    }

    /// Opens the pool's retention scope: until it closes, freed mappings are retained
    /// idle (reusable by later allocations) and nothing is released, so no unmap can
    /// race work that is queued or captured. Open it around warmup and graph capture.
    ///
    /// The scope is a barrier: when this returns, no release step that began before
    /// it (a free outside a scope, `finish`, `trim`, the out-of-memory release) is
    /// still running (this call waits for them; their synchronize would break a
    /// capture begun after it, `docs/vmm-semantics.md`), and none starts while the
    /// scope is open.
    ///
    /// Memory freed during a capture belongs to the scope open when the pool first
    /// sees that capture, unless the capture was already open, when the scope began,
    /// on a stream holding memory in the pool (then it belongs to no scope: trim or
    /// destroy releases it).
    ///
    /// Errors: [`Error::ScopeState`] when a scope is already open (scopes do not nest).
    pub fn retention_begin(&self) -> Result<()> {
        self.begin_scope().map(|_| ())
    }

    /// Opens the scope; returns its epoch.
    fn begin_scope(&self) -> Result<u64> {
        let _order = self.record_order();
        let mut st = lock(&self.state);
        if st.counters.scope_open {
            return Err(Error::ScopeState("a retention scope is already open"));
        }
        st.counters.scope_open = true;
        if let Some(rec) = &self.rec {
            rec.line("begin");
        }
        st.scope_epoch += 1;
        let epoch = st.scope_epoch;
        self.caches.set_open(true);
        // Barrier: no release starts from now on (every release point checks
        // `scope_open` under the lock); wait for those already running.
        while st.releases_running > 0 {
            st = wait(&self.releases_done, st);
        }
        // Captures already open belong to no scope of ours.
        st.pre_scope_captures = self.open_captures(&st);
        Ok(epoch)
    }

    /// Opens a retention scope and returns a guard: [`RetentionScope::finish`]
    /// finishes it; dropping the guard without finishing aborts it.
    ///
    /// Errors: as [`Pool::retention_begin`].
    pub fn retention_scope(&self) -> Result<RetentionScope<'_>> {
        let epoch = self.begin_scope()?;
        Ok(RetentionScope {
            pool: self,
            epoch,
            open: true,
        })
    }

    /// Closes the scope and releases every idle mapping (one synchronize, then
    /// unmap, release, free each). Live allocations stay live.
    ///
    /// Errors: [`Error::ScopeState`] with no scope open; [`Error::Driver`] with the
    /// first release step the driver refused (the scope is closed all the same, and
    /// what was refused is kept and retried at the next release point).
    pub fn retention_finish(&self) -> Result<()> {
        self.close_scope(false, None)
    }

    /// Closes the scope as failed: the same release as [`Pool::retention_finish`],
    /// counted in `scopes_aborted`.
    ///
    /// Errors: as [`Pool::retention_finish`].
    pub fn retention_abort(&self) -> Result<()> {
        self.close_scope(true, None)
    }

    /// Closes the open scope; with `epoch`, only if it is that scope.
    fn close_scope(&self, aborted: bool, epoch: Option<u64>) -> Result<()> {
        let _order = self.record_order();
        let epoch = {
            let mut st = lock(&self.state);
            if !st.counters.scope_open {
                return Err(Error::ScopeState("no retention scope is open"));
            }
            if epoch.is_some_and(|e| e != st.scope_epoch) {
                return Err(Error::ScopeState(
                    "this guard's retention scope was already closed; another one is open",
                ));
            }
            st.counters.scope_open = false;
            if let Some(rec) = &self.rec {
                rec.line(if aborted { "abort" } else { "finish" });
            }
            // The caches close here; the release below settles them first.
            self.caches.set_open(self.release_threshold == u64::MAX);
            if aborted {
                st.counters.scopes_aborted += 1;
            } else {
                st.counters.scopes_finished += 1;
            }
            st.pre_scope_captures.clear();
            // Registered before the lock is let go: a scope begun next waits for
            // this release (the barrier).
            st.releases_running += 1;
            st.scope_epoch
        };
        self.release_now(Captures::OfScope(epoch), true, false, true)
    }

    /// Releases every idle (cached) mapping now, and retries pending releases; frees
    /// the pinned host buffer an offload's wake kept for the next offload sleep
    /// ([`Pool::sleep`]). Memory freed on streams is released once its fences complete
    /// (`cuEventSynchronize`, no device synchronize). Memory freed with the
    /// synchronous `free`, held for a capture, or whose stream order is unknown needs
    /// a device synchronize first; it is kept instead while one of the pool's streams
    /// (used since the last trim or finish, or holding memory in the pool) is being
    /// captured. A capture open on a stream the
    /// pool has never seen cannot be known: do not trim while one is open.
    ///
    /// Errors: [`Error::ScopeState`] inside a retention scope (nothing retained is
    /// released there); [`Error::Driver`] with the first step the driver refused.
    pub fn trim(&self) -> Result<()> {
        let _order = self.record_order();
        let r = self.release_idle(true);
        if !matches!(r, Err(Error::ScopeState(_))) {
            // The pinned host buffer a wake kept for the next offload: host memory
            // cached as idle device memory is.
            let spare = lock(&self.state).take_spare_host(|_| true);
            if let Some(h) = spare {
                if let Err(source) = self.driver.host_free(h) {
                    let bytes = h.size;
                    return r.and(Err(Error::Driver { source, bytes }));
                }
            }
        }
        if let Some(rec) = &self.rec {
            // A trim refused inside a scope did nothing; one whose release the
            // driver refused in part released the rest.
            if !matches!(r, Err(Error::ScopeState(_))) {
                rec.line("trim");
            }
        }
        r
    }

    /// The first error of this pool's recording ([`PoolConfig::record_path`]): the
    /// file could not be created, or a write failed (a full disk). `None` while
    /// recording works, and for a pool that does not record. After an error the
    /// recording has stopped: the file holds what was written before it.
    pub fn record_error(&self) -> Option<String> {
        self.rec.as_ref().and_then(|r| r.error())
    }

    /// Writes what this pool recorded so far to its file and waits for the write
    /// (the pool's drop does it too). Does nothing for a pool that does not record.
    /// A write error is kept as [`Pool::record_error`] says.
    pub fn record_flush(&self) {
        if let Some(rec) = &self.rec {
            rec.flush();
        }
    }

    /// Writes `line` into this pool's recording as a comment (`# ` and the line; a
    /// line break in it is written as a space). Does nothing for a pool that does
    /// not record.
    pub fn record_comment(&self, line: &str) {
        if let Some(rec) = &self.rec {
            rec.line(&format!("# {}", line.replace(['\n', '\r'], " ")));
        }
    }

    /// A consistent copy of the counters, taken under the lock.
    pub fn snapshot(&self) -> Snapshot {
        if self.caches.enabled {
            return self.caches.snapshot(&self.state);
        }
        lock(&self.state).counters
    }

    /// Releases everything the pool holds, live allocations included, after one
    /// synchronize, and retries every refused step once.
    ///
    /// Errors: [`Error::Driver`] with the first step the driver still refused after
    /// the retry; that memory is left to the driver (a reservation is never freed
    /// while a mapping in it is live).
    pub fn destroy(mut self) -> Result<()> {
        let result = self.release_everything();
        self.drop_stream_resources();
        // What the driver still refuses is left to it, as reported: forget it in the
        // books so that `Drop` (which runs next) does not release it a third and
        // fourth time behind the error just returned (found by
        // failure_classes::drop_retries_once_and_leaves_refused_memory_in_order).
        *lock(&self.state) = State::new(self.granularity);
        result
    }
}

/// The largest mapping size best-fit takes for a request of `rounded` bytes with a
/// waste bound of `percent` (of `rounded`): saturates at `u64::MAX`, so a larger
/// percent never gives a smaller bound.
fn max_fit(rounded: u64, percent: u64) -> u64 {
    // floor(rounded * percent / 100) in u64: with rounded = 100 q + r it is
    // q * percent + floor(r * percent / 100), saturating. (A u128 division here
    // made valgrind report a conditional jump on uninitialised bits inside
    // compiler-builtins' `__udivti3`, a false positive that failed the C tests
    // under valgrind.) `percent` comes from a u32, so `r * percent` cannot overflow.
    let (q, r) = (rounded / 100, rounded % 100);
    let waste = q
        .checked_mul(percent)
        .and_then(|w| w.checked_add(r.saturating_mul(percent) / 100))
        .unwrap_or(u64::MAX);
    rounded.saturating_add(waste)
}

/// What [`Pool::new`] and [`Pool::with_driver`] refuse before touching anything: a
/// negative device or peer ordinal, and an empty recording path (issue 34: a
/// mistake seen at creation, unlike a file that cannot be created, which only stops
/// the recording; see [`PoolConfig::record_path`]).
fn validate_config(config: &PoolConfig) -> Result<()> {
    if config
        .record_path
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        return Err(Error::InvalidArgument(
            "record_path is empty: give a file to record to, or none to record nothing".into(),
        ));
    }
    if config.device < 0 {
        return Err(Error::InvalidArgument(format!(
            "device ordinal {} is negative",
            config.device
        )));
    }
    if let Some(p) = config.peer_devices.iter().find(|&&p| p < 0) {
        return Err(Error::InvalidArgument(format!(
            "peer device ordinal {p} is negative"
        )));
    }
    Ok(())
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = self.release_everything();
        self.drop_stream_resources();
        self.caches.retire();
        if let Some(rec) = &self.rec {
            rec.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::max_fit;

    /// The bound grows with the percent and never wraps: a larger percent never gives
    /// a smaller bound (issue 9: a waste percent near `u32::MAX` wrapped the
    /// product), and it is never below the request.
    #[test]
    fn best_fit_bound_saturates() {
        let percents = [
            0u64,
            1,
            30,
            100,
            1000,
            1 << 20,
            u64::from(u32::MAX) / 2,
            u64::from(u32::MAX),
        ];
        for rounded in [
            2u64 << 20,
            1 << 40,
            1 << 57,
            1 << 62,
            u64::MAX - (2 << 20) + 1,
        ] {
            let mut last = rounded;
            for p in percents {
                let b = max_fit(rounded, p);
                assert!(
                    b >= last,
                    "rounded {rounded}: percent {p} gives {b} < {last}"
                );
                last = b;
            }
            assert_eq!(max_fit(rounded, 0), rounded);
            // 100 % of 2^62 is 2^63; u32::MAX % of it exceeds u64::MAX.
            if rounded == 1 << 62 {
                assert_eq!(max_fit(rounded, 100), 1 << 63);
                assert_eq!(max_fit(rounded, u64::from(u32::MAX)), u64::MAX);
            }
        }
        assert_eq!(max_fit(2 << 20, 30), (2 << 20) + (2 << 20) * 30 / 100);
        // Exactly floor(rounded * (100 + percent) / 100), saturating, as computed
        // in 128 bits, including sizes that are not multiples of 100.
        for rounded in [
            1u64,
            99,
            512,
            1000,
            2 << 20,
            (2 << 20) + 512,
            1 << 62,
            u64::MAX,
        ] {
            for p in [0u64, 1, 30, 99, 100, 101, 12345, u64::from(u32::MAX)] {
                let exact = u128::from(rounded) * u128::from(100 + p) / 100;
                let want = u64::try_from(exact).unwrap_or(u64::MAX);
                assert_eq!(max_fit(rounded, p), want, "rounded {rounded}, percent {p}");
            }
        }
    }
}
