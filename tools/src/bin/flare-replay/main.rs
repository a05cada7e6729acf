//! `flare-replay`: replays flare-trace v1 files (and PyTorch memory snapshots, imported
//! as flare-traces by `flare_tools::torch_snapshot`) on a fresh pool per reuse policy and
//! prints, per trace, its reference figures (lower bound, no reuse) and a table of
//! peak and final physical memory, mappings created, reuse hits, the out-of-memory
//! line and the allocations still live at the end of the trace (which the replay
//! releases); `--json` prints one object per (trace, policy) instead. `--help` says
//! what every figure, policy and JSON key means. `--convert OUT SNAPSHOT` writes a
//! snapshot's flare-trace instead of replaying it.
//!
//! Exit status: 0 when every replay ran (running out of memory is a result, shown in
//! the table), 1 when a pool could not be created, a replay or writing the output
//! failed, 2 for bad input (arguments, a missing or malformed trace or snapshot). When
//! standard output is closed early (`flare-replay ... | head -1`), it stops replaying
//! and exits 0, quietly.

use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use comfy_table::{presets, CellAlignment, Table};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use flare_package::trace::{self, Excerpt, ReplayReport, Trace};
use flare_package::{fmt_bytes, Pool, PoolConfig, ReusePolicy, SimConfig};
use flare_tools::torch_snapshot::{self, Level, Summary};

/// What `-h` says after the options.
const AFTER_HELP: &str = "\
Trace format: docs/trace-format.md in the flare-package source. An input that is a
pickle (or named *.pickle, *.pkl) is read as a PyTorch memory snapshot. `--help` says
what the policies, the table's figures and the --json keys mean.

Exit status:
  0  every replay ran (running out of memory is a result, shown in the table)
  1  a pool could not be created, a replay failed, or writing the output failed
     (other than a closed pipe)
  2  bad input: arguments, a missing or malformed trace or snapshot";

