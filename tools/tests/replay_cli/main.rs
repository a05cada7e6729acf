//! The `flare-replay` command line: exit statuses, error messages, `--json` output,
//! the table. One concern in one test binary: what a user of the command sees, a
//! module per behaviour.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../cli/mod.rs"]
mod cli;
#[path = "../../../tests/common/mod.rs"]
mod common;

mod arguments;
mod as_recorded;
mod bad_input;
mod growth;
mod help;
mod json;
mod plot;
mod stdio;
mod table;
mod viz;

use std::path::{Path, PathBuf};

/// A recorded trace (an `exact` pool, 2 MiB granularity): 3 MiB and 2 MiB live, the
/// 3 MiB freed (no scope: released), then 1 MiB.
const RECORDED_EXACT: &str = "# flare-trace v1\n\
     # flare-pool policy=exact granularity=2097152 device_total=150323855360 \
     release_threshold=0 best_fit_waste_percent=30 cross_stream=when-complete \
     segment_whole_threshold=18446744073709551615 thread_cache_entries=32 \
     thread_cache_bytes=1073741824 device=0 peers=none\n\
     a 0x1000 3145728\na 0x2000 2097152\nf 0x1000\na 0x3000 1048576\n";

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
