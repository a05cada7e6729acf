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

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fmt::Write as _;

use flare_package::fmt_bytes;
use flare_package::trace::Excerpt;

use crate::pickle::{self, Obj, ObjId, Pickle, PickleError};

/// The caching allocator's smallest block and its rounding unit, bytes
/// (`kMinBlockSize`): a request is rounded up to a multiple of it, 512 at least.
pub const MIN_BLOCK_BYTES: u64 = 512;

/// The largest request the caching allocator serves from its small pool, bytes
/// (`kSmallSize`, 1 MiB). A split of a large block keeps a remainder only when it
/// is larger than this.
pub const SMALL_REQUEST_BYTES: u64 = 1 << 20;

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

/// The caching allocator's rounding of a request of `bytes` bytes (default
/// settings: no `roundup_power2_divisions`): [`MIN_BLOCK_BYTES`] below it, else
/// `bytes` rounded up to a multiple of it. Saturates at the largest multiple of 512
/// that fits in a `u64`.
pub fn round_request(bytes: u64) -> u64 {
    if bytes < MIN_BLOCK_BYTES {
        return MIN_BLOCK_BYTES;
    }
    bytes
        .checked_next_multiple_of(MIN_BLOCK_BYTES)
        .unwrap_or(u64::MAX / MIN_BLOCK_BYTES * MIN_BLOCK_BYTES)
}

/// One block of the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    /// Bytes.
    size: u64,
    allocated: bool,
    /// Address of the segment the block is in (blocks merge only within one).
    segment: u64,
}

/// The caching allocator's blocks, rebuilt from the events: per segment (from
/// `segment_alloc`, dropped at `segment_free`), blocks by address, each allocated or
/// free. An `alloc` at the start of a free block takes it whole or splits it as the
/// allocator does ([`BlockLayout::alloc`]); `free_completed` frees the block and
/// merges it with free neighbours of the same segment.
#[derive(Clone, Debug, Default)]
pub struct BlockLayout {
    blocks: BTreeMap<u64, Block>,
    /// `max_split_size` when set (bytes): a large block is split only for a request
    /// below it.
    max_split_bytes: Option<u64>,
}

impl BlockLayout {
    /// An empty layout. `max_split_bytes`: the allocator's `max_split_size`, bytes,
    /// `None` when unset (the snapshot's `-1`).
    pub fn new(max_split_bytes: Option<u64>) -> BlockLayout {
        BlockLayout {
            blocks: BTreeMap::new(),
            max_split_bytes,
        }
    }

    /// A segment of `size` bytes at `addr`: one free block.
    pub fn segment_alloc(&mut self, addr: u64, size: u64) {
        self.blocks.insert(
            addr,
            Block {
                size,
                allocated: false,
                segment: addr,
            },
        );
    }

    /// The segment at `addr` is released: its blocks are dropped.
    pub fn segment_free(&mut self, addr: u64) {
        let gone: Vec<u64> = self
            .blocks
            .range(addr..)
            .take_while(|(_, b)| b.segment == addr)
            .map(|(&a, _)| a)
            .collect();
        for a in gone {
            self.blocks.remove(&a);
        }
    }

    /// An allocation of `request` bytes at `addr`: the size of the block it got,
    /// bytes, or `None` when no free block of at least the rounded request starts at
    /// `addr` (the layout then is unchanged). With `r` the rounded request
    /// ([`round_request`]) and `B` the free block's size, the block is split into
    /// `r` and a free remainder of `B - r` at `addr + r` when the remainder is at
    /// least [`MIN_BLOCK_BYTES`] for a small request (`r` at most
    /// [`SMALL_REQUEST_BYTES`]), or more than [`SMALL_REQUEST_BYTES`] for a large one
    /// (and `r` is below `max_split_size` when that is set); else the whole `B` is
    /// allocated.
    pub fn alloc(&mut self, addr: u64, request: u64) -> Option<u64> {
        let r = round_request(request);
        let max_split = self.max_split_bytes;
        let block = self.blocks.get_mut(&addr)?;
        if block.allocated || block.size < r {
            return None;
        }
        let remaining = block.size - r;
        let split = if r <= SMALL_REQUEST_BYTES {
            remaining >= MIN_BLOCK_BYTES
        } else {
            max_split.is_none_or(|m| r < m) && remaining > SMALL_REQUEST_BYTES
        };
        block.allocated = true;
        if !split {
            return Some(block.size);
        }
        block.size = r;
        let segment = block.segment;
        self.blocks.insert(
            addr + r,
            Block {
                size: remaining,
                allocated: false,
                segment,
            },
        );
        Some(r)
    }

