//! The command line: the options, their help texts, and the parsers of their
//! values (reuse policies, byte counts, percents).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use flare_package::trace::Excerpt;
use flare_package::{fmt_bytes, ReusePolicy, SimConfig};
use flare_tools::torch_snapshot::Level;

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
`finish` and `abort` (a retention scope), `trim`, `step` (a step marker, for
--growth); `#` starts a comment line. A
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

--viz OUT.pickle writes what the pool held when the trace's events were done, as
a memory_viz snapshot (docs/flare-replay.md, \"memory_viz snapshots\"): open it at
pytorch.org/memory_viz or with torch.cuda._memory_viz. The replay runs with the
pool's history ring on (its events are the snapshot's trace: every allocation, free,
mapping made and released). One input; each policy replayed writes its own file,
OUT with the policy's name before the extension, unless one policy is replayed
(--policy NAME), which writes OUT itself.

--growth prints, instead of replaying, each trace's growth report: the
allocations still live at its end, grouped by tag and size (a tag's sizes made in
one step each pooled as \"a new size each step\"), with the steps they were made in
and the rate each group gained at after its first step; the groups that keep
growing first. A step is the span between two `step` lines when the trace has one,
else between two `begin` lines, else --step-events allocations (default 1000). A
group grows when its live allocations come from at least --min-steps distinct
steps (default 32), one of them in the last quarter of the steps. The report is
the trace's own (no pool, the same for every policy); with --json it is one JSON
object per trace, its `trace` key the trace's path (the other keys:
docs/flare-replay.md).

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

/// `--help` on `--plot`.
const PLOT_HELP: &str = "\
Also draw the one input's memory over its events to OUT, as SVG or PNG (from OUT's
extension): one line per replay (policy, or the recorded pool with --as-recorded)
of the physical memory the pool held, the bytes live (the sum of the live
allocations' sizes) and the lower bound as a dashed level. The events are grouped in
runs (at most 2000 a line), each drawn at the largest value any of its events
reached, so no peak is lost. A replay that ran out of memory stops with a cross.
The table (or --json) is printed as without --plot. Takes exactly one input (a
trace, a recorded trace or a PyTorch snapshot).";

#[derive(Debug, Parser)]
#[command(
    name = "flare-replay",
    version,
    about = "Replay flare-trace v1 allocation traces (or PyTorch memory snapshots) on flare-package pools, one fresh pool per reuse policy",
    after_help = AFTER_HELP,
    after_long_help = AFTER_LONG_HELP
)]
pub(crate) struct Args {
    /// Driver to replay on: the simulated device, or the real CUDA driver.
    #[arg(long, value_enum, default_value_t = BackendArg::Sim)]
    pub(crate) backend: BackendArg,

    /// Reuse policy: none, exact, best-fit, segments, or all (one replay each).
    #[arg(long, default_value = "all", value_parser = parse_policies)]
    pub(crate) policy: Policies,

    /// Capacity of the simulated device (default 140GiB; simulated backend only).
    #[arg(long, value_parser = parse_capacity, long_help = CAPACITY_HELP)]
    pub(crate) capacity: Option<u64>,

    /// Best-fit only: the largest excess of a reused mapping, percent of the request.
    #[arg(
        long,
        value_name = "PERCENT",
        value_parser = parse_percent,
        default_value_t = flare_package::pool::DEFAULT_BEST_FIT_MAX_WASTE_PERCENT,
        long_help = WASTE_HELP
    )]
    pub(crate) best_fit_waste_percent: u32,

    /// One JSON object per replay on stdout, nothing else (keys: see --help).
    #[arg(long)]
    pub(crate) json: bool,

    /// PyTorch snapshots only: which events to replay (default tensor).
    #[arg(long, value_enum, value_name = "EVENTS")]
    pub(crate) torch_events: Option<TorchEvents>,

    /// PyTorch snapshots only: the device whose events to replay (index in the
    /// snapshot's device_traces; default: the one device that has events).
    #[arg(long, value_name = "N")]
    pub(crate) device: Option<usize>,

    /// Write the flare-trace of the one input, a PyTorch snapshot, to OUT (`-`:
    /// standard output) instead of replaying it.
    #[arg(
        long,
        value_name = "OUT",
        conflicts_with_all = ["json", "backend", "capacity", "policy", "best_fit_waste_percent"]
    )]
    pub(crate) convert: Option<PathBuf>,

    /// Replay recorded traces as the recorded pool ran them: with the configuration
    /// of their `# flare-pool` header (policy, granularity, device memory, ...) on
    /// the simulated driver, no implicit scope; one row each (--policy, --capacity,
    /// --backend and --best-fit-waste-percent do not apply, and are refused).
    #[arg(
        long,
        conflicts_with_all = ["convert", "backend", "capacity", "policy", "best_fit_waste_percent"]
    )]
    pub(crate) as_recorded: bool,

    /// Also draw the one input's memory over its events to OUT (.svg or .png): the
    /// physical memory of each replay, the bytes live and the lower bound.
    #[arg(long, value_name = "OUT", conflicts_with = "convert", long_help = PLOT_HELP)]
    pub(crate) plot: Option<PathBuf>,

    /// Write a memory_viz snapshot of the replay to OUT (a pickle that PyTorch's
    /// memory_viz opens): the pool's segments and blocks when the trace's events are
    /// done, and its events; one input only; with several policies, one file each,
    /// the policy's name before OUT's extension (run.best-fit.pickle).
    #[arg(
        long,
        value_name = "OUT.pickle",
        conflicts_with_all = ["convert", "as_recorded"]
    )]
    pub(crate) viz: Option<PathBuf>,

    /// Print each trace's growth report (live allocations at its end, grouped by
    /// tag, size and step; those that keep growing first) instead of replaying it.
    #[arg(
        long,
        conflicts_with_all = ["convert", "as_recorded", "backend", "capacity", "policy", "best_fit_waste_percent", "plot", "viz"]
    )]
    pub(crate) growth: bool,

    /// --growth: allocations per step when a trace has no `step` and no `begin`
    /// line (default 1000).
    #[arg(long, value_name = "N", requires = "growth", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) step_events: Option<u64>,

    /// --growth: the distinct steps a group's live allocations must come from for
    /// it to grow (default 32).
    #[arg(long, value_name = "N", requires = "growth")]
    pub(crate) min_steps: Option<u64>,

    /// Trace files (flare-trace v1) or PyTorch memory snapshots; `-` is standard
    /// input.
    #[arg(required = true, value_name = "TRACE")]
    pub(crate) traces: Vec<PathBuf>,
}

/// `--torch-events`: which events of a PyTorch snapshot become the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum TorchEvents {
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
pub(crate) enum BackendArg {
    /// The simulated driver.
    Sim,
    /// The real CUDA driver (libcuda).
    Cuda,
}

impl BackendArg {
    pub(crate) fn name(self) -> &'static str {
        match self {
            BackendArg::Sim => "sim",
            BackendArg::Cuda => "cuda",
        }
    }
}

/// The policies to replay with, in report order.
#[derive(Clone, Debug)]
pub(crate) struct Policies(pub(crate) Vec<ReusePolicy>);

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
pub(crate) const DEFAULT_CAPACITY: u64 = 140 << 30;

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
