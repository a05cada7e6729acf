//! What a replay prints: the table of each trace, the census per tag of a trace
//! with tags, and one JSON row per replay with `--json`.

use comfy_table::{presets, CellAlignment, Table};
use serde::Serialize;

use flare_package::trace::{self, ReplayReport, Trace};
use flare_package::{fmt_bytes, ReusePolicy};
use flare_tools::torch_snapshot::Summary;

use crate::{emit, Stop, EXIT_FAILED};

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

/// Writes one `--json` row: a replay of trace `trace` under `policy` on `backend`.
///
/// Errors: status 1 when the row cannot be serialised or written.
pub(crate) fn emit_json_row(
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

/// The census of each tag of a trace with tags, per policy, taken when the trace's
/// events are done (before the replay frees what is still live): `a` lines, the
/// tag's peak live bytes, and its live, idle and physical bytes then
/// (`Pool::tag_census`; tag 0 is the lines without a tag).
pub(crate) fn render_census(census: &[(ReusePolicy, Vec<trace::TagReplay>)]) -> String {
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
pub(crate) fn gib(bytes: u64) -> String {
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
pub(crate) fn render_table(
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
