//! Log analysis: the state machine that turns a checkpoint's tables plus the log records after
//! its begin record into the tables at the end of those records. Restart runs it from the
//! latest complete checkpoint to the end of the log; the decoupled checkpoint runs it from the
//! previous checkpoint to its own begin record, and so never looks at the buffer pool, the
//! transaction table or the lock table.
//!
//! Invariants, for the tables after records up to `L` have been applied:
//! - Every page whose stored image may lack a change at or below `L` is in the dirty-page
//!   table, with a `rec_lsn` at or below the first such change (it may be older: an entry is
//!   conservative where the log does not say better). A page leaves the table only on a
//!   `PagesWritten` record at or above its newest change; such a record is logged only after the
//!   page file was synced (see `pagefile`).
//! - Every transaction with a write or compensation and no end record is in the transaction
//!   table with its last record and the keys it wrote (its exclusive locks).
//! - Applying a record twice, or records from before the tables' own point again (a classical
//!   checkpoint's tables are copied after its begin record), leaves the tables conservative:
//!   older `rec_lsn`s, never a missing page or transaction.
//! - Since the last [`Analysis::mark`] (a decoupled checkpoint took the tables), every
//!   dirty-page entry inserted or changed is in `changed`, and every entry present at the mark
//!   and removed since is in `cleaned`; so [`Analysis::changes`] costs what changed, not the
//!   table, and gives exactly what `CheckpointTables::changes_since` would of the two tables.

use crate::format::page::PageId;
use crate::format::{
    ActiveTxn, CheckpointTables, DirtyPage, LogBody, LogRecord, TableChanges, TxnId, SYSTEM_TXN,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use stela_format::Lsn;

#[derive(Clone, Debug, Default)]
struct DirtyEntry {
    rec_lsn: Lsn,
    page_lsn: Lsn,
    /// Changes at or below this LSN may be unknown here (they came with a checkpoint's tables);
    /// `later` holds every change above it.
    known_after: Lsn,
    /// The LSNs of the changes seen above `known_after`, ascending.
    later: VecDeque<Lsn>,
    /// The mark (see [`Analysis::mark`]) in force when the entry was inserted: an entry
    /// inserted before the last mark was in the tables the last checkpoint took.
    inserted_at: u64,
    /// The mark in force when the entry was last listed in `changed`.
    listed_at: u64,
}

#[derive(Clone, Debug, Default)]
struct TxnEntry {
    last_lsn: Lsn,
    locks: BTreeSet<Vec<u8>>,
}

/// The tables of log analysis. See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct Analysis {
    dirty: BTreeMap<PageId, DirtyEntry>,
    active: BTreeMap<TxnId, TxnEntry>,
    next_page: PageId,
    max_txn: TxnId,
    /// The last LSN applied.
    pub applied_to: Lsn,
    /// How many times the tables were marked as taken by a checkpoint.
    marks: u64,
    /// Pages whose entry was inserted or changed since the last mark (a page may appear more
    /// than once: removed and inserted again).
    changed: Vec<PageId>,
    /// Pages whose entry, present at the last mark, was removed since.
    cleaned: Vec<PageId>,
}

impl Analysis {
    /// Tables to continue from, as a checkpoint recorded them.
    pub fn from_tables(tables: &CheckpointTables) -> Analysis {
        Analysis {
            dirty: tables
                .dirty_pages
                .iter()
                .map(|d| {
                    let entry = DirtyEntry {
                        rec_lsn: d.rec_lsn,
                        page_lsn: d.page_lsn,
                        known_after: d.page_lsn,
                        later: VecDeque::new(),
                        // Present at the mark these tables stand for (see `marks` below).
                        inserted_at: 0,
                        listed_at: 0,
                    };
                    (d.page, entry)
                })
                .collect(),
            active: tables
                .active
                .iter()
                .map(|t| {
                    let entry = TxnEntry {
                        last_lsn: t.last_lsn,
                        locks: t.locks.iter().cloned().collect(),
                    };
                    (t.txn, entry)
                })
                .collect(),
            next_page: tables.next_page,
            max_txn: tables.max_txn,
            // The tables given count as taken: `changes` gives what changed from them.
            marks: 1,
            ..Analysis::default()
        }
    }

