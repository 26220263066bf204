//! ARIES restart (analysis, redo, undo) and the rollback of one transaction, which a normal
//! abort and restart's undo share.
//!
//! Invariants:
//! - Redo repeats history: every page-changing record (writes, compensations, structure
//!   changes, of winners and losers alike) is applied to every page whose LSN is below the
//!   record's, in LSN order. Afterwards every page is as it was at the crash, tree structure
//!   included, so undo can find keys from the root.
//! - Undo walks each loser's chain backwards (`prev_txn_lsn`), logs a compensation for each
//!   write it undoes, and jumps over work already compensated (`undo_next`), so a crash during
//!   undo, followed by another restart, never undoes a write twice. A loser is finished with an
//!   `Aborted` record.
//! - Restart writes no page: the pages it redid are dirty in the pool like any others.
//!
//! There are no checkpoints yet, so analysis reads the log from its first record and the
//! dirty-page table it builds holds every page the log names (at its first record's LSN).

use crate::btree::{self, Engine};
use crate::error::{Error, Result};
use crate::format::{LogBody, LogRecord, RecordError, TxnId, SYSTEM_TXN};
use crate::page::PageId;
use std::collections::{BTreeMap, HashMap};
use stela_format::Lsn;

/// What a restart found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestartReport {
    /// Records read by analysis.
    pub records_analyzed: u64,
    /// (record, page) pairs redo applied because the page lacked them.
    pub redo_applied: u64,
    /// Transactions without an end record at the crash, rolled back.
    pub losers: Vec<TxnId>,
    /// Compensation records undo wrote.
    pub compensations: u64,
    /// The largest transaction id in the log.
    pub max_txn: TxnId,
}

/// Rolls back `txn`, whose last record is `last_lsn`, finding its records with `lookup`.
/// Writes a compensation for every write not yet compensated, then the `Aborted` record.
/// Returns the LSN of that record.
///
/// # Errors
/// [`Error::BadLogRecord`] if the chain is broken (a record missing or of another
/// transaction); log and page errors from the undo itself.
pub(crate) fn rollback(
    engine: &mut Engine,
    txn: TxnId,
    last_lsn: Lsn,
    lookup: impl Fn(Lsn) -> Option<LogRecord>,
    compensations: &mut u64,
) -> Result<Lsn> {
    let mut chain_end = last_lsn;
    let mut next = last_lsn;
    while next != Lsn::ZERO {
        let broken = |what| Error::BadLogRecord {
            lsn: next,
            source: RecordError::Invalid(what),
        };
        let record =
            lookup(next).ok_or_else(|| broken("undo: the chain names a missing record"))?;
        if record.txn != txn || record.prev_txn_lsn >= next {
            return Err(broken(
                "undo: the chain leaves its transaction or does not go back",
            ));
        }
        match record.body {
            LogBody::Write { key, before, .. } => {
                let undo_next = record.prev_txn_lsn;
                let (lsn, _) = engine.set(&key, before.as_deref(), |page, prev_page_lsn, _| {
                    LogRecord {
                        txn,
                        prev_txn_lsn: chain_end,
                        body: LogBody::Compensate {
                            page,
                            prev_page_lsn,
                            key: key.clone(),
                            value: before.clone(),
                            undo_next,
                        },
                    }
                })?;
                *compensations += 1;
                chain_end = lsn;
                next = undo_next;
            }
            LogBody::Compensate { undo_next, .. } => next = undo_next,
            LogBody::Structure { .. } | LogBody::Commit | LogBody::Aborted => {
                return Err(broken("undo: the chain reaches a record undo cannot be on"))
            }
        }
    }
    engine.log.append(&LogRecord {
        txn,
        prev_txn_lsn: chain_end,
        body: LogBody::Aborted,
    })
}

/// Restarts from the log: analysis, redo, undo. `engine.next_page` must already cover the
/// page file; analysis raises it above every page the log names.
pub(crate) fn restart(engine: &mut Engine) -> Result<RestartReport> {
    let mut report = RestartReport::default();
    let log = std::sync::Arc::clone(&engine.log);

    // Analysis: which transactions were running at the end of the log (and their records, for
    // undo), which pages may lack changes (and from which LSN), which page ids are in use.
    let mut active: BTreeMap<TxnId, Lsn> = BTreeMap::new();
    let mut undo_records: HashMap<TxnId, HashMap<Lsn, LogRecord>> = HashMap::new();
    let mut dirty_pages: HashMap<PageId, Lsn> = HashMap::new();
    for item in log.read_from(Lsn::FIRST)? {
        let (lsn, record) = item?;
        report.records_analyzed += 1;
        for (page, _) in record.pages() {
            dirty_pages.entry(page).or_insert(lsn);
            engine.next_page = engine.next_page.max(page.saturating_add(1));
        }
        if record.txn == SYSTEM_TXN {
            continue;
        }
        report.max_txn = report.max_txn.max(record.txn);
        match record.body {
            LogBody::Commit | LogBody::Aborted => {
                active.remove(&record.txn);
                undo_records.remove(&record.txn);
            }
            LogBody::Write { .. } | LogBody::Compensate { .. } => {
                active.insert(record.txn, lsn);
                undo_records
                    .entry(record.txn)
                    .or_default()
                    .insert(lsn, record);
            }
            LogBody::Structure { .. } => {}
        }
    }

    // Redo: from the oldest LSN a dirty page may lack, every change its page lacks.
    if let Some(&redo_from) = dirty_pages.values().min() {
        for item in log.read_from(redo_from)? {
            let (lsn, record) = item?;
            for (page, _) in record.pages() {
                if dirty_pages.get(&page).is_some_and(|&since| since <= lsn) {
                    let applied = engine.pool.update(page, log.as_ref(), |image| {
                        btree::redo(page, image, lsn, &record)
                    })?;
                    report.redo_applied += u64::from(applied);
                }
            }
        }
    }

    // Undo: roll back every loser, newest transaction first. Losers held exclusive locks on
    // the keys they wrote, so no two of them wrote the same key and the order among them does
    // not change the result.
    for (&txn, &last_lsn) in active.iter().rev() {
        let records = undo_records.remove(&txn).unwrap_or_default();
        rollback(
            engine,
            txn,
            last_lsn,
            |lsn| records.get(&lsn).cloned(),
            &mut report.compensations,
        )?;
        report.losers.push(txn);
    }
    let last = log.last_lsn();
    if last > log.durable_lsn() {
        log.flush(last)?;
    }
    Ok(report)
}
