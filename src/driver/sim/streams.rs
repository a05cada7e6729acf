//! The simulated driver's model of streams, queued work, events and stream captures,
//! behind the driver's one lock (a field of [`Inner`]).
//!
//! Ordering is a vector clock. Each stream counts its launches (`seq`); its `clock`
//! maps every stream whose work its next operation is ordered after to the last
//! launch of that stream it covers (its own entry is its own `seq`). A launch, an
//! event record or a `cuStreamWaitEvent` on a stream first takes in the implicit
//! legacy-stream ordering (an operation on the legacy stream of a device waits for
//! every blocking stream of that device, and an operation on a blocking stream waits
//! for the legacy stream), and a wait merges in the event's clock. Clocks are
//! transitively closed, so "the work up to a point" is always one clock, and
//! completing it is raising each named stream's `completed` watermark: completing a
//! stream's work completes what it waited on, as on the device.

use std::collections::BTreeMap;

#[cfg(flare_loom)]
use loom::thread::{current as current_thread, ThreadId};

/// A thread's identity for the simulated driver: a number per OS thread, from a
/// thread-local (no heap allocation: `std::thread::current()` allocates the
/// thread's handle on first use, which valgrind reports as possibly lost on a C
/// program's main thread).
#[cfg(not(flare_loom))]
pub(super) type ThreadId = u64;

#[cfg(not(flare_loom))]
fn current_thread_id() -> ThreadId {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    ID.with(|id| *id)
}

use super::model::{overlaps, Inner};
use super::{
    CaptureMode, CaptureStatus, SimFault, SimStreamCall, SimWork,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, SIM_LEGACY_STREAM,
};
use crate::driver::{CuResult, DevicePtr};

/// The calling thread's id (loom's under `--cfg flare_loom`, whose threads all run on
/// one OS thread).
pub(super) fn caller() -> ThreadId {
    #[cfg(flare_loom)]
    return current_thread().id();
    #[cfg(not(flare_loom))]
    current_thread_id()
}

/// Internal keys of legacy streams: `LEGACY_KEY + device`. Created streams' keys and
/// handles (from [`FIRST_STREAM`] up, one at a time) never get near it.
pub(super) const LEGACY_KEY: u64 = 1 << 63;

/// CUDA's `CU_STREAM_LEGACY` (a `CUstream` of 1): the legacy stream, like 0.
const CU_STREAM_LEGACY: u64 = 1;

/// First handle of a created stream (1 and 2 are CUDA's `CU_STREAM_LEGACY` and
/// `CU_STREAM_PER_THREAD`; stream handles and event handles never coincide).
pub(super) const FIRST_STREAM: u64 = 1 << 32;

/// First handle of a created event.
pub(super) const FIRST_EVENT: u64 = 2 << 32;

/// For every stream, the last launch covered.
pub(super) type Clock = BTreeMap<u64, u64>;

/// Raises every entry of `into` to at least `from`'s.
pub(super) fn merge(into: &mut Clock, from: &Clock) {
    for (&k, &n) in from {
        let e = into.entry(k).or_insert(0);
        if *e < n {
            *e = n;
        }
    }
}

/// One launch not yet completed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Work {
    /// Its number on its stream (from 1).
    pub(super) seq: u64,
    pub(super) ptr: DevicePtr,
    pub(super) bytes: u64,
}

/// A stream (created, or the legacy stream of a device), under its internal key: a
/// created stream's key is never reused, while its handle may be (a destroyed
/// stream's handle goes to the next created stream), so a destroyed stream whose
/// work still runs and the new stream with its old handle are two records.
#[derive(Clone, Debug)]
pub(super) struct StreamRec {
    /// The handle callers know it by ([`SIM_LEGACY_STREAM`] for a legacy stream).
    pub(super) handle: u64,
    pub(super) device: i32,
    /// Synchronizes with the legacy stream (`CU_STREAM_DEFAULT`); false for a
    /// non-blocking stream and for the legacy stream itself.
    pub(super) blocking: bool,
    pub(super) legacy: bool,
    /// Destroyed: its handle is refused, its queued work still runs.
    pub(super) destroyed: bool,
    /// Launches so far.
    pub(super) seq: u64,
    /// Launches completed (a watermark: launches complete in order).
    pub(super) completed: u64,
    /// What its next operation is ordered after (see the module documentation).
    pub(super) clock: Clock,
    /// Launches not completed, oldest first.
    pub(super) pending: Vec<Work>,
    /// The open capture it belongs to (began it or joined it).
    pub(super) capture: Option<u64>,
}