    /// Applies the record at `lsn`.
    pub fn apply(&mut self, lsn: Lsn, record: &LogRecord) {
        self.applied_to = self.applied_to.max(lsn);
        for (page, _) in record.pages() {
            self.next_page = self.next_page.max(page.saturating_add(1));
            let marks = self.marks;
            let entry = self.dirty.entry(page).or_insert_with(|| DirtyEntry {
                rec_lsn: lsn,
                inserted_at: marks,
                // Listed just below, as changed.
                listed_at: marks.wrapping_sub(1),
                ..DirtyEntry::default()
            });
            if lsn > entry.page_lsn {
                entry.page_lsn = lsn;
                if entry.listed_at != marks {
                    entry.listed_at = marks;
                    self.changed.push(page);
                }
            }
            if lsn > entry.known_after && entry.later.back().is_none_or(|&last| last < lsn) {
                entry.later.push_back(lsn);
            }
        }
        if record.txn != SYSTEM_TXN {
            self.max_txn = self.max_txn.max(record.txn);
        }
        match &record.body {
            LogBody::Write { key, .. } => {
                let txn = self.active.entry(record.txn).or_default();
                txn.last_lsn = txn.last_lsn.max(lsn);
                txn.locks.insert(key.clone());
            }
            LogBody::Compensate { .. } => {
                let txn = self.active.entry(record.txn).or_default();
                txn.last_lsn = txn.last_lsn.max(lsn);
            }
            LogBody::Commit | LogBody::Aborted => {
                self.active.remove(&record.txn);
            }
            LogBody::PagesWritten { pages } => {
                for &(page, written) in pages {
                    self.written(page, written);
                }
            }
            LogBody::Structure { .. }
            | LogBody::CheckpointBegin
            | LogBody::CheckpointEnd { .. }
            | LogBody::CheckpointDelta { .. } => {}
        }
    }

    /// Page `page`'s stored image holds every change up to `written`.
    fn written(&mut self, page: PageId, written: Lsn) {
        let Some(entry) = self.dirty.get_mut(&page) else {
            return;
        };
        if entry.page_lsn <= written {
            if entry.inserted_at != self.marks {
                self.cleaned.push(page);
            }
            self.dirty.remove(&page);
            return;
        }
        while entry.later.front().is_some_and(|&lsn| lsn <= written) {
            entry.later.pop_front();
        }
        // Only when no unknown change can lie above `written` is the first known change after
        // it the first change the image lacks.
        if written >= entry.known_after {
            if let Some(&first) = entry.later.front() {
                if first > entry.rec_lsn {
                    entry.rec_lsn = first;
                    if entry.listed_at != self.marks {
                        entry.listed_at = self.marks;
                        self.changed.push(page);
                    }
                }
            }
        }
    }

    /// Marks the tables as taken by a checkpoint: [`Analysis::changes`] from now on gives the
    /// changes since this point.
    pub fn mark(&mut self) {
        self.marks = self.marks.wrapping_add(1);
        self.changed.clear();
        self.cleaned.clear();
    }

    /// The changes since the last [`Analysis::mark`], as a delta checkpoint logs them: the
    /// entries inserted or changed and the pages cleaned, each ascending, and the transaction
    /// table whole. Costs what changed (and the transaction table), not the dirty-page table.
    pub fn changes(&self) -> TableChanges {
        let mut changed = self.changed.clone();
        changed.sort_unstable();
        changed.dedup();
        // Each page is cleaned at most once per mark (an entry inserted again after is new),
        // but one cleaned and dirty again is changed, not cleaned.
        let mut cleaned: Vec<PageId> = self
            .cleaned
            .iter()
            .copied()
            .filter(|page| !self.dirty.contains_key(page))
            .collect();
        cleaned.sort_unstable();
        TableChanges {
            dirty_pages: changed
                .into_iter()
                .filter_map(|page| {
                    self.dirty.get(&page).map(|e| DirtyPage {
                        page,
                        rec_lsn: e.rec_lsn,
                        page_lsn: e.page_lsn,
                    })
                })
                .collect(),
            cleaned,
            active: self.active_table(),
            next_page: self.next_page,
            max_txn: self.max_txn,
        }
    }

