//! The replay of a parsed [`Trace`] on a [`Pool`]: every event in order, under one
//! implicit retention scope when the trace has no scope lines, with the pool's
//! figures (peak physical bytes, mappings, reuse hits, the line where the device
//! ran out of memory) reported in a [`ReplayReport`].

use std::time::Instant;

use super::{Event, Trace};
use crate::driver::{CuResult, DevicePtr, DriverCall};
use crate::error::Error;
use crate::pool::Pool;

mod report;
mod samples;
mod streams;

pub use report::{ReplayError, ReplayReport, TagReplay};
pub use samples::{PhysicalSample, PhysicalSamples};
use streams::SimStreams;

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
    replay_inner(pool, trace, progress, None, None, None, false)
}

/// Replays a recorded trace (`docs/trace-format.md`, "Recorded traces") as the
/// recorded pool ran it: as [`replay`], but with no implicit retention scope (a
/// recorded pool opened none; its `trim` lines trim). Give it a pool made from
/// [`RecordedConfig::pool_config`](super::RecordedConfig::pool_config): its peak
/// physical bytes are then the recorded pool's.
///
/// Errors: as [`replay`].
pub fn replay_as_recorded(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<ReplayReport, ReplayError> {
    replay_inner(pool, trace, progress, None, None, None, true)
}

/// [`replay_as_recorded`], with the pool's physical bytes read after every event
/// into `samples` (for a plot of memory over the trace: `flare-replay --plot`).
///
/// Errors: as [`replay`].
pub fn replay_as_recorded_sampled(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
    samples: &mut PhysicalSamples,
) -> Result<ReplayReport, ReplayError> {
    replay_inner(pool, trace, progress, None, Some(samples), None, true)
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
    replay_observed(pool, trace, progress, None, None)
}

/// [`replay_census`], calling `at_end` with the pool when the trace's events are
/// done (or stopped), before the census and before the replay frees what is live
/// (`flare-replay --viz` writes its memory_viz snapshot there).
///
/// Errors: as [`replay`].
pub fn replay_census_then(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
    at_end: &mut dyn FnMut(&Pool),
) -> Result<(ReplayReport, Vec<TagReplay>), ReplayError> {
    replay_observed(pool, trace, progress, None, Some(at_end))
}

/// [`replay_census`], with the pool's physical bytes read after every event into
/// `samples` (for a plot of memory over the trace: `flare-replay --plot`). The
/// replay's own time ([`ReplayReport::seconds`]) then includes the reads.
///
/// Errors: as [`replay`].
pub fn replay_sampled(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
    samples: &mut PhysicalSamples,
) -> Result<(ReplayReport, Vec<TagReplay>), ReplayError> {
    replay_observed(pool, trace, progress, Some(samples), None)
}

/// [`replay_census`] with both observers, each optional: the pool's physical bytes
/// read after every event into `samples` ([`replay_sampled`]) and `at_end` called
/// with the pool when the trace's events are done ([`replay_census_then`]).
///
/// Errors: as [`replay`].
pub fn replay_observed(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
    samples: Option<&mut PhysicalSamples>,
    at_end: Option<&mut dyn FnMut(&Pool)>,
) -> Result<(ReplayReport, Vec<TagReplay>), ReplayError> {
    let mut tags = Vec::new();
    let report = replay_inner(
        pool,
        trace,
        progress,
        Some(&mut tags),
        samples,
        at_end,
        false,
    )?;
    Ok((report, tags))
}

fn replay_inner(
    pool: &Pool,
    trace: &Trace,
    progress: Option<&dyn Fn(u64, u64)>,
    tags: Option<&mut Vec<TagReplay>>,
    mut samples: Option<&mut PhysicalSamples>,
    at_end: Option<&mut dyn FnMut(&Pool)>,
    as_recorded: bool,
) -> Result<ReplayReport, ReplayError> {
    let start_snapshot = pool.snapshot();
    let implicit_scope = !trace.has_scope_events() && !trace.has_sleep() && !as_recorded;
    let mut streams =
        if trace.has_streams() {
            match pool.sim_driver() {
                Some(sim) => Some(SimStreams::new(sim, trace, as_recorded)),
                None => return Err(ReplayError::Pool {
                    file: trace.name.clone(),
                    line: 0,
                    source: Error::NotSupported(
                        "a trace with stream-ordered lines replays on the simulated driver only",
                    ),
                }),
            }
        } else {
            None
        };
    let mut requested: Vec<u64> = if streams.is_some() {
        vec![0; trace.id_count()]
    } else {
        Vec::new()
    };
    let total = trace.len() as u64;
    // The pointer table is the replay's bookkeeping, not the pool's work: made before
    // the clock starts (a new user saw the first replay of a large trace timed 3x
    // slower than a second one, from this allocation).
    let mut ptrs: Vec<Option<u64>> = vec![None; trace.id_count()];
    // The tag of each id's allocation, and the tags asleep: what a tag still asleep
    // at the end holds is freed after waking it.
    let mut tag_of: Vec<u32> = if trace.has_sleep() {
        vec![0; trace.id_count()]
    } else {
        Vec::new()
    };
    let mut asleep: Vec<u32> = Vec::new();
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
    // `x` lines whose request the replay served.
    let mut failed_served: u64 = 0;
    let mut failure: Option<(usize, Error)> = None;
    // Whether an `oom` line injected failures for the next allocation: what that
    // allocation did not take is dropped after it, never left for a later call.
    let mut injected = false;
    // Events done (for the samples' last point).
    let mut processed: u64 = 0;

    for (i, (&event, &line)) in trace.events.iter().zip(&trace.lines).enumerate() {
        if let Some(report) = progress {
            if i % PROGRESS_EVERY == 0 && i != 0 {
                report(i as u64, total);
            }
        }
        let result = match event {
            Event::Alloc { id, bytes }
            | Event::AllocTagged { id, bytes, .. }
            | Event::AllocAsync { id, bytes, .. } => {
                if let Some(r) = requested.get_mut(id as usize) {
                    *r = bytes;
                }
                if let Some(ss) = streams.as_mut() {
                    ss.recorded_clear(id);
                }
                if let (Some(t), Event::AllocTagged { tag, .. } | Event::AllocAsync { tag, .. }) =
                    (tag_of.get_mut(id as usize), event)
                {
                    *t = tag;
                }
                match ptrs.get_mut(id as usize) {
                    Some(slot @ None) => {
                        match allocate_settled(pool, event, bytes, streams.as_mut(), &mut injected)
                        {
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
                        }
                    }
                    // Unreachable for a parsed trace: the parser rejects both.
                    _ => Err(Error::InvalidArgument(format!(
                        "allocation id index {id} is live or out of range"
                    ))),
                }
            }
            Event::Free { id } => match ptrs.get_mut(id as usize).and_then(Option::take) {
                Some(ptr) => {
                    live -= 1;
                    pool.free_raw(ptr)
                }
                None => Err(Error::InvalidArgument(format!(
                    "allocation id index {id} is not live"
                ))),
            },
            Event::FreeAsync { id, stream } => {
                match (
                    ptrs.get_mut(id as usize).and_then(Option::take),
                    streams.as_mut(),
                ) {
                    (Some(ptr), Some(ss)) => {
                        live -= 1;
                        let bytes = requested.get(id as usize).copied().unwrap_or(0);
                        let s = ss.free_marks(id, stream, ptr, bytes);
                        pool.free_async_raw(ptr, s)
                    }
                    _ => Err(Error::InvalidArgument(format!(
                        "allocation id index {id} is not live"
                    ))),
                }
            }
            Event::RecordStream { id, stream } => {
                match (ptrs.get(id as usize).copied().flatten(), streams.as_mut()) {
                    (Some(ptr), Some(ss)) => {
                        let s = ss.stream(stream);
                        ss.recorded_push(id, stream);
                        pool.record_stream(ptr, s)
                    }
                    _ => Err(Error::InvalidArgument(format!(
                        "allocation id index {id} is not live"
                    ))),
                }
            }
            Event::Done { stream, mark } => {
                if let Some(ss) = streams.as_mut() {
                    ss.done(stream, mark);
                }
                Ok(())
            }
            Event::Forget { stream } => match streams.as_mut() {
                Some(ss) => pool.forget_stream(ss.forget(stream)),
                None => Ok(()),
            },
            Event::AllocFailed { bytes, tag, stream } => {
                // The same request; refused as recorded, it allocates nothing. Served
                // (a replay under other settings, or one that diverged), it is given
                // back at once: the engine never had it.
                let as_event = match stream {
                    Some(stream) => Event::AllocAsync {
                        id: 0,
                        bytes,
                        tag,
                        stream,
                    },
                    None if tag != 0 => Event::AllocTagged { id: 0, bytes, tag },
                    None => Event::Alloc { id: 0, bytes },
                };
                match allocate_settled(pool, as_event, bytes, streams.as_mut(), &mut injected) {
                    Ok(ptr) => {
                        failed_served += 1;
                        pool.free_raw(ptr)
                    }
                    Err(Error::OutOfMemory { .. } | Error::RequestTooLarge { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Event::Sleep { tag, offload } => pool
                .sleep(
                    tag,
                    if offload {
                        crate::SleepMode::Offload
                    } else {
                        crate::SleepMode::Discard
                    },
                )
                .map(|()| asleep.push(tag)),
            Event::Wake { tag } => pool.wake(tag).map(|()| asleep.retain(|&t| t != tag)),
            Event::Oom { count } => {
                if let Some(sim) = pool.sim_driver() {
                    for _ in 0..count {
                        sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
                    }
                    injected = true;
                }
                Ok(())
            }
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
            Event::Step => {
                pool.mark_step();
                Ok(())
            }
        };
        // After a call (not after `done` and `oom`: the recorded pool wrote those
        // during the call that follows, before its own fences of that call).
        if let (Some(ss), false) = (
            streams.as_mut(),
            matches!(event, Event::Done { .. } | Event::Oom { .. }),
        ) {
            ss.keep_busy();
        }
        if let Err(e) = result {
            failure = Some((line, e));
            break;
        }
        if let Some(s) = samples.as_deref_mut() {
            s.read(i as u64, pool);
        }
        processed = i as u64 + 1;
    }
    if let Some(s) = samples {
        s.close(processed);
    }
    if let Some(f) = at_end {
        f(pool);
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
    let tag = |id: usize| tag_of.get(id).copied().unwrap_or(0);
    for (id, slot) in ptrs.iter_mut().enumerate() {
        if asleep.contains(&tag(id)) {
            continue;
        }
        if let Some(ptr) = slot.take() {
            note(pool.free_raw(ptr));
        }
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
    // A tag still asleep (a recording of a pool destroyed while it slept): its
    // allocations cannot be freed asleep (`Pool::free_raw` refuses them). With
    // everything else released, the tag is woken (it maps no more than it held when
    // it went to sleep, so the peak stays the recorded one) and they are freed.
    asleep.sort_unstable();
    for &t in &asleep {
        note(pool.wake(t));
        for (id, slot) in ptrs.iter_mut().enumerate() {
            if tag(id) == t {
                if let Some(ptr) = slot.take() {
                    note(pool.free_raw(ptr));
                }
            }
        }
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
        failed_requests_served: failed_served,
    })
}

/// [`allocate`]; then, when an `oom` line injected failures for this allocation
/// (`injected`), the injections it did not take are dropped: a replay that went
/// another way (its allocation served from idle memory) would otherwise fail a later
/// call with them.
fn allocate_settled(
    pool: &Pool,
    event: Event,
    bytes: u64,
    streams: Option<&mut SimStreams>,
    injected: &mut bool,
) -> crate::Result<DevicePtr> {
    let r = allocate(pool, event, bytes, streams);
    if std::mem::take(injected) {
        if let Some(sim) = pool.sim_driver() {
            sim.clear_failures();
        }
    }
    r
}

/// The pool call of an allocation event (`a` line).
fn allocate(
    pool: &Pool,
    event: Event,
    bytes: u64,
    streams: Option<&mut SimStreams>,
) -> crate::Result<DevicePtr> {
    match (event, streams) {
        (Event::AllocTagged { tag, .. }, _) => pool.allocate_tagged_raw(bytes, None, tag),
        (Event::AllocAsync { tag, stream, .. }, Some(ss)) => {
            let s = ss.stream(stream);
            if tag == 0 {
                pool.allocate_async_raw(bytes, s)
            } else {
                pool.allocate_tagged_raw(bytes, Some(s), tag)
            }
        }
        _ => pool.allocate_raw(bytes),
    }
}
