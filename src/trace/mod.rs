//! flare-trace v1: the parser of allocation traces and their replay on a [`Pool`](crate::Pool).
//! This file holds the format (its events, its errors and their excerpts), the parser
//! of each line's form and the reference figures; `check.rs` the keywords
//! ([`KEYWORDS`]) and the rules the lines keep together; `recorded.rs` the header of
//! recorded traces; the replay is in `replay.rs`.
//!
//! The format is described in `docs/trace-format.md`: one event per line (a keyword
//! of [`KEYWORDS`] and its fields: `a ID BYTES`, `f ID`, `begin`, `finish`, `abort`,
//! `trim`, and in recorded traces `r`, `done`, `oom`, `x`, `sleep`, `wake`), `#`
//! comment lines, blank lines, fields separated by spaces or tabs; a UTF-8
//! byte-order mark at the start of the file is ignored.
//!
//! - [`parse`] / [`parse_str`] / [`parse_reader`] read a trace into a [`Trace`]:
//!   every event with its
//!   line number, allocation ids interned to dense `u32` indices (so a replay keeps
//!   its pointers in a `Vec`, not a map of strings). Every rule of the format is
//!   checked at parse time, with the state a replay would be in followed line after
//!   line (a trace whose replay would fail for a reason its text shows is refused);
//!   a broken rule is a [`TraceError::Parse`] naming the file, the line and the
//!   [`Problem`]. A problem quotes the offending token as an
//!   [`Excerpt`] (at most [`EXCERPT_CHARS`] characters and the token's length), so a
//!   huge line never makes a huge message.
//! - [`Trace::lower_bound_bytes`] and [`Trace::no_reuse_bytes`] are the two reference
//!   figures of a trace that any replay can be judged against.
//! - [`replay`] runs a trace on a pool and returns a [`ReplayReport`] (`replay.rs`).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::Path;

mod check;
mod recorded;
mod replay;
pub use check::{keyword, Keyword, KeywordSpec, KEYWORDS};
pub use recorded::{RecordedConfig, RECORDED_HEADER, RECORDED_KEYS};
pub use replay::{replay, replay_as_recorded, replay_census, ReplayError, ReplayReport, TagReplay};

/// Largest allocation size a trace may name, bytes (2^63).
pub const MAX_ALLOCATION_BYTES: u64 = 1 << 63;

/// The most characters of an input token that an error message quotes
/// ([`Excerpt`]): enough to recognise the token, small enough that a 100 MB line
/// gives a one-line message.
pub const EXCERPT_CHARS: usize = 40;

/// A token of the input as an error quotes it: the whole token when it has at most
/// [`EXCERPT_CHARS`] characters, else its first [`EXCERPT_CHARS`] characters and the
/// token's length in bytes. Only the quoted part is kept (copied from the input).
///
/// Displays as the quoted token (`"alloc"`), or the quoted start, `…` and the length
/// (`"aaaa…" (104857600 bytes)`). Compares equal to a `&str` that is the quoted part
/// of an uncut token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Excerpt {
    head: String,
    token_bytes: usize,
}

impl Excerpt {
    /// Quotes `token`: the whole of it, or its first [`EXCERPT_CHARS`] characters
    /// (cut on a character boundary) and its length.
    pub fn new(token: &str) -> Excerpt {
        let cut = token
            .char_indices()
            .nth(EXCERPT_CHARS)
            .map_or(token.len(), |(i, _)| i);
        Excerpt {
            head: token[..cut].to_string(),
            token_bytes: token.len(),
        }
    }

    /// The quoted part: the whole token, or its first [`EXCERPT_CHARS`] characters.
    pub fn head(&self) -> &str {
        &self.head
    }

    /// Length of the whole token, bytes (the input's, not the quoted part's).
    pub fn token_bytes(&self) -> usize {
        self.token_bytes
    }

    /// Whether the token was longer than [`EXCERPT_CHARS`] characters and only its
    /// start is quoted.
    pub fn is_cut(&self) -> bool {
        self.head.len() < self.token_bytes
    }
}

impl From<&str> for Excerpt {
    fn from(token: &str) -> Excerpt {
        Excerpt::new(token)
    }
}

impl From<String> for Excerpt {
    fn from(token: String) -> Excerpt {
        Excerpt::new(&token)
    }
}

