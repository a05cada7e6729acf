//! `flare-replay`: replays flare-trace v1 files on a fresh pool per reuse policy and
//! prints peak and final physical memory, mappings created, reuse hits and the
//! allocations still live at the end of the trace (which the replay releases), next
//! to the trace's lower bound and no-reuse figures.
//!
//! Exit status: 0 when every replay ran (running out of memory is a result, shown in
//! the table), 1 when a pool could not be created or a replay failed, 2 for bad
//! input (arguments, a missing or malformed trace).

use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use comfy_table::{CellAlignment, Table};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use flare_package::trace::{self, ReplayReport, Trace};
use flare_package::{fmt_bytes, Pool, PoolConfig, ReusePolicy, SimConfig};

/// What `--help` says after the options.
const AFTER_HELP: &str = "\
Exit status:
  0  every replay ran (running out of memory is a result, shown in the table)
  1  a pool could not be created or a replay failed
  2  bad input: arguments, a missing or malformed trace";

#[derive(Debug, Parser)]
#[command(
    name = "flare-replay",
    version,
    about = "Replay flare-trace v1 allocation traces on flare-package pools, one fresh pool per reuse policy",
    after_help = AFTER_HELP
)]
struct Args {
    /// Driver to replay on: the simulated device, or the real CUDA driver.
    #[arg(long, value_enum, default_value_t = BackendArg::Sim)]
    backend: BackendArg,

    /// Reuse policy: none, exact, best-fit, or all (one replay each).
    #[arg(long, default_value = "all", value_parser = parse_policies)]
    policy: Policies,

    /// Capacity of the simulated device: bytes, or a number with a suffix
    /// (K/M/G/T or KiB/MiB/GiB/TiB: powers of 1024; KB/MB/GB/TB: powers of 1000).
    /// Default 140GiB. Simulated backend only.
    #[arg(long, value_parser = parse_capacity)]
    capacity: Option<u64>,

    /// Best-fit only: the largest excess of a reused idle mapping over the rounded
    /// request, percent of the request (default: the library's, chosen on these
    /// traces).
    #[arg(long, value_name = "PERCENT", default_value_t = flare_package::pool::DEFAULT_BEST_FIT_MAX_WASTE_PERCENT)]
    best_fit_waste_percent: u32,

    /// One JSON object per replay on stdout, nothing else.
    #[arg(long)]
    json: bool,

    /// Trace files (flare-trace v1).
    #[arg(required = true, value_name = "TRACE")]
    traces: Vec<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// The simulated driver.
    Sim,
    /// The real CUDA driver (libcuda).
    Cuda,
}

impl BackendArg {
    fn name(self) -> &'static str {
        match self {
            BackendArg::Sim => "sim",
            BackendArg::Cuda => "cuda",
        }
    }
}

/// The policies to replay with, in report order.
#[derive(Clone, Debug)]
struct Policies(Vec<ReusePolicy>);

/// `--policy`: exactly `none`, `exact`, `best-fit` or `all` (no aliases, no other
/// spelling).
fn parse_policies(s: &str) -> Result<Policies, String> {
    let policies = match s {
        "none" => vec![ReusePolicy::None],
        "exact" => vec![ReusePolicy::Exact],
        "best-fit" => vec![ReusePolicy::BestFit],
        "all" => ReusePolicy::ALL.to_vec(),
        _ => {
            return Err(format!(
                "unknown reuse policy {s:?} (expected none, exact, best-fit or all)"
            ))
        }
    };
    Ok(Policies(policies))
}

/// Default capacity of the simulated device, bytes.
const DEFAULT_CAPACITY: u64 = 140 << 30;

fn parse_capacity(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "{s:?} is not a byte count (examples: 103079215104, 96GiB, 141G)"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{digits} is too large"))?;
    let unit: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "unknown size suffix {:?} (B, K, M, G, T, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                suffix.trim()
            ))
        }
    };
    match n.checked_mul(unit) {
        Some(0) => Err("the capacity must be greater than 0 bytes".into()),
        Some(b) => Ok(b),
        None => Err(format!("{s} does not fit in 64 bits")),
    }
}

/// One line of `--json` output. Keys are part of the tool's interface.
#[derive(Serialize)]
struct JsonRow<'a> {
    trace: &'a str,
    policy: &'a str,
    backend: &'a str,
    allocations: u64,
    peak_physical_bytes: u64,
    final_physical_bytes: u64,
    mappings_created: u64,
    reuse_hits: u64,
    out_of_memory_at_line: Option<usize>,
    seconds: f64,
}

