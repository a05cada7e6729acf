//! `--growth`: each trace's growth report instead of a replay; the planted leak
//! named with its rate, the shipped traces silent, `--json`, `--step-events` and
//! `--min-steps`, and the options it refuses.

use crate::cli::{flare_replay, stderr, stdout};
use crate::common::data;
use crate::common::per_shape_leak::{self as leak, CALLS};
use crate::{s, scratch};

#[test]
fn the_planted_leak_is_named_and_the_shipped_traces_are_silent() {
    let leak_trace = data("planted/per-shape-leak.tensor.trace");
    let shipped = [
        data("eager-prefill-20shapes.segment.trace"),
        data("eager-prefill-20shapes.tensor.trace"),
        data("graph-warmup-20sizes.segment.trace"),
        data("graph-warmup-20sizes.tensor.trace"),
    ];
    let mut args = vec!["--growth", s(&leak_trace)];
    args.extend(shipped.iter().map(|p| s(p)));
    let o = flare_replay(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // One report per trace, in order, each after its path; nothing replayed.
    let reports: Vec<&str> = out.split("\n\n").filter(|r| !r.is_empty()).collect();
    assert_eq!(reports.len(), 5, "{out}");
    assert!(!out.contains("peak"), "no replay table: {out}");

    let r = reports[0];
    assert!(r.starts_with(&format!("{}\n", s(&leak_trace))), "{r}");
    assert!(r.contains("; 1 grows\n"), "{r}");
    assert!(
        r.contains(&format!("steps: {}, one per step marker", CALLS + 1)),
        "{r}"
    );
    let growing = r
        .lines()
        .skip_while(|l| !l.starts_with("growing"))
        .nth(1)
        .unwrap();
    assert!(
        growing.starts_with("  tag 0, a new size each step ("),
        "{growing}"
    );
    assert!(growing.contains("): 6 allocations and "), "{growing}");
    let per_step = flare_package::fmt_bytes(leak::leak_bytes_per_step().round() as u64);
    assert!(
        growing.ends_with(&format!(" and {per_step} per step")),
        "{growing}"
    );

    for (r, p) in reports[1..].iter().zip(&shipped) {
        assert!(r.starts_with(&format!("{}\n", s(p))), "{r}");
        assert!(r.contains("; none grows\n"), "{r}");
        assert!(r.contains("\ngrowing: none\n"), "{r}");
        assert!(r.contains("steps: "), "{r}");
        assert!(r.contains("at least 32\n  distinct steps"), "{r}");
    }
}

#[test]
fn growth_json_is_one_object_per_trace() {
    let a = data("planted/per-shape-leak.tensor.trace");
    let b = data("graph-warmup-20sizes.tensor.trace");
    let o = flare_replay(&["--growth", "--json", s(&a), s(&b)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    let (l, g) = (&lines[0], &lines[1]);
    assert_eq!(l["trace"], s(&a));
    assert_eq!(l["step_kind"], "markers");
    assert_eq!(l["steps"], CALLS + 1);
    assert_eq!(l["growing"], 1);
    let first = &l["groups"][0];
    assert_eq!(
        (first["tag"].as_u64(), first["grows"].as_bool()),
        (Some(0), Some(true))
    );
    assert!(first["bytes"].is_null(), "a new size each step: {first}");
    assert_eq!(first["allocations_per_step"], 6.0);
    assert_eq!(first["added_count"], 6 * CALLS);
    assert_eq!(first["steps_after_first"], CALLS);
    assert_eq!(first["bytes_per_step"], leak::leak_bytes_per_step());

    assert_eq!(g["trace"], s(&b));
    assert_eq!(
        (g["step_kind"].as_str(), g["step_events"].as_u64()),
        (Some("events"), Some(1000))
    );
    assert_eq!(
        (g["growing"].as_u64(), g["live_count"].as_u64()),
        (Some(0), Some(63))
    );
}

/// `--step-events` cuts a trace without markers or scopes into steps of N
/// allocations; `--min-steps` is the rule's threshold.
#[test]
fn step_events_and_min_steps() {
    // 40 allocations of 1 MiB kept, one every 3 allocations (the others freed).
    let mut text = String::from("# flare-trace v1\n");
    for i in 0..120u32 {
        text.push_str(&format!("a {i} 1048576\n"));
        if i % 3 != 0 {
            text.push_str(&format!("f {i}\n"));
        }
    }
    let p = scratch("growth-steps.trace", &text);
    let run = |extra: &[&str]| {
        let mut args = vec!["--growth", "--json"];
        args.extend_from_slice(extra);
        args.push(s(&p));
        let o = flare_replay(&args);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(stdout(&o).trim()).unwrap()
    };
    // Default: one step of 1000 allocations; nothing grows.
    let v = run(&[]);
    assert_eq!(
        (v["steps"].as_u64(), v["growing"].as_u64()),
        (Some(1), Some(0))
    );
    // Steps of 3: the 40 kept in 40 distinct steps, the last the last step.
    let v = run(&["--step-events", "3"]);
    assert_eq!(
        (v["steps"].as_u64(), v["growing"].as_u64()),
        (Some(40), Some(1))
    );
    assert_eq!(v["groups"][0]["distinct_steps"], 40);
    let v = run(&["--step-events", "3", "--min-steps", "41"]);
    assert_eq!(v["growing"], 0);
    assert_eq!(v["min_steps"], 41);
}

#[test]
fn growth_refuses_what_does_not_apply() {
    let t = data("graph-warmup-20sizes.segment.trace");
    for extra in [
        &["--growth", "--policy", "exact"][..],
        &["--growth", "--as-recorded"],
        &["--growth", "--capacity", "1G"],
        &["--growth", "--backend", "cuda"],
        &["--step-events", "5"],
        &["--min-steps", "5"],
        &["--growth", "--step-events", "0"],
    ] {
        let mut args = extra.to_vec();
        args.push(s(&t));
        let o = flare_replay(&args);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stdout(&o));
        assert!(stderr(&o).contains("error"), "{extra:?}: {}", stderr(&o));
    }
}
