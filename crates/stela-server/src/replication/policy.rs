//! Registering a `replicated` wait with a link ([`Replication::when_received`]), and the
//! policies that answer such waits without the standby: `--degrade-after` (the standby
//! has been unreachable too long) and a promoted primary's unprotected mode (no standby holds
//! what it acknowledged since). Neither ever answers `Ok`: the answer says the record is on this
//! primary alone ([`PoolError::Unprotected`]).
//!
//! Invariants:
//! - **Counted where decided.** Every wait a policy answers is counted in the link's state
//!   (`degraded_acks`, `unprotected_acks`) and, on an unprotected node, recorded with the
//!   reprotection registry, under the same lock that decided it.
//! - **Never answered twice.** Waits are taken from the link's protection before they are
//!   answered; those that must wait after all are registered again ([`Replication::wait_again`]).

use super::protection::{Holds, Registered};
use super::{Link, LinkState, LinkWaiter, Replication, Waiter, PRUNE_PAST};
use crate::pool::{LogId, PoolError};
use crate::sync::lock;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// A policy that answers `replicated` waits without the standby.
#[derive(Clone, Copy)]
pub(super) enum Policy {
    /// `--degrade-after`: the standby has been unreachable too long.
    Degraded,
    /// A promoted primary before its old primary has rejoined.
    Unprotected,
}

impl Policy {
    /// The answer a commit this policy takes gets: never `Ok`, which would say a standby holds
    /// the record (`ErrorCode::Unprotected` on the wire).
    pub(super) fn answer(self, log: &str, lsn: u64) -> PoolError {
        PoolError::Unprotected(match self {
            Policy::Degraded => format!(
                "log {log} LSN {lsn} is on this primary alone: its standby has been unreachable past --degrade-after"
            ),
            Policy::Unprotected => format!(
                "log {log} LSN {lsn} is on this primary alone: it was promoted and no standby holds what it acknowledged since (--after-failover unprotected)"
            ),
        })
    }
}

impl Replication {
    /// Calls `waiter` once the standby holds `lsn` of `log` as `holds` asks (in memory, or
    /// synced). `Ok(true)`: it already does (the waiter is dropped uncalled).
    /// [`PoolError::Unprotected`]: a policy answered without the standby (the waiter is dropped
    /// uncalled; the record stays appended).
    pub fn when_received(
        &self,
        log: LogId,
        lsn: u64,
        holds: Holds,
        waiter: Waiter,
        decided: Option<Arc<AtomicBool>>,
    ) -> Result<bool, PoolError> {
        let Some(link) = lock(&self.links).get(&log).cloned() else {
            return Err(PoolError::Closed);
        };
        let waiting = link.protection.waiting();
        if waiting >= PRUNE_PAST && waiting.is_power_of_two() {
            let dropped = link.protection.prune(|w| !w.decided());
            tracing::debug!(log = %link.name, standby = %self.standby, dropped, "dropped waits decided without this standby");
        }
        let waiter = LinkWaiter {
            tell: waiter,
            decided,
        };
        // Policies that answer without the standby: `--degrade-after` while it is unreachable,
        // and a promoted primary whose old primary has not rejoined (unprotected). Asked under
        // the protection's lock, so a wait never slips past the moment a policy ends or begins.
        // The unprotected policy is asked of `Reprotection`, which records the LSN under the
        // same lock that ends unprotected mode.
        let policy = std::cell::Cell::new(None);
        let answer_now = || {
            let mut state = lock(&link.state);
            if state.degraded {
                self.count_degraded(&link, &mut state, 1, lsn);
                policy.set(Some(Policy::Degraded));
                return true;
            }
            if !state.connected && self.reprotection.acknowledge_alone(&link.name, lsn) {
                state.unprotected_acks += 1;
                policy.set(Some(Policy::Unprotected));
                return true;
            }
            false
        };
        match link.protection.wait(lsn, holds, waiter, answer_now) {
            Registered::Waiting => Ok(false),
            Registered::Already(_) => match policy.get() {
                Some(policy) => Err(policy.answer(&link.name, lsn)),
                None => Ok(true),
            },
            Registered::Fenced(_, why) => Err(PoolError::InDoubt(why)),
        }
    }