/// What `--help` says after the options.
const AFTER_LONG_HELP: &str = "\
Traces (flare-trace v1, described in docs/trace-format.md in the flare-package
source): one event per line, `a ID BYTES` (allocate; `a ID BYTES TAG` for a tagged
allocation, TAG 0 to 4294967295), `f ID` (free), `begin`,
`finish` and `abort` (a retention scope), `trim`; `#` starts a comment line. A
recorded trace (one with a `# flare-pool` header line) also has `r`, `done`, `oom`,
`x`, `sleep`, `wake` lines and streams on `a` and `f` lines. `-` reads a trace from
standard input (once; it is called <stdin> in the output). Every trace is parsed
before any is replayed, and one whose replay would fail for a reason its text shows
(a free of a sleeping tag's allocation, say) is refused: bad input replays nothing.
A trace with no scope lines is replayed inside one retention scope.

PyTorch memory snapshots (the pickle of torch.cuda.memory._dump_snapshot after
torch.cuda.memory._record_memory_history): an input whose first byte is 0x80 (a
pickle) or whose name ends in .pickle or .pkl is imported as a flare-trace of one
device's events (--device) and replayed like one (docs/trace-format.md, \"Importing
PyTorch memory snapshots\"). --torch-events chooses the events:
  tensor   the allocation trace (default): alloc -> `a` of the allocation's block
           size (the caching allocator's blocks are rebuilt from the events),
           free_requested -> `f` (free_completed only keeps the block layout)
  segment  the segment events: segment_alloc and segment_map -> `a`,
           segment_free and segment_unmap -> `f`
Ids are the addresses in hex. The table's heading then says which events were
used, the `a` and `f` lines, the block sizes that had to be rounded requests (no
free block at the address: allocated before recording, or a setting such as
expandable segments), the frees skipped (not live: allocated before recording) and
the peak of live bytes. `--convert OUT SNAPSHOT` writes the snapshot's flare-trace
to OUT (`-`: standard output), the same summary as its comments, and replays
nothing; the trace replays exactly as the snapshot does.

Reuse policies (each replay runs on a fresh pool):
  none      never reuse: a freed mapping is kept (retained) until its retention
            scope closes; the warmup-retention bug, kept as the baseline
  exact     reuse an idle mapping of exactly the request's rounded size
  best-fit  reuse the smallest idle mapping that is large enough, if it exceeds
            the rounded request by at most --best-fit-waste-percent
  segments  carve blocks (requests rounded to 512 bytes) out of segments of
            whole handles, split and coalesced: many tensors share a handle

Each trace gets a heading: its path, its events and `a` lines, and two reference
figures, sizes rounded up to the device's allocation granularity:
  lower bound  the peak of the bytes live at once: the least a pool that gives
               each allocation a mapping of its own can hold on this trace
  no reuse     the peak physical memory of a pool that never reuses (what `none`
               reaches unless it runs out of memory)
then one row per policy:
  peak physical     the most physical memory the pool held
  final physical    what the pool still holds once the replay freed everything,
                    closed the scope and trimmed (0 B when every release worked)
  mappings created  allocations that created a mapping (driver calls); for
                    segments, the handles created to grow a segment
  reuse hits        allocations served from an idle mapping (no driver call); for
                    segments, blocks carved from memory already held
  out of memory     the line whose allocation found the device full, or asked for
                    more than the whole device, which stopped the replay (- when
                    the whole trace ran)
  live at end       allocations still live when the replay stopped (the trace's
                    end or the out-of-memory line); the replay then frees them
  wall time         the replay's own time, parsing excluded
A trace with tags (an `a` line with a tag other than 0) then gets a census per
policy and tag, taken when the trace's events are done (before the replay frees
what is live): the tag's `a` lines, its peak live bytes, and its live, idle and
physical bytes then (tag 0: the lines without a tag). Tagged allocations are whole
mappings in every policy.

--json prints, instead of the table, one JSON object per line and per (trace,
policy), with exactly these keys:
  trace                  the trace's path as given (<stdin> for -)
  policy                 none, exact, best-fit or segments
  backend                sim or cuda
  allocations            allocations the replay made: mappings_created +
                         reuse_hits (all the trace's `a` lines unless it ran
                         out of memory)
  peak_physical_bytes    peak physical, bytes
  final_physical_bytes   final physical, bytes
  mappings_created       as in the table
  reuse_hits             as in the table
  out_of_memory_at_line  the out-of-memory line, null when the whole trace ran
  seconds                wall time, seconds

Exit status:
  0  every replay ran (running out of memory is a result, shown in the table);
     also when standard output is closed early (`| head`): the tool stops quietly
  1  a pool could not be created, a replay failed, or writing the output failed
     (other than a closed pipe)
  2  bad input: arguments, a missing or malformed trace or snapshot";

/// `--help` on `--capacity`.
const CAPACITY_HELP: &str = "\
Capacity of the simulated device (simulated backend only; default 140GiB): bytes, or
a number with a suffix: K, M, G, T or KiB, MiB, GiB, TiB are powers of 1024; KB,
MB, GB, TB powers of 1000. A decimal number is rounded down to a whole byte
(1.5G = 1.5 * 2^30 = 1610612736). At least the device's allocation granularity
(2 MiB), the size of the smallest mapping.";

/// `--help` on `--best-fit-waste-percent`.
const WASTE_HELP: &str = "\
Best-fit only: the largest excess of a reused idle mapping over the rounded request,
a whole number of percent of the request (100: up to twice its size); 0 reuses
only mappings of exactly the rounded size, as `exact` does. The default is the
library's, chosen on the shipped traces. (The C ABI's `best_fit_max_waste_percent`
reads 0 as that default instead, because an older caller's zeroed struct padding
reads 0 there.) Ignored by the other policies.";

#[derive(Debug, Parser)]
#[command(
    name = "flare-replay",
    version,
    about = "Replay flare-trace v1 allocation traces (or PyTorch memory snapshots) on flare-package pools, one fresh pool per reuse policy",
    after_help = AFTER_HELP,
    after_long_help = AFTER_LONG_HELP
)]
struct Args {
    /// Driver to replay on: the simulated device, or the real CUDA driver.
    #[arg(long, value_enum, default_value_t = BackendArg::Sim)]
    backend: BackendArg,

    /// Reuse policy: none, exact, best-fit, segments, or all (one replay each).
    #[arg(long, default_value = "all", value_parser = parse_policies)]
    policy: Policies,

    /// Capacity of the simulated device (default 140GiB; simulated backend only).
    #[arg(long, value_parser = parse_capacity, long_help = CAPACITY_HELP)]
    capacity: Option<u64>,

