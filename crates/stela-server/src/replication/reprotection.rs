//! When a promoted primary is protected again. While it is unprotected (promoted, and its old
//! primary not yet back as its standby) `replicated` commits of a log whose standby is not
//! connected are acknowledged from this node alone; "protected" must mean that losing this node
//! now loses no acknowledged record, so the node leaves unprotected mode only once the standby
//! of *every* log holds what that log acknowledged alone. This module keeps, per log, what was
//! acknowledged alone and what the log's standby has confirmed holding, and ends unprotected
//! mode ([`crate::cluster::Node::protected_again`]) when nothing is left unconfirmed.
//!
//! The rule. A log *counts* while it is open for shipping (it has a link) or once it has
//! acknowledged anything alone (even closed: those records are still on this node alone). What
//! a log *owes* its standby: every LSN it acknowledged alone and, while it is open, every record
//! it held when it was opened on the unprotected node. Those may be on this node alone too: the
//! old primary acknowledged them at `replicated` once this node held them, but it may come back
//! without them (a power cut took what it had not synced, or its disk was restored from an older
//! copy), and no other node has them. A log is *confirmed* once its standby holds what it owes:
//! as the standby's position at a stream's handshake (an idle log ships nothing, so no
//! acknowledgement ever comes for it) or as an acknowledgement since. A log whose standby has
//! not connected is not confirmed: its commits are acknowledged alone for as long as the node is
//! unprotected. A promoted node opens every log of its directory for shipping
//! (`Engine::ship_every_log`), so every log it holds owes its records; one that cannot be
//! opened is logged and not counted. What a log held at its opening is owed only while it is
//! open: a log closed (deleted, or it failed) is not shipped, so its standby could never
//! confirm it.
//! Acknowledging alone after a confirmation raises the log's mark above what its standby
//! confirmed, so the log is unconfirmed again. The node is protected again once every log that
//! counts is confirmed *and* some standby has acknowledged something since the promotion: a
//! handshake alone never ends unprotected mode (an old primary stepping down can answer one and
//! exit, and `replicated` commits would then wait for a standby that is gone).
//!
//! Invariants:
//! - **Nothing acknowledged alone is forgotten while unprotected.** The marks are keyed by the
//!   log's name, not kept in its link: a log closed and reopened keeps its mark and what its
//!   standby confirmed. Only deleting the log forgets them (its records are gone from this node
//!   too). Once the node is protected again nothing here is read: a node is promoted at most
//!   once in its life, so it never becomes unprotected again.
//! - **No record is acknowledged alone once the node reads as protected.** Acknowledging alone
//!   ([`Reprotection::acknowledge_alone`]) and ending unprotected mode both happen under this
//!   registry's lock, and the former asks the node's state under it; a log opened meanwhile is
//!   registered under the same lock, so it is counted or the node is already protected.
//! - **Taken last.** This lock is taken under a link's protection and state locks (a wait's
//!   policy), under the links map and a link's `acks` lock; under it nothing is taken, only the
//!   node's atomics are read and written. So it never inverts an order or blocks an
//!   acknowledgement behind shipping.

use crate::cluster::Node;
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The per-log marks, and the node's switch back to protected.
pub(super) struct Reprotection {
    node: Arc<Node>,
    ledger: Mutex<Ledger>,
}

impl Reprotection {
    pub(super) fn new(node: Arc<Node>) -> Reprotection {
        Reprotection {
            node,
            ledger: Mutex::new(Ledger::default()),
        }
    }

    /// `log` is open for shipping (its link was created, again or for the first time) and its
    /// last record is `end`. On an unprotected node those records are owed to its standby.
    pub(super) fn log_opened(&self, log: &str, end: u64) {
        let mut ledger = lock(&self.ledger);
        let held = if self.node.unprotected() { end } else { 0 };
        ledger.opened(log, held);
    }

