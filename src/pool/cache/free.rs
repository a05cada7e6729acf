//! A synchronous free through the caches: into the caller's cache, onto the owner's
//! remote list, or back to the books.

use super::deltas::add;
use super::{to_books, Caches, Freed, Held, Inner, ThreadCache, TIER_KEY};
use crate::driver::DevicePtr;
use crate::pool::books::{MappingState, State, SYNC_FREED};
use crate::pool::history::{free_pair, History};
use crate::pool::segments::home_of;
use crate::pool::table::{Entry, IDLE, LIVE};
use crate::pool::tag_gate::TagGate;
use crate::pool::{table, SEGMENT_SMALL_MAX_BYTES};
use crate::sync::atomic::Ordering;
use crate::sync::{lock, Mutex, MutexGuard};

impl Caches {
    /// A synchronous free through the caches. Memory a cache handed out goes to the
    /// caller's cache, its owner's remote list (another thread's), or (caches closed
    /// or full) back to the books; memory the books handed out goes to the caller's
    /// cache when the caches are open, it fits and it may be held there (a whole
    /// mapping, or a block of at most 1 MiB of the synchronous API's heap, with no
    /// stream recorded). `None`: the caches did not take it (the books free it;
    /// memory of another tag than 0 always); `Some(Err)`: not live, or (live through
    /// a cache) refused while tag 0 is closed (`gate`, read under the cache's mutex or
    /// the books' lock: `tag_gate.rs`); nothing changed then.
    pub(in crate::pool) fn free<'a>(
        &self,
        ptr: DevicePtr,
        id: Option<u64>,
        state: &'a Mutex<State>,
        rec: Option<&crate::pool::record::Recorder>,
        history: Option<&History>,
        gate: &TagGate,
    ) -> Option<crate::Result<Freed<'a>>> {
        if !self.enabled || (self.used.load(Ordering::Relaxed) == 0 && !self.is_open()) {
            return None;
        }
        let on_cache = self.with_local(state, |c| {
            let mut g = lock(&c.inner);
            if gate.tag0_closed() {
                return self.refuse_closed(ptr, id);
            }
            let open = self.is_open();
            let inner = &mut *g;
            let claimed = inner
                .tlb
                .with(&self.table, ptr, false, |entry| {
                    let (e, owner) = claim(entry, ptr, id)?;
                    let requested = entry.requested.load(Ordering::Relaxed);
                    // Recorded before the memory can be handed out again.
                    if let Some(r) = rec {
                        r.free(ptr, None);
                    }
                    if let Some(h) = history {
                        h.write(&free_pair(ptr, requested, 0, 0));
                    }
                    let remote = if open && owner != c.id {
                        self.cache(owner).filter(|o| self.reserve_remote(o, e.size))
                    } else {
                        None
                    };
                    if let Some(o) = remote {
                        push_remote(o, entry, ptr);
                    }
                    Some((e, requested, remote.is_some()))
                })
                .flatten();
            let Some((e, requested, pushed)) = claimed else {
                return if open {
                    self.free_into(c, inner, ptr, id, state, rec)
                } else {
                    None
                };
            };
            inner.d.freed(e.size, requested, e.block);
            if pushed {
                inner.d.held(e.size, true);
                add(&mut inner.d.remote_frees, 1);
                return Some(Ok(Freed::Done));
            }
            if open && self.fits(inner, e.size) {
                inner.d.held(e.size, true);
                inner.push(e);
                return Some(Ok(Freed::Done));
            }
            let mut st = lock(state);
            to_books(&mut st, e.slot);
            Some(Ok(Freed::Books(st, e.slot)))
        });
        match on_cache {
            Some(r) => r,
            // No cache for this thread: the books hold its deltas.
            None => {
                let entry = self.table.get(ptr)?;
                let mut st = lock(state);
                if gate.tag0_closed() {
                    return self.refuse_closed(ptr, id);
                }
                let (e, _) = claim(entry, ptr, id)?;
                let requested = entry.requested.load(Ordering::Relaxed);
                if let Some(r) = rec {
                    r.free(ptr, None);
                }
                if let Some(h) = history {
                    h.write(&free_pair(ptr, requested, 0, 0));
                }
                st.tier_deltas.freed(e.size, requested, e.block);
                to_books(&mut st, e.slot);
                Some(Ok(Freed::Books(st, e.slot)))
            }
        }
    }

    /// A free of `ptr` while tag 0 is closed: refused when a cache handed it out and
    /// it is live (tag 0's memory; `id`, if any, its key), else left to the books
    /// (`None`), which check its tag.
    fn refuse_closed<'a>(
        &self,
        ptr: DevicePtr,
        id: Option<u64>,
    ) -> Option<crate::Result<Freed<'a>>> {
        let key = self.key_of(ptr)?;
        if id.is_some_and(|id| id != key) {
            return None;
        }
        Some(Err(crate::pool::tag_gate::refused0()))
    }

    /// Frees books-live `ptr` into cache `c` (held as `g`; the caches are open) if
    /// it fits and may be held there, else leaves it idle for the books' tail. Memory
    /// of a tag other than 0, or not live, is left to the books' free (`None`), which
    /// enters its tag (`tag_gate.rs`) or answers that it is unknown.
    fn free_into<'a>(
        &self,
        c: &ThreadCache,
        g: &mut Inner,
        ptr: DevicePtr,
        id: Option<u64>,
        state: &'a Mutex<State>,
        rec: Option<&crate::pool::record::Recorder>,
    ) -> Option<crate::Result<Freed<'a>>> {
        let st = lock(state);
        let tag = st.live.get(&ptr).map(|&slot| st.mref(slot).tag);
        if tag != Some(0) {
            return None;
        }
        Some(self.free_into_books_live(c, g, ptr, id, st, rec))
    }

    /// [`Caches::free_into`] of tag 0's books-live `ptr` (the books held as `st`).
    fn free_into_books_live<'a>(
        &self,
        c: &ThreadCache,
        g: &mut Inner,
        ptr: DevicePtr,
        id: Option<u64>,
        mut st: MutexGuard<'a, State>,
        rec: Option<&crate::pool::record::Recorder>,
    ) -> crate::Result<Freed<'a>> {
        let (slot, recorded) = st.free_live(ptr, id, None)?;
        if let Some(r) = rec {
            r.free(ptr, None);
        }
        let m = st.mref(slot);
        let (size, block) = (m.size(), m.is_block());
        // A tagged mapping (issue 15) never enters a cache: its tag's books count it.
        let eligible = recorded.is_none()
            && m.tag == 0
            && (!block
                || (size <= SEGMENT_SMALL_MAX_BYTES
                    && home_of(st.segs.segs[m.seg as usize].key) == SYNC_FREED))
            && self.fits(g, size);
        if !eligible {
            return Ok(Freed::Books(st, slot));
        }
        let Some(entry) = self.table.get_or_make(ptr) else {
            return Ok(Freed::Books(st, slot));
        };
        let word = entry.word.load(Ordering::Relaxed);
        entry.set_slot(slot, block, size);
        entry.word.store(
            table::pack(IDLE, c.id, table::generation(word)),
            Ordering::Release,
        );
        st.mapping_mut(slot).state = MappingState::Cached;
        st.tier_slots += 1;
        g.d.held(size, true);
        g.push(Held {
            ptr,
            slot,
            size,
            block,
        });
        Ok(Freed::Done)
    }

    /// Reserves room for one entry of `size` bytes on the remote list of `o`
    /// within the cache's bounds; false (nothing reserved) when it is full.
    fn reserve_remote(&self, o: &ThreadCache, size: u64) -> bool {
        let n = o.remote_len.fetch_add(1, Ordering::Relaxed);
        let b = o.remote_bytes.fetch_add(size, Ordering::Relaxed);
        if n < self.max_entries && b.saturating_add(size) <= self.max_bytes {
            return true;
        }
        o.remote_len.fetch_sub(1, Ordering::Relaxed);
        o.remote_bytes.fetch_sub(size, Ordering::Relaxed);
        false
    }
}

