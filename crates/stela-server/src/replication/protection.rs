//! Commit protection for one log: the `replicated` waiters, what the standby has acknowledged,
//! and whether this log is fenced (a newer term exists, or this node stepped down). Kept apart
//! from the shipping so that `tests/loom_protection.rs` can run every interleaving of a commit,
//! the standby's acknowledgement, a term change and the degrade policy against this code.
//!
//! Invariants:
//! - **Every waiter is answered exactly once**: registered waiters are handed back by exactly
//!   one of [`Protection::acknowledged`], [`Protection::fence`] or [`Protection::take_all`]; a
//!   waiter that cannot wait is handed back at once by [`Protection::wait`]. The one
//!   exception is [`Protection::prune`], which drops, uncalled, only the waiters its caller
//!   says nobody needs (a commit waiting on several standbys that K others already answered). None is left
//!   behind by a race with a fence: the fence and the registration take the same lock.
//! - **`Ok` only for what the standby holds**: [`Protection::acknowledged`] releases exactly
//!   the waiters at or below the received LSN it was given (at or below the durable LSN for a
//!   wait that needs the standby's disk, `all`); neither LSN ever goes down.
//! - **No wait begins on a fenced log**: after [`Protection::fence`] every new wait above the
//!   received LSN is refused with the fence's reason (the first one is kept).
//!
//! Waiters are handed back, never called here, so that no waiter runs under the lock.

use crate::sync::{lock, Mutex};

/// One log's commit protection. `W` is who to tell (a closure in the daemon).
pub struct Protection<W> {
    state: Mutex<State<W>>,
}

struct State<W> {
    received: u64,
    durable: u64,
    waiters: Vec<(u64, Holds, W)>,
    fenced: Option<String>,
}

/// What a wait needs of the standby: the record in its memory (`replicated`) or synced on its
/// disk (`all`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    Received,
    Durable,
}

impl<W> State<W> {
    /// Whether the standby holds `lsn` as `holds` asks.
    fn holds(&self, lsn: u64, holds: Holds) -> bool {
        match holds {
            Holds::Received => self.received >= lsn,
            Holds::Durable => self.durable >= lsn,
        }
    }
}

/// What became of a wait.
pub enum Registered<W> {
    /// It waits for the standby; it is handed back later.
    Waiting,
    /// The standby already holds the LSN (or the policy answered it): answer `Ok` now.
    Already(W),
    /// The log is fenced: answer with this reason now.
    Fenced(W, String),
}

impl<W> Default for Protection<W> {
    fn default() -> Self {
        Protection::new()
    }
}

impl<W> Protection<W> {
    pub fn new() -> Protection<W> {
        Protection {
            state: Mutex::new(State {
                received: 0,
                durable: 0,
                waiters: Vec::new(),
                fenced: None,
            }),
        }
    }

    /// Registers `waiter` for `lsn`. `answer_now` is asked, under the lock and only when the
    /// standby does not hold `lsn` yet and the log is not fenced, whether a policy answers the
    /// wait without the standby (degraded, unprotected after a failover); it counts what it
    /// answers.
    pub fn wait(
        &self,
        lsn: u64,
        holds: Holds,
        waiter: W,
        answer_now: impl FnOnce() -> bool,
    ) -> Registered<W> {
        let mut state = lock(&self.state);
        if state.holds(lsn, holds) {
            return Registered::Already(waiter);
        }
        if let Some(why) = &state.fenced {
            return Registered::Fenced(waiter, why.clone());
        }
        if answer_now() {
            return Registered::Already(waiter);
        }
        state.waiters.push((lsn, holds, waiter));
        Registered::Waiting
    }

    /// The standby holds `received` in memory and `durable` on disk: hands back the waiters
    /// that satisfies.
    pub fn acknowledged(&self, received: u64, durable: u64) -> Vec<W> {
        let mut state = lock(&self.state);
        state.received = state.received.max(received);
        state.durable = state.durable.max(durable);
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut state.waiters)
            .into_iter()
            .partition(|&(lsn, holds, _)| state.holds(lsn, holds));
        state.waiters = waiting;
        ready.into_iter().map(|(_, _, waiter)| waiter).collect()
    }

    /// No acknowledgement can come any more (`why`): hands back every waiter, to be told its
    /// commit is in doubt, and refuses later waits. The first reason is kept.
    pub fn fence(&self, why: String) -> Vec<W> {
        let mut state = lock(&self.state);
        state.fenced.get_or_insert(why);
        std::mem::take(&mut state.waiters)
            .into_iter()
            .map(|(_, _, waiter)| waiter)
            .collect()
    }

    /// Hands back every waiter, with the LSN it waits for and what it needs, without fencing
    /// (a policy answers them without the standby, or the log closed).
    pub fn take_all(&self) -> Vec<(u64, Holds, W)> {
        std::mem::take(&mut lock(&self.state).waiters)
    }

    /// Drops the waits `keep` says no one needs any more (decided without this standby),
    /// uncalled; returns how many.
    pub fn prune(&self, keep: impl Fn(&W) -> bool) -> usize {
        let mut state = lock(&self.state);
        let before = state.waiters.len();
        state.waiters.retain(|(_, _, waiter)| keep(waiter));
        before - state.waiters.len()
    }

    /// What the standby acknowledged: (received, durable).
    pub fn acknowledged_lsns(&self) -> (u64, u64) {
        let state = lock(&self.state);
        (state.received, state.durable)
    }

    /// Why the log is fenced, if it is.
    pub fn fenced(&self) -> Option<String> {
        lock(&self.state).fenced.clone()
    }

    /// How many waits are registered.
    pub fn waiting(&self) -> usize {
        lock(&self.state).waiters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `all` waits for the standby's disk: an acknowledgement that it holds the record in
    /// memory releases `replicated` waits only.
    #[test]
    fn a_durable_wait_is_released_by_the_standby_sync_only() {
        let protection: Protection<&str> = Protection::new();
        assert!(matches!(
            protection.wait(5, Holds::Received, "replicated", || false),
            Registered::Waiting
        ));
        assert!(matches!(
            protection.wait(5, Holds::Durable, "all", || false),
            Registered::Waiting
        ));
        assert_eq!(protection.acknowledged(5, 4), vec!["replicated"]);
        assert!(matches!(
            protection.wait(5, Holds::Received, "again", || false),
            Registered::Already("again")
        ));
        assert_eq!(protection.acknowledged(5, 5), vec!["all"]);
        assert!(matches!(
            protection.wait(5, Holds::Durable, "late", || false),
            Registered::Already("late")
        ));
    }

    #[test]
    fn pruning_drops_only_what_the_caller_says_nobody_needs() {
        let protection: Protection<(u64, bool)> = Protection::new();
        for lsn in 1..=4 {
            let _ = protection.wait(lsn, Holds::Received, (lsn, lsn % 2 == 0), || false);
        }
        assert_eq!(protection.prune(|&(_, decided)| !decided), 2);
        assert_eq!(protection.waiting(), 2);
        let released: Vec<u64> = protection
            .acknowledged(4, 0)
            .into_iter()
            .map(|(l, _)| l)
            .collect();
        assert_eq!(released, vec![1, 3]);
    }
}