    /// Best-fit only: the largest excess of a reused mapping, percent of the request.
    #[arg(
        long,
        value_name = "PERCENT",
        value_parser = parse_percent,
        default_value_t = flare_package::pool::DEFAULT_BEST_FIT_MAX_WASTE_PERCENT,
        long_help = WASTE_HELP
    )]
    best_fit_waste_percent: u32,

    /// One JSON object per replay on stdout, nothing else (keys: see --help).
    #[arg(long)]
    json: bool,

    /// PyTorch snapshots only: which events to replay (default tensor).
    #[arg(long, value_enum, value_name = "EVENTS")]
    torch_events: Option<TorchEvents>,

    /// PyTorch snapshots only: the device whose events to replay (index in the
    /// snapshot's device_traces; default: the one device that has events).
    #[arg(long, value_name = "N")]
    device: Option<usize>,

    /// Write the flare-trace of the one input, a PyTorch snapshot, to OUT (`-`:
    /// standard output) instead of replaying it.
    #[arg(
        long,
        value_name = "OUT",
        conflicts_with_all = ["json", "backend", "capacity", "policy", "best_fit_waste_percent"]
    )]
    convert: Option<PathBuf>,

    /// Replay recorded traces as the recorded pool ran them: with the configuration
    /// of their `# flare-pool` header (policy, granularity, device memory, ...) on
    /// the simulated driver, no implicit scope; one row each (--policy, --capacity,
    /// --backend and --best-fit-waste-percent do not apply, and are refused).
    #[arg(
        long,
        conflicts_with_all = ["convert", "backend", "capacity", "policy", "best_fit_waste_percent"]
    )]
    as_recorded: bool,

    /// Trace files (flare-trace v1) or PyTorch memory snapshots; `-` is standard
    /// input.
    #[arg(required = true, value_name = "TRACE")]
    traces: Vec<PathBuf>,
}

/// `--torch-events`: which events of a PyTorch snapshot become the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum TorchEvents {
    /// The allocation trace (per-tensor events): alloc, free_requested.
    Tensor,
    /// The segment events: segment_alloc, segment_free (segment_map, segment_unmap).
    Segment,
}

impl From<TorchEvents> for Level {
    fn from(e: TorchEvents) -> Level {
        match e {
            TorchEvents::Tensor => Level::Tensor,
            TorchEvents::Segment => Level::Segment,
        }
    }
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

/// `--policy`: exactly `none`, `exact`, `best-fit`, `segments` or `all` (no
/// aliases, no other spelling).
fn parse_policies(s: &str) -> Result<Policies, String> {
    let policies = match s {
        "none" => vec![ReusePolicy::None],
        "exact" => vec![ReusePolicy::Exact],
        "best-fit" => vec![ReusePolicy::BestFit],
        "segments" => vec![ReusePolicy::Segments],
        "all" => ReusePolicy::ALL.to_vec(),
        _ => {
            return Err(format!(
                "unknown reuse policy {} (expected none, exact, best-fit, segments or all)",
                Excerpt::new(s)
            ))
        }
    };
    Ok(Policies(policies))
}

/// Default capacity of the simulated device, bytes.
const DEFAULT_CAPACITY: u64 = 140 << 30;

/// Most digits after the decimal point of a `--capacity` (18: the fraction times a
/// unit of at most 2^40 stays within 128-bit arithmetic).
const MAX_FRACTION_DIGITS: usize = 18;

/// `--capacity`: a byte count (see [`parse_byte_count`]) of at least one allocation
/// granule of the simulated device, which a smaller device could not map even once
/// (`SimConfig::granularity_bytes`, 2 MiB as measured on an H200).
fn parse_capacity(s: &str) -> Result<u64, String> {
    let bytes = parse_byte_count(s)?;
    let granule = SimConfig::default().granularity_bytes;
    if bytes < granule {
        return Err(format!(
            "capacity {bytes} B is less than the simulated device's allocation granularity, \
             {granule} B ({}): such a device could not hold a single mapping",
            fmt_bytes(granule)
        ));
    }
    Ok(bytes)
}

/// A byte count: decimal digits with at most one `.` and at most
/// [`MAX_FRACTION_DIGITS`] digits after it, then an optional suffix (`K`/`KiB` and
/// the like are powers of 1024, `KB` and the like powers of 1000; case is ignored).
/// The value is rounded down to a whole byte: `1.5G` is 1.5 * 2^30 = 1610612736,
/// `0.1K` is 102.
fn parse_byte_count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(format!(
            "{} is not a byte count (examples: 103079215104, 96GiB, 141G, 1.5T)",
            Excerpt::new(s)
        ));
    }
    if frac.len() > MAX_FRACTION_DIGITS {
        return Err(format!(
            "{} has more than {MAX_FRACTION_DIGITS} digits after the decimal point",
            Excerpt::new(s)
        ));
    }
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
                "unknown size suffix {} (B, K, M, G, T, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                Excerpt::new(suffix.trim())
            ))
        }
    };
    let too_large = || format!("{} does not fit in 64 bits", Excerpt::new(s));
    let whole: u128 = if int.is_empty() {
        0
    } else {
        int.parse::<u64>().map_err(|_| too_large())?.into()
    };
    // frac < 10^18 and unit <= 2^40: the product fits in 128 bits.
    let fraction: u128 = if frac.is_empty() {
        0
    } else {
        let digits: u128 = frac.parse::<u64>().map_err(|_| too_large())?.into();
        digits * u128::from(unit) / 10u128.pow(frac.len() as u32)
    };
    let bytes = whole * u128::from(unit) + fraction;
    u64::try_from(bytes).map_err(|_| too_large())
}

