//! The flare-trace v1 parser: every error rule (with its line number and problem),
//! comments, blank lines, tabs, id reuse. The lines of recorded traces and the
//! figures of parsed traces have modules of their own.

use crate::common;

use common::data;
use flare_package::trace::{self, Event, Problem, TraceError, MAX_ALLOCATION_BYTES};

/// Parses `text` and returns its error's (line, problem), checking that the message
/// names the file and the line.
pub(crate) fn error_of(text: &str) -> (usize, Problem) {
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
        "unknown keyword \"malloc\" (keywords: a, f, begin, finish, abort, trim, step; \
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
