//! Section 5: every shipped trace replayed through the pool (best-fit and segment
//! mode) and through the stream-ordered pool.

use std::time::Instant;

use serde::Serialize;

use flare_package::trace::{self, Event, Trace};
use flare_package::{Pool, ReusePolicy};
use flare_tools::cuda_baseline::StreamOrderedPool;

use crate::harness::ratio;
use crate::{Bench, BoxResult};

#[derive(Debug, Serialize)]
pub(crate) struct FlareReplay {
    /// The reuse policy: `best-fit` or `segments`.
    pub(crate) policy: &'static str,
    pub(crate) seconds: f64,
    pub(crate) events_per_second: f64,
    pub(crate) peak_physical_bytes: u64,
    /// Peak physical bytes / the trace's lower bound.
    pub(crate) ratio_peak_vs_lower_bound: Option<f64>,
    pub(crate) final_physical_bytes: u64,
    /// Physical handles created (`cuMemCreate`): one per mapping with whole
    /// mappings, one per growth of a segment in segment mode.
    pub(crate) mappings_created: u64,
    /// Segments (reserved ranges) held at the end of the replay (0 with whole
    /// mappings).
    pub(crate) segments: u64,
    pub(crate) reuse_hits: u64,
    pub(crate) out_of_memory_at_line: Option<usize>,
    pub(crate) mem_free_before: Option<u64>,
    pub(crate) mem_free_after: Option<u64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct StreamReplay {
    pub(crate) seconds: f64,
    pub(crate) events_per_second: f64,
    pub(crate) reserved_high_bytes: u64,
    pub(crate) used_high_bytes: u64,
    pub(crate) mem_free_before: Option<u64>,
    /// After the replay, before the pool is destroyed (it keeps what it reserved).
    pub(crate) mem_free_after: Option<u64>,
    pub(crate) error: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Replay {
    pub(crate) trace: String,
    pub(crate) events: usize,
    pub(crate) allocations: usize,
    /// Peak of the bytes live at once, each allocation rounded up to the
    /// granularity (`Trace::lower_bound_bytes`, as `flare-replay` reports it).
    pub(crate) lower_bound_bytes: u64,
    /// Best-fit, whole mappings (the default policy).
    pub(crate) flare: FlareReplay,
    /// Segment mode.
    pub(crate) flare_segments: FlareReplay,
    pub(crate) stream_ordered: Option<StreamReplay>,
    /// ours (best-fit) / stream-ordered pool: time, peak physical / reserved high.
    pub(crate) ratio_seconds: Option<f64>,
    pub(crate) ratio_peak_bytes: Option<f64>,
    /// ours (segments) / stream-ordered pool: time, peak physical / reserved high.
    pub(crate) ratio_seconds_segments: Option<f64>,
    pub(crate) ratio_peak_bytes_segments: Option<f64>,
}

impl Bench {
    /// Replays `t` on a fresh pool of the benchmark's backend with `policy`.
    fn flare_replay(&self, t: &Trace, policy: ReusePolicy, lower: u64) -> BoxResult<FlareReplay> {
        let pool = Pool::new(self.config().with_policy(policy))?;
        let before = self.mem_info(Some(&pool));
        let r = trace::replay(&pool, t, None)?;
        let after = self.mem_info(Some(&pool));
        let segments = pool.snapshot().segment_count;
        drop(pool);
        Ok(FlareReplay {
            policy: policy.name(),
            seconds: r.seconds,
            events_per_second: t.len() as f64 / r.seconds.max(1e-12),
            peak_physical_bytes: r.peak_physical_bytes,
            ratio_peak_vs_lower_bound: ratio(r.peak_physical_bytes as f64, lower as f64),
            final_physical_bytes: r.final_physical_bytes,
            mappings_created: r.mappings_created,
            segments,
            reuse_hits: r.reuse_hits,
            out_of_memory_at_line: r.out_of_memory_at_line,
            mem_free_before: before.map(|m| m.free),
            mem_free_after: after.map(|m| m.free),
        })
    }

    pub(crate) fn replays(&self) -> BoxResult<Vec<Replay>> {
        let mut out = Vec::new();
        let granularity = Pool::new(self.config())?.granularity();
        for file in &self.trace_files {
            let t = trace::parse(file)?;
            eprintln!("replay {} ({} events)", t.name(), t.len());
            let lower = t.lower_bound_bytes(granularity);
            let flare = self.flare_replay(&t, ReusePolicy::BestFit, lower)?;
            let flare_segments = self.flare_replay(&t, ReusePolicy::Segments, lower)?;
            let stream_ordered = match self.cuda {
                Some(_) => Some(self.stream_replay(&t)?),
                None => None,
            };
            let so = stream_ordered.as_ref().filter(|s| s.error.is_none());
            let vs_time = |f: &FlareReplay| so.and_then(|s| ratio(f.seconds, s.seconds));
            let vs_peak = |f: &FlareReplay| {
                so.and_then(|s| ratio(f.peak_physical_bytes as f64, s.reserved_high_bytes as f64))
            };
            out.push(Replay {
                trace: t.name().to_string(),
                events: t.len(),
                allocations: t.allocations(),
                lower_bound_bytes: lower,
                ratio_seconds: vs_time(&flare),
                ratio_peak_bytes: vs_peak(&flare),
                ratio_seconds_segments: vs_time(&flare_segments),
                ratio_peak_bytes_segments: vs_peak(&flare_segments),
                flare,
                flare_segments,
                stream_ordered,
            });
        }
        Ok(out)
    }

    fn stream_replay(&self, t: &Trace) -> BoxResult<StreamReplay> {
        let before = self.mem_info(None);
        let sop = StreamOrderedPool::new(self.args.device)?;
        let mut ptrs: Vec<Option<u64>> = vec![None; t.id_count()];
        let mut error = None;
        let started = Instant::now();
        {
            let cur = sop.make_current()?;
            for &event in t.events() {
                let r = match event {
                    // The baseline has no tags: a tagged line is an allocation (and
                    // a recorded stream-ordered one, on the baseline's stream).
                    Event::Alloc { id, bytes }
                    | Event::AllocTagged { id, bytes, .. }
                    | Event::AllocAsync { id, bytes, .. } => cur.pool_alloc(&sop, bytes).map(|p| {
                        if let Some(slot) = ptrs.get_mut(id as usize) {
                            *slot = Some(p);
                        }
                    }),
                    Event::Free { id } | Event::FreeAsync { id, .. } => {
                        match ptrs.get_mut(id as usize).and_then(Option::take) {
                            Some(p) => cur.pool_free(&sop, p),
                            None => Ok(()),
                        }
                    }
                    Event::Trim => sop.trim_to(0),
                    Event::Begin
                    | Event::Step
                    | Event::Finish
                    | Event::Abort
                    | Event::RecordStream { .. }
                    | Event::Forget { .. }
                    | Event::Done { .. }
                    | Event::Oom { .. }
                    | Event::AllocFailed { .. }
                    | Event::Sleep { .. }
                    | Event::Wake { .. } => Ok(()),
                };
                if let Err(e) = r {
                    error = Some(e.to_string());
                    break;
                }
            }
            for p in ptrs.iter_mut().filter_map(Option::take) {
                cur.pool_free(&sop, p)?;
            }
            sop.synchronize()?;
        }
        let seconds = started.elapsed().as_secs_f64();
        let after = self.mem_info(None);
        Ok(StreamReplay {
            seconds,
            events_per_second: t.len() as f64 / seconds.max(1e-12),
            reserved_high_bytes: sop.reserved_high_bytes()?,
            used_high_bytes: sop.used_high_bytes()?,
            mem_free_before: before.map(|m| m.free),
            mem_free_after: after.map(|m| m.free),
            error,
        })
    }
}
