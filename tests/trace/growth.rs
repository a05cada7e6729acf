//! The growth report of a trace (issue 38; `Trace::growth_report`): the planted
//! per-shape leak named with its rate, the shipped traces silent, the `step` line
//! (parsed, recorded by `Pool::mark_step`, replayed).

use std::collections::{BTreeSet, HashMap};

use crate::common::per_shape_leak::{self as leak, CALLS, WIDTHS};
use flare_package::growth::{GroupSize, GrowthOptions, StepKind, DEFAULT_MIN_STEPS};
use flare_package::trace::{self, Event};
use flare_package::{Pool, PoolConfig, ReusePolicy, SimConfig};

const LEAK_TRACE: &str = "tests/data/planted/per-shape-leak.tensor.trace";

/// The committed trace is the generator's output (`FLARE_BLESS_TRACE=1` writes it).
#[test]
fn the_committed_leak_trace_is_the_generators() {
    let want = leak::trace_text();
    if std::env::var_os("FLARE_BLESS_TRACE").is_some() {
        std::fs::write(LEAK_TRACE, &want).unwrap();
    }
    let got = std::fs::read_to_string(LEAK_TRACE).unwrap();
    assert!(
        got == want,
        "{LEAK_TRACE} is not tests/common/per_shape_leak.rs's output: \
         FLARE_BLESS_TRACE=1 cargo test --release --test trace growth:: writes it"
    );
}

/// The generator's own promises, checked on its parameters: every call's length is
/// new and no scratch size meets another live size (so each is made in one step).
#[test]
fn the_generator_makes_a_new_length_every_call() {
    let lengths = leak::lengths();
    assert_eq!(lengths.len() as u64, CALLS);
    const { assert!(CALLS >= 100, "a server loop of at least 100 calls") };
    let distinct: BTreeSet<u64> = lengths.iter().copied().collect();
    assert_eq!(distinct.len(), lengths.len());
    let mut sizes: Vec<u64> = lengths.iter().flat_map(|l| WIDTHS.map(|w| l * w)).collect();
    sizes.extend(leak::WEIGHTS.iter().map(|&(b, _)| b));
    sizes.extend([leak::KV_CACHE, leak::CACHE_ENTRY]);
    let n = sizes.len();
    sizes.sort_unstable();
    sizes.dedup();
    assert_eq!(sizes.len(), n, "a scratch size meets another live size");
}

/// The planted leak is named, alone, with 6 allocations and the generator's bytes per
/// step; the bounded cache (12 entries) and the weights are not growth.
#[test]
fn the_planted_leak_is_named_with_its_rate() {
    let t = trace::parse(LEAK_TRACE).unwrap();
    let r = t.growth_report(&GrowthOptions::default());
    assert_eq!(r.step_kind, StepKind::Markers);
    // Step 0 (the weights, before the first marker), then one step per call.
    assert_eq!(r.steps, CALLS + 1);
    assert_eq!(r.counts.markers, CALLS);

    let growing: Vec<_> = r.growing().collect();
    assert_eq!(growing.len(), 1, "{r}");
    let g = growing[0];
    assert_eq!(g.tag, 0);
    assert!(matches!(g.size, GroupSize::NewEachStep { .. }), "{r}");
    // Its growth: the six scratch tensors of each call, steps 1 to CALLS, over the
    // CALLS steps after its first (step 0: the weights and the KV cache, each size
    // made there only, pooled with it as its base).
    let per_token: u64 = WIDTHS.iter().sum();
    let leaked: u64 = leak::lengths().iter().map(|l| l * per_token).sum();
    assert_eq!(g.first_step, 0);
    assert_eq!(g.last_step, CALLS);
    assert_eq!(g.distinct_steps, CALLS + 1);
    assert_eq!(g.steps_after_first, CALLS);
    assert_eq!(g.added_count, 6 * CALLS);
    assert_eq!(g.added_bytes, leaked);
    assert_eq!(g.allocations_per_step(), 6.0);
    assert_eq!(g.bytes_per_step(), leak::leak_bytes_per_step());
    let weights: u64 = leak::WEIGHTS.iter().map(|&(_, n)| n).sum();
    assert_eq!(g.count, 6 * CALLS + weights + 1);
    let sizes = 6 * CALLS + leak::WEIGHTS.len() as u64 + 1;
    assert_eq!(g.size, GroupSize::NewEachStep { sizes });

    // The cache: one entry every tenth call, 12 steps, below the 32 of the rule.
    let cache = r
        .groups
        .iter()
        .find(|g| g.size == GroupSize::Bytes(leak::CACHE_ENTRY))
        .unwrap();
    assert_eq!((cache.count, cache.distinct_steps), (12, 12));
    assert!(!cache.grows);
    assert_eq!(r.groups.len(), 2, "{r}");

    // The text names it first, with its rate.
    let text = r.to_string();
    let line = text.lines().nth(7).unwrap();
    assert!(
        line.starts_with(&format!("  tag 0, a new size each step ({sizes} sizes): ")),
        "{text}"
    );
    assert!(line.contains("): 6 allocations and "), "{text}");
}

