//! `--viz OUT.pickle`: a memory_viz snapshot of each policy's replay (issue 38),
//! taken when the trace's events are done, before the replay frees what is live.

use std::path::{Path, PathBuf};

use flare_package::{Pool, ReusePolicy};

/// The most events a replay's history ring keeps (about 72 bytes each): a longer
/// replay's snapshot holds its last events only.
const MAX_EVENTS: usize = 4 << 20;

/// The history ring of a replay of a trace of `events` lines: room for every event
/// the replay writes (an allocation writes at most a map and an `alloc`, a free two
/// events and an unmap; releases write one unmap per mapping), up to
/// [`MAX_EVENTS`].
pub(crate) fn history_events(events: usize) -> usize {
    events
        .saturating_mul(8)
        .saturating_add(1024)
        .min(MAX_EVENTS)
}

/// The file of `policy`'s snapshot: `out` itself when one policy is replayed, else
/// `out` with the policy's name before its extension (`run.pickle` ->
/// `run.best-fit.pickle`).
pub(crate) fn path_for(out: &Path, policy: ReusePolicy, several: bool) -> PathBuf {
    if !several {
        return out.to_path_buf();
    }
    let stem = out.file_stem().map_or_else(
        || std::ffi::OsString::from("snapshot"),
        std::ffi::OsStr::to_os_string,
    );
    let mut name = stem;
    name.push(".");
    name.push(policy.name());
    if let Some(ext) = out.extension() {
        name.push(".");
        name.push(ext);
    }
    out.with_file_name(name)
}

/// Writes `pool`'s snapshot to `path`; the first error is kept in `error`.
pub(crate) fn write(pool: &Pool, path: &Path, error: &mut Option<String>) {
    if let Err(e) = pool.dump_snapshot(path) {
        error.get_or_insert(format!("--viz: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_per_policy_when_several() {
        let out = Path::new("dir/run.pickle");
        assert_eq!(path_for(out, ReusePolicy::Exact, false), out);
        assert_eq!(
            path_for(out, ReusePolicy::BestFit, true),
            Path::new("dir/run.best-fit.pickle")
        );
        assert_eq!(
            path_for(Path::new("run"), ReusePolicy::Segments, true),
            Path::new("run.segments")
        );
    }

    #[test]
    fn the_ring_holds_a_replays_events_up_to_a_bound() {
        assert_eq!(history_events(0), 1024);
        assert_eq!(history_events(1000), 9024);
        assert_eq!(history_events(usize::MAX), MAX_EVENTS);
    }
}
