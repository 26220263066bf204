//! A node's log as the replication rules see it: records labelled with the term that wrote
//! them, the term history those labels make, where two logs stop agreeing, and what became of
//! a record a client asks about.
//!
//! Invariants (asserted by [`Log::push`] and the property tests below):
//! - LSNs are dense from 1: the record at index `i` has LSN `i + 1`;
//! - terms never go down along the log, and are never 0.
//!
//! The rule [`divergence`] rests on (log matching, as in Raft and Neon's safekeepers): a term
//! has one primary, which gives each LSN once, and a standby takes a primary's records in
//! order; so two logs holding the same LSN from the same term hold the same record there and
//! the same records before it. They agree up to the highest LSN both hold from one term.

/// A primary's tenure: the epoch the coordinator granted. `Term(0)` is "no term yet".
///
/// The daemon's terms are `epoch << 32 | n`, `n` counting the openings of a log in one
/// epoch; the model never reopens a term (a restarted primary comes back as a standby and is
/// elected again in a newer epoch), so its term is the epoch alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Term(pub u64);

/// A log sequence number; the first record is LSN 1, 0 means "nothing".
pub type Lsn = u64;

/// One record: its place, the term whose primary wrote it, and what a client asked to write
/// (0 for the record a primary writes first in its term).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    pub term: Term,
    pub lsn: Lsn,
    pub payload: u64,
}

/// How far a log reaches, compared first by the term of its last record, then by its length:
/// of two logs, the greater holds every record the coordinator can count as acknowledged by
/// both (see `coordinator`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub last_term: Term,
    pub last_lsn: Lsn,
}

/// `(term, first LSN)` for each run of records one term wrote, in order.
pub type History = Vec<(Term, Lsn)>;

/// A log held in memory. See the module documentation for its invariants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log {
    records: Vec<Record>,
}

impl Log {
    /// A log of `records`, checked.
    ///
    /// # Panics
    /// If the records break the invariants (a caller's bug, never input).
    pub fn from_records(records: Vec<Record>) -> Log {
        let mut log = Log::default();
        for record in records {
            log.push(record);
        }
        log
    }

    pub fn records(&self) -> &[Record] {
        &self.records
    }

    pub fn last_lsn(&self) -> Lsn {
        self.records.len() as Lsn
    }

    pub fn last_term(&self) -> Term {
        self.records.last().map_or(Term(0), |r| r.term)
    }

    pub fn position(&self) -> Position {
        Position {
            last_term: self.last_term(),
            last_lsn: self.last_lsn(),
        }
    }

    pub fn get(&self, lsn: Lsn) -> Option<&Record> {
        lsn.checked_sub(1)
            .and_then(|i| self.records.get(usize::try_from(i).ok()?))
    }

    /// Appends `record`, which must continue the log.
    pub fn push(&mut self, record: Record) {
        assert_eq!(record.lsn, self.last_lsn() + 1, "LSNs are dense");
        assert!(record.term.0 > 0, "term 0 writes nothing");
        assert!(record.term >= self.last_term(), "terms never go down");
        self.records.push(record);
    }

    /// Cuts every record after `keep`, returning them (the salvage).
    pub fn cut_after(&mut self, keep: Lsn) -> Vec<Record> {
        let keep = usize::try_from(keep.min(self.last_lsn())).unwrap_or(usize::MAX);
        self.records.split_off(keep)
    }

    /// Records `after + 1 ..= after + count` (fewer at the end of the log).
    pub fn slice_after(&self, after: Lsn, count: usize) -> Vec<Record> {
        let from = usize::try_from(after).unwrap_or(usize::MAX);
        self.records
            .iter()
            .skip(from)
            .take(count)
            .copied()
            .collect()
    }

    pub fn history(&self) -> History {
        let mut history = History::new();
        for record in &self.records {
            if history.last().is_none_or(|&(term, _)| term != record.term) {
                history.push((record.term, record.lsn));
            }
        }
        history
    }

    /// The first LSN `term` wrote here, if it wrote any.
    pub fn first_of(&self, term: Term) -> Option<Lsn> {
        self.history()
            .into_iter()
            .find(|&(t, _)| t == term)
            .map(|(_, first)| first)
    }
}

/// Each run of a history as `(term, first, last)`, given the log's last LSN.
fn runs(history: &History, end: Lsn) -> impl Iterator<Item = (Term, Lsn, Lsn)> + '_ {
    history.iter().enumerate().map(move |(i, &(term, first))| {
        let last = history.get(i + 1).map_or(end, |&(_, next)| next - 1);
        (term, first, last)
    })
}

