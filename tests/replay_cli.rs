//! The `flare-replay` command line: exit statuses, error messages, `--json` output.
//! Tests that replay need the simulated driver and are ignored until it is merged.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::data;

fn flare_replay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flare-replay"))
        .args(args)
        .output()
        .expect("run flare-replay")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

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
    assert_eq!(lines.len(), 6, "two traces x three policies: {out}");
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
        ["none", "exact", "best-fit", "none", "exact", "best-fit"]
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

/// The cells of the table's rows (comfy-table's ASCII borders), the header row
/// first: each row split on `|`, cells trimmed; border and separator lines skipped.
fn table_rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| l.starts_with('|') && !l.chars().all(|c| "|-+=".contains(c)))
        .map(|l| {
            let inner = l.trim().trim_start_matches('|').trim_end_matches('|');
            inner.split('|').map(|c| c.trim().to_string()).collect()
        })
        .collect()
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
        "1  a pool could not be created or a replay failed",
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
    ] {
        let o = flare_replay(&["--policy", name, s(&t)]);
        assert_eq!(o.status.code(), Some(2), "{name:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("none, exact, best-fit or all"),
            "{name:?}: {}",
            stderr(&o)
        );
        assert!(stdout(&o).is_empty(), "{name:?}");
    }
    for (name, rows) in [("none", 1), ("exact", 1), ("best-fit", 1), ("all", 3)] {
        let o = flare_replay(&["--json", "--policy", name, s(&t)]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        assert_eq!(stdout(&o).lines().count(), rows, "{name}");
    }
}
