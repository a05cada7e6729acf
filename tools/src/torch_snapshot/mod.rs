//! Importing PyTorch memory snapshots (issue 17): the pickle that
//! `torch.cuda.memory._dump_snapshot` writes after
//! `torch.cuda.memory._record_memory_history`, turned into flare-trace v1 text
//! (`docs/trace-format.md`, "Importing PyTorch memory snapshots").
//!
//! A snapshot is a dict; its `device_traces` is a list, one entry per device, of
//! lists of event dicts (`action`, `addr`, `size`, and keys this importer ignores,
//! such as `stream`, `time_us` and `frames`). [`import`] reads one device's events
//! at one of two levels ([`Level`]):
//!
//! - [`Level::Tensor`], the allocation trace: `alloc` becomes `a ID BYTES` and
//!   `free_requested` becomes `f ID`. The tensor is dead for its caller when the
//!   free is requested; when the caching allocator completes it (after the streams
//!   that used the block are done) is the allocator's business, so `free_completed`
//!   is used only to keep the block layout below. An `alloc` event's `size` is the
//!   *requested* size, while PyTorch's `max_memory_allocated` counts *block* sizes:
//!   the importer rebuilds the caching allocator's blocks from the events
//!   ([`BlockLayout`]) and writes each allocation's block size, so the trace's peak
//!   live bytes is PyTorch's `max_memory_allocated` (exactly, on the snapshots in
//!   `tests/data/torch/`).
//! - [`Level::Segment`], the segment events: `segment_alloc` becomes `a` and
//!   `segment_free` becomes `f` (what a backing allocator under PyTorch sees, as
//!   `cudaMalloc` and `cudaFree`); `segment_map` and `segment_unmap` (expandable
//!   segments) become `a` and `f` of the mapped ranges.
//!
//! Ids are the allocation's address in hex (`0x7f2a00000000`): unique among live
//! allocations, and reused after the free, as the format allows. A free of an
//! address that is not live (allocated before recording began) is skipped and
//! counted ([`Summary::skipped_frees`]).
#![forbid(unsafe_code)]

mod events;
mod layout;
mod writer;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fmt::Write as _;

use flare_package::fmt_bytes;

use crate::pickle::{self, Obj, ObjId, Pickle, PickleError};
use events::{some_keys, Ev, EventKeysCache};
use layout::settings;
use writer::{segment_events, tensor_events, Writer};

pub use layout::{round_request, BlockLayout, MIN_BLOCK_BYTES, SMALL_REQUEST_BYTES};

/// The first byte of a pickle of protocol 2 or later (the `PROTO` opcode), which is
/// what `torch.cuda.memory._dump_snapshot` writes.
pub const PICKLE_PROTO: u8 = 0x80;

/// Which events of a snapshot become the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Level {
    /// The allocation trace (per-tensor events): `alloc` and `free_requested`, with
    /// block sizes from the block layout.
    #[default]
    Tensor,
    /// The segment events: `segment_alloc`, `segment_free`, `segment_map`,
    /// `segment_unmap`.
    Segment,
}

impl Level {
    /// How reports name the level: `allocation trace (per-tensor events)` or
    /// `segment events`.
    pub fn describe(self) -> &'static str {
        match self {
            Level::Tensor => "allocation trace (per-tensor events)",
            Level::Segment => "segment events",
        }
    }
}

/// What to import from a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Which events become the trace.
    pub level: Level,
    /// The device (index into `device_traces`); `None`: the one device that has
    /// events.
    pub device: Option<usize>,
}

