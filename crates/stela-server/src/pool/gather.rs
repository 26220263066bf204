//! Gathering: when a flusher starts a log's next round under concurrent `disk` commits, and
//! when a sleeping flusher is called to look for work.
//!
//! The committers a round releases come straight back with their next commit. A flusher that
//! started the next round at once would take only the first of them; the rest would register
//! during its sync and make the round after, so the committers split into two groups taking
//! turns, each sync covering half of them (measured: 9 commits per fdatasync at 16 clients,
//! against 14 for the embedded log, whose leader gathers the same way, `stela_wal::Log`). So
//! before a round that a `disk` waiter asks for, the flusher waits until as many waiters are
//! registered as the log's previous round released, for at most half that round's write and
//! sync and at most [`GATHER_MAX`]. A lone committer (the last round released one) never
//! waits, nor does a round that something presses for: an append waiting for buffer space, a
//! drain (power failure, shutdown), a closing, failed or full log.
//!
//! Not part of the critical core (docs/DURABILITY.md): this decides only *when* a round
//! starts or a flusher looks, never which bytes are written, where, or whom a completion
//! releases (a flusher also looks by itself when its timed sleep ends). While a
//! gathering is active the log is not eligible (no other flusher starts the round) and new
//! waiters do not wake idle flushers; the gathering ends by its deadline whatever happens, so a
//! bug here can delay `disk` acknowledgements by [`GATHER_MAX`], not lose one.

use super::{Admission, LogId, LogState, Pool, State};
use crate::sync::{self, MutexGuard};
use std::time::{Duration, Instant};

/// The longest a round is held back, however long the log's last sync took.
pub const GATHER_MAX: Duration = Duration::from_millis(2);

/// A log's gathering state.
#[derive(Debug, Default)]
pub(super) struct Gathering {
    /// A flusher is holding the log's next round back.
    pub active: bool,
    /// `disk` waiters the last completed round released: the committers likely to come back.
    released: usize,
    /// When the round being written was taken, and how long the last one took.
    started: Option<Instant>,
    last_round: Duration,
}

impl Gathering {
    pub(super) fn round_started(&mut self, now: Instant) {
        self.started = Some(now);
    }

    pub(super) fn round_done(&mut self, released: usize) {
        self.released = released;
        if let Some(started) = self.started.take() {
            self.last_round = started.elapsed();
        }
    }

    /// Whether the round should wait for more committers than `waiting`.
    fn wants_more(&self, waiting: usize) -> bool {
        self.released > 1 && waiting < self.released
    }
}

impl<W> Pool<W> {
    /// Holds back the next round of the first log that wants gathering, until its committers
    /// are registered or its deadline passes. Returns at once if none does.
    pub(super) fn gather_if_due<'a>(
        &'a self,
        mut state: MutexGuard<'a, State<W>>,
    ) -> MutexGuard<'a, State<W>> {
        // Under loom there is no clock (a timed wait is untimed there) and a gathering no
        // committer completes would hang the model; gathering only delays a round.
        if cfg!(stela_loom) {
            return state;
        }
        let Some(log) = (0..state.logs.len()).find(|&log| wants_gathering(&state, log)) else {
            return state;
        };
        let gather = &mut super::log_mut(&mut state, log).gather;
        let deadline = Instant::now() + (gather.last_round / 2).min(GATHER_MAX);
        gather.active = true;
        loop {
            let now = Instant::now();
            if now >= deadline || !wants_gathering(&state, log) {
                break;
            }
            state = sync::wait_timeout(&self.gathered, state, deadline - now);
        }
        super::log_mut(&mut state, log).gather.active = false;
        state
    }

    /// Calls a sleeping flusher to look for work, unless one was called and has not looked yet
    /// (it takes what is there and calls another if more is left). Each call is a system call
    /// whether anyone sleeps or not, and the event loop makes it for every append.
    pub(super) fn wake_flusher(&self, state: &mut State<W>) {
        if state.idle_flushers > 0 && !state.flusher_called {
            state.flusher_called = true;
            self.work.notify_one();
        }
    }

    /// After a `disk` waiter registered for `entry`'s log: wakes the flusher gathering for it
    /// once the round is complete.
    pub(super) fn note_waiter(&self, entry: &LogState<W>) {
        if entry.gather.active && !entry.gather.wants_more(entry.waiters.len()) {
            self.gathered.notify_all();
        }
    }
}

/// Whether `log`'s next round should wait for committers.
fn wants_gathering<W>(state: &State<W>, log: LogId) -> bool {
    let Some(entry) = state.logs[log].as_ref() else {
        return false;
    };
    !state.space_wanted
        && state.admission == Admission::Open
        && !entry.writing
        && !entry.closing
        && entry.failure.is_none()
        && entry.disk_full.is_none()
        && entry.urgent_to > entry.durable_lsn
        && entry.gather.wants_more(entry.waiters.len())
}
