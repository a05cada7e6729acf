//! What is wrong with a trace: [`Problem`] (a line breaks a rule of the format) and
//! [`TraceError`] (a trace that could not be read or parsed).

use super::{check, Excerpt};

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
    ///
    /// [`KEYWORDS`]: super::KEYWORDS
    #[error("unknown keyword {0} (keywords: {list})", list = check::keyword_list())]
    UnknownKeyword(Excerpt),
    /// A line only a recorded trace may have (a keyword of [`KEYWORDS`] marked
    /// `recorded_only`, or a stream on an `a` or `f` line) in a trace with no
    /// `# flare-pool` header line before it.
    ///
    /// [`KEYWORDS`]: super::KEYWORDS
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
    ///
    /// [`MAX_OOM_ANSWERS`]: super::MAX_OOM_ANSWERS
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