/// Why a snapshot could not be imported. Each message names what is missing or
/// wrong (a key, an event's index in `device_traces`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    /// The input does not start with byte 0x80 ([`PICKLE_PROTO`]), as a pickle of
    /// protocol 2 or later does: it is not a pickle (or one too old to be a
    /// snapshot). The first byte, if any.
    NotAPickle(Option<u8>),
    /// The pickle ends before its `STOP` opcode (a file cut short); the byte offset
    /// where the input ran out.
    Truncated(usize),
    /// A pickle the decoder cannot read (an unknown opcode, a class instance it does
    /// not resolve, bytes after the end); the decoder's message.
    Malformed(String),
    /// A pickle that decodes but is not a snapshot as this importer knows it: a
    /// missing key or a value of the wrong type. The message names it (``no key
    /// `device_traces` ``, ``event 17 of device 0 (`alloc`) has no `addr` ``).
    Layout(String),
    /// The device to import cannot be chosen: the one asked for is not in the
    /// snapshot, no device has allocator events, or several have and none was chosen.
    Device(String),
    /// Events this importer does not support (a `segment_unmap` that cuts a mapping
    /// in two, an `alloc` at an address that is live).
    Unsupported(String),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::NotAPickle(None) => f.write_str(
                "not a pickle: the input is empty (a PyTorch snapshot is a pickle, \
                 starting with byte 0x80)",
            ),
            SnapshotError::NotAPickle(Some(b)) => write!(
                f,
                "not a pickle: the first byte is {b:#04x}, not 0x80 (a PyTorch snapshot \
                 is a pickle of protocol 2 or later, written by \
                 torch.cuda.memory._dump_snapshot)"
            ),
            SnapshotError::Truncated(at) => write!(
                f,
                "truncated pickle: the input ends at byte {at}, before the pickle's end \
                 (a file cut short?)"
            ),
            SnapshotError::Malformed(m) => write!(f, "malformed pickle: {m}"),
            SnapshotError::Layout(m) => write!(f, "not a PyTorch memory snapshot: {m}"),
            SnapshotError::Device(m) | SnapshotError::Unsupported(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for SnapshotError {}

/// What an import did: the source, the counts, and the peak of live bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The level imported.
    pub level: Level,
    /// The device imported (index into `device_traces`).
    pub device: usize,
    /// Entries of `device_traces` (devices in the snapshot).
    pub devices: usize,
    /// Events of the imported device, all actions.
    pub events: usize,
    /// Events per action of the imported device (`alloc`, `free_requested`, ...).
    pub actions: BTreeMap<String, u64>,
    /// `a` lines written.
    pub allocations: u64,
    /// `f` lines written.
    pub frees: u64,
    /// Frees of an address that was not live (allocated before recording began),
    /// skipped.
    pub skipped_frees: u64,
    /// [`Level::Tensor`]: allocations whose block size is the rounded request
    /// ([`round_request`]) because no free block of the layout starts at their
    /// address (its segment was allocated before recording began, or the layout is
    /// not modelled: [`Summary::layout_not_modelled`]). 0 for [`Level::Segment`].
    pub rounded_blocks: u64,
    /// [`Level::Tensor`]: why the block layout is not modelled, when it is not (an
    /// allocator setting the model does not follow, such as expandable segments);
    /// every block size is then the rounded request.
    pub layout_not_modelled: Option<String>,
    /// The peak over the trace of the bytes live at once (the sum of the `a` sizes
    /// of live allocations), bytes.
    pub peak_live_bytes: u64,
}

impl Summary {
    /// The summary as a few lines of text (no trailing newline on each), at most
    /// about 90 columns: the source on the first line, then the counts, the
    /// fallbacks and skips, and the peak of live bytes.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "PyTorch snapshot, {}: device {} of {}, {} events",
            self.level.describe(),
            self.device,
            self.devices,
            self.events
        )];
        match self.level {
            Level::Tensor => {
                lines.push(format!(
                    "{} \"a\" lines (alloc), {} \"f\" lines (free_requested); \
                     free_completed: block layout only",
                    self.allocations, self.frees
                ));
                lines.push(format!(
                    "block sizes: {} from the block layout, {} rounded requests \
                     (no free block at the address)",
                    self.allocations.saturating_sub(self.rounded_blocks),
                    self.rounded_blocks
                ));
                if let Some(why) = &self.layout_not_modelled {
                    lines.push(format!("block layout not modelled: {why}"));
                }
            }
            Level::Segment => lines.push(format!(
                "{} \"a\" lines (segment_alloc, segment_map), {} \"f\" lines \
                 (segment_free, segment_unmap)",
                self.allocations, self.frees
            )),
        }
        lines.push(format!(
            "{} frees skipped (not live: allocated before recording)",
            self.skipped_frees
        ));
        lines.push(format!(
            "peak live bytes {} ({})",
            self.peak_live_bytes,
            fmt_bytes(self.peak_live_bytes)
        ));
        lines
    }
}

