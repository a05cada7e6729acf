//! The format's keywords (one table: the parser, its errors and
//! `docs/trace-format.md` all take them from [`KEYWORDS`]) and the rules a trace's
//! lines must keep together, checked at parse time by following the state a replay
//! would be in (`docs/trace-format.md`, "What the parser checks"): the allocations
//! live and their tags, the tags asleep, the open retention scope, each stream's
//! marks and `done` lines, and the `oom` line waiting for its allocation. A trace
//! whose replay would fail for a reason its text shows is refused before anything
//! is replayed, with the line that breaks the rule.

use std::collections::{HashMap, HashSet};

use super::{is_legacy_stream_name, Event, Excerpt, Problem};

/// A keyword of flare-trace v1: what a line's first field says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Keyword {
    /// `a`: an allocation.
    A,
    /// `f`: a free.
    F,
    /// `r`: a live allocation used on another stream (`record_stream`).
    R,
    /// `x`: a request the recorded pool refused with out-of-memory.
    X,
    /// `done`: a stream's work the recorded pool saw complete.
    Done,
    /// `oom`: the driver's out-of-memory answers during the next allocation.
    Oom,
    /// `sleep`: a tag put to sleep.
    Sleep,
    /// `wake`: a tag woken.
    Wake,
    /// `forget`: a stream the recorded pool was told is about to be destroyed.
    Forget,
    /// `begin`: a retention scope opened.
    Begin,
    /// `finish`: the scope closed.
    Finish,
    /// `abort`: the scope closed as failed.
    Abort,
    /// `trim`: idle memory released.
    Trim,
    /// `step`: a step marker (the growth report's steps).
    Step,
}

/// One keyword of the format, as [`KEYWORDS`] lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeywordSpec {
    /// The keyword.
    pub keyword: Keyword,
    /// How it is written (`"done"`).
    pub name: &'static str,
    /// The fields it takes, as the malformed-line error says them.
    pub fields: &'static str,
    /// Whether only a recorded trace may have it: one with a `# flare-pool` header
    /// line before it (`docs/trace-format.md`, "Recorded traces"). Such a line says
    /// what a recording pool saw or was told (a stream's work complete, the
    /// driver's answers, a refused request), which a hand-written trace cannot know,
    /// or belongs to the stream-ordered and tag calls only recordings carry.
    pub recorded_only: bool,
}

/// Every keyword of flare-trace v1, in the order `docs/trace-format.md` lists them
/// (a test reads the document's table and compares): the parser knows these and no
/// others, and its unknown-keyword error names them.
pub const KEYWORDS: [KeywordSpec; 14] = [
    spec(
        Keyword::A,
        "a",
        "an id, a size in bytes, optionally a tag and then a stream",
        false,
    ),
    spec(Keyword::F, "f", "an id and optionally a stream", false),
    spec(Keyword::Begin, "begin", "no fields", false),
    spec(Keyword::Finish, "finish", "no fields", false),
    spec(Keyword::Abort, "abort", "no fields", false),
    spec(Keyword::Trim, "trim", "no fields", false),
    spec(Keyword::Step, "step", "no fields", false),
    spec(Keyword::R, "r", "an id and a stream", true),
    spec(Keyword::Done, "done", "a stream and a mark", true),
    spec(Keyword::Oom, "oom", "a count", true),
    spec(
        Keyword::X,
        "x",
        "a size in bytes, optionally a tag and then a stream",
        true,
    ),
    spec(
        Keyword::Sleep,
        "sleep",
        "a tag and offload or discard",
        true,
    ),
    spec(Keyword::Wake, "wake", "a tag", true),
    spec(Keyword::Forget, "forget", "a stream", true),
];

const fn spec(
    keyword: Keyword,
    name: &'static str,
    fields: &'static str,
    recorded_only: bool,
) -> KeywordSpec {
    KeywordSpec {
        keyword,
        name,
        fields,
        recorded_only,
    }
}

/// The keyword `token` names, if it is one of [`KEYWORDS`].
pub fn keyword(token: &str) -> Option<&'static KeywordSpec> {
    KEYWORDS.iter().find(|k| k.name == token)
}

