//! The analysis: live allocations grouped by tag and size, the new sizes of each step
//! pooled, each group's steps and rate, and the rule that says which grow.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::{
    GroupSize, GrowthGroup, GrowthOptions, GrowthReport, LiveAllocation, StepCounts, StepKind,
};

/// The report of `live` (the allocations still live, in any order) at `counts`,
/// under `options` (the module's documentation says the rules).
pub fn analyze(
    live: &[LiveAllocation],
    counts: StepCounts,
    options: &GrowthOptions,
) -> GrowthReport {
    let step_kind = if counts.markers > 0 {
        StepKind::Markers
    } else if counts.scopes > 0 {
        StepKind::Scopes
    } else {
        StepKind::Events(options.step_events.max(1))
    };
    // The step kind as two plain values read once: a closure matching on
    // `step_kind` let the compiler test `Events`' divisor (for the division's zero
    // check) before the variant, a jump on bytes that `Markers` and `Scopes` leave
    // unwritten (valgrind's memcheck flagged it in the C programs).
    let per_step = match step_kind {
        StepKind::Events(n) => n.max(1),
        StepKind::Markers | StepKind::Scopes => 1,
    };
    let by_markers = matches!(step_kind, StepKind::Markers);
    let by_scopes = matches!(step_kind, StepKind::Scopes);
    let step_of = |a: &LiveAllocation| {
        if by_markers {
            a.markers
        } else if by_scopes {
            a.scopes
        } else {
            a.seq / per_step
        }
    };
    // The step running now; never below a live allocation's (a marker written while
    // the report's records were read is counted).
    let now = if by_markers {
        counts.markers
    } else if by_scopes {
        counts.scopes
    } else {
        counts.allocations.saturating_sub(1) / per_step
    };
    let last = live.iter().map(step_of).fold(now, u64::max);
    let steps = last.saturating_add(1);
    let final_quarter_from = steps - steps.div_ceil(4);

    // The steps of each (tag, size), sorted.
    let mut by_size: BTreeMap<(u32, u64), Vec<u64>> = BTreeMap::new();
    for a in live {
        by_size
            .entry((a.tag, a.bytes))
            .or_default()
            .push(step_of(a));
    }
    let mut groups = Vec::new();
    // Per tag: the sizes made in one step each, pooled.
    let mut pooled: BTreeMap<u32, Vec<Made>> = BTreeMap::new();
    for ((tag, bytes), mut made) in by_size {
        made.sort_unstable();
        let first = made.first().copied().unwrap_or(0);
        let last_made = made.last().copied().unwrap_or(0);
        let count = made.len() as u64;
        if first == last_made {
            pooled.entry(tag).or_default().push(Made {
                step: first,
                count,
                bytes: bytes.saturating_mul(count),
            });
            continue;
        }
        let in_first = made.iter().take_while(|&&s| s == first).count() as u64;
        made.dedup();
        groups.push(Summary {
            tag,
            size: GroupSize::Bytes(bytes),
            count,
            bytes: bytes.saturating_mul(count),
            first_count: in_first,
            first_bytes: bytes.saturating_mul(in_first),
            steps: made,
        });
    }
    for (tag, sizes) in pooled {
        let first = sizes.iter().map(|m| m.step).min().unwrap_or(0);
        let sum = |of_first: bool, f: fn(&Made) -> u64| {
            sizes
                .iter()
                .filter(|m| !of_first || m.step == first)
                .fold(0u64, |s, m| s.saturating_add(f(m)))
        };
        let mut steps: Vec<u64> = sizes.iter().map(|m| m.step).collect();
        steps.sort_unstable();
        steps.dedup();
        groups.push(Summary {
            tag,
            size: GroupSize::NewEachStep {
                sizes: sizes.len() as u64,
            },
            count: sum(false, |m| m.count),
            bytes: sum(false, |m| m.bytes),
            first_count: sum(true, |m| m.count),
            first_bytes: sum(true, |m| m.bytes),
            steps,
        });
    }
    let mut groups: Vec<GrowthGroup> = groups
        .into_iter()
        .map(|s| s.group(last, final_quarter_from, options.min_steps))
        .collect();
    groups.sort_by(order);
    GrowthReport {
        step_kind,
        steps,
        counts,
        options: *options,
        final_quarter_from,
        live_count: live.len() as u64,
        live_bytes: live.iter().fold(0u64, |sum, a| sum.saturating_add(a.bytes)),
        groups,
    }
}

/// One size of a tag whose live allocations were all made in one step.
struct Made {
    step: u64,
    count: u64,
    bytes: u64,
}

/// A group before its rate and rule: its distinct steps, sorted (never empty), and
/// what its first step made.
struct Summary {
    tag: u32,
    size: GroupSize,
    count: u64,
    bytes: u64,
    first_count: u64,
    first_bytes: u64,
    steps: Vec<u64>,
}

impl Summary {
    /// The group, with `last` the report's last step.
    fn group(self, last: u64, final_quarter_from: u64, min_steps: u64) -> GrowthGroup {
        let first_step = self.steps.first().copied().unwrap_or(0);
        let last_step = self.steps.last().copied().unwrap_or(0);
        let distinct_steps = self.steps.len() as u64;
        GrowthGroup {
            tag: self.tag,
            size: self.size,
            count: self.count,
            bytes: self.bytes,
            first_step,
            last_step,
            distinct_steps,
            added_count: self.count - self.first_count,
            added_bytes: self.bytes.saturating_sub(self.first_bytes),
            steps_after_first: last - first_step,
            grows: distinct_steps >= min_steps && last_step >= final_quarter_from,
        }
    }
}

/// The report's order: groups that grow first, most bytes per step first; then the
/// others, most bytes first; ties by tag, then size.
fn order(a: &GrowthGroup, b: &GrowthGroup) -> Ordering {
    let rank = b.grows.cmp(&a.grows);
    let amount = if a.grows && b.grows {
        // a.added / a.steps against b.added / b.steps, exactly (a group that grows
        // has steps after its first: it has a distinct step there).
        let lhs = u128::from(a.added_bytes) * u128::from(b.steps_after_first);
        let rhs = u128::from(b.added_bytes) * u128::from(a.steps_after_first);
        rhs.cmp(&lhs)
    } else {
        b.bytes.cmp(&a.bytes)
    };
    rank.then(amount)
        .then(a.tag.cmp(&b.tag))
        .then(a.size.cmp(&b.size))
}
