//! `flare-replay` on PyTorch memory snapshots (issue 17): the figures of the
//! committed snapshots against what PyTorch reported for the same runs, the
//! converter, and the errors for inputs that are not snapshots. One concern in one
//! file: importing snapshots, as a user of the command sees it.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

mod cli;

use std::path::{Path, PathBuf};

use cli::{flare_replay, stderr, stdout};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A committed snapshot (tests/data/torch/).
fn torch(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/torch")
        .join(name)
}

/// What PyTorch reported for the run of a committed snapshot (the .json beside it).
fn reported(snapshot: &str) -> serde_json::Value {
    let json = torch(snapshot).with_extension("json");
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// A scratch file with `bytes`, unique per test process.
fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flare-torch-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The flare-trace of a snapshot (`--convert -`), with its status checked.
fn converted(args: &[&str]) -> String {
    let mut all = vec!["--convert", "-"];
    all.extend_from_slice(args);
    let o = flare_replay(&all);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

/// Figures counted here from a trace's text: (`a` lines, `f` lines, peak of live
/// bytes, live bytes at the end). Every `f` must name a live id.
fn count(trace: &str) -> (u64, u64, u64, u64) {
    let mut live = std::collections::HashMap::new();
    let (mut a, mut f, mut bytes, mut peak) = (0, 0, 0u64, 0u64);
    for line in trace.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["a", id, size] => {
                let size: u64 = size.parse().unwrap();
                assert!(live.insert(id.to_string(), size).is_none(), "{line}");
                a += 1;
                bytes += size;
                peak = peak.max(bytes);
            }
            ["f", id] => {
                bytes -= live
                    .remove(*id)
                    .unwrap_or_else(|| panic!("not live: {line}"));
                f += 1;
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }
    (a, f, peak, bytes)
}

/// The allocation trace's peak of live bytes is PyTorch's `max_memory_allocated`
/// (its counter adds the *block* size at `alloc` and drops it at `free_requested`;
/// the events carry requested sizes, so the importer rebuilds the blocks), and it
/// has one `a` line per `alloc` event and one `f` line per `free_requested`.
#[test]
fn allocation_trace_peak_is_max_memory_allocated() {
    for (snapshot, expected_peak) in [
        ("torch-eager.pickle", 39_106_560),
        ("torch-graphs.pickle", 72_678_400),
    ] {
        let r = reported(snapshot);
        assert_eq!(r["max_memory_allocated"], expected_peak, "{snapshot}");
        let trace = converted(&[s(&torch(snapshot))]);
        let (a, f, peak, _) = count(&trace);
        assert_eq!(a, r["trace_actions"]["alloc"], "{snapshot}");
        assert_eq!(f, r["trace_actions"]["free_requested"], "{snapshot}");
        assert_eq!(peak, r["max_memory_allocated"], "{snapshot}");
        // every block size came from the layout; no free was skipped
        assert!(
            trace.contains("block sizes: ") && trace.contains(", 0 rounded requests"),
            "{trace}"
        );
        assert!(trace.contains("# 0 frees skipped"), "{snapshot}");
        // the replay says so too, with the source
        let o = flare_replay(&["--policy", "exact", s(&torch(snapshot))]);
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        assert!(
            out.contains("PyTorch snapshot, allocation trace (per-tensor events): device 0 of 1"),
            "{out}"
        );
        assert!(out.contains(&format!("peak live bytes {peak} (")), "{out}");
    }
}

/// The segment trace: one `a` per `segment_alloc`, one `f` per `segment_free`, and
/// its peak (the segments alive at the worst moment) is PyTorch's
/// `max_memory_reserved` for these runs (no segment was released before the peak
/// but the ones re-allocated at once; the graphs run frees 4 of its 13).
#[test]
fn segment_trace_peak_is_max_memory_reserved() {
    for snapshot in ["torch-eager.pickle", "torch-graphs.pickle"] {
        let r = reported(snapshot);
        let trace = converted(&["--torch-events", "segment", s(&torch(snapshot))]);
        let (a, f, peak, at_end) = count(&trace);
        let actions = &r["trace_actions"];
        assert_eq!(a, actions["segment_alloc"], "{snapshot}");
        assert_eq!(
            f,
            actions["segment_free"].as_u64().unwrap_or(0),
            "{snapshot}"
        );
        assert_eq!(peak, r["max_memory_reserved"], "{snapshot}");
        // what is left at the end is the `segments` count of the README
        assert_eq!(
            a - f,
            r["segments"].as_u64().unwrap(),
            "{snapshot}: segments at the end"
        );
        assert!(at_end <= peak);
        let o = flare_replay(&[
            "--policy",
            "exact",
            "--torch-events",
            "segment",
            s(&torch(snapshot)),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stdout(&o).contains("PyTorch snapshot, segment events: device 0 of 1"),
            "{}",
            stdout(&o)
        );
    }
}

/// The converted trace replays exactly as the snapshot does, under every policy.
#[test]
fn converted_trace_replays_like_the_snapshot() {
    for level in ["tensor", "segment"] {
        let snapshot = torch("torch-graphs.pickle");
        let out = std::env::temp_dir().join(format!(
            "flare-torch-import-{}-{level}.trace",
            std::process::id()
        ));
        let o = flare_replay(&["--torch-events", level, "--convert", s(&out), s(&snapshot)]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stdout(&o).contains(&format!("wrote {}", out.display())),
            "{}",
            stdout(&o)
        );
        // the file is what `--convert -` prints
        let text = std::fs::read_to_string(&out).unwrap();
        assert_eq!(text, converted(&["--torch-events", level, s(&snapshot)]));
        assert!(text.starts_with("# flare-trace v1\n"), "{text}");
        // --json rows without the trace's name and the wall time
        let rows = |args: &[&str]| -> Vec<serde_json::Value> {
            let o = flare_replay(args);
            assert!(o.status.success(), "{}", stderr(&o));
            stdout(&o)
                .lines()
                .map(|l| {
                    let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                    let m = v.as_object_mut().unwrap();
                    m.remove("trace");
                    m.remove("seconds");
                    v
                })
                .collect()
        };
        let from_snapshot = rows(&["--json", "--torch-events", level, s(&snapshot)]);
        let from_trace = rows(&["--json", s(&out)]);
        assert_eq!(from_snapshot.len(), 4);
        assert_eq!(from_snapshot, from_trace, "{level}");
        std::fs::remove_file(&out).unwrap();
    }
}

/// A tiny pickle writer for synthetic snapshots (protocol 2: what a snapshot needs).
enum P {
    Int(i64),
    Str(&'static str),
    Bool(bool),
    List(Vec<P>),
    Dict(Vec<(&'static str, P)>),
}

fn encode(p: &P, out: &mut Vec<u8>) {
    match p {
        P::Int(i) => {
            out.extend([0x8a, 8]); // LONG1, 8 bytes
            out.extend(i.to_le_bytes());
        }
        P::Str(text) => {
            out.push(b'X');
            out.extend((text.len() as u32).to_le_bytes());
            out.extend(text.as_bytes());
        }
        P::Bool(b) => out.push(if *b { 0x88 } else { 0x89 }),
        P::List(items) => {
            out.push(b']');
            for item in items {
                encode(item, out);
                out.push(b'a');
            }
        }
        P::Dict(pairs) => {
            out.push(b'}');
            for (k, v) in pairs {
                encode(&P::Str(k), out);
                encode(v, out);
                out.push(b's');
            }
        }
    }
}

fn pickle(p: &P) -> Vec<u8> {
    let mut out = vec![0x80, 2];
    encode(p, &mut out);
    out.push(b'.');
    out
}

/// An event dict.
fn ev(action: &'static str, addr: i64, size: i64) -> P {
    P::Dict(vec![
        ("action", P::Str(action)),
        ("addr", P::Int(addr)),
        ("size", P::Int(size)),
        ("stream", P::Int(0)),
    ])
}

/// A snapshot dict with these devices' event lists and settings.
fn snapshot(devices: Vec<Vec<P>>, settings: Vec<(&'static str, P)>) -> Vec<u8> {
    pickle(&P::Dict(vec![
        ("segments", P::List(vec![])),
        (
            "device_traces",
            P::List(devices.into_iter().map(P::List).collect()),
        ),
        ("allocator_settings", P::Dict(settings)),
    ]))
}

/// Runs flare-replay on a scratch snapshot; (status, stdout, stderr).
fn run_on(name: &str, bytes: &[u8], args: &[&str]) -> (Option<i32>, String, String) {
    let path = scratch(name, bytes);
    let mut all: Vec<&str> = args.to_vec();
    all.push(s(&path));
    let o = flare_replay(&all);
    (o.status.code(), stdout(&o), stderr(&o))
}

const MIB: i64 = 1 << 20;

#[test]
fn not_a_pickle_is_a_clear_error() {
    // a text file named as a pickle, and a binary that is not one
    for (name, bytes) in [
        ("text.pickle", &b"a 1 4096\nf 1\n"[..]),
        ("empty.pkl", &b""[..]),
        ("zip.pickle", &b"PK\x03\x04rest"[..]),
    ] {
        let (code, out, err) = run_on(name, bytes, &[]);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains(name), "{err}");
        assert!(err.contains("not a pickle"), "{name}: {err}");
        assert!(out.is_empty());
    }
    // a pickle of code (a class instance) is refused, not run
    let (code, _, err) = run_on(
        "class.pickle",
        b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01.",
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unsupported pickle opcode"), "{err}");
}

#[test]
fn a_truncated_pickle_says_so() {
    let bytes = std::fs::read(torch("torch-eager.pickle")).unwrap();
    for cut in [2, bytes.len() / 2, bytes.len() - 1] {
        let (code, out, err) = run_on("cut.pickle", &bytes[..cut], &[]);
        assert_eq!(code, Some(2), "{cut}: {err}");
        assert!(err.contains("truncated pickle"), "{cut}: {err}");
        assert!(err.contains(&format!("ends at byte {cut}")), "{cut}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(out.is_empty());
    }
    // detected by its first byte whatever its name
    let (code, _, err) = run_on("cut.bin", &bytes[..1000], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("truncated pickle"), "{err}");
}

#[test]
fn missing_keys_are_named() {
    // a dict without device_traces
    let p = pickle(&P::Dict(vec![("segments", P::List(vec![]))]));
    let (code, _, err) = run_on("no-traces.pickle", &p, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no key `device_traces`"), "{err}");
    assert!(err.contains("\"segments\""), "{err}");
    // not a dict
    let (code, _, err) = run_on("list.pickle", &pickle(&P::List(vec![])), &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("the pickle holds a list"), "{err}");
    // event 17 without addr
    let mut events = vec![ev("segment_alloc", 0, 2 * MIB)];
    for i in 0..16 {
        events.push(ev("alloc", i * 512, 512));
    }
    events.push(P::Dict(vec![
        ("action", P::Str("free_requested")),
        ("size", P::Int(512)),
    ]));
    let p = snapshot(vec![events], vec![]);
    let (code, _, err) = run_on("no-addr.pickle", &p, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("event 17 of device 0 (`free_requested`) has no `addr`"),
        "{err}"
    );
    assert!(err.contains("device_traces[0][17]"), "{err}");
    // the segment level reads segment events only: the same snapshot imports
    let (code, out, err) = run_on("no-addr.pickle", &p, &["--torch-events", "segment"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("1 \"a\" lines (segment_alloc, segment_map)"),
        "{out}"
    );
    // an address that is not an int
    let p = snapshot(
        vec![vec![P::Dict(vec![
            ("action", P::Str("alloc")),
            ("addr", P::Str("0x10")),
            ("size", P::Int(512)),
        ])]],
        vec![],
    );
    let (code, _, err) = run_on("str-addr.pickle", &p, &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("`addr` is str \"0x10\""), "{err}");
    // a size above 2^62 (here 2^63 - 1) is refused as input, not replayed: its
    // 512-byte rounding would not fit a flare-trace size (at most 2^63)
    let p = snapshot(vec![vec![ev("alloc", 0, i64::MAX)]], vec![]);
    let (code, _, err) = run_on("huge-size.pickle", &p, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not an int from 0 to 2^62"), "{err}");
    // 2^62 itself is accepted (and replays as an out-of-memory on the simulated H200)
    let p = snapshot(vec![vec![ev("alloc", 0, 1 << 62)]], vec![]);
    let (code, _, err) = run_on("edge-size.pickle", &p, &["--convert", "-"]);
    assert_eq!(code, Some(0), "{err}");
    // an event without action
    let p = snapshot(vec![vec![P::Dict(vec![("addr", P::Int(0))])]], vec![]);
    let (code, _, err) = run_on("no-action.pickle", &p, &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("event 0 of device 0 has no `action`"), "{err}");
}

/// Block sizes: split, whole blocks, merges; and the fallbacks and skips counted.
#[test]
fn block_sizes_fallbacks_and_skips() {
    let events = vec![
        // a free for an address allocated before recording: skipped
        ev("free_requested", 99 * MIB, 4096),
        ev("free_completed", 99 * MIB, 4096),
        // an alloc in a segment from before recording: rounded request
        ev("alloc", 50 * MIB, 1000),
        ev("segment_alloc", 0, 2 * MIB),
        // 100 B -> a 512 B block split from the segment
        ev("alloc", 0, 100),
        // 2 MiB - 768 B rounds to 2 MiB - 512, the whole remainder: a large request
        // whose remainder (0) is not more than 1 MiB takes the block whole
        ev("alloc", 512, 2 * MIB - 512 - 256),
        ev("free_requested", 0, 100),
        ev("free_requested", 512, 2 * MIB - 768),
        ev("free_completed", 512, 2 * MIB - 768),
        ev("free_completed", 0, 100),
        // merged again: 2 MiB whole for a 1.5 MiB request (remainder not > 1 MiB)
        ev("alloc", 0, 3 * MIB / 2),
    ];
    let p = snapshot(vec![events], vec![]);
    let path = scratch("layout.pickle", &p);
    let trace = converted(&[s(&path)]);
    let body: Vec<&str> = trace.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        body,
        [
            "a 0x3200000 1024",
            "a 0x0 512",
            "a 0x200 2096640",
            "f 0x0",
            "f 0x200",
            "a 0x0 2097152",
        ]
    );
    assert!(
        trace.contains("block sizes: 3 from the block layout, 1 rounded requests"),
        "{trace}"
    );
    assert!(trace.contains("# 1 frees skipped"), "{trace}");
    // peak: 1024 + 512 + 2096640, and again 1024 + 2097152 at the end
    assert!(trace.contains("peak live bytes 2098176 "), "{trace}");
    // with expandable segments the layout is not modelled: every size is rounded
    let p = snapshot(
        vec![vec![ev("segment_alloc", 0, 2 * MIB), ev("alloc", 0, 100)]],
        vec![("expandable_segments", P::Bool(true))],
    );
    let path = scratch("expandable.pickle", &p);
    let trace = converted(&[s(&path)]);
    assert!(
        trace.contains("block layout not modelled: expandable_segments is on"),
        "{trace}"
    );
    assert!(
        trace.contains("0 from the block layout, 1 rounded requests"),
        "{trace}"
    );
}

#[test]
fn segment_map_and_unmap() {
    let events = vec![
        ev("segment_map", 0, 2 * MIB),
        ev("segment_map", 2 * MIB, 4 * MIB),
        ev("segment_map", 8 * MIB, 2 * MIB),
        // unmaps the first two whole
        ev("segment_unmap", 0, 6 * MIB),
        // mapped before recording: skipped
        ev("segment_unmap", 20 * MIB, 2 * MIB),
    ];
    let p = snapshot(vec![events], vec![]);
    let path = scratch("map.pickle", &p);
    let trace = converted(&["--torch-events", "segment", s(&path)]);
    let body: Vec<&str> = trace.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        body,
        [
            "a 0x0 2097152",
            "a 0x200000 4194304",
            "a 0x800000 2097152",
            "f 0x0",
            "f 0x200000",
        ]
    );
    assert!(trace.contains("# 1 frees skipped"), "{trace}");
    // an unmap that cuts a mapping in two is not supported
    let p = snapshot(
        vec![vec![
            ev("segment_map", 0, 4 * MIB),
            ev("segment_unmap", 2 * MIB, 2 * MIB),
        ]],
        vec![],
    );
    let (code, _, err) = run_on("cut-map.pickle", &p, &["--torch-events", "segment"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("partial unmaps are not supported"), "{err}");
    assert!(
        err.contains("event 1 of device 0 (`segment_unmap`"),
        "{err}"
    );
}

#[test]
fn the_device_is_chosen() {
    let two = snapshot(
        vec![
            vec![ev("segment_alloc", 0, 2 * MIB)],
            vec![
                ev("segment_alloc", 0, 20 * MIB),
                ev("segment_alloc", 20 * MIB, 2 * MIB),
            ],
        ],
        vec![],
    );
    let (code, _, err) = run_on("two.pickle", &two, &["--torch-events", "segment"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("devices 0, 1 have events: choose one with --device"),
        "{err}"
    );
    let (code, out, err) = run_on(
        "two.pickle",
        &two,
        &["--torch-events", "segment", "--device", "1"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("segment events: device 1 of 2"), "{out}");
    assert!(out.contains("2 \"a\" lines"), "{out}");
    let (code, _, err) = run_on("two.pickle", &two, &["--device", "2"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("device 2 is not in the snapshot"), "{err}");
    // one device with events among several: that one
    let one = snapshot(vec![vec![], vec![ev("segment_alloc", 0, 2 * MIB)]], vec![]);
    let (code, out, err) = run_on("one.pickle", &one, &["--torch-events", "segment"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("device 1 of 2"), "{out}");
    // A device with only PyTorch's own `snapshot` marker allocated nothing (seen on
    // a two-GPU H200 host: `_snapshot()` leaves one on every device): not a choice.
    let marker = snapshot(
        vec![
            vec![ev("segment_alloc", 0, 2 * MIB)],
            vec![ev("snapshot", 0, 0)],
        ],
        vec![],
    );
    let (code, out, err) = run_on("marker.pickle", &marker, &["--torch-events", "segment"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("device 0 of 2"), "{out}");
    // none
    let none = snapshot(vec![vec![]], vec![]);
    let (code, _, err) = run_on("none.pickle", &none, &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("no device has allocator events"), "{err}");
}

#[test]
fn convert_and_snapshot_options_are_checked() {
    let eager = torch("torch-eager.pickle");
    let trace = scratch("plain.trace", b"a 1 4096\nf 1\n");
    for (args, message) in [
        (
            vec!["--convert", "-", s(&eager), s(&eager)],
            "exactly one input",
        ),
        (
            vec!["--convert", "-", s(&trace)],
            "is a flare-trace already",
        ),
        (
            vec!["--convert", "-", "--json", s(&eager)],
            "cannot be used with",
        ),
        (
            vec!["--convert", "-", "--policy", "exact", s(&eager)],
            "cannot be used with",
        ),
        (
            vec!["--torch-events", "segment", s(&trace)],
            "apply to PyTorch snapshots only",
        ),
        (
            vec!["--device", "0", s(&trace)],
            "apply to PyTorch snapshots only",
        ),
        (vec!["--torch-events", "blocks", s(&eager)], "invalid value"),
    ] {
        let o = flare_replay(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(message), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
    // converting onto the snapshot itself would lose it: refused, the file intact
    let copy = scratch("self.pickle", &std::fs::read(&eager).unwrap());
    let before = std::fs::read(&copy).unwrap();
    let o = flare_replay(&["--convert", s(&copy), s(&copy)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("that is the snapshot being converted"));
    assert_eq!(std::fs::read(&copy).unwrap(), before);
    // an unwritable output is a failure (status 1)
    let o = flare_replay(&["--convert", "/nonexistent/dir/out.trace", s(&eager)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("writing /nonexistent/dir/out.trace"));
}

#[test]
fn help_describes_snapshots() {
    let o = flare_replay(&["--help"]);
    let help = stdout(&o);
    for term in [
        "--torch-events",
        "--device",
        "--convert",
        "PyTorch memory snapshots",
        "free_requested",
        "segment_alloc",
        "rounded requests",
    ] {
        assert!(help.contains(term), "{term:?} in {help}");
    }
    let short = stdout(&flare_replay(&["-h"]));
    assert!(short.contains("PyTorch memory snapshot"), "{short}");
}

/// A snapshot whose live allocations share bytes is inconsistent (the caching
/// allocator never hands out a byte twice, and a segment is mapped once): refused,
/// naming the events, in both event kinds.
#[test]
fn inconsistent_snapshots_are_refused() {
    let refused = |name: &str, events: Vec<P>, args: &[&str]| -> String {
        let (code, _, err) = run_on(name, &snapshot(vec![events], vec![]), args);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains("an inconsistent snapshot"), "{name}: {err}");
        err
    };
    // The same address allocated twice.
    let err = refused(
        "twice.pickle",
        vec![ev("alloc", 0, 4096), ev("alloc", 0, 4096)],
        &[],
    );
    assert!(
        err.contains("address 0x0 is live (allocated by event 0"),
        "{err}"
    );
    // 4096 bytes at 0 (a request of 4096 is a 4096-byte block at least), then a
    // block at 1024 inside it, both live.
    let err = refused(
        "inside.pickle",
        vec![ev("alloc", 0, 4096), ev("alloc", 1024, 512)],
        &[],
    );
    assert!(err.contains("0x400..0x600 overlaps 0x0..0x1000"), "{err}");
    // A block that runs into the next live one (0x1000 is live; 0x800 + 4096 ends
    // past it).
    let err = refused(
        "into.pickle",
        vec![ev("alloc", 4096, 512), ev("alloc", 2048, 4096)],
        &[],
    );
    assert!(
        err.contains("0x800..0x1800 overlaps 0x1000..0x1200"),
        "{err}"
    );
    // Freed in between: no overlap.
    let (code, _, err) = run_on(
        "freed.pickle",
        &snapshot(
            vec![vec![
                ev("alloc", 0, 4096),
                ev("free_requested", 0, 4096),
                ev("alloc", 1024, 512),
            ]],
            vec![],
        ),
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    // Segment events: two mappings over the same 2 MiB.
    let err = refused(
        "maps.pickle",
        vec![
            ev("segment_map", 0, 4 * MIB),
            ev("segment_map", 2 * MIB, 2 * MIB),
        ],
        &["--torch-events", "segment"],
    );
    assert!(
        err.contains("0x200000..0x400000 overlaps 0x0..0x400000"),
        "{err}"
    );
}

/// A converted trace names its snapshot whole in its first comment, however long
/// the path (a new user saw it cut to 40 characters).
#[test]
fn converted_trace_names_its_whole_source() {
    let p = snapshot(vec![vec![ev("alloc", 0, 4096)]], vec![]);
    let name = format!("{}.pickle", "a-rather-long-snapshot-name-".repeat(4));
    let path = scratch(&name, &p);
    let trace = converted(&[s(&path)]);
    let first_comment = trace.lines().nth(1).unwrap();
    assert!(first_comment.ends_with(&name), "{first_comment}");
    assert!(first_comment.contains(s(&path)), "{first_comment}");
}