impl PartialEq<str> for Excerpt {
    /// Whether the token was not cut and is `other`.
    fn eq(&self, other: &str) -> bool {
        !self.is_cut() && self.head == other
    }
}

impl PartialEq<&str> for Excerpt {
    /// Whether the token was not cut and is `other`.
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl fmt::Display for Excerpt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_cut() {
            write!(
                f,
                "\"{}…\" ({} bytes)",
                self.head.escape_debug(),
                self.token_bytes
            )
        } else {
            write!(f, "{:?}", self.head)
        }
    }
}

/// The largest count of an `oom N` line: the out-of-memory answers one allocation
/// of a pool gets from the driver, its create and (outside a retention scope, after
/// releasing idle memory) one retry (`Pool::allocate_raw`). An allocation that
/// succeeded got one at most: a second answer fails it (an `x` line).
pub const MAX_OOM_ANSWERS: u64 = 2;

/// One event of a trace. Allocation ids are dense indices `0..Trace::id_count()`,
/// one per distinct id token of the file (an id reused after its free keeps its
/// index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// `a ID BYTES`: allocate `bytes` bytes (`1..=2^63`) as allocation `id`.
    Alloc {
        /// Dense index of the allocation's id.
        id: u32,
        /// Requested size, bytes (not rounded).
        bytes: u64,
    },
    /// `a ID BYTES TAG` with a tag other than 0: allocate `bytes` bytes as
    /// allocation `id` for tag `tag` (`Pool::allocate_tagged_raw`; issue 15). `a ID
    /// BYTES 0` is an [`Event::Alloc`].
    AllocTagged {
        /// Dense index of the allocation's id.
        id: u32,
        /// Requested size, bytes (not rounded).
        bytes: u64,
        /// The tag, 1 to 2^32 - 1.
        tag: u32,
    },
    /// `a ID BYTES TAG STREAM`: allocate `bytes` bytes as allocation `id` for tag
    /// `tag` (0: untagged), stream-ordered on stream `stream`
    /// (`Pool::allocate_async_raw`, or `Pool::allocate_tagged_raw` with the stream;
    /// a recorded trace, `docs/trace-format.md`).
    AllocAsync {
        /// Dense index of the allocation's id.
        id: u32,
        /// Requested size, bytes (not rounded).
        bytes: u64,
        /// The tag, 0 to 2^32 - 1.
        tag: u32,
        /// Dense index of the stream's name ([`Trace::stream_name`]).
        stream: u32,
    },
    /// `f ID`: free the live allocation `id`.
    Free {
        /// Dense index of the allocation's id.
        id: u32,
    },
    /// `f ID STREAM`: free the live allocation `id` on stream `stream`
    /// (`Pool::free_async_raw`).
    FreeAsync {
        /// Dense index of the allocation's id.
        id: u32,
        /// Dense index of the stream's name.
        stream: u32,
    },
    /// `r ID STREAM`: the live allocation `id` is used on stream `stream` too
    /// (`Pool::record_stream`).
    RecordStream {
        /// Dense index of the allocation's id.
        id: u32,
        /// Dense index of the stream's name.
        stream: u32,
    },
    /// `done STREAM MARK`: the recorded pool saw the work of stream `stream` complete
    /// through its `mark`-th stream-ordered free (counted as the replay counts them:
    /// `docs/trace-format.md`, "Recorded traces").
    Done {
        /// Dense index of the stream's name.
        stream: u32,
        /// The mark, 1 or more.
        mark: u64,
    },
    /// `forget STREAM`: the recorded pool was told that stream `stream` is about to be
    /// destroyed (`Pool::forget_stream`); from the next line on its name names a new
    /// stream (a new dense index: the driver may hand the handle out again).
    Forget {
        /// Dense index of the stream's name, before the line.
        stream: u32,
    },
    /// `oom N` (N from 1 to [`MAX_OOM_ANSWERS`]; 1 before an `a` line, and before an
    /// `x` inside a retention scope): during the next allocation, the recorded pool's driver answered
    /// out-of-memory `count` times (the replay makes its next `count` handle
    /// creations fail so).
    Oom {
        /// How many times, 1 or more.
        count: u32,
    },
    /// `x BYTES [TAG [STREAM]]`: an allocation of `bytes` bytes (for `tag`, on
    /// `stream` when given) that the recorded pool refused with out-of-memory, after
    /// releasing idle memory to retry (a recorded trace: the replay makes the same
    /// request; it allocates nothing when it fails as recorded).
    AllocFailed {
        /// Requested size, bytes (not rounded).
        bytes: u64,
        /// The tag, 0 to 2^32 - 1.
        tag: u32,
        /// Dense index of the stream's name, for a stream-ordered request.
        stream: Option<u32>,
    },
    /// `sleep TAG offload|discard`: the recorded pool put tag `tag` to sleep
    /// (`Pool::sleep`; a recorded trace).
    Sleep {
        /// The tag.
        tag: u32,
        /// Whether its contents were copied to host memory (`offload`).
        offload: bool,
    },
    /// `wake TAG`: the recorded pool woke tag `tag` (`Pool::wake`).
    Wake {
        /// The tag.
        tag: u32,
    },
    /// `begin`: open a retention scope.
    Begin,
    /// `finish`: close the retention scope; retained memory is released.
    Finish,
    /// `abort`: close the retention scope as failed; retained memory is released.
    Abort,
    /// `trim`: release idle cached memory now (outside a scope).
    Trim,
}

