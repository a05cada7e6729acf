//! The replay of a parsed [`Trace`] on a [`Pool`]: every event in order, under one
//! implicit retention scope when the trace has no scope lines, with the pool's
//! figures (peak physical bytes, mappings, reuse hits, the line where the device
//! ran out of memory) reported in a [`ReplayReport`].

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use super::{Event, Trace};
use crate::driver::sim::SimDriver;
use crate::driver::{CuResult, DevicePtr, DriverCall, Stream};
use crate::error::Error;
use crate::pool::Pool;

/// What a replay did. Byte fields are bytes; counts count allocations or mappings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplayReport {
    /// Allocations the replay made (successful `a` events).
    pub allocations: u64,
    /// The pool's high watermark of physical bytes after the replay
    /// ([`Snapshot::peak_physical_bytes`](crate::Snapshot::peak_physical_bytes)): the
    /// replay's own peak on a fresh pool, as `flare-replay` runs it.
    pub peak_physical_bytes: u64,
    /// Physical bytes the pool holds after the replay, once the scope finished and
    /// every allocation of the replay was released (0 on a fresh pool unless a
    /// release step failed).
    pub final_physical_bytes: u64,
    /// Mappings the pool created during the replay (driver create/reserve/map).
    pub mappings_created: u64,
    /// Allocations of the replay served from an idle mapping (no driver call).
    pub reuse_hits: u64,
    /// The trace line whose allocation ran out of memory, which stopped the replay;
    /// `None` when the whole trace ran.
    pub out_of_memory_at_line: Option<usize>,
    /// Allocations still live when the replay ended (the trace's end, or the
    /// out-of-memory line); the replay freed them.
    pub live_at_end: u64,
    /// Wall time of the replay itself, seconds (parsing excluded).
    pub seconds: f64,
    /// Requests of `x` lines (refused by the recorded pool with out-of-memory) that
    /// the replay served (and gave back at once): 0 for a replay as recorded that
    /// went as the recording did.
    pub failed_requests_served: u64,
}

/// What one tag held when a replay reached the end of its trace (before the
/// replay's own release): [`replay_census`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TagReplay {
    /// The tag (0: `a` lines without one).
    pub tag: u32,
    /// The trace's `a` lines with this tag.
    pub allocations: u64,
    /// [`Pool::tag_census`] at the end of the trace: its peak live bytes cover the
    /// whole replay (for tag 0, as sampled at the end).
    pub census: crate::TagCensus,
}

/// A replay that failed for a reason other than running out of memory. Whatever the
/// replay allocated was freed and its scope closed before this is returned.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A pool operation failed on a line of the trace (a driver failure, say).
    #[error("{file}:{line}: {source}")]
    Pool {
        /// The trace's name.
        file: String,
        /// The 1-based line of the event.
        line: usize,
        /// The pool's error.
        source: Error,
    },
    /// Opening the replay's own retention scope (for a trace without scope lines)
    /// failed: a scope is already open on the pool, say.
    #[error("{file}: cannot open the replay's retention scope: {source}")]
    Begin {
        /// The trace's name.
        file: String,
        /// The pool's error.
        source: Error,
    },
    /// Releasing at the end of the replay (freeing what is still live, finishing the
    /// scope, trimming) failed: the driver refused a release step. The pool keeps
    /// that memory and retries it at its next release point.
    #[error("{file}: releasing at the end of the replay failed: {source}")]
    Release {
        /// The trace's name.
        file: String,
        /// The first error.
        source: Error,
    },
}

/// How often (in events) the progress callback is called.
const PROGRESS_EVERY: usize = 1 << 14;

