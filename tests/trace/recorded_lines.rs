//! The flare-trace v1 parser on the lines of recorded traces (`docs/trace-format.md`,
//! "Recorded traces"): the `# flare-pool` header's rules, `done` lines after their
//! stream's marks, refused requests and `oom` lines, sleep and wake lines.

use crate::parse_errors::error_of;
use flare_package::trace::{self, Event, Problem};

/// The `# flare-pool` header of a recorded trace (every key), which the lines of
/// recorded traces need before them.
const POOL: &str = "# flare-pool policy=exact granularity=2097152 device_total=150323855360 \
    release_threshold=0 best_fit_waste_percent=30 cross_stream=when-complete \
    segment_whole_threshold=18446744073709551615 thread_cache_entries=32 \
    thread_cache_bytes=1073741824 device=0 peers=none\n";

/// `text` as a recorded trace: [`POOL`] on line 1, `text` from line 2.
pub(crate) fn recorded(text: &str) -> String {
    format!("{POOL}{text}")
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
