//! The growth report (issue 38): which allocations still live keep growing, step after
//! step, and how fast.
//!
//! A pure analysis, below the pool and the trace replay, which both use it: live
//! allocations in ([`LiveAllocation`], each stamped when it was made with its
//! allocation sequence number and the step counts then), a [`GrowthReport`] out
//! ([`analyze`]). [`Pool::growth_report`](crate::Pool::growth_report) stamps a live
//! pool's allocations; [`Trace::growth_report`](crate::trace::Trace::growth_report)
//! follows a trace's lines; `flare-replay --growth` prints the latter.
//!
//! # Steps
//! A step is, in this order of preference:
//! - the span between two markers the caller writes (`Pool::mark_step`,
//!   `flare_pool_mark_step`, Python's `mark_step()`, a trace's `step` line), when at
//!   least one was written: [`StepKind::Markers`];
//! - else the span between two retention scopes' begins, when a scope was begun:
//!   [`StepKind::Scopes`];
//! - else [`GrowthOptions::step_events`] allocations: [`StepKind::Events`].
//!
//! Step 0 is before the first marker (scope begin; the first allocation); the last
//! step is the one running when the report is made. Only one kind counts: a caller
//! that writes a marker per request and also opens a scope per request has one step
//! per request, not two.
//!
//! # Groups
//! Allocations are grouped by tag and requested size. A size whose live allocations
//! were all made in one step, as a per-shape cache or per-shape scratch makes (a new
//! size every call), would be a group of one step that never looks like growth; such
//! sizes are pooled, per tag, into one group, "a new size each step"
//! ([`GroupSize::NewEachStep`]). Each group has its live count and bytes, the steps
//! its allocations were made in (first, last, how many distinct), and its rate: the
//! allocations and bytes it gained after its first step, divided by the steps from
//! its first step to the last (a burst in its first step is its base, not its rate:
//! a leak's new sizes pooled with a model's weights made before the first marker
//! grow at the leak's rate).
//!
//! # What grows
//! A group grows when its live allocations were made in at least
//! [`GrowthOptions::min_steps`] distinct steps (default 32) and one of them is in the
//! last quarter of the steps: growth that goes on to the end. A warmup's retention
//! stops: the graph-warmup trace shipped in `tests/data/` ends with 63 allocations
//! live, made while its CUDA graphs were captured (21 cuBLAS workspaces of 32 MiB and
//! the graphs' outputs, a new size each graph: bounded by the number of graphs), in
//! 21 distinct steps of 1000 allocations, below 32.
//! The groups that grow come first, most bytes per step first; the others follow,
//! most bytes first. The report's text states the rule with its thresholds.

mod analysis;
mod json;
mod text;

pub use analysis::analyze;
pub use text::SHOWN_NOT_GROWING;

/// Allocations per step when neither markers nor retention scopes define the steps
/// ([`GrowthOptions::step_events`]'s default).
pub const DEFAULT_STEP_EVENTS: u64 = 1000;

/// The distinct steps a group's live allocations must come from for it to grow
/// ([`GrowthOptions::min_steps`]'s default): above the 21 steps of the shipped
/// graph-warmup trace's survivors, below the 100 calls or more of a server loop that
/// leaks.
pub const DEFAULT_MIN_STEPS: u64 = 32;

/// How a report cuts time into steps and what it calls growth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrowthOptions {
    /// Allocations per step when there are neither markers nor retention scopes
    /// (default [`DEFAULT_STEP_EVENTS`]); 0 is taken as 1.
    pub step_events: u64,
    /// The distinct steps a group's live allocations must come from for it to grow
    /// (default [`DEFAULT_MIN_STEPS`]).
    pub min_steps: u64,
}

impl Default for GrowthOptions {
    fn default() -> Self {
        GrowthOptions {
            step_events: DEFAULT_STEP_EVENTS,
            min_steps: DEFAULT_MIN_STEPS,
        }
    }
}

/// One allocation still live, with what was stamped on it when it was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LiveAllocation {
    /// Bytes the caller asked for (not rounded).
    pub bytes: u64,
    /// Its tag (0: untagged).
    pub tag: u32,
    /// Its sequence number: how many allocations were made before it (0 for the
    /// first). A live pool's allocations served by different threads' caches may be
    /// out of order by up to [`SEQ_SKEW`] each.
    pub seq: u64,
    /// Step markers written before it.
    pub markers: u64,
    /// Retention scopes begun before it.
    pub scopes: u64,
}