/// A shipped trace's survivors (`a` lines never freed), each with its allocation's
/// index among the `a` lines: read from the file here, not by the library's parser.
fn survivors(path: &str) -> (Vec<(u64, u64)>, u64) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut live: HashMap<&str, (u64, u64)> = HashMap::new();
    let mut allocations = 0u64;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["a", id, bytes, ..] => {
                live.insert(id, (bytes.parse().unwrap(), allocations));
                allocations += 1;
            }
            ["f", id, ..] => {
                live.remove(id);
            }
            ["step" | "begin", ..] => panic!("{path}: the shipped traces have no steps"),
            _ => {}
        }
    }
    (live.into_values().collect(), allocations)
}

/// The shipped traces report no growth under the defaults: their survivors come
/// from fewer distinct 1000-allocation steps than the rule's 32 (no group can
/// reach it), which this computes from the files themselves. The graph-warmup
/// tensor trace's 63 survivors (3 per graph captured) come from 21 distinct steps (23 if
/// a step were 1000 lines, `a` and `f`, not 1000 allocations).
#[test]
fn the_shipped_traces_report_no_growth() {
    let mut paths: Vec<String> = std::fs::read_dir("tests/data")
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.ends_with(".trace"))
        .collect();
    paths.sort();
    assert_eq!(paths.len(), 4, "{paths:?}");
    for path in &paths {
        let (live, allocations) = survivors(path);
        let steps: BTreeSet<u64> = live.iter().map(|&(_, i)| i / 1000).collect();
        assert!(
            (steps.len() as u64) < DEFAULT_MIN_STEPS,
            "{path}: survivors in {} steps",
            steps.len()
        );
        if path.ends_with("graph-warmup-20sizes.tensor.trace") {
            assert_eq!((live.len(), steps.len()), (63, 21), "{path}");
        }
        let r = trace::parse(path)
            .unwrap()
            .growth_report(&GrowthOptions::default());
        assert_eq!(r.step_kind, StepKind::Events(1000), "{path}");
        assert_eq!(r.steps, allocations.div_ceil(1000).max(1), "{path}");
        assert_eq!(r.live_count, live.len() as u64, "{path}");
        assert!(!r.grows(), "{path}:\n{r}");
        assert!(r.to_string().contains("\ngrowing: none\n"), "{path}");
    }
}

/// `step` takes no field; it is allowed in any trace (not only recordings), inside
/// or outside a scope, between any two calls.
#[test]
fn the_step_line() {
    let t = trace::parse_str("t", "step\na 1 512\nbegin\nstep\nfinish\nstep\n").unwrap();
    assert_eq!(t.events()[0], Event::Step);
    assert_eq!(Event::Step.to_string(), "step");
    let err = trace::parse_str("t", "step 1\n").unwrap_err();
    assert_eq!(err.line(), Some(1));
    assert!(err.to_string().contains("`step`"), "{err}");
    let r = t.growth_report(&GrowthOptions::default());
    assert_eq!((r.counts.markers, r.counts.scopes), (3, 1));
    assert_eq!(r.groups[0].first_step, 1);
}

/// `Pool::mark_step` is recorded as a `step` line; the recording's growth report is
/// the recorded pool's, and so is its replay's (as recorded).
#[test]
fn mark_step_is_recorded_and_replayed() {
    let dir = std::env::temp_dir().join(format!("flare-growth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("steps.trace");
    let config = PoolConfig {
        record_path: Some(path.clone()),
        reuse_policy: ReusePolicy::BestFit,
        ..PoolConfig::simulated(SimConfig::default())
    };
    let pool = Pool::new(config).unwrap();
    let mut kept = Vec::new();
    for i in 1..=40u64 {
        pool.mark_step();
        kept.push(pool.allocate_raw(i << 20).unwrap());
        let t = pool.allocate_raw(3 << 20).unwrap();
        pool.free_raw(t).unwrap();
    }
    let options = GrowthOptions::default();
    let live = pool.growth_report(&options);
    assert_eq!(live.counts.markers, 40);
    assert!(live.grows(), "{live}");
    pool.record_flush();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().filter(|l| *l == "step").count(), 40);
    let t = trace::parse(&path).unwrap();
    assert_eq!(t.growth_report(&options), live);

    // The replay marks the steps too (it frees what is live at the end: nothing is
    // left to group, but the markers are counted).
    let replayed = Pool::new(t.recorded_config().unwrap().pool_config()).unwrap();
    trace::replay_as_recorded(&replayed, &t, None).unwrap();
    let after = replayed.growth_report(&options);
    assert_eq!((after.counts.markers, after.live_count), (40, 0));
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}