/// What an event was last recorded on.
#[derive(Clone, Debug)]
pub(super) enum Recorded {
    /// Never recorded: a query or synchronize returns `CUDA_SUCCESS` at once.
    Never,
    /// Recorded outside any capture: the work up to that point.
    Work {
        /// The clock of the stream when recorded.
        frontier: Clock,
        /// Recorded on a legacy stream.
        legacy: bool,
    },
    /// Recorded on a stream being captured (a graph node, not work).
    Captured {
        /// The capture's id.
        capture: u64,
    },
}

/// An event.
#[derive(Clone, Debug)]
pub(super) struct EventRec {
    pub(super) recorded: Recorded,
}

/// An open stream capture.
#[derive(Clone, Debug)]
pub(super) struct CaptureRec {
    /// The stream that began it.
    pub(super) origin: u64,
    /// The thread that began it.
    pub(super) thread: ThreadId,
    pub(super) mode: CaptureMode,
    pub(super) invalidated: bool,
    /// Launches recorded into it.
    pub(super) launches: u64,
    /// Streams in it: the origin and those that joined it.
    pub(super) members: Vec<u64>,
}

/// A thread's settings that differ from the defaults (global mode, device 0).
#[derive(Clone, Copy, Debug)]
pub(super) struct ThreadRec {
    pub(super) id: ThreadId,
    pub(super) mode: CaptureMode,
    pub(super) device: i32,
}

/// Everything of streams, events and captures.
#[derive(Debug)]
pub(super) struct Streams {
    /// The next stream handle never handed out.
    pub(super) next_stream: u64,
    /// The next internal key of a created stream (never reused).
    next_key: u64,
    /// Live created streams: handle to internal key.
    handles: BTreeMap<u64, u64>,
    /// Handles of destroyed streams, handed out again by the next creates (the most
    /// recently destroyed first), as the CUDA driver may: a `CUstream` is the address
    /// of the driver's record, which a new stream may get once the old one is freed.
    free_handles: Vec<u64>,
    pub(super) next_event: u64,
    pub(super) next_capture: u64,
    pub(super) streams: BTreeMap<u64, StreamRec>,
    pub(super) events: BTreeMap<u64, EventRec>,
    pub(super) captures: BTreeMap<u64, CaptureRec>,
    /// Threads with a non-default mode or current device (few; ThreadId has no
    /// order, so a list).
    pub(super) threads: Vec<ThreadRec>,
    pub(super) calls: [u64; SimStreamCall::ALL.len()],
    /// Pending injections: (call, absolute call number that fails, code).
    pub(super) injections: Vec<(SimStreamCall, u64, CuResult)>,
}

impl Streams {
    pub(super) fn new() -> Streams {
        Streams {
            next_stream: FIRST_STREAM,
            next_key: FIRST_STREAM,
            handles: BTreeMap::new(),
            free_handles: Vec::new(),
            next_event: FIRST_EVENT,
            next_capture: 1,
            streams: BTreeMap::new(),
            events: BTreeMap::new(),
            captures: BTreeMap::new(),
            threads: Vec::new(),
            calls: [0; SimStreamCall::ALL.len()],
            injections: Vec::new(),
        }
    }

    /// Counts one call of `call` and returns the injected failure, if this call is
    /// the one an injection targets.
    pub(super) fn begin(&mut self, call: SimStreamCall) -> Option<CuResult> {
        let n = match self.calls.get_mut(call as usize) {
            Some(c) => {
                *c += 1;
                *c
            }
            None => return None,
        };
        let pos = self
            .injections
            .iter()
            .position(|&(c, at, _)| c == call && at == n)?;
        let (_, _, code) = self.injections.remove(pos);
        Some(code)
    }

    fn thread(&self, id: ThreadId) -> ThreadRec {
        self.threads
            .iter()
            .find(|t| t.id == id)
            .copied()
            .unwrap_or(ThreadRec {
                id,
                mode: CaptureMode::Global,
                device: 0,
            })
    }

    /// Sets a thread's settings, keeping only threads that differ from the defaults.
    fn set_thread(&mut self, rec: ThreadRec) {
        self.threads.retain(|t| t.id != rec.id);
        if rec.mode != CaptureMode::Global || rec.device != 0 {
            self.threads.push(rec);
        }
    }

    /// The capture mode of thread `id`.
    pub(super) fn mode_of(&self, id: ThreadId) -> CaptureMode {
        self.thread(id).mode
    }

