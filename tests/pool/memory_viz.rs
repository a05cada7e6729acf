//! memory_viz snapshots (issue 38) read back: the pickle loaded by Python's `pickle`
//! and checked as PyTorch's memory_viz page reads it
//! (`python/tests/memory_viz_model.py`: blocks tile their segments, the trace replays
//! back from the segments), against the pool's own counters and the calls made; and
//! decoded with serde-pickle against [`Pool::memory_layout`] and [`Pool::history`].

use std::path::PathBuf;
use std::process::Command;

use crate::common::{config, On, MIB};
use flare_package::{Pool, PoolConfig, ReusePolicy, Stream};
use serde_pickle::{DeOptions, HashableValue, Value};

fn pool_with(policy: ReusePolicy, events: usize) -> Pool {
    Pool::new(PoolConfig {
        history_events: events,
        ..config(On::Sim, policy)
    })
    .unwrap()
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("flare-viz-{}-{name}", std::process::id()))
}

/// Runs the page's model over `pickle` with the expectations `expect` (JSON); returns
/// its summary (JSON text). Fails when python3 is missing: CI has it.
fn model(pickle: &std::path::Path, expect: &str) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/tests/memory_viz_model.py");
    let exp = pickle.with_extension("expect.json");
    std::fs::write(&exp, expect).unwrap();
    let out = Command::new("python3")
        .arg(&script)
        .arg(pickle)
        .arg(&exp)
        .output()
        .expect("python3 runs (the memory_viz model needs it)");
    let _ = std::fs::remove_file(&exp);
    assert!(
        out.status.success(),
        "memory_viz model failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Dumps `pool`'s snapshot to `path` and runs the page's model over it, expecting the
/// pool's own totals: its physical bytes as the segments' and its live bytes as the
/// allocated blocks'. Returns the model's summary.
fn dump_and_model(pool: &Pool, path: &std::path::Path) -> String {
    pool.dump_snapshot(path).unwrap();
    let snap = pool.snapshot();
    model(
        path,
        &format!(
            r#"{{"total_bytes": {}, "allocated_bytes": {}}}"#,
            snap.physical_bytes,
            snap.live_mapped_bytes + snap.block_live_bytes
        ),
    )
}

/// Whole mappings: the pickle holds the one mapping left, its block allocated, and the
/// calls' actions in order, ending with the `snapshot` event of category "unknown"
/// (the events name "untagged": without it the page throws).
#[test]
fn whole_mappings_read_back_with_the_calls_in_order() {
    let pool = pool_with(ReusePolicy::BestFit, 64);
    let a = pool.allocate_raw(3 * MIB).unwrap();
    let b = pool.allocate_raw(MIB).unwrap();
    pool.free_raw(a).unwrap();
    let path = temp("whole.pickle");
    pool.dump_snapshot(&path).unwrap();
    let s = pool.snapshot();
    assert_eq!(s.physical_bytes, 2 * MIB);
    let expect = format!(
        r#"{{"segments": 1, "total_bytes": {phys}, "allocated_bytes": {live},
            "actions": [["segment_map", {a}, {m4}], ["alloc", {a}, {m3}],
                        ["segment_map", {b}, {m2}], ["alloc", {b}, {m1}],
                        ["free_requested", {a}, {m3}], ["free_completed", {a}, {m3}],
                        ["segment_unmap", {a}, {m4}], ["snapshot", 0, 0]]}}"#,
        phys = s.physical_bytes,
        live = s.live_mapped_bytes,
        m1 = MIB,
        m2 = 2 * MIB,
        m3 = 3 * MIB,
        m4 = 4 * MIB,
    );
    model(&path, &expect);
    // The same file decoded in Rust: one segment at b, one block of 2 MiB, 1 MiB
    // asked.
    let v: Value =
        serde_pickle::value_from_slice(&std::fs::read(&path).unwrap(), DeOptions::new()).unwrap();
    let _ = std::fs::remove_file(&path);
    let segs = list(get(&v, "segments"));
    assert_eq!(segs.len(), 1);
    assert_eq!(int(get(&segs[0], "address")), b);
    let blocks = list(get(&segs[0], "blocks"));
    assert_eq!(blocks.len(), 1);
    assert_eq!(int(get(&blocks[0], "size")), 2 * MIB);
    assert_eq!(int(get(&blocks[0], "requested_size")), MIB);
    assert_eq!(text(get(&blocks[0], "state")), "active_allocated");
    assert_eq!(text(get(&blocks[0], "category")), "untagged");
    pool.free_raw(b).unwrap();
}

