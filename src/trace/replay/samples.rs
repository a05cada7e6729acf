//! Physical memory over a replay's events, for plots (`flare-replay --plot`): the
//! pool's physical bytes read after every event and kept as the largest value of
//! each run of events, so a plot of a few thousand points still shows every peak.

use crate::pool::Pool;

/// One point of [`PhysicalSamples`]: the events `[first_event, end_event)` (0-based
/// indices into [`Trace::events`](crate::trace::Trace::events)) and the most physical
/// memory the pool held after any of them, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhysicalSample {
    /// Index of the first event this point covers.
    pub first_event: u64,
    /// One past the index of the last event this point covers.
    pub end_event: u64,
    /// The most physical memory the pool held after any of these events (bytes:
    /// [`Snapshot::physical_bytes`](crate::Snapshot::physical_bytes)).
    pub max_physical_bytes: u64,
}

/// The pool's physical bytes over a replay's events, in runs of
/// [`events_per_point`](Self::events_per_point) events (the last run may be
/// shorter). Filled by [`replay_sampled`](super::replay_sampled) and
/// [`replay_as_recorded_sampled`](super::replay_as_recorded_sampled); a replay that
/// stops early (out of memory) ends its points at the event that stopped it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhysicalSamples {
    events_per_point: u64,
    points: Vec<PhysicalSample>,
    /// The open run: its first event and its largest value so far.
    open: Option<(u64, u64)>,
}

impl PhysicalSamples {
    /// Samples for a trace of `events` events, in at most `max_points` points (at
    /// least one event a point; `max_points` 0 is taken as 1).
    pub fn new(events: u64, max_points: u64) -> Self {
        let max_points = max_points.max(1);
        Self {
            events_per_point: events.div_ceil(max_points).max(1),
            points: Vec::new(),
            open: None,
        }
    }

    /// How many events each point covers (the last point may cover fewer).
    pub fn events_per_point(&self) -> u64 {
        self.events_per_point
    }

    /// The points, in event order.
    pub fn points(&self) -> &[PhysicalSample] {
        &self.points
    }

    /// The largest value of every point: the replay's peak physical bytes as the
    /// samples saw it (0 when there is none).
    pub fn max_physical_bytes(&self) -> u64 {
        self.points
            .iter()
            .map(|p| p.max_physical_bytes)
            .max()
            .unwrap_or(0)
    }

    /// Records `physical_bytes`, read after event `event` (0-based, in order).
    pub(super) fn after_event(&mut self, event: u64, physical_bytes: u64) {
        let (first, max) = self.open.unwrap_or((event, 0));
        let max = max.max(physical_bytes);
        if (event + 1 - first) >= self.events_per_point {
            self.points.push(PhysicalSample {
                first_event: first,
                end_event: event + 1,
                max_physical_bytes: max,
            });
            self.open = None;
        } else {
            self.open = Some((first, max));
        }
    }

    /// Closes the open run after its last event, `end_event - 1`.
    pub(super) fn close(&mut self, end_event: u64) {
        if let Some((first, max)) = self.open.take() {
            self.points.push(PhysicalSample {
                first_event: first,
                end_event: end_event.max(first + 1),
                max_physical_bytes: max,
            });
        }
    }

    /// Reads the pool's physical bytes after event `event`.
    pub(super) fn read(&mut self, event: u64, pool: &Pool) {
        self.after_event(event, pool.snapshot().physical_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_keep_the_largest_value_of_their_events() {
        // 10 events in at most 4 points: 3 events a point (ceil(10 / 4)), 4 points.
        let mut s = PhysicalSamples::new(10, 4);
        assert_eq!(s.events_per_point(), 3);
        let values = [5, 9, 1, 0, 0, 7, 2, 2, 2, 4];
        for (i, v) in values.iter().enumerate() {
            s.after_event(i as u64, *v);
        }
        s.close(10);
        let got: Vec<(u64, u64, u64)> = s
            .points()
            .iter()
            .map(|p| (p.first_event, p.end_event, p.max_physical_bytes))
            .collect();
        assert_eq!(got, vec![(0, 3, 9), (3, 6, 7), (6, 9, 2), (9, 10, 4)]);
        assert_eq!(s.max_physical_bytes(), 9);
    }

    #[test]
    fn a_replay_that_stops_early_ends_at_its_last_event() {
        let mut s = PhysicalSamples::new(100, 10);
        for i in 0..15 {
            s.after_event(i, i);
        }
        s.close(15);
        let last = s.points().last().copied();
        assert_eq!(
            last,
            Some(PhysicalSample {
                first_event: 10,
                end_event: 15,
                max_physical_bytes: 14
            })
        );
        assert_eq!(s.points().len(), 2);
    }

    #[test]
    fn zero_points_is_one_point() {
        let s = PhysicalSamples::new(7, 0);
        assert_eq!(s.events_per_point(), 7);
        assert!(s.points().is_empty());
        assert_eq!(s.max_physical_bytes(), 0);
    }
}
