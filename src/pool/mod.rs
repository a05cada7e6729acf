//! The pool: whole mappings handed out, retained, reused and released.
//!
//! - [`Pool`]: allocate, free, retention scope, trim, snapshot; `Send + Sync`.
//! - [`Allocation`], [`RetentionScope`]: guards that free / abort on drop.
//! - [`ReusePolicy`], [`PoolConfig`], [`Backend`]: configuration.
//! - [`Snapshot`]: the counters, copied atomically.
//! - [`HistoryEvent`], [`LayoutSegment`]: the history ring and the mapped memory as
//!   memory_viz draws it (issue 38; `history/`).
//! - [`Pool::mark_step`], [`Pool::growth_report`]: which live allocations keep
//!   growing (`steps.rs` stamps every allocation, `growth_report.rs` reads them;
//!   the analysis is `crate::growth`).
//!
//! Every mapping is in exactly one state: live, idle (retained or cached; a mapping
//! being released by another thread is still idle in the books, but out of the reuse
//! index) or pending (a release step failed; kept and retried). The books sit under
//! one lock, which is never held across a driver call that creates or releases
//! memory.
#![forbid(unsafe_code)]

mod allocate;
mod books;
mod cache;
mod config;
mod create;
mod fit;
mod free;
mod growth_report;
mod guards;
mod history;
mod index;
mod miss;
mod record;
mod release;
mod retention;
mod segments;
mod snapshot;
mod steps;
mod streams;
mod table;
mod tags;
mod too_large;
mod undo;

pub(crate) use config::cross_stream_modes;
pub(crate) use config::reuse_policies;
pub use config::{
    Backend, CrossStreamReuse, PoolConfig, ReusePolicy, DEFAULT_BEST_FIT_MAX_WASTE_PERCENT,
    DEFAULT_SEGMENT_WHOLE_THRESHOLD_BYTES, DEFAULT_THREAD_CACHE_BYTES,
    DEFAULT_THREAD_CACHE_ENTRIES, SEGMENT_BLOCK_ROUND_BYTES, SEGMENT_SMALL_MAX_BYTES,
};
pub use guards::{Allocation, RetentionScope};
pub use history::{
    history_frame, set_history_frame, BlockState, HistoryAction, HistoryEvent, LayoutBlock,
    LayoutSegment,
};
pub(crate) use snapshot::snapshot_counters;
pub use snapshot::Snapshot;
pub(crate) use steps::StepClock;
pub(crate) use streams::check_forgettable;
pub use tags::{SleepMode, TagCensus};

use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::sync::{lock, Condvar, Mutex};
use allocate::max_fit;
use books::State;
use miss::OnOom;
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
    /// The thread caches in front of the books (`cache/`).
    caches: cache::Caches,
    /// Signalled when `State::releases_running` falls to 0 (the scope barrier).
    releases_done: Condvar,
    /// The tag gate (`tag_gate.rs`): calls on a tag's memory against its sleep and
    /// wake.
    gate: tag_gate::TagGate,
    /// The recording ([`PoolConfig::record_path`]; `record.rs`), `None` when off.
    rec: Option<Arc<record::Recorder>>,
    /// The history ring ([`PoolConfig::history_events`]; `history/`), `None` when
    /// off (also held by the books, whose steps write to it).
    history: Option<Arc<history::History>>,
    /// A pool that only captures allocate from (a PyTorch graph pool,
    /// [`Pool::dedicate_to_captures`]): memory freed during a capture on its own
    /// stream goes back to that stream's heap or bucket at once (coalescing), as a
    /// free outside a capture does, instead of waiting whole in the capture's bucket.
    captures_only: std::sync::atomic::AtomicBool,
    /// The clock every allocation is stamped from (`steps.rs`): sequence numbers,
    /// step markers, scope begins; the growth report's steps.
    clock: Arc<steps::StepClock>,
}

impl Pool {
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
        let clock = Arc::new(steps::StepClock::new());
        let history = (config.history_events > 0)
            .then(|| Arc::new(history::History::new(config.history_events)));
        let mut state = State::new(granularity, Arc::clone(&clock));
        state.history = history.clone();
        Ok(Pool {
            rec,
            history,
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
            state: Mutex::new(state),
            releases_done: Condvar::new(),
            gate: tag_gate::TagGate::new(),
            captures_only: std::sync::atomic::AtomicBool::new(false),
            clock,
        })
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

    /// The device ordinal whose memory the pool allocates ([`PoolConfig::device`]).
    pub fn device(&self) -> i32 {
        self.access_devices.first().copied().unwrap_or(0)
    }

    /// The reuse policy.
    pub fn policy(&self) -> ReusePolicy {
        self.policy
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
        *lock(&self.state) = State::new(self.granularity, Arc::clone(&self.clock));
        result
    }
}

/// What [`Pool::new`] and [`Pool::with_driver`] refuse before touching anything: a
/// negative device or peer ordinal, and an empty recording path (issue 34: a
/// mistake seen at creation, unlike a file that cannot be created, which only stops
/// the recording; see [`PoolConfig::record_path`]).
pub(crate) fn validate_config(config: &PoolConfig) -> Result<()> {
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