/// What is wrong with a line of a trace.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// The line is not valid UTF-8.
    #[error("the line is not valid UTF-8")]
    NotUtf8,
    /// A known keyword with the wrong number of fields. `expected` says what the
    /// keyword takes; `found` is how many fields follow it. (The keyword is one of
    /// the format's, so it is short and quoted whole.)
    #[error(
        "malformed `{keyword}` line: expected {expected}, found {found} field(s) after the keyword"
    )]
    Malformed {
        /// The keyword of the line (`a`, `f`, `begin`, ...).
        keyword: String,
        /// What the keyword takes (`"an id and a size in bytes"`).
        expected: &'static str,
        /// Number of fields after the keyword.
        found: usize,
    },
    /// The first field is not a keyword of the format ([`KEYWORDS`]; quoted as an
    /// [`Excerpt`]).
    #[error("unknown keyword {0} (keywords: {list})", list = check::keyword_list())]
    UnknownKeyword(Excerpt),
    /// A line only a recorded trace may have (a keyword of [`KEYWORDS`] marked
    /// `recorded_only`, or a stream on an `a` or `f` line) in a trace with no
    /// `# flare-pool` header line before it.
    #[error("{what} is a line of recorded traces only, and this trace has no `# flare-pool` header line before it (docs/trace-format.md, \"Recorded traces\")")]
    RecordedOnly {
        /// What the line is (`` `done` ``, ``a stream on an `a` line``).
        what: String,
    },
    /// An allocation, free or record-stream of a tag that sleeps: the pool refuses
    /// it until the tag's `wake` (tag 0 is the untagged allocations').
    #[error("{what} of tag {tag}, which is asleep (since line {sleep_line}): the pool refuses it until the tag's wake")]
    TagAsleep {
        /// What the line is (`"a free (f)"`).
        what: &'static str,
        /// The tag.
        tag: u32,
        /// The line of the tag's `sleep`.
        sleep_line: usize,
    },
    /// A `sleep` while a retention scope is open: the pool refuses it there.
    #[error("sleep inside a retention scope (opened on line {open_line}): the pool refuses a sleep there")]
    SleepInScope {
        /// The line of the `begin` that opened the scope.
        open_line: usize,
    },
    /// An `oom N` with more answers than its allocation can have got: one for an
    /// allocation that succeeded (`a`), and for a refused one (`x`) one inside a
    /// retention scope (no retry there), else [`MAX_OOM_ANSWERS`].
    #[error("oom {count} (line {oom_line}) before an `{keyword}` line: that allocation gets at most {most} out-of-memory answer(s) from the driver")]
    OomTooMany {
        /// The line of the `oom`.
        oom_line: usize,
        /// Its count.
        count: u64,
        /// The allocation's keyword (`a` or `x`).
        keyword: &'static str,
        /// The most it can have got.
        most: u64,
    },
    /// A `forget STREAM` of a default stream (`0x0`, `0x1`, `0x2`: the legacy and
    /// per-thread streams, never destroyed; a pool refuses to forget them).
    #[error("forget of the default stream {0}, which is never destroyed")]
    ForgetDefaultStream(Excerpt),
    /// An allocation of 0 bytes.
    #[error("allocation size is 0 bytes (sizes are greater than zero)")]
    ZeroSize,
    /// An allocation size above 2^63 bytes (the token as written, as an [`Excerpt`]).
    #[error("allocation size {0} is larger than 2^63 bytes")]
    SizeTooLarge(Excerpt),
    /// An allocation tag that is not a decimal number from 0 to 2^32 - 1 (the token
    /// as written, as an [`Excerpt`]).
    #[error("allocation tag {0} is not a decimal number from 0 to 4294967295")]
    TagNotDecimal(Excerpt),
    /// An allocation size that is not a plain decimal number (the token as written,
    /// as an [`Excerpt`]).
    #[error("allocation size {0} is not a decimal number of bytes")]
    SizeNotDecimal(Excerpt),
    /// An `a` for an id that is still live.
    #[error(
        "allocation id {id} is already live (allocated on line {allocated_line} and not freed)"
    )]
    AllocLiveId {
        /// The id token (as an [`Excerpt`]).
        id: Excerpt,
        /// The line of the `a` that made it live.
        allocated_line: usize,
    },
    /// An `f` for an id that is not live (never allocated, or already freed).
    #[error("free of allocation id {id}, which is not live (never allocated, or already freed)")]
    FreeNotLive {
        /// The id token (as an [`Excerpt`]).
        id: Excerpt,
    },
    /// An `r` for an id that is not live (never allocated, or already freed).
    #[error("record-stream (r) of allocation id {id}, which is not live (never allocated, or already freed)")]
    RecordNotLive {
        /// The id token (as an [`Excerpt`]).
        id: Excerpt,
    },
    /// A `done STREAM MARK` whose mark is not above the stream's previous `done`
    /// (a pool writes one only when its stream's completed mark advances).
    #[error("done {stream} {mark} after done {stream} {previous}: a stream's done marks increase")]
    DoneNotIncreasing {
        /// The stream name (as an [`Excerpt`]).
        stream: Excerpt,
        /// This line's mark.
        mark: u64,
        /// The stream's previous `done` mark.
        previous: u64,
    },
    /// A `done STREAM MARK` for a mark the stream does not have by the end of the
    /// next call's line (a pool learns of a mark's completion during the call that
    /// makes it at the latest).
    #[error("done {stream} {mark} (line {done_line}): the stream has {marks} marks by the next call's line")]
    DoneBeyondMarks {
        /// The stream name (as an [`Excerpt`]).
        stream: Excerpt,
        /// The `done` line's mark.
        mark: u64,
        /// The stream's marks by the end of the next call's line.
        marks: u64,
        /// The line of the `done`.
        done_line: usize,
    },
    /// A `sleep` line's mode that is neither `offload` nor `discard`.
    #[error("sleep mode {0} is neither offload nor discard")]
    SleepMode(Excerpt),
    /// A `sleep` of a tag already asleep, or a `wake` of a tag awake.
    #[error("{} of tag {tag}, which is {}", if *sleeping { "sleep" } else { "wake" }, if *sleeping { "asleep already" } else { "not asleep" })]
    SleepState {
        /// The tag.
        tag: u32,
        /// Whether the line is a `sleep` (of a sleeping tag); else a `wake` (of an
        /// awake one).
        sleeping: bool,
    },
    /// An `oom N` that no allocation (`a` or `x`) follows as the next call's line
    /// (the recorded pool writes it just before the allocation it happened in).
    #[error("oom (line {oom_line}) is not followed by an allocation (a or x): it belongs to the next allocation's call")]
    OomWithoutAllocation {
        /// The line of the `oom`.
        oom_line: usize,
    },
    /// A `begin` while a scope opened by an earlier `begin` is still open (retention
    /// scopes do not nest).
    #[error(
        "begin while a retention scope is open (opened on line {open_line}); scopes do not nest"
    )]
    BeginInScope {
        /// The line of the `begin` that opened the scope.
        open_line: usize,
    },
    /// A `finish` or `abort` with no scope open.
    #[error("{keyword} with no retention scope open")]
    CloseWithoutScope {
        /// `finish` or `abort`.
        keyword: &'static str,
    },
    /// More than 2^32 distinct allocation ids (ids are interned to `u32`).
    #[error("more than 2^32 distinct allocation ids")]
    TooManyIds,
    /// A field that must be a decimal number is not one (or is out of range): the
    /// field's name and the token as written.
    #[error("{field} {token} is not a decimal number from {min} to {max}")]
    NotDecimal {
        /// What the field is (`"mark"`, `"count"`).
        field: &'static str,
        /// The token (as an [`Excerpt`]).
        token: Excerpt,
        /// The smallest value allowed.
        min: u64,
        /// The largest value allowed.
        max: u64,
    },
    /// A `# flare-pool` header line (a recorded pool's configuration) with a value
    /// that cannot be read, a key missing or repeated, or a second such line.
    #[error("recorded configuration: {0}")]
    RecordedConfig(String),
    /// A `trim` inside a retention scope (nothing retained may be released there).
    #[error("trim inside a retention scope (opened on line {open_line}); nothing retained is released there")]
    TrimInScope {
        /// The line of the `begin` that opened the scope.
        open_line: usize,
    },
}

