//! What the trace parser checks beyond each line's own form (issue 34, item 3;
//! `docs/trace-format.md`, "What the parser checks"): a trace whose replay would
//! fail for a reason its text shows is refused at parse time, naming the line, so a
//! bad trace replays nothing. And the one list of keywords.

use flare_package::trace::{self, Problem, TraceError, KEYWORDS};

/// The `# flare-pool` header of a recorded trace (every key).
const POOL: &str = "# flare-pool policy=best-fit granularity=2097152 device_total=1073741824 \
    release_threshold=0 best_fit_waste_percent=30 cross_stream=when-complete \
    segment_whole_threshold=18446744073709551615 thread_cache_entries=0 \
    thread_cache_bytes=0 device=0 peers=none\n";

/// `text` as a recorded trace: the header on line 1, `text` from line 2.
fn recorded(text: &str) -> String {
    format!("{POOL}{text}")
}

/// The (line, problem) of `text`'s parse error; the message names the file and line.
#[track_caller]
fn refused(text: &str) -> (usize, Problem) {
    match trace::parse_str("t.trace", text) {
        Err(TraceError::Parse { line, problem, .. }) => {
            let msg = TraceError::Parse {
                file: "t.trace".into(),
                line,
                problem: problem.clone(),
            }
            .to_string();
            assert!(msg.starts_with(&format!("t.trace:{line}: ")), "{msg}");
            (line, problem)
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

/// An allocation of a tag that sleeps: `Pool::allocate_tagged_raw` refuses it
/// (`Error::TagState`), so the replay would stop there with an error. Tag 0 (the
/// untagged allocations) too, stream-ordered too, and a refused request (`x`) of
/// the tag. Woken, the tag allocates again.
#[test]
fn an_allocation_of_a_sleeping_tag_is_refused() {
    for (line4, what) in [
        ("a 2 4096 1", "an allocation (a)"),
        ("a 2 4096 1 0x5", "an allocation (a)"),
        ("x 4096 1", "a refused request (x)"),
    ] {
        let (line, p) = refused(&recorded(&format!(
            "a 1 4096 1\nsleep 1 offload\n{line4}\n"
        )));
        assert_eq!(line, 4, "{line4}");
        assert_eq!(
            p,
            Problem::TagAsleep {
                what,
                tag: 1,
                sleep_line: 3
            },
            "{line4}"
        );
        assert!(
            p.to_string()
                .contains("of tag 1, which is asleep (since line 3)"),
            "{p}"
        );
    }
    let (line, p) = refused(&recorded("sleep 0 discard\na 1 4096\n"));
    assert_eq!(
        (line, &p),
        (
            3,
            &Problem::TagAsleep {
                what: "an allocation (a)",
                tag: 0,
                sleep_line: 2
            }
        )
    );
    assert!(trace::parse_str(
        "t",
        &recorded("a 1 4096 1\nsleep 1 offload\na 2 4096 2\nwake 1\na 3 4096 1\n")
    )
    .is_ok());
}

/// A free (synchronous or stream-ordered) or a record-stream of a sleeping tag's
/// allocation: `Pool::free_raw` / `free_async_raw` / `record_stream` refuse it.
#[test]
fn a_free_of_a_sleeping_tags_allocation_is_refused() {
    for (line4, what) in [
        ("f 1", "a free (f)"),
        ("f 1 0x5", "a free (f)"),
        ("r 1 0x5", "a record-stream (r)"),
    ] {
        let (line, p) = refused(&recorded(&format!(
            "a 1 4096 7\nsleep 7 discard\n{line4}\n"
        )));
        assert_eq!(line, 4, "{line4}");
        assert_eq!(
            p,
            Problem::TagAsleep {
                what,
                tag: 7,
                sleep_line: 3
            },
            "{line4}"
        );
    }
    // Another tag's allocation frees while tag 7 sleeps; tag 7's after its wake.
    assert!(trace::parse_str(
        "t",
        &recorded("a 1 4096 7\na 2 4096\nsleep 7 discard\nf 2\nwake 7\nf 1\n")
    )
    .is_ok());
}

/// A `sleep` inside a retention scope: `Pool::sleep` refuses it (`ScopeState`).
#[test]
fn a_sleep_inside_a_scope_is_refused() {
    let (line, p) = refused(&recorded("begin\na 1 4096 1\nsleep 1 offload\n"));
    assert_eq!(line, 4);
    assert_eq!(p, Problem::SleepInScope { open_line: 2 });
    assert!(p.to_string().contains("opened on line 2"), "{p}");
    assert!(trace::parse_str(
        "t",
        &recorded("begin\na 1 4096 1\nfinish\nsleep 1 offload\n")
    )
    .is_ok());
}

/// `oom N` with more answers than its allocation can have got: an allocation that
/// succeeded (`a`) got one at most (the pool retries once; a second answer fails
/// it), a refused one (`x`) two, or one inside a scope (no retry there). The replay
/// would inject the surplus: the allocation fails where it succeeded, or the
/// surplus fails a later call.
#[test]
fn an_oom_count_its_allocation_cannot_have_got_is_refused() {
    let (line, p) = refused(&recorded("a 1 4096\noom 2\na 2 4096\n"));
    assert_eq!(line, 4);
    assert_eq!(
        p,
        Problem::OomTooMany {
            oom_line: 3,
            count: 2,
            keyword: "a",
            most: 1
        }
    );
    assert!(p.to_string().contains("at most 1"), "{p}");
    let (line, p) = refused(&recorded("begin\noom 2\nx 4096\n"));
    assert_eq!(line, 4);
    assert!(
        matches!(
            p,
            Problem::OomTooMany {
                most: 1,
                keyword: "x",
                ..
            }
        ),
        "{p:?}"
    );
    assert!(trace::parse_str("t", &recorded("oom 2\nx 4096\noom 1\na 1 4096\n")).is_ok());
    assert!(trace::parse_str("t", &recorded("begin\noom 1\nx 4096\noom 1\na 1 4096\n")).is_ok());
}

/// A recorded configuration no simulated pool takes: a device or peer ordinal of
/// 128 or more (`SIM_MAX_DEVICES`). Pool creation would fail, after the traces
/// before it replayed; the header's line is refused.
#[test]
fn a_peer_beyond_the_simulated_machine_is_refused() {
    for (from, to) in [("peers=none", "peers=1,129"), ("device=0", "device=128")] {
        let (line, p) = refused(&format!(
            "# flare-trace v1\n{}a 1 4096\n",
            POOL.replace(from, to)
        ));
        assert_eq!(line, 2, "{to}");
        let msg = p.to_string();
        assert!(matches!(p, Problem::RecordedConfig(_)), "{p:?}");
        assert!(msg.contains("no simulated pool replays it"), "{msg}");
        assert!(msg.contains("at most 128"), "{msg}");
    }
    assert!(trace::parse_str("t", &POOL.replace("peers=none", "peers=1,127")).is_ok());
}

/// One list of keywords: the parser takes each of [`KEYWORDS`] (the recorded ones
/// in a recorded trace), and its unknown-keyword error names all of them.
#[test]
fn the_unknown_keyword_error_names_every_keyword() {
    let (line, p) = refused("a 1 5\nmalloc 2 5\n");
    assert_eq!(line, 2);
    let msg = p.to_string();
    for k in &KEYWORDS {
        assert!(
            msg.contains(&format!(" {},", k.name))
                || msg.contains(&format!(" {})", k.name))
                || msg.contains(&format!(" {};", k.name)),
            "{} in {msg}",
            k.name
        );
    }
    assert_eq!(KEYWORDS.len(), 14);
    let names: Vec<&str> = KEYWORDS.iter().map(|k| k.name).collect();
    for name in [
        "a", "f", "r", "x", "done", "oom", "sleep", "wake", "forget", "begin", "finish", "abort",
        "trim", "step",
    ] {
        assert!(names.contains(&name), "{name}");
        assert_eq!(trace::keyword(name).map(|k| k.name), Some(name));
    }
    assert_eq!(trace::keyword("alloc"), None);
    // Every keyword parses, in a recorded trace.
    let every = "a 1 4096 1\na 2 4096 0 0x5\nr 2 0x6\nf 2 0x5\ndone 0x6 1\noom 1\nx 4096\n\
                 sleep 1 offload\nwake 1\nforget 0x5\nbegin\nabort\nbegin\nfinish\ntrim\n";
    let t = trace::parse_str("t", &recorded(every)).unwrap();
    assert_eq!(t.len(), 15);
}

/// The lines of recorded traces (`r`, `x`, `done`, `oom`, `sleep`, `wake`, and a
/// stream on an `a` or `f` line) in a trace with no `# flare-pool` header before
/// them: refused, naming the line (a stray `x 2` in a hand-written trace used to
/// replay as two extra mappings). With the header they parse.
#[test]
fn a_recorded_only_line_in_a_plain_trace_is_refused() {
    for (text, what) in [
        ("a 1 4096\nr 1 0x5\n", "`r`"),
        ("a 1 4096\nx 2\n", "`x`"),
        ("a 1 4096\ndone 0x5 1\n", "`done`"),
        ("a 1 4096\noom 1\n", "`oom`"),
        ("a 1 4096\nsleep 0 offload\n", "`sleep`"),
        ("a 1 4096\nwake 0\n", "`wake`"),
        ("a 1 4096\nforget 0x5\n", "`forget`"),
        (
            "a 1 4096\na 2 4096 0 0x5\n",
            "a stream (field 4) on an `a` line",
        ),
        ("a 1 4096\nf 1 0x5\n", "a stream (field 2) on an `f` line"),
    ] {
        let (line, p) = refused(text);
        assert_eq!(line, 2, "{text:?}");
        assert_eq!(p, Problem::RecordedOnly { what: what.into() }, "{text:?}");
        assert!(
            p.to_string()
                .contains("no `# flare-pool` header line before it"),
            "{p}"
        );
    }
    // The header after the line does not make it a recording's.
    let (line, _) = refused(&format!("x 2\n{POOL}"));
    assert_eq!(line, 1);
    assert!(trace::parse_str("t", &recorded("a 1 4096\nx 2\n")).is_ok());
}

/// A `# flare-pool` header whose value cannot be read is refused with a message of
/// bounded length: the value is quoted by its start and its length (a fuzzer's
/// 100,000-byte value gave a 100 KB message before).
#[test]
fn an_unreadable_header_value_is_quoted_shortly() {
    let long = "x".repeat(100_000);
    let text = format!("# flare-pool policy=exact segment_whole_threshold={long}\na 1 4096\n");
    let err = trace::parse_str("t", &text).unwrap_err().to_string();
    assert!(
        err.len() < 400,
        "{} bytes: {}",
        err.len(),
        &err[..400.min(err.len())]
    );
    assert!(err.contains("segment_whole_threshold="), "{err}");
    assert!(err.contains("(100000 bytes)"), "{err}");
}
