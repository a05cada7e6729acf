//! The analysis on hand-built records: the groups, their steps and rates, the rule,
//! the order, the step kinds, and the text and JSON forms. Every expected value is
//! computed here from how the records were built.

use super::*;

/// One live allocation.
fn live(bytes: u64, tag: u32, seq: u64, markers: u64, scopes: u64) -> LiveAllocation {
    LiveAllocation {
        bytes,
        tag,
        seq,
        markers,
        scopes,
    }
}

/// A server loop of 40 marked steps (markers 1 to 40; step 0 before them): weights
/// in step 0 (4096 B twice, 8192 B once), three new sizes per step (1000 s + 1,
/// 1000 s + 2, 1000 s + 3) never freed, a 256 B allocation kept in each of steps 1
/// to 33, and a tag-5 allocation of 512 B in each even step from 2 to 40.
fn server_loop() -> (Vec<LiveAllocation>, StepCounts) {
    let mut v = Vec::new();
    let mut seq = 0;
    let mut push = |v: &mut Vec<LiveAllocation>, bytes, tag, step| {
        v.push(live(bytes, tag, seq, step, 0));
        // Freed transients between them: sequence numbers are not dense.
        seq += 7;
    };
    push(&mut v, 4096, 0, 0);
    push(&mut v, 4096, 0, 0);
    push(&mut v, 8192, 0, 0);
    for s in 1..=40u64 {
        for w in 1..=3 {
            push(&mut v, 1000 * s + w, 0, s);
        }
        if s <= 33 {
            push(&mut v, 256, 0, s);
        }
        if s % 2 == 0 {
            push(&mut v, 512, 5, s);
        }
    }
    let counts = StepCounts {
        allocations: seq,
        markers: 40,
        scopes: 3,
    };
    (v, counts)
}

#[test]
fn a_new_size_each_step_is_one_group_and_grows_at_its_rate() {
    let (v, counts) = server_loop();
    let r = analyze(&v, counts, &GrowthOptions::default());
    assert_eq!(r.step_kind, StepKind::Markers, "markers win over scopes");
    // Steps 0 to 40; the last quarter is its last ceil(41 / 4) = 11 steps.
    assert_eq!(r.steps, 41);
    assert_eq!(r.final_quarter_from, 30);
    assert_eq!(r.live_count, v.len() as u64);
    assert_eq!(r.live_bytes, v.iter().map(|a| a.bytes).sum::<u64>());
    assert_eq!(r.groups.len(), 3);

    // The pooled group: the leak's 120 sizes and the weights' two (each made in one
    // step); it gained the leak's allocations after step 0.
    let leak_bytes: u64 = (1..=40u64).map(|s| 3000 * s + 6).sum();
    let weights = 2 * 4096 + 8192;
    let g = r.groups[0];
    assert_eq!(g.tag, 0);
    assert_eq!(g.size, GroupSize::NewEachStep { sizes: 122 });
    assert_eq!((g.count, g.bytes), (123, leak_bytes + weights));
    assert_eq!((g.first_step, g.last_step, g.distinct_steps), (0, 40, 41));
    assert_eq!((g.added_count, g.added_bytes), (120, leak_bytes));
    assert_eq!(g.steps_after_first, 40);
    assert!(g.grows);
    assert_eq!(g.allocations_per_step(), 3.0);
    assert_eq!(g.bytes_per_step(), leak_bytes as f64 / 40.0);

    // 256 B kept in 33 steps, the last (33) in the last quarter: it grows, more
    // slowly (32 gained over the 39 steps after step 1).
    let g = r.groups[1];
    assert_eq!((g.tag, g.size), (0, GroupSize::Bytes(256)));
    assert_eq!((g.count, g.first_step, g.last_step), (33, 1, 33));
    assert_eq!(
        (g.distinct_steps, g.added_count, g.steps_after_first),
        (33, 32, 39)
    );
    assert!(g.grows);
    assert_eq!(g.allocations_per_step(), 32.0 / 39.0);

    // Tag 5: 20 distinct steps, below 32: live, not growing.
    let g = r.groups[2];
    assert_eq!((g.tag, g.size, g.count), (5, GroupSize::Bytes(512), 20));
    assert_eq!((g.first_step, g.last_step, g.distinct_steps), (2, 40, 20));
    assert!(!g.grows);
    assert_eq!(r.growing().count(), 2);

    // With min_steps 34 the 256 B group no longer grows; with 20 tag 5 does.
    let strict = analyze(
        &v,
        counts,
        &GrowthOptions {
            min_steps: 34,
            ..GrowthOptions::default()
        },
    );
    assert_eq!(strict.growing().count(), 1);
    let loose = analyze(
        &v,
        counts,
        &GrowthOptions {
            min_steps: 20,
            ..GrowthOptions::default()
        },
    );
    assert!(loose.groups.iter().all(|g| g.grows));
}