    /// Entries in the dirty-page table.
    pub fn dirty_len(&self) -> usize {
        self.dirty.len()
    }

    /// Every stored image holds every change up to `lsn` (a standby follower's directory,
    /// `follow`): each dirty page is cleaned, or its `rec_lsn` moved past `lsn`, as a
    /// `PagesWritten` record for every page at `lsn` would. Precise only when `lsn` is at or
    /// above the page LSNs the starting checkpoint's tables carry; conservative otherwise.
    pub fn images_hold_up_to(&mut self, lsn: Lsn) {
        let pages: Vec<PageId> = self.dirty.keys().copied().collect();
        for page in pages {
            self.written(page, lsn);
        }
    }

    /// The tables as a checkpoint records them.
    pub fn tables(&self) -> CheckpointTables {
        CheckpointTables {
            dirty_pages: self
                .dirty
                .iter()
                .map(|(&page, e)| DirtyPage {
                    page,
                    rec_lsn: e.rec_lsn,
                    page_lsn: e.page_lsn,
                })
                .collect(),
            active: self.active_table(),
            next_page: self.next_page,
            max_txn: self.max_txn,
        }
    }

    fn active_table(&self) -> Vec<ActiveTxn> {
        self.active
            .iter()
            .map(|(&txn, e)| ActiveTxn {
                txn,
                last_lsn: e.last_lsn,
                locks: e.locks.iter().cloned().collect(),
            })
            .collect()
    }

    /// Where redo must start: the oldest `rec_lsn`, if any page is dirty.
    pub fn redo_start(&self) -> Option<Lsn> {
        self.dirty.values().map(|e| e.rec_lsn).min()
    }

