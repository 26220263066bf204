//! The checkers, run after every step of a simulation. They look at every answer a client got
//! and at every node's state:
//! - one primary per term, ever;
//! - the newest term seen by a node never goes down, across restarts too;
//! - every record answered `Ok` or `Kept` is in the log of the primary of the newest term
//!   (whenever that node is up as primary), and every record answered `Lost` is not;
//! - a cut removes only records the primary does not hold there, and keeps all it does (so a
//!   stream's first shipment starts no lower than where the two logs part: one that started
//!   lower would cut records the primary holds);
//! - a restarted node keeps every synced record (damage is refused, never cut).

use super::client::{Answer, Answered};
use crate::log::{Log, Lsn, Record, Term};
use crate::msg::NodeId;
use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct Checker {
    /// Records answered `Ok` or `Kept`, with the answer.
    must_hold: Vec<(Record, Answer)>,
    must_not: Vec<Record>,
    primaries: HashMap<Term, NodeId>,
    newest: Term,
    promised: HashMap<NodeId, Term>,
    /// The primary last checked against `must_hold`, and how far.
    checked: Option<(NodeId, Term, usize)>,
    /// Every resolution given, to catch one record resolved both ways.
    resolved: HashMap<Record, Answer>,
}

pub type Verdict = Result<(), String>;

impl Checker {
    pub fn answer(&mut self, answered: &Answered) -> Verdict {
        let record = Record {
            term: answered.term,
            lsn: answered.lsn,
            payload: answered.payload,
        };
        if matches!(answered.answer, Answer::Kept | Answer::Lost) {
            let first = *self.resolved.entry(record).or_insert(answered.answer);
            if first != answered.answer {
                return Err(format!(
                    "{record:?} resolved {first:?}, then {:?}",
                    answered.answer
                ));
            }
        }
        match answered.answer {
            Answer::Ok | Answer::Kept => self.must_hold.push((record, answered.answer)),
            Answer::Lost => self.must_not.push(record),
            Answer::Unprotected | Answer::InDoubt | Answer::Unknown => {}
        }
        Ok(())
    }

    /// Checks one node's term and role.
    pub fn node(&mut self, id: NodeId, promised: Term, primary: Option<Term>) -> Verdict {
        let before = self.promised.entry(id).or_default();
        if promised < *before {
            return Err(format!(
                "node {id}'s newest term went down from {} to {}",
                before.0, promised.0
            ));
        }
        *before = promised;
        if let Some(term) = primary {
            let holder = *self.primaries.entry(term).or_insert(id);
            if holder != id {
                return Err(format!(
                    "two primaries of term {}: nodes {holder} and {id}",
                    term.0
                ));
            }
            self.newest = self.newest.max(term);
        }
        Ok(())
    }

    /// Checks the log of `id`, primary of `term`, if that is the newest term ever held.
    pub fn primary_log(&mut self, id: NodeId, term: Term, log: &Log) -> Verdict {
        if term != self.newest {
            return Ok(());
        }
        let from = match self.checked {
            Some((node, t, upto)) if (node, t) == (id, term) => upto,
            _ => 0,
        };
        for (record, answer) in &self.must_hold[from..] {
            if log.get(record.lsn) != Some(record) {
                return Err(format!("{record:?}, answered {answer:?}, is not in the log of node {id}, primary of term {}: found {:?}", term.0, log.get(record.lsn)));
            }
        }
        self.checked = Some((id, term, self.must_hold.len()));
        for record in &self.must_not {
            if log.get(record.lsn) == Some(record) {
                return Err(format!(
                    "{record:?}, resolved Lost, is in the log of node {id}, primary of term {}",
                    term.0
                ));
            }
        }
        Ok(())
    }

    /// Checks a cut a standby made on its primary's word: everything kept is the primary's,
    /// the first record cut is not.
    pub fn cut(standby: &Log, keep: Lsn, salvage: &[Record], primary: &Log) -> Verdict {
        for record in standby.records().iter().take(keep as usize) {
            if primary.get(record.lsn) != Some(record) {
                return Err(format!(
                    "a cut at {keep} kept {record:?}, which the primary does not hold"
                ));
            }
        }
        if let Some(first) = salvage.first() {
            if primary.get(first.lsn) == Some(first) {
                return Err(format!("a cut at {keep} removed {first:?}, which the primary holds: it had not diverged"));
            }
        }
        Ok(())
    }

    /// The primary of the newest term holds every record answered `Ok` or `Kept`.
    pub fn holds_all(&self, id: NodeId, term: Term, log: &Log) -> Verdict {
        if term != self.newest {
            return Err(format!(
                "node {id}, primary of term {} at the end, is not the newest primary (term {})",
                term.0, self.newest.0
            ));
        }
        match self
            .must_hold
            .iter()
            .find(|(r, _)| log.get(r.lsn) != Some(r))
        {
            Some((r, answer)) => Err(format!(
                "at the end, {r:?}, answered {answer:?}, is not in the primary's log"
            )),
            None => Ok(()),
        }
    }

    /// At the end: every live node's log is a prefix of the primary's.
    pub fn converged(id: NodeId, log: &Log, primary: &Log) -> Verdict {
        for record in log.records() {
            if primary.get(record.lsn) != Some(record) {
                return Err(format!(
                    "after healing, node {id} holds {record:?}, which the primary does not"
                ));
            }
        }
        Ok(())
    }
}
