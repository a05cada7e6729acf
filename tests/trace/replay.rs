//! Replay of traces on pools on the simulated driver: small hand-made traces and
//! the four shipped real traces under every policy.

use crate::common;

use std::cell::RefCell;

use common::{data, sim_pool, GIB, GRANULARITY, SHIPPED};
use flare_package::trace::{self, ReplayError};
use flare_package::{CuResult, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SimConfig};

const CAPACITY: u64 = 140 * GIB;

fn parse(text: &str) -> trace::Trace {
    trace::parse_str("test.trace", text).unwrap()
}

#[test]
fn implicit_scope_reuse_and_release() {
    let t = parse("a 1 2097152\nf 1\na 2 2097152\na 3 1\nf 2\nf 3\n");
    for policy in ReusePolicy::ALL {
        let (pool, driver) = sim_pool(policy, CAPACITY);
        let r = trace::replay(&pool, &t, None).unwrap();
        assert_eq!(r.allocations, 3);
        assert_eq!(r.out_of_memory_at_line, None);
        assert_eq!(r.live_at_end, 0);
        assert_eq!(r.final_physical_bytes, 0);
        assert_eq!(r.mappings_created + r.reuse_hits, 3, "{policy:?}");
        let want_peak = if policy == ReusePolicy::None { 3 } else { 2 } * GRANULARITY;
        assert_eq!(r.peak_physical_bytes, want_peak, "{policy:?}");
        assert!(r.seconds >= 0.0);
        let s = pool.snapshot();
        assert!(!s.scope_open);
        assert_eq!(s.scopes_finished, 1);
        assert_eq!(s.physical_bytes, 0);
        s.check_invariants().unwrap();
        assert_eq!(driver.state().physical_bytes, 0);
    }
}

#[test]
fn live_at_end_is_reported_and_released() {
    let t = parse("a w 4194304\na 1 2097152\nf 1\na k 10\n");
    let (pool, driver) = sim_pool(ReusePolicy::BestFit, CAPACITY);
    let r = trace::replay(&pool, &t, None).unwrap();
    assert_eq!(r.live_at_end, 2);
    assert_eq!(r.final_physical_bytes, 0);
    assert_eq!(r.peak_physical_bytes, 6 << 20);
    assert_eq!(pool.snapshot().live_count, 0);
    assert_eq!(driver.state().physical_bytes, 0);
}

#[test]
fn explicit_scopes_and_trim() {
    let t = parse(
        "a w 4194304\nbegin\na 1 2097152\nf 1\na 2 2097152\nf 2\nfinish\na 3 2097152\nf 3\ntrim\nbegin\na 4 2097152\nabort\nbegin\na 5 6291456\n",
    );
    let (pool, driver) = sim_pool(ReusePolicy::None, CAPACITY);
    let r = trace::replay(&pool, &t, None).unwrap();
    assert_eq!(r.peak_physical_bytes, t.no_reuse_bytes(GRANULARITY));
    assert_eq!(r.allocations, 6);
    assert_eq!(r.live_at_end, 3, "w, 4 (live through the abort) and 5");
    assert_eq!(r.final_physical_bytes, 0);
    let s = pool.snapshot();
    assert!(
        !s.scope_open,
        "the scope left open by the trace is finished"
    );
    assert_eq!(s.scopes_finished, 2);
    assert_eq!(s.scopes_aborted, 1);
    assert_eq!(driver.state().physical_bytes, 0);
}

#[test]
fn trim_inside_the_implicit_scope_is_a_no_op() {
    let t = parse("a 1 5\nf 1\ntrim\na 2 5\n");
    let (pool, _driver) = sim_pool(ReusePolicy::Exact, CAPACITY);
    let r = trace::replay(&pool, &t, None).unwrap();
    assert_eq!(r.reuse_hits, 1);
    assert_eq!(r.mappings_created, 1);
}