    /// `log` is no longer shipped (closed): what it acknowledged alone is kept.
    pub(super) fn log_closed(&self, log: &str) {
        let mut ledger = lock(&self.ledger);
        ledger.closed(log);
        self.end_if_confirmed(&ledger);
    }

    /// `log` was deleted: its records are gone from this node, nothing of it is owed any more.
    pub(super) fn log_deleted(&self, log: &str) {
        let mut ledger = lock(&self.ledger);
        ledger.deleted(log);
        self.end_if_confirmed(&ledger);
    }

    /// Whether a `replicated` commit of `log` at `lsn` is acknowledged without a standby (the
    /// node is unprotected); if so, it is recorded. The caller knows the log's standby does not
    /// hold it: it is not connected, or `--degrade-after` answers for it (which answers either
    /// way; recorded, the node stays unprotected until the standby holds it). Protected, this
    /// costs one atomic load (a node is protected again for good).
    pub(super) fn acknowledge_alone(&self, log: &str, lsn: u64) -> bool {
        if !self.node.unprotected() {
            return false;
        }
        let mut ledger = lock(&self.ledger);
        if !self.node.unprotected() {
            return false;
        }
        ledger.acknowledged_alone(log, lsn);
        true
    }

    /// `log`'s standby answered a stream's handshake holding every record up to `holds` (as
    /// this node has them: what diverged is cut first).
    pub(super) fn standby_connected(&self, log: &str, holds: u64) {
        if !self.node.unprotected() {
            return;
        }
        let mut ledger = lock(&self.ledger);
        ledger.standby_connected(log, holds);
        self.end_if_confirmed(&ledger);
    }

    /// `log`'s standby acknowledged holding `received`. Protected, this costs one atomic load
    /// (it runs for every acknowledgement).
    pub(super) fn standby_acknowledged(&self, log: &str, received: u64) {
        if !self.node.unprotected() {
            return;
        }
        let mut ledger = lock(&self.ledger);
        ledger.standby_acknowledged(log, received);
        self.end_if_confirmed(&ledger);
    }

    /// Called under the ledger's lock, so that no record is acknowledged alone, and no log
    /// registered, between the check and the switch.
    fn end_if_confirmed(&self, ledger: &Ledger) {
        if self.node.unprotected() && ledger.all_confirmed() {
            self.node.protected_again();
        }
    }
}

/// What each log owes its standby while the node is unprotected (the rule is in the module's
/// comment). Plain data, so that the rule can be tested on its own.
#[derive(Default)]
pub(super) struct Ledger {
    logs: HashMap<String, Owed>,
    /// A standby has acknowledged something since the promotion (it is back, not only
    /// answering a handshake).
    any_acknowledgement: bool,
}

#[derive(Default)]
struct Owed {
    /// The log has a link (it is shipped, and acknowledges alone while its standby is away).
    open: bool,
    /// The highest LSN acknowledged at `replicated` without a standby (0: none).
    alone_through: u64,
    /// The last LSN the log held when it was opened on the unprotected node (0: none, or
    /// opened on a protected node); owed while the log is open.
    held_at_open: u64,
    /// The highest LSN the log's standby has shown it holds, at a handshake (its copy's end) or
    /// in an acknowledgement; `None` while it never answered.
    standby_holds: Option<u64>,
}

impl Owed {
    fn counts(&self) -> bool {
        self.open || self.alone_through > 0
    }

    /// The highest LSN the log's standby must hold.
    fn owed_through(&self) -> u64 {
        if self.open {
            self.alone_through.max(self.held_at_open)
        } else {
            self.alone_through
        }
    }

    fn confirmed(&self) -> bool {
        self.standby_holds
            .is_some_and(|held| held >= self.owed_through())
    }
}

impl Ledger {
    fn entry(&mut self, log: &str) -> &mut Owed {
        self.logs.entry(log.to_owned()).or_default()
    }

    /// `held`: the log's last LSN if it is opened on the unprotected node, else 0.
    pub(super) fn opened(&mut self, log: &str, held: u64) {
        let owed = self.entry(log);
        owed.open = true;
        owed.held_at_open = owed.held_at_open.max(held);
    }

