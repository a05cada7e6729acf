//! A parsed, valid trace ([`Trace`]): its events with their lines, the id and stream
//! names, and the reference figures any replay is judged against.

use super::{Event, RecordedConfig};

/// A parsed, valid trace: its events in order, each with its line number, and the
/// id names. Built only by [`parse`] / [`parse_str`], so every `Free` names a live
/// allocation and scopes are well nested.
///
/// [`parse`]: super::parse
/// [`parse_str`]: super::parse_str
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    pub(super) name: String,
    pub(super) events: Vec<Event>,
    pub(super) lines: Vec<usize>,
    pub(super) id_names: Vec<String>,
    pub(super) allocations: usize,
    pub(super) has_scope_events: bool,
    /// Whether any `sleep` line is there.
    pub(super) has_sleep: bool,
    /// Whether an `a` line carries a tag other than 0.
    pub(super) has_tags: bool,
    /// The stream names of stream-ordered lines, by dense index.
    pub(super) stream_names: Vec<String>,
    /// The `# flare-pool` header of a recorded trace.
    pub(super) recorded: Option<RecordedConfig>,
}

/// Rounds `bytes` up to a multiple of `granularity` (bytes; 0 is taken as 1),
/// saturating at `u64::MAX`.
fn round_up(bytes: u64, granularity: u64) -> u64 {
    let g = granularity.max(1);
    match bytes.checked_add(g - 1) {
        Some(b) => b / g * g,
        None => u64::MAX,
    }
}

impl Trace {
    /// The trace's name: the path as given to [`parse`], or the name given to
    /// [`parse_str`].
    ///
    /// [`parse`]: super::parse
    /// [`parse_str`]: super::parse_str
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The events, in trace order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The 1-based line number of each event (`lines()[i]` is the line of
    /// `events()[i]`).
    pub fn lines(&self) -> &[usize] {
        &self.lines
    }

    /// The events with their 1-based line numbers, in trace order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, Event)> + '_ {
        self.lines.iter().copied().zip(self.events.iter().copied())
    }

    /// Number of events (comment and blank lines excluded).
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the trace has no events.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Number of distinct allocation ids: every `id` in an [`Event`] is below it.
    pub fn id_count(&self) -> usize {
        self.id_names.len()
    }

    /// The id token as written in the file for the dense index `id`.
    pub fn id_name(&self, id: u32) -> Option<&str> {
        self.id_names.get(id as usize).map(String::as_str)
    }

    /// Number of `a` events.
    pub fn allocations(&self) -> usize {
        self.allocations
    }

    /// Whether the trace has any `begin`, `finish` or `abort` line. A trace without
    /// one (and without `sleep` lines) is replayed inside a single retention scope.
    pub fn has_scope_events(&self) -> bool {
        self.has_scope_events
    }

    /// Whether the trace has any `sleep` line (a recorded trace): it is replayed
    /// with no implicit retention scope (a sleep is refused inside one).
    pub fn has_sleep(&self) -> bool {
        self.has_sleep
    }

    /// The stream names of the trace's stream-ordered lines (dense indices), in
    /// order of first appearance.
    pub fn stream_names(&self) -> &[String] {
        &self.stream_names
    }

    /// The name of stream index `stream` as written in the file.
    pub fn stream_name(&self, stream: u32) -> Option<&str> {
        self.stream_names.get(stream as usize).map(String::as_str)
    }

    /// Whether the trace has stream-ordered lines (`a` or `f` with a stream, `r`,
    /// `done`): its replay needs the simulated driver.
    pub fn has_streams(&self) -> bool {
        !self.stream_names.is_empty()
    }

    /// The recorded pool's configuration, from the `# flare-pool` header line of a
    /// recorded trace (`None` for a trace without one).
    pub fn recorded_config(&self) -> Option<&RecordedConfig> {
        self.recorded.as_ref()
    }

    /// Whether an `a` line carries a tag other than 0 (`flare-replay` then prints a
    /// census per tag).
    pub fn has_tags(&self) -> bool {
        self.has_tags
    }

    /// The tags the trace's `a` lines name (0 for those without a tag), ascending,
    /// each with its number of `a` lines.
    pub fn tags(&self) -> Vec<(u32, u64)> {
        let mut counts = std::collections::BTreeMap::new();
        for e in &self.events {
            match *e {
                Event::Alloc { .. } => *counts.entry(0).or_insert(0u64) += 1,
                Event::AllocTagged { tag, .. } | Event::AllocAsync { tag, .. } => {
                    *counts.entry(tag).or_insert(0u64) += 1
                }
                _ => {}
            }
        }
        counts.into_iter().collect()
    }

    /// The lower bound of any allocator's physical memory on this trace, bytes: the
    /// peak over the trace of live bytes, each allocation rounded up to
    /// `granularity` (bytes; 0 is taken as 1). Saturates at `u64::MAX`.
    pub fn lower_bound_bytes(&self, granularity: u64) -> u64 {
        self.figures(granularity).0
    }

    /// Physical memory of a pool that never reuses on this trace, bytes: every freed
    /// mapping retained until its scope closes (the warmup-retention bug). Sizes are
    /// rounded up to `granularity` (bytes; 0 is taken as 1); a trace without scope
    /// lines is taken as one scope, as [`replay`] runs it. Within a scope this is the
    /// live bytes at its start plus every allocation since; outside a scope it is the
    ///
    /// [`replay`]: super::replay
    /// live bytes; the result is the peak over the trace. Saturates at `u64::MAX`.
    pub fn no_reuse_bytes(&self, granularity: u64) -> u64 {
        self.figures(granularity).1
    }

    /// One pass over the trace: (peak of live rounded bytes, peak of live plus
    /// retained rounded bytes).
    fn figures(&self, granularity: u64) -> (u64, u64) {
        let mut sizes = vec![0u64; self.id_count()];
        let mut in_scope = !self.has_scope_events;
        let (mut live, mut retained) = (0u64, 0u64);
        let (mut live_peak, mut no_reuse_peak) = (0u64, 0u64);
        for e in &self.events {
            match *e {
                Event::Alloc { id, bytes }
                | Event::AllocTagged { id, bytes, .. }
                | Event::AllocAsync { id, bytes, .. } => {
                    let r = round_up(bytes, granularity);
                    if let Some(s) = sizes.get_mut(id as usize) {
                        *s = r;
                    }
                    live = live.saturating_add(r);
                    live_peak = live_peak.max(live);
                    no_reuse_peak = no_reuse_peak.max(live.saturating_add(retained));
                }
                Event::Free { id } | Event::FreeAsync { id, .. } => {
                    let r = sizes.get(id as usize).copied().unwrap_or(0);
                    live = live.saturating_sub(r);
                    if in_scope {
                        retained = retained.saturating_add(r);
                    }
                }
                Event::Begin => in_scope = true,
                Event::Finish | Event::Abort => {
                    in_scope = false;
                    retained = 0;
                }
                Event::Trim
                | Event::Step
                | Event::RecordStream { .. }
                | Event::Forget { .. }
                | Event::Done { .. }
                | Event::Oom { .. }
                | Event::AllocFailed { .. }
                | Event::Sleep { .. }
                | Event::Wake { .. } => {}
            }
        }
        (live_peak, no_reuse_peak)
    }
}
