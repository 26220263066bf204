//! Realtime scheduling for the threads every acknowledgement passes through: the event loop
//! and, with a standby, the primary's acknowledgement reader and the standby's receiver.
//!
//! Why: on a machine with few CPUs and many runnable threads (database clients that spin while
//! they wait, the daemon's own flushers) a thread woken under the normal scheduler waits for
//! its fair share before it runs, and a `replicated` commit waits for two such wake-ups on each
//! node. Measured on this project's 2-vCPU machine with 16 clients: the primary's
//! acknowledgement reader ran about 1.4 ms after the standby's answer arrived. At the lowest
//! realtime priority a woken thread runs at once; these threads block whenever they have no
//! work, and the kernel keeps 5 % of every CPU for normal threads. Threads they start (the
//! standby's writer, say) do not inherit it: the policy is asked with `SCHED_RESET_ON_FORK`.

use std::io;

/// Gives the calling thread `SCHED_FIFO` at the lowest priority, if the process may (root, or
/// `CAP_SYS_NICE`); says whether it got it. `what` names the thread in the log.
pub(crate) fn become_realtime(what: &str) -> bool {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: a plain system call on the calling thread (pid 0) with a valid, initialised
    // parameter; it changes nothing but that thread's scheduling.
    let done = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    } == 0;
    if done {
        tracing::debug!(thread = what, "realtime scheduling (SCHED_FIFO 1)");
    } else {
        tracing::debug!(thread = what, error = %io::Error::last_os_error(),
            "normal scheduling (realtime needs CAP_SYS_NICE)");
    }
    done
}