    /// The block at `addr` is free again (`free_completed`): it merges with the next
    /// block and the previous one when they are free and in the same segment.
    /// Nothing happens when no allocated block starts at `addr`.
    pub fn free(&mut self, addr: u64) {
        let Some(block) = self.blocks.get(&addr).copied() else {
            return;
        };
        if !block.allocated {
            return;
        }
        let mut size = block.size;
        let next_addr = addr.saturating_add(size);
        if let Some(next) = self.blocks.get(&next_addr).copied() {
            if !next.allocated && next.segment == block.segment {
                size += next.size;
                self.blocks.remove(&next_addr);
            }
        }
        let prev = self
            .blocks
            .range(..addr)
            .next_back()
            .map(|(&a, &b)| (a, b))
            .filter(|&(a, b)| {
                !b.allocated && b.segment == block.segment && a.saturating_add(b.size) == addr
            });
        if let Some((prev_addr, prev)) = prev {
            self.blocks.remove(&addr);
            self.blocks.insert(
                prev_addr,
                Block {
                    size: prev.size + size,
                    ..prev
                },
            );
        } else {
            self.blocks.insert(
                addr,
                Block {
                    size,
                    allocated: false,
                    segment: block.segment,
                },
            );
        }
    }
}

/// The most bytes [`some_keys`] spends on quoted keys: a message stays one short
/// line whatever the keys hold (an excerpt of escaped control characters is up to
/// about 250 bytes; 8 of them made a message of 1.9 KB, a fuzz finding).
const SOME_KEYS_BYTES: usize = 400;

/// Up to 8 of a dict's str keys, for a message (`its keys: "a", "b"`), no more of
/// them than [`SOME_KEYS_BYTES`] hold (at least one).
fn some_keys(p: &Pickle, dict: ObjId) -> String {
    let keys = p.str_keys(dict);
    let mut names: Vec<String> = Vec::new();
    let mut used = 0;
    for k in keys.iter().take(8) {
        let name = Excerpt::new(k).to_string();
        if !names.is_empty() && used + name.len() > SOME_KEYS_BYTES {
            break;
        }
        used += name.len() + 2;
        names.push(name);
    }
    if keys.len() > names.len() {
        names.push(format!("... ({} keys)", keys.len()));
    }
    if names.is_empty() {
        "the dict has no str keys".to_string()
    } else {
        format!("its keys: {}", names.join(", "))
    }
}

/// The allocator settings that decide the block layout.
struct Settings {
    /// `max_split_size`, bytes, when set.
    max_split_bytes: Option<u64>,
    /// Why the layout cannot be modelled, if it cannot.
    not_modelled: Option<String>,
}

/// Reads `allocator_settings` of the snapshot's dict `top` (absent in older
/// snapshots: defaults).
fn settings(p: &Pickle, top: ObjId) -> Settings {
    let mut s = Settings {
        max_split_bytes: None,
        not_modelled: None,
    };
    let Some(cfg) = p.get(top, "allocator_settings") else {
        return s;
    };
    if let Some(m) = p.get(cfg, "max_split_size").and_then(|v| p.int(v)) {
        s.max_split_bytes = u64::try_from(m).ok().filter(|&m| m < u64::MAX);
    }
    let mut why = Vec::new();
    if let Some(v) = p.get(cfg, "expandable_segments") {
        if p.obj(v) == Some(&Obj::Bool(true)) {
            why.push("expandable_segments is on".to_string());
        }
    }
    let nonzero = |v: ObjId| p.int(v).is_some_and(|n| n != 0);
    let divisions_set = match p.get(cfg, "roundup_power2_divisions") {
        Some(v) => match p.obj(v) {
            Some(Obj::Dict(pairs)) => pairs.iter().any(|&(_, x)| nonzero(x)),
            Some(Obj::List(l) | Obj::Tuple(l)) => l.iter().any(|&x| nonzero(x)),
            _ => nonzero(v),
        },
        None => false,
    };
    if divisions_set {
        why.push("roundup_power2_divisions are set".to_string());
    }
    if !why.is_empty() {
        s.not_modelled = Some(why.join(", "));
    }
    s
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

/// The keys of an event dict the importer reads: their values, if present.
#[derive(Clone, Copy, Debug, Default)]
struct EventKeys {
    action: Option<ObjId>,
    addr: Option<ObjId>,
    size: Option<ObjId>,
}

/// [`EventKeys`] of each event dict, looked up once per dict ([`Pickle::get_all`])
/// however many times the pickle's memo shares it.
struct EventKeysCache<'a> {
    p: &'a Pickle,
    seen: HashMap<ObjId, EventKeys>,
}

