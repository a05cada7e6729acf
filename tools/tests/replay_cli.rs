//! The `flare-replay` command line: exit statuses, error messages, `--json` output,
//! the table. One concern in one file: what a user of the command sees.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

mod cli;
#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cli::{flare_replay, stderr, stdout};
use common::data;

/// A scratch file with `text`, unique per test.
fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flare-replay-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn malformed_trace_exits_2_naming_file_line_and_problem() {
    let bad = scratch("bad-size.trace", "# flare-trace v1\na 1 4096\n\na 2 0x10\n");
    let o = flare_replay(&[s(&bad)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains(&format!("{}:4:", bad.display())), "{err}");
    assert!(err.contains("not a decimal number"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}

#[test]
fn malformed_trace_under_json_prints_nothing_on_stdout() {
    let bad = scratch("free-not-live.trace", "a 1 4096\nf 1\nf 1\n");
    let o = flare_replay(&["--json", s(&bad)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains(":3:"), "{}", stderr(&o));
    assert!(stderr(&o).contains("not live"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
}

#[test]
fn a_bad_trace_after_a_good_one_runs_nothing() {
    let bad = scratch("unknown-keyword.trace", "a 1 4096\nmalloc 2 4096\n");
    let good = data("eager-prefill-20shapes.segment.trace");
    let o = flare_replay(&["--json", s(&good), s(&bad)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!("{}:2:", bad.display())),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("unknown keyword"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}

#[test]
fn missing_file_is_a_clear_error() {
    let o = flare_replay(&["/nonexistent/flare/no-such.trace"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("/nonexistent/flare/no-such.trace"), "{err}");
    assert!(err.contains("cannot read"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_arguments_exit_2() {
    let good = data("eager-prefill-20shapes.segment.trace");
    for args in [
        vec!["--policy", "first-fit", s(&good)],
        vec!["--capacity", "12XB", s(&good)],
        vec!["--capacity", "0", s(&good)],
        vec!["--backend", "rocm", s(&good)],
        vec!["--backend", "cuda", "--capacity", "96GiB", s(&good)],
        vec![],
    ] {
        let o = flare_replay(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).is_empty(), "{args:?}");
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
}

const JSON_KEYS: [&str; 10] = [
    "allocations",
    "backend",
    "final_physical_bytes",
    "mappings_created",
    "out_of_memory_at_line",
    "peak_physical_bytes",
    "policy",
    "reuse_hits",
    "seconds",
    "trace",
];

#[test]
fn json_has_exactly_the_keys() {
    let a = data("eager-prefill-20shapes.segment.trace");
    let b = data("graph-warmup-20sizes.segment.trace");
    let o = flare_replay(&["--json", s(&a), s(&b)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 8, "two traces x four policies: {out}");
    let mut policies = Vec::new();
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let obj = v.as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, JSON_KEYS);
        assert_eq!(obj["backend"], "sim");
        assert!(obj["out_of_memory_at_line"].is_null());
        assert_eq!(obj["final_physical_bytes"], 0);
        assert!(obj["seconds"].is_f64());
        policies.push(obj["policy"].as_str().unwrap().to_string());
    }
    assert_eq!(
        policies,
        ["none", "exact", "best-fit", "segments", "none", "exact", "best-fit", "segments"]
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(lines[0]).unwrap()["trace"],
        s(&a)
    );
}

#[test]
fn json_reports_out_of_memory_with_its_line() {
    let t = data("graph-warmup-20sizes.tensor.trace");
    let o = flare_replay(&["--json", "--policy", "none", "--capacity", "96GiB", s(&t)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["policy"], "none");
    assert!(v["out_of_memory_at_line"].as_u64().unwrap() > 1);
    assert_eq!(v["final_physical_bytes"], 0);
    assert!(v["peak_physical_bytes"].as_u64().unwrap() <= 96 << 30);
}

#[test]
fn table_shows_the_reference_figures_and_every_policy() {
    let t = data("graph-warmup-20sizes.segment.trace");
    let o = flare_replay(&[s(&t)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("lower bound 28.58 GiB"), "{out}");
    assert!(out.contains("no reuse 53.43 GiB"), "{out}");
    for p in ["none", "exact", "best-fit"] {
        assert!(out.contains(p), "{out}");
    }
    // stderr is not a terminal here: no progress bar
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
}

#[test]
fn cuda_backend_without_cuda_is_a_clear_error() {
    let t = data("eager-prefill-20shapes.segment.trace");
    let o = flare_replay(&["--backend", "cuda", "--policy", "exact", s(&t)]);
    if o.status.success() {
        return; // a machine with CUDA
    }
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("no CUDA driver"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(stdout(&o).is_empty());
}

/// The cells of the rows of the first table in `out` (comfy-table's ASCII borders,
/// header lines above the `+===+` line, one line per data row): the header first,
/// its lines joined per column ("live at" over "end" is "live at end"), then each
/// data row; cells trimmed, border lines skipped.
fn table_rows(out: &str) -> Vec<Vec<String>> {
    let cells = |l: &str| -> Vec<String> {
        let inner = l.trim().trim_start_matches('|').trim_end_matches('|');
        inner.split('|').map(|c| c.trim().to_string()).collect()
    };
    let mut header: Vec<String> = Vec::new();
    let mut rows = Vec::new();
    let mut in_header = true;
    for l in out.lines() {
        if l.starts_with("+=") {
            in_header = false;
        } else if l.starts_with("+-") && !in_header {
            break; // the bottom border
        } else if l.starts_with('|') {
            if in_header {
                let c = cells(l);
                header.resize(c.len(), String::new());
                for (h, part) in header.iter_mut().zip(c) {
                    if !part.is_empty() {
                        *h = if h.is_empty() {
                            part
                        } else {
                            format!("{h} {part}")
                        };
                    }
                }
            } else {
                rows.push(cells(l));
            }
        }
    }
    assert!(!header.is_empty(), "no table header: {out}");
    std::iter::once(header).chain(rows).collect()
}

/// The "live at end" column of every data row, by policy.
fn live_at_end_by_policy(out: &str) -> Vec<(String, String)> {
    let rows = table_rows(out);
    let header = &rows[0];
    let col = header
        .iter()
        .position(|h| h == "live at end")
        .unwrap_or_else(|| panic!("no \"live at end\" column: {out}"));
    let policy = header.iter().position(|h| h == "policy").unwrap();
    rows[1..]
        .iter()
        .map(|r| (r[policy].clone(), r[col].clone()))
        .collect()
}

#[test]
fn table_reports_allocations_live_at_the_end() {
    // The segment trace's 21 segments are never freed (tests/data/README.md): all 21
    // are live when the trace ends, under every policy, and all are released.
    let t = data("eager-prefill-20shapes.segment.trace");
    let text = std::fs::read_to_string(&t).unwrap();
    let allocs = text.lines().filter(|l| l.starts_with("a ")).count();
    let frees = text.lines().filter(|l| l.starts_with("f ")).count();
    assert_eq!((allocs, frees), (21, 0));
    let o = flare_replay(&[s(&t)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(
        live_at_end_by_policy(&out),
        [
            ("none".to_string(), "21".to_string()),
            ("exact".to_string(), "21".to_string()),
            ("best-fit".to_string(), "21".to_string()),
            ("segments".to_string(), "21".to_string()),
        ],
        "{out}"
    );
    // released: the final physical memory is zero (the JSON keys are unchanged)
    let o = flare_replay(&["--json", "--policy", "exact", s(&t)]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["final_physical_bytes"], 0);
    assert!(v.get("live_at_end").is_none());
}

#[test]
fn live_at_end_of_a_small_trace() {
    // x, y, z freed; w and v still live: 2 at the end. A trace that frees everything: 0.
    let two = scratch(
        "two-live.trace",
        "a x 4096\na y 4096\nf x\na z 4096\nf y\nf z\na w 1\na v 1\n",
    );
    let o = flare_replay(&["--policy", "exact", s(&two)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        live_at_end_by_policy(&stdout(&o)),
        [("exact".to_string(), "2".to_string())]
    );
    let none = scratch("none-live.trace", "a x 4096\nf x\n");
    let o = flare_replay(&["--policy", "none", s(&none)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        live_at_end_by_policy(&stdout(&o)),
        [("none".to_string(), "0".to_string())]
    );
}

#[test]
fn version_and_help_name_the_tool() {
    let o = flare_replay(&["--version"]);
    assert!(o.status.success());
    assert_eq!(
        stdout(&o).trim(),
        format!("flare-replay {}", env!("CARGO_PKG_VERSION"))
    );
    let o = flare_replay(&["--help"]);
    assert!(o.status.success());
    let help = stdout(&o);
    assert!(help.starts_with("Replay flare-trace v1"), "{help}");
    assert!(!help.contains(env!("CARGO_PKG_DESCRIPTION")), "{help}");
    assert!(help.contains("Usage: flare-replay"), "{help}");
    assert!(help.contains("Exit status:"), "{help}");
    for line in [
        "0  every replay ran",
        "1  a pool could not be created, a replay failed, or writing the output failed",
        "2  bad input",
    ] {
        assert!(help.contains(line), "{line:?} in {help}");
    }
}

#[test]
fn policy_names_are_exact() {
    let t = scratch("one.trace", "a 1 4096\nf 1\n");
    for name in [
        "best_fit",
        "bestfit",
        "Best-Fit",
        "EXACT",
        "All",
        " none",
        "best-fit,exact",
        "Segments",
        "segment",
    ] {
        let o = flare_replay(&["--policy", name, s(&t)]);
        assert_eq!(o.status.code(), Some(2), "{name:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("none, exact, best-fit, segments or all"),
            "{name:?}: {}",
            stderr(&o)
        );
        assert!(stdout(&o).is_empty(), "{name:?}");
    }
    for (name, rows) in [
        ("none", 1),
        ("exact", 1),
        ("best-fit", 1),
        ("segments", 1),
        ("all", 4),
    ] {
        let o = flare_replay(&["--json", "--policy", name, s(&t)]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        assert_eq!(stdout(&o).lines().count(), rows, "{name}");
    }
}

/// Starts flare-replay with `stdin` and piped stdout and stderr.
fn spawn(args: &[&str], stdin: Stdio) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_flare-replay"))
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run flare-replay")
}

/// Runs flare-replay with stdout a pipe that is closed after its first line has been
/// read (as `flare-replay ... | head -1` does); returns that line and the output
/// (status, stderr).
fn closed_after_first_line(args: &[&str]) -> (String, Output) {
    let mut child = spawn(args, Stdio::null());
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    drop(reader);
    (first, child.wait_with_output().unwrap())
}

#[test]
fn closed_stdout_stops_quietly_with_status_0() {
    // 1000 traces: about 800 KB of tables and 750 KB of JSON, far more than a pipe
    // holds (64 KiB), so the tool is still writing when the reader goes away.
    let t = scratch("pipe.trace", "a 1 4096\nf 1\n");
    let many: Vec<&str> = std::iter::repeat_n(s(&t), 1000).collect();
    for json in [false, true] {
        let mut args = many.clone();
        if json {
            args.insert(0, "--json");
        }
        let (first, o) = closed_after_first_line(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "--json {json}: {err}");
        assert!(err.is_empty(), "--json {json}: {err}");
        if json {
            assert!(first.starts_with("{\"trace\":"), "{first}");
        } else {
            assert_eq!(first.trim_end(), s(&t));
        }
    }
}

#[test]
fn capacity_below_one_granule_is_rejected_with_the_granularity() {
    // The simulated device's granularity is 2 MiB (an H200's, SimConfig): a smaller
    // device could not map anything, so every policy would run out of memory at once.
    let t = scratch("granule.trace", "a 1 4096\nf 1\n");
    for capacity in ["1", "1M", "0", "2097151", "1.9999M", "0.001G"] {
        let o = flare_replay(&["--capacity", capacity, s(&t)]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{capacity}: {err}");
        assert!(err.contains("granularity"), "{capacity}: {err}");
        assert!(err.contains("2097152 B (2.0 MiB)"), "{capacity}: {err}");
        assert!(stdout(&o).is_empty(), "{capacity}");
    }
    // one granule is enough for this trace (4 KiB rounds up to one 2 MiB mapping)
    for capacity in ["2097152", "2M", "2MiB"] {
        let o = flare_replay(&["--json", "--policy", "exact", "--capacity", capacity, s(&t)]);
        assert!(o.status.success(), "{capacity}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        assert!(v["out_of_memory_at_line"].is_null(), "{capacity}: {v}");
        assert_eq!(v["peak_physical_bytes"], 2 << 20, "{capacity}");
    }
}

/// The out-of-memory line of a one-policy JSON replay of `trace` on a device of
/// `capacity`.
fn oom_line(capacity: &str, trace: &Path) -> Option<u64> {
    let o = flare_replay(&[
        "--json",
        "--policy",
        "exact",
        "--capacity",
        capacity,
        s(trace),
    ]);
    assert!(o.status.success(), "{capacity}: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    v["out_of_memory_at_line"].as_u64()
}

#[test]
fn decimal_capacity_is_that_many_bytes() {
    // 1.5G is 1.5 * 2^30 = 1610612736 bytes = 768 granules of 2 MiB: a 1.5 GiB
    // allocation fits, one more granule does not.
    let t = scratch("one-and-a-half.trace", "a 1 1610612736\na 2 1\n");
    assert_eq!(oom_line("1.5G", &t), Some(2));
    assert_eq!(oom_line("1.5GiB", &t), Some(2));
    assert_eq!(oom_line("1536M", &t), Some(2));
    // 1.5 GB is 1.5e9 bytes, less than the first allocation
    assert_eq!(oom_line("1.5GB", &t), Some(1));
    // one granule more holds both
    assert_eq!(oom_line("1.502G", &t), None);
    for bad in ["1.5.G", ".G", "1,5G", "1.5e9"] {
        let o = flare_replay(&["--capacity", bad, s(&t)]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{bad}");
    }
}

#[test]
fn fractional_waste_percent_is_a_clear_error() {
    let t = scratch("waste.trace", "a 1 4096\nf 1\n");
    for bad in ["1.5", "30%", "abc", ""] {
        let o = flare_replay(&["--best-fit-waste-percent", bad, s(&t)]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {err}");
        assert!(
            err.contains("is not a whole number of percent"),
            "{bad:?}: {err}"
        );
        assert!(!err.contains("invalid digit"), "{bad:?}: {err}");
    }
    let o = flare_replay(&["--best-fit-waste-percent", "4294967296", s(&t)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("is more than 4294967295 percent"),
        "{}",
        stderr(&o)
    );
    for good in ["0", "30", "4294967295"] {
        let o = flare_replay(&["--json", "--best-fit-waste-percent", good, s(&t)]);
        assert!(o.status.success(), "{good}: {}", stderr(&o));
    }
}

/// Runs flare-replay with `input` on its standard input.
fn flare_replay_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = spawn(args, Stdio::piped());
    let mut stdin = child.stdin.take().unwrap();
    // A rejected run may exit before reading: a failed write is not the test's point.
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().unwrap()
}

#[test]
fn dash_reads_a_trace_from_standard_input_once() {
    let file = data("graph-warmup-20sizes.segment.trace");
    let text = std::fs::read(&file).unwrap();
    let from_file = flare_replay(&["--json", s(&file)]);
    let from_stdin = flare_replay_stdin(&["--json", "-"], &text);
    assert!(from_stdin.status.success(), "{}", stderr(&from_stdin));
    let (a, b) = (stdout(&from_file), stdout(&from_stdin));
    assert_eq!(a.lines().count(), 4);
    for (f, i) in a.lines().zip(b.lines()) {
        let mut f: serde_json::Value = serde_json::from_str(f).unwrap();
        let mut i: serde_json::Value = serde_json::from_str(i).unwrap();
        assert_eq!(i["trace"], "<stdin>");
        for v in [&mut f, &mut i] {
            let o = v.as_object_mut().unwrap();
            o.remove("trace");
            o.remove("seconds");
        }
        assert_eq!(f, i);
    }
    // with a file: reports in argument order
    let o = flare_replay_stdin(&["--json", "--policy", "exact", s(&file), "-"], &text);
    assert!(o.status.success(), "{}", stderr(&o));
    let traces: Vec<String> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["trace"].to_string())
        .collect();
    assert_eq!(
        traces,
        [format!("{:?}", s(&file)), "\"<stdin>\"".to_string()]
    );
    // errors name it <stdin>, with the line
    let o = flare_replay_stdin(&["-"], b"a 1 5\nmalloc 2 5\n");
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("<stdin>:2: unknown keyword"),
        "{}",
        stderr(&o)
    );
    // only once
    let o = flare_replay_stdin(&["-", "-"], &text);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("only once"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
}

#[test]
fn a_huge_bad_token_gives_a_short_message() {
    // A 10 MB unknown keyword on line 2: the message quotes its first 40 characters
    // and gives its length.
    let token = "k".repeat(10_000_000);
    let bad = scratch("huge-token.trace", &format!("a 1 5\n{token} 1\n"));
    let o = flare_replay(&[s(&bad)]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.len() < 300, "{} bytes: {}", err.len(), &err[..300]);
    assert!(
        err.contains(&format!("\"{}…\" (10000000 bytes)", "k".repeat(40))),
        "{err}"
    );
    assert!(err.contains(":2: unknown keyword"), "{err}");
    std::fs::remove_file(&bad).unwrap();
    // a huge size and a huge id
    for (text, what) in [
        (
            format!("a 1 {}\n", "9".repeat(10_000_000)),
            "allocation size",
        ),
        (format!("f {token}\n"), "free of allocation id"),
    ] {
        let bad = scratch("huge-field.trace", &text);
        let o = flare_replay(&[s(&bad)]);
        assert_eq!(o.status.code(), Some(2));
        let err = stderr(&o);
        assert!(err.len() < 300, "{what}: {} bytes", err.len());
        assert!(
            err.contains(what) && err.contains("(10000000 bytes)"),
            "{err}"
        );
        std::fs::remove_file(&bad).unwrap();
    }
}

#[test]
fn help_explains_policies_figures_json_keys_and_the_format() {
    let o = flare_replay(&["--help"]);
    assert!(o.status.success());
    let help = stdout(&o);
    assert!(help.contains("docs/trace-format.md"), "{help}");
    for term in [
        "none ",
        "exact ",
        "best-fit ",
        "lower bound",
        "no reuse",
        "peak physical",
        "final physical",
        "mappings created",
        "reuse hits",
        "out of memory",
        "live at end",
        "wall time",
        "standard input",
    ] {
        assert!(help.contains(term), "{term:?} in {help}");
    }
    // every --json key is listed, at the start of a line of its own
    for key in JSON_KEYS {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{key} "))),
            "{key:?} in {help}"
        );
    }
    // -h is the summary and points to the format and to --help
    let o = flare_replay(&["-h"]);
    assert!(o.status.success());
    let short = stdout(&o);
    assert!(short.contains("docs/trace-format.md"), "{short}");
    assert!(short.contains("--help"), "{short}");
    assert!(short.len() < help.len());
}

#[test]
fn table_names_each_trace_once_and_fits_100_columns() {
    let traces: Vec<PathBuf> = [
        "eager-prefill-20shapes.tensor.trace",
        "eager-prefill-20shapes.segment.trace",
        "graph-warmup-20sizes.tensor.trace",
        "graph-warmup-20sizes.segment.trace",
    ]
    .iter()
    .map(|f| data(f))
    .collect();
    let args: Vec<&str> = traces.iter().map(|p| s(p)).collect();
    let o = flare_replay(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for line in out.lines() {
        assert!(
            line.chars().count() <= 100,
            "{} columns: {line}",
            line.chars().count()
        );
    }
    for t in &args {
        assert_eq!(out.matches(t).count(), 1, "{t} in {out}");
    }
    // the per-trace heading gives the events and `a` lines of the trace, counted
    // here from its text (tests/data/README.md: 35323 allocations)
    let text = std::fs::read_to_string(&traces[2]).unwrap();
    let events = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .count();
    let allocs = text.lines().filter(|l| l.starts_with("a ")).count();
    assert_eq!(allocs, 35323);
    assert!(
        out.contains(&format!("{events} events, {allocs} \"a\" lines;")),
        "{out}"
    );
    let rows = table_rows(&out);
    assert_eq!(
        rows[0],
        [
            "policy",
            "peak physical",
            "final physical",
            "mappings created",
            "reuse hits",
            "out of memory",
            "live at end",
            "wall time"
        ]
    );
    assert_eq!(rows.len(), 5, "{out}");
}

/// A trace with tags (issue 15) gets a census per policy and tag after its table;
/// one without gets none, and `--json` keeps its fixed keys.
#[test]
fn a_tagged_trace_prints_a_census_per_tag() {
    let tagged = scratch(
        "tagged.trace",
        "a w 1073741824 1\na k 2147483648 2\na t 3000000\nf t\na u 4194304 1\nf u\n",
    );
    let o = flare_replay(&["--policy", "best-fit", s(&tagged)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("census per tag at the end of the trace"),
        "{out}"
    );
    // best-fit, tag 1: one `a` line live (1 GiB), the 4 MiB it freed retained
    // idle in the replay's implicit scope, peak 1 GiB + 4 MiB.
    let row = out
        .lines()
        .find(|l| l.starts_with("| best-fit |   1 "))
        .unwrap_or_else(|| panic!("no row for tag 1: {out}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(
        cells[1..8],
        ["best-fit", "1", "2", "1.00 GiB", "1.00 GiB", "4.0 MiB", "1.00 GiB"]
    );
    let untagged = scratch("untagged.trace", "a w 1073741824\nf w\n");
    let o = flare_replay(&[s(&untagged)]);
    assert!(!stdout(&o).contains("census"), "{}", stdout(&o));
    let o = flare_replay(&["--json", "--policy", "exact", s(&tagged)]);
    assert!(o.status.success());
    assert_eq!(stdout(&o).lines().count(), 1);
}

/// `--as-recorded` replays with the header's configuration, and refuses the
/// options that would change it.
#[test]
fn as_recorded_uses_the_header_and_refuses_other_settings() {
    let recorded = scratch(
        "recorded.trace",
        "# flare-trace v1\n\
         # flare-pool policy=exact granularity=2097152 device_total=150323855360 \
         release_threshold=0 best_fit_waste_percent=30 cross_stream=when-complete \
         segment_whole_threshold=18446744073709551615 thread_cache_entries=32 \
         thread_cache_bytes=1073741824 device=0 peers=none\n\
         a 0x1000 3145728\na 0x2000 2097152\nf 0x1000\na 0x3000 1048576\n",
    );
    let o = flare_replay(&["--as-recorded", "--json", s(&recorded)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let row: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(row["policy"], "exact");
    // 3 MiB rounds up to two 2 MiB granules, live with the 2 MiB one: 6 MiB; the
    // 1 MiB comes after the 3 MiB's free (no scope: released), a handle of its own.
    assert_eq!(row["peak_physical_bytes"], 6 << 20);
    assert_eq!(row["mappings_created"], 3);
    for other in [
        &["--policy", "best-fit"][..],
        &["--capacity", "1GiB"],
        &["--backend", "sim"],
        &["--best-fit-waste-percent", "10"],
        &["--convert", "-"],
    ] {
        let mut args = vec!["--as-recorded"];
        args.extend_from_slice(other);
        args.push(s(&recorded));
        let o = flare_replay(&args);
        assert_eq!(o.status.code(), Some(2), "{other:?}");
        assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
        assert!(stdout(&o).is_empty());
    }
    // A trace without the header among recorded ones: refused before any replays
    // (no row of the first on the output).
    let plain = scratch(
        "plain.trace",
        "# flare-trace v1
a x 512
",
    );
    let o = flare_replay(&["--as-recorded", "--json", s(&recorded), s(&plain)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no `# flare-pool` header"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}
