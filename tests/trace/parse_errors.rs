//! The flare-trace v1 parser: every error rule (with its line number and problem),
//! comments, blank lines, tabs, id reuse, and the reference figures of the shipped
//! traces against `tests/data/README.md`.

use crate::common;

use common::{data, GIB, GRANULARITY, SHIPPED};
use flare_package::trace::{self, Event, Problem, TraceError, MAX_ALLOCATION_BYTES};

/// The `# flare-pool` header of a recorded trace (every key), which the lines of
/// recorded traces need before them.
const POOL: &str = "# flare-pool policy=exact granularity=2097152 device_total=150323855360 \
    release_threshold=0 best_fit_waste_percent=30 cross_stream=when-complete \
    segment_whole_threshold=18446744073709551615 thread_cache_entries=32 \
    thread_cache_bytes=1073741824 device=0 peers=none\n";

/// `text` as a recorded trace: [`POOL`] on line 1, `text` from line 2.
fn recorded(text: &str) -> String {
    format!("{POOL}{text}")
}

/// Parses `text` and returns its error's (line, problem), checking that the message
/// names the file and the line.
fn error_of(text: &str) -> (usize, Problem) {
    let err = trace::parse_str("test.trace", text).expect_err("the trace must be rejected");
    let msg = err.to_string();
    match err {
        TraceError::Parse {
            file,
            line,
            problem,
        } => {
            assert_eq!(file, "test.trace");
            assert!(
                msg.starts_with(&format!("test.trace:{line}: ")),
                "message {msg:?}"
            );
            assert!(msg.contains(&problem.to_string()), "message {msg:?}");
            (line, problem)
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn parses_every_keyword_with_line_numbers() {
    let text = "# flare-trace v1\n# a comment\n\na 1 33554432\na 2 2097152\nf 1\nbegin\nfinish\nbegin\nabort\ntrim\n";
    let t = trace::parse_str("ok.trace", text).unwrap();
    assert_eq!(t.name(), "ok.trace");
    assert_eq!(
        t.events(),
        &[
            Event::Alloc {
                id: 0,
                bytes: 33554432
            },
            Event::Alloc {
                id: 1,
                bytes: 2097152
            },
            Event::Free { id: 0 },
            Event::Begin,
            Event::Finish,
            Event::Begin,
            Event::Abort,
            Event::Trim,
        ]
    );
    assert_eq!(t.lines(), &[4, 5, 6, 7, 8, 9, 10, 11]);
    assert_eq!(t.len(), 8);
    assert_eq!(t.allocations(), 2);
    assert_eq!(t.id_count(), 2);
    assert_eq!(t.id_name(0), Some("1"));
    assert_eq!(t.id_name(1), Some("2"));
    assert_eq!(t.id_name(2), None);
    assert!(t.has_scope_events());
    let pairs: Vec<(usize, Event)> = t.iter().collect();
    assert_eq!(pairs[2], (6, Event::Free { id: 0 }));
}

#[test]
fn comments_blank_lines_tabs_and_crlf() {
    let text =
        "  # indented comment\n\t\n   \na\t7\t\t4096  \r\n\t f \t7\r\n#a 1 0 (commented out)\n";
    let t = trace::parse_str("ws.trace", text).unwrap();
    assert_eq!(
        t.events(),
        &[Event::Alloc { id: 0, bytes: 4096 }, Event::Free { id: 0 }]
    );
    assert_eq!(t.lines(), &[4, 5]);
    assert!(!t.has_scope_events());
    assert!(trace::parse_str("empty", "").unwrap().is_empty());
    assert!(
        trace::parse_str("comments", "# flare-trace v1\n# nothing\n")
            .unwrap()
            .is_empty()
    );
}

#[test]
fn id_reused_after_free_keeps_its_index() {
    let t = trace::parse_str("reuse", "a x 1\nf x\na x 2\na y 3\nf x\nf y\na x 4\n").unwrap();
    assert_eq!(t.id_count(), 2);
    assert_eq!(
        t.events(),
        &[
            Event::Alloc { id: 0, bytes: 1 },
            Event::Free { id: 0 },
            Event::Alloc { id: 0, bytes: 2 },
            Event::Alloc { id: 1, bytes: 3 },
            Event::Free { id: 0 },
            Event::Free { id: 1 },
            Event::Alloc { id: 0, bytes: 4 },
        ]
    );
}

#[test]
fn ids_are_any_token() {
    let t = trace::parse_str("ids", "a 0x7f00:blk#3 10\nf 0x7f00:blk#3\n").unwrap();
    assert_eq!(t.id_name(0), Some("0x7f00:blk#3"));
}

#[test]
fn malformed_lines() {
    let cases: [(&str, &str, usize); 8] = [
        ("a 1 5\na 2\n", "a", 1),
        // A third field is a tag (issue 15), a fourth a stream (issue 17, recorded
        // traces); a fifth is one too many.
        ("a 1 5 6 7 8\n", "a", 5),
        ("a\n", "a", 0),
        ("a 1 5\nf\n", "f", 0),
        // A second field is a stream (issue 17); a third is one too many.
        ("a 1 5\nf 1 2 3\n", "f", 3),
        ("begin now\n", "begin", 1),
        ("begin\nfinish 1\n", "finish", 1),
        ("trim all\n", "trim", 1),
    ];
    for (text, kw, found_fields) in cases {
        let want_line = text.lines().count();
        let (line, problem) = error_of(text);
        assert_eq!(line, want_line, "{text:?}");
        match problem {
            Problem::Malformed { keyword, found, .. } => {
                assert_eq!(keyword, kw, "{text:?}");
                assert_eq!(found, found_fields, "{text:?}");
            }
            other => panic!("{text:?}: expected Malformed, got {other:?}"),
        }
    }
    // abort with an argument, after a scope opened
    let (line, problem) = error_of("begin\n\n# c\nabort now\n");
    assert_eq!(line, 4);
    assert!(matches!(problem, Problem::Malformed { ref keyword, .. } if keyword == "abort"));
}

#[test]
fn unknown_keyword() {
    let (line, problem) = error_of("a 1 5\n\nalloc 2 5\n");
    assert_eq!(line, 3);
    assert_eq!(problem, Problem::UnknownKeyword("alloc".into()));
    let (line, problem) = error_of("A 1 5\n");
    assert_eq!(line, 1);
    assert_eq!(problem, Problem::UnknownKeyword("A".into()));
    let (line, problem) = error_of("a 1 5\nfree 1\n");
    assert_eq!(line, 2);
    assert_eq!(problem, Problem::UnknownKeyword("free".into()));
}

#[test]
fn size_zero() {
    let (line, problem) = error_of("# header\na 1 0\n");
    assert_eq!(line, 2);
    assert_eq!(problem, Problem::ZeroSize);
    let (_, problem) = error_of("a 1 000\n");
    assert_eq!(problem, Problem::ZeroSize);
}

#[test]
fn size_too_large() {
    // 2^63 itself is allowed.
    let t = trace::parse_str("max", &format!("a 1 {MAX_ALLOCATION_BYTES}\n")).unwrap();
    assert_eq!(
        t.events(),
        &[Event::Alloc {
            id: 0,
            bytes: 1 << 63
        }]
    );
    for size in [
        "9223372036854775809",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999999",
    ] {
        let (line, problem) = error_of(&format!("a 1 1\na 2 {size}\n"));
        assert_eq!(line, 2);
        assert_eq!(problem, Problem::SizeTooLarge(size.into()));
    }
}

#[test]
fn size_not_decimal() {
    for size in ["0x10", "-5", "+5", "1e6", "1.5", "12MiB", "abc", "5_000"] {
        let (line, problem) = error_of(&format!("\na 1 {size}\n"));
        assert_eq!(line, 2, "{size}");
        assert_eq!(problem, Problem::SizeNotDecimal(size.into()), "{size}");
    }
}

#[test]
fn second_alloc_of_a_live_id() {
    let (line, problem) = error_of("a 1 5\na 2 5\n# c\na 1 7\n");
    assert_eq!(line, 4);
    assert_eq!(
        problem,
        Problem::AllocLiveId {
            id: "1".into(),
            allocated_line: 1
        }
    );
    // after its free and a new allocation, the line named is the new one
    let (line, problem) = error_of("a 1 5\nf 1\na 1 6\na 1 7\n");
    assert_eq!(line, 4);
    assert_eq!(
        problem,
        Problem::AllocLiveId {
            id: "1".into(),
            allocated_line: 3
        }
    );
}

#[test]
fn free_of_an_id_not_live() {
    let (line, problem) = error_of("a 1 5\nf 2\n");
    assert_eq!(line, 2);
    assert_eq!(problem, Problem::FreeNotLive { id: "2".into() });
    // double free
    let (line, problem) = error_of("a 1 5\nf 1\n\nf 1\n");
    assert_eq!(line, 4);
    assert_eq!(problem, Problem::FreeNotLive { id: "1".into() });
}

#[test]
fn scope_lines_must_be_well_nested() {
    let (line, problem) = error_of("begin\na 1 5\nbegin\n");
    assert_eq!(line, 3);
    assert_eq!(problem, Problem::BeginInScope { open_line: 1 });
    let (line, problem) = error_of("a 1 5\nfinish\n");
    assert_eq!(line, 2);
    assert_eq!(problem, Problem::CloseWithoutScope { keyword: "finish" });
    let (line, problem) = error_of("begin\nabort\nabort\n");
    assert_eq!(line, 3);
    assert_eq!(problem, Problem::CloseWithoutScope { keyword: "abort" });
    let (line, problem) = error_of("\nbegin\ntrim\n");
    assert_eq!(line, 3);
    assert_eq!(problem, Problem::TrimInScope { open_line: 2 });
    // trim outside a scope, and a scope left open at the end, are fine
    assert!(trace::parse_str("ok", "trim\nbegin\nfinish\ntrim\nbegin\na 1 5\n").is_ok());
}

#[test]
fn a_leading_byte_order_mark_is_ignored() {
    // Events, ids and line numbers are as without the mark.
    let t = trace::parse_str("bom.trace", "\u{feff}a 1 5\nf 1\n").unwrap();
    assert_eq!(
        t.events(),
        &[Event::Alloc { id: 0, bytes: 5 }, Event::Free { id: 0 }]
    );
    assert_eq!(t.lines(), &[1, 2]);
    assert_eq!(t.id_name(0), Some("1"));
    // before a comment line, and in a file read from disk (with CRLF)
    let t = trace::parse_str("bom.trace", "\u{feff}# flare-trace v1\nbegin\nfinish\n").unwrap();
    assert_eq!(t.events(), &[Event::Begin, Event::Finish]);
    assert_eq!(t.lines(), &[2, 3]);
    let dir = std::env::temp_dir().join(format!("flare-trace-bom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bom.trace");
    std::fs::write(&path, b"\xEF\xBB\xBFa 7 4096\r\na 8 1\r\n").unwrap();
    let t = trace::parse(&path).unwrap();
    assert_eq!(t.allocations(), 2);
    assert_eq!(t.id_name(0), Some("7"));
    std::fs::remove_dir_all(&dir).unwrap();
    // only one mark, and only at the start of the file
    let (line, problem) = error_of("a 1 5\n\u{feff}f 1\n");
    assert_eq!(line, 2);
    assert_eq!(problem, Problem::UnknownKeyword("\u{feff}f".into()));
    let (line, problem) = error_of("\u{feff}\u{feff}a 1 5\n");
    assert_eq!(line, 1);
    assert_eq!(problem, Problem::UnknownKeyword("\u{feff}a".into()));
}

#[test]
fn not_utf8() {
    let dir = std::env::temp_dir().join(format!("flare-trace-parse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("latin1.trace");
    std::fs::write(&path, b"a 1 5\na \xe9t\xe9 5\n").unwrap();
    let err = trace::parse(&path).unwrap_err();
    assert_eq!(err.line(), Some(2));
    assert_eq!(err.problem(), Some(&Problem::NotUtf8));
    assert!(err
        .to_string()
        .starts_with(&format!("{}:2: ", path.display())));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_file_is_an_io_error() {
    let err = trace::parse(data("no-such.trace")).unwrap_err();
    assert!(matches!(err, TraceError::Io { .. }), "{err:?}");
    assert_eq!(err.line(), None);
    assert!(err.to_string().contains("no-such.trace"), "{err}");
}

#[test]
fn figures_of_a_small_trace() {
    let mib = 1 << 20;
    // live: 2, 2+4 = 6 (peak), then 4, then 4+2 = 6; no reuse: 2 + 4 + 2 = 8
    let t = trace::parse_str("small", "a 1 1\na 2 3145728\nf 1\na 3 2097152\n").unwrap();
    assert_eq!(t.lower_bound_bytes(GRANULARITY), 6 * mib);
    assert_eq!(t.no_reuse_bytes(GRANULARITY), 8 * mib);
    // granularity 0 or 1: no rounding (1 + 3 MiB, then 3 + 2 MiB)
    assert_eq!(t.lower_bound_bytes(1), 5 * mib);
    assert_eq!(t.lower_bound_bytes(0), 5 * mib);
    assert_eq!(t.no_reuse_bytes(1), 1 + 5 * mib);
    // explicit scopes: retained memory is dropped at finish/abort, and frees outside
    // a scope are released
    let t = trace::parse_str(
        "scoped",
        "a w 4194304\nbegin\na 1 2097152\nf 1\na 2 2097152\nf 2\nfinish\na 3 2097152\nf 3\na 4 2097152\nf 4\nbegin\na 5 2097152\nabort\n",
    )
    .unwrap();
    assert_eq!(t.lower_bound_bytes(GRANULARITY), 6 * mib);
    // first scope: 4 live + 2 + 2 = 8; outside: 6; second: 4 + 2 = 6
    assert_eq!(t.no_reuse_bytes(GRANULARITY), 8 * mib);
}

#[test]
fn shipped_traces_match_the_readme_figures() {
    for (file, lower_gib, no_reuse_gib) in SHIPPED {
        let t = trace::parse(data(file)).unwrap_or_else(|e| panic!("{e}"));
        assert!(!t.has_scope_events(), "{file}");
        let lower = t.lower_bound_bytes(GRANULARITY) as f64 / GIB as f64;
        let no_reuse = t.no_reuse_bytes(GRANULARITY) as f64 / GIB as f64;
        assert!(
            (lower - lower_gib).abs() <= 0.01,
            "{file}: lower bound {lower:.4} GiB, README {lower_gib}"
        );
        assert!(
            (no_reuse - no_reuse_gib).abs() <= 0.01,
            "{file}: no reuse {no_reuse:.4} GiB, README {no_reuse_gib}"
        );
    }
}

#[test]
fn shipped_trace_allocation_counts_match_the_readme() {
    for (file, allocations) in [
        ("eager-prefill-20shapes.tensor.trace", 11781),
        ("eager-prefill-20shapes.segment.trace", 21),
        ("graph-warmup-20sizes.tensor.trace", 35323),
        ("graph-warmup-20sizes.segment.trace", 524),
    ] {
        let t = trace::parse(data(file)).unwrap();
        assert_eq!(t.allocations(), allocations, "{file}");
        assert!(t.name().ends_with(file));
    }
}

#[test]
fn huge_tokens_are_quoted_cut_with_their_length() {
    // A 10 MB token in each place a problem quotes one: the message stays short, and
    // quotes the first EXCERPT_CHARS (40) characters and the token's length in bytes.
    let big = "x".repeat(10_000_000);
    let digits = "7".repeat(10_000_000);
    for (text, line, start) in [
        (format!("a 1 5\n{big} 1\n"), 2, 'x'),       // unknown keyword
        (format!("a 1 {big}\n"), 1, 'x'),            // size not decimal
        (format!("a 1 {digits}\n"), 1, '7'),         // size too large
        (format!("a {big} 5\na {big} 5\n"), 2, 'x'), // id already live
        (format!("a 1 5\nf {big}\n"), 2, 'x'),       // free of an id not live
    ] {
        let (l, problem) = error_of(&text);
        assert_eq!(l, line);
        let quoted = match &problem {
            Problem::UnknownKeyword(q) | Problem::SizeNotDecimal(q) | Problem::SizeTooLarge(q) => q,
            Problem::AllocLiveId { id, .. } | Problem::FreeNotLive { id } => id,
            other => panic!("unexpected problem {other:?}"),
        };
        let first_40: String = std::iter::repeat_n(start, 40).collect();
        assert!(quoted.is_cut());
        assert_eq!(quoted.token_bytes(), 10_000_000);
        assert_eq!(quoted.head(), first_40);
        let msg = problem.to_string();
        assert!(msg.len() < 200, "{} bytes", msg.len());
        assert!(
            msg.contains(&format!("\"{first_40}…\" (10000000 bytes)")),
            "{msg}"
        );
    }
}

#[test]
fn excerpt_cuts_after_40_characters_on_a_character_boundary() {
    // 40 characters: quoted whole, as before
    let forty = "é".repeat(40);
    let q = trace::Excerpt::new(&forty);
    assert!(!q.is_cut());
    assert_eq!(q.to_string(), format!("\"{forty}\""));
    assert_eq!(q, forty.as_str());
    // 41 two-byte characters: the first 40 (80 bytes), and the length, 82 bytes
    let q = trace::Excerpt::new(&"é".repeat(41));
    assert!(q.is_cut());
    assert_eq!(q.head(), forty);
    assert_eq!(q.token_bytes(), 82);
    assert_eq!(q.to_string(), format!("\"{forty}…\" (82 bytes)"));
    assert_ne!(q, "é".repeat(41).as_str());
    // a short token is quoted as the parser always quoted it ({:?})
    assert_eq!(
        Problem::UnknownKeyword("malloc".into()).to_string(),
        "unknown keyword \"malloc\" (keywords: a, f, begin, finish, abort, trim; \
         recorded traces also r, done, oom, x, sleep, wake, forget)"
    );
    assert_eq!(
        Problem::FreeNotLive { id: "a\tb".into() }.to_string(),
        "free of allocation id \"a\\tb\", which is not live (never allocated, or already freed)"
    );
}

#[test]
fn parse_reader_reads_bytes_like_a_file() {
    let text = b"# flare-trace v1\r\na x 4096\r\nf x\r\n";
    let from_reader = trace::parse_reader("<stdin>", &text[..]).unwrap();
    let from_str = trace::parse_str("<stdin>", std::str::from_utf8(text).unwrap()).unwrap();
    assert_eq!(from_reader, from_str);
    assert_eq!(from_reader.name(), "<stdin>");
    assert_eq!(from_reader.lines(), &[2, 3]);
    // a line that is not UTF-8 is that line's error, not a read error
    let err = trace::parse_reader("<stdin>", &b"a 1 5\na \xe9 5\n"[..]).unwrap_err();
    assert_eq!(err.line(), Some(2));
    assert_eq!(err.problem(), Some(&Problem::NotUtf8));
    assert!(err.to_string().starts_with("<stdin>:2: "), "{err}");
    // a failing reader is an I/O error naming the trace
    struct Failing;
    impl std::io::Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk on fire"))
        }
    }
    let err = trace::parse_reader("<stdin>", Failing).unwrap_err();
    assert!(matches!(err, TraceError::Io { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "<stdin>: cannot read the trace: disk on fire"
    );
}

/// `oom N` counts the driver's out-of-memory answers in one allocation: its create
/// and one retry (`Pool::allocate_raw`: "after releasing idle mappings and
/// retrying once"), so 1 or 2.
#[test]
fn oom_counts_are_1_or_2() {
    assert_eq!(trace::MAX_OOM_ANSWERS, 2);
    let t = trace::parse_str("oom", &recorded("oom 2\nx 4096\n")).unwrap();
    assert!(matches!(t.events()[0], trace::Event::Oom { count: 2 }));
    for bad in ["oom 0\n", "oom 3\n", "oom 4294967295\n"] {
        let err = trace::parse_str("oom", &recorded(bad)).unwrap_err();
        assert_eq!(err.line(), Some(2), "{bad}");
        assert!(err.to_string().contains("count"), "{bad}: {err}");
    }
}

/// The `# flare-pool` header of a recorded trace: every key once (a recording pool
/// writes them all, so a default in place of a missing one would not be "as
/// recorded"), a device of some memory, one header per trace.
#[test]
fn recorded_header_rules() {
    const FULL: &str = "policy=exact granularity=2097152 device_total=150323855360 \
        release_threshold=0 best_fit_waste_percent=30 cross_stream=when-complete \
        segment_whole_threshold=18446744073709551615 thread_cache_entries=32 \
        thread_cache_bytes=1073741824 device=0 peers=none";
    let header = |fields: &str| format!("# flare-trace v1\n# flare-pool {fields}\na x 512\n");
    let t = trace::parse_str("test.trace", &header(FULL)).unwrap();
    let c = t.recorded_config().unwrap();
    assert_eq!(c.device_total, 150_323_855_360);
    assert_eq!(c.granularity, 2 << 20);
    // An unknown key (a later version's) is ignored.
    assert!(trace::parse_str("test.trace", &header(&format!("{FULL} future_key=1"))).is_ok());
    let problem = |fields: &str| -> String {
        let (line, p) = error_of(&header(fields));
        assert_eq!(line, 2, "{fields}");
        assert!(matches!(p, Problem::RecordedConfig(_)), "{p:?}");
        p.to_string()
    };
    for key in trace::RECORDED_KEYS {
        let without: Vec<&str> = FULL
            .split(' ')
            .filter(|f| !f.starts_with(&format!("{key}=")))
            .collect();
        assert_eq!(without.len(), 10, "{key}");
        let msg = problem(&without.join(" "));
        assert!(msg.contains(&format!("{key}= is missing")), "{msg}");
    }
    let msg = problem(&format!("{FULL} policy=best-fit"));
    assert!(msg.contains("policy= is given twice"), "{msg}");
    let msg = problem(&FULL.replace("device_total=150323855360", "device_total=0"));
    assert!(
        msg.contains("device_total=0 is less than one granule"),
        "{msg}"
    );
    let msg = problem(&FULL.replace("granularity=2097152", "granularity=3000000"));
    assert!(
        msg.contains("granularity=3000000 is not a power of two"),
        "{msg}"
    );
    // Below a page: no pool takes it (the simulated driver's least).
    let msg = problem(&FULL.replace("granularity=2097152", "granularity=256"));
    assert!(msg.contains("granularity=256 is below the least"), "{msg}");
    // The query-failed marker is accepted.
    let t = FULL.replace(
        "device_total=150323855360",
        "device_total=18446744073709551615",
    );
    assert!(trace::parse_str("test.trace", &header(&t)).is_ok());
    let (line, p) = error_of(&format!(
        "# flare-trace v1\n# flare-pool {FULL}\na x 512\n# flare-pool {FULL}\n"
    ));
    assert_eq!(line, 4);
    assert!(p.to_string().contains("second"), "{p}");
}

/// `done` lines: a stream's marks (one per `f ID STREAM`, one per other stream
/// recorded with `r` on a freed id) bound them by the next call's line, and they
/// increase; an `r` of an id that is not live names the `r`.
#[test]
fn done_lines_follow_the_streams_marks() {
    const S: &str = "0x100000000";
    const T: &str = "0x100000001";
    // Two marks on S (its own free; T's free of an id recorded on S), one on T.
    let ok = format!(
        "a x 512 0 {S}\nf x {S}\na y 512 0 {T}\nr y {S}\nf y {T}\n\
         done {S} 1\ndone {S} 2\ndone {T} 1\n\
         a z 512 0 {S}\ndone {S} 3\nf z {S}\n"
    );
    let t = trace::parse_str("test.trace", &recorded(&ok)).unwrap();
    let dones: Vec<_> = t
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Done { .. }))
        .collect();
    assert_eq!(dones.len(), 4);
    // `done S 3` before the `f` that makes S's third mark: the pool saw it during
    // that call. Past the next call's line it is an error, on that call's line.
    let (line, p) = error_of(&recorded(&format!(
        "a x 512 0 {S}\nf x {S}\ndone {S} 2\na y 512\n"
    )));
    assert_eq!(line, 5);
    assert_eq!(
        p,
        Problem::DoneBeyondMarks {
            stream: S.into(),
            mark: 2,
            marks: 1,
            done_line: 4
        }
    );
    // A `done` with no call after it: the last event's line.
    let (line, p) = error_of(&recorded(&format!("a x 512 0 {S}\nf x {S}\ndone {S} 2\n")));
    assert_eq!(line, 4);
    assert!(
        matches!(p, Problem::DoneBeyondMarks { marks: 1, .. }),
        "{p:?}"
    );
    // A stream with no marks at all.
    let (_, p) = error_of(&recorded(&format!("a x 512\ndone {T} 1\nf x\n")));
    assert!(
        matches!(p, Problem::DoneBeyondMarks { marks: 0, .. }),
        "{p:?}"
    );
    // Not increasing.
    let (line, p) = error_of(&recorded(&format!(
        "a x 512 0 {S}\nf x {S}\na y 512 0 {S}\nf y {S}\ndone {S} 2\ndone {S} 1\n"
    )));
    assert_eq!(line, 7);
    assert_eq!(
        p,
        Problem::DoneNotIncreasing {
            stream: S.into(),
            mark: 1,
            previous: 2
        }
    );
    // The legacy stream's two names are one stream's marks.
    let legacy = "a x 512 0 0x0\nf x 0x0\na y 512 0 0x1\nf y 0x1\ndone 0x0 2\n";
    assert!(trace::parse_str("test.trace", &recorded(legacy)).is_ok());
    // `r` of an id not live.
    let (line, p) = error_of(&recorded(&format!("a x 512\nf x\nr x {S}\n")));
    assert_eq!(line, 4);
    assert_eq!(p, Problem::RecordNotLive { id: "x".into() });
    let msg = p.to_string();
    assert!(
        msg.starts_with("record-stream (r) of allocation id"),
        "{msg}"
    );
    assert!(msg.contains("\"x\", which is not live"), "{msg}");
}

/// `x BYTES [TAG [STREAM]]`: a request the recorded pool refused; and `oom N`
/// belongs to the next call's allocation (`a` or `x`).
#[test]
fn refused_requests_and_oom_lines() {
    let t = trace::parse_str(
        "test.trace",
        &recorded(
            "oom 2\nx 4096\nx 8192 3\nx 512 0 0x100000000\na y 512\noom 1\na z 512 0 0x100000000\n",
        ),
    )
    .unwrap();
    let e = t.events();
    assert_eq!(
        e[1],
        Event::AllocFailed {
            bytes: 4096,
            tag: 0,
            stream: None
        }
    );
    assert_eq!(
        e[2],
        Event::AllocFailed {
            bytes: 8192,
            tag: 3,
            stream: None
        }
    );
    assert_eq!(
        e[3],
        Event::AllocFailed {
            bytes: 512,
            tag: 0,
            stream: Some(0)
        }
    );
    // A refused request allocates nothing: one `a` per live allocation only.
    assert_eq!(t.allocations(), 2);
    let (_, p) = error_of(&recorded("x\n"));
    assert!(matches!(p, Problem::Malformed { found: 0, .. }), "{p:?}");
    let (_, p) = error_of(&recorded("x 0\n"));
    assert_eq!(p, Problem::ZeroSize);
    // `oom` then a free, a second `oom`, or the end: errors naming the `oom` line.
    for (text, line) in [
        ("a x 512\noom 1\nf x\n", 3),
        ("oom 1\noom 1\na x 512\n", 2),
        ("a x 512\noom 1\n", 2),
    ] {
        let (at, p) = error_of(&recorded(text));
        assert_eq!(at, line + 1, "{text:?}");
        let want = if text.starts_with("oom 1\noom") { 2 } else { 3 };
        assert_eq!(
            p,
            Problem::OomWithoutAllocation { oom_line: want },
            "{text:?}"
        );
    }
    // `done` lines may come between (the pool learnt both during the call).
    assert!(trace::parse_str(
        "test.trace",
        &recorded(
            "oom 1\na x 512 0 0x100000000\nf x 0x100000000\noom 1\ndone 0x100000000 1\na y 512\n"
        )
    )
    .is_ok());
}

/// `sleep TAG offload|discard` and `wake TAG`: a tag sleeps once until its wake.
#[test]
fn sleep_and_wake_lines() {
    let t = trace::parse_str(
        "test.trace",
        &recorded("a x 512 1\nsleep 1 offload\nwake 1\nsleep 0 discard\nwake 0\n"),
    )
    .unwrap();
    assert!(t.has_sleep());
    assert_eq!(
        t.events()[1],
        Event::Sleep {
            tag: 1,
            offload: true
        }
    );
    assert_eq!(
        t.events()[3],
        Event::Sleep {
            tag: 0,
            offload: false
        }
    );
    assert_eq!(t.events()[4], Event::Wake { tag: 0 });
    let (line, p) = error_of(&recorded("sleep 1 offload\nsleep 1 discard\n"));
    assert_eq!(
        (line, p),
        (
            3,
            Problem::SleepState {
                tag: 1,
                sleeping: true
            }
        )
    );
    let (line, p) = error_of(&recorded("wake 2\n"));
    assert_eq!(
        (line, p),
        (
            2,
            Problem::SleepState {
                tag: 2,
                sleeping: false
            }
        )
    );
    let (_, p) = error_of(&recorded("sleep 1 later\n"));
    assert_eq!(p, Problem::SleepMode("later".into()));
    let (_, p) = error_of(&recorded("sleep 1\n"));
    assert!(matches!(p, Problem::Malformed { found: 1, .. }), "{p:?}");
}
