//! What the tools' command-line tests share: running `flare-replay` and reading its
//! output.
#![allow(dead_code)] // each test file uses its own part

use std::process::{Command, Output};

/// Runs the `flare-replay` built for these tests with `args`.
pub fn flare_replay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flare-replay"))
        .args(args)
        .output()
        .expect("run flare-replay")
}

/// Its standard error, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Its standard output, as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