#[test]
fn an_empty_or_comments_only_trace_replays_nothing_and_reports_zeros() {
    for text in [
        "",
        "# flare-trace v1\n\n   \n# nothing else\n",
        "\u{feff}\n",
    ] {
        let t = parse(text);
        assert!(t.is_empty());
        for policy in ReusePolicy::ALL {
            let (pool, driver) = sim_pool(policy, CAPACITY);
            let r = trace::replay(&pool, &t, None).unwrap();
            assert_eq!(r.allocations, 0, "{text:?} {policy:?}");
            assert_eq!(r.peak_physical_bytes, 0);
            assert_eq!(r.final_physical_bytes, 0);
            assert_eq!(r.mappings_created, 0);
            assert_eq!(r.reuse_hits, 0);
            assert_eq!(r.out_of_memory_at_line, None);
            assert_eq!(r.live_at_end, 0);
            let s = pool.snapshot();
            assert!(!s.scope_open);
            assert_eq!(s.live_count, 0);
            assert_eq!(driver.state().physical_bytes, 0);
        }
    }
}

#[test]
fn out_of_memory_stops_at_its_line_and_frees_everything() {
    // capacity 6 MiB: the third 2 MiB mapping under `none` is the fourth line's
    let t = parse("a 1 2097152\nf 1\n# comment\na 2 2097152\na 3 2097152\na 4 2097152\na 5 1\n");
    let (pool, driver) = sim_pool(ReusePolicy::None, 6 << 20);
    let r = trace::replay(&pool, &t, None).unwrap();
    assert_eq!(r.out_of_memory_at_line, Some(6));
    assert_eq!(r.allocations, 3);
    assert_eq!(r.live_at_end, 2);
    assert_eq!(r.final_physical_bytes, 0);
    assert_eq!(r.peak_physical_bytes, 6 << 20);
    let s = pool.snapshot();
    assert!(!s.scope_open);
    assert_eq!(s.scopes_aborted, 1);
    assert_eq!(s.live_count, 0);
    assert_eq!(driver.state().physical_bytes, 0);
    // with reuse, the same trace goes two lines further
    let (pool, _driver) = sim_pool(ReusePolicy::BestFit, 6 << 20);
    let r = trace::replay(&pool, &t, None).unwrap();
    assert_eq!(r.out_of_memory_at_line, Some(7));
    assert_eq!(r.reuse_hits, 1);
}

#[test]
fn a_size_beyond_the_device_is_out_of_memory() {
    let t = parse("a 1 5\na 2 9223372036854775808\n");
    let (pool, driver) = sim_pool(ReusePolicy::BestFit, CAPACITY);
    let r = trace::replay(&pool, &t, None).unwrap();
    assert_eq!(r.out_of_memory_at_line, Some(2));
    assert_eq!(driver.state().physical_bytes, 0);
}

#[test]
fn a_driver_failure_is_an_error_naming_the_line_and_nothing_leaks() {
    let t = parse("a 1 5\na 2 5\n\na 3 5\na 4 5\n");
    let (pool, driver) = sim_pool(ReusePolicy::BestFit, CAPACITY);
    driver.inject_failure(DriverCall::Create, 3, CuResult::UNKNOWN);
    let err = trace::replay(&pool, &t, None).unwrap_err();
    match &err {
        ReplayError::Pool { file, line, source } => {
            assert_eq!(file, "test.trace");
            assert_eq!(*line, 4);
            assert!(matches!(source, Error::Driver { .. }), "{source:?}");
        }
        other => panic!("expected a pool error, got {other:?}"),
    }
    assert!(err.to_string().starts_with("test.trace:4: "), "{err}");
    let s = pool.snapshot();
    assert!(!s.scope_open);
    assert_eq!(s.live_count, 0);
    assert_eq!(s.physical_bytes, 0);
    assert_eq!(driver.state().physical_bytes, 0);
}

