//! The report as JSON, for tools (`flare-replay --growth --json`, the C and Python
//! entry points): written by hand, since the library has no serialization
//! dependency; numbers and fixed names only, so nothing needs escaping.

use std::fmt::Write;

use super::{GroupSize, GrowthReport, StepKind};

impl GrowthReport {
    /// The report as one JSON object on one line:
    /// `{"step_kind":"markers"|"scopes"|"events","step_events":N|null,"steps":N,
    /// "allocations":N,"markers":N,"scopes":N,"min_steps":N,"final_quarter_from":N,
    /// "live_count":N,"live_bytes":N,"growing":N,"groups":[...]}`, each group
    /// `{"tag":N,"bytes":N|null,"sizes":N,"count":N,"live_bytes":N,"first_step":N,
    /// "last_step":N,"distinct_steps":N,"added_count":N,"added_bytes":N,"steps_after_first":N,
    /// "allocations_per_step":X,"bytes_per_step":X,"grows":true|false}` in the
    /// report's order (`bytes` null and `sizes` the pooled sizes for "a new size each
    /// step"; `sizes` 1 otherwise). `steps`, `allocations`, `markers` and `scopes`
    /// are [`GrowthReport::steps`] and [`GrowthReport::counts`].
    pub fn to_json(&self) -> String {
        let mut s = String::with_capacity(256 + 256 * self.groups.len());
        let step_events = match self.step_kind {
            StepKind::Events(n) => n.to_string(),
            _ => "null".to_string(),
        };
        // Writing to a String cannot fail.
        let _ = write!(
            s,
            "{{\"step_kind\":\"{}\",\"step_events\":{step_events},\"steps\":{},\
             \"allocations\":{},\"markers\":{},\"scopes\":{},\"min_steps\":{},\
             \"final_quarter_from\":{},\"live_count\":{},\"live_bytes\":{},\
             \"growing\":{},\"groups\":[",
            self.step_kind.name(),
            self.steps,
            self.counts.allocations,
            self.counts.markers,
            self.counts.scopes,
            self.options.min_steps,
            self.final_quarter_from,
            self.live_count,
            self.live_bytes,
            self.growing().count(),
        );
        for (i, g) in self.groups.iter().enumerate() {
            let (bytes, sizes) = match g.size {
                GroupSize::Bytes(b) => (b.to_string(), 1),
                GroupSize::NewEachStep { sizes } => ("null".to_string(), sizes),
            };
            let _ = write!(
                s,
                "{}{{\"tag\":{},\"bytes\":{bytes},\"sizes\":{sizes},\"count\":{},\
                 \"live_bytes\":{},\"first_step\":{},\"last_step\":{},\
                 \"distinct_steps\":{},\"added_count\":{},\"added_bytes\":{},\
                 \"steps_after_first\":{},\
                 \"allocations_per_step\":{},\"bytes_per_step\":{},\"grows\":{}}}",
                if i == 0 { "" } else { "," },
                g.tag,
                g.count,
                g.bytes,
                g.first_step,
                g.last_step,
                g.distinct_steps,
                g.added_count,
                g.added_bytes,
                g.steps_after_first,
                number(g.allocations_per_step()),
                number(g.bytes_per_step()),
                g.grows,
            );
        }
        s.push_str("]}");
        s
    }
}

/// A finite f64 as a JSON number (Rust's `Display` of one never uses an exponent
/// and always has a digit before any point); anything else (never: rates divide
/// by at least 1) as 0.
fn number(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "0".to_string()
    }
}
