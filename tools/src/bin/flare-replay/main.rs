//! `flare-replay`: replays flare-trace v1 files (and PyTorch memory snapshots, imported
//! as flare-traces by `flare_tools::torch_snapshot`) on a fresh pool per reuse policy and
//! prints, per trace, its reference figures (lower bound, no reuse) and a table of
//! peak and final physical memory, mappings created, reuse hits, the out-of-memory
//! line and the allocations still live at the end of the trace (which the replay
//! releases); `--json` prints one object per (trace, policy) instead. `--help` says
//! what every figure, policy and JSON key means. `--convert OUT SNAPSHOT` writes a
//! snapshot's flare-trace instead of replaying it; `--growth` prints each trace's
//! growth report instead (`growth.rs`).
//!
//! Exit status: 0 when every replay ran (running out of memory is a result, shown in
//! the table), 1 when a pool could not be created, a replay or writing the output
//! failed, 2 for bad input (arguments, a missing or malformed trace or snapshot). When
//! standard output is closed early (`flare-replay ... | head -1`), it stops replaying
//! and exits 0, quietly.

mod args;
mod growth;
mod input;
mod output;
mod plot;
mod viz;

use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use flare_package::trace::{self, ReplayReport, Trace};
use flare_package::{fmt_bytes, Pool, PoolConfig, ReusePolicy, SimConfig};
use flare_tools::torch_snapshot::{self, Level};

use crate::args::{Args, BackendArg, DEFAULT_CAPACITY};
use crate::input::{convert, read_input, Input};
use crate::output::{emit_json_row, gib, render_census, render_table};

/// Exit status for bad input.
const EXIT_BAD_INPUT: u8 = 2;
/// Exit status for a failed pool or replay.
const EXIT_FAILED: u8 = 1;

/// How a run ends early.
enum Stop {
    /// Standard output was closed (a reader such as `head` is done): nothing more can
    /// be shown, so the tool stops and exits 0 without a message.
    OutputClosed,
    /// An error: the exit status and the message.
    Failed(u8, String),
}

impl From<(u8, String)> for Stop {
    fn from((code, message): (u8, String)) -> Stop {
        Stop::Failed(code, message)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) | Err(Stop::OutputClosed) => ExitCode::SUCCESS,
        Err(Stop::Failed(code, message)) => {
            eprintln!("flare-replay: error: {message}");
            ExitCode::from(code)
        }
    }
}

/// Writes `text` to standard output and flushes it. A closed output (`EPIPE`) is
/// [`Stop::OutputClosed`]; any other write error is a failure.
fn emit(text: &str) -> Result<(), Stop> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Stop::OutputClosed),
        Err(e) => Err(Stop::Failed(EXIT_FAILED, format!("writing to stdout: {e}"))),
    }
}

/// The name a trace read from standard input (`-`) has in reports.
const STDIN_NAME: &str = "<stdin>";

