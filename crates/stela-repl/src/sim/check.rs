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

/// What a checker found wrong: the run fails with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("{record:?} resolved {first:?}, then {then:?}")]
    ResolvedBothWays {
        record: Record,
        first: Answer,
        then: Answer,
    },
    #[error("node {node}'s newest term went down from {from:?} to {to:?}")]
    TermWentDown { node: NodeId, from: Term, to: Term },
    #[error("two primaries of {term:?}: nodes {first} and {second}")]
    TwoPrimaries {
        term: Term,
        first: NodeId,
        second: NodeId,
    },
    #[error("{record:?}, answered {answer:?}, is not in the log of node {node}, primary of {term:?}: found {found:?}")]
    Missing {
        record: Record,
        answer: Answer,
        node: NodeId,
        term: Term,
        found: Option<Record>,
    },
    #[error("{record:?}, resolved Lost, is in the log of node {node}, primary of {term:?}")]
    LostPresent {
        record: Record,
        node: NodeId,
        term: Term,
    },
    #[error("a cut at {keep} kept {record:?}, which the primary does not hold")]
    CutKeptForeign { keep: Lsn, record: Record },
    #[error("a cut at {keep} removed {record:?}, which the primary holds: it had not diverged")]
    CutAgreeing { keep: Lsn, record: Record },
    #[error("node {node}, primary of {term:?} at the end, is not the newest primary ({newest:?})")]
    StalePrimaryAtEnd {
        node: NodeId,
        term: Term,
        newest: Term,
    },
    #[error("after healing, node {node} holds {record:?}, which the primary does not")]
    NotConverged { node: NodeId, record: Record },
    #[error("no primary {heal_ms} ms after every fault healed")]
    NoPrimary { heal_ms: u64 },
    #[error("node {node} restarted without its synced record {lsn}")]
    SyncedRecordDropped { node: NodeId, lsn: Lsn },
}

pub type Verdict = Result<(), Violation>;

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
                let then = answered.answer;
                return Err(Violation::ResolvedBothWays {
                    record,
                    first,
                    then,
                });
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
            let (node, from, to) = (id, *before, promised);
            return Err(Violation::TermWentDown { node, from, to });
        }
        *before = promised;
        if let Some(term) = primary {
            let holder = *self.primaries.entry(term).or_insert(id);
            if holder != id {
                return Err(Violation::TwoPrimaries {
                    term,
                    first: holder,
                    second: id,
                });
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
                let (record, answer, found) = (*record, *answer, log.get(record.lsn).copied());
                return Err(Violation::Missing {
                    record,
                    answer,
                    node: id,
                    term,
                    found,
                });
            }
        }
        self.checked = Some((id, term, self.must_hold.len()));
        for record in &self.must_not {
            if log.get(record.lsn) == Some(record) {
                return Err(Violation::LostPresent {
                    record: *record,
                    node: id,
                    term,
                });
            }
        }
        Ok(())
    }

    /// Checks a cut a standby made on its primary's word: everything kept is the primary's,
    /// the first record cut is not.
    pub fn cut(standby: &Log, keep: Lsn, salvage: &[Record], primary: &Log) -> Verdict {
        for record in standby.records().iter().take(keep as usize) {
            if primary.get(record.lsn) != Some(record) {
                return Err(Violation::CutKeptForeign {
                    keep,
                    record: *record,
                });
            }
        }
        if let Some(first) = salvage.first() {
            if primary.get(first.lsn) == Some(first) {
                return Err(Violation::CutAgreeing {
                    keep,
                    record: *first,
                });
            }
        }
        Ok(())
    }

    /// The primary of the newest term holds every record answered `Ok` or `Kept`.
    pub fn holds_all(&self, id: NodeId, term: Term, log: &Log) -> Verdict {
        if term != self.newest {
            let newest = self.newest;
            return Err(Violation::StalePrimaryAtEnd {
                node: id,
                term,
                newest,
            });
        }
        match self
            .must_hold
            .iter()
            .find(|(r, _)| log.get(r.lsn) != Some(r))
        {
            Some(&(record, answer)) => {
                let found = log.get(record.lsn).copied();
                Err(Violation::Missing {
                    record,
                    answer,
                    node: id,
                    term,
                    found,
                })
            }
            None => Ok(()),
        }
    }

    /// At the end: every live node's log is a prefix of the primary's.
    pub fn converged(id: NodeId, log: &Log, primary: &Log) -> Verdict {
        for record in log.records() {
            if primary.get(record.lsn) != Some(record) {
                return Err(Violation::NotConverged {
                    node: id,
                    record: *record,
                });
            }
        }
        Ok(())
    }
}