/// Wins the free of live `ptr` (with `id`, only if it is that allocation): one
/// compare-and-swap on its word, so of two racing frees one wins and the other
/// finds it not live. Returns the entry as held and its owner.
fn claim(entry: &Entry, ptr: DevicePtr, id: Option<u64>) -> Option<(Held, u16)> {
    let w = entry.word.load(Ordering::Acquire);
    if table::state(w) != LIVE || id.is_some_and(|id| id != table::generation(w) | TIER_KEY) {
        return None;
    }
    let idle = table::pack(IDLE, table::owner(w), table::generation(w));
    entry
        .word
        .compare_exchange(w, idle, Ordering::AcqRel, Ordering::Acquire)
        .ok()?;
    let (slot, block) = entry.slot();
    let held = Held {
        ptr,
        slot,
        size: entry.size.load(Ordering::Relaxed),
        block,
    };
    Some((held, table::owner(w)))
}

/// Pushes `ptr` (its entry `entry`) on `o`'s remote list. Pushes and the owner's
/// take-all swap are the only operations, so the stack has no ABA problem.
fn push_remote(o: &ThreadCache, entry: &Entry, ptr: DevicePtr) {
    let mut head = o.remote.load(Ordering::Relaxed);
    loop {
        entry.next.store(head, Ordering::Relaxed);
        match o
            .remote
            .compare_exchange_weak(head, ptr, Ordering::Release, Ordering::Relaxed)
        {
            Ok(_) => return,
            Err(h) => head = h,
        }
    }
}
