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
//! Analysis starts at the latest complete checkpoint of either kind (the master record names
//! it) with that checkpoint's tables; without one, at the first record with empty tables.
//! Redo starts at the oldest `rec_lsn` of the dirty-page table analysis ends with. Undo reads a
//! loser's records from the analysed part of the log when it has them, and follows the
//! transaction's chain into the older log for the rest.

use crate::analysis::Analysis;
use crate::btree::Engine;
use crate::checkpoint::Master;
use crate::error::{Error, Result};
use crate::format::{LogBody, LogRecord, RecordError, TxnId};
use crate::log::read_one;
use crate::redo::redo;
use std::collections::HashMap;
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
    /// The begin record of the checkpoint analysis started from, if there was one.
    pub checkpoint: Option<Lsn>,
    /// Where redo started (`None`: no page was dirty).
    pub redo_start: Option<Lsn>,
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
            _ => return Err(broken("undo: the chain reaches a record undo cannot be on")),
        }
    }
    engine.log.append(&LogRecord {
        txn,
        prev_txn_lsn: chain_end,
        body: LogBody::Aborted,
    })
}

/// Restarts from the log: analysis, redo, undo. `engine.next_page` must already cover the
/// page file; analysis raises it above every page the log names. Returns the report and the
/// analysis tables as they were at the end of the log before undo (where a decoupled
/// checkpoint continues from).
pub(crate) fn restart(
    engine: &mut Engine,
    master: Option<Master>,
) -> Result<(RestartReport, Analysis)> {
    let mut report = RestartReport::default();
    let log = std::sync::Arc::clone(&engine.log);

    // Analysis: from the checkpoint's tables (or none), every record from its begin on.
    let (mut analysis, start) = match master {
        Some(master) => match read_one(log.as_ref(), master.end)? {
            LogRecord {
                body: LogBody::CheckpointEnd { begin, tables, .. },
                ..
            } if begin == master.begin => {
                report.checkpoint = Some(begin);
                (Analysis::from_tables(&tables), begin)
            }
            _ => {
                return Err(Error::BadLogRecord {
                    lsn: master.end,
                    source: RecordError::Invalid(
                        "the master record names no end of checkpoint there",
                    ),
                })
            }
        },
        None => (Analysis::default(), Lsn::FIRST),
    };
    // The records of transactions still running, for undo without rereading them.
    let mut undo_records: HashMap<TxnId, HashMap<Lsn, LogRecord>> = HashMap::new();
    for item in log.read_from(start)? {
        let (lsn, record) = item?;
        report.records_analyzed += 1;
        analysis.apply(lsn, &record);
        match record.body {
            LogBody::Commit | LogBody::Aborted => {
                undo_records.remove(&record.txn);
            }
            LogBody::Write { .. } | LogBody::Compensate { .. } => {
                undo_records
                    .entry(record.txn)
                    .or_default()
                    .insert(lsn, record);
            }
            _ => {}
        }
    }
    engine.next_page = engine.next_page.max(analysis.next_page());
    report.max_txn = analysis.max_txn();

    // Redo: from the oldest LSN a dirty page may lack, every change its page lacks.
    report.redo_start = analysis.redo_start();
    if let Some(redo_from) = report.redo_start {
        for item in log.read_from(redo_from)? {
            let (lsn, record) = item?;
            for (page, _) in record.pages() {
                if analysis.rec_lsn(page).is_some_and(|since| since <= lsn) {
                    let applied = engine
                        .pool
                        .update(page, log.as_ref(), |image| redo(page, image, lsn, &record))?;
                    report.redo_applied += u64::from(applied);
                }
            }
        }
    }

    // Undo: roll back every loser, newest transaction first. Losers held exclusive locks on
    // the keys they wrote, so no two of them wrote the same key and the order among them does
    // not change the result.
    let losers: Vec<(TxnId, Lsn)> = analysis.active().collect();
    for &(txn, last_lsn) in losers.iter().rev() {
        let records = undo_records.remove(&txn).unwrap_or_default();
        rollback(
            engine,
            txn,
            last_lsn,
            |lsn| {
                records
                    .get(&lsn)
                    .cloned()
                    .or_else(|| read_one(log.as_ref(), lsn).ok())
            },
            &mut report.compensations,
        )?;
        report.losers.push(txn);
    }
    let last = log.last_lsn();
    if last > log.durable_lsn() {
        log.flush(last)?;
    }
    Ok((report, analysis))
}