    /// Sets thread `id`'s mode; returns the previous one.
    pub(super) fn exchange_mode(&mut self, id: ThreadId, mode: CaptureMode) -> CaptureMode {
        let mut t = self.thread(id);
        let previous = t.mode;
        t.mode = mode;
        self.set_thread(t);
        previous
    }

    /// The current device of thread `id`.
    pub(super) fn device_of(&self, id: ThreadId) -> i32 {
        self.thread(id).device
    }

    /// Sets thread `id`'s current device.
    pub(super) fn set_device(&mut self, id: ThreadId, device: i32) {
        let mut t = self.thread(id);
        t.device = device;
        self.set_thread(t);
    }

    /// The handle callers know stream `key` by: its own, or 0 for a legacy stream.
    pub(super) fn handle_of(&self, key: u64) -> u64 {
        match self.streams.get(&key) {
            Some(s) => s.handle,
            None if key >= LEGACY_KEY => SIM_LEGACY_STREAM,
            None => key,
        }
    }

    /// Creates a stream on `device`; returns its handle: the most recently destroyed
    /// stream's handle if one is free, else a new one. The new stream gets a key of
    /// its own: it shares no order with the destroyed stream's work.
    pub(super) fn create_stream(&mut self, device: i32, blocking: bool) -> u64 {
        let handle = match self.free_handles.pop() {
            Some(h) => h,
            None => {
                let h = self.next_stream;
                self.next_stream += 1;
                h
            }
        };
        let key = self.next_key;
        self.next_key += 1;
        let mut rec = StreamRec::new(device, blocking, false);
        rec.handle = handle;
        self.streams.insert(key, rec);
        self.handles.insert(handle, key);
        handle
    }

    /// Destroys live created stream `key`: its handle is refused from now on and free
    /// for the next create; its record stays while its work runs.
    pub(super) fn destroy_stream(&mut self, key: u64) {
        if let Some(s) = self.streams.get_mut(&key) {
            s.destroyed = true;
            let handle = s.handle;
            if self.handles.remove(&handle).is_some() {
                self.free_handles.push(handle);
            }
        }
        self.forget_finished();
    }

    /// The internal keys of the destroyed streams that had handle `handle` (their
    /// work may still be queued).
    pub(super) fn destroyed_with_handle(&self, handle: u64) -> Vec<u64> {
        self.streams
            .iter()
            .filter(|(_, s)| s.destroyed && s.handle == handle)
            .map(|(&k, _)| k)
            .collect()
    }

    /// The internal key of the stream a caller names: 0 and 1 are the legacy stream of
    /// the calling thread's current device (created on first use), any other a live
    /// created stream. `None` for anything else.
    pub(super) fn resolve(&mut self, handle: u64) -> Option<u64> {
        if handle == SIM_LEGACY_STREAM || handle == CU_STREAM_LEGACY {
            let device = self.device_of(caller());
            let key = LEGACY_KEY + u64::from(device.unsigned_abs());
            self.streams
                .entry(key)
                .or_insert_with(|| StreamRec::new(device, false, true));
            return Some(key);
        }
        self.handles.get(&handle).copied()
    }

    /// The clock stream `key`'s next operation gets: its own, plus the implicit
    /// legacy-stream ordering of its device.
    pub(super) fn next_frontier(&self, key: u64) -> Clock {
        let Some(s) = self.streams.get(&key) else {
            return Clock::new();
        };
        let mut f = s.clock.clone();
        if s.legacy {
            for o in self.streams.values() {
                if o.blocking && o.device == s.device {
                    merge(&mut f, &o.clock);
                }
            }
        } else if s.blocking {
            let legacy = LEGACY_KEY + u64::from(s.device.unsigned_abs());
            if let Some(l) = self.streams.get(&legacy) {
                merge(&mut f, &l.clock);
            }
        }
        f
    }

    /// Takes the implicit legacy ordering into stream `key`'s clock (it is about to
    /// queue an operation) and returns the clock.
    pub(super) fn commit_frontier(&mut self, key: u64) -> Clock {
        let f = self.next_frontier(key);
        if let Some(s) = self.streams.get_mut(&key) {
            s.clock = f.clone();
        }
        f
    }

    /// Queues a launch on stream `key` touching `[ptr, ptr + bytes)`.
    pub(super) fn queue(&mut self, key: u64, ptr: DevicePtr, bytes: u64) {
        let mut f = self.next_frontier(key);
        if let Some(s) = self.streams.get_mut(&key) {
            s.seq += 1;
            f.insert(key, s.seq);
            s.clock = f;
            s.pending.push(Work {
                seq: s.seq,
                ptr,
                bytes,
            });
        }
    }