fn run(args: &Args) -> Result<(), Stop> {
    if args.backend == BackendArg::Cuda && args.capacity.is_some() {
        return Err(Stop::Failed(
            EXIT_BAD_INPUT,
            "--capacity applies to the simulated backend only".into(),
        ));
    }
    let is_stdin = |p: &PathBuf| p.as_path() == Path::new("-");
    if args.traces.iter().filter(|p| is_stdin(p)).count() > 1 {
        return Err(Stop::Failed(
            EXIT_BAD_INPUT,
            "`-` (standard input) can be given only once".into(),
        ));
    }
    if args.convert.is_some() && args.traces.len() != 1 {
        return Err(Stop::Failed(
            EXIT_BAD_INPUT,
            format!(
                "--convert takes exactly one input (a PyTorch snapshot), not {}",
                args.traces.len()
            ),
        ));
    }
    let options = torch_snapshot::Options {
        level: args.torch_events.map_or(Level::Tensor, Level::from),
        device: args.device,
    };
    // Every trace is parsed (every snapshot imported) before anything is replayed:
    // bad input runs nothing.
    let mut traces = Vec::with_capacity(args.traces.len());
    for path in &args.traces {
        traces.push(read_input(path, is_stdin(path), &options)?);
    }
    if (args.torch_events.is_some() || args.device.is_some())
        && traces.iter().all(|i| i.snapshot.is_none())
    {
        return Err(Stop::Failed(
            EXIT_BAD_INPUT,
            "--torch-events and --device apply to PyTorch snapshots only, and no input is one"
                .into(),
        ));
    }
    if let Some(out) = &args.convert {
        return convert(out, &traces);
    }
    if let Some(out) = &args.plot {
        plot::check(out, traces.len())?;
    }
    if args.as_recorded {
        return run_as_recorded(args, &traces);
    }
    if args.growth {
        return growth::run(args, &traces);
    }
    if args.viz.is_some() && traces.len() != 1 {
        return Err(Stop::Failed(
            EXIT_BAD_INPUT,
            format!(
                "--viz takes exactly one input (its snapshot is of one trace), not {}",
                traces.len()
            ),
        ));
    }
    // Stream-ordered lines replay on the simulated driver only: refused before any
    // trace replays, not after those before it.
    if args.backend == BackendArg::Cuda {
        if let Some(t) = traces.iter().find(|i| i.trace.has_streams()) {
            return Err(Stop::Failed(
                EXIT_BAD_INPUT,
                format!(
                    "{}: stream-ordered lines (a stream on an `a` or `f` line, `r`, `done`) \
                     replay on the simulated backend only, not with --backend cuda",
                    t.trace.name()
                ),
            ));
        }
    }
    let config = match args.backend {
        BackendArg::Sim => PoolConfig::simulated(SimConfig {
            capacity_bytes: args.capacity.unwrap_or(DEFAULT_CAPACITY),
            ..SimConfig::default()
        }),
        BackendArg::Cuda => PoolConfig::cuda(0),
    };
    let config = PoolConfig {
        best_fit_max_waste_percent: args.best_fit_waste_percent,
        ..config
    };
    let show_progress = !args.json && std::io::stderr().is_terminal();
    for Input {
        trace: t, snapshot, ..
    } in &traces
    {
        let mut rows: Vec<(ReusePolicy, ReplayReport)> = Vec::new();
        let mut census: Vec<(ReusePolicy, Vec<trace::TagReplay>)> = Vec::new();
        let mut granularity = 0;
        let mut lines = Vec::new();
        for &policy in &args.policy.0 {
            let config = PoolConfig {
                history_events: args
                    .viz
                    .as_ref()
                    .map_or(0, |_| viz::history_events(t.len())),
                ..config.clone()
            };
            let pool = Pool::new(config.with_policy(policy)).map_err(|e| {
                (
                    EXIT_FAILED,
                    format!("cannot create a {} pool: {e}", args.backend.name()),
                )
            })?;
            granularity = pool.granularity();
            let mut viz_error = None;
            let viz_path = args
                .viz
                .as_ref()
                .map(|out| viz::path_for(out, policy, args.policy.0.len() > 1));
            let mut at_end = |pool: &Pool| {
                if let Some(path) = &viz_path {
                    viz::write(pool, path, &mut viz_error);
                }
            };
            let mut samples = args.plot.as_ref().map(|_| plot::samples_for(t));
            let (report, tags) = replay_with_progress(
                &pool,
                t,
                policy,
                show_progress,
                samples.as_mut(),
                &mut at_end,
            )
            .map_err(|e| (EXIT_FAILED, format!("replay ({}): {e}", policy.name())))?;
            if let Some(e) = viz_error {
                return Err(Stop::Failed(EXIT_FAILED, e));
            }
            if let Some(s) = &samples {
                lines.push(plot::line_of(policy.name(), s, &report));
            }
            census.push((policy, tags));
            pool.destroy().map_err(|e| {
                (
                    EXIT_FAILED,
                    format!("destroying the pool after {}: {e}", t.name()),
                )
            })?;
            if args.json {
                emit_json_row(t.name(), policy.name(), args.backend.name(), &report)?;
            }
            rows.push((policy, report));
        }
        if !args.json {
            emit(&render_table(t, snapshot.as_ref(), granularity, &rows))?;
            if t.has_tags() {
                emit(&render_census(&census))?;
            }
        }
        if let Some(out) = &args.plot {
            plot::write(out, t, granularity, lines)?;
        }
    }
    Ok(())
}