/// Every event tagged: "unknown" is still among the categories (the guard event).
/// History off: no events, so no categories and no guard; the segments are there.
#[test]
fn categories_always_include_unknown_when_any() {
    let pool = pool_with(ReusePolicy::BestFit, 64);
    let a = pool.allocate_tagged_raw(MIB, None, 5).unwrap();
    let path = temp("tagged.pickle");
    pool.dump_snapshot(&path).unwrap();
    let summary = model(
        &path,
        &format!(
            r#"{{"actions": [["segment_map", {a}, {m2}], ["alloc", {a}, {m1}], ["snapshot", 0, 0]]}}"#,
            m1 = MIB,
            m2 = 2 * MIB
        ),
    );
    assert!(summary.contains("\"segments\": 1"), "{summary}");
    let off = Pool::new(config(On::Sim, ReusePolicy::BestFit)).unwrap();
    let b = off.allocate_raw(MIB).unwrap();
    off.dump_snapshot(&path).unwrap();
    model(&path, r#"{"segments": 1, "events": 0, "actions": []}"#);
    let _ = std::fs::remove_file(&path);
    off.free_raw(b).unwrap();
    pool.free_raw(a).unwrap();
}

/// A small linear congruential generator (the test's own choices, repeatable).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Segment mode under a mixed load (the synchronous API and two streams, a tag,
/// scopes that retain and finish, releases outside them, handles lent): the pickle's
/// segments are tiled by their blocks, their bytes are the pool's physical bytes and
/// their allocated bytes its live bytes, the trace replays back from them as the page
/// does, and the decoded pickle holds every segment of `memory_layout` and every
/// event of `history`.
#[test]
fn segments_under_a_mixed_load_read_back_consistent() {
    for policy in [ReusePolicy::Segments, ReusePolicy::BestFit] {
        let pool = pool_with(policy, 1 << 16);
        let sim = pool.sim_driver().unwrap();
        let streams = [
            None,
            Some(Stream(sim.stream_create().unwrap())),
            Some(Stream(sim.stream_create().unwrap())),
        ];
        let mut rng = Lcg(38);
        let mut live: Vec<(u64, Option<Stream>)> = Vec::new();
        let mut scope = None;
        for i in 0..600 {
            if i % 150 == 20 {
                scope = Some(pool.retention_scope().unwrap());
            }
            if i % 150 == 120 {
                scope.take().unwrap().finish().unwrap();
            }
            if live.is_empty() || rng.next(3) > 0 && live.len() < 40 {
                let bytes = match rng.next(3) {
                    0 => 1 + rng.next(4096),
                    1 => 1 + rng.next(MIB),
                    _ => MIB + rng.next(6 * MIB),
                };
                let s = streams[rng.next(3) as usize];
                let tag = if rng.next(5) == 0 { 4 } else { 0 };
                let p = pool.allocate_tagged_raw(bytes, s, tag).unwrap();
                live.push((p, s));
            } else {
                let (p, s) = live.swap_remove(rng.next(live.len() as u64) as usize);
                match s {
                    Some(s) => pool.free_async_raw(p, s).unwrap(),
                    None => pool.free_raw(p).unwrap(),
                }
            }
        }
        let snap = pool.snapshot();
        let path = temp(&format!("mixed-{}.pickle", policy.name()));
        dump_and_model(&pool, &path);
        let v: Value =
            serde_pickle::value_from_slice(&std::fs::read(&path).unwrap(), DeOptions::new())
                .unwrap();
        let _ = std::fs::remove_file(&path);
        let layout = pool.memory_layout();
        let segs = list(get(&v, "segments"));
        assert_eq!(segs.len(), layout.len(), "{policy:?}");
        for (s, l) in segs.iter().zip(&layout) {
            assert_eq!(int(get(s, "address")), l.address);
            assert_eq!(int(get(s, "total_size")), l.total_size);
            assert_eq!(list(get(s, "blocks")).len(), l.blocks.len());
        }
        let (events, dropped) = pool.history();
        assert_eq!(dropped, 0);
        let traces = list(get(&v, "device_traces"));
        let trace = list(&traces[0]);
        // Every event, then the guard ("untagged" and "tag 4" name no "unknown").
        assert_eq!(trace.len(), events.len() + 1, "{policy:?}");
        for (t, e) in trace.iter().zip(&events) {
            assert_eq!(text(get(t, "action")), e.action.name());
            assert_eq!(int(get(t, "addr")), e.addr);
        }
        if policy == ReusePolicy::Segments {
            assert!(layout.iter().all(|s| s.is_expandable));
            assert!(snap.segment_handles > 1, "{snap:#?}");
        }
        for (p, s) in live {
            match s {
                Some(s) => pool.free_async_raw(p, s).unwrap(),
                None => pool.free_raw(p).unwrap(),
            }
        }
    }
}

/// A tag's sleep and wake: memory_viz has no sleep, so a sleep shows as the tag's
/// allocations freed and their memory unmapped, a wake as mapped and allocated again
/// at the same addresses. The snapshot taken asleep leaves the tag's memory out and
/// replays back consistently, and so does the one taken after the wake; the tag's
/// allocations' events are exactly those.
#[test]
fn sleep_and_wake_read_back_consistent() {
    use flare_package::{HistoryAction::*, SleepMode};
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        for mode in [SleepMode::Discard, SleepMode::Offload] {
            let pool = pool_with(policy, 4096);
            let keep = pool.allocate_raw(3 * MIB).unwrap();
            let a = pool.allocate_tagged_raw(5 * MIB, None, 7).unwrap();
            let b = pool.allocate_tagged_raw(1000, None, 7).unwrap();
            let (before, _) = pool.history();
            pool.sleep(7, mode).unwrap();
            let path = temp(&format!("sleep-{}.pickle", policy.name()));
            dump_and_model(&pool, &path);
            pool.wake(7).unwrap();
            dump_and_model(&pool, &path);
            let _ = std::fs::remove_file(&path);
            let (events, _) = pool.history();
            let mine: Vec<_> = events[before.len()..]
                .iter()
                .filter(|e| matches!(e.action, Alloc | FreeRequested | FreeCompleted))
                .map(|e| (e.action, e.addr, e.size, e.tag))
                .collect();
            let mut want = Vec::new();
            for p in [(a, 5 * MIB), (b, 1000)] {
                want.push((FreeRequested, p.0, p.1, 7));
                want.push((FreeCompleted, p.0, p.1, 7));
            }
            for p in [(a, 5 * MIB), (b, 1000)] {
                want.push((Alloc, p.0, p.1, 7));
            }
            // Each allocation's own order is fixed; between them, the books' order.
            let key =
                |x: &(flare_package::HistoryAction, u64, u64, u32)| (x.0 as u8 == Alloc as u8, x.1);
            let mut got_sorted = mine.clone();
            got_sorted.sort_by_key(key);
            want.sort_by_key(key);
            assert_eq!(got_sorted, want, "{policy:?} {mode:?}: {mine:?}");
            let unmaps = events[before.len()..]
                .iter()
                .filter(|e| e.action == SegmentUnmap)
                .count();
            assert!(unmaps >= 1, "{policy:?}: the sleep unmaps");
            pool.free_raw(a).unwrap();
            pool.free_raw(b).unwrap();
            pool.free_raw(keep).unwrap();
        }
    }
}

