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
