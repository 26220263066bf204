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
//!
//! The event loop gives realtime up while the commits it serves wait for the disk
//! ([`LoopPriority`]).

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

/// Gives the calling thread back the normal scheduler (`SCHED_OTHER`); says whether it could.
pub(crate) fn become_normal(what: &str) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in `become_realtime`: a system call on the calling thread only, with a valid
    // parameter.
    let done = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK, &param)
    } == 0;
    if done {
        tracing::debug!(thread = what, "normal scheduling");
    } else {
        tracing::debug!(thread = what, error = %io::Error::last_os_error(),
            "could not leave realtime scheduling");
    }
    done
}

/// How long the event loop counts its rings' entries before it reconsiders its scheduling.
pub(crate) const LOOP_PRIORITY_WINDOW: std::time::Duration = std::time::Duration::from_millis(1);

/// The event loop's scheduling while realtime is permitted: realtime while most ring entries
/// are answered at once (`buffered`, `unsafe`: the client's commit waits for the loop alone),
/// normal while most wait for the disk.
///
/// Why: a realtime loop that keeps serving holds one CPU whole. When commits wait for an
/// fdatasync, the loop's few microseconds per commit are not what they wait for, but the
/// committers, woken by the round's completion, must all run before the next round can cover
/// them; on two CPUs they then get one. Measured on the 2-vCPU machine, sides taking turns
/// (`bench/results/commit-loop-priority.txt`), `disk` commits against the embedded group
/// commit: 16 clients 0.88-0.97 with this policy, 0.80-0.92 with the loop always realtime; 64
/// clients 0.86-0.94 against 0.82-0.89; one client 0.71-0.89 against 0.60-0.62. Never realtime,
/// `buffered` commits of 64 clients fall to a third (`docs/DAEMON.md`). The decision is taken once per
/// [`LOOP_PRIORITY_WINDOW`] from the entries served in it, so the loop changes its scheduling at
/// most a thousand times a second, and keeps it through idle windows.
#[derive(Debug)]
pub(crate) struct LoopPriority {
    /// Realtime is permitted and was asked for.
    permitted: bool,
    realtime: bool,
    window_start: std::time::Instant,
    /// Ring entries answered at once, and entries that waited for the disk, this window.
    answered_at_once: u64,
    waited_for_disk: u64,
}

impl LoopPriority {
    /// Asks for realtime scheduling if `wanted` (see [`become_realtime`]).
    pub(crate) fn start(wanted: bool) -> LoopPriority {
        let realtime = wanted && become_realtime("event loop");
        LoopPriority {
            permitted: realtime,
            realtime,
            window_start: std::time::Instant::now(),
            answered_at_once: 0,
            waited_for_disk: 0,
        }
    }

    /// Whether the loop runs realtime now.
    pub(crate) fn realtime(&self) -> bool {
        self.realtime
    }

    /// Counts entries served since the last call; at the end of a window, changes the loop's
    /// scheduling if the window's mix asks for the other one. Returns whether it changed.
    pub(crate) fn served(&mut self, answered_at_once: u64, waited_for_disk: u64) -> bool {
        self.answered_at_once += answered_at_once;
        self.waited_for_disk += waited_for_disk;
        if !self.permitted || self.window_start.elapsed() < LOOP_PRIORITY_WINDOW {
            return false;
        }
        let wanted = wants_realtime(self.answered_at_once, self.waited_for_disk);
        self.window_start = std::time::Instant::now();
        self.answered_at_once = 0;
        self.waited_for_disk = 0;
        match wanted {
            Some(true) if !self.realtime => {
                self.realtime = become_realtime("event loop");
                self.realtime
            }
            Some(false) if self.realtime => {
                self.realtime = !become_normal("event loop");
                !self.realtime
            }
            _ => false,
        }
    }
}

/// The scheduling a window's entries ask for: realtime unless entries waiting for the disk were
/// at least as many as those answered at once; `None` (keep what it is) for a window with none.
fn wants_realtime(answered_at_once: u64, waited_for_disk: u64) -> Option<bool> {
    match (answered_at_once, waited_for_disk) {
        (0, 0) => None,
        (at_once, disk) => Some(at_once > disk),
    }
}

#[cfg(test)]
mod tests {
    use super::wants_realtime;

    #[test]
    fn disk_bound_windows_give_up_realtime_and_idle_ones_change_nothing() {
        assert_eq!(wants_realtime(0, 0), None);
        assert_eq!(wants_realtime(100, 0), Some(true));
        assert_eq!(wants_realtime(0, 64), Some(false));
        // A client appending at `buffered` and committing at `disk` is disk-bound.
        assert_eq!(wants_realtime(50, 50), Some(false));
        assert_eq!(wants_realtime(51, 50), Some(true));
    }
}
