//! What is live through the caches, read with the books at one moment: for the
//! growth report (`growth_report.rs`).

use super::Caches;
use crate::pool::books::{MappingState, State};
use crate::pool::steps::Stamp;
use crate::pool::table::{self, LIVE};
use crate::sync::atomic::Ordering;
use crate::sync::{lock, Mutex};

impl Caches {
    /// Runs `f` on the books with every cache's mutex and then the books' held (so
    /// that nothing is handed out or freed meanwhile), and with the allocations live
    /// through the caches: each one's requested bytes and stamp (all tag 0's: caches
    /// serve only the untagged synchronous API). Without caches, only the books'
    /// lock is taken.
    pub(in crate::pool) fn with_live<R>(
        &self,
        state: &Mutex<State>,
        f: impl FnOnce(&State, &[(u64, Stamp)]) -> R,
    ) -> R {
        if !self.enabled {
            return f(&lock(state), &[]);
        }
        let (_registry, _caches) = self.lock_all();
        let st = lock(state);
        let mut live = Vec::new();
        if st.tier_slots > 0 {
            for m in st.slots.iter().flatten() {
                if m.state != MappingState::Cached {
                    continue;
                }
                let Some(entry) = self.table.get(m.ptr()) else {
                    continue;
                };
                if table::state(entry.word.load(Ordering::Acquire)) != LIVE {
                    continue;
                }
                live.push((
                    entry.requested.load(Ordering::Relaxed),
                    Stamp {
                        seq: entry.seq.load(Ordering::Relaxed),
                        steps: entry.steps.load(Ordering::Relaxed),
                    },
                ));
            }
        }
        f(&st, &live)
    }
}