/// A trace that could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{file}: cannot read the trace: {source}")]
    Io {
        /// The file as given.
        file: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A line breaks a rule of the format.
    #[error("{file}:{line}: {problem}")]
    Parse {
        /// The file (or name) of the trace.
        file: String,
        /// Line number, 1-based.
        line: usize,
        /// What is wrong.
        problem: Problem,
    },
}

impl TraceError {
    /// The line of a parse error (1-based), `None` for a read error.
    pub fn line(&self) -> Option<usize> {
        match self {
            TraceError::Parse { line, .. } => Some(*line),
            TraceError::Io { .. } => None,
        }
    }

    /// The problem of a parse error, `None` for a read error.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            TraceError::Parse { problem, .. } => Some(problem),
            TraceError::Io { .. } => None,
        }
    }
}

/// A parsed, valid trace: its events in order, each with its line number, and the
/// id names. Built only by [`parse`] / [`parse_str`], so every `Free` names a live
/// allocation and scopes are well nested.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    name: String,
    events: Vec<Event>,
    lines: Vec<usize>,
    id_names: Vec<String>,
    allocations: usize,
    has_scope_events: bool,
    /// Whether any `sleep` line is there.
    has_sleep: bool,
    /// Whether an `a` line carries a tag other than 0.
    has_tags: bool,
    /// The stream names of stream-ordered lines, by dense index.
    stream_names: Vec<String>,
    /// The `# flare-pool` header of a recorded trace.
    recorded: Option<RecordedConfig>,
}

