//! What a replay reports: [`ReplayReport`], [`TagReplay`] (a tag's census at the end)
//! and [`ReplayError`].

use crate::error::Error;

/// What a replay did. Byte fields are bytes; counts count allocations or mappings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplayReport {
    /// Allocations the replay made (successful `a` events).
    pub allocations: u64,
    /// The pool's high watermark of physical bytes after the replay
    /// ([`Snapshot::peak_physical_bytes`](crate::Snapshot::peak_physical_bytes)): the
    /// replay's own peak on a fresh pool, as `flare-replay` runs it.
    pub peak_physical_bytes: u64,
    /// Physical bytes the pool holds after the replay, once the scope finished and
    /// every allocation of the replay was released (0 on a fresh pool unless a
    /// release step failed).
    pub final_physical_bytes: u64,
    /// Mappings the pool created during the replay (driver create/reserve/map).
    pub mappings_created: u64,
    /// Allocations of the replay served from an idle mapping (no driver call).
    pub reuse_hits: u64,
    /// The trace line whose allocation ran out of memory, which stopped the replay;
    /// `None` when the whole trace ran.
    pub out_of_memory_at_line: Option<usize>,
    /// Allocations still live when the replay ended (the trace's end, or the
    /// out-of-memory line); the replay freed them.
    pub live_at_end: u64,
    /// Wall time of the replay itself, seconds (parsing excluded).
    pub seconds: f64,
    /// Requests of `x` lines (refused by the recorded pool with out-of-memory) that
    /// the replay served (and gave back at once): 0 for a replay as recorded that
    /// went as the recording did.
    pub failed_requests_served: u64,
}

/// What one tag held when a replay reached the end of its trace (before the
/// replay's own release): [`replay_census`].
///
/// [`replay_census`]: super::replay_census
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TagReplay {
    /// The tag (0: `a` lines without one).
    pub tag: u32,
    /// The trace's `a` lines with this tag.
    pub allocations: u64,
    /// [`Pool::tag_census`] at the end of the trace: its peak live bytes cover the
    /// whole replay (for tag 0, as sampled at the end).
    ///
    /// [`Pool::tag_census`]: crate::pool::Pool::tag_census
    pub census: crate::TagCensus,
}

/// A replay that failed for a reason other than running out of memory. Whatever the
/// replay allocated was freed and its scope closed before this is returned.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A pool operation failed on a line of the trace (a driver failure, say).
    #[error("{file}:{line}: {source}")]
    Pool {
        /// The trace's name.
        file: String,
        /// The 1-based line of the event.
        line: usize,
        /// The pool's error.
        source: Error,
    },
    /// Opening the replay's own retention scope (for a trace without scope lines)
    /// failed: a scope is already open on the pool, say.
    #[error("{file}: cannot open the replay's retention scope: {source}")]
    Begin {
        /// The trace's name.
        file: String,
        /// The pool's error.
        source: Error,
    },
    /// Releasing at the end of the replay (freeing what is still live, finishing the
    /// scope, trimming) failed: the driver refused a release step. The pool keeps
    /// that memory and retries it at its next release point.
    #[error("{file}: releasing at the end of the replay failed: {source}")]
    Release {
        /// The trace's name.
        file: String,
        /// The first error.
        source: Error,
    },
}
