//! The synchronisation primitives of the buffer pool, swapped for loom's under `--cfg stela_loom` so
//! the model in `tests/loom_pool.rs` explores every interleaving of appenders, the flusher and
//! the emergency flush against the very code the daemon runs.

#[cfg(stela_loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(stela_loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Waits on `condvar` for at most `timeout`. Loom has no clock, so there the wait is untimed:
/// the model must never depend on a timeout to make progress.
pub(crate) fn wait_timeout<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: std::time::Duration,
) -> MutexGuard<'a, T> {
    #[cfg(stela_loom)]
    {
        let _ = timeout;
        condvar.wait(guard).unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(not(stela_loom))]
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

pub(crate) fn lock<M: Lock + ?Sized>(mutex: &M) -> M::Guard<'_> {
    // A panic while holding the pool lock is a bug we do not want to turn into a second panic
    // in every connection thread; the state itself stays consistent (every mutation is
    // completed before anything that can panic).
    mutex.lock_ignoring_poison()
}

/// A mutex [`lock`] takes: std's always (the modules around the pool keep std's mutexes), and
/// under `--cfg stela_loom` also loom's, so the whole crate compiles for the loom model.
pub(crate) trait Lock {
    type Guard<'a>
    where
        Self: 'a;
    fn lock_ignoring_poison(&self) -> Self::Guard<'_>;
}

impl<T: ?Sized> Lock for std::sync::Mutex<T> {
    type Guard<'a>
        = std::sync::MutexGuard<'a, T>
    where
        Self: 'a;
    fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(stela_loom)]
impl<T> Lock for loom::sync::Mutex<T> {
    type Guard<'a>
        = loom::sync::MutexGuard<'a, T>
    where
        Self: 'a;
    fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}