/// Growth that stopped before the last quarter (a warmup that retained one
/// allocation per step, then ran on) is not growth; one allocation more in the
/// last quarter makes it growth.
#[test]
fn growth_must_reach_the_last_quarter() {
    // Steps of 10 allocations (no markers, no scopes): survivors of one size in
    // each of the first 40 steps, then 1200 more allocations, all freed.
    let mut v: Vec<LiveAllocation> = (0..40).map(|i| live(1 << 20, 0, i * 10, 0, 0)).collect();
    let counts = StepCounts {
        allocations: 1600,
        markers: 0,
        scopes: 0,
    };
    let options = GrowthOptions {
        step_events: 10,
        min_steps: 32,
    };
    let r = analyze(&v, counts, &options);
    assert_eq!(r.step_kind, StepKind::Events(10));
    // Allocations 0 to 1599: steps 0 to 159; the last quarter from 160 - 40.
    assert_eq!((r.steps, r.final_quarter_from), (160, 120));
    assert_eq!(r.groups.len(), 1);
    let g = r.groups[0];
    assert_eq!((g.first_step, g.last_step, g.distinct_steps), (0, 39, 40));
    assert!(!g.grows, "its last step, 39, is before 120");
    assert!(!r.grows());

    v.push(live(1 << 20, 0, 1205, 0, 0));
    let r = analyze(&v, counts, &options);
    let g = r.groups[0];
    assert_eq!((g.last_step, g.distinct_steps), (120, 41));
    assert!(g.grows);
    // 40 gained after step 0 over the 159 steps after it.
    assert_eq!(g.allocations_per_step(), 40.0 / 159.0);
}

/// Scopes make the steps when no marker was written; with neither, allocations do;
/// a step_events of 0 is taken as 1; an empty pool reports one step and no group.
#[test]
fn the_step_kinds() {
    let v = [live(100, 0, 5, 0, 2), live(100, 0, 9, 0, 3)];
    let r = analyze(
        &v,
        StepCounts {
            allocations: 10,
            markers: 0,
            scopes: 3,
        },
        &GrowthOptions::default(),
    );
    assert_eq!((r.step_kind, r.steps), (StepKind::Scopes, 4));
    assert_eq!((r.groups[0].first_step, r.groups[0].last_step), (2, 3));

    let counts = StepCounts {
        allocations: 10,
        markers: 0,
        scopes: 0,
    };
    let zero = GrowthOptions {
        step_events: 0,
        min_steps: 1,
    };
    let r = analyze(&v, counts, &zero);
    assert_eq!((r.step_kind, r.steps), (StepKind::Events(1), 10));
    assert_eq!((r.groups[0].first_step, r.groups[0].last_step), (5, 9));

    let r = analyze(&[], StepCounts::default(), &GrowthOptions::default());
    assert_eq!((r.steps, r.final_quarter_from, r.live_count), (1, 0, 0));
    assert!(r.groups.is_empty());
    assert_eq!(r.step_kind, StepKind::Events(DEFAULT_STEP_EVENTS));
}

/// A live allocation stamped after the counts were read (a marker written while a
/// pool's records were collected) extends the steps instead of underflowing.
#[test]
fn a_stamp_beyond_the_counts_extends_the_steps() {
    let v = [live(100, 0, 0, 7, 0)];
    let counts = StepCounts {
        allocations: 1,
        markers: 5,
        scopes: 0,
    };
    let r = analyze(&v, counts, &GrowthOptions::default());
    assert_eq!(r.steps, 8);
    assert_eq!(r.groups[0].steps_after_first, 0);
    assert_eq!(r.groups[0].allocations_per_step(), 0.0);
}

/// Sizes of one step each are pooled per tag; a size seen in two steps is a group of
/// its own; groups that do not grow are ordered by bytes, then tag.
#[test]
fn pooling_is_per_tag_and_the_others_are_ordered_by_bytes() {
    let v = [
        live(300, 1, 0, 1, 0),
        live(200, 2, 1, 2, 0),
        live(100, 2, 2, 3, 0),
        live(50, 3, 3, 1, 0),
        live(50, 3, 4, 2, 0),
    ];
    let counts = StepCounts {
        allocations: 5,
        markers: 3,
        scopes: 0,
    };
    let r = analyze(&v, counts, &GrowthOptions::default());
    let got: Vec<(u32, GroupSize, u64)> =
        r.groups.iter().map(|g| (g.tag, g.size, g.bytes)).collect();
    assert_eq!(
        got,
        vec![
            (1, GroupSize::NewEachStep { sizes: 1 }, 300),
            (2, GroupSize::NewEachStep { sizes: 2 }, 300),
            (3, GroupSize::Bytes(50), 100),
        ]
    );
}

