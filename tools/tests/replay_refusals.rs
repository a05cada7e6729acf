//! `flare-replay` refuses a trace whose replay would fail for a reason its text
//! shows before it replays anything (issue 34, item 3): exit 2, the file, line and
//! problem on stderr, nothing on stdout, however many good traces come before it.
//! Before, these traces parsed and their replay failed half-way (exit 1), after the
//! traces before them had replayed.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

mod cli;
#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};

use cli::{flare_replay, stderr, stdout};
use common::data;

/// The `# flare-pool` header of a recorded trace (every key).
const POOL: &str = "# flare-pool policy=best-fit granularity=2097152 device_total=1073741824 \
    release_threshold=0 best_fit_waste_percent=30 cross_stream=when-complete \
    segment_whole_threshold=18446744073709551615 thread_cache_entries=0 \
    thread_cache_bytes=0 device=0 peers=none\n";

/// A scratch file with `text`, unique per test.
fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flare-replay-refusals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `flare-replay` on a good trace then `text` (as `name`), plain and (when the text
/// is a recording's) `--as-recorded`: exit 2, `name:line:` and `needle` on stderr,
/// nothing replayed (no row of the good trace on stdout).
#[track_caller]
fn refused_before_anything_runs(name: &str, text: &str, line: usize, needle: &str) {
    let bad = scratch(name, text);
    let good_plain = data("eager-prefill-20shapes.segment.trace");
    let good_recorded = scratch(&format!("good-{name}"), &format!("{POOL}a g 4096\nf g\n"));
    let mut runs = vec![vec!["--json", s(&good_plain), s(&bad)]];
    if text.contains("# flare-pool") {
        runs.push(vec!["--json", "--as-recorded", s(&good_recorded), s(&bad)]);
    }
    for args in runs {
        let o = flare_replay(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("{}:{line}: ", bad.display())),
            "{args:?}: {err}"
        );
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(stdout(&o).is_empty(), "{args:?}: {}", stdout(&o));
    }
}

#[test]
fn an_allocation_of_a_sleeping_tag_replays_nothing() {
    refused_before_anything_runs(
        "asleep-a.trace",
        &format!("{POOL}a 1 4096 1\nsleep 1 offload\na 2 4096 1\n"),
        4,
        "an allocation (a) of tag 1, which is asleep (since line 3)",
    );
}

#[test]
fn a_free_of_a_sleeping_tags_allocation_replays_nothing() {
    refused_before_anything_runs(
        "asleep-f.trace",
        &format!("{POOL}a 1 4096 1\nsleep 1 offload\nf 1\n"),
        4,
        "a free (f) of tag 1, which is asleep",
    );
}

#[test]
fn a_sleep_inside_a_scope_replays_nothing() {
    refused_before_anything_runs(
        "begin-sleep.trace",
        &format!("{POOL}begin\na 1 4096 1\nsleep 1 offload\n"),
        4,
        "sleep inside a retention scope (opened on line 2)",
    );
}

#[test]
fn an_oom_count_no_allocation_gets_replays_nothing() {
    refused_before_anything_runs(
        "oom.trace",
        &format!("{POOL}a 1 4096\noom 2\na 2 4096\n"),
        4,
        "oom 2 (line 3) before an `a` line",
    );
}

#[test]
fn a_peer_beyond_the_simulated_machine_replays_nothing() {
    refused_before_anything_runs(
        "peer.trace",
        &format!(
            "# flare-trace v1\n{}a 1 4096\n",
            POOL.replace("peers=none", "peers=129")
        ),
        2,
        "no simulated pool replays it",
    );
}

#[test]
fn an_unknown_keyword_is_refused_with_every_keyword_named() {
    refused_before_anything_runs(
        "unknown.trace",
        "a 1 4096\nalloc 2 4096\n",
        2,
        "unknown keyword \"alloc\" (keywords: a, f, begin, finish, abort, trim, step; \
         recorded traces also r, done, oom, x, sleep, wake, forget)",
    );
}

#[test]
fn a_recorded_only_keyword_in_a_plain_trace_replays_nothing() {
    refused_before_anything_runs(
        "stray-x.trace",
        "a 1 4096\nx 2\n",
        2,
        "`x` is a line of recorded traces only",
    );
}

/// Stream-ordered lines replay on the simulated driver only: with `--backend cuda`
/// they are refused before anything runs (not after the traces before them).
#[test]
fn stream_lines_under_the_cuda_backend_replay_nothing() {
    let bad = scratch("streams.trace", &format!("{POOL}a 1 4096 0 0x5\nf 1 0x5\n"));
    let good = data("eager-prefill-20shapes.segment.trace");
    let o = flare_replay(&["--json", "--backend", "cuda", s(&good), s(&bad)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("simulated backend only"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}
