//! The tag gate (issue 34): one ordering rule between a tag's state changes (sleep,
//! wake) and the calls on its memory (`docs/ARCHITECTURE.md`, "Tags: sleep and
//! wake", Concurrency).
//!
//! **The rule.** A call on a tag's memory (an allocation of the tag, a free or
//! stream-ordered free of one of its pointers) *enters* the tag, where it first
//! touches the tag's books, and *leaves* it when it returns; entering is refused
//! ([`Error::TagState`], nothing changed) while the tag is asleep or a sleep or wake
//! of it runs. A sleep or wake takes the tag *exclusively*: under the books' lock it
//! marks the tag busy (so no call enters from then on), then waits until no call of
//! the tag is in flight; a second sleep or wake of a busy tag is refused. So every
//! call on a tag's memory runs wholly before or wholly after each of its state
//! changes, and two state changes of one tag never overlap. A call that finishes
//! within one hold of a lock the state change also takes (a thread cache's hit or
//! push, `record_stream`) only checks the gate under that lock.
//!
//! **Where the entry is taken.** A tag other than 0: under the books' lock, counted in
//! its [`TagBooks`](crate::pool::tags::TagBooks) (`users`). A free: under the books' lock, in the same
//! hold as the lookup that tells its tag (`State::free_live`), so the lookup and the
//! check are one step. Tag 0's calls are the untagged hot paths, so its count is an
//! atomic (`users0`): an untagged allocation that misses its thread cache enters
//! with one read-modify-write and one load, no lock; the thread caches' hit and free
//! paths read one flag (`closed0`) under their own mutex, which the sleep takes
//! (settling the caches) before it looks at tag 0's memory. No lock is added to an
//! untagged call while tag 0 is awake and not changing.
//!
//! **Whole mappings of other tags.** A tagged allocation of a whole mapping is handed
//! out by tag 0's books (memory freed on streams, a new mapping) and is tag 0's until
//! it is booked as its tag's, in a later hold: it enters tag 0 as well, waiting out a
//! sleep or wake of tag 0 that runs (never refused: tag 0 asleep does not stop other
//! tags), so a sleep of tag 0 never takes it for its own.
//!
//! **Tag 0's count without a lock.** An entry increments `users0` (read-modify-write,
//! acquire-release) and then loads `closed0`; a state change stores `closed0` and
//! then reads `users0` with a read-modify-write. The two read-modify-writes of
//! `users0` are ordered: if the call's comes first, the state change reads its
//! increment (and waits); if the state change's comes first, the call's reads from it
//! and so sees `closed0` set (and leaves, refused). Both sides use read-modify-writes
//! so that the argument needs no sequentially consistent store and load (which loom
//! does not model as such). A leave that brings `users0` to 0 while `closed0` is set
//! takes the books' lock to signal the waiting state change.

use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::pool::books::State;
use crate::pool::Pool;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{lock, wait, Condvar, MutexGuard};

/// The gate's shared part (the rest is in the books: each tag's `busy`, `sleeping`
/// and `users`).
pub(in crate::pool) struct TagGate {
    /// Tag 0 is asleep, or a sleep or wake of it runs: its calls are refused. Written
    /// under the books' lock; read by the thread caches under their own mutex.
    closed0: AtomicBool,
    /// Calls in flight on tag 0's memory (and tagged whole-mapping allocations passing
    /// through its books).
    users0: Padded,
    /// Signalled when the last call of a busy tag leaves, and when a sleep or wake of
    /// tag 0 ends (allocations of other tags wait for it).
    changed: Condvar,
}

/// `users0` on a cache line of its own: every untagged call that reaches the books
/// writes it, while the thread caches' hit paths read `closed0`.
#[repr(align(128))]
struct Padded(AtomicU64);

/// A call's hold on a tag, from [`Pool::enter_untagged`], [`Pool::enter_tagged`] or
/// [`Pool::enter_live`]; given back with [`Pool::leave`], without the books' lock
/// held.
#[must_use]
#[derive(Debug)]
pub(in crate::pool) struct Entry {
    /// The tag entered (`None`: nothing, a pointer that is not live).
    tag: Option<u32>,
    /// A tag other than 0 that entered tag 0 as well (a whole mapping).
    also0: bool,
}

const REFUSED: &str = "the tag is asleep (or being put to sleep or woken): wake it first";

/// The refusal of a call on tag 0's memory while it is closed.
pub(in crate::pool) fn refused0() -> Error {
    Error::TagState {
        tag: 0,
        reason: REFUSED,
    }
}

impl TagGate {
    pub(in crate::pool) fn new() -> TagGate {
        TagGate {
            closed0: AtomicBool::new(false),
            users0: Padded(AtomicU64::new(0)),
            changed: Condvar::new(),
        }
    }

    /// Whether tag 0 is closed (asleep, or a sleep or wake of it runs). Exact under
    /// the books' lock; under a thread cache's mutex, exact from the moment the
    /// closing state change has settled that cache (`Caches::settle` takes every
    /// cache's mutex), which it does before it looks at tag 0's memory.
    pub(in crate::pool) fn tag0_closed(&self) -> bool {
        self.closed0.load(Ordering::Relaxed)
    }

