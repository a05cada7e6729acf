//! The inputs: each read and parsed before anything is replayed, a flare-trace or a
//! PyTorch snapshot imported as one, and `--convert`, which writes a snapshot's
//! flare-trace instead of replaying it.

use std::path::Path;

use flare_package::trace::{self, Trace};
use flare_tools::torch_snapshot::{self, Summary};

use crate::{emit, Stop, EXIT_BAD_INPUT, EXIT_FAILED, STDIN_NAME};

/// One input, read and parsed: a flare-trace, or a PyTorch snapshot imported as one.
pub(crate) struct Input {
    pub(crate) trace: Trace,
    /// The flare-trace text of an imported snapshot.
    pub(crate) text: Option<String>,
    /// What the import of a snapshot did; `None` for a flare-trace.
    pub(crate) snapshot: Option<Summary>,
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
pub(crate) fn read_input(
    path: &Path,
    stdin: bool,
    options: &torch_snapshot::Options,
) -> Result<Input, Stop> {
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
pub(crate) fn convert(out: &Path, inputs: &[Input]) -> Result<(), Stop> {
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