    pub(super) fn closed(&mut self, log: &str) {
        if let Some(owed) = self.logs.get_mut(log) {
            owed.open = false;
            owed.held_at_open = 0;
            if !owed.counts() {
                self.logs.remove(log);
            }
        }
    }

    /// A log created again under the name since the delete (it is open) keeps the entry: what
    /// it holds cannot be told from the deleted log's, and keeping it errs on the side of
    /// staying unprotected.
    pub(super) fn deleted(&mut self, log: &str) {
        if self.logs.get(log).is_some_and(|owed| !owed.open) {
            self.logs.remove(log);
        }
    }

    pub(super) fn acknowledged_alone(&mut self, log: &str, lsn: u64) {
        let owed = self.entry(log);
        owed.alone_through = owed.alone_through.max(lsn);
    }

    pub(super) fn standby_connected(&mut self, log: &str, holds: u64) {
        let held = self.entry(log).standby_holds.get_or_insert(0);
        *held = (*held).max(holds);
    }

    pub(super) fn standby_acknowledged(&mut self, log: &str, received: u64) {
        self.any_acknowledgement = true;
        let held = self.entry(log).standby_holds.get_or_insert(0);
        *held = (*held).max(received);
    }

    /// Every log that counts is confirmed, and a standby has acknowledged something.
    pub(super) fn all_confirmed(&self) -> bool {
        self.any_acknowledgement
            && self
                .logs
                .values()
                .all(|owed| !owed.counts() || owed.confirmed())
    }
}

#[cfg(test)]
mod tests {
    use super::Ledger;

    /// Two logs acknowledged alone: the first one's standby catching up is not enough.
    #[test]
    fn every_log_that_acknowledged_alone_must_be_confirmed() {
        let mut ledger = Ledger::default();
        ledger.opened("ledger", 0);
        ledger.opened("audit", 0);
        ledger.acknowledged_alone("ledger", 500);
        ledger.acknowledged_alone("audit", 20);
        ledger.standby_connected("audit", 0);
        ledger.standby_connected("ledger", 0);
        ledger.standby_acknowledged("audit", 20);
        assert!(
            !ledger.all_confirmed(),
            "ledger's standby holds nothing yet"
        );
        ledger.standby_acknowledged("ledger", 499);
        assert!(!ledger.all_confirmed(), "ledger's standby lacks LSN 500");
        ledger.standby_acknowledged("ledger", 500);
        assert!(ledger.all_confirmed());
    }

    /// A log that acknowledged nothing alone counts once its standby answered a handshake; one
    /// whose standby never connected does not, whatever the other logs' standbys hold.
    #[test]
    fn an_idle_log_is_confirmed_by_its_standby_connecting_not_before() {
        let mut ledger = Ledger::default();
        ledger.opened("ledger", 0);
        ledger.opened("idle", 0);
        ledger.acknowledged_alone("ledger", 10);
        ledger.standby_connected("ledger", 0);
        ledger.standby_acknowledged("ledger", 10);
        assert!(!ledger.all_confirmed(), "idle's standby never connected");
        ledger.standby_connected("idle", 0);
        assert!(ledger.all_confirmed());
    }

    /// A handshake alone never ends unprotected mode: some standby must have acknowledged.
    #[test]
    fn handshakes_alone_confirm_nothing() {
        let mut ledger = Ledger::default();
        ledger.opened("idle", 0);
        ledger.standby_connected("idle", 0);
        assert!(!ledger.all_confirmed());
        ledger.standby_acknowledged("idle", 0);
        assert!(ledger.all_confirmed());
    }

