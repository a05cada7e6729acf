//! flare-trace v1: the parser of allocation traces and their replay on a [`Pool`](crate::Pool).
//! `event.rs` holds the format's events, `error.rs` its errors and `excerpt.rs` the
//! excerpts they quote; `parse.rs` the parser of each line's form; `parsed.rs` a
//! parsed trace and its reference figures; `check.rs` the keywords ([`KEYWORDS`]) and
//! the rules the lines keep together; `recorded.rs` the header of recorded traces;
//! the replay is in `replay/`.
//!
//! The format is described in `docs/trace-format.md`: one event per line (a keyword
//! of [`KEYWORDS`] and its fields: `a ID BYTES`, `f ID`, `begin`, `finish`, `abort`,
//! `trim`, `step`, and in recorded traces `r`, `done`, `oom`, `x`, `sleep`, `wake`), `#`
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
//! - [`replay`] runs a trace on a pool and returns a [`ReplayReport`] (`replay/`).
//! - [`Trace::growth_report`] is the growth report of the trace's own lines
//!   (`growth.rs`; `crate::growth`): the allocations live at its end, grouped by
//!   tag, size and the step (`step` lines, else `begin` lines, else N `a` lines)
//!   they were made in.
#![forbid(unsafe_code)]

mod check;
mod error;
mod event;
mod excerpt;
mod growth;
mod parse;
mod parsed;
mod recorded;
mod replay;
pub use check::{keyword, Keyword, KeywordSpec, KEYWORDS};
pub use error::{Problem, TraceError};
pub use event::{Event, MAX_ALLOCATION_BYTES, MAX_OOM_ANSWERS};
pub use excerpt::{Excerpt, EXCERPT_CHARS};
pub(crate) use parse::is_legacy_stream_name;
pub use parse::{parse, parse_reader, parse_str};
pub use parsed::Trace;
pub use recorded::{RecordedConfig, RECORDED_HEADER, RECORDED_KEYS};
pub use replay::{
    replay, replay_as_recorded, replay_as_recorded_sampled, replay_census, replay_census_then,
    replay_observed, replay_sampled, PhysicalSample, PhysicalSamples, ReplayError, ReplayReport,
    TagReplay,
};
