//! What the fault-injection property test knows independently of the pool: the live
//! allocations, tags, scope, streams and capture, the injections aimed at absolute
//! call numbers, and the driver failures the pool counted.

use crate::common;

use crate::random_failures::operations::{Op, Setup};
use common::check_with_devices;
use flare_package::driver::sim::SimStreamCall;
use flare_package::{CuResult, DevicePtr, DriverCall, Pool, ReusePolicy, SimDriver, Stream};
use std::sync::Arc;

/// The calls the pool counts in its snapshot.
const COUNTED: [DriverCall; 8] = DriverCall::MEMORY_CALLS;

fn counted(s: &flare_package::Snapshot, call: DriverCall) -> u64 {
    match call {
        DriverCall::Create => s.create_failures,
        DriverCall::Reserve => s.reserve_failures,
        DriverCall::Map => s.map_failures,
        DriverCall::SetAccess => s.access_failures,
        DriverCall::Unmap => s.unmap_failures,
        DriverCall::Release => s.release_failures,
        DriverCall::FreeReservation => s.reservation_free_failures,
        DriverCall::Synchronize => s.sync_failures,
        _ => 0,
    }
}

/// What the test knows independently of the pool.
pub(crate) struct Model {
    pub(crate) sim: Arc<SimDriver>,
    pub(crate) setup: Setup,
    pub(crate) granularity: u64,
    /// Live allocations: pointer, bytes asked, the stream (index) it was made on.
    pub(crate) live: Vec<(DevicePtr, u64, Option<usize>)>,
    /// Live tagged allocations: pointer, bytes asked, tag (1 or 2).
    pub(crate) tagged: Vec<(DevicePtr, u64, u32)>,
    /// The stream each of `tagged` was allocated on (`None`: synchronous).
    pub(crate) tagged_on: Vec<Option<usize>>,
    /// Whether tags 1 and 2 (indices 1, 2) sleep.
    pub(crate) asleep: [bool; 3],
    pub(crate) scope: bool,
    /// The three created streams, then the legacy stream.
    pub(crate) streams: [u64; 4],
    /// The stream (index) being captured.
    pub(crate) capture: Option<usize>,
    /// A stream-ordered call was made: memory may then wait idle on fences, or be
    /// kept for a captured graph, at release points.
    pub(crate) used_streams: bool,
    /// Stream-call injections: (call, absolute call number that fails).
    pub(crate) stream_targets: Vec<(SimStreamCall, u64)>,
    /// Successful allocations and frees, scopes closed by finish and by abort:
    /// counted here from the calls' results, independently of the pool's counters.
    pub(crate) allocations: u64,
    pub(crate) frees: u64,
    pub(crate) finished: u64,
    pub(crate) aborted: u64,
    /// Injections: (call, absolute call number that fails). The simulated driver
    /// moves an injection aimed at an already targeted call to the next one; so do we.
    pub(crate) targets: Vec<(DriverCall, u64)>,
}

impl Model {
    pub(crate) fn inject(&mut self, call: DriverCall, nth: u32, code: CuResult) {
        let mut at = self.sim.call_count(call) + u64::from(nth);
        while self.targets.contains(&(call, at)) {
            at += 1;
        }
        self.targets.push((call, at));
        self.sim.inject_failure(call, nth, code);
    }

    /// Injected failures of `call` that have fired so far.
    pub(crate) fn fired(&self, call: DriverCall) -> u64 {
        let n = self.sim.call_count(call);
        self.targets
            .iter()
            .filter(|&&(c, at)| c == call && at <= n)
            .count() as u64
    }

    pub(crate) fn inject_stream(&mut self, call: SimStreamCall, nth: u32, code: CuResult) {
        let mut at = self.sim.stream_call_count(call) + u64::from(nth);
        while self.stream_targets.contains(&(call, at)) {
            at += 1;
        }
        self.stream_targets.push((call, at));
        self.sim.inject_stream_failure(call, nth, code);
    }

    pub(crate) fn stream_fired(&self) -> u64 {
        self.stream_targets
            .iter()
            .filter(|&&(c, at)| at <= self.sim.stream_call_count(c))
            .count() as u64
    }

    pub(crate) fn stream(&self, i: usize) -> Stream {
        Stream(self.streams[i])
    }

    /// Injected failures of every kind that have fired so far.
    pub(crate) fn fired_all(&self) -> u64 {
        DriverCall::ALL.iter().map(|&c| self.fired(c)).sum()
    }

    pub(crate) fn live_count(&self) -> u64 {
        (self.live.len() + self.tagged.len()) as u64
    }

