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
//! The event loop gives realtime up while several of the committers it serves wait for the
//! disk or a standby ([`LoopPriority`]).

use std::io;

/// Gives the calling thread `SCHED_FIFO` at the lowest priority, if the process may (root, or
/// `CAP_SYS_NICE`); says whether it got it. `what` names the thread in the log.
pub(crate) fn become_realtime(what: &str) -> bool {
    let set = set_scheduler(libc::SCHED_FIFO, 1);
    match &set {
        Ok(()) => tracing::debug!(thread = what, "realtime scheduling (SCHED_FIFO 1)"),
        Err(error) => tracing::debug!(thread = what, %error,
            "normal scheduling (realtime needs CAP_SYS_NICE)"),
    }
    set.is_ok()
}

/// Gives the calling thread back the normal scheduler (`SCHED_OTHER`); says whether it could.
pub(crate) fn become_normal(what: &str) -> bool {
    let set = set_scheduler(libc::SCHED_OTHER, 0);
    match &set {
        Ok(()) => tracing::debug!(thread = what, "normal scheduling"),
        Err(error) => tracing::debug!(thread = what, %error, "could not leave realtime scheduling"),
    }
    set.is_ok()
}

/// Sets the calling thread's scheduling policy, with `SCHED_RESET_ON_FORK`.
fn set_scheduler(policy: libc::c_int, priority: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: a plain system call on the calling thread (pid 0) with a valid, initialised
    // parameter; it changes nothing but that thread's scheduling.
    match unsafe { libc::sched_setscheduler(0, policy | libc::SCHED_RESET_ON_FORK, &param) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// How long the event loop counts its rings' entries before it reconsiders its scheduling.
pub(crate) const LOOP_PRIORITY_WINDOW: std::time::Duration = std::time::Duration::from_millis(1);

/// The event loop's scheduling while realtime is permitted: normal while several committers'
/// entries wait (for the disk, or a standby's acknowledgement) and such entries are at least
/// as many as those answered at once; realtime otherwise (`buffered`, `unsafe`: the client's
/// commit waits for the loop alone; or a lone committer).
///
/// Why: a realtime loop that keeps serving holds one CPU whole. When commits wait for an
/// fdatasync or a round trip, the loop's few microseconds per commit are not what they wait
/// for, but the committers, woken together when their round completes, must all run before the
/// next round can cover them; on two CPUs they then get one. A lone committer competes with
/// nobody, and its commit waits for every hop through the loop, so it keeps the realtime loop.
/// Measured on the 2-vCPU machine, sides taking turns (the loop-priority block of
/// `bench/results/commit-changes.txt`):
/// `disk` commits against the embedded group commit at 16 clients 0.88-1.07 with this policy,
/// 0.80-0.92 with the loop always realtime, at 64 clients 0.83-0.94 against 0.75-0.89;
/// `replicated` commits of 16 clients 103-107k/s against 35-41k/s. Never realtime,
/// `buffered` commits of 64 clients fall to a third (`docs/DAEMON.md`), and a lone
/// `replicated` committer's p50 goes from 25 to 68 us. The decision is taken once per
/// [`LOOP_PRIORITY_WINDOW`] from what the window served, so the loop changes its scheduling
/// at most a thousand times a second, and keeps it through idle windows.
#[derive(Debug)]
pub(crate) struct LoopPriority {
    /// Realtime is permitted and was asked for.
    permitted: bool,
    realtime: bool,
    window: Window,
}

/// What the loop served in the current window.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: std::time::Instant,
    /// Ring entries answered at once.
    answered_at_once: u64,
    /// Ring entries sent to wait (for the disk or a standby).
    waited: u64,
    /// The most rings seen waiting at once.
    most_rings_waiting: usize,
}

impl Window {
    fn new() -> Window {
        Window {
            start: std::time::Instant::now(),
            answered_at_once: 0,
            waited: 0,
            most_rings_waiting: 0,
        }
    }

    /// The scheduling the window's entries ask for; `None` (keep what it is) for a window
    /// without entries.
    fn wants_realtime(&self) -> Option<bool> {
        if self.answered_at_once == 0 && self.waited == 0 {
            return None;
        }
        Some(self.answered_at_once > self.waited || self.most_rings_waiting < 2)
    }
}

impl LoopPriority {
    /// Asks for realtime scheduling if `wanted` (see [`become_realtime`]).
    pub(crate) fn start(wanted: bool) -> LoopPriority {
        let realtime = wanted && become_realtime("event loop");
        LoopPriority {
            permitted: realtime,
            realtime,
            window: Window::new(),
        }
    }

    /// Whether the loop runs realtime now.
    pub(crate) fn realtime(&self) -> bool {
        self.realtime
    }

    /// Counts a turn's ring entries (answered at once, sent to wait) and the rings waiting
    /// after it; at the end of a window, changes the loop's scheduling if the window asks for
    /// the other one. Returns whether it changed.
    pub(crate) fn served(
        &mut self,
        answered_at_once: u64,
        waited: u64,
        rings_waiting: usize,
    ) -> bool {
        let window = &mut self.window;
        window.answered_at_once += answered_at_once;
        window.waited += waited;
        window.most_rings_waiting = window.most_rings_waiting.max(rings_waiting);
        if !self.permitted || window.start.elapsed() < LOOP_PRIORITY_WINDOW {
            return false;
        }
        let wanted = window.wants_realtime();
        self.window = Window::new();
        match wanted {
            Some(true) if !self.realtime => {
                self.realtime = become_realtime("event loop");
                // Refused now (the permission was taken away): stop asking every window.
                self.permitted = self.realtime;
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

#[cfg(test)]
mod tests {
    use super::Window;

    fn wants(answered_at_once: u64, waited: u64, most_rings_waiting: usize) -> Option<bool> {
        Window {
            start: std::time::Instant::now(),
            answered_at_once,
            waited,
            most_rings_waiting,
        }
        .wants_realtime()
    }

    #[test]
    fn several_waiting_committers_give_up_realtime_and_idle_windows_change_nothing() {
        assert_eq!(wants(0, 0, 0), None);
        assert_eq!(wants(100, 0, 0), Some(true));
        assert_eq!(wants(0, 64, 16), Some(false));
        // A lone committer keeps realtime: nobody competes with it for the CPU.
        assert_eq!(wants(0, 64, 1), Some(true));
        // Clients appending at `buffered` and committing at `disk` are disk-bound.
        assert_eq!(wants(50, 50, 2), Some(false));
        assert_eq!(wants(51, 50, 2), Some(true));
    }
}