/// Reads and parses the trace file at `path`. The trace's name is the path as given.
///
/// Errors: [`TraceError::Io`] when the file cannot be read; [`TraceError::Parse`]
/// for the first line that breaks a rule of the format.
pub fn parse(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
    let path = path.as_ref();
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| TraceError::Io {
        file: file.clone(),
        source,
    })?;
    parse_bytes(file, &bytes)
}

/// Reads a whole trace from `reader` (standard input, say) and parses it; `name`
/// names the trace in errors and reports (`flare-replay` calls standard input
/// `<stdin>`). The text is taken as bytes, as [`parse`] takes a file's: a line that
/// is not UTF-8 is a [`Problem::NotUtf8`] on that line.
///
/// Errors: [`TraceError::Io`] when reading fails; [`TraceError::Parse`] for the first
/// line that breaks a rule of the format.
pub fn parse_reader(name: &str, mut reader: impl Read) -> Result<Trace, TraceError> {
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .map_err(|source| TraceError::Io {
            file: name.to_string(),
            source,
        })?;
    parse_bytes(name.to_string(), &bytes)
}

/// Parses trace text; `name` names the trace in errors and reports (a file name,
/// say).
///
/// Errors: [`TraceError::Parse`] for the first line that breaks a rule of the format.
pub fn parse_str(name: &str, text: &str) -> Result<Trace, TraceError> {
    parse_bytes(name.to_string(), text.as_bytes())
}