/// `--as-recorded`: each trace on a pool of its recorded configuration.
fn run_as_recorded(args: &Args, traces: &[Input]) -> Result<(), Stop> {
    // Every trace has its header before any is replayed (a bad input replays
    // nothing, as a parse error does).
    if let Some(t) = traces
        .iter()
        .map(|i| &i.trace)
        .find(|t| t.recorded_config().is_none())
    {
        return Err(Stop::Failed(
            EXIT_BAD_INPUT,
            format!(
                "{}: no `# flare-pool` header: not a recorded trace (--as-recorded)",
                t.name()
            ),
        ));
    }
    for t in traces.iter().map(|i| &i.trace) {
        let Some(recorded) = t.recorded_config() else {
            continue;
        };
        let pool = Pool::new(recorded.pool_config())
            .map_err(|e| (EXIT_FAILED, format!("cannot create the pool: {e}")))?;
        let mut samples = args.plot.as_ref().map(|_| plot::samples_for(t));
        let report = match samples.as_mut() {
            Some(s) => trace::replay_as_recorded_sampled(&pool, t, None, s),
            None => trace::replay_as_recorded(&pool, t, None),
        }
        .map_err(|e| (EXIT_FAILED, format!("replay (as recorded): {e}")))?;
        if let (Some(out), Some(s)) = (&args.plot, &samples) {
            let line = plot::line_of("as recorded", s, &report);
            plot::write(out, t, recorded.granularity, vec![line])?;
        }
        pool.destroy().map_err(|e| {
            (
                EXIT_FAILED,
                format!("destroying the pool after {}: {e}", t.name()),
            )
        })?;
        if args.json {
            emit_json_row(
                t.name(),
                recorded.policy.name(),
                BackendArg::Sim.name(),
                &report,
            )?;
        } else {
            emit(&format!(
                "{} (as recorded: {}, granularity {}, device {})\n  peak physical {} ({} B), \
                 final physical {}, mappings created {}, reuse hits {}, live at end {}{}\n\n",
                t.name(),
                recorded.policy.name(),
                fmt_bytes(recorded.granularity),
                fmt_bytes(recorded.device_total),
                gib(report.peak_physical_bytes),
                report.peak_physical_bytes,
                gib(report.final_physical_bytes),
                report.mappings_created,
                report.reuse_hits,
                report.live_at_end,
                report
                    .out_of_memory_at_line
                    .map_or(String::new(), |l| format!(", out of memory at line {l}")),
            ))?;
        }
    }
    Ok(())
}

/// Replays with a progress bar on stderr that appears only once the replay has run
/// for more than a second (and only when `show` is set).
fn replay_with_progress(
    pool: &Pool,
    t: &Trace,
    policy: ReusePolicy,
    show: bool,
    mut samples: Option<&mut trace::PhysicalSamples>,
    at_end: &mut dyn FnMut(&Pool),
) -> Result<(ReplayReport, Vec<trace::TagReplay>), trace::ReplayError> {
    if !show {
        return trace::replay_observed(pool, t, None, samples.as_deref_mut(), Some(at_end));
    }
    let bar = ProgressBar::with_draw_target(Some(t.len() as u64), ProgressDrawTarget::hidden());
    if let Ok(style) =
        ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} events ({eta} left)")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(format!("{} ({})", t.name(), policy.name()));
    let started = Instant::now();
    let visible = Cell::new(false);
    let on_progress = |done: u64, _total: u64| {
        if !visible.get() && started.elapsed() > Duration::from_secs(1) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            visible.set(true);
        }
        bar.set_position(done);
    };
    let result = trace::replay_observed(pool, t, Some(&on_progress), samples, Some(at_end));
    bar.finish_and_clear();
    result
}
