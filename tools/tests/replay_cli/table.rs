//! The table: the reference figures and a row per policy, the allocations live at
//! the end, each trace named once within 100 columns, and the census per tag.

use std::path::PathBuf;

use crate::cli::{flare_replay, stderr, stdout};
use crate::common::data;
use crate::{s, scratch};

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