/// The last LSN two logs agree on, from their histories and last LSNs.
pub fn divergence(ours: (&History, Lsn), theirs: (&History, Lsn)) -> Lsn {
    let mut agreed = 0;
    for (term, first, last) in runs(ours.0, ours.1) {
        for (t, their_first, their_last) in runs(theirs.0, theirs.1) {
            if t == term && first.max(their_first) <= last.min(their_last) {
                agreed = agreed.max(last.min(their_last));
            }
        }
    }
    agreed
}

/// What became of a record a client was told was written at (`term`, `lsn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// It is in the log, protected: every later primary will hold it.
    Kept,
    /// Another term's record holds its place, protected: it can never appear.
    Lost,
}

/// The answer of a primary of `own` (whose first record is at `start`) that knows its log is
/// protected up to `protected`, or `None` while it cannot tell yet. Only a primary whose own
/// term is protected (`protected >= start`) may ask: from then on every later primary holds
/// this log up to `start`, and only this term's records after it.
pub fn resolve(
    log: &Log,
    own: Term,
    start: Lsn,
    protected: Lsn,
    asked: (Term, Lsn),
) -> Option<Resolution> {
    debug_assert!(protected >= start && protected <= log.last_lsn());
    let (term, lsn) = asked;
    if term == own {
        if lsn < start {
            return Some(Resolution::Lost); // this term wrote nothing before its start
        }
        return (lsn <= protected).then_some(Resolution::Kept);
    }
    if term > own {
        return None;
    }
    if lsn >= start {
        return Some(Resolution::Lost);
    }
    match log.get(lsn) {
        Some(record) if record.term == term => Some(Resolution::Kept),
        _ => Some(Resolution::Lost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn log_of(terms: &[u64]) -> Log {
        Log::from_records(
            terms
                .iter()
                .enumerate()
                .map(|(i, &t)| Record {
                    term: Term(t),
                    lsn: i as Lsn + 1,
                    payload: t * 1000 + i as u64,
                })
                .collect(),
        )
    }

    /// Two logs that shared a prefix and then were written by different terms.
    fn forked() -> impl Strategy<Value = (Vec<u64>, Vec<u64>)> {
        (
            proptest::collection::vec(1u64..4, 0..8),
            proptest::collection::vec(0u64..3, 0..6),
            proptest::collection::vec(0u64..3, 0..6),
        )
            .prop_map(|(mut common, a, b)| {
                common.sort_unstable();
                let top = common.last().copied().unwrap_or(1);
                // Suffixes in distinct terms above the common part: one term writes at one place once.
                let a: Vec<u64> = {
                    let mut s: Vec<u64> = a.iter().map(|d| top + 1 + 2 * d).collect();
                    s.sort_unstable();
                    s
                };
                let b: Vec<u64> = {
                    let mut s: Vec<u64> = b.iter().map(|d| top + 2 + 2 * d).collect();
                    s.sort_unstable();
                    s
                };
                let mut left = common.clone();
                left.extend(a);
                let mut right = common;
                right.extend(b);
                (left, right)
            })
    }

    proptest! {
        /// The divergence found from the histories is the end of the common prefix.
        #[test]
        fn divergence_is_the_common_prefix((a, b) in forked()) {
            let (a, b) = (log_of(&a), log_of(&b));
            let common = a.records().iter().zip(b.records()).take_while(|(x, y)| x.term == y.term).count() as Lsn;
            let found = divergence((&a.history(), a.last_lsn()), (&b.history(), b.last_lsn()));
            prop_assert_eq!(found, common);
            prop_assert_eq!(divergence((&b.history(), b.last_lsn()), (&a.history(), a.last_lsn())), common);
        }

        /// A primary's answers agree with its log: `Kept` only for a record it holds and has
        /// protected, `Lost` only where another term holds the place or its own term began.
        #[test]
        fn resolution_follows_the_log(terms in proptest::collection::vec(1u64..4, 1..10), asked_term in 1u64..5, lsn in 1u64..12) {
            let mut terms = terms;
            terms.sort_unstable();
            let own = Term(*terms.last().unwrap() + 1);
            terms.push(own.0);
            let log = log_of(&terms);
            let start = log.last_lsn();
            let answer = resolve(&log, own, start, start, (Term(asked_term), lsn));
            match answer {
                Some(Resolution::Kept) => prop_assert_eq!(log.get(lsn).map(|r| r.term), Some(Term(asked_term))),
                Some(Resolution::Lost) => prop_assert!(log.get(lsn).map(|r| r.term) != Some(Term(asked_term))),
                None => prop_assert!(Term(asked_term) >= own),
            }
        }
    }

    #[test]
    fn cut_returns_the_salvage_and_keeps_the_prefix() {
        let mut log = log_of(&[1, 1, 2, 2]);
        let salvage = log.cut_after(2);
        assert_eq!(log.last_lsn(), 2);
        assert_eq!(salvage.len(), 2);
        assert_eq!(salvage[0].lsn, 3);
        assert_eq!(log.history(), vec![(Term(1), 1)]);
    }
}
