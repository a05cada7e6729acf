//! `--plot OUT`: memory over the input's events, drawn as SVG or PNG; the legend
//! gives each line's peak, so the picture can be checked against what was replayed.

use std::path::PathBuf;

use crate::cli::{flare_replay, stderr, stdout};
use crate::{s, scratch};

/// Where a test's picture goes (a fresh path: the file must not exist before).
fn out(name: &str) -> PathBuf {
    let p = scratch(name, "");
    std::fs::remove_file(&p).unwrap();
    p
}

fn svg(path: &PathBuf) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// A trace whose figures are known by hand: 3 MiB (two 2 MiB granules) and 2 MiB
/// live, then the 3 MiB freed and 1 MiB allocated (a granule).
const SMALL: &str = "# flare-trace v1\na 1 3145728\na 2 2097152\nf 1\na 3 1048576\n";

#[test]
fn the_legend_gives_each_line_and_its_peak() {
    let trace = scratch("plot-small.trace", SMALL);
    let pic = out("plot-small.svg");
    let o = flare_replay(&["--plot", s(&pic), s(&trace)]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The table is printed as without --plot.
    assert!(stdout(&o).contains("| exact"), "{}", stdout(&o));
    let text = svg(&pic);
    assert!(text.starts_with("<svg"), "{}", &text[..80.min(text.len())]);
    // none keeps every freed mapping inside the implicit scope: 4 + 2 + 2 MiB.
    assert!(text.contains("none (peak 8.00 MiB)"), "{text}");
    // exact: the 1 MiB request rounds to one granule; no 2 MiB mapping is idle (the
    // freed one is 4 MiB), so a new one: 4 + 2 + 2 = 8 MiB as well.
    assert!(text.contains("exact (peak 8.00 MiB)"), "{text}");
    // best-fit: the idle 4 MiB would exceed the 2 MiB rounded request by 100%, more
    // than the default 30%: a new mapping too.
    assert!(text.contains("best-fit (peak 8.00 MiB)"), "{text}");
    assert!(text.contains("segments (peak "), "{text}");
    // The lower bound: the peak of live rounded bytes, 4 + 2 MiB.
    assert!(text.contains("lower bound (6.00 MiB)"), "{text}");
    assert!(text.contains("live bytes"), "{text}");
    assert!(text.contains("memory over 4 events"), "{text}");
}

#[test]
fn the_peaks_drawn_are_the_replays_peaks() {
    // Two ways to the same figure: the replay's own peak (the pool's counter, in
    // the JSON rows) and the largest value the plot's samples read after each event.
    let trace = "../tests/data/graph-warmup-20sizes.segment.trace";
    let pic = out("plot-warmup.svg");
    let o = flare_replay(&["--json", "--plot", s(&pic), trace]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = svg(&pic);
    let rows: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4);
    for row in rows {
        let peak = row["peak_physical_bytes"].as_u64().unwrap() as f64 / (1u64 << 30) as f64;
        let label = format!("{} (peak {peak:.2} GiB)", row["policy"].as_str().unwrap());
        assert!(text.contains(&label), "{label} not in the plot");
    }
    assert!(text.contains("lower bound (28.58 GiB)"), "{text}");
}

#[test]
fn a_replay_that_runs_out_of_memory_stops_at_its_event() {
    // Three 2 MiB allocations on a 4 MiB device: the third (event 2) finds it full.
    let trace = scratch(
        "plot-oom.trace",
        "# flare-trace v1\na 1 2097152\na 2 2097152\na 3 2097152\n",
    );
    let pic = out("plot-oom.svg");
    let o = flare_replay(&[
        "--policy",
        "none",
        "--capacity",
        "4MiB",
        "--plot",
        s(&pic),
        s(&trace),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(svg(&pic).contains("none: out of memory at event 2"));
}

#[test]
fn png_by_its_extension() {
    let trace = scratch("plot-png.trace", SMALL);
    let pic = out("plot-small.PNG");
    let o = flare_replay(&["--plot", s(&pic), s(&trace)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&pic).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn recorded_traces_and_pytorch_snapshots_plot_too() {
    let recorded = scratch("plot-recorded.trace", crate::RECORDED_EXACT);
    let pic = out("plot-recorded.svg");
    let o = flare_replay(&["--as-recorded", "--plot", s(&pic), s(&recorded)]);
    assert!(o.status.success(), "{}", stderr(&o));
    // No scope in a recorded pool: the 4 MiB mapping is released at its free, so
    // the peak is 4 + 2 MiB (as the as-recorded test's JSON says).
    assert!(
        svg(&pic).contains("as recorded (peak 6.00 MiB)"),
        "{}",
        svg(&pic)
    );

    let pic = out("plot-snapshot.svg");
    let o = flare_replay(&[
        "--policy",
        "segments",
        "--plot",
        s(&pic),
        "../tests/data/torch/torch-eager.pickle",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(svg(&pic).contains("segments (peak "));
}

#[test]
fn one_input_and_a_known_extension_or_nothing_runs() {
    let trace = scratch("plot-refused.trace", SMALL);
    let pic = out("plot-refused.svg");
    let cases: [(&[&str], &str); 3] = [
        (
            &["--plot", s(&pic), s(&trace), s(&trace)],
            "--plot takes exactly one input, not 2",
        ),
        (
            &["--plot", "x.jpg", s(&trace)],
            "a plot is written as .svg or .png",
        ),
        (
            &["--plot", s(&pic), "--convert", "-", s(&trace)],
            "cannot be used with",
        ),
    ];
    for (args, message) in cases {
        let o = flare_replay(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(message), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{args:?} replayed");
        assert!(!pic.exists(), "{args:?} drew");
    }
    // A picture that cannot be written: a failure (1), after the table.
    let o = flare_replay(&["--plot", "/nonexistent-dir/x.svg", s(&trace)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--plot"), "{}", stderr(&o));
}

#[test]
fn the_pictures_in_the_docs_are_what_the_tool_draws() {
    // README.md and docs/flare-replay.md show this picture: redrawn, it must be the
    // same bytes (re-make it with the command in docs/flare-replay.md when the plot
    // or the replay changes).
    // Run from the repository's root, as the docs' command is (the title names the
    // trace by the path given).
    let pic = out("plot-docs.svg");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_flare-replay"))
        .current_dir("..")
        .args([
            "--plot",
            s(&pic),
            "tests/data/graph-warmup-20sizes.segment.trace",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let committed =
        std::fs::read_to_string("../docs/img/graph-warmup-20sizes.segment.svg").unwrap();
    assert!(
        svg(&pic) == committed,
        "docs/img/graph-warmup-20sizes.segment.svg is not what `flare-replay --plot` draws now"
    );
}
