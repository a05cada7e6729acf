//! The lines of a memory plot that come from the trace alone: the bytes live over
//! its events, in the same runs of events as the pool's samples.

use flare_package::trace::{Event, Trace};

/// The most bytes live (the sum of the `a` sizes of live allocations) after any
/// event of each run of `events_per_point` events, for the first `events` events of
/// `trace` (a replay that stopped early covers fewer); one value per run, in order,
/// with the run's `[first, end)` events.
///
/// An allocation counts from its `a` line to its `f` line; a request the trace
/// records as refused (`x`) is never live; a sleeping tag's allocations stay live
/// (they are the caller's until freed).
pub fn live_bytes(trace: &Trace, events_per_point: u64, events: u64) -> Vec<(u64, u64, u64)> {
    let events_per_point = events_per_point.max(1);
    let mut size: Vec<u64> = vec![0; trace.id_count()];
    let mut live: u64 = 0;
    let mut out = Vec::new();
    let mut run: Option<(u64, u64)> = None;
    for (i, event) in trace.events().iter().enumerate().take(events as usize) {
        match *event {
            Event::Alloc { id, bytes }
            | Event::AllocTagged { id, bytes, .. }
            | Event::AllocAsync { id, bytes, .. } => {
                if let Some(s) = size.get_mut(id as usize) {
                    *s = bytes;
                }
                live = live.saturating_add(bytes);
            }
            Event::Free { id } | Event::FreeAsync { id, .. } => {
                if let Some(s) = size.get_mut(id as usize) {
                    live = live.saturating_sub(std::mem::take(s));
                }
            }
            _ => {}
        }
        let i = i as u64;
        let (first, max) = run.unwrap_or((i, 0));
        let max = max.max(live);
        if i + 1 - first >= events_per_point {
            out.push((first, i + 1, max));
            run = None;
        } else {
            run = Some((first, max));
        }
    }
    if let Some((first, max)) = run {
        out.push((first, events.min(trace.len() as u64).max(first + 1), max));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_hold_the_most_bytes_live_after_any_of_their_events() {
        let t = flare_package::trace::parse_str(
            "t",
            "# flare-trace v1\na 1 100\na 2 50\nf 1\na 3 10\nf 2\nf 3\na 4 7\n",
        )
        .expect("a valid trace");
        // Live after each event: 100, 150, 50, 60, 10, 0, 7.
        assert_eq!(
            live_bytes(&t, 3, 7),
            vec![(0, 3, 150), (3, 6, 60), (6, 7, 7)]
        );
        assert_eq!(live_bytes(&t, 10, 7), vec![(0, 7, 150)]);
        // A replay that stopped after 2 events.
        assert_eq!(live_bytes(&t, 1, 2), vec![(0, 1, 100), (1, 2, 150)]);
    }
}
