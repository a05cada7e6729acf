//! `--plot OUT`: the lines of each replay, gathered while replaying, drawn to OUT
//! once every replay of the input ran (`flare_tools::plot`).

use std::path::Path;

use flare_package::trace::{PhysicalSamples, ReplayReport, Trace};
use flare_tools::plot::{self, Line, MemoryPlot, MAX_POINTS};

use crate::{Stop, EXIT_BAD_INPUT, EXIT_FAILED};

/// Fresh samples for one replay of `t`.
pub(crate) fn samples_for(t: &Trace) -> PhysicalSamples {
    PhysicalSamples::new(t.len() as u64, MAX_POINTS)
}

/// The line of one replay: its samples, stopped where it ran out of memory.
pub(crate) fn line_of(label: &str, samples: &PhysicalSamples, report: &ReplayReport) -> Line {
    let runs: Vec<(u64, u64, u64)> = samples
        .points()
        .iter()
        .map(|p| (p.first_event, p.end_event, p.max_physical_bytes))
        .collect();
    // The replay stops at the allocation that ran out of memory: the event after
    // the last one sampled.
    let out_of_memory_at_event = report
        .out_of_memory_at_line
        .map(|_| runs.last().map_or(0, |r| r.1));
    Line {
        label: label.to_string(),
        runs,
        out_of_memory_at_event,
    }
}

/// `--plot` takes exactly one input, and a path whose extension names a format:
/// checked before anything is replayed.
pub(crate) fn check(out: &Path, inputs: usize) -> Result<(), Stop> {
    if inputs != 1 {
        return Err(Stop::Failed(
            EXIT_BAD_INPUT,
            format!("--plot takes exactly one input, not {inputs}"),
        ));
    }
    plot::Format::of(out).map_err(|e| Stop::Failed(EXIT_BAD_INPUT, format!("--plot {e}")))?;
    Ok(())
}

/// Draws the replays' `lines` of trace `t` to `out`, with the bytes live and the
/// lower bound at `granularity`.
pub(crate) fn write(out: &Path, t: &Trace, granularity: u64, lines: Vec<Line>) -> Result<(), Stop> {
    let events = t.len() as u64;
    let per_point = events.div_ceil(MAX_POINTS).max(1);
    let plot = MemoryPlot {
        title: format!("{}: memory over {} events", t.name(), events),
        events,
        policies: lines,
        live: Line {
            label: "live bytes".into(),
            runs: plot::live_bytes(t, per_point, events),
            out_of_memory_at_event: None,
        },
        lower_bound_bytes: t.lower_bound_bytes(granularity),
    };
    plot::write(&plot, out).map_err(|e| Stop::Failed(EXIT_FAILED, format!("--plot: {e}")))
}