#[test]
fn a_scope_already_open_is_an_error() {
    let t = parse("a 1 5\n");
    let (pool, driver) = sim_pool(ReusePolicy::BestFit, CAPACITY);
    pool.retention_begin().unwrap();
    let err = trace::replay(&pool, &t, None).unwrap_err();
    assert!(
        matches!(
            err,
            ReplayError::Begin {
                source: Error::ScopeState(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(driver.state().physical_bytes, 0);
    // a trace with scope lines fails on its begin line instead
    let t = parse("a 1 5\nbegin\n");
    let err = trace::replay(&pool, &t, None).unwrap_err();
    assert!(matches!(err, ReplayError::Pool { line: 2, .. }), "{err:?}");
    assert_eq!(pool.snapshot().live_count, 0);
}

#[test]
fn progress_ends_with_done_equal_total() {
    let t = trace::parse(data("graph-warmup-20sizes.tensor.trace")).unwrap();
    let (pool, _driver) = sim_pool(ReusePolicy::BestFit, CAPACITY);
    let seen = RefCell::new(Vec::new());
    let cb = |done: u64, total: u64| seen.borrow_mut().push((done, total));
    trace::replay(&pool, &t, Some(&cb)).unwrap();
    let seen = seen.into_inner();
    let total = t.len() as u64;
    assert!(seen.len() >= 2, "{seen:?}");
    assert_eq!(seen.last(), Some(&(total, total)));
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0));
    assert!(seen.iter().all(|&(d, n)| n == total && d <= total));
}

/// Every shipped trace under every policy on the bump driver: `none` peaks at the
/// no-reuse figure (or runs out of memory when that is above the capacity), the
/// reuse policies stay between the lower bound and the no-reuse figure, and
/// everything is released at the end.
#[test]
fn shipped_traces_on_the_bump_driver() {
    for (file, _, _) in SHIPPED {
        let t = trace::parse(data(file)).unwrap();
        let lower = t.lower_bound_bytes(GRANULARITY);
        let no_reuse = t.no_reuse_bytes(GRANULARITY);
        for policy in ReusePolicy::ALL {
            let (pool, driver) = sim_pool(policy, CAPACITY);
            let r = trace::replay(&pool, &t, None).unwrap();
            let ctx = format!("{file} {}", policy.name());
            assert_eq!(r.final_physical_bytes, 0, "{ctx}");
            assert_eq!(driver.state().physical_bytes, 0, "{ctx}");
            assert_eq!(r.mappings_created + r.reuse_hits, r.allocations, "{ctx}");
            if no_reuse > CAPACITY && policy == ReusePolicy::None {
                assert!(r.out_of_memory_at_line.is_some(), "{ctx}");
                assert_eq!(r.peak_physical_bytes, pool.snapshot().peak_physical_bytes);
                assert!(r.peak_physical_bytes <= CAPACITY, "{ctx}");
                continue;
            }
            assert_eq!(r.out_of_memory_at_line, None, "{ctx}");
            assert_eq!(r.allocations, t.allocations() as u64, "{ctx}");
            if policy == ReusePolicy::None {
                assert_eq!(r.peak_physical_bytes, no_reuse, "{ctx}");
                assert_eq!(r.reuse_hits, 0, "{ctx}");
            } else {
                assert!(
                    r.peak_physical_bytes >= lower,
                    "{ctx}: below the lower bound"
                );
                assert!(r.peak_physical_bytes <= no_reuse, "{ctx}: above no reuse");
            }
        }
    }
}

/// The shipped traces on the simulated driver (an H200: 140 GiB, 2 MiB).
#[test]
fn shipped_traces_on_the_simulated_driver() {
    let capacity = SimConfig::default().capacity_bytes;
    for (file, _, _) in SHIPPED {
        let t = trace::parse(data(file)).unwrap();
        let no_reuse = t.no_reuse_bytes(GRANULARITY);
        let lower = t.lower_bound_bytes(GRANULARITY);
        let mut peak = std::collections::HashMap::new();
        for policy in ReusePolicy::ALL {
            let pool =
                Pool::new(PoolConfig::simulated(SimConfig::default()).with_policy(policy)).unwrap();
            let r = trace::replay(&pool, &t, None).unwrap();
            let ctx = format!("{file} {}", policy.name());
            assert_eq!(r.final_physical_bytes, 0, "{ctx}");
            assert!(
                r.peak_physical_bytes >= lower,
                "{ctx}: below the lower bound"
            );
            if policy == ReusePolicy::None {
                // Every freed mapping retained: the trace's no-reuse figure, or out
                // of memory where that is beyond the device.
                if no_reuse > capacity {
                    assert!(r.out_of_memory_at_line.is_some(), "{ctx}");
                    assert!(r.peak_physical_bytes <= capacity, "{ctx}");
                } else {
                    assert_eq!(r.out_of_memory_at_line, None, "{ctx}");
                    assert_eq!(r.peak_physical_bytes, no_reuse, "{ctx}");
                }
            } else {
                assert_eq!(r.out_of_memory_at_line, None, "{ctx}");
            }
            peak.insert(policy, r.peak_physical_bytes);
            if let Some(sim) = pool.sim_driver() {
                assert_eq!(sim.state().physical_bytes, 0, "{ctx}");
                assert!(sim.faults().is_empty(), "{ctx}");
            }
            pool.snapshot().check_invariants().unwrap();
            pool.destroy().unwrap();
        }
        assert!(
            peak[&ReusePolicy::BestFit] <= peak[&ReusePolicy::Exact],
            "{file}: best-fit {} above exact {}",
            peak[&ReusePolicy::BestFit],
            peak[&ReusePolicy::Exact]
        );
    }
}

/// Issue 12's replay targets for segment mode on the four shipped traces: peak
/// physical at most 1.15x the lower bound on the per-tensor traces and 1.02x on the
/// segment-level ones (whole mappings per allocation reach it there), and every
/// trace replayed with no memory left behind. The handles created are at most 100
/// on three of the four traces; on the graph-warmup segment trace (28.6 GiB live
/// through 196 allocations of 100 MiB to 1 GiB) fewer than best-fit's mappings.
#[test]
fn segments_meet_the_replay_targets_on_the_shipped_traces() {
    for (name, _, _) in SHIPPED {
        let t = trace::parse(data(name)).unwrap();
        let bound = t.lower_bound_bytes(GRANULARITY);
        let (pool, driver) = sim_pool(ReusePolicy::Segments, CAPACITY);
        let r = trace::replay(&pool, &t, None).unwrap();
        let ratio = r.peak_physical_bytes as f64 / bound as f64;
        let limit = if name.contains(".tensor.") {
            1.15
        } else {
            1.02
        };
        assert!(ratio <= limit, "{name}: {ratio:.3}x the lower bound");
        assert!(
            ratio >= 1.0 || name.contains(".tensor."),
            "{name}: {ratio:.3}x"
        );
        assert_eq!(r.final_physical_bytes, 0, "{name}");
        assert_eq!(driver.state().physical_bytes, 0, "{name}");
        let (whole, _) = sim_pool(ReusePolicy::BestFit, CAPACITY);
        let w = trace::replay(&whole, &t, None).unwrap();
        if name.starts_with("graph-warmup-20sizes.segment") {
            assert!(r.mappings_created < w.mappings_created, "{name}");
        } else {
            assert!(r.mappings_created <= 100, "{name}: {}", r.mappings_created);
        }
        assert!(r.peak_physical_bytes <= w.peak_physical_bytes, "{name}");
    }
}

/// An `oom N` injects N out-of-memory answers for its allocation only (issue 34):
/// one the replay's allocation does not take (here served from idle memory, where
/// the recorded pool's went to the driver: a replay that went another way, or an
/// edited trace) is dropped after it, and never fails a later call. Before the fix
/// it stayed injected and failed the wake's create three lines later: the replay
/// stopped with an error (`flare-replay` exit 1).
#[test]
fn an_oom_answer_left_over_never_fails_a_later_call() {
    let text = "# flare-pool policy=best-fit granularity=2097152 device_total=1073741824 \
        release_threshold=18446744073709551615 best_fit_waste_percent=30 \
        cross_stream=when-complete segment_whole_threshold=18446744073709551615 \
        thread_cache_entries=0 thread_cache_bytes=0 device=0 peers=none\n\
        a t 4096 5\na 1 4096\nf 1\noom 1\na 2 4096\nsleep 5 discard\nwake 5\nf 2\nf t\n";
    let t = parse(text);
    let pool = Pool::new(t.recorded_config().unwrap().pool_config()).unwrap();
    let r = trace::replay_as_recorded(&pool, &t, None).unwrap();
    assert_eq!(r.out_of_memory_at_line, None);
    // `a 2` reused the idle mapping `a 1` left: two mappings, the tag's and one.
    assert_eq!((r.mappings_created, r.reuse_hits), (2, 1));
    assert_eq!(pool.sim_driver().unwrap().pending_failures(), 0);
}
