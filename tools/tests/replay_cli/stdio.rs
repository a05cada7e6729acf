//! Standard input and output: `-` reads a trace from standard input (once), and a
//! standard output closed early stops the tool quietly with status 0.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};

use crate::cli::{flare_replay, stderr, stdout};
use crate::common::data;
use crate::{s, scratch};

/// Starts flare-replay with `stdin` and piped stdout and stderr.
fn spawn(args: &[&str], stdin: Stdio) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_flare-replay"))
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run flare-replay")
}

/// Runs flare-replay with stdout a pipe that is closed after its first line has been
/// read (as `flare-replay ... | head -1` does); returns that line and the output
/// (status, stderr).
fn closed_after_first_line(args: &[&str]) -> (String, Output) {
    let mut child = spawn(args, Stdio::null());
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    drop(reader);
    (first, child.wait_with_output().unwrap())
}

#[test]
fn closed_stdout_stops_quietly_with_status_0() {
    // 1000 traces: about 800 KB of tables and 750 KB of JSON, far more than a pipe
    // holds (64 KiB), so the tool is still writing when the reader goes away.
    let t = scratch("pipe.trace", "a 1 4096\nf 1\n");
    let many: Vec<&str> = std::iter::repeat_n(s(&t), 1000).collect();
    for json in [false, true] {
        let mut args = many.clone();
        if json {
            args.insert(0, "--json");
        }
        let (first, o) = closed_after_first_line(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "--json {json}: {err}");
        assert!(err.is_empty(), "--json {json}: {err}");
        if json {
            assert!(first.starts_with("{\"trace\":"), "{first}");
        } else {
            assert_eq!(first.trim_end(), s(&t));
        }
    }
}

/// Runs flare-replay with `input` on its standard input.
fn flare_replay_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = spawn(args, Stdio::piped());
    let mut stdin = child.stdin.take().unwrap();
    // A rejected run may exit before reading: a failed write is not the test's point.
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().unwrap()
}

#[test]
fn dash_reads_a_trace_from_standard_input_once() {
    let file = data("graph-warmup-20sizes.segment.trace");
    let text = std::fs::read(&file).unwrap();
    let from_file = flare_replay(&["--json", s(&file)]);
    let from_stdin = flare_replay_stdin(&["--json", "-"], &text);
    assert!(from_stdin.status.success(), "{}", stderr(&from_stdin));
    let (a, b) = (stdout(&from_file), stdout(&from_stdin));
    assert_eq!(a.lines().count(), 4);
    for (f, i) in a.lines().zip(b.lines()) {
        let mut f: serde_json::Value = serde_json::from_str(f).unwrap();
        let mut i: serde_json::Value = serde_json::from_str(i).unwrap();
        assert_eq!(i["trace"], "<stdin>");
        for v in [&mut f, &mut i] {
            let o = v.as_object_mut().unwrap();
            o.remove("trace");
            o.remove("seconds");
        }
        assert_eq!(f, i);
    }
    // with a file: reports in argument order
    let o = flare_replay_stdin(&["--json", "--policy", "exact", s(&file), "-"], &text);
    assert!(o.status.success(), "{}", stderr(&o));
    let traces: Vec<String> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["trace"].to_string())
        .collect();
    assert_eq!(
        traces,
        [format!("{:?}", s(&file)), "\"<stdin>\"".to_string()]
    );
    // errors name it <stdin>, with the line
    let o = flare_replay_stdin(&["-"], b"a 1 5\nmalloc 2 5\n");
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("<stdin>:2: unknown keyword"),
        "{}",
        stderr(&o)
    );
    // only once
    let o = flare_replay_stdin(&["-", "-"], &text);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("only once"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
}