    /// Whether every launch `f` covers has completed.
    pub(super) fn is_complete(&self, f: &Clock) -> bool {
        f.iter()
            .all(|(k, &n)| self.streams.get(k).is_none_or(|s| s.completed >= n))
    }

    /// Completes every launch `f` covers (the device finished that work, so also all
    /// it was ordered after: `f` is closed). Destroyed streams left with nothing
    /// queued are forgotten.
    pub(super) fn complete(&mut self, f: &Clock) {
        for (k, &n) in f {
            if let Some(s) = self.streams.get_mut(k) {
                if s.completed < n {
                    s.completed = n;
                    s.pending.retain(|w| w.seq > n);
                }
            }
        }
        self.forget_finished();
    }

    /// Forgets destroyed streams that are in no capture and whose work, and all it
    /// waits on, has completed: nothing can name them or be ordered by them any more.
    pub(super) fn forget_finished(&mut self) {
        let done: Vec<u64> = self
            .streams
            .iter()
            .filter(|(_, s)| s.destroyed && s.capture.is_none() && self.is_complete(&s.clock))
            .map(|(&k, _)| k)
            .collect();
        for k in done {
            self.streams.remove(&k);
        }
    }

    /// Completes all the work of every stream of `device` (`cuCtxSynchronize`).
    pub(super) fn complete_device(&mut self, device: i32) {
        let clocks: Vec<Clock> = self
            .streams
            .values()
            .filter(|s| s.device == device)
            .map(|s| s.clock.clone())
            .collect();
        for c in &clocks {
            self.complete(c);
        }
    }

    /// The first queued launch (in stream-key order) overlapping
    /// `[ptr, ptr + size)`: its stream's handle.
    pub(super) fn queued_over(&self, ptr: DevicePtr, size: u64) -> Option<u64> {
        self.streams.values().find_map(|s| {
            s.pending
                .iter()
                .any(|w| overlaps(w.ptr, w.bytes, ptr, size))
                .then_some(s.handle)
        })
    }

    /// The first stream other than `key` whose queued work overlapping
    /// `[ptr, ptr + size)` is not ordered before `key`'s next operation.
    pub(super) fn unordered_over(&self, key: u64, ptr: DevicePtr, size: u64) -> Option<u64> {
        let f = self.next_frontier(key);
        self.streams.iter().find_map(|(&k, s)| {
            if k == key {
                return None;
            }
            let ordered = f.get(&k).copied().unwrap_or(0);
            s.pending
                .iter()
                .any(|w| w.seq > ordered && overlaps(w.ptr, w.bytes, ptr, size))
                .then_some(s.handle)
        })
    }

    /// Every queued launch, in stream-key (creation) then launch order.
    pub(super) fn work(&self) -> Vec<SimWork> {
        self.streams
            .values()
            .flat_map(|s| {
                s.pending.iter().map(move |w| SimWork {
                    stream: s.handle,
                    device: s.device,
                    ptr: w.ptr,
                    bytes: w.bytes,
                })
            })
            .collect()
    }

    /// Open captures (not the stream-less one) that a blocking stream of `device`
    /// belongs to: an operation on that device's legacy stream would depend on them.
    pub(super) fn blocking_captures_on(&self, device: i32) -> Vec<u64> {
        self.captures
            .iter()
            .filter(|(_, c)| {
                c.members.iter().any(|m| {
                    self.streams
                        .get(m)
                        .is_some_and(|s| s.blocking && s.device == device)
                })
            })
            .map(|(&id, _)| id)
            .collect()
    }

    /// Ends capture `id`: its streams leave it.
    pub(super) fn close_capture(&mut self, id: u64) -> Option<CaptureRec> {
        let c = self.captures.remove(&id)?;
        for m in &c.members {
            if let Some(s) = self.streams.get_mut(m) {
                s.capture = None;
            }
        }
        self.forget_finished();
        Some(c)
    }

    /// The status of capture `id`, for a stream in it.
    pub(super) fn status_of(&self, id: Option<u64>) -> (CaptureStatus, u64, CaptureMode, u64) {
        match id.and_then(|id| Some((id, self.captures.get(&id)?))) {
            Some((id, c)) if c.invalidated => (CaptureStatus::Invalidated, id, c.mode, c.launches),
            Some((id, c)) => (CaptureStatus::Active, id, c.mode, c.launches),
            None => (CaptureStatus::None, 0, CaptureMode::Global, 0),
        }
    }
}

