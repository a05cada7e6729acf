//! Steps for the growth report (issue 38, `crate::growth`): the clock every
//! allocation reads when it is made (its sequence number, the step markers and
//! scope begins so far) and the stamp it keeps while live; [`Pool::mark_step`].
//!
//! Cheap on the hot path: the books' path takes its sequence number with one atomic
//! add under the lock it holds anyway; a thread cache takes
//! [`SEQ_SKEW`] numbers at a time into its own state (so threads reusing memory
//! share no counter, `cache/`); both read the step word, written only by markers and
//! scope begins, with one relaxed load.

use std::sync::Arc;

use super::Pool;
use crate::growth::{StepCounts, SEQ_SKEW};
// std's atomics in every build, the loom one included (`sync.rs`): relaxed counters
// that no decision of the pool depends on, so loom need not explore their orderings;
// as its atomics, each would multiply the interleavings of every model.
use std::sync::atomic::{AtomicU64, Ordering};

/// What an allocation was stamped with when it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// Its sequence number (allocations made before it, up to [`SEQ_SKEW`] off
    /// across threads).
    pub(crate) seq: u64,
    /// The step word then ([`StepClock::steps`]).
    pub(crate) steps: u64,
}

impl Stamp {
    /// Step markers written before it.
    pub(crate) fn markers(self) -> u64 {
        self.steps >> 32
    }

    /// Retention scopes begun before it.
    pub(crate) fn scopes(self) -> u64 {
        self.steps & u64::from(u32::MAX)
    }
}

/// An atomic on a cache line of its own: the sequence counter is written by every
/// allocation of the books, the step word read by every allocation.
#[repr(align(128))]
struct Padded(AtomicU64);

/// The clock of a pool (shared by the pools of a PyTorch allocator, so that their
/// reports cut the same steps): sequence numbers, markers and scope begins.
pub(crate) struct StepClock {
    /// The next sequence number.
    seq: Padded,
    /// Markers in the high 32 bits, scope begins in the low 32, each saturating at
    /// `u32::MAX` (4 billion markers, or begins: a server writing one per request
    /// at 10 000 requests a second runs 5 days to reach it).
    steps: Padded,
}

impl StepClock {
    pub(crate) fn new() -> StepClock {
        StepClock {
            seq: Padded(AtomicU64::new(0)),
            steps: Padded(AtomicU64::new(0)),
        }
    }

    /// The stamp of an allocation the books make live now.
    #[inline]
    pub(crate) fn stamp(&self) -> Stamp {
        Stamp {
            seq: self.seq.0.fetch_add(1, Ordering::Relaxed),
            steps: self.steps(),
        }
    }

    /// The first of [`SEQ_SKEW`] sequence numbers reserved for a thread cache.
    pub(crate) fn reserve(&self) -> u64 {
        self.seq.0.fetch_add(SEQ_SKEW, Ordering::Relaxed)
    }

    /// The step word now (markers and scope begins).
    #[inline]
    pub(crate) fn steps(&self) -> u64 {
        self.steps.0.load(Ordering::Relaxed)
    }

    /// A step marker was written.
    pub(crate) fn mark(&self) {
        self.bump(32);
    }

    /// A retention scope was begun.
    pub(crate) fn scope_begun(&self) {
        self.bump(0);
    }

    /// Adds 1 to the 32-bit count at bit `shift` of the step word, saturating.
    fn bump(&self, shift: u32) {
        let one = 1u64 << shift;
        let full = u64::from(u32::MAX) << shift;
        // A failed update means another bump got there first: read and try again.
        let _ = self
            .steps
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                // Not `then_some(w + one)`: its argument is evaluated even when the
                // count is full, and overflows (found by the overflow-checked run).
                if w & full == full {
                    None
                } else {
                    Some(w + one)
                }
            });
    }

    /// The counts now.
    pub(crate) fn counts(&self) -> StepCounts {
        let steps = Stamp {
            seq: 0,
            steps: self.steps(),
        };
        StepCounts {
            allocations: self.seq.0.load(Ordering::Relaxed),
            markers: steps.markers(),
            scopes: steps.scopes(),
        }
    }
}

impl Pool {
    /// Writes a step marker: allocations made from now on belong to the next step of
    /// [`Pool::growth_report`] (`crate::growth`, "Steps"). Call it once per request
    /// or iteration of a serving loop. A recording pool writes a `step` line.
    /// Cheap: one atomic update (and the recording's line); never fails.
    pub fn mark_step(&self) {
        let _order = self.record_order();
        self.clock.mark();
        self.record_step();
    }

    /// Writes a `step` line into this pool's recording (nothing else): a marker
    /// made on a clock this pool shares (a PyTorch allocator's).
    pub(crate) fn record_step(&self) {
        if let Some(rec) = &self.rec {
            let _order = self.record_order();
            rec.line("step");
        }
    }

    /// Makes this pool stamp its allocations from `clock` (a PyTorch allocator's,
    /// shared by its pools). Called right after creation, before any allocation.
    pub(crate) fn use_step_clock(&mut self, clock: Arc<StepClock>) {
        crate::sync::lock(&self.state).clock = Arc::clone(&clock);
        self.clock = clock;
    }
}

#[cfg(all(test, not(flare_loom)))]
mod tests {
    use super::*;

    /// Markers and scope begins count apart, each saturating in its half of the
    /// step word; sequence numbers count one per stamp and `SEQ_SKEW` per
    /// reservation.
    #[test]
    fn the_clock_counts_and_saturates() {
        let c = StepClock::new();
        assert_eq!(c.stamp(), Stamp { seq: 0, steps: 0 });
        c.mark();
        c.mark();
        c.scope_begun();
        let s = c.stamp();
        assert_eq!((s.seq, s.markers(), s.scopes()), (1, 2, 1));
        assert_eq!(c.reserve(), 2);
        assert_eq!(
            c.counts(),
            StepCounts {
                allocations: 2 + SEQ_SKEW,
                markers: 2,
                scopes: 1
            }
        );
        // Saturation: the low half full does not carry into the markers.
        c.steps
            .0
            .store(u64::from(u32::MAX) | (5 << 32), Ordering::Relaxed);
        c.scope_begun();
        assert_eq!(
            (c.counts().markers, c.counts().scopes),
            (5, u64::from(u32::MAX))
        );
        c.steps.0.store(u64::MAX, Ordering::Relaxed);
        c.mark();
        c.scope_begun();
        assert_eq!(c.steps(), u64::MAX);
    }
}
