//! `flare-bench-gpu --traces`: checked before anything is measured. On the simulated
//! backend a bad directory would otherwise be reported only after every other
//! benchmark ran (exit 1); checked first, it is an argument error (exit 2) at once.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

use std::path::PathBuf;
use std::process::{Command, Output};

fn bench(args: &[&str], cwd: Option<&std::path::Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flare-bench-gpu"));
    c.args(args);
    if let Some(dir) = cwd {
        c.current_dir(dir);
    }
    c.output().expect("run flare-bench-gpu")
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("flare-bench-gpu-cli-{}", std::process::id()))
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs with `--traces` (or the default when `None`) on the simulated backend and
/// checks the run stopped before any measurement: exit 2, nothing on stdout, no
/// JSON report. Returns stderr.
fn rejected(traces: Option<&str>, cwd: &std::path::Path) -> String {
    let json = cwd.join("report.json");
    let json = json.to_str().unwrap();
    let mut args = vec!["--backend", "sim", "--quick", "--json", json];
    if let Some(t) = traces {
        args.extend(["--traces", t]);
    }
    let o = bench(&args, Some(cwd));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(o.stdout.is_empty(), "{args:?}: measured before failing");
    assert!(
        !std::path::Path::new(json).exists(),
        "{args:?}: wrote a report"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        err.lines().count(),
        1,
        "one error line, nothing measured: {err}"
    );
    err
}

#[test]
fn missing_traces_directory_fails_before_measuring() {
    let cwd = scratch_dir("missing");
    let err = rejected(Some("/nonexistent/flare/traces"), &cwd);
    assert!(err.contains("--traces /nonexistent/flare/traces"), "{err}");
}

#[test]
fn directory_without_trace_files_fails_before_measuring() {
    let cwd = scratch_dir("empty");
    let dir = scratch_dir("empty/traces");
    std::fs::write(dir.join("notes.txt"), "not a trace").unwrap();
    std::fs::create_dir_all(dir.join("sub.trace")).unwrap(); // a directory, not a file
    let err = rejected(Some(dir.to_str().unwrap()), &cwd);
    assert!(err.contains("no *.trace file"), "{err}");
}

#[test]
fn the_default_is_relative_to_the_current_directory() {
    // A directory without tests/data: the default does not fall back to the
    // repository, and the error says where it looked.
    let cwd = scratch_dir("default");
    let err = rejected(None, &cwd);
    assert!(err.contains("--traces tests/data"), "{err}");
    assert!(err.contains("relative to the current directory"), "{err}");
    assert!(err.contains(cwd.to_str().unwrap()), "{err}");
}

#[test]
fn help_says_where_the_default_is_looked_up() {
    let o = bench(&["--help"], None);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.starts_with("Compare flare-package with"), "{help}");
    assert!(!help.contains(env!("CARGO_PKG_DESCRIPTION")), "{help}");
    assert!(help.contains("current directory"), "{help}");
    assert!(!help.contains("repository root)"), "{help}");
    let o = bench(&["--version"], None);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("flare-bench-gpu {}", env!("CARGO_PKG_VERSION"))
    );
}