    /// One more call on tag 0's memory.
    fn add0(&self) {
        self.users0.0.fetch_add(1, Ordering::AcqRel);
    }
}

impl Pool {
    /// Enters tag 0 for an untagged allocation that goes to the books (no lock).
    ///
    /// Errors: [`Error::TagState`] while tag 0 is asleep or a sleep or wake of it
    /// runs.
    pub(in crate::pool) fn enter_untagged(&self) -> Result<Entry> {
        self.gate.add0();
        if self.gate.closed0.load(Ordering::Acquire) {
            self.leave0();
            return Err(refused0());
        }
        Ok(Entry {
            tag: Some(0),
            also0: false,
        })
    }

    /// Enters tag `tag` (not 0) for an allocation; `whole`: a whole mapping, which
    /// passes through tag 0's books, so it enters tag 0 too, first waiting for a sleep
    /// or wake of tag 0 that runs to end.
    ///
    /// Errors: [`Error::TagState`] while tag `tag` is asleep or a sleep or wake of it
    /// runs.
    pub(in crate::pool) fn enter_tagged(&self, tag: u32, whole: bool) -> Result<Entry> {
        let mut st = lock(&self.state);
        if whole {
            while st.tags.get(&0).is_some_and(|t| t.busy) {
                st = wait(&self.gate.changed, st);
            }
        }
        st.tag_usable(tag)?;
        st.tags.entry(tag).or_default().users += 1;
        if whole {
            self.gate.add0();
        }
        Ok(Entry {
            tag: Some(tag),
            also0: whole,
        })
    }

    /// Enters the tag of live `ptr` (held as `st`, the books' lock, in the same hold
    /// as the free that looks it up); a pointer that is not live enters nothing (the
    /// free then answers that it is unknown).
    ///
    /// Errors: [`Error::TagState`] while its tag is asleep or a sleep or wake of it
    /// runs.
    pub(in crate::pool) fn enter_live(&self, st: &mut State, ptr: DevicePtr) -> Result<Entry> {
        let Some(&slot) = st.live.get(&ptr) else {
            return Ok(Entry {
                tag: None,
                also0: false,
            });
        };
        let tag = st.mref(slot).tag;
        st.tag_usable(tag)?;
        if tag == 0 {
            self.gate.add0();
        } else {
            st.tags.entry(tag).or_default().users += 1;
        }
        Ok(Entry {
            tag: Some(tag),
            also0: false,
        })
    }

    /// Leaves what `e` entered. Must not be called with the books' lock held.
    pub(in crate::pool) fn leave(&self, e: Entry) {
        match e.tag {
            None => {}
            Some(0) => self.leave0(),
            Some(tag) => {
                {
                    let mut st = lock(&self.state);
                    let t = st.tags.entry(tag).or_default();
                    t.users -= 1;
                    if t.users == 0 && t.busy {
                        self.gate.changed.notify_all();
                    }
                }
                if e.also0 {
                    self.leave0();
                }
            }
        }
    }

    /// One call on tag 0's memory fewer; the last one while tag 0 is closed signals
    /// the state change waiting for it.
    fn leave0(&self) {
        let before = self.gate.users0.0.fetch_sub(1, Ordering::AcqRel);
        if before == 1 && self.gate.closed0.load(Ordering::Acquire) {
            let _st = lock(&self.state);
            self.gate.changed.notify_all();
        }
    }

    /// Takes tag `tag` exclusively for a sleep or wake (the caller checked, under the
    /// same hold of `st`, that no other one runs): marks it busy, so that no call
    /// enters it from now on, then waits until none is in flight. Returns the books'
    /// lock, taken again.
    pub(in crate::pool) fn close_tag<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        tag: u32,
    ) -> MutexGuard<'a, State> {
        st.tags.entry(tag).or_default().busy = true;
        if tag == 0 {
            self.gate.closed0.store(true, Ordering::Release);
        }
        loop {
            let users = if tag == 0 {
                // A read-modify-write: see the module's doc.
                self.gate.users0.0.fetch_add(0, Ordering::AcqRel)
            } else {
                st.tags.get(&tag).map_or(0, |t| u64::from(t.users))
            };
            if users == 0 {
                return st;
            }
            st = wait(&self.gate.changed, st);
        }
    }

    /// Ends the sleep or wake of tag `tag` (held as `st`): no longer busy; its calls
    /// enter again if it is awake. Wakes the allocations waiting for tag 0.
    pub(in crate::pool) fn open_tag(&self, st: &mut State, tag: u32) {
        let t = st.tags.entry(tag).or_default();
        t.busy = false;
        if tag == 0 {
            if t.sleeping.is_none() {
                self.gate.closed0.store(false, Ordering::Release);
            }
            self.gate.changed.notify_all();
        }
    }

    /// The pool is being destroyed: every tag is forgotten, tag 0 open again.
    pub(in crate::pool) fn reset_gate(&self) {
        self.gate.closed0.store(false, Ordering::Release);
    }
}
