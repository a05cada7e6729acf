//! The history ring (issue 38): a bounded ring of the pool's recent events, named as
//! PyTorch's memory_viz names them, for [`Pool::history`] and the memory_viz
//! snapshot (`crate::viz`).
//!
//! Off by default ([`PoolConfig::history_events`](super::PoolConfig::history_events)
//! 0): the pool then holds `None`, and each hook is one test of that `Option` (a
//! branch the processor predicts). On, each event is written under the ring's own
//! mutex, a leaf lock (taken under the books' lock or no lock, never the other way):
//! a ring that is full overwrites its oldest slot, so nothing is allocated per
//! event once it has filled (a frame is an `Arc<str>`: a reference count, not a
//! copy).
//!
//! Where the events come from:
//! - `alloc`: after an allocation call succeeded (the untagged, stream-ordered and
//!   tagged fronts), with the bytes asked.
//! - `free_requested` and `free_completed`: written together, as one step, where a
//!   free takes the memory out of the live books or a thread cache claims it, under
//!   the lock that step holds and so before the memory can be handed out again. The
//!   pool reuses freed memory at once (stream order, or its fences, make that safe),
//!   so a free is requested and completed in the same step.
//! - `segment_map` / `segment_unmap`: a whole mapping booked after its creation, or
//!   taken out for release; in segment mode a handle booked into a segment (a growth,
//!   or a free handle lent to a segment's end) or taken out of one (for release or
//!   lending). A release the driver refused maps it back (`segment_map` again). The
//!   unmap is written when the memory is taken out under the books' lock, before
//!   the driver calls that release it, so a new mapping at the same address always
//!   comes after it.
//! - `oom`: an allocation the pool refused for lack of device memory
//!   ([`Error::OutOfMemory`](crate::Error::OutOfMemory)), with the bytes asked and the
//!   device's free memory (`cuMemGetInfo`) then.
//!
//! - A tag's sleep and wake: memory_viz has no sleep, so a sleep is written as each
//!   live allocation of the tag freed (`free_requested`, `free_completed`) and its
//!   memory unmapped (`segment_unmap` of a whole mapping, or of each handle of the
//!   tag's segments), a wake as the memory mapped and each allocation allocated again
//!   at the same address; a snapshot taken while the tag sleeps leaves its memory out.
//!
//! A frame: a short string the calling thread sets ([`set_history_frame`]) that every
//! event of that thread carries, in any pool, until it is changed or cleared (the
//! name of a phase, a layer, a request: memory_viz shows it as the event's stack).

mod layout;

pub use layout::{BlockState, LayoutBlock, LayoutSegment};

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::Pool;
use crate::driver::{DevicePtr, Stream};

/// What an event of the history ring records: the `action` strings of PyTorch's
/// memory_viz (`torch/cuda/_memory_viz.py`, `MemoryViz.js`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HistoryAction {
    /// An allocation handed out (`size`: the bytes asked).
    Alloc,
    /// A free asked for (always followed at once by its [`HistoryAction::FreeCompleted`]).
    FreeRequested,
    /// The freed memory is the pool's again (reusable).
    FreeCompleted,
    /// A mapping or a segment's handle mapped by the pool (`size`: its bytes).
    SegmentMap,
    /// A mapping or a segment's handle taken out for release (or, in segment mode,
    /// moved to another place of its segment).
    SegmentUnmap,
    /// An allocation refused for lack of device memory (`size`: the bytes asked;
    /// `device_free`: the device's free bytes then).
    Oom,
}

impl HistoryAction {
    /// The action's name in memory_viz (`"alloc"`, `"free_requested"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            HistoryAction::Alloc => "alloc",
            HistoryAction::FreeRequested => "free_requested",
            HistoryAction::FreeCompleted => "free_completed",
            HistoryAction::SegmentMap => "segment_map",
            HistoryAction::SegmentUnmap => "segment_unmap",
            HistoryAction::Oom => "oom",
        }
    }
}

/// One event of the history ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEvent {
    /// What happened.
    pub action: HistoryAction,
    /// The address (an allocation's, a mapping's or a handle's); 0 for an `oom`.
    pub addr: DevicePtr,
    /// Bytes: asked for (`alloc`, `free_*`: the allocation's requested bytes; `oom`),
    /// or mapped (`segment_*`).
    pub size: u64,
    /// The raw stream: of a stream-ordered allocation or free, of a segment's heap
    /// (segment mode); 0 for the synchronous API and whole mappings.
    pub stream: u64,
    /// The allocation's tag (0: untagged); a segment's tag; the tag asked (`oom`).
    pub tag: u32,
    /// When, in microseconds since the Unix epoch (the system clock).
    pub time_us: u64,
    /// The calling thread's frame when the event was written ([`set_history_frame`]).
    pub frame: Option<Arc<str>>,
    /// `oom` only: the device's free memory then, bytes (`cuMemGetInfo`; 0 when the
    /// query failed); 0 for every other action.
    pub device_free: u64,
    /// The event's number in this process (every pool's events share one count): the
    /// order of events of several pools.
    pub seq: u64,
}

