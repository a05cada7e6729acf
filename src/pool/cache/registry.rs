//! Each thread's cache: registered (or an orphan adopted) on the thread's first call,
//! found through a thread-local, and every cache locked in index order.

use super::{Caches, Inner, Local, ThreadCache, LOCAL, MAX_CACHES};
use crate::pool::books::State;
use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::sync::{lock, Mutex, MutexGuard};
use std::sync::{Arc, OnceLock};

impl Caches {
    /// The cache registered with index `id` (1-based).
    pub(super) fn cache(&self, id: u16) -> Option<&ThreadCache> {
        self.slots
            .get(usize::from(id).checked_sub(1)?)?
            .get()
            .map(|c| &**c)
    }

    /// The registered caches, in index order.
    fn all(&self) -> impl Iterator<Item = &ThreadCache> {
        let used = self.used.load(Ordering::SeqCst).min(self.slots.len());
        self.slots[..used]
            .iter()
            .filter_map(|s| s.get().map(|c| &**c))
    }

    /// Runs `f` on the calling thread's cache (registered or adopted on first use);
    /// `None` when the thread has none (every index is taken, or its thread-locals
    /// are being destroyed).
    pub(super) fn with_local<R>(
        &self,
        state: &Mutex<State>,
        f: impl FnOnce(&ThreadCache) -> R,
    ) -> Option<R> {
        LOCAL
            .try_with(|l| {
                {
                    let held = l.try_borrow().ok()?;
                    // `f` runs with the borrow held (it never touches `LOCAL`): no
                    // reference count is touched on the hot path.
                    if let Some((_, c)) = held.iter().find(|(id, _)| *id == self.id) {
                        return Some(f(&c.0));
                    }
                }
                let c = self.register(state)?;
                let mut held = l.try_borrow_mut().ok()?;
                held.retain(|(_, c)| !c.0.dead.load(Ordering::Relaxed));
                held.push((self.id, Local(Arc::clone(&c))));
                drop(held);
                Some(f(&c))
            })
            .ok()
            .flatten()
    }

    /// A cache for the calling thread: an orphan adopted (what its exited thread
    /// left goes back to the books first: the new thread may need other sizes), or
    /// a new one.
    fn register(&self, state: &Mutex<State>) -> Option<Arc<ThreadCache>> {
        if self.used.load(Ordering::Acquire) == MAX_CACHES
            && self.orphans.load(Ordering::Acquire) == 0
        {
            return None;
        }
        let _registry = lock(&self.registry);
        for c in self.slots.iter().filter_map(OnceLock::get) {
            if c.orphan.load(Ordering::Relaxed)
                && c.orphan
                    .compare_exchange(true, false, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                self.orphans.fetch_sub(1, Ordering::Relaxed);
                let mut g = lock(&c.inner);
                if !g.entries.is_empty() || c.remote.load(Ordering::Relaxed) != 0 {
                    self.drain_into(c, &mut g, &mut lock(state));
                }
                drop(g);
                return Some(Arc::clone(c));
            }
        }
        for (i, s) in self.slots.iter().enumerate() {
            if s.get().is_some() {
                continue;
            }
            let c = Arc::new(ThreadCache {
                id: u16::try_from(i + 1).ok()?,
                inner: Mutex::new(Inner::default()),
                remote: AtomicU64::new(0),
                remote_len: AtomicUsize::new(0),
                remote_bytes: AtomicU64::new(0),
                orphan: AtomicBool::new(false),
                orphans: Arc::clone(&self.orphans),
                dead: AtomicBool::new(false),
            });
            if s.set(Arc::clone(&c)).is_ok() {
                self.used.fetch_max(i + 1, Ordering::SeqCst);
                return Some(c);
            }
        }
        None
    }

    /// Locks the registry, then every cache, in index order.
    pub(super) fn lock_all(
        &self,
    ) -> (
        MutexGuard<'_, ()>,
        Vec<(&ThreadCache, MutexGuard<'_, Inner>)>,
    ) {
        let registry = lock(&self.registry);
        let caches = self.all().map(|c| (c, lock(&c.inner))).collect();
        (registry, caches)
    }

    /// The pool is gone: thread-locals let go of its caches.
    pub(in crate::pool) fn retire(&self) {
        self.set_open(false);
        for c in self.all() {
            c.dead.store(true, Ordering::Relaxed);
            lock(&c.inner).tlb.clear();
        }
    }
}
