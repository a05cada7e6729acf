//! The report as people read it: what a step was, the rule with its thresholds, the
//! groups that grow, then the others.

use std::fmt;

use super::{GroupSize, GrowthGroup, GrowthReport, StepKind};
use crate::fmt_bytes;

/// Groups that do not grow shown one per line; the rest are summed on one line.
pub const SHOWN_NOT_GROWING: usize = 20;

impl fmt::Display for GrowthReport {
    /// The report as text, two lines per group (the groups that do not grow beyond
    /// the first [`SHOWN_NOT_GROWING`] summed on one line), ending in a line break.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let growing = self.growing().count();
        writeln!(
            f,
            "growth report: {} live allocation{}, {}, in {} group{}; {}",
            self.live_count,
            plural(self.live_count),
            fmt_bytes(self.live_bytes),
            self.groups.len(),
            plural(self.groups.len() as u64),
            match growing {
                0 => "none grows".to_string(),
                1 => "1 grows".to_string(),
                n => format!("{n} grow"),
            }
        )?;
        let c = &self.counts;
        match self.step_kind {
            StepKind::Markers => writeln!(
                f,
                "steps: {}, one per step marker ({} written; step 0 is before the first)",
                self.steps, c.markers
            )?,
            StepKind::Scopes => writeln!(
                f,
                "steps: {}, one per retention scope begun ({} begun, no step markers; \
                 step 0 is before the first)",
                self.steps, c.scopes
            )?,
            StepKind::Events(n) => writeln!(
                f,
                "steps: {}, of {n} allocation{} each ({} made; no step markers, no \
                 retention scopes)",
                self.steps,
                plural(n),
                c.allocations
            )?,
        }
        writeln!(
            f,
            "rule: a group (a tag and a size; a tag's sizes made in one step each pooled as\n  \
             \"a new size each step\") grows when its live allocations come from at least {}\n  \
             distinct steps, one of them in the last quarter (step {} or later); its rate\n  \
             is what it gained after its first step, per step since",
            self.options.min_steps, self.final_quarter_from
        )?;
        if growing == 0 {
            writeln!(f, "growing: none")?;
        } else {
            writeln!(f, "growing, most bytes per step first:")?;
            for g in self.growing() {
                writeln!(f, "  {}", Line(g))?;
            }
        }
        let others: Vec<&GrowthGroup> = self.groups.iter().filter(|g| !g.grows).collect();
        if !others.is_empty() {
            writeln!(f, "not growing, most bytes first:")?;
            for g in others.iter().take(SHOWN_NOT_GROWING) {
                writeln!(f, "  {}", Line(g))?;
            }
            let rest = &others[others.len().min(SHOWN_NOT_GROWING)..];
            if !rest.is_empty() {
                let count = rest.iter().map(|g| g.count).sum::<u64>();
                let bytes = rest.iter().fold(0u64, |s, g| s.saturating_add(g.bytes));
                writeln!(
                    f,
                    "  ... {} more group{}: {count} live, {}",
                    rest.len(),
                    plural(rest.len() as u64),
                    fmt_bytes(bytes)
                )?;
            }
        }
        Ok(())
    }
}

/// One group's line.
struct Line<'a>(&'a GrowthGroup);

impl fmt::Display for Line<'_> {
    /// Two lines: the group and its rate, then (indented, without a line break at
    /// the end) what is live and the steps it was made in.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.0;
        write!(f, "tag {}, ", g.tag)?;
        match g.size {
            GroupSize::Bytes(b) if b >= 1024 => write!(f, "{} ({b} B) each", fmt_bytes(b))?,
            GroupSize::Bytes(b) => write!(f, "{b} B each")?,
            GroupSize::NewEachStep { sizes } => {
                write!(f, "a new size each step ({sizes} size{})", plural(sizes))?
            }
        }
        let per_step = g.allocations_per_step();
        write!(
            f,
            ": {} allocation{} and {} per step\n      {} live, {}, made in ",
            rate(per_step),
            if per_step == 1.0 { "" } else { "s" },
            fmt_bytes(g.bytes_per_step().round() as u64),
            g.count,
            fmt_bytes(g.bytes)
        )?;
        if g.first_step == g.last_step {
            write!(f, "step {}", g.first_step)
        } else {
            write!(
                f,
                "steps {} to {} ({} distinct)",
                g.first_step, g.last_step, g.distinct_steps
            )
        }
    }
}

/// A rate as text: whole numbers without decimals, others with up to three.
fn rate(x: f64) -> String {
    if x.fract() == 0.0 {
        return format!("{x:.0}");
    }
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0');
    s.trim_end_matches('.').to_string()
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