/// `--best-fit-waste-percent`: a whole number of percent, 0 to `u32::MAX` (the
/// pool's bound is an integer percent of the rounded request).
fn parse_percent(s: &str) -> Result<u32, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse()
            .map_err(|_| format!("{} is more than {} percent", Excerpt::new(t), u32::MAX));
    }
    Err(format!(
        "{} is not a whole number of percent (0, 30, 100, ...; no fractions, no sign, no %)",
        Excerpt::new(t)
    ))
}

/// One line of `--json` output. Keys are part of the tool's interface (listed in
/// `--help`).
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
    if args.as_recorded {
        return run_as_recorded(args, &traces);
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
        for &policy in &args.policy.0 {
            let pool = Pool::new(config.clone().with_policy(policy)).map_err(|e| {
                (
                    EXIT_FAILED,
                    format!("cannot create a {} pool: {e}", args.backend.name()),
                )
            })?;
            granularity = pool.granularity();
            let (report, tags) = replay_with_progress(&pool, t, policy, show_progress)
                .map_err(|e| (EXIT_FAILED, format!("replay ({}): {e}", policy.name())))?;
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
    }
    Ok(())
}

/// One input, read and parsed: a flare-trace, or a PyTorch snapshot imported as one.
struct Input {
    trace: Trace,
    /// The flare-trace text of an imported snapshot.
    text: Option<String>,
    /// What the import of a snapshot did; `None` for a flare-trace.
    snapshot: Option<Summary>,
}

/// Whether `path` is named as a pickle (`*.pickle`, `*.pkl`): such an input is read as a
/// PyTorch snapshot even when it does not start as a pickle (and is then "not a
/// pickle").
fn named_as_pickle(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("pickle") || e.eq_ignore_ascii_case("pkl"))
}

/// Reads the input at `path` (standard input when `stdin`): a PyTorch snapshot when it
/// starts as a pickle or is named as one ([`named_as_pickle`]), imported with
/// `options`; else a flare-trace. Its name in reports is the path as given, or
/// `<stdin>`.
///
/// Errors (status 2): the input cannot be read, the trace does not parse, the snapshot
/// cannot be imported. Status 1 if an imported snapshot's trace does not parse (a bug
/// of the importer).
fn read_input(path: &Path, stdin: bool, options: &torch_snapshot::Options) -> Result<Input, Stop> {
    let name = if stdin {
        STDIN_NAME.to_string()
    } else {
        path.display().to_string()
    };
    let read = if stdin {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes).map(|_| bytes)
    } else {
        std::fs::read(path)
    };
    let bytes = read.map_err(|source| {
        let e = trace::TraceError::Io {
            file: name.clone(),
            source,
        };
        (EXIT_BAD_INPUT, e.to_string())
    })?;
    let snapshot = torch_snapshot::looks_like_pickle(&bytes) || (!stdin && named_as_pickle(path));
    if !snapshot {
        let trace =
            trace::parse_reader(&name, &bytes[..]).map_err(|e| (EXIT_BAD_INPUT, e.to_string()))?;
        return Ok(Input {
            trace,
            text: None,
            snapshot: None,
        });
    }
    let imported = torch_snapshot::import(&name, &bytes, options)
        .map_err(|e| (EXIT_BAD_INPUT, format!("{name}: {e}")))?;
    let trace = trace::parse_str(&name, &imported.text).map_err(|e| {
        (
            EXIT_FAILED,
            format!("the trace imported from {name} does not parse (an importer bug): {e}"),
        )
    })?;
    Ok(Input {
        trace,
        text: Some(imported.text),
        snapshot: Some(imported.summary),
    })
}

