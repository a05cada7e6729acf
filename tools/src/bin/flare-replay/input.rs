//! The inputs: each read and parsed before anything is replayed, a flare-trace or a
//! PyTorch snapshot imported as one, and `--convert`, which writes a snapshot's
//! flare-trace instead of replaying it.

use std::io::Read;
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

/// The most bytes an input is read to: a flare-trace of 16 GiB holds some 500 million
/// lines, far beyond any recorded workload (the shipped traces are under 4 MB, a
/// 20-graph warm-up's recording 2 MB); past it the reading stops and what was read is
/// parsed (a truncated last line is refused like any other).
const MAX_INPUT_BYTES: u64 = 16 << 30;

/// Bytes read at a time, and how much text is read before a byte that no trace holds
/// stops the reading.
const CHUNK: usize = 64 << 10;

/// Reads `r` to its end, at most [`MAX_INPUT_BYTES`]; with `may_be_text`, an input that
/// does not start as a pickle stops at the first chunk holding a NUL byte or bytes that
/// are not UTF-8 (no flare-trace holds them: the parser then refuses the line that has
/// them, from what was read, at once). Endless or binary input (`/dev/zero`,
/// `/dev/urandom` on standard input) is refused instead of read until memory runs out.
fn read_bounded(r: impl std::io::Read, may_be_text: bool) -> std::io::Result<Vec<u8>> {
    let mut r = r.take(MAX_INPUT_BYTES);
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = match r.read(&mut chunk) {
            Ok(0) => return Ok(bytes),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let start = bytes.len();
        bytes.extend_from_slice(&chunk[..n]);
        let text = may_be_text && !torch_snapshot::looks_like_pickle(&bytes);
        // A chunk may end inside a multi-byte character: only a sequence that is wrong,
        // not one cut short, stops the reading.
        if text
            && (chunk[..n].contains(&0)
                || std::str::from_utf8(&bytes[start.saturating_sub(3)..])
                    .is_err_and(|e| e.error_len().is_some()))
        {
            return Ok(bytes);
        }
    }
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
        read_bounded(std::io::stdin().lock(), true)
    } else {
        std::fs::File::open(path).and_then(|f| read_bounded(f, !named_as_pickle(path)))
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