    pub(crate) fn fired_total(&self) -> u64 {
        COUNTED.iter().map(|&c| self.fired(c)).sum()
    }

    pub(crate) fn rounded(&self, bytes: u64) -> u64 {
        bytes.div_ceil(self.granularity) * self.granularity
    }

    /// Whether a request of `bytes` is a block of a segment (segment mode, not above
    /// the whole-mapping threshold).
    pub(crate) fn is_block(&self, bytes: u64) -> bool {
        self.setup.policy == ReusePolicy::Segments && bytes <= self.setup.whole_threshold
    }

    /// The alignment of the pointer handed out for `bytes`: the granularity for a
    /// whole mapping, 512 bytes for a block.
    pub(crate) fn align(&self, bytes: u64) -> u64 {
        if self.is_block(bytes) {
            512
        } else {
            self.granularity
        }
    }

    /// Every check that runs after every step.
    pub(crate) fn check(&self, pool: &Pool, step: &Op) {
        let devices = if self.setup.peer { 2 } else { 1 };
        let s = check_with_devices(pool, devices);
        assert_eq!(s.scope_open, self.scope, "{step:?}: scope state");
        assert_eq!(s.live_count, self.live_count(), "{step:?}: live count");
        assert_eq!(
            s.live_requested_bytes,
            self.live.iter().map(|&(_, b, _)| b).sum::<u64>()
                + self.tagged.iter().map(|&(_, b, _)| b).sum::<u64>(),
            "{step:?}: live requested bytes"
        );
        assert_eq!(
            s.tags_sleeping,
            self.asleep.iter().filter(|&&a| a).count() as u64,
            "{step:?}: tags asleep"
        );
        // Tag 0: its census says whether it sleeps and counts the untagged
        // allocations (what a sleep of it left physical is checked at the sleep).
        let c0 = pool.tag_census(0);
        assert_eq!(c0.sleeping, self.asleep[0], "{step:?}: tag 0");
        assert_eq!(
            c0.live_count,
            self.live.len() as u64,
            "{step:?}: tag 0 live"
        );
        for t in 1..3u32 {
            let c = pool.tag_census(t);
            assert_eq!(c.sleeping, self.asleep[t as usize], "{step:?}: tag {t}");
            let mine: Vec<_> = self.tagged.iter().filter(|x| x.2 == t).collect();
            assert_eq!(c.live_count, mine.len() as u64, "{step:?}: tag {t} live");
            // Each holds a whole mapping of at least its rounded size (a best fit or
            // a forced reuse may hand out a larger one), or in segment mode a block
            // of its size rounded to 512 bytes.
            let least: u64 = mine
                .iter()
                .map(|x| {
                    if self.is_block(x.1) {
                        x.1.div_ceil(512) * 512
                    } else {
                        self.rounded(x.1)
                    }
                })
                .sum();
            assert!(
                c.live_bytes >= least
                    && c.live_bytes
                        <= s.live_mapped_bytes
                            + s.block_live_bytes
                            + s.sleeping_bytes
                            + s.sleeping_held_bytes,
                "{step:?}: tag {t} live bytes {}",
                c.live_bytes
            );
            if self.asleep[t as usize] {
                assert_eq!(c.idle_bytes, 0, "{step:?}: a sleeping tag's idle");
            }
        }
        // Pinned host memory: the sleeping tags' copies and the buffer a wake kept
        // for the next offload, nothing else (a failed sleep or wake frees what it
        // pinned).
        assert_eq!(
            self.sim.host_bytes(),
            s.offloaded_bytes + s.host_kept_bytes,
            "{step:?}: host memory"
        );
        if self.asleep.iter().all(|&a| !a) {
            assert_eq!(
                s.offloaded_bytes, 0,
                "{step:?}: offloaded with no tag asleep"
            );
        }
        assert_eq!(
            self.sim.contract_faults(),
            0,
            "{step:?}: contract faults {:?}",
            self.sim.faults()
        );
        assert!(
            s.stream_call_failures <= self.stream_fired(),
            "{step:?}: {} stream call failures counted, {} injected and fired",
            s.stream_call_failures,
            self.stream_fired()
        );
        // Every failure the pool counted is one that was injected, and every
        // injected failure that fired was counted. Only a real out-of-memory (the
        // small device) may add create failures nobody injected.
        for call in COUNTED {
            let fired = self.fired(call);
            let seen = counted(&s, call);
            if call == DriverCall::Create && self.setup.small_device {
                assert!(seen >= fired, "{step:?}: {call} failures {seen} < {fired}");
            } else {
                assert_eq!(
                    seen, fired,
                    "{step:?}: {call} failures counted vs injected and fired\n{s:#?}"
                );
            }
        }
    }
}
