//! The synchronisation types of the pool and the simulated driver: parking_lot's
//! mutex (it spins briefly before parking, which suits the pool's critical sections
//! of tens of nanoseconds), or loom's under `--cfg flare_loom` so that loom models can
//! explore every interleaving. The `std-mutex` feature switches to std's mutex, for
//! comparing the two in the benchmarks.
//!
//! Only what loom runs goes through here; nothing in the pool core or the simulated
//! driver uses `thread_local!` or an atomic directly. The exceptions, the same in
//! both builds: the pointer table's `std::sync::OnceLock` nodes (`pool/table.rs`): a
//! node is only ever initialised under the pool's lock, and read with one acquire
//! load; and the growth report's stamps (`pool/steps.rs`, and their copies in the
//! table's entries): relaxed counters that no decision of the pool depends on, which
//! loom would otherwise explore in every model.

#[cfg(flare_loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(all(not(flare_loom), not(feature = "std-mutex")))]
pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};

#[cfg(all(not(flare_loom), feature = "std-mutex"))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// Locks `m`. parking_lot's mutex has no poisoning; loom's is recovered from a
/// panicking thread, as the books are updated so that every step leaves them
/// consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(any(flare_loom, feature = "std-mutex"))]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(all(not(flare_loom), not(feature = "std-mutex")))]
    {
        m.lock()
    }
}

/// Waits on `cv`, releasing `guard` while waiting and taking the lock again before
/// returning (spurious wake-ups are possible: callers wait in a loop).
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    #[cfg(any(flare_loom, feature = "std-mutex"))]
    {
        cv.wait(guard).unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(all(not(flare_loom), not(feature = "std-mutex")))]
    {
        let mut guard = guard;
        cv.wait(&mut guard);
        guard
    }
}

/// Atomics: loom's under `--cfg flare_loom` (its models explore every ordering of the
/// thread caches' lock-free steps), std's otherwise.
pub(crate) mod atomic {
    #[cfg(flare_loom)]
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    #[cfg(not(flare_loom))]
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
}

/// `thread_local!`: loom's under `--cfg flare_loom` (loom's threads all run on one OS
/// thread, so std's thread-locals would be shared between them), std's otherwise.
#[cfg(flare_loom)]
pub(crate) use loom::thread_local;
#[cfg(not(flare_loom))]
pub(crate) use std::thread_local;