/// Four threads at once (allocations, frees, scopes and trims: the stress mix of
/// `many_threads`), with the history on: the events the threads wrote replay back
/// from the final segments as the page replays them (every free and unmap written
/// before the memory could be handed out again, every map before its first block).
#[test]
fn many_threads_write_a_trace_that_replays_back() {
    use crate::common::hammer::{hammer, Params};
    use std::sync::Arc;
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let pool = Arc::new(
            Pool::new(PoolConfig {
                history_events: 1 << 20,
                ..PoolConfig::simulated(flare_package::SimConfig {
                    capacity_bytes: 1 << 40,
                    ..Default::default()
                })
                .with_policy(policy)
            })
            .unwrap(),
        );
        hammer(
            pool.clone(),
            Params {
                threads: 4,
                scope_threads: 1,
                ops: 1500,
                max_live: 12,
                max_bytes: 64 * MIB,
                limit: std::time::Duration::from_secs(120),
                captures: false,
                small_sizes: true,
            },
        );
        let (events, dropped) = pool.history();
        assert_eq!(dropped, 0);
        assert!(events.len() > 6000, "{}", events.len());
        let path = temp(&format!("threads-{}.pickle", policy.name()));
        dump_and_model(&pool, &path);
        let _ = std::fs::remove_file(&path);
    }
}

/// A path that cannot be written: `Error::Io` naming it, the pool unchanged.
#[test]
fn an_unwritable_path_is_an_io_error() {
    let pool = pool_with(ReusePolicy::BestFit, 8);
    let e = pool
        .dump_snapshot("/nonexistent-dir-flare/x.pickle")
        .unwrap_err();
    assert!(matches!(e, flare_package::Error::Io { .. }), "{e}");
    assert!(
        e.to_string().contains("/nonexistent-dir-flare/x.pickle"),
        "{e}"
    );
}

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    match v {
        Value::Dict(d) => d
            .get(&HashableValue::String(key.to_string()))
            .unwrap_or_else(|| panic!("no key {key}")),
        _ => panic!("not a dict: {v:?}"),
    }
}

fn list(v: &Value) -> &Vec<Value> {
    match v {
        Value::List(l) => l,
        _ => panic!("not a list: {v:?}"),
    }
}

fn int(v: &Value) -> u64 {
    match v {
        Value::I64(i) => u64::try_from(*i).unwrap(),
        _ => panic!("not an int: {v:?}"),
    }
}

fn text(v: &Value) -> &str {
    match v {
        Value::String(s) => s,
        _ => panic!("not a str: {v:?}"),
    }
}