impl StreamRec {
    fn new(device: i32, blocking: bool, legacy: bool) -> StreamRec {
        StreamRec {
            handle: SIM_LEGACY_STREAM,
            device,
            blocking,
            legacy,
            destroyed: false,
            seq: 0,
            completed: 0,
            clock: Clock::new(),
            pending: Vec::new(),
            capture: None,
        }
    }
}

/// What a refused call breaks: stream captures (ids) and whether the stream-less
/// capture of [`SimDriver::begin_capture`](super::SimDriver::begin_capture).
#[derive(Debug, Default)]
pub(super) struct Breaks {
    pub(super) captures: Vec<u64>,
    pub(super) stream_less: bool,
}

impl Breaks {
    pub(super) fn is_empty(&self) -> bool {
        self.captures.is_empty() && !self.stream_less
    }
}

impl Inner {
    /// Every open capture, the stream-less one included: what `cuCtxSynchronize`, and
    /// a wait on the legacy stream, break (section "Stream capture": in any mode, on
    /// any thread, even with the caller in relaxed mode).
    pub(super) fn all_captures(&self) -> Breaks {
        Breaks {
            captures: self.streams.captures.keys().copied().collect(),
            stream_less: self.capture.is_some(),
        }
    }

    /// The captures that forbid the calling thread a potentially unsafe call (event
    /// query or synchronize, stream query or synchronize), by the rule of
    /// [`CaptureMode`]: the table of section "Events and stream queries while another
    /// stream is captured". The stream-less capture counts as another thread's
    /// global-mode capture.
    pub(super) fn forbidding(&self) -> Breaks {
        let me = caller();
        let mode = self.streams.mode_of(me);
        let own = |c: &CaptureRec| c.thread == me && c.mode != CaptureMode::Relaxed;
        let other_global = |c: &CaptureRec| c.thread != me && c.mode == CaptureMode::Global;
        let (captures, stream_less) = match mode {
            CaptureMode::Relaxed => (Vec::new(), false),
            CaptureMode::ThreadLocal => (
                self.streams
                    .captures
                    .iter()
                    .filter(|(_, c)| own(c))
                    .map(|(&id, _)| id)
                    .collect(),
                false,
            ),
            CaptureMode::Global => (
                self.streams
                    .captures
                    .iter()
                    .filter(|(_, c)| own(c) || other_global(c))
                    .map(|(&id, _)| id)
                    .collect(),
                self.capture.is_some(),
            ),
        };
        Breaks {
            captures,
            stream_less,
        }
    }

    /// Invalidates what `breaks` names and records one [`SimFault::CaptureBroken`]
    /// when that includes a stream capture. Returns `code` to hand back.
    pub(super) fn break_captures(
        &mut self,
        call: &'static str,
        breaks: &Breaks,
        code: CuResult,
    ) -> CuResult {
        for id in &breaks.captures {
            if let Some(c) = self.streams.captures.get_mut(id) {
                c.invalidated = true;
            }
        }
        if breaks.stream_less {
            if let Some(c) = self.capture.as_mut() {
                c.invalidated = true;
            }
        }
        if let Some(&capture) = breaks.captures.iter().min() {
            self.faults.push(SimFault::CaptureBroken { call, capture });
        }
        code
    }

    /// An operation queued on the legacy stream `key` while a blocking stream of its
    /// device is captured: the implicit dependency breaks that capture
    /// ([`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`]). `None` when nothing is in the way.
    pub(super) fn implicit_conflict(&mut self, key: u64, call: &'static str) -> Option<CuResult> {
        let s = self.streams.streams.get(&key)?;
        if !s.legacy {
            return None;
        }
        let captures = self.streams.blocking_captures_on(s.device);
        if captures.is_empty() {
            return None;
        }
        let breaks = Breaks {
            captures,
            stream_less: false,
        };
        Some(self.break_captures(call, &breaks, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT))
    }

    /// Whether `[ptr, ptr + size)` is mapped throughout with access granted to
    /// `device` (a size of 0: true).
    pub(super) fn accessible(&self, ptr: DevicePtr, size: u64, device: i32) -> bool {
        if device < 0 || i64::from(device) >= i64::from(self.config.device_count) {
            return false;
        }
        let Some(end) = ptr.checked_add(size) else {
            return false;
        };
        let mut cursor = ptr;
        while cursor < end {
            match self.mapping_at(cursor) {
                Some((s, m)) if m.access.contains(device) => {
                    cursor = s.saturating_add(m.size);
                }
                _ => return false,
            }
        }
        true
    }
}
