//! Tags in flare-trace v1 (issue 15): the optional tag field of `a` lines, its
//! errors, and the replay's census per tag.

use crate::common;

use common::MIB;
use flare_package::trace::{self, Event, Problem};
use flare_package::{Pool, PoolConfig, ReusePolicy};

#[test]
fn a_lines_take_an_optional_tag() {
    let t = trace::parse_str("t.trace", "a w 100 3\na x 200 0\na y 300\nf w\n").unwrap();
    assert_eq!(
        t.events(),
        &[
            Event::AllocTagged {
                id: 0,
                bytes: 100,
                tag: 3
            },
            Event::Alloc { id: 1, bytes: 200 },
            Event::Alloc { id: 2, bytes: 300 },
            Event::Free { id: 0 },
        ]
    );
    assert!(t.has_tags());
    assert_eq!(t.tags(), vec![(0, 2), (3, 1)]);
    assert_eq!(t.events()[0].to_string(), "a 0 100 3");
    assert_eq!(t.allocations(), 3);
    // An untagged trace has no tags; the largest tag parses.
    assert!(!trace::parse_str("u", "a 1 5\n").unwrap().has_tags());
    let max = trace::parse_str("m", "a 1 5 4294967295\n").unwrap();
    assert_eq!(max.tags(), vec![(u32::MAX, 1)]);
}

#[test]
fn bad_tags_are_errors_with_their_line() {
    for bad in ["4294967296", "-1", "x", "1.5", "0x10"] {
        let err = trace::parse_str("b.trace", &format!("a 1 5\na 2 5 {bad}\n")).unwrap_err();
        assert_eq!(err.line(), Some(2), "{bad}");
        assert!(
            matches!(err.problem(), Some(Problem::TagNotDecimal(_))),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains(bad), "{err}");
    }
}

/// The census of a replay: tag 1 holds 1 GiB + 512 MiB live and, retained inside
/// the replay's implicit scope, the 4 MiB it freed; tag 2 2 GiB; tag 0 the untagged
/// lines (3 000 000 bytes round to 4 MiB, twice: the first is retained idle under
/// `none`, reused under `exact`).
#[test]
fn replay_counts_each_tag() {
    let text = "a w1 1073741824 1\na w2 536870912 1\na kv 2147483648 2\n\
                a t1 3000000\nf t1\na t2 3000000\na s1 4194304 1\nf s1\n";
    let t = trace::parse_str("tags.trace", text).unwrap();
    for (policy, idle0) in [(ReusePolicy::None, 4 * MIB), (ReusePolicy::Exact, 0)] {
        let pool = Pool::new(PoolConfig::default().with_policy(policy)).unwrap();
        let (report, tags) = trace::replay_census(&pool, &t, None).unwrap();
        assert_eq!(report.live_at_end, 4);
        let by = |tag: u32| tags.iter().find(|r| r.tag == tag).unwrap();
        assert_eq!(tags.len(), 3);
        let one = by(1);
        assert_eq!(one.allocations, 3);
        assert_eq!(one.census.live_count, 2);
        assert_eq!(one.census.live_bytes, 1536 * MIB);
        assert_eq!(one.census.peak_live_bytes, 1540 * MIB);
        assert_eq!(one.census.idle_bytes, 4 * MIB);
        assert_eq!(one.census.physical_bytes, 1540 * MIB);
        assert_eq!(by(2).census.physical_bytes, 2048 * MIB);
        let zero = by(0);
        assert_eq!((zero.allocations, zero.census.live_bytes), (2, 4 * MIB));
        assert_eq!(zero.census.idle_bytes, idle0, "{policy:?}");
        // Afterwards the pool holds nothing.
        assert_eq!(pool.snapshot().physical_bytes, 0);
    }
}

/// A recording of a pool dropped while a tag sleeps (issue 34): the trace ends with
/// the tag asleep and its allocation live, which the format allows ("a trace may
/// end with allocations still live"). The replay frees what is live at the end:
/// the tag's allocation once the rest is released and the tag woken, so the replay
/// succeeds, reaches the recorded peak (the 48 MiB allocated while the tag's 32
/// MiB slept; the wake at the end maps 32 MiB on an empty device) and holds nothing
/// at the end. Before the fix the replay failed at its end (exit 1 in
/// `flare-replay`: "tag 1: the tag is asleep").
#[test]
fn a_recording_that_ends_with_a_tag_asleep_replays() {
    let path = std::env::temp_dir().join(format!(
        "flare-tags-asleep-at-end-{}.trace",
        std::process::id()
    ));
    for mode in [
        flare_package::SleepMode::Offload,
        flare_package::SleepMode::Discard,
    ] {
        let (pool, _sim) = common::simulated_pool(
            64 * MIB,
            PoolConfig {
                record_path: Some(path.clone()),
                ..PoolConfig::default()
            },
        );
        let _weights = pool.allocate_tagged_raw(32 * MIB, None, 1).unwrap();
        pool.sleep(1, mode).unwrap();
        let other = pool.allocate_raw(48 * MIB).unwrap();
        pool.free_raw(other).unwrap();
        let recorded_peak = pool.snapshot().peak_physical_bytes;
        assert_eq!(recorded_peak, 48 * MIB);
        drop(pool);
        let t = trace::parse(&path).unwrap();
        let replay_pool = Pool::new(t.recorded_config().unwrap().pool_config()).unwrap();
        let report = trace::replay_as_recorded(&replay_pool, &t, None)
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_eq!(report.peak_physical_bytes, recorded_peak, "{mode:?}");
        assert_eq!(report.live_at_end, 1, "{mode:?}");
        assert_eq!(report.final_physical_bytes, 0, "{mode:?}");
        let snap = replay_pool.snapshot();
        assert_eq!((snap.live_count, snap.tags_sleeping), (0, 0), "{mode:?}");
    }
    let _ = std::fs::remove_file(&path);
}
