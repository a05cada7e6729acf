//! The retention scope (begin, finish, abort: a barrier against releases) and trim.

use crate::error::{Error, Result};
use crate::pool::release::Captures;
use crate::pool::{Pool, RetentionScope};
use crate::sync::{lock, wait};

impl Pool {
    /// Opens the pool's retention scope: until it closes, freed mappings are retained
    /// idle (reusable by later allocations) and nothing is released, so no unmap can
    /// race work that is queued or captured. Open it around warmup and graph capture.
    ///
    /// The scope is a barrier: when this returns, no release step that began before
    /// it (a free outside a scope, `finish`, `trim`, the out-of-memory release) is
    /// still running (this call waits for them; their synchronize would break a
    /// capture begun after it, `docs/vmm-semantics.md`), and none starts while the
    /// scope is open.
    ///
    /// Memory freed during a capture belongs to the scope open when the pool first
    /// sees that capture, unless the capture was already open, when the scope began,
    /// on a stream holding memory in the pool (then it belongs to no scope: trim or
    /// destroy releases it).
    ///
    /// Errors: [`Error::ScopeState`] when a scope is already open (scopes do not nest).
    pub fn retention_begin(&self) -> Result<()> {
        self.begin_scope().map(|_| ())
    }

    /// Opens the scope; returns its epoch.
    fn begin_scope(&self) -> Result<u64> {
        let _order = self.record_order();
        let mut st = lock(&self.state);
        if st.counters.scope_open {
            return Err(Error::ScopeState("a retention scope is already open"));
        }
        st.counters.scope_open = true;
        if let Some(rec) = &self.rec {
            rec.line("begin");
        }
        st.scope_epoch += 1;
        self.clock.scope_begun();
        let epoch = st.scope_epoch;
        self.caches.set_open(true);
        // Barrier: no release starts from now on (every release point checks
        // `scope_open` under the lock); wait for those already running.
        while st.releases_running > 0 {
            st = wait(&self.releases_done, st);
        }
        // Captures already open belong to no scope of ours.
        st.pre_scope_captures = self.open_captures(&st);
        Ok(epoch)
    }

    /// Opens a retention scope and returns a guard: [`RetentionScope::finish`]
    /// finishes it; dropping the guard without finishing aborts it.
    ///
    /// Errors: as [`Pool::retention_begin`].
    pub fn retention_scope(&self) -> Result<RetentionScope<'_>> {
        let epoch = self.begin_scope()?;
        Ok(RetentionScope {
            pool: self,
            epoch,
            open: true,
        })
    }

    /// Closes the scope and releases every idle mapping (one synchronize, then
    /// unmap, release, free each). Live allocations stay live.
    ///
    /// Errors: [`Error::ScopeState`] with no scope open; [`Error::Driver`] with the
    /// first release step the driver refused (the scope is closed all the same, and
    /// what was refused is kept and retried at the next release point).
    pub fn retention_finish(&self) -> Result<()> {
        self.close_scope(false, None)
    }

    /// Closes the scope as failed: the same release as [`Pool::retention_finish`],
    /// counted in `scopes_aborted`.
    ///
    /// Errors: as [`Pool::retention_finish`].
    pub fn retention_abort(&self) -> Result<()> {
        self.close_scope(true, None)
    }

    /// Closes the open scope; with `epoch`, only if it is that scope.
    pub(super) fn close_scope(&self, aborted: bool, epoch: Option<u64>) -> Result<()> {
        let _order = self.record_order();
        let epoch = {
            let mut st = lock(&self.state);
            if !st.counters.scope_open {
                return Err(Error::ScopeState("no retention scope is open"));
            }
            if epoch.is_some_and(|e| e != st.scope_epoch) {
                return Err(Error::ScopeState(
                    "this guard's retention scope was already closed; another one is open",
                ));
            }
            st.counters.scope_open = false;
            if let Some(rec) = &self.rec {
                rec.line(if aborted { "abort" } else { "finish" });
            }
            // The caches close here; the release below settles them first.
            self.caches.set_open(self.release_threshold == u64::MAX);
            if aborted {
                st.counters.scopes_aborted += 1;
            } else {
                st.counters.scopes_finished += 1;
            }
            st.pre_scope_captures.clear();
            // Registered before the lock is let go: a scope begun next waits for
            // this release (the barrier).
            st.releases_running += 1;
            st.scope_epoch
        };
        self.release_now(Captures::OfScope(epoch), true, false, true)
    }

    /// Releases every idle (cached) mapping now, and retries pending releases; frees
    /// the pinned host buffer an offload's wake kept for the next offload sleep
    /// ([`Pool::sleep`]). Memory freed on streams is released once its fences complete
    /// (`cuEventSynchronize`, no device synchronize). Memory freed with the
    /// synchronous `free`, held for a capture, or whose stream order is unknown needs
    /// a device synchronize first; it is kept instead while one of the pool's streams
    /// (used since the last trim or finish, or holding memory in the pool) is being
    /// captured. A capture open on a stream the
    /// pool has never seen cannot be known: do not trim while one is open.
    ///
    /// Errors: [`Error::ScopeState`] inside a retention scope (nothing retained is
    /// released there); [`Error::Driver`] with the first step the driver refused.
    pub fn trim(&self) -> Result<()> {
        let _order = self.record_order();
        let r = self.release_idle(true);
        if !matches!(r, Err(Error::ScopeState(_))) {
            // The pinned host buffer a wake kept for the next offload: host memory
            // cached as idle device memory is.
            let spare = lock(&self.state).take_spare_host(|_| true);
            if let Some(h) = spare {
                if let Err(source) = self.driver.host_free(h) {
                    let bytes = h.size;
                    return r.and(Err(Error::Driver { source, bytes }));
                }
            }
        }
        if let Some(rec) = &self.rec {
            // A trim refused inside a scope did nothing; one whose release the
            // driver refused in part released the rest.
            if !matches!(r, Err(Error::ScopeState(_))) {
                rec.line("trim");
            }
        }
        r
    }
}