impl<'a> EventKeysCache<'a> {
    fn new(p: &'a Pickle) -> Self {
        EventKeysCache {
            p,
            seen: HashMap::new(),
        }
    }

    /// The keys of the dict at `event` (all `None` when it is not a dict).
    fn get(&mut self, event: ObjId) -> EventKeys {
        let p = self.p;
        *self.seen.entry(event).or_insert_with(|| {
            let [action, addr, size] = p.get_all(event, ["action", "addr", "size"]);
            EventKeys { action, addr, size }
        })
    }
}

/// An int key of an event that the importer reads.
#[derive(Clone, Copy, Debug)]
enum Field {
    /// `addr`.
    Addr,
    /// `size`.
    Size,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Addr => "addr",
            Field::Size => "size",
        }
    }
}

/// One event as the importer needs it.
struct Ev<'a> {
    p: &'a Pickle,
    /// Index in the device's list.
    index: usize,
    keys: EventKeys,
    action: &'a str,
    device: usize,
}

/// The largest address or size an event may carry (see `Ev::uint`).
const MAX_EVENT_INT: u64 = 1 << 62;

impl Ev<'_> {
    /// The event's non-negative int key `key` (an address or a size, bytes), at most
    /// 2^62: an address plus a size (rounded up to 512 bytes) never overflows, and a
    /// size stays within the flare-trace limit of 2^63 (real addresses and sizes are
    /// far below: 57-bit virtual addresses, devices of a few hundred GiB).
    fn uint(&self, field: Field) -> Result<u64, SnapshotError> {
        let key = field.name();
        let v = match field {
            Field::Addr => self.keys.addr,
            Field::Size => self.keys.size,
        };
        let v = v.ok_or_else(|| {
            SnapshotError::Layout(format!(
                "event {} of device {} (`{}`) has no `{key}` (device_traces[{}][{}])",
                self.index, self.device, self.action, self.device, self.index
            ))
        })?;
        self.p
            .int(v)
            .and_then(|i| u64::try_from(i).ok())
            .filter(|&u| u <= MAX_EVENT_INT)
            .ok_or_else(|| {
                SnapshotError::Layout(format!(
                    "event {} of device {} (`{}`): `{key}` is {} {}, not an int from 0 to \
                     2^62 (device_traces[{}][{}])",
                    self.index,
                    self.device,
                    self.action,
                    self.p.type_name(v),
                    short(self.p, v),
                    self.device,
                    self.index
                ))
            })
    }

    /// Where the event is, for messages.
    fn at(&self) -> String {
        format!(
            "event {} of device {} (`{}`, device_traces[{}][{}])",
            self.index, self.device, self.action, self.device, self.index
        )
    }
}

