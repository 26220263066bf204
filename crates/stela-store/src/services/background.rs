//! The scheduling of the store's background threads: the persistence services (checkpoints,
//! page cleaning, archiving) and instant restart's redo and undo. They run under
//! `SCHED_BATCH` (`StoreOptions::batch_services`), so that one waking up never preempts a
//! transaction's thread.
//!
//! Why: a transaction holds the engine latch while it changes pages and appends its records.
//! Under the normal policy a service thread waking from its interval preempts whichever thread
//! is running, latch holder or not, and on a machine with few CPUs every other transaction
//! then waits for the latch until the holder runs again. `SCHED_BATCH` threads get the same
//! share of the CPUs, but a woken one waits until the running thread blocks or its time slice
//! ends instead of preempting it: a service starts up to a few milliseconds late, which none of
//! them needs to avoid (RocksDB can lower its background threads' priority for the same
//! reason). Measured on this project's 2-vCPU machine, TPC-B
//! with 2 clients at `buffered` and both services every millisecond, builds taking turns: p99
//! 105-127 us against 225-297 us with the decoupled cleaner, throughput 2-16 % higher in each
//! of the four configurations (`bench/results/tpcb.txt`).

use std::io;

/// Moves the calling thread to `SCHED_BATCH`; logs (at debug) if it could not. `what` names
/// the thread in the log.
pub(crate) fn yield_to_transactions(what: &str) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain system call on the calling thread (pid 0) with a valid, initialised
    // parameter; it changes nothing but that thread's scheduling.
    let set = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if set != 0 {
        let error = io::Error::last_os_error();
        tracing::debug!(thread = what, %error, "normal scheduling (SCHED_BATCH refused)");
    }
}
