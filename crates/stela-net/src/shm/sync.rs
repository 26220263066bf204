//! The atomics the ring's two ends use, swapped for loom's under `--cfg stela_loom` (as
//! `stela-server/src/sync.rs` does for the pool), so `tests/loom_ring.rs` checks the very
//! producer and consumer code the daemon and the client run. Also the model's crash points.

#[cfg(stela_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64};
#[cfg(stela_loom)]
pub(crate) use loom::sync::Arc;
#[cfg(not(stela_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64};
#[cfg(not(stela_loom))]
pub(crate) use std::sync::Arc;

/// A point between two steps of the client where the loom model may kill it. Compiles to
/// nothing outside the model.
#[cfg(not(stela_loom))]
#[inline(always)]
pub(crate) fn crash_point() {}

#[cfg(stela_loom)]
pub(crate) use model_crash::crash_point;

#[cfg(stela_loom)]
pub(crate) mod model_crash {
    use std::cell::Cell;

    /// The panic payload of a killed model thread (see [`crash_point`]).
    #[derive(Debug)]
    pub struct Killed;

    loom::thread_local! {
        static COUNTDOWN: Cell<Option<usize>> = Cell::new(None);
    }

    /// Kills the calling model thread (panics with [`Killed`]) at its `n`-th crash point from
    /// now (0: the next one). The thread catches the panic and then behaves as a dead process:
    /// it stops, leaving shared memory exactly as the steps before left it.
    pub fn arm(n: usize) {
        COUNTDOWN.with(|c| c.set(Some(n)));
    }

    pub(crate) fn crash_point() {
        COUNTDOWN.with(|c| match c.get() {
            Some(0) => {
                c.set(None);
                std::panic::panic_any(Killed);
            }
            Some(n) => c.set(Some(n - 1)),
            None => {}
        });
    }
}
