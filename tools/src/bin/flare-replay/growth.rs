//! `--growth`: each trace's growth report (`Trace::growth_report`: the allocations
//! live at its end, grouped by tag, size and step, those that keep growing first),
//! as text or, with `--json`, one JSON object per trace; nothing is replayed.

use flare_package::growth::{GrowthOptions, DEFAULT_MIN_STEPS, DEFAULT_STEP_EVENTS};

use crate::args::Args;
use crate::input::Input;
use crate::{emit, Stop};

/// Prints the growth report of every input, in order.
pub(crate) fn run(args: &Args, traces: &[Input]) -> Result<(), Stop> {
    let options = GrowthOptions {
        step_events: args.step_events.unwrap_or(DEFAULT_STEP_EVENTS),
        min_steps: args.min_steps.unwrap_or(DEFAULT_MIN_STEPS),
    };
    for input in traces {
        let t = &input.trace;
        let report = t.growth_report(&options);
        if args.json {
            // The library's object with the trace's path first.
            let json = report.to_json();
            let name = serde_json::to_string(t.name()).unwrap_or_else(|_| "null".into());
            let rest = json.strip_prefix('{').unwrap_or(&json);
            emit(&format!("{{\"trace\":{name},{rest}\n"))?;
        } else {
            emit(&format!("{}\n{report}\n", t.name()))?;
        }
    }
    Ok(())
}