#[test]
fn the_text_names_the_steps_the_rule_and_the_groups() {
    let (v, counts) = server_loop();
    let text = analyze(&v, counts, &GrowthOptions::default()).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "growth report: {} live allocations, {}, in 3 groups; 2 grow",
            v.len(),
            crate::fmt_bytes(v.iter().map(|a| a.bytes).sum())
        )
    );
    assert_eq!(
        lines[1],
        "steps: 41, one per step marker (40 written; step 0 is before the first)"
    );
    assert_eq!(
        lines[2..6].join("\n"),
        "rule: a group (a tag and a size; a tag's sizes made in one step each pooled as\n  \
         \"a new size each step\") grows when its live allocations come from at least 32\n  \
         distinct steps, one of them in the last quarter (step 30 or later); its rate\n  \
         is what it gained after its first step, per step since"
    );
    assert_eq!(lines[6], "growing, most bytes per step first:");
    // 3 a step, 61506 B a step: (3000 s + 6) over s = 1..40, over 40 steps.
    assert_eq!(
        lines[7],
        format!(
            "  tag 0, a new size each step (122 sizes): 3 allocations and {} per step",
            crate::fmt_bytes(61_506)
        )
    );
    assert!(
        lines[8].starts_with("      123 live, ")
            && lines[8].ends_with(", made in steps 0 to 40 (41 distinct)"),
        "{}",
        lines[8]
    );
    // 32 gained over 39 steps: 0.821 a step; 8192 B over 39: 210 B.
    assert_eq!(
        lines[9],
        "  tag 0, 256 B each: 0.821 allocations and 210 B per step"
    );
    assert_eq!(
        lines[10],
        "      33 live, 8.2 KiB, made in steps 1 to 33 (33 distinct)"
    );
    assert_eq!(lines[11], "not growing, most bytes first:");
    assert!(
        lines[12].starts_with("  tag 5, 512 B each: "),
        "{}",
        lines[12]
    );
    assert_eq!(
        lines[13],
        "      20 live, 10.0 KiB, made in steps 2 to 40 (20 distinct)"
    );
    assert_eq!(lines.len(), 14);

    // Nothing grows: said in so many words.
    let r = analyze(&v[..3], counts, &GrowthOptions::default());
    assert!(r.to_string().contains("\ngrowing: none\n"), "{r}");
}

/// Beyond [`SHOWN_NOT_GROWING`] groups that do not grow, the rest is one line.
#[test]
fn the_text_sums_the_groups_beyond_those_shown() {
    let n = SHOWN_NOT_GROWING as u64 + 3;
    // Each size in two steps (not pooled), sizes 1000, 2000, ...: the smallest
    // three are summed.
    let v: Vec<LiveAllocation> = (1..=n)
        .flat_map(|i| [live(1000 * i, 0, 0, 0, 0), live(1000 * i, 0, 1, 1, 0)])
        .collect();
    let counts = StepCounts {
        allocations: 2,
        markers: 1,
        scopes: 0,
    };
    let text = analyze(&v, counts, &GrowthOptions::default()).to_string();
    let last = text.lines().last().unwrap_or("");
    // Sizes 1000, 2000, 3000 twice each: 6 live, 12000 bytes.
    assert_eq!(
        last,
        format!("  ... 3 more groups: 6 live, {}", crate::fmt_bytes(12_000))
    );
}

#[test]
fn the_json_form_has_every_field() {
    let (v, counts) = server_loop();
    let r = analyze(&v, counts, &GrowthOptions::default());
    let j: serde_json::Value =
        serde_json::from_str(&r.to_json()).unwrap_or_else(|e| panic!("{e}: {}", r.to_json()));
    assert_eq!(j["step_kind"], "markers");
    assert!(j["step_events"].is_null());
    assert_eq!(j["steps"], 41);
    assert_eq!(j["markers"], 40);
    assert_eq!(j["scopes"], 3);
    assert_eq!(j["min_steps"], 32);
    assert_eq!(j["final_quarter_from"], 30);
    assert_eq!(j["live_count"], v.len() as u64);
    assert_eq!(j["growing"], 2);
    let groups = j["groups"].as_array().map_or(0, Vec::len);
    assert_eq!(groups, 3);
    let g = &j["groups"][0];
    assert!(g["bytes"].is_null());
    assert_eq!(g["sizes"], 122);
    assert_eq!(g["count"], 123);
    assert_eq!(g["added_count"], 120);
    assert_eq!(g["steps_after_first"], 40);
    assert_eq!(g["allocations_per_step"], 3.0);
    assert_eq!(g["grows"], true);
    assert_eq!(j["groups"][2]["bytes"], 512);
    assert_eq!(j["groups"][2]["tag"], 5);
    assert_eq!(j["groups"][2]["grows"], false);

    let r = analyze(&[], StepCounts::default(), &GrowthOptions::default());
    let j: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap_or_default();
    assert_eq!(j["step_kind"], "events");
    assert_eq!(j["step_events"], 1000);
    assert_eq!(j["groups"].as_array().map(Vec::len), Some(0));
}
