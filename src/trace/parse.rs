//! The parser: reads a trace's bytes line by line into a [`Trace`], each line's form
//! checked here and the rules the lines keep together in `check.rs`.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use super::{
    check, Event, Excerpt, Keyword, Problem, RecordedConfig, Trace, TraceError,
    MAX_ALLOCATION_BYTES, MAX_OOM_ANSWERS, RECORDED_HEADER,
};

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
            Keyword::Step => {
                arity(found == 0)?;
                Event::Step
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