/// The parser's state: ids interned so far and which are live, and the rules the
/// lines keep together (`check.rs`).
struct Parser {
    trace: Trace,
    ids: HashMap<String, u32>,
    /// Stream names interned so far.
    streams: HashMap<String, u32>,
    /// For each id index: the line of the `a` that made it live, 0 when not live.
    live_since: Vec<usize>,
    /// The replay's state as the text shows it (scope, tags asleep, marks, `oom`).
    checks: check::Checks,
}

/// The UTF-8 byte-order mark, ignored at the start of a trace.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

fn parse_bytes(name: String, bytes: &[u8]) -> Result<Trace, TraceError> {
    let bytes = bytes.strip_prefix(UTF8_BOM).unwrap_or(bytes);
    let mut p = Parser {
        trace: Trace {
            name,
            events: Vec::with_capacity(bytes.len() / 12),
            lines: Vec::with_capacity(bytes.len() / 12),
            id_names: Vec::new(),
            allocations: 0,
            has_scope_events: false,
            has_sleep: false,
            has_tags: false,
            stream_names: Vec::new(),
            recorded: None,
        },
        ids: HashMap::new(),
        streams: HashMap::new(),
        live_since: Vec::new(),
        checks: check::Checks::default(),
    };
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = i + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let result = match std::str::from_utf8(raw) {
            Ok(text) => p.line(line, text),
            Err(_) => Err(Problem::NotUtf8),
        };
        if let Err(problem) = result {
            return Err(TraceError::Parse {
                file: p.trace.name,
                line,
                problem,
            });
        }
    }
    // A `done` or an `oom` with no call after it.
    if let Err(problem) = p.checks.end(&p.trace.stream_names) {
        return Err(TraceError::Parse {
            file: p.trace.name,
            line: p.trace.lines.last().copied().unwrap_or(0),
            problem,
        });
    }
    Ok(p.trace)
}

/// Whether a stream name is the legacy default stream: its value (hex with `0x`, or
/// decimal) is 0 or 1, as for the pool.
pub(crate) fn is_legacy_stream_name(name: &str) -> bool {
    stream_name_value(name).is_some_and(|v| v <= 1)
}

/// Whether a stream name is a default stream's (the legacy stream, or
/// `CU_STREAM_PER_THREAD`, 2): never destroyed, never forgotten.
fn is_default_stream_name(name: &str) -> bool {
    stream_name_value(name).is_some_and(|v| v <= 2)
}

/// The handle a stream name writes (hex with `0x`, else decimal), if it is a number.
fn stream_name_value(name: &str) -> Option<u64> {
    match name.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => name.parse::<u64>().ok(),
    }
}

fn is_sep(c: char) -> bool {
    c == ' ' || c == '\t'
}