    /// `--degrade-after`: once the standby has been unreachable that long, answers every
    /// `replicated` waiter (the records stay in this primary's buffers: `buffered`'s promise) and
    /// every later one at once, loudly, until the standby is back.
    pub(super) fn degrade_if_due(&self, link: &Link) {
        let Some(after) = self.degrade_after else {
            return;
        };
        {
            let mut state = lock(&link.state);
            let due = state
                .unreachable_since
                .is_some_and(|t| t.elapsed() >= after);
            if !due || state.degraded {
                return;
            }
            state.degraded = true;
        }
        // Waits registered before the flag was set are answered here; later ones see it.
        let waiting = self.answer_all_without_standby(link, Policy::Degraded);
        tracing::error!(log = %link.name, standby = %self.standby, after_ms = after.as_millis() as u64, waiting,
            "standby unreachable too long: replicated commits are acknowledged WITHOUT it (as buffered) until it is back");
    }

    /// The degrade policy acknowledged `answered` commits of `link` without the standby, the
    /// highest at `through`: counted for `stela status`, and on a promoted node not yet
    /// protected again also recorded as acknowledged alone (the policy answers either way).
    /// Called under the link's state lock, which is taken before the registry's.
    pub(super) fn count_degraded(
        &self,
        link: &Link,
        state: &mut LinkState,
        answered: u64,
        through: u64,
    ) {
        debug_assert!(
            state.degraded,
            "only the degrade policy counts degraded answers"
        );
        state.count_degraded(answered, through);
        self.reprotection.acknowledge_alone(&link.name, through);
    }

    /// Answers every registered wait of `link` without the standby, as `policy` does
    /// ([`PoolError::Unprotected`], never `Ok`), and counts them as its acknowledgements.
    /// Returns how many it answered.
    pub(super) fn answer_all_without_standby(&self, link: &Link, policy: Policy) -> usize {
        let waiters = link.protection.take_all();
        if waiters.is_empty() {
            return 0;
        }
        let highest = waiters.iter().map(|&(lsn, _, _)| lsn).max().unwrap_or(0);
        if let Policy::Unprotected = policy {
            if !self.reprotection.acknowledge_alone(&link.name, highest) {
                // The node was protected again since the caller looked (the other logs'
                // standbys confirmed, and this log's had before its session ended): these
                // commits wait for the standby, as every commit of a protected node does.
                self.wait_again(link, waiters);
                return 0;
            }
        }
        let answered = waiters.len();
        {
            let mut state = lock(&link.state);
            match policy {
                Policy::Degraded => self.count_degraded(link, &mut state, answered as u64, highest),
                Policy::Unprotected => state.unprotected_acks += answered as u64,
            }
        }
        for (lsn, _, waiter) in waiters {
            waiter.call(Err(policy.answer(&link.name, lsn)));
        }
        (self.released)();
        answered
    }

    /// Registers `waiters`, taken from `link`, again: each waits for the standby (or is
    /// answered now if it already holds the LSN, or the log was fenced meanwhile).
    fn wait_again(&self, link: &Link, waiters: Vec<(u64, Holds, LinkWaiter)>) {
        let mut any = false;
        for (lsn, holds, waiter) in waiters {
            match link.protection.wait(lsn, holds, waiter, || false) {
                Registered::Waiting => {}
                Registered::Already(waiter) => {
                    waiter.call(Ok(()));
                    any = true;
                }
                Registered::Fenced(waiter, why) => {
                    waiter.call(Err(PoolError::InDoubt(why)));
                    any = true;
                }
            }
        }
        if any {
            (self.released)();
        }
    }

    /// The session ended while the node is unprotected (promoted, and not every log's standby
    /// has confirmed holding what the log acknowledged alone): the waits registered while the
    /// standby was connected are answered now, as the unprotected policy answers new ones
    /// (`when_received`). Without this, an old primary that answered the handshake and then
    /// exited (stepping down) left them waiting for a standby that was gone. `connected` is
    /// cleared before: a wait registered from then on is answered at once, one registered
    /// before is taken here.
    pub(super) fn answer_unprotected(&self, link: &Link) {
        if !self.node.unprotected() {
            return;
        }
        let waiting = self.answer_all_without_standby(link, Policy::Unprotected);
        if waiting > 0 {
            tracing::warn!(log = %link.name, standby = %self.standby, waiting,
                "the standby left before confirming its rejoin: replicated commits acknowledged WITHOUT it (unprotected)");
        }
    }
}