    /// A log closed and reopened keeps what it acknowledged alone: its new standby stream must
    /// still bring it to that LSN.
    #[test]
    fn a_reopened_log_keeps_what_it_acknowledged_alone() {
        let mut ledger = Ledger::default();
        ledger.opened("ledger", 0);
        ledger.opened("other", 0);
        ledger.acknowledged_alone("ledger", 300);
        ledger.closed("ledger");
        ledger.standby_connected("other", 0);
        ledger.standby_acknowledged("other", 0);
        assert!(!ledger.all_confirmed(), "closed, ledger still owes 300");
        ledger.opened("ledger", 0);
        ledger.standby_connected("ledger", 0);
        ledger.standby_acknowledged("ledger", 1);
        assert!(!ledger.all_confirmed(), "reopened, ledger still owes 300");
        ledger.standby_acknowledged("ledger", 300);
        assert!(ledger.all_confirmed());
    }

    /// A log closed having acknowledged nothing alone owes nothing; a deleted log owes nothing.
    #[test]
    fn closing_an_idle_log_or_deleting_one_leaves_nothing_owed() {
        let mut ledger = Ledger::default();
        ledger.opened("ledger", 0);
        ledger.opened("idle", 0);
        ledger.opened("gone", 0);
        ledger.acknowledged_alone("ledger", 5);
        ledger.acknowledged_alone("gone", 7);
        ledger.standby_connected("ledger", 0);
        ledger.standby_acknowledged("ledger", 5);
        assert!(!ledger.all_confirmed());
        ledger.closed("idle");
        ledger.closed("gone");
        assert!(
            !ledger.all_confirmed(),
            "gone's records are still on this node alone"
        );
        ledger.deleted("gone");
        assert!(ledger.all_confirmed());
    }

    /// A log opened on the unprotected node owes what it held then, even if it acknowledges
    /// nothing alone: a standby that comes back without those records (a power cut, an older
    /// copy) confirms it only once it holds them; one that has them confirms it at its
    /// handshake.
    #[test]
    fn a_log_owes_what_it_held_when_opened_on_the_unprotected_node() {
        let mut ledger = Ledger::default();
        ledger.opened("short", 400);
        ledger.opened("whole", 90);
        ledger.standby_connected("short", 250);
        ledger.standby_connected("whole", 90);
        ledger.standby_acknowledged("short", 399);
        assert!(!ledger.all_confirmed(), "short's standby lacks LSN 400");
        ledger.standby_acknowledged("short", 400);
        assert!(ledger.all_confirmed());
    }

    /// What a log held at its opening is owed while it is open (shipped); closed, only what it
    /// acknowledged alone is, and reopened it owes what it holds then.
    #[test]
    fn what_a_log_held_at_opening_is_owed_while_it_is_open() {
        let mut ledger = Ledger::default();
        ledger.opened("ledger", 40);
        ledger.opened("other", 0);
        ledger.standby_connected("other", 0);
        ledger.standby_acknowledged("other", 0);
        assert!(!ledger.all_confirmed(), "ledger's standby never connected");
        ledger.closed("ledger");
        assert!(
            ledger.all_confirmed(),
            "closed, ledger owes nothing it acknowledged alone"
        );
        ledger.opened("ledger", 55);
        ledger.standby_connected("ledger", 40);
        assert!(!ledger.all_confirmed(), "reopened, ledger owes 55");
        ledger.standby_acknowledged("ledger", 55);
        assert!(ledger.all_confirmed());
    }

    /// The standby of a confirmed log leaves and the log acknowledges alone again: it is
    /// unconfirmed until its standby holds the new mark.
    #[test]
    fn acknowledging_alone_after_a_confirmation_unconfirms_the_log() {
        let mut ledger = Ledger::default();
        ledger.opened("ledger", 0);
        ledger.acknowledged_alone("ledger", 10);
        ledger.standby_connected("ledger", 0);
        ledger.standby_acknowledged("ledger", 10);
        assert!(ledger.all_confirmed());
        ledger.acknowledged_alone("ledger", 11);
        assert!(!ledger.all_confirmed());
        ledger.standby_acknowledged("ledger", 11);
        assert!(ledger.all_confirmed());
    }
}