/// The keywords as the unknown-keyword error lists them: those of every trace, then
/// those of recorded traces.
pub(super) fn keyword_list() -> String {
    let names = |recorded: bool| {
        KEYWORDS
            .iter()
            .filter(|k| k.recorded_only == recorded)
            .map(|k| k.name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("{}; recorded traces also {}", names(false), names(true))
}

/// The most out-of-memory answers one allocation gets from the driver: its create,
/// then (outside a retention scope, after releasing idle memory) one retry. An
/// allocation that succeeded got at most one (a second fails it).
const MOST_ANSWERS: u64 = super::MAX_OOM_ANSWERS;

/// The state of a trace's replay as far as its text shows it, line after line.
#[derive(Default)]
pub(super) struct Checks {
    /// The line of the `begin` of the open scope, 0 when none is open.
    pub(super) open_scope: usize,
    /// Per stream key ([`Checks::mark_key`]): marks so far (as the replay counts
    /// them) and the last `done` mark.
    marks: HashMap<u32, (u64, u64)>,
    /// The streams each live id was recorded on (`r` lines), by id index.
    recorded: HashMap<u32, Vec<u32>>,
    /// `done` lines beyond their stream's marks, checked after the next call's line:
    /// (stream key, stream index, mark, line).
    pending_done: Vec<(u32, u32, u64, usize)>,
    /// The `oom` whose allocation has not come yet: (line, count); line 0 for none.
    pending_oom: (usize, u64),
    /// Tags asleep, with the line of their `sleep`.
    sleeping: HashMap<u32, usize>,
    /// The tag of each id's allocation (0: untagged), by id index.
    tag_of: Vec<u32>,
    /// Stream indices that name the legacy stream (`0x0`, `0x1`: one stream).
    legacy: HashSet<u32>,
    /// Stream indices whose name a `forget` line gave to a new index: they get no
    /// marks (the pool no longer fences a forgotten stream).
    forgotten: HashSet<u32>,
}

impl Checks {
    /// Stream index `s` is named `name` (called once per stream, when interned).
    pub(super) fn stream_named(&mut self, s: u32, name: &str) {
        if is_legacy_stream_name(name) {
            self.legacy.insert(s);
        }
    }

    /// The rules of `event` on line `line` against the state so far, which it then
    /// changes. `stream_names` names the streams (for messages).
    ///
    /// Errors: the [`Problem`] of the first rule the line breaks; the state is then
    /// of no further use (the parse stops).
    pub(super) fn event(
        &mut self,
        line: usize,
        event: Event,
        stream_names: &[String],
    ) -> Result<(), Problem> {
        match event {
            Event::Alloc { id, .. }
            | Event::AllocTagged { id, .. }
            | Event::AllocAsync { id, .. } => {
                let tag = match event {
                    Event::AllocTagged { tag, .. } | Event::AllocAsync { tag, .. } => tag,
                    _ => 0,
                };
                self.awake(tag, "an allocation (a)")?;
                self.oom_fits("a", 1)?;
                let slot = id as usize;
                if self.tag_of.len() <= slot {
                    self.tag_of.resize(slot + 1, 0);
                }
                self.tag_of[slot] = tag;
                self.recorded.remove(&id);
            }
            Event::AllocFailed { tag, .. } => {
                self.awake(tag, "a refused request (x)")?;
                // Inside a scope the pool does not retry: one answer fails it.
                let most = if self.open_scope != 0 {
                    1
                } else {
                    MOST_ANSWERS
                };
                self.oom_fits("x", most)?;
            }
            Event::Free { id } | Event::FreeAsync { id, .. } => {
                self.awake(self.tag(id), "a free (f)")?;
                let recorded = self.recorded.remove(&id).unwrap_or_default();
                if let Event::FreeAsync { stream, .. } = event {
                    let own = self.mark_key(stream);
                    self.marks.entry(own).or_default().0 += 1;
                    for other in recorded {
                        // A forgotten stream was fenced whole at its `forget`: the
                        // pool makes no mark on it (`Pool::forget_stream`).
                        if self.forgotten.contains(&other) {
                            continue;
                        }
                        let other = self.mark_key(other);
                        if other != own {
                            self.marks.entry(other).or_default().0 += 1;
                        }
                    }
                }
            }
            Event::RecordStream { id, stream } => {
                self.awake(self.tag(id), "a record-stream (r)")?;
                let list = self.recorded.entry(id).or_default();
                if !list.contains(&stream) {
                    list.push(stream);
                }
            }
            Event::Done { stream, mark } => {
                let key = self.mark_key(stream);
                let (count, last) = self.marks.entry(key).or_default();
                if mark <= *last {
                    return Err(Problem::DoneNotIncreasing {
                        stream: name_of(stream_names, stream),
                        mark,
                        previous: *last,
                    });
                }
                *last = mark;
                if mark > *count {
                    self.pending_done.push((key, stream, mark, line));
                }
            }
            Event::Oom { count } => {
                if self.pending_oom.0 != 0 {
                    return Err(Problem::OomWithoutAllocation {
                        oom_line: self.pending_oom.0,
                    });
                }
                self.pending_oom = (line, u64::from(count));
            }
            Event::Sleep { tag, .. } => {
                if self.open_scope != 0 {
                    return Err(Problem::SleepInScope {
                        open_line: self.open_scope,
                    });
                }
                if self.sleeping.contains_key(&tag) {
                    return Err(Problem::SleepState {
                        tag,
                        sleeping: true,
                    });
                }
                self.sleeping.insert(tag, line);
            }
            Event::Wake { tag } => {
                if self.sleeping.remove(&tag).is_none() {
                    return Err(Problem::SleepState {
                        tag,
                        sleeping: false,
                    });
                }
            }
            Event::Forget { stream } => {
                // The name's later lines are a new stream's (a new index).
                self.forgotten.insert(stream);
            }
            Event::Begin => {
                if self.open_scope != 0 {
                    return Err(Problem::BeginInScope {
                        open_line: self.open_scope,
                    });
                }
                self.open_scope = line;
            }
            Event::Finish | Event::Abort => {
                if self.open_scope == 0 {
                    return Err(Problem::CloseWithoutScope {
                        keyword: if event == Event::Finish {
                            "finish"
                        } else {
                            "abort"
                        },
                    });
                }
                self.open_scope = 0;
            }
            Event::Trim => {
                if self.open_scope != 0 {
                    return Err(Problem::TrimInScope {
                        open_line: self.open_scope,
                    });
                }
            }
            // A marker: allowed anywhere a call is.
            Event::Step => {}
        }
        // An `oom` belongs to the next call's line, which must be its allocation
        // (`done` lines may come between).
        if !matches!(
            event,
            Event::Done { .. }
                | Event::Oom { .. }
                | Event::Alloc { .. }
                | Event::AllocTagged { .. }
                | Event::AllocAsync { .. }
                | Event::AllocFailed { .. }
        ) && self.pending_oom.0 != 0
        {
            return Err(Problem::OomWithoutAllocation {
                oom_line: self.pending_oom.0,
            });
        }
        if !matches!(event, Event::Done { .. } | Event::Oom { .. }) {
            self.check_pending_done(stream_names)?;
        }
        Ok(())
    }

    /// At the end of the trace: a `done` or an `oom` with no call after it.
    ///
    /// Errors: [`Problem::DoneBeyondMarks`], [`Problem::OomWithoutAllocation`].
    pub(super) fn end(&mut self, stream_names: &[String]) -> Result<(), Problem> {
        self.check_pending_done(stream_names)?;
        match self.pending_oom.0 {
            0 => Ok(()),
            oom_line => Err(Problem::OomWithoutAllocation { oom_line }),
        }
    }

    /// The tag of id `id`'s allocation.
    fn tag(&self, id: u32) -> u32 {
        self.tag_of.get(id as usize).copied().unwrap_or(0)
    }

    /// Error unless tag `tag` is awake: the pool refuses `what` while it sleeps.
    fn awake(&self, tag: u32, what: &'static str) -> Result<(), Problem> {
        match self.sleeping.get(&tag) {
            Some(&sleep_line) => Err(Problem::TagAsleep {
                what,
                tag,
                sleep_line,
            }),
            None => Ok(()),
        }
    }

    /// The allocation of the pending `oom` (a `keyword` line): it got at most
    /// `most` answers. The `oom` is then settled.
    fn oom_fits(&mut self, keyword: &'static str, most: u64) -> Result<(), Problem> {
        let (oom_line, count) = std::mem::take(&mut self.pending_oom);
        if oom_line != 0 && count > most {
            return Err(Problem::OomTooMany {
                oom_line,
                count,
                keyword,
                most,
            });
        }
        Ok(())
    }

    /// The key marks are counted under for stream index `s`: the replay's (every
    /// legacy-stream name, `0x0` or `0x1`, is one stream).
    fn mark_key(&self, s: u32) -> u32 {
        if self.legacy.contains(&s) {
            u32::MAX
        } else {
            s
        }
    }

    /// After a call's line: every `done` beyond its stream's marks before it is
    /// reached now.
    fn check_pending_done(&mut self, stream_names: &[String]) -> Result<(), Problem> {
        for (key, stream, mark, done_line) in std::mem::take(&mut self.pending_done) {
            let marks = self.marks.get(&key).map_or(0, |m| m.0);
            if mark > marks {
                return Err(Problem::DoneBeyondMarks {
                    stream: name_of(stream_names, stream),
                    mark,
                    marks,
                    done_line,
                });
            }
        }
        Ok(())
    }
}

/// Stream index `s`'s name, quoted.
fn name_of(stream_names: &[String], s: u32) -> Excerpt {
    Excerpt::new(stream_names.get(s as usize).map_or("", String::as_str))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed step is their failure
mod tests {
    use super::KEYWORDS;

    /// `docs/trace-format.md`'s keyword table lists exactly [`KEYWORDS`], in order,
    /// with the same fields and the same "recorded traces only" marks: the document
    /// cannot drift from the parser.
    #[test]
    fn the_documents_keyword_table_is_the_parsers() {
        let doc = include_str!("../../docs/trace-format.md");
        let start = doc
            .find("| keyword | fields | recorded traces only |")
            .expect("the keyword table");
        let rows: Vec<Vec<String>> = doc[start..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().trim_matches('`').to_string())
                    .collect()
            })
            .collect();
        let want: Vec<Vec<String>> = KEYWORDS
            .iter()
            .map(|k| {
                vec![
                    k.name.to_string(),
                    k.fields.to_string(),
                    if k.recorded_only { "yes" } else { "no" }.to_string(),
                ]
            })
            .collect();
        assert_eq!(rows, want);
    }
}