/// Exit status for bad input.
const EXIT_BAD_INPUT: u8 = 2;
/// Exit status for a failed pool or replay.
const EXIT_FAILED: u8 = 1;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => {
            eprintln!("flare-replay: error: {message}");
            ExitCode::from(code)
        }
    }
}

fn run(args: &Args) -> Result<(), (u8, String)> {
    if args.backend == BackendArg::Cuda && args.capacity.is_some() {
        return Err((
            EXIT_BAD_INPUT,
            "--capacity applies to the simulated backend only".into(),
        ));
    }
    // Every trace is parsed before anything is replayed: bad input runs nothing.
    let mut traces = Vec::with_capacity(args.traces.len());
    for path in &args.traces {
        traces.push(trace::parse(path).map_err(|e| (EXIT_BAD_INPUT, e.to_string()))?);
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
    let stdout = std::io::stdout();
    for t in &traces {
        let mut rows: Vec<(ReusePolicy, ReplayReport)> = Vec::new();
        let mut granularity = 0;
        for &policy in &args.policy.0 {
            let pool = Pool::new(config.clone().with_policy(policy)).map_err(|e| {
                (
                    EXIT_FAILED,
                    format!("cannot create a {} pool: {e}", args.backend.name()),
                )
            })?;
            granularity = pool.granularity();
            let report = replay_with_progress(&pool, t, policy, show_progress)
                .map_err(|e| (EXIT_FAILED, format!("replay ({}): {e}", policy.name())))?;
            pool.destroy().map_err(|e| {
                (
                    EXIT_FAILED,
                    format!("destroying the pool after {}: {e}", t.name()),
                )
            })?;
            if args.json {
                let row = JsonRow {
                    trace: t.name(),
                    policy: policy.name(),
                    backend: args.backend.name(),
                    allocations: report.allocations,
                    peak_physical_bytes: report.peak_physical_bytes,
                    final_physical_bytes: report.final_physical_bytes,
                    mappings_created: report.mappings_created,
                    reuse_hits: report.reuse_hits,
                    out_of_memory_at_line: report.out_of_memory_at_line,
                    seconds: report.seconds,
                };
                let line = serde_json::to_string(&row)
                    .map_err(|e| (EXIT_FAILED, format!("JSON output: {e}")))?;
                let mut out = stdout.lock();
                writeln!(out, "{line}")
                    .and_then(|()| out.flush())
                    .map_err(|e| (EXIT_FAILED, format!("writing to stdout: {e}")))?;
            }
            rows.push((policy, report));
        }
        if !args.json {
            print_table(t, granularity, &rows);
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
) -> Result<ReplayReport, trace::ReplayError> {
    if !show {
        return trace::replay(pool, t, None);
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
    let result = trace::replay(pool, t, Some(&on_progress));
    bar.finish_and_clear();
    result
}

/// Bytes as GiB with two decimals at and above 1 GiB (as the traces' README prints
/// them), else as [`fmt_bytes`].
fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
    } else {
        fmt_bytes(bytes)
    }
}

fn print_table(t: &Trace, granularity: u64, rows: &[(ReusePolicy, ReplayReport)]) {
    println!(
        "{}: {} events, {} allocations; lower bound {}, no reuse {} (granularity {})",
        t.name(),
        t.len(),
        t.allocations(),
        gib(t.lower_bound_bytes(granularity)),
        gib(t.no_reuse_bytes(granularity)),
        fmt_bytes(granularity),
    );
    let mut table = Table::new();
    table.set_header(vec![
        "trace",
        "policy",
        "peak physical",
        "final physical",
        "mappings created",
        "reuse hits",
        "out of memory",
        "live at end",
        "wall time",
    ]);
    for (policy, r) in rows {
        table.add_row(vec![
            t.name().to_string(),
            policy.name().to_string(),
            gib(r.peak_physical_bytes),
            gib(r.final_physical_bytes),
            r.mappings_created.to_string(),
            r.reuse_hits.to_string(),
            r.out_of_memory_at_line
                .map_or_else(|| "-".to_string(), |l| format!("line {l}")),
            r.live_at_end.to_string(),
            format!("{:.3} s", r.seconds),
        ]);
    }
    for i in 2..9 {
        if let Some(col) = table.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    println!("{table}\n");
}