    /// The dirty pages with their `rec_lsn` and newest change, ascending by page id.
    pub fn dirty_pages(&self) -> impl Iterator<Item = (PageId, Lsn, Lsn)> + '_ {
        self.dirty
            .iter()
            .map(|(&page, e)| (page, e.rec_lsn, e.page_lsn))
    }

    /// The `rec_lsn` of page `page`, if it is dirty.
    pub fn rec_lsn(&self, page: PageId) -> Option<Lsn> {
        self.dirty.get(&page).map(|e| e.rec_lsn)
    }

    /// The transactions without an end record, with their last records.
    pub fn active(&self) -> impl Iterator<Item = (TxnId, Lsn)> + '_ {
        self.active.iter().map(|(&txn, e)| (txn, e.last_lsn))
    }

    /// The keys `txn` wrote and holds exclusively (empty if it is not active).
    pub fn locks_of(&self, txn: TxnId) -> Vec<Vec<u8>> {
        self.active
            .get(&txn)
            .map(|e| e.locks.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn next_page(&self) -> PageId {
        self.next_page
    }

    pub fn max_txn(&self) -> TxnId {
        self.max_txn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::LogRecord;

    fn write(txn: TxnId, page: PageId) -> LogRecord {
        LogRecord {
            txn,
            prev_txn_lsn: Lsn::ZERO,
            body: LogBody::Write {
                page,
                prev_page_lsn: Lsn::ZERO,
                key: b"k".to_vec(),
                before: None,
                after: Some(b"v".to_vec()),
            },
        }
    }

    fn written(pages: &[(PageId, u64)]) -> LogRecord {
        LogRecord {
            txn: SYSTEM_TXN,
            prev_txn_lsn: Lsn::ZERO,
            body: LogBody::PagesWritten {
                pages: pages.iter().map(|&(p, l)| (p, Lsn::new(l))).collect(),
            },
        }
    }

    #[test]
    fn a_page_write_cleans_a_page_or_moves_its_rec_lsn_past_what_it_holds() {
        let mut a = Analysis::default();
        a.apply(Lsn::new(1), &write(1, 5));
        a.apply(Lsn::new(2), &write(1, 6));
        a.apply(Lsn::new(3), &write(1, 5));
        // Page 6 written at its newest change: clean. Page 5 written at 1: dirty since 3.
        a.apply(Lsn::new(4), &written(&[(6, 2), (5, 1)]));
        assert_eq!(a.rec_lsn(6), None);
        assert_eq!(a.rec_lsn(5), Some(Lsn::new(3)));

        // From a checkpoint's tables, changes before the entry's page LSN are unknown: a write
        // below it cannot move rec_lsn, one at or above it can.
        let mut b = Analysis::from_tables(&a.tables());
        b.apply(Lsn::new(7), &write(2, 5));
        b.apply(Lsn::new(8), &written(&[(5, 2)]));
        assert_eq!(b.rec_lsn(5), Some(Lsn::new(3)));
        b.apply(Lsn::new(9), &written(&[(5, 3)]));
        assert_eq!(b.rec_lsn(5), Some(Lsn::new(7)));
        assert_eq!(
            b.active().collect::<Vec<_>>(),
            vec![(1, Lsn::new(3)), (2, Lsn::new(7))]
        );
    }

    /// One step of the property below: a write of `page` by `txn`, its commit, a page write
    /// at an LSN some way back, or a checkpoint taking the tables.
    #[derive(Clone, Debug)]
    enum Step {
        Write { txn: TxnId, page: PageId },
        Commit { txn: TxnId },
        Written { page: PageId, back: u64 },
        Checkpoint,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (1u64..4, 0u64..12).prop_map(|(txn, page)| Step::Write { txn, page }),
            1 => (1u64..4).prop_map(|txn| Step::Commit { txn }),
            3 => (0u64..12, 0u64..6).prop_map(|(page, back)| Step::Written { page, back }),
            1 => Just(Step::Checkpoint),
        ]
    }

    proptest::proptest! {
        /// What analysis lists as changed since the last checkpoint took its tables is
        /// exactly the difference of the two whole tables, from empty tables or from a
        /// checkpoint's (as after restart), with pages cleaned, dirtied again, and cleaned
        /// again between checkpoints.
        #[test]
        fn the_changes_listed_are_the_difference_of_the_tables(
            start in proptest::collection::btree_map(0u64..12, 1u64..20, 0..8),
            steps in proptest::collection::vec(step(), 1..120),
        ) {
            let mut analysis = if start.is_empty() {
                Analysis::default()
            } else {
                let mut tables = CheckpointTables::default();
                for (&page, &lsn) in &start {
                    tables.dirty_pages.push(DirtyPage {
                        page,
                        rec_lsn: Lsn::new(lsn),
                        page_lsn: Lsn::new(lsn + 3),
                    });
                }
                Analysis::from_tables(&tables)
            };
            let mut taken = analysis.tables();
            let mut lsn = 30;
            for step in steps {
                lsn += 1;
                let record = match step {
                    Step::Write { txn, page } => write(txn, page),
                    Step::Commit { txn } => LogRecord {
                        txn,
                        prev_txn_lsn: Lsn::ZERO,
                        body: LogBody::Commit,
                    },
                    Step::Written { page, back } => written(&[(page, lsn - 1 - back)]),
                    Step::Checkpoint => {
                        let tables = analysis.tables();
                        proptest::prop_assert_eq!(
                            analysis.changes(),
                            tables.changes_since(&taken)
                        );
                        analysis.mark();
                        taken = tables;
                        continue;
                    }
                };
                analysis.apply(Lsn::new(lsn), &record);
            }
            proptest::prop_assert_eq!(
                analysis.changes(),
                analysis.tables().changes_since(&taken)
            );
        }
    }
}
