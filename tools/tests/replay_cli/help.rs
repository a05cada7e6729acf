//! `--version` and `--help`: the tool named, and the policies, figures, JSON keys
//! and trace format explained.

use crate::cli::{flare_replay, stdout};
use crate::json::JSON_KEYS;

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