/// A live pool's sequence numbers are exact in one thread; a thread cache takes
/// them this many at a time (one shared counter update per this many allocations, so
/// that threads reusing memory share no counter), so across threads an allocation's
/// number may be off its true order by up to this many.
pub const SEQ_SKEW: u64 = 64;

/// Where the counts stand when the report is made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCounts {
    /// Allocations made so far (live or freed).
    pub allocations: u64,
    /// Step markers written so far.
    pub markers: u64,
    /// Retention scopes begun so far.
    pub scopes: u64,
}

/// What a report took as a step (the module's documentation, "Steps").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// The span between two step markers.
    Markers,
    /// The span between two retention scopes' begins.
    Scopes,
    /// This many allocations.
    Events(u64),
}

impl StepKind {
    /// Its name in the JSON form: `markers`, `scopes` or `events`.
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Markers => "markers",
            StepKind::Scopes => "scopes",
            StepKind::Events(_) => "events",
        }
    }
}

/// The sizes of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupSize {
    /// One requested size, bytes.
    Bytes(u64),
    /// The tag's sizes whose live allocations were all made in one step each, pooled
    /// ("a new size each step"): this many sizes.
    NewEachStep {
        /// Distinct sizes pooled.
        sizes: u64,
    },
}

/// One group of live allocations: a tag and a size (or the tag's new sizes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrowthGroup {
    /// The tag (0: untagged).
    pub tag: u32,
    /// The size, or the pooled new sizes.
    pub size: GroupSize,
    /// Allocations live.
    pub count: u64,
    /// Bytes live (requested; saturating at `u64::MAX`).
    pub bytes: u64,
    /// The first step a live allocation of the group was made in.
    pub first_step: u64,
    /// The last step a live allocation of the group was made in.
    pub last_step: u64,
    /// The distinct steps its live allocations were made in.
    pub distinct_steps: u64,
    /// Allocations live that were made after its first step: what its rate counts
    /// (a burst in its first step, a model's weights made before the first marker
    /// pooled with a leak's new sizes, say, is its base, not its growth).
    pub added_count: u64,
    /// Their bytes (saturating).
    pub added_bytes: u64,
    /// Steps after its first step up to the report's last step: what its rate
    /// divides by (0 when its first step is the last).
    pub steps_after_first: u64,
    /// Whether it grows (the module's documentation, "What grows").
    pub grows: bool,
}

impl GrowthGroup {
    /// Allocations per step: [`GrowthGroup::added_count`] over
    /// [`GrowthGroup::steps_after_first`] (0 when that is 0).
    pub fn allocations_per_step(&self) -> f64 {
        per_step(self.added_count, self.steps_after_first)
    }

    /// Bytes per step: [`GrowthGroup::added_bytes`] over
    /// [`GrowthGroup::steps_after_first`] (0 when that is 0).
    pub fn bytes_per_step(&self) -> f64 {
        per_step(self.added_bytes, self.steps_after_first)
    }
}

/// `amount / steps`, 0 for no steps.
fn per_step(amount: u64, steps: u64) -> f64 {
    if steps == 0 {
        0.0
    } else {
        amount as f64 / steps as f64
    }
}

/// The growth report: every group of live allocations, those that grow first. Its
/// `Display` is the text people read (the rule and its thresholds included);
/// [`GrowthReport::to_json`] the form tools read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowthReport {
    /// What a step was.
    pub step_kind: StepKind,
    /// Steps, the one running at the report included (the last is `steps - 1`).
    pub steps: u64,
    /// The counts the steps were cut from.
    pub counts: StepCounts,
    /// The options it was made with.
    pub options: GrowthOptions,
    /// The first step of the last quarter: a group grows only with a live
    /// allocation made at this step or later.
    pub final_quarter_from: u64,
    /// Allocations live.
    pub live_count: u64,
    /// Bytes live (requested; saturating).
    pub live_bytes: u64,
    /// The groups: those that grow, most bytes per step first; then the others,
    /// most bytes first.
    pub groups: Vec<GrowthGroup>,
}

impl GrowthReport {
    /// The groups that grow, most bytes per step first.
    pub fn growing(&self) -> impl Iterator<Item = &GrowthGroup> {
        self.groups.iter().filter(|g| g.grows)
    }

    /// Whether any group grows.
    pub fn grows(&self) -> bool {
        self.groups.iter().any(|g| g.grows)
    }
}

#[cfg(test)]
mod tests;