/// An imported snapshot: the flare-trace v1 text and what the import did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Imported {
    /// The trace: a `# flare-trace v1` header, the [`Summary::lines`] as comments,
    /// then one line per event. Parses with `flare_package::trace::parse_str`.
    pub text: String,
    /// What the import did.
    pub summary: Summary,
}

/// Whether `bytes` start as a pickle of protocol 2 or later does (byte 0x80,
/// [`PICKLE_PROTO`]); a flare-trace never does (it is text).
pub fn looks_like_pickle(bytes: &[u8]) -> bool {
    bytes.first() == Some(&PICKLE_PROTO)
}

/// Decodes the pickle in `bytes` ([`crate::pickle::read`]).
///
/// Errors: [`SnapshotError::NotAPickle`] when `bytes` do not start with byte 0x80,
/// [`SnapshotError::Truncated`] when they end before the pickle does,
/// [`SnapshotError::Malformed`] for anything else the reader rejects.
pub fn decode(bytes: &[u8]) -> Result<Pickle, SnapshotError> {
    if !looks_like_pickle(bytes) {
        return Err(SnapshotError::NotAPickle(bytes.first().copied()));
    }
    pickle::read(bytes).map_err(|e| match e {
        PickleError::Truncated(at) => SnapshotError::Truncated(at),
        other => SnapshotError::Malformed(other.to_string()),
    })
}

/// Imports a snapshot: decodes the pickle in `bytes`, chooses the device, and turns
/// its events at `options.level` into flare-trace v1 text. `name` names the snapshot
/// in the trace's header comment (a path, say).
///
/// Errors: those of [`decode`]; [`SnapshotError::Layout`] when the pickle is not a
/// dict with a `device_traces` list of lists of event dicts, or an event the level
/// uses lacks its `action`, `addr` or `size` or has one of the wrong type;
/// [`SnapshotError::Device`] when `options.device` is not in the snapshot, or it is
/// `None` and no device, or several, have events; [`SnapshotError::Unsupported`]
/// for an `alloc` (or `segment_alloc`, `segment_map`) at an address that is live, a
/// `segment_unmap` that cuts a mapping in two, or a segment of 0 bytes.
pub fn import(name: &str, bytes: &[u8], options: &Options) -> Result<Imported, SnapshotError> {
    let p = decode(bytes)?;
    let top = p.root();
    if !matches!(p.obj(top), Some(Obj::Dict(_))) {
        return Err(SnapshotError::Layout(format!(
            "the pickle holds a {}, not a dict with `device_traces`",
            p.type_name(top)
        )));
    }
    let traces = p.get(top, "device_traces").ok_or_else(|| {
        SnapshotError::Layout(format!(
            "no key `device_traces` in the pickle's dict ({}); was the snapshot \
             taken with torch.cuda.memory._record_memory_history on?",
            some_keys(&p, top)
        ))
    })?;
    let traces = p.items(traces).ok_or_else(|| {
        SnapshotError::Layout(format!(
            "`device_traces` is a {}, not a list",
            p.type_name(traces)
        ))
    })?;
    // Events are read through `keys`, once per event dict and once per device
    // list: the pickle's memo shares objects, so a few bytes can name a large list
    // or dict again and again, and walking it at each reference is quadratic work
    // (issue 34: 70,000 devices sharing one event list, 65,000 events sharing one
    // dict of 130,000 keys, took 11 to 18 s).
    let mut keys = EventKeysCache::new(&p);
    let mut per_device = Vec::with_capacity(traces.len());
    for (d, &t) in traces.iter().enumerate() {
        per_device.push(p.items(t).ok_or_else(|| {
            SnapshotError::Layout(format!(
                "`device_traces[{d}]` is a {}, not a list of events",
                p.type_name(t)
            ))
        })?);
    }
    // A device whose only events are PyTorch's own markers (a `snapshot` taken, an
    // `oom` reported) allocated nothing: a snapshot from a two-GPU machine that used
    // one has a `snapshot` event on the other.
    let mut list_allocates: HashMap<ObjId, bool> = HashMap::new();
    let mut allocating = Vec::with_capacity(traces.len());
    for (&t, events) in traces.iter().zip(&per_device) {
        let allocates = match list_allocates.get(&t) {
            Some(&a) => a,
            None => {
                let a = events.iter().any(|&e| {
                    keys.get(e)
                        .action
                        .and_then(|a| p.str(a))
                        .is_none_or(|a| a != "snapshot" && a != "oom")
                });
                list_allocates.insert(t, a);
                a
            }
        };
        allocating.push(allocates);
    }
    let device = choose_device(&allocating, options.device)?;
    let events = per_device.get(device).copied().unwrap_or(&[]);
    let mut parsed = Vec::with_capacity(events.len());
    let mut actions: BTreeMap<String, u64> = BTreeMap::new();
    for (index, &e) in events.iter().enumerate() {
        if !matches!(p.obj(e), Some(Obj::Dict(_))) {
            return Err(SnapshotError::Layout(format!(
                "event {index} of device {device} is a {}, not a dict \
                 (device_traces[{device}][{index}])",
                p.type_name(e)
            )));
        }
        let found = keys.get(e);
        let action = match found.action {
            Some(a) => p.str(a).ok_or_else(|| {
                SnapshotError::Layout(format!(
                    "event {index} of device {device}: `action` is a {}, not a str \
                     (device_traces[{device}][{index}])",
                    p.type_name(a)
                ))
            })?,
            None => {
                return Err(SnapshotError::Layout(format!(
                    "event {index} of device {device} has no `action` \
                     (device_traces[{device}][{index}])"
                )))
            }
        };
        *actions.entry(action.to_string()).or_insert(0) += 1;
        parsed.push(Ev {
            p: &p,
            index,
            keys: found,
            action,
            device,
        });
    }
    let settings = settings(&p, top);
    let mut w = Writer::default();
    match options.level {
        Level::Tensor => tensor_events(&parsed, &settings, &mut w)?,
        Level::Segment => segment_events(&parsed, &mut w)?,
    }
    let summary = Summary {
        level: options.level,
        device,
        devices: per_device.len(),
        events: events.len(),
        actions,
        allocations: w.allocations,
        frees: w.frees,
        skipped_frees: w.skipped_frees,
        rounded_blocks: w.rounded_blocks,
        layout_not_modelled: match options.level {
            Level::Tensor => settings.not_modelled,
            Level::Segment => None,
        },
        peak_live_bytes: w.peak,
    };
    let mut text = String::with_capacity(w.body.len() + 512);
    text.push_str("# flare-trace v1\n");
    let _ = writeln!(
        text,
        "# imported by flare-replay from the PyTorch memory snapshot {}",
        // The whole name (a converted trace says where it came from), on one line.
        name.replace(['\n', '\r'], " ")
    );
    for line in summary.lines() {
        let _ = writeln!(text, "# {line}");
    }
    text.push_str(&w.body);
    Ok(Imported { text, summary })
}

