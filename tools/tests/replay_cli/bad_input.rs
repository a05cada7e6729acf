//! Bad input: a malformed or missing trace is a clear error (exit 2, the file, line
//! and problem named, a short message), and nothing is replayed.

use crate::cli::{flare_replay, stderr, stdout};
use crate::common::data;
use crate::{s, scratch};

#[test]
fn malformed_trace_exits_2_naming_file_line_and_problem() {
    let bad = scratch("bad-size.trace", "# flare-trace v1\na 1 4096\n\na 2 0x10\n");
    let o = flare_replay(&[s(&bad)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains(&format!("{}:4:", bad.display())), "{err}");
    assert!(err.contains("not a decimal number"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}

#[test]
fn malformed_trace_under_json_prints_nothing_on_stdout() {
    let bad = scratch("free-not-live.trace", "a 1 4096\nf 1\nf 1\n");
    let o = flare_replay(&["--json", s(&bad)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains(":3:"), "{}", stderr(&o));
    assert!(stderr(&o).contains("not live"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
}

#[test]
fn a_bad_trace_after_a_good_one_runs_nothing() {
    let bad = scratch("unknown-keyword.trace", "a 1 4096\nmalloc 2 4096\n");
    let good = data("eager-prefill-20shapes.segment.trace");
    let o = flare_replay(&["--json", s(&good), s(&bad)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!("{}:2:", bad.display())),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("unknown keyword"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}

#[test]
fn missing_file_is_a_clear_error() {
    let o = flare_replay(&["/nonexistent/flare/no-such.trace"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("/nonexistent/flare/no-such.trace"), "{err}");
    assert!(err.contains("cannot read"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_huge_bad_token_gives_a_short_message() {
    // A 10 MB unknown keyword on line 2: the message quotes its first 40 characters
    // and gives its length.
    let token = "k".repeat(10_000_000);
    let bad = scratch("huge-token.trace", &format!("a 1 5\n{token} 1\n"));
    let o = flare_replay(&[s(&bad)]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.len() < 300, "{} bytes: {}", err.len(), &err[..300]);
    assert!(
        err.contains(&format!("\"{}…\" (10000000 bytes)", "k".repeat(40))),
        "{err}"
    );
    assert!(err.contains(":2: unknown keyword"), "{err}");
    std::fs::remove_file(&bad).unwrap();
    // a huge size and a huge id
    for (text, what) in [
        (
            format!("a 1 {}\n", "9".repeat(10_000_000)),
            "allocation size",
        ),
        (format!("f {token}\n"), "free of allocation id"),
    ] {
        let bad = scratch("huge-field.trace", &text);
        let o = flare_replay(&[s(&bad)]);
        assert_eq!(o.status.code(), Some(2));
        let err = stderr(&o);
        assert!(err.len() < 300, "{what}: {} bytes", err.len());
        assert!(
            err.contains(what) && err.contains("(10000000 bytes)"),
            "{err}"
        );
        std::fs::remove_file(&bad).unwrap();
    }
}

/// Endless input on standard input (`-`): bytes that no flare-trace holds stop the
/// reading at the chunk that has them, and the parser refuses line 1 at once (exit 2),
/// instead of reading `/dev/zero` until memory runs out (a new user's try: 6.7 GB in 5
/// s, never finished). Endless zeros and endless random bytes.
#[test]
fn endless_binary_input_on_stdin_is_refused_at_once() {
    for (dev, problem) in [
        ("/dev/zero", "unknown keyword"),
        ("/dev/urandom", "not valid UTF-8"),
    ] {
        let input = std::fs::File::open(dev).expect("the device file");
        let started = std::time::Instant::now();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_flare-replay"))
            .arg("-")
            .stdin(input)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run flare-replay");
        // Reading on would take gigabytes; a chunk of 64 KiB takes microseconds.
        while child.try_wait().expect("wait").is_none() {
            if started.elapsed().as_secs() >= 10 {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{dev}: still reading after 10 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = child.wait_with_output().expect("its output");
        assert_eq!(o.status.code(), Some(2), "{dev}: {}", stderr(&o));
        assert!(stderr(&o).contains("<stdin>:1:"), "{dev}: {}", stderr(&o));
        assert!(stderr(&o).contains(problem), "{dev}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{dev}");
    }
}