impl Parser {
    fn line(&mut self, line: usize, text: &str) -> Result<(), Problem> {
        let text = text.trim_matches(is_sep);
        if let Some(header) = text.strip_prefix(RECORDED_HEADER) {
            if self.trace.recorded.is_some() {
                // Two recordings joined, or an edited file: which one holds?
                return Err(Problem::RecordedConfig(
                    "a second `# flare-pool` header (a recorded trace has one)".into(),
                ));
            }
            self.trace.recorded = Some(RecordedConfig::parse(header)?);
            return Ok(());
        }
        if text.is_empty() || text.starts_with('#') {
            return Ok(());
        }
        let mut fields = text.split(is_sep).filter(|f| !f.is_empty());
        let token = fields.next().unwrap_or("");
        let mut args: [&str; 4] = ["", "", "", ""];
        let mut found = 0;
        for f in fields {
            if found < args.len() {
                args[found] = f;
            }
            found += 1;
        }
        let spec =
            check::keyword(token).ok_or_else(|| Problem::UnknownKeyword(Excerpt::new(token)))?;
        let recording = self.trace.recorded.is_some();
        if spec.recorded_only && !recording {
            return Err(Problem::RecordedOnly {
                what: format!("`{}`", spec.name),
            });
        }
        let arity = |ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(Problem::Malformed {
                    keyword: spec.name.to_string(),
                    expected: spec.fields,
                    found,
                })
            }
        };
        // A stream field (on `a` and `f`) makes a line stream-ordered: recorded
        // traces only.
        let stream_field = |at: usize| {
            if recording {
                Ok(())
            } else {
                Err(Problem::RecordedOnly {
                    what: format!("a stream (field {}) on an `{}` line", at + 1, spec.name),
                })
            }
        };
        let event = match spec.keyword {
            Keyword::A => {
                arity((2..=4).contains(&found))?;
                let bytes = parse_size(args[1])?;
                let tag = if found >= 3 { parse_tag(args[2])? } else { 0 };
                let stream = if found == 4 {
                    stream_field(3)?;
                    Some(self.stream(args[3])?)
                } else {
                    None
                };
                let id = self.intern(args[0])?;
                let slot = id as usize;
                let since = self.live_since.get(slot).copied().unwrap_or(0);
                if since != 0 {
                    return Err(Problem::AllocLiveId {
                        id: Excerpt::new(args[0]),
                        allocated_line: since,
                    });
                }
                if let Some(s) = self.live_since.get_mut(slot) {
                    *s = line;
                }
                self.trace.allocations += 1;
                if tag != 0 {
                    self.trace.has_tags = true;
                }
                match stream {
                    Some(stream) => Event::AllocAsync {
                        id,
                        bytes,
                        tag,
                        stream,
                    },
                    None if tag == 0 => Event::Alloc { id, bytes },
                    None => Event::AllocTagged { id, bytes, tag },
                }
            }
            Keyword::F => {
                arity(found == 1 || found == 2)?;
                let stream = if found == 2 {
                    stream_field(1)?;
                    Some(self.stream(args[1])?)
                } else {
                    None
                };
                let id = self.live_id(args[0])?;
                if let Some(since) = self.live_since.get_mut(id as usize) {
                    *since = 0;
                }
                match stream {
                    Some(stream) => Event::FreeAsync { id, stream },
                    None => Event::Free { id },
                }
            }
            Keyword::R => {
                arity(found == 2)?;
                let stream = self.stream(args[1])?;
                let id = self.live_id(args[0]).map_err(|_| Problem::RecordNotLive {
                    id: Excerpt::new(args[0]),
                })?;
                Event::RecordStream { id, stream }
            }
            Keyword::X => {
                arity((1..=3).contains(&found))?;
                let bytes = parse_size(args[0])?;
                let tag = if found >= 2 { parse_tag(args[1])? } else { 0 };
                let stream = if found == 3 {
                    Some(self.stream(args[2])?)
                } else {
                    None
                };
                Event::AllocFailed { bytes, tag, stream }
            }
            Keyword::Sleep => {
                arity(found == 2)?;
                let tag = parse_tag(args[0])?;
                let offload = match args[1] {
                    "offload" => true,
                    "discard" => false,
                    other => {
                        return Err(Problem::SleepMode(Excerpt::new(other)));
                    }
                };
                self.trace.has_sleep = true;
                Event::Sleep { tag, offload }
            }
            Keyword::Wake => {
                arity(found == 1)?;
                Event::Wake {
                    tag: parse_tag(args[0])?,
                }
            }
            Keyword::Done => {
                arity(found == 2)?;
                let stream = self.stream(args[0])?;
                let mark = parse_decimal("mark", args[1], 1, u64::MAX)?;
                Event::Done { stream, mark }
            }
            Keyword::Forget => {
                arity(found == 1)?;
                if is_default_stream_name(args[0]) {
                    return Err(Problem::ForgetDefaultStream(Excerpt::new(args[0])));
                }
                let stream = self.stream(args[0])?;
                // The name's next use is a new stream: a new index, new marks.
                self.streams.remove(args[0]);
                Event::Forget { stream }
            }
            Keyword::Oom => {
                arity(found == 1)?;
                // An allocation asks the driver for a handle twice at most (a create,
                // a retry after releasing): a larger count was not recorded by a
                // pool, and replaying it would inject that many failures.
                let count = parse_decimal("count", args[0], 1, MAX_OOM_ANSWERS)?;
                Event::Oom {
                    count: u32::try_from(count).unwrap_or(u32::MAX),
                }
            }
            Keyword::Begin => {
                arity(found == 0)?;
                Event::Begin
            }
            Keyword::Finish => {
                arity(found == 0)?;
                Event::Finish
            }
            Keyword::Abort => {
                arity(found == 0)?;
                Event::Abort
            }
            Keyword::Trim => {
                arity(found == 0)?;
                Event::Trim
            }
        };
        self.checks.event(line, event, &self.trace.stream_names)?;
        if matches!(event, Event::Begin | Event::Finish | Event::Abort) {
            self.trace.has_scope_events = true;
        }
        self.trace.events.push(event);
        self.trace.lines.push(line);
        Ok(())
    }

    /// The dense index of live id `token`.
    fn live_id(&self, token: &str) -> Result<u32, Problem> {
        self.ids
            .get(token)
            .copied()
            .filter(|&id| self.live_since.get(id as usize).is_some_and(|&s| s != 0))
            .ok_or_else(|| Problem::FreeNotLive {
                id: Excerpt::new(token),
            })
    }

    /// The dense index of stream name `token`, interning it on first sight.
    fn stream(&mut self, token: &str) -> Result<u32, Problem> {
        if let Some(&s) = self.streams.get(token) {
            return Ok(s);
        }
        let s = u32::try_from(self.trace.stream_names.len()).map_err(|_| Problem::TooManyIds)?;
        self.streams.insert(token.to_string(), s);
        self.trace.stream_names.push(token.to_string());
        self.checks.stream_named(s, token);
        Ok(s)
    }

    /// The dense index of `token`, interning it on first sight.
    fn intern(&mut self, token: &str) -> Result<u32, Problem> {
        if let Some(&id) = self.ids.get(token) {
            return Ok(id);
        }
        let id = u32::try_from(self.trace.id_names.len()).map_err(|_| Problem::TooManyIds)?;
        self.ids.insert(token.to_string(), id);
        self.trace.id_names.push(token.to_string());
        self.live_since.push(0);
        Ok(id)
    }
}

