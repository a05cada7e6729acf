//! The synchronisation types of the pool and the simulated driver: std's, or loom's
//! under `--cfg loom` so that loom models can explore every interleaving.
//!
//! Only what loom runs goes through here; nothing in the pool core or the simulated
//! driver uses `std::sync::OnceLock` or `thread_local!` directly.

#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Locks `m`, recovering the guard if a panicking thread poisoned it: the pool's
/// books are updated so that every step leaves them consistent, so a panic in
/// a caller's thread never makes the pool unusable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
