//! `--viz OUT.pickle` (issue 38): a memory_viz snapshot of the replay, taken when the
//! trace's events are done: read back by Python's `pickle` through the page's model
//! (`python/tests/memory_viz_model.py`), its allocated bytes those of the trace's
//! allocations still live then (computed here from the trace's text), one file per
//! policy when several are replayed, one input only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cli::{flare_replay, stderr};
use crate::common::data;
use crate::{s, scratch};

/// The page's model over `pickle`: its summary's `"key": value` pairs as text.
fn model(pickle: &Path) -> String {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../python/tests/memory_viz_model.py");
    let o = Command::new("python3")
        .arg(script)
        .arg(pickle)
        .output()
        .expect("python3 runs (the memory_viz model needs it)");
    assert!(
        o.status.success(),
        "model: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The bytes of the trace's allocations live at its end, each rounded up to `round`.
fn live_at_end(trace: &Path, round: u64) -> u64 {
    let mut live: BTreeMap<String, u64> = BTreeMap::new();
    for line in std::fs::read_to_string(trace).unwrap().lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["a", id, bytes, ..] => {
                live.insert(
                    id.to_string(),
                    bytes.parse::<u64>().unwrap().div_ceil(round) * round,
                );
            }
            ["f", id, ..] => {
                live.remove(*id);
            }
            _ => {}
        }
    }
    live.values().sum()
}

#[test]
fn viz_writes_the_live_memory_at_the_traces_end() {
    let trace = data("eager-prefill-20shapes.segment.trace");
    let out = scratch("viz-one.pickle", "");
    let o = flare_replay(&["--policy", "segments", "--viz", s(&out), s(&trace)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary = model(&out);
    let want = live_at_end(&trace, 512);
    assert!(want > 0);
    assert!(
        summary.contains(&format!("\"allocated_bytes\": {want},")),
        "{summary} (want {want} allocated)"
    );
    // Segment mode: one expandable segment holds them, a map precedes each alloc.
    assert!(summary.contains("\"segment_map\""), "{summary}");
}

#[test]
fn several_policies_write_one_file_each() {
    let trace = data("eager-prefill-20shapes.segment.trace");
    let out = scratch("viz-all.pickle", "");
    std::fs::remove_file(&out).unwrap();
    let o = flare_replay(&["--viz", s(&out), s(&trace)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let want = live_at_end(&trace, 2 << 20);
    for name in [
        "viz-all.none.pickle",
        "viz-all.exact.pickle",
        "viz-all.best-fit.pickle",
        "viz-all.segments.pickle",
    ] {
        let path = out.with_file_name(name);
        let summary = model(&path);
        // Whole mappings: a block is its mapping (rounded to 2 MiB), and exact
        // reuse gives each its exact size; every mapping holds one block.
        if name.contains("exact") {
            assert!(
                summary.contains(&format!("\"allocated_bytes\": {want},")),
                "{summary}"
            );
        }
        let _ = std::fs::remove_file(path);
    }
    assert!(
        !out.exists(),
        "OUT itself is not written with several policies"
    );
}

#[test]
fn viz_takes_one_input() {
    let a = data("eager-prefill-20shapes.segment.trace");
    let out = scratch("viz-two.pickle", "");
    let o = flare_replay(&["--viz", s(&out), s(&a), s(&a)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--viz takes exactly one input"),
        "{}",
        stderr(&o)
    );
}
