//! The GPU to one test at a time. Every test here that uses the GPU takes this lock
//! first: they share one process (this binary), and a stream query, a stream
//! synchronize or a synchronous copy made by any thread of a process in global
//! capture mode invalidates a capture open on another thread
//! (`docs/vmm-semantics.md`), while the tests make such calls, open captures, and
//! measure the device's free memory.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// The one-at-a-time lock.
static GPU: Mutex<()> = Mutex::new(());

/// Takes the lock (a test that failed holding it leaves it usable).
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    GPU.lock().unwrap_or_else(PoisonError::into_inner)
}