/// The count behind [`HistoryEvent::seq`].
static SEQ: AtomicU64 = AtomicU64::new(0);

// std's `thread_local!` under loom too (loom's takes no `const` initialiser, and no
// loom model turns the history on).
std::thread_local! {
    /// The calling thread's frame ([`set_history_frame`]).
    static FRAME: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// Sets the calling thread's frame: every history event this thread writes, in any
/// pool, carries `frame` (memory_viz shows it as the event's stack frame) until the
/// next call; `None` clears it. A frame is a short label the caller chooses (a
/// phase, a layer, a request id); nothing is written when no pool has its history on.
pub fn set_history_frame(frame: Option<&str>) {
    let f = frame.map(Arc::<str>::from);
    let _ = FRAME.try_with(|c| *c.borrow_mut() = f);
}

/// The calling thread's frame ([`set_history_frame`]).
pub fn history_frame() -> Option<Arc<str>> {
    FRAME.try_with(|c| c.borrow().clone()).ok().flatten()
}

/// The ring: up to `cap` events, the oldest overwritten first.
struct Ring {
    events: Vec<HistoryEvent>,
    cap: usize,
    /// Once full: the slot of the oldest event (the next one overwritten).
    head: usize,
    /// Events overwritten so far.
    dropped: u64,
}

impl Ring {
    fn push(&mut self, e: HistoryEvent) {
        if self.events.len() < self.cap {
            self.events.push(e);
        } else if let Some(slot) = self.events.get_mut(self.head) {
            *slot = e;
            self.head = (self.head + 1) % self.cap;
            self.dropped += 1;
        }
    }
}

/// A pool's history ring (see the module documentation).
pub(in crate::pool) struct History {
    ring: parking_lot::Mutex<Ring>,
}

/// What one event says, before its time, frame and number are added.
#[derive(Clone, Copy)]
pub(in crate::pool) struct What {
    pub(in crate::pool) action: HistoryAction,
    pub(in crate::pool) addr: DevicePtr,
    pub(in crate::pool) size: u64,
    pub(in crate::pool) stream: u64,
    pub(in crate::pool) tag: u32,
    pub(in crate::pool) device_free: u64,
}

impl What {
    /// An event of `action` at `addr`, `size` bytes, on raw stream `stream`, of `tag`.
    pub(in crate::pool) fn new(
        action: HistoryAction,
        addr: DevicePtr,
        size: u64,
        stream: u64,
        tag: u32,
    ) -> What {
        What {
            action,
            addr,
            size,
            stream,
            tag,
            device_free: 0,
        }
    }
}

/// Microseconds since the Unix epoch (0 before it).
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl History {
    /// A ring of `cap` events (at least 1). Room for the first events is reserved
    /// now (at most 4096); the ring grows to `cap` as it fills, then reuses its slots.
    pub(in crate::pool) fn new(cap: usize) -> History {
        let cap = cap.max(1);
        History {
            ring: parking_lot::Mutex::new(Ring {
                events: Vec::with_capacity(cap.min(4096)),
                cap,
                head: 0,
                dropped: 0,
            }),
        }
    }

    /// Writes the events `whats`, in order, as one step (nothing of another thread
    /// comes between them), with the time, the calling thread's frame and their
    /// numbers.
    pub(in crate::pool) fn write(&self, whats: &[What]) {
        let time_us = now_us();
        let frame = history_frame();
        let mut ring = self.ring.lock();
        for w in whats {
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            ring.push(HistoryEvent {
                action: w.action,
                addr: w.addr,
                size: w.size,
                stream: w.stream,
                tag: w.tag,
                time_us,
                frame: frame.clone(),
                device_free: w.device_free,
                seq,
            });
        }
    }

    /// The events held, oldest first, and how many were overwritten before them.
    pub(in crate::pool) fn events(&self) -> (Vec<HistoryEvent>, u64) {
        let ring = self.ring.lock();
        let mut out = Vec::with_capacity(ring.events.len());
        out.extend_from_slice(&ring.events[ring.head..]);
        out.extend_from_slice(&ring.events[..ring.head]);
        (out, ring.dropped)
    }
}

/// The raw value of an optional stream (0: none, the synchronous API).
pub(in crate::pool) fn raw(stream: Option<Stream>) -> u64 {
    stream.map_or(0, |s| s.raw())
}

impl Pool {
    /// The history ring's events, oldest first ([`PoolConfig::history_events`]; empty
    /// when it is off), and how many older events the ring overwrote.
    ///
    /// [`PoolConfig::history_events`]: super::PoolConfig::history_events
    pub fn history(&self) -> (Vec<HistoryEvent>, u64) {
        match &self.history {
            Some(h) => h.events(),
            None => (Vec::new(), 0),
        }
    }

    /// Whether this pool keeps a history ring ([`PoolConfig::history_events`] > 0).
    ///
    /// [`PoolConfig::history_events`]: super::PoolConfig::history_events
    pub fn history_on(&self) -> bool {
        self.history.is_some()
    }

    /// The outcome of an allocation call of `bytes` (tag `tag`, on `stream`), when the
    /// history is on: `alloc` on success, `oom` for an out-of-memory refusal.
    #[inline]
    pub(in crate::pool) fn history_alloc<T>(
        &self,
        r: &crate::Result<T>,
        ptr_of: impl FnOnce(&T) -> DevicePtr,
        bytes: u64,
        tag: u32,
        stream: Option<Stream>,
    ) {
        if let Some(h) = &self.history {
            self.history_alloc_on(h, r.as_ref().map(ptr_of), bytes, tag, stream);
        }
    }

    #[cold]
    fn history_alloc_on(
        &self,
        h: &History,
        r: std::result::Result<DevicePtr, &crate::Error>,
        bytes: u64,
        tag: u32,
        stream: Option<Stream>,
    ) {
        match r {
            Ok(ptr) => h.write(&[What::new(
                HistoryAction::Alloc,
                ptr,
                bytes,
                raw(stream),
                tag,
            )]),
            Err(crate::Error::OutOfMemory { .. }) => {
                let free = self.driver.mem_info().map_or(0, |m| m.free);
                h.write(&[What {
                    device_free: free,
                    ..What::new(HistoryAction::Oom, 0, bytes, raw(stream), tag)
                }]);
            }
            Err(_) => {}
        }
    }
}

/// The two events of a free of `ptr` (`requested` bytes asked, of `tag`, on raw
/// stream `stream`): requested and completed, written as one step.
pub(in crate::pool) fn free_pair(
    ptr: DevicePtr,
    requested: u64,
    stream: u64,
    tag: u32,
) -> [What; 2] {
    [
        What::new(HistoryAction::FreeRequested, ptr, requested, stream, tag),
        What::new(HistoryAction::FreeCompleted, ptr, requested, stream, tag),
    ]
}

/// A `segment_map` (`map`) or `segment_unmap` of `size` bytes at `ptr`.
pub(in crate::pool) fn segment(
    map: bool,
    ptr: DevicePtr,
    size: u64,
    stream: u64,
    tag: u32,
) -> What {
    let action = if map {
        HistoryAction::SegmentMap
    } else {
        HistoryAction::SegmentUnmap
    };
    What::new(action, ptr, size, stream, tag)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed step is their failure
mod tests {
    use super::*;

    fn w(addr: u64) -> What {
        What::new(HistoryAction::Alloc, addr, 1, 0, 0)
    }

    /// A full ring overwrites its oldest events and keeps its capacity: the events
    /// read back are the last `cap` written, oldest first.
    #[test]
    fn a_full_ring_keeps_the_last_events_in_order() {
        let h = History::new(3);
        for a in 1..=7 {
            h.write(&[w(a)]);
        }
        let (events, dropped) = h.events();
        let addrs: Vec<u64> = events.iter().map(|e| e.addr).collect();
        assert_eq!(addrs, vec![5, 6, 7]);
        assert_eq!(dropped, 4);
        assert!(events.windows(2).all(|p| p[0].seq < p[1].seq));
        assert_eq!(h.ring.lock().events.capacity(), 3);
    }

    /// The calling thread's frame goes with its events; another thread's does not.
    #[test]
    fn frames_are_per_thread() {
        let h = History::new(8);
        set_history_frame(Some("warmup"));
        h.write(&[w(1)]);
        std::thread::scope(|s| {
            s.spawn(|| h.write(&[w(2)]));
        });
        set_history_frame(None);
        h.write(&[w(3)]);
        let (events, _) = h.events();
        let frames: Vec<Option<&str>> = events.iter().map(|e| e.frame.as_deref()).collect();
        assert_eq!(frames, vec![Some("warmup"), None, None]);
    }
}
