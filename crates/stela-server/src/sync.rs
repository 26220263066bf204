//! The synchronisation primitives of the buffer pool, swapped for loom's under `--cfg loom` so
//! the model in `tests/loom_pool.rs` explores every interleaving of appenders, the flusher and
//! the emergency flush against the very code the daemon runs.

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Waits on `condvar` for at most `timeout`. Loom has no clock, so there the wait is untimed:
/// the model must never depend on a timeout to make progress.
pub(crate) fn wait_timeout<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: std::time::Duration,
) -> MutexGuard<'a, T> {
    #[cfg(loom)]
    {
        let _ = timeout;
        condvar.wait(guard).unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(not(loom))]
    {
        condvar
            .wait_timeout(guard, timeout)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }
}

pub(crate) fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar.wait(guard).unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the pool lock is a bug we do not want to turn into a second panic
    // in every connection thread; the state itself stays consistent (every mutation is
    // completed before anything that can panic).
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