/// A value, shortly, for a message: a scalar as Python writes it, a container as
/// `(a list)`.
fn short(p: &Pickle, v: ObjId) -> String {
    match p.obj(v) {
        Some(Obj::Int(i)) => i.to_string(),
        Some(Obj::Float(f)) => f.to_string(),
        Some(Obj::Bool(b)) => if *b { "True" } else { "False" }.to_string(),
        Some(Obj::None) => "None".to_string(),
        Some(Obj::Str(s)) => Excerpt::new(s).to_string(),
        Some(o) => format!("(a {})", o.type_name()),
        None => String::new(),
    }
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

/// The trace being written, with its counts and live bytes.
#[derive(Default)]
struct Writer {
    body: String,
    /// Live allocations: address -> (bytes, index of the event that made it).
    live: BTreeMap<u64, (u64, usize)>,
    live_bytes: u64,
    peak: u64,
    allocations: u64,
    frees: u64,
    skipped_frees: u64,
    rounded_blocks: u64,
}

impl Writer {
    /// `a 0xADDR BYTES`. Errors when `addr` is live, or when `[addr, addr + bytes)`
    /// overlaps a live allocation (two live blocks or segments never share a byte;
    /// a block's size here is at most the real block's: the layout's, or the
    /// request rounded as the caching allocator rounds it at least).
    fn alloc(&mut self, ev: &Ev<'_>, addr: u64, bytes: u64) -> Result<(), SnapshotError> {
        if let Some(&(_, since)) = self.live.get(&addr) {
            return Err(SnapshotError::Unsupported(format!(
                "{}: address {addr:#x} is live (allocated by event {since} and not freed): \
                 an inconsistent snapshot",
                ev.at()
            )));
        }
        let end = addr.saturating_add(bytes);
        let before = self
            .live
            .range(..addr)
            .next_back()
            .filter(|(&a, &(b, _))| a.saturating_add(b) > addr);
        let after = self.live.range(addr..end).next();
        if let Some((&a, &(b, since))) = before.or(after) {
            return Err(SnapshotError::Unsupported(format!(
                "{}: {addr:#x}..{end:#x} overlaps {a:#x}..{:#x}, live (allocated by event \
                 {since} and not freed): an inconsistent snapshot",
                ev.at(),
                a.saturating_add(b)
            )));
        }
        self.live.insert(addr, (bytes, ev.index));
        let _ = writeln!(self.body, "a {addr:#x} {bytes}");
        self.allocations += 1;
        self.live_bytes = self.live_bytes.saturating_add(bytes);
        self.peak = self.peak.max(self.live_bytes);
        Ok(())
    }

    /// `f 0xADDR` when `addr` is live, else a skipped free. Whether it was live.
    fn free(&mut self, addr: u64) -> bool {
        match self.live.remove(&addr) {
            Some((bytes, _)) => {
                let _ = writeln!(self.body, "f {addr:#x}");
                self.frees += 1;
                self.live_bytes = self.live_bytes.saturating_sub(bytes);
                true
            }
            None => {
                self.skipped_frees += 1;
                false
            }
        }
    }
}

/// The allocation trace: `alloc` -> `a` (block size from the layout),
/// `free_requested` -> `f`; `segment_alloc`, `segment_free` and `free_completed`
/// keep the layout.
fn tensor_events(events: &[Ev<'_>], s: &Settings, w: &mut Writer) -> Result<(), SnapshotError> {
    let mut layout = BlockLayout::new(s.max_split_bytes);
    let modelled = s.not_modelled.is_none();
    for ev in events {
        match ev.action {
            "alloc" => {
                let addr = ev.uint(Field::Addr)?;
                let size = ev.uint(Field::Size)?;
                let block = if modelled {
                    layout.alloc(addr, size)
                } else {
                    None
                };
                let bytes = match block {
                    Some(b) => b,
                    None => {
                        w.rounded_blocks += 1;
                        round_request(size)
                    }
                };
                w.alloc(ev, addr, bytes)?;
            }
            "free_requested" => {
                w.free(ev.uint(Field::Addr)?);
            }
            "free_completed" => layout.free(ev.uint(Field::Addr)?),
            "segment_alloc" => layout.segment_alloc(ev.uint(Field::Addr)?, ev.uint(Field::Size)?),
            "segment_free" => layout.segment_free(ev.uint(Field::Addr)?),
            _ => {}
        }
    }
    Ok(())
}

/// The segment events: `segment_alloc` and `segment_map` -> `a`, `segment_free` and
/// `segment_unmap` -> `f`.
fn segment_events(events: &[Ev<'_>], w: &mut Writer) -> Result<(), SnapshotError> {
    // Mapped ranges of expandable segments: address -> bytes.
    let mut mapped: BTreeMap<u64, u64> = BTreeMap::new();
    for ev in events {
        match ev.action {
            "segment_alloc" | "segment_map" => {
                let addr = ev.uint(Field::Addr)?;
                let size = ev.uint(Field::Size)?;
                if size == 0 {
                    return Err(SnapshotError::Unsupported(format!(
                        "{}: a segment of 0 bytes",
                        ev.at()
                    )));
                }
                w.alloc(ev, addr, size)?;
                if ev.action == "segment_map" {
                    mapped.insert(addr, size);
                }
            }
            "segment_free" => {
                w.free(ev.uint(Field::Addr)?);
            }
            "segment_unmap" => {
                let addr = ev.uint(Field::Addr)?;
                let end = addr.saturating_add(ev.uint(Field::Size)?);
                // The mappings that overlap [addr, end): each must lie inside it.
                let mut inside = Vec::new();
                let before = mapped.range(..addr).next_back().map(|(&a, &s)| (a, s));
                for (a, s) in before
                    .into_iter()
                    .chain(mapped.range(addr..end).map(|(&a, &s)| (a, s)))
                {
                    let a_end = a.saturating_add(s);
                    if a_end <= addr {
                        continue;
                    }
                    if a < addr || a_end > end {
                        return Err(SnapshotError::Unsupported(format!(
                            "{}: unmapping {addr:#x}..{end:#x} cuts the mapping \
                             {a:#x}..{a_end:#x} of an earlier segment_map in two; \
                             partial unmaps are not supported",
                            ev.at()
                        )));
                    }
                    inside.push(a);
                }
                if inside.is_empty() {
                    // Mapped before recording began.
                    w.skipped_frees += 1;
                }
                for a in inside {
                    mapped.remove(&a);
                    w.free(a);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_to_512_bytes() {
        assert_eq!(round_request(0), 512);
        assert_eq!(round_request(1), 512);
        assert_eq!(round_request(512), 512);
        assert_eq!(round_request(513), 1024);
        assert_eq!(round_request(u64::MAX), u64::MAX - 511);
    }

    #[test]
    fn small_blocks_split_when_512_bytes_remain() {
        let mut l = BlockLayout::new(None);
        l.segment_alloc(0, 2 << 20);
        assert_eq!(l.alloc(0, 1000), Some(1024));
        // the remainder starts at 1024
        assert_eq!(l.alloc(1024, 2 << 20), None);
        assert_eq!(l.alloc(1024, 1 << 20), Some(1 << 20));
        // (2 MiB - 1024 - 1 MiB) left at 1024 + 1 MiB: a small request of all but
        // 256 bytes of it takes it whole (256 < 512 left)
        let rest = (2 << 20) - 1024 - (1 << 20);
        assert_eq!(l.alloc(1024 + (1 << 20), rest - 256), Some(rest));
        // freeing the middle block merges nothing (neighbours allocated)
        l.free(1024);
        l.free(0);
        // 0 and 1024 merged: a 1 MiB + 1024 free block at 0
        assert_eq!(l.alloc(0, (1 << 20) + 1024), Some((1 << 20) + 1024));
    }

    #[test]
    fn large_blocks_split_only_when_more_than_1_mib_remains() {
        let mut l = BlockLayout::new(None);
        l.segment_alloc(0, 20 << 20);
        // 20 MiB - 19 MiB = 1 MiB remains: not split
        assert_eq!(l.alloc(0, 19 << 20), Some(20 << 20));
        l.free(0);
        // 2 MiB remain: split
        assert_eq!(l.alloc(0, 18 << 20), Some(18 << 20));
        assert_eq!(l.alloc(18 << 20, 2 << 20), Some(2 << 20));
        // max_split_size: no split of a request at or above it
        let mut l = BlockLayout::new(Some(4 << 20));
        l.segment_alloc(0, 20 << 20);
        assert_eq!(l.alloc(0, 4 << 20), Some(20 << 20));
        l.free(0);
        assert_eq!(l.alloc(0, 3 << 20), Some(3 << 20));
    }

    #[test]
    fn segment_free_drops_its_blocks_only() {
        let mut l = BlockLayout::new(None);
        l.segment_alloc(0, 2 << 20);
        l.segment_alloc(2 << 20, 2 << 20);
        assert_eq!(l.alloc(0, 512), Some(512));
        l.segment_free(0);
        assert_eq!(l.alloc(512, 512), None);
        // a free block of the other segment does not merge across segments
        assert_eq!(l.alloc(2 << 20, 512), Some(512));
        l.free(2 << 20);
        assert_eq!(l.alloc(2 << 20, 2 << 20), Some(2 << 20));
    }
}
