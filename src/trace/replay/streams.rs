//! The replay's simulated streams: one per stream name, with the marks the recorded
//! pool counted and the `done` lines that complete their work.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::driver::sim::SimDriver;
use crate::driver::{CuResult, DevicePtr, Stream};
use crate::trace::Trace;

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
pub(super) struct SimStreams {
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
    pub(super) fn new(sim: Arc<SimDriver>, trace: &Trace, background: bool) -> SimStreams {
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
    pub(super) fn stream(&mut self, i: u32) -> Stream {
        if let Some(Some(s)) = self.streams.get(i as usize) {
            return *s;
        }
        let name = self.names.get(i as usize).map_or("", String::as_str);
        let s = if crate::trace::is_legacy_stream_name(name) {
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

    pub(super) fn recorded_clear(&mut self, id: u32) {
        self.recorded.remove(&id);
    }

    pub(super) fn recorded_push(&mut self, id: u32, stream: u32) {
        let list = self.recorded.entry(id).or_default();
        if !list.contains(&stream) {
            list.push(stream);
        }
    }

    /// A stream-ordered free of `ptr` (`bytes` asked) as id `id` on name index
    /// `stream`: the marks it makes (its stream's, then each recorded stream's),
    /// before the pool's call. Returns the stream.
    pub(super) fn free_marks(
        &mut self,
        id: u32,
        stream: u32,
        ptr: DevicePtr,
        bytes: u64,
    ) -> Stream {
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
    pub(super) fn forget(&mut self, stream: u32) -> Stream {
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
    pub(super) fn done(&mut self, stream: u32, mark: u64) {
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
    pub(super) fn keep_busy(&mut self) {
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