/// Replays `trace` on `pool`, event by event.
///
/// A trace without `begin`/`finish`/`abort` lines runs inside one retention scope
/// (begun before the first event, finished after the last; its `trim` lines are then
/// no-ops, as the pool releases nothing inside a scope). At the end, allocations
/// still live are counted in [`ReplayReport::live_at_end`] and freed, an open scope
/// is finished, and idle cached memory is trimmed, so that
/// [`ReplayReport::final_physical_bytes`] is what the pool holds afterwards.
///
/// An allocation that runs out of memory ([`Error::OutOfMemory`], or
/// [`Error::RequestTooLarge`] for one beyond the whole device) stops the replay:
/// it is reported in [`ReplayReport::out_of_memory_at_line`], not as an error; what
/// was allocated is freed and the open scope is aborted.
///
/// `progress`, when given, is called with `(events done, events in total)` every
/// few thousand events and once at the end.
///
/// Errors: [`ReplayError`] for any other failure; whatever the replay allocated is
/// freed first (the first error is returned).
pub fn replay(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<ReplayReport, ReplayError> {
    replay_inner(pool, trace, progress, None, false)
}

/// Replays a recorded trace (`docs/trace-format.md`, "Recorded traces") as the
/// recorded pool ran it: as [`replay`], but with no implicit retention scope (a
/// recorded pool opened none; its `trim` lines trim). Give it a pool made from
/// [`RecordedConfig::pool_config`](super::RecordedConfig::pool_config): its peak
/// physical bytes are then the recorded pool's.
///
/// Errors: as [`replay`].
pub fn replay_as_recorded(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<ReplayReport, ReplayError> {
    replay_inner(pool, trace, progress, None, true)
}

/// [`replay`], with the census of every tag the trace names
/// ([`Trace::tags`]), taken when the trace's events are done (or stopped), before
/// the replay frees what is live.
///
/// Errors: as [`replay`].
pub fn replay_census(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<(ReplayReport, Vec<TagReplay>), ReplayError> {
    let mut tags = Vec::new();
    let report = replay_inner(pool, trace, progress, Some(&mut tags), false)?;
    Ok((report, tags))
}

fn replay_inner(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
    tags: Option<&mut Vec<TagReplay>>,
    as_recorded: bool,
) -> Result<ReplayReport, ReplayError> {
    let start_snapshot = pool.snapshot();
    let implicit_scope = !trace.has_scope_events() && !trace.has_sleep() && !as_recorded;
    let mut streams =
        if trace.has_streams() {
            match pool.sim_driver() {
                Some(sim) => Some(SimStreams::new(sim, trace, as_recorded)),
                None => return Err(ReplayError::Pool {
                    file: trace.name.clone(),
                    line: 0,
                    source: Error::NotSupported(
                        "a trace with stream-ordered lines replays on the simulated driver only",
                    ),
                }),
            }
        } else {
            None
        };
    let mut requested: Vec<u64> = if streams.is_some() {
        vec![0; trace.id_count()]
    } else {
        Vec::new()
    };
    let total = trace.len() as u64;
    // The pointer table is the replay's bookkeeping, not the pool's work: made before
    // the clock starts (a new user saw the first replay of a large trace timed 3x
    // slower than a second one, from this allocation).
    let mut ptrs: Vec<Option<u64>> = vec![None; trace.id_count()];
    // The tag of each id's allocation, and the tags asleep: what a tag still asleep
    // at the end holds is freed after waking it.
    let mut tag_of: Vec<u32> = if trace.has_sleep() {
        vec![0; trace.id_count()]
    } else {
        Vec::new()
    };
    let mut asleep: Vec<u32> = Vec::new();
    let started = Instant::now();
    if implicit_scope {
        pool.retention_begin()
            .map_err(|source| ReplayError::Begin {
                file: trace.name.clone(),
                source,
            })?;
    }
    let mut live: u64 = 0;
    let mut allocations: u64 = 0;
    let mut scope_open = implicit_scope;
    let mut oom_line: Option<usize> = None;
    // `x` lines whose request the replay served.
    let mut failed_served: u64 = 0;
    let mut failure: Option<(usize, Error)> = None;
    // Whether an `oom` line injected failures for the next allocation: what that
    // allocation did not take is dropped after it, never left for a later call.
    let mut injected = false;

    for (i, (&event, &line)) in trace.events.iter().zip(&trace.lines).enumerate() {
        if let Some(report) = progress {
            if i % PROGRESS_EVERY == 0 && i != 0 {
                report(i as u64, total);
            }
        }
        let result = match event {
            Event::Alloc { id, bytes }
            | Event::AllocTagged { id, bytes, .. }
            | Event::AllocAsync { id, bytes, .. } => {
                if let Some(r) = requested.get_mut(id as usize) {
                    *r = bytes;
                }
                if let Some(ss) = streams.as_mut() {
                    ss.recorded_clear(id);
                }
                if let (Some(t), Event::AllocTagged { tag, .. } | Event::AllocAsync { tag, .. }) =
                    (tag_of.get_mut(id as usize), event)
                {
                    *t = tag;
                }
                match ptrs.get_mut(id as usize) {
                    Some(slot @ None) => {
                        match allocate_settled(pool, event, bytes, streams.as_mut(), &mut injected)
                        {
                            Ok(ptr) => {
                                *slot = Some(ptr);
                                live += 1;
                                allocations += 1;
                                Ok(())
                            }
                            Err(Error::OutOfMemory { .. } | Error::RequestTooLarge { .. }) => {
                                oom_line = Some(line);
                                break;
                            }
                            Err(e) => Err(e),
                        }
                    }
                    // Unreachable for a parsed trace: the parser rejects both.
                    _ => Err(Error::InvalidArgument(format!(
                        "allocation id index {id} is live or out of range"
                    ))),
                }
            }
            Event::Free { id } => match ptrs.get_mut(id as usize).and_then(Option::take) {
                Some(ptr) => {
                    live -= 1;
                    pool.free_raw(ptr)
                }
                None => Err(Error::InvalidArgument(format!(
                    "allocation id index {id} is not live"
                ))),
            },
            Event::FreeAsync { id, stream } => {
                match (
                    ptrs.get_mut(id as usize).and_then(Option::take),
                    streams.as_mut(),
                ) {
                    (Some(ptr), Some(ss)) => {
                        live -= 1;
                        let bytes = requested.get(id as usize).copied().unwrap_or(0);
                        let s = ss.free_marks(id, stream, ptr, bytes);
                        pool.free_async_raw(ptr, s)
                    }
                    _ => Err(Error::InvalidArgument(format!(
                        "allocation id index {id} is not live"
                    ))),
                }
            }
            Event::RecordStream { id, stream } => {
                match (ptrs.get(id as usize).copied().flatten(), streams.as_mut()) {
                    (Some(ptr), Some(ss)) => {
                        let s = ss.stream(stream);
                        ss.recorded_push(id, stream);
                        pool.record_stream(ptr, s)
                    }
                    _ => Err(Error::InvalidArgument(format!(
                        "allocation id index {id} is not live"
                    ))),
                }
            }
            Event::Done { stream, mark } => {
                if let Some(ss) = streams.as_mut() {
                    ss.done(stream, mark);
                }
                Ok(())
            }
            Event::Forget { stream } => match streams.as_mut() {
                Some(ss) => pool.forget_stream(ss.forget(stream)),
                None => Ok(()),
            },
            Event::AllocFailed { bytes, tag, stream } => {
                // The same request; refused as recorded, it allocates nothing. Served
                // (a replay under other settings, or one that diverged), it is given
                // back at once: the engine never had it.
                let as_event = match stream {
                    Some(stream) => Event::AllocAsync {
                        id: 0,
                        bytes,
                        tag,
                        stream,
                    },
                    None if tag != 0 => Event::AllocTagged { id: 0, bytes, tag },
                    None => Event::Alloc { id: 0, bytes },
                };
                match allocate_settled(pool, as_event, bytes, streams.as_mut(), &mut injected) {
                    Ok(ptr) => {
                        failed_served += 1;
                        pool.free_raw(ptr)
                    }
                    Err(Error::OutOfMemory { .. } | Error::RequestTooLarge { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Event::Sleep { tag, offload } => pool
                .sleep(
                    tag,
                    if offload {
                        crate::SleepMode::Offload
                    } else {
                        crate::SleepMode::Discard
                    },
                )
                .map(|()| asleep.push(tag)),
            Event::Wake { tag } => pool.wake(tag).map(|()| asleep.retain(|&t| t != tag)),
            Event::Oom { count } => {
                if let Some(sim) = pool.sim_driver() {
                    for _ in 0..count {
                        sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
                    }
                    injected = true;
                }
                Ok(())
            }
            Event::Begin => pool.retention_begin().map(|()| scope_open = true),
            Event::Finish => {
                scope_open = false;
                pool.retention_finish()
            }
            Event::Abort => {
                scope_open = false;
                pool.retention_abort()
            }
            Event::Trim if implicit_scope => Ok(()),
            Event::Trim => pool.trim(),
        };
        // After a call (not after `done` and `oom`: the recorded pool wrote those
        // during the call that follows, before its own fences of that call).
        if let (Some(ss), false) = (
            streams.as_mut(),
            matches!(event, Event::Done { .. } | Event::Oom { .. }),
        ) {
            ss.keep_busy();
        }
        if let Err(e) = result {
            failure = Some((line, e));
            break;
        }
    }

    if let Some(out) = tags {
        *out = trace
            .tags()
            .into_iter()
            .map(|(tag, allocations)| TagReplay {
                tag,
                allocations,
                census: pool.tag_census(tag),
            })
            .collect();
    }
    // Release: free what is live, close the scope, trim idle cached memory.
    let live_at_end = live;
    let mut release_error: Option<Error> = None;
    let mut note = |r: crate::Result<()>| {
        if let Err(e) = r {
            release_error.get_or_insert(e);
        }
    };
    let tag = |id: usize| tag_of.get(id).copied().unwrap_or(0);
    for (id, slot) in ptrs.iter_mut().enumerate() {
        if asleep.contains(&tag(id)) {
            continue;
        }
        if let Some(ptr) = slot.take() {
            note(pool.free_raw(ptr));
        }
    }
    if scope_open {
        if oom_line.is_some() || failure.is_some() {
            note(pool.retention_abort());
        } else {
            note(pool.retention_finish());
        }
    }
    if !pool.snapshot().scope_open {
        note(pool.trim());
    }
    // A tag still asleep (a recording of a pool destroyed while it slept): its
    // allocations cannot be freed asleep (`Pool::free_raw` refuses them). With
    // everything else released, the tag is woken (it maps no more than it held when
    // it went to sleep, so the peak stays the recorded one) and they are freed.
    asleep.sort_unstable();
    for &t in &asleep {
        note(pool.wake(t));
        for (id, slot) in ptrs.iter_mut().enumerate() {
            if tag(id) == t {
                if let Some(ptr) = slot.take() {
                    note(pool.free_raw(ptr));
                }
            }
        }
        note(pool.trim());
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(report) = progress {
        report(total, total);
    }

    if let Some((line, source)) = failure {
        return Err(ReplayError::Pool {
            file: trace.name.clone(),
            line,
            source,
        });
    }
    if let Some(source) = release_error {
        return Err(ReplayError::Release {
            file: trace.name.clone(),
            source,
        });
    }
    let end = pool.snapshot();
    Ok(ReplayReport {
        allocations,
        peak_physical_bytes: end.peak_physical_bytes,
        final_physical_bytes: end.physical_bytes,
        mappings_created: end
            .mappings_created
            .saturating_sub(start_snapshot.mappings_created),
        reuse_hits: end.reuse_hits.saturating_sub(start_snapshot.reuse_hits),
        out_of_memory_at_line: oom_line,
        live_at_end,
        seconds,
        failed_requests_served: failed_served,
    })
}

/// [`allocate`]; then, when an `oom` line injected failures for this allocation
/// (`injected`), the injections it did not take are dropped: a replay that went
/// another way (its allocation served from idle memory) would otherwise fail a later
/// call with them.
fn allocate_settled(
    pool: &Pool,
    event: Event,
    bytes: u64,
    streams: Option<&mut SimStreams>,
    injected: &mut bool,
) -> crate::Result<DevicePtr> {
    let r = allocate(pool, event, bytes, streams);
    if std::mem::take(injected) {
        if let Some(sim) = pool.sim_driver() {
            sim.clear_failures();
        }
    }
    r
}

/// The pool call of an allocation event (`a` line).
fn allocate(
    pool: &Pool,
    event: Event,
    bytes: u64,
    streams: Option<&mut SimStreams>,
) -> crate::Result<DevicePtr> {
    match (event, streams) {
        (Event::AllocTagged { tag, .. }, _) => pool.allocate_tagged_raw(bytes, None, tag),
        (Event::AllocAsync { tag, stream, .. }, Some(ss)) => {
            let s = ss.stream(stream);
            if tag == 0 {
                pool.allocate_async_raw(bytes, s)
            } else {
                pool.allocate_tagged_raw(bytes, Some(s), tag)
            }
        }
        _ => pool.allocate_raw(bytes),
    }
}

/// The replay's simulated streams (a trace with stream-ordered lines): one simulated
/// stream per stream name (names whose value is 0 or 1 are the legacy stream, as
/// for the pool), and the marks of each, as the recorded pool counted them: one per
/// stream-ordered free on it, and one per free on another stream of memory recorded
/// on it (`r`). Each mark records an event on its stream and then queues a kernel over
/// the freed memory, so the pool's fences complete only when a `done` line completes
/// the work: `done S K` completes everything queued on S before mark K + 1 (the
/// event recorded before that mark's kernel; every of the pool's fences covering at
/// most K was recorded before it), or all of S's work when K is its last mark.
///
/// As recorded, a stream with marks also always has work at its tail that only a
/// `done` line completes (a kernel touching no memory, queued again after each call's
/// line once it completed; not after `done` lines, which the recorded pool wrote
/// during the next call, before that call's own fences): the recorded engine's own work between its frees (kernels
/// after each allocation, say), which the trace does not carry. Without it a fence
/// the pool records after a device synchronize would complete at once in the replay,
/// where the recorded one waited for the engine's later work (found by a recording
/// whose frees the pool had synchronized and whose stream then ran more kernels).
struct SimStreams {
    sim: Arc<SimDriver>,
    /// The stream of each name index, made on first use.
    streams: Vec<Option<Stream>>,
    /// Names, for making streams.
    names: Vec<String>,
    /// Per stream (legacy as 0): marks so far, the events recorded before marks not
    /// yet completed, the highest `done` mark not yet reached, the tail's work.
    marks: HashMap<u64, Marks>,
    /// The streams each live id was recorded on (`r` lines), by id index.
    recorded: HashMap<u32, Vec<u32>>,
    /// Name indices a `forget` line ended: no more marks or work on them.
    forgotten: std::collections::HashSet<u32>,
    /// Keep work that only `done` completes at each stream's tail (as recorded).
    background: bool,
}

struct Marks {
    stream: Stream,
    count: u64,
    /// (mark, event recorded on the stream just before the mark's kernel).
    events: VecDeque<(u64, u64)>,
    pending: u64,
    /// The event after the tail's work, while `background`.
    tail: Option<u64>,
}

impl Marks {
    fn new(stream: Stream) -> Marks {
        Marks {
            stream,
            count: 0,
            events: VecDeque::new(),
            pending: 0,
            tail: None,
        }
    }

    /// Completes all the work queued on the stream so far.
    fn complete_all(&mut self, sim: &SimDriver) {
        let _ = sim.stream_complete(self.stream.raw());
        for (_, e) in self.events.drain(..) {
            let _ = sim.event_destroy(e);
        }
    }

    /// Completes the work queued before mark `through + 1` (all of it when
    /// `through` is the last mark).
    fn complete_through(&mut self, sim: &SimDriver, through: u64) {
        if through >= self.count {
            self.complete_all(sim);
            return;
        }
        while let Some(&(mark, e)) = self.events.front() {
            if mark > through + 1 {
                break;
            }
            self.events.pop_front();
            if mark == through + 1 {
                let _ = sim.event_synchronize(e);
            }
            let _ = sim.event_destroy(e);
        }
    }
}

impl SimStreams {
    fn new(sim: Arc<SimDriver>, trace: &Trace, background: bool) -> SimStreams {
        SimStreams {
            sim,
            streams: vec![None; trace.stream_names().len()],
            names: trace.stream_names().to_vec(),
            marks: HashMap::new(),
            recorded: HashMap::new(),
            forgotten: std::collections::HashSet::new(),
            background,
        }
    }

    /// The simulated stream of name index `i`.
    fn stream(&mut self, i: u32) -> Stream {
        if let Some(Some(s)) = self.streams.get(i as usize) {
            return *s;
        }
        let name = self.names.get(i as usize).map_or("", String::as_str);
        let s = if super::is_legacy_stream_name(name) {
            Stream::LEGACY
        } else {
            // Non-blocking, as an engine's (and PyTorch's) side streams are; a failed
            // creation leaves the legacy stream: the replay goes on.
            self.sim
                .stream_create_with_flags(crate::driver::sim::CU_STREAM_NON_BLOCKING)
                .map_or(Stream::LEGACY, Stream)
        };
        if let Some(slot) = self.streams.get_mut(i as usize) {
            *slot = Some(s);
        }
        s
    }

    /// The key of a stream's marks (the pool keys the legacy stream as 0).
    fn key(s: Stream) -> u64 {
        if s.is_legacy() {
            0
        } else {
            s.raw()
        }
    }

    fn recorded_clear(&mut self, id: u32) {
        self.recorded.remove(&id);
    }

    fn recorded_push(&mut self, id: u32, stream: u32) {
        let list = self.recorded.entry(id).or_default();
        if !list.contains(&stream) {
            list.push(stream);
        }
    }

    /// A stream-ordered free of `ptr` (`bytes` asked) as id `id` on name index
    /// `stream`: the marks it makes (its stream's, then each recorded stream's),
    /// before the pool's call. Returns the stream.
    fn free_marks(&mut self, id: u32, stream: u32, ptr: DevicePtr, bytes: u64) -> Stream {
        let own = self.stream(stream);
        self.mark(own, ptr, bytes);
        for other in self.recorded.remove(&id).unwrap_or_default() {
            if self.forgotten.contains(&other) {
                continue; // its work all came before its forget's fence
            }
            let s = self.stream(other);
            if Self::key(s) != Self::key(own) {
                self.mark(s, ptr, bytes);
            }
        }
        own
    }

    /// One mark on `s`: an event, then a kernel over the freed memory; then a `done`
    /// waiting for this mark is applied.
    fn mark(&mut self, s: Stream, ptr: DevicePtr, bytes: u64) {
        let sim = Arc::clone(&self.sim);
        let m = self
            .marks
            .entry(Self::key(s))
            .or_insert_with(|| Marks::new(s));
        m.count += 1;
        if let Ok(e) = sim.event_create() {
            if sim.event_record(e, s.raw()) == CuResult::SUCCESS {
                m.events.push_back((m.count, e));
            } else {
                let _ = sim.event_destroy(e);
            }
        }
        let _ = sim.launch(s.raw(), ptr, bytes.max(1));
        if m.pending > 0 {
            // The pending mark is at or past this one: all is complete.
            if m.pending <= m.count {
                m.pending = 0;
            }
            m.complete_all(&sim);
        }
    }

    /// `forget STREAM`: the name index's stream gets no more marks, nor work at its
    /// tail (the engine destroyed it). Its simulated stream stays (its queued work
    /// completes with a synchronize: the recorded pool's completions of a forgotten
    /// stream's fence are not in the trace); the name's next index gets a new one.
    /// Returns the stream, for the pool's call.
    fn forget(&mut self, stream: u32) -> Stream {
        let s = self.stream(stream);
        self.forgotten.insert(stream);
        if let Some(m) = self.marks.remove(&Self::key(s)) {
            for (_, e) in m.events.into_iter().chain(m.tail.map(|e| (0, e))) {
                let _ = self.sim.event_destroy(e);
            }
        }
        s
    }

    /// `done STREAM MARK`: the recorded pool saw a fence covering the stream's marks
    /// through `mark` complete: the work queued before mark `mark + 1` completes (now,
    /// or once the replay reaches that mark: the recorded pool saw it during the call
    /// that made it).
    fn done(&mut self, stream: u32, mark: u64) {
        let s = self.stream(stream);
        let sim = Arc::clone(&self.sim);
        let m = self
            .marks
            .entry(Self::key(s))
            .or_insert_with(|| Marks::new(s));
        if mark > m.count {
            m.pending = m.pending.max(mark);
        }
        m.complete_through(&sim, mark);
    }

    /// As recorded, after each call's line: a stream with marks whose tail's work
    /// completed gets new work that only a `done` line completes.
    fn keep_busy(&mut self) {
        if !self.background {
            return;
        }
        let sim = &self.sim;
        for m in self.marks.values_mut() {
            if m.count == 0 {
                continue;
            }
            let idle = match m.tail {
                Some(e) => sim.event_query(e) == CuResult::SUCCESS,
                None => true,
            };
            if !idle {
                continue;
            }
            if let Some(e) = m.tail.take() {
                let _ = sim.event_destroy(e);
            }
            if sim.launch(m.stream.raw(), 0, 0) != CuResult::SUCCESS {
                continue;
            }
            if let Ok(e) = sim.event_create() {
                if sim.event_record(e, m.stream.raw()) == CuResult::SUCCESS {
                    m.tail = Some(e);
                } else {
                    let _ = sim.event_destroy(e);
                }
            }
        }
    }
}