/// A decimal field from `min` to `max`.
fn parse_decimal(field: &'static str, token: &str, min: u64, max: u64) -> Result<u64, Problem> {
    let bad = || Problem::NotDecimal {
        field,
        token: Excerpt::new(token),
        min,
        max,
    };
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match token.parse::<u64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(bad()),
    }
}

/// A size field: plain decimal digits, `1..=2^63`.
/// A tag field: decimal digits only, at most `u32::MAX`.
fn parse_tag(token: &str) -> Result<u32, Problem> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::TagNotDecimal(Excerpt::new(token)));
    }
    token
        .parse::<u32>()
        .map_err(|_| Problem::TagNotDecimal(Excerpt::new(token)))
}

fn parse_size(token: &str) -> Result<u64, Problem> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::SizeNotDecimal(Excerpt::new(token)));
    }
    match token.parse::<u64>() {
        Ok(0) => Err(Problem::ZeroSize),
        Ok(n) if n <= MAX_ALLOCATION_BYTES => Ok(n),
        _ => Err(Problem::SizeTooLarge(Excerpt::new(token))),
    }
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

impl fmt::Display for Event {
    /// Writes the event as a trace line would, with its dense id index
    /// (`a 3 2097152`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Alloc { id, bytes } => write!(f, "a {id} {bytes}"),
            Event::AllocTagged { id, bytes, tag } => write!(f, "a {id} {bytes} {tag}"),
            Event::AllocAsync {
                id,
                bytes,
                tag,
                stream,
            } => write!(f, "a {id} {bytes} {tag} s{stream}"),
            Event::Free { id } => write!(f, "f {id}"),
            Event::FreeAsync { id, stream } => write!(f, "f {id} s{stream}"),
            Event::RecordStream { id, stream } => write!(f, "r {id} s{stream}"),
            Event::Done { stream, mark } => write!(f, "done s{stream} {mark}"),
            Event::Forget { stream } => write!(f, "forget s{stream}"),
            Event::Oom { count } => write!(f, "oom {count}"),
            Event::Sleep { tag, offload } => {
                write!(
                    f,
                    "sleep {tag} {}",
                    if *offload { "offload" } else { "discard" }
                )
            }
            Event::Wake { tag } => write!(f, "wake {tag}"),
            Event::AllocFailed { bytes, tag, stream } => match stream {
                Some(s) => write!(f, "x {bytes} {tag} s{s}"),
                None if *tag != 0 => write!(f, "x {bytes} {tag}"),
                None => write!(f, "x {bytes}"),
            },
            Event::Begin => f.write_str("begin"),
            Event::Finish => f.write_str("finish"),
            Event::Abort => f.write_str("abort"),
            Event::Trim => f.write_str("trim"),
        }
    }
}