/// `--convert OUT`: writes the flare-trace of the one input, a snapshot, to `out`
/// (standard output for `-`); for a file, then prints the import's summary and what
/// was written.
///
/// Errors: status 2 when the input is not a snapshot; 1 when writing fails.
fn convert(out: &Path, inputs: &[Input]) -> Result<(), Stop> {
    let Some(Input {
        trace: t,
        text: Some(text),
        snapshot: Some(summary),
    }) = inputs.first()
    else {
        let name = inputs.first().map_or("", |i| i.trace.name());
        return Err(Stop::Failed(
            EXIT_BAD_INPUT,
            format!("--convert reads a PyTorch snapshot; {name} is a flare-trace already"),
        ));
    };
    if out == Path::new("-") {
        return emit(text);
    }
    // Writing over the snapshot being converted would lose it.
    let same = |a: &Path, b: &Path| {
        std::fs::canonicalize(a)
            .ok()
            .zip(std::fs::canonicalize(b).ok())
            .is_some_and(|(a, b)| a == b)
    };
    if same(out, Path::new(t.name())) {
        return Err(Stop::Failed(
            EXIT_BAD_INPUT,
            format!(
                "--convert {}: that is the snapshot being converted; write the trace elsewhere",
                out.display()
            ),
        ));
    }
    std::fs::write(out, text)
        .map_err(|e| (EXIT_FAILED, format!("writing {}: {e}", out.display())))?;
    let mut report = format!("{}\n", t.name());
    for line in summary.lines() {
        report.push_str(&line);
        report.push('\n');
    }
    report.push_str(&format!(
        "wrote {}: {} events, {} \"a\" lines\n",
        out.display(),
        t.len(),
        t.allocations()
    ));
    emit(&report)
}

