//! The one way the crate takes a std mutex: a panic while one was held cannot leave what it
//! guards half-updated in a way that matters here (maps of hints, counters), so a poisoned lock
//! is taken over rather than turned into a second panic.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking over a poisoned lock.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