/// The device to import: `asked`, if it is in the snapshot, else the one device
/// with allocator events (`per_device[d]`: device `d` has some).
fn choose_device(per_device: &[bool], asked: Option<usize>) -> Result<usize, SnapshotError> {
    if let Some(d) = asked {
        if d >= per_device.len() {
            return Err(SnapshotError::Device(format!(
                "device {d} is not in the snapshot (`device_traces` has {} entries: \
                 devices 0 to {})",
                per_device.len(),
                per_device.len().saturating_sub(1)
            )));
        }
        return Ok(d);
    }
    let with_events: Vec<usize> = per_device
        .iter()
        .enumerate()
        .filter(|(_, &has)| has)
        .map(|(d, _)| d)
        .collect();
    match with_events.as_slice() {
        [d] => Ok(*d),
        [] => Err(SnapshotError::Device(format!(
            "no device has allocator events (`device_traces` has {} entries, none with \
             one): was \
             torch.cuda.memory._record_memory_history on while the program allocated?",
            per_device.len()
        ))),
        several => {
            // At most 8 named: a message, not a list of every device.
            let mut named: Vec<String> = several.iter().take(8).map(usize::to_string).collect();
            if several.len() > 8 {
                named.push(format!("... ({} devices)", several.len()));
            }
            Err(SnapshotError::Device(format!(
                "devices {} have events: choose one with --device",
                named.join(", ")
            )))
        }
    }
}
