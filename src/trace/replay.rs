//! The replay of a parsed [`Trace`] on a [`Pool`]: every event in order, under one
//! implicit retention scope when the trace has no scope lines, with the pool's
//! figures (peak physical bytes, mappings, reuse hits, the line where the device
//! ran out of memory) reported in a [`ReplayReport`].

use std::time::Instant;

use super::{Event, Trace};
use crate::error::Error;
use crate::pool::Pool;

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
}

/// What one tag held when a replay reached the end of its trace (before the
/// replay's own release): [`replay_census`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TagReplay {
    /// The tag (0: `a` lines without one).
    pub tag: u32,
    /// The trace's `a` lines with this tag.
    pub allocations: u64,
    /// [`Pool::tag_census`] at the end of the trace: its peak live bytes cover the
    /// whole replay (for tag 0, as sampled at the end).
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

/// How often (in events) the progress callback is called.
const PROGRESS_EVERY: usize = 1 << 14;

/// Replays `trace` on `pool`, event by event.
///
/// A trace without `begin`/`finish`/`abort` lines runs inside one retention scope
/// (begun before the first event, finished after the last; its `trim` lines are then
/// no-ops, as the pool releases nothing inside a scope). At the end, allocations
/// still live are counted in [`ReplayReport::live_at_end`] and freed, an open scope
/// is finished, and idle cached memory is trimmed, so that
/// [`ReplayReport::final_physical_bytes`] is what the pool holds afterwards.
///
/// An allocation that runs out of memory ([`Error::OutOfMemory`], or
/// [`Error::RequestTooLarge`] for one beyond the whole device) stops the replay:
/// it is reported in [`ReplayReport::out_of_memory_at_line`], not as an error; what
/// was allocated is freed and the open scope is aborted.
///
/// `progress`, when given, is called with `(events done, events in total)` every
/// few thousand events and once at the end.
///
/// Errors: [`ReplayError`] for any other failure; whatever the replay allocated is
/// freed first (the first error is returned).
pub fn replay(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<ReplayReport, ReplayError> {
    replay_inner(pool, trace, progress, None)
}

/// [`replay`], with the census of every tag the trace names
/// ([`Trace::tags`]), taken when the trace's events are done (or stopped), before
/// the replay frees what is live.
///
/// Errors: as [`replay`].
pub fn replay_census(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<(ReplayReport, Vec<TagReplay>), ReplayError> {
    let mut tags = Vec::new();
    let report = replay_inner(pool, trace, progress, Some(&mut tags))?;
    Ok((report, tags))
}

fn replay_inner(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
    tags: Option<&mut Vec<TagReplay>>,
) -> Result<ReplayReport, ReplayError> {
    let start_snapshot = pool.snapshot();
    let implicit_scope = !trace.has_scope_events();
    let total = trace.len() as u64;
    // The pointer table is the replay's bookkeeping, not the pool's work: made before
    // the clock starts (a new user saw the first replay of a large trace timed 3x
    // slower than a second one, from this allocation).
    let mut ptrs: Vec<Option<u64>> = vec![None; trace.id_count()];
    let started = Instant::now();
    if implicit_scope {
        pool.retention_begin()
            .map_err(|source| ReplayError::Begin {
                file: trace.name.clone(),
                source,
            })?;
    }
    let mut live: u64 = 0;
    let mut allocations: u64 = 0;
    let mut scope_open = implicit_scope;
    let mut oom_line: Option<usize> = None;
    let mut failure: Option<(usize, Error)> = None;

    for (i, (&event, &line)) in trace.events.iter().zip(&trace.lines).enumerate() {
        if let Some(report) = progress {
            if i % PROGRESS_EVERY == 0 && i != 0 {
                report(i as u64, total);
            }
        }
        let result = match event {
            Event::Alloc { id, bytes } | Event::AllocTagged { id, bytes, .. } => match ptrs
                .get_mut(id as usize)
            {
                Some(slot @ None) => match match event {
                    Event::AllocTagged { tag, .. } => pool.allocate_tagged_raw(bytes, None, tag),
                    _ => pool.allocate_raw(bytes),
                } {
                    Ok(ptr) => {
                        *slot = Some(ptr);
                        live += 1;
                        allocations += 1;
                        Ok(())
                    }
                    Err(Error::OutOfMemory { .. } | Error::RequestTooLarge { .. }) => {
                        oom_line = Some(line);
                        break;
                    }
                    Err(e) => Err(e),
                },
                // Unreachable for a parsed trace: the parser rejects both.
                _ => Err(Error::InvalidArgument(format!(
                    "allocation id index {id} is live or out of range"
                ))),
            },
            Event::Free { id } => match ptrs.get_mut(id as usize).and_then(Option::take) {
                Some(ptr) => {
                    live -= 1;
                    pool.free_raw(ptr)
                }
                None => Err(Error::InvalidArgument(format!(
                    "allocation id index {id} is not live"
                ))),
            },
            Event::Begin => pool.retention_begin().map(|()| scope_open = true),
            Event::Finish => {
                scope_open = false;
                pool.retention_finish()
            }
            Event::Abort => {
                scope_open = false;
                pool.retention_abort()
            }
            Event::Trim if implicit_scope => Ok(()),
            Event::Trim => pool.trim(),
        };
        if let Err(e) = result {
            failure = Some((line, e));
            break;
        }
    }

    if let Some(out) = tags {
        *out = trace
            .tags()
            .into_iter()
            .map(|(tag, allocations)| TagReplay {
                tag,
                allocations,
                census: pool.tag_census(tag),
            })
            .collect();
    }
    // Release: free what is live, close the scope, trim idle cached memory.
    let live_at_end = live;
    let mut release_error: Option<Error> = None;
    let mut note = |r: crate::Result<()>| {
        if let Err(e) = r {
            release_error.get_or_insert(e);
        }
    };
    for ptr in ptrs.iter_mut().filter_map(Option::take) {
        note(pool.free_raw(ptr));
    }
    if scope_open {
        if oom_line.is_some() || failure.is_some() {
            note(pool.retention_abort());
        } else {
            note(pool.retention_finish());
        }
    }
    if !pool.snapshot().scope_open {
        note(pool.trim());
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(report) = progress {
        report(total, total);
    }

    if let Some((line, source)) = failure {
        return Err(ReplayError::Pool {
            file: trace.name.clone(),
            line,
            source,
        });
    }
    if let Some(source) = release_error {
        return Err(ReplayError::Release {
            file: trace.name.clone(),
            source,
        });
    }
    let end = pool.snapshot();
    Ok(ReplayReport {
        allocations,
        peak_physical_bytes: end.peak_physical_bytes,
        final_physical_bytes: end.physical_bytes,
        mappings_created: end
            .mappings_created
            .saturating_sub(start_snapshot.mappings_created),
        reuse_hits: end.reuse_hits.saturating_sub(start_snapshot.reuse_hits),
        out_of_memory_at_line: oom_line,
        live_at_end,
        seconds,
    })
}