/// Writes one `--json` row: a replay of trace `trace` under `policy` on `backend`.
///
/// Errors: status 1 when the row cannot be serialised or written.
fn emit_json_row(
    trace: &str,
    policy: &str,
    backend: &str,
    report: &ReplayReport,
) -> Result<(), Stop> {
    let row = JsonRow {
        trace,
        policy,
        backend,
        allocations: report.allocations,
        peak_physical_bytes: report.peak_physical_bytes,
        final_physical_bytes: report.final_physical_bytes,
        mappings_created: report.mappings_created,
        reuse_hits: report.reuse_hits,
        out_of_memory_at_line: report.out_of_memory_at_line,
        seconds: report.seconds,
    };
    let line =
        serde_json::to_string(&row).map_err(|e| (EXIT_FAILED, format!("JSON output: {e}")))?;
    emit(&format!("{line}\n"))
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
        let report = trace::replay_as_recorded(&pool, t, None)
            .map_err(|e| (EXIT_FAILED, format!("replay (as recorded): {e}")))?;
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
) -> Result<(ReplayReport, Vec<trace::TagReplay>), trace::ReplayError> {
    if !show {
        return trace::replay_census(pool, t, None);
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
    let result = trace::replay_census(pool, t, Some(&on_progress));
    bar.finish_and_clear();
    result
}

/// The census of each tag of a trace with tags, per policy, taken when the trace's
/// events are done (before the replay frees what is still live): `a` lines, the
/// tag's peak live bytes, and its live, idle and physical bytes then
/// (`Pool::tag_census`; tag 0 is the lines without a tag).
fn render_census(census: &[(ReusePolicy, Vec<trace::TagReplay>)]) -> String {
    let mut table = Table::new();
    table.load_preset(presets::ASCII_FULL_CONDENSED);
    table.set_header(vec![
        "policy",
        "tag",
        "\"a\"\nlines",
        "peak\nlive",
        "live at\nend",
        "idle at\nend",
        "physical\nat end",
    ]);
    for (policy, tags) in census {
        for r in tags {
            table.add_row(vec![
                policy.name().to_string(),
                r.tag.to_string(),
                r.allocations.to_string(),
                gib(r.census.peak_live_bytes),
                gib(r.census.live_bytes),
                gib(r.census.idle_bytes),
                gib(r.census.physical_bytes),
            ]);
        }
    }
    for i in 1..7 {
        if let Some(col) = table.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    format!("census per tag at the end of the trace\n{table}\n\n")
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

/// The table of one trace: a heading (the trace's name on a line of its own, then,
/// for an imported PyTorch snapshot, the import's summary, then its events, `a` lines
/// and reference figures), then one row per policy under two-line column names,
/// numbers right-aligned. About 90 columns wide, whatever the trace's path.
fn render_table(
    t: &Trace,
    snapshot: Option<&Summary>,
    granularity: u64,
    rows: &[(ReusePolicy, ReplayReport)],
) -> String {
    let mut table = Table::new();
    table.load_preset(presets::ASCII_FULL_CONDENSED);
    table.set_header(vec![
        "policy",
        "peak\nphysical",
        "final\nphysical",
        "mappings\ncreated",
        "reuse\nhits",
        "out of\nmemory",
        "live at\nend",
        "wall\ntime",
    ]);
    for (policy, r) in rows {
        table.add_row(vec![
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
    for i in 1..8 {
        if let Some(col) = table.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    let source: String = snapshot
        .map(|s| s.lines().iter().map(|l| format!("{l}\n")).collect())
        .unwrap_or_default();
    format!(
        "{}\n{source}{} events, {} \"a\" lines; lower bound {}, no reuse {} ({} granularity)\n{table}\n\n",
        t.name(),
        t.len(),
        t.allocations(),
        gib(t.lower_bound_bytes(granularity)),
        gib(t.no_reuse_bytes(granularity)),
        fmt_bytes(granularity),
    )
}

#[cfg(test)]
mod tests {
    use super::{parse_byte_count, parse_capacity, parse_percent};

    #[test]
    fn byte_counts_with_decimals_are_rounded_down_to_a_byte() {
        for (text, bytes) in [
            ("1.5G", 3 << 29), // 1.5 * 2^30
            ("1.5GiB", 3 << 29),
            ("1.5gb", 1_500_000_000),
            (".5K", 512),
            ("2.", 2),
            ("0.1K", 102), // 102.4
            ("0.999B", 0),
            ("1.0000000001K", 1024), // + 1.024e-7 bytes
            ("0.000000000000000001T", 0),
            ("1.25T", 5 << 38), // 1.25 * 2^40
            ("141G", 141 << 30),
            (" 96GiB ", 96 << 30),
            ("103079215104", 103_079_215_104),
            ("18446744073709551615", u64::MAX),
            ("15.999999999999999999T", 17_592_186_044_415), // 16 T - 1e-18 T: 1 byte short
        ] {
            assert_eq!(parse_byte_count(text), Ok(bytes), "{text}");
        }
        for bad in [
            "",
            ".",
            "1.2.3",
            "1e9",
            "-1",
            "1.5X",
            "18446744073709551616",
            "16777216T",
        ] {
            assert!(parse_byte_count(bad).is_err(), "{bad}");
        }
        assert!(parse_byte_count(&format!("1.{}", "1".repeat(19))).is_err());
    }

    #[test]
    fn capacity_is_at_least_one_granule() {
        assert!(parse_capacity("2097151").is_err());
        assert_eq!(parse_capacity("2M"), Ok(2 << 20));
    }

    #[test]
    fn percent_is_a_whole_number() {
        assert_eq!(parse_percent("30"), Ok(30));
        assert_eq!(parse_percent("4294967295"), Ok(u32::MAX));
        for bad in ["1.5", "-1", "+1", "30%", "", "4294967296"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
    }
}
