//! Restart after a crash, in one of two modes ([`RestartMode`]), and the rollback of one
//! transaction, which a normal abort and restart's undo share.
//!
//! Classical is ARIES: analysis, redo, undo, all before the store opens. Instant does the same
//! analysis, then hands the rest to later: for every dirty page it indexes the records the
//! stored image may lack (no page read; those the log archive holds stay there, the rest come
//! from the log) and gives the index to the pool, which redoes a page when it first reads it; the losers come back to the store, which locks
//! their keys under their ids before it opens and rolls them back later with
//! [`undo_loser`]. Both modes keep the invariants below: instant only changes when the work is
//! done, and repeating history page by page gives the same pages as repeating it in LSN order,
//! because each page's records are applied in LSN order and no record changes two pages
//! differently depending on another's state (a structure change carries whole images).
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
//! - Undo needs the tree as it was at the crash; instant undo gets it because every page undo
//!   reads goes through the pool, which redoes it first.
//!
//! A standby follower's directory (`follow`) comes with one more fact: its images hold every
//! change up to the follower's progress `L`, and its master record names a checkpoint that ends
//! at or below `L`. Analysis then ignores the `PagesWritten` records above `L` it reads (they
//! describe the old primary's page file, not these images; ignoring a true one only keeps a
//! page dirty longer), and at its end moves every dirty page's `rec_lsn` past `L`, so redo
//! covers only what the follower had not applied. An empty page file without a master record,
//! opened on a log that has records, is treated as a follower at `L = 0`: the log's
//! `PagesWritten` records are then about some other page file, and the whole log is redone.
//!
//! Analysis starts at the latest complete checkpoint of either kind (the master record names
//! it) with that checkpoint's tables; without one, at LSN 1 with empty tables (a log that
//! starts later was truncated behind a checkpoint whose master record is lost: an error).
//! Redo starts at the oldest `rec_lsn` of the dirty-page table analysis ends with (a log
//! truncated past it is an error, never a silent skip: `retention` keeps it). Undo reads a
//! loser's records from the analysed part of the log when it has them, and follows the
//! transaction's chain into the older log for the rest.

use crate::access::btree::Engine;
use crate::access::redo::{redo, PendingRedo};
use crate::error::{Error, Result};
use crate::format::{CheckpointTables, LogBody, LogRecord, RecordError, TableChanges, TxnId};
use crate::log::read_one;
use crate::recovery::analysis::Analysis;
use crate::recovery::master::Master;
use std::collections::HashMap;
use std::sync::Arc;
use stela_format::Lsn;

/// What a restart found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestartReport {
    /// Records restart read before it opened: those analysed, and, when the checkpoint was
    /// logged as a delta, those from its chain's full checkpoint on.
    pub records_analyzed: u64,
    /// (record, page) pairs redo applied because the page lacked them.
    pub redo_applied: u64,
    /// Transactions without an end record at the crash: rolled back before open returned
    /// (classical), or left to roll back after it (instant).
    pub losers: Vec<TxnId>,
    /// Compensation records undo wrote before open returned.
    pub compensations: u64,
    /// The largest transaction id in the log.
    pub max_txn: TxnId,
    /// The begin record of the checkpoint analysis started from, if there was one.
    pub checkpoint: Option<Lsn>,
    /// Where redo started, or starts for the pages left pending (`None`: no page was dirty).
    pub redo_start: Option<Lsn>,
    /// Instant restart: pages whose redo was left to their first read or the background.
    pub pending_pages: u64,
    /// Instant restart: (record, page) pairs in those pages' pending redo, read at open (the
    /// ones left in the log archive not counted).
    pub pending_records: u64,
    /// Instant restart: pending pages whose older changes were left in the log archive, to be
    /// read from it by the page index when the page is redone.
    pub pending_from_archive: u64,
    /// A standby follower's directory: every change up to this LSN was in its page images
    /// (zero, too, for an empty page file opened on a log that has records).
    pub followed_to: Option<Lsn>,
}

/// Restart work an instant restart has not done yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveryPending {
    /// Pages whose redo is still pending (not read since the restart).
    pub pages: usize,
    /// Losers not rolled back yet.
    pub losers: usize,
}

impl RecoveryPending {
    pub fn is_done(&self) -> bool {
        self.pages == 0 && self.losers == 0
    }
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

/// How restart brings the store back after a crash.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RestartMode {
    /// ARIES as written: analysis, then redo of every dirty page, then undo of every loser,
    /// all before open returns. Open takes time in proportion to the dirty set.
    Classical,
    /// Analysis only before open returns; redo happens page by page when a page is first read
    /// (or by a background thread), undo of a loser when a transaction waits for one of its
    /// locks (or in the background). Open takes time in proportion to the log to analyse.
    #[default]
    Instant,
}

/// A transaction without an end record at the crash whose rollback instant restart left for
/// later. Until it is rolled back it holds its keys' exclusive locks under its own id.
#[derive(Debug)]
pub(crate) struct Loser {
    pub txn: TxnId,
    pub last_lsn: Lsn,
    /// The keys it wrote: the locks it holds.
    pub keys: Vec<Vec<u8>>,
    /// Its records from the analysed part of the log (undo reads older ones from the log).
    pub records: HashMap<Lsn, LogRecord>,
}

impl Loser {
    /// The pages its records name: where its rollback will most likely read (a split may
    /// have moved a key since).
    pub fn pages(&self) -> std::collections::BTreeSet<crate::format::page::PageId> {
        self.records
            .values()
            .flat_map(|record| record.pages())
            .map(|(page, _)| page)
            .collect()
    }
}

/// What restart hands the store.
pub(crate) struct Restarted {
    pub report: RestartReport,
    /// The analysis tables as they were at the end of the log before undo (where a decoupled
    /// checkpoint continues from).
    pub analysis: Analysis,
    /// Instant restart: the losers left to roll back, newest last (classical: none).
    pub losers: Vec<Loser>,
}

/// Restarts from the log in `mode`. `engine.next_page` must already cover the page file;
/// analysis raises it above every page the log names. Classical: analysis, redo, undo. Instant:
/// analysis, then the pending redo handed to the pool, and the losers returned for the store to
/// lock and roll back later.
pub(crate) fn restart(
    engine: &mut Engine,
    master: Option<Master>,
    followed_to: Option<Lsn>,
    mode: RestartMode,
) -> Result<Restarted> {
    let mut report = RestartReport {
        followed_to,
        ..RestartReport::default()
    };
    let log = std::sync::Arc::clone(&engine.log);
    let started = std::time::Instant::now();
    let scan = analyse_log(log.as_ref(), master, followed_to, mode, &mut report)?;
    let LogScan {
        start,
        mut analysis,
        mut undo_records,
        analysed_changes,
        ..
    } = scan;
    if let Some(followed) = followed_to {
        analysis.images_hold_up_to(followed);
    }
    engine.next_page = engine.next_page.max(analysis.next_page());
    report.max_txn = analysis.max_txn();
    report.redo_start = analysis.redo_start();
    let analysed = started.elapsed();

    match mode {
        RestartMode::Classical => {
            redo_everything(engine, &analysis, &mut report)?;
            undo_everything(engine, &analysis, undo_records, &mut report)?;
            let last = log.last_lsn();
            if last > log.durable_lsn() {
                log.flush(last)?;
            }
            Ok(Restarted {
                report,
                analysis,
                losers: Vec::new(),
            })
        }
        RestartMode::Instant => {
            let pending = pending_redo(
                engine,
                &analysis,
                start,
                analysed_changes,
                &mut undo_records,
            )?;
            report.pending_pages = pending.pages() as u64;
            report.pending_records = pending.records() as u64;
            report.pending_from_archive = pending.pages_from_archive() as u64;
            engine.pool.set_pending(pending);
            tracing::debug!(?analysed, indexed = ?started.elapsed() - analysed, "instant restart");
            let losers = analysis
                .active()
                .map(|(txn, last_lsn)| Loser {
                    txn,
                    last_lsn,
                    keys: analysis.locks_of(txn),
                    records: undo_records.remove(&txn).unwrap_or_default(),
                })
                .collect::<Vec<_>>();
            report.losers = losers.iter().map(|l| l.txn).collect();
            Ok(Restarted {
                report,
                analysis,
                losers,
            })
        }
    }
}

/// Restart's one pass over the log, and what it keeps of it.
///
/// Analysis: from the checkpoint's tables (or none), every record from its begin on. The end
/// record, which carries the tables, is among those records: it is read once, in the same pass
/// (a checkpoint of a 1 GB dirty set carries 131,072 dirty pages, and decoding them twice cost
/// restart tens of milliseconds). The records between begin and end wait for the tables, then
/// go through analysis in order.
///
/// A checkpoint logged as a delta (`CheckpointDelta`) has its tables composed first: the log is
/// read from its chain's full checkpoint (`Master::root`), whose tables each delta of the chain
/// then changes in LSN order. Other records before the begin record are read but not analysed
/// (the tables at the begin record already account for them); undo and instant redo keep them
/// as they keep the analysed ones.
struct LogScan {
    master: Option<Master>,
    followed_to: Option<Lsn>,
    mode: RestartMode,
    /// Where the pass starts: the chain's root or the checkpoint's begin record.
    start: Lsn,
    /// The end record whose tables analysis still waits for.
    tables_pending: Option<Lsn>,
    chain: ChainTables,
    waiting_for_tables: Vec<(Lsn, LogRecord)>,
    analysis: Analysis,
    /// The records of transactions still running, for undo without rereading them.
    undo_records: HashMap<TxnId, HashMap<Lsn, LogRecord>>,
    /// Instant: the page-changing records analysed, kept so that building the pending redo
    /// does not read them again (which ones are pending is known only at the end).
    analysed_changes: Vec<(Lsn, Arc<LogRecord>)>,
}

/// Reads the log once from where `master` says analysis starts; see [`LogScan`].
fn analyse_log(
    log: &dyn crate::log::LogDevice,
    master: Option<Master>,
    followed_to: Option<Lsn>,
    mode: RestartMode,
    report: &mut RestartReport,
) -> Result<LogScan> {
    let start = master.map_or(Lsn::FIRST, |master| master.begin.min(master.root));
    let mut scan = LogScan {
        master,
        followed_to,
        mode,
        start,
        tables_pending: master.map(|master| master.end),
        chain: ChainTables::default(),
        waiting_for_tables: Vec::new(),
        analysis: Analysis::default(),
        undo_records: HashMap::new(),
        analysed_changes: Vec::new(),
    };
    for item in log.read_from(start)? {
        let (lsn, record) = item?;
        if report.records_analyzed == 0 && lsn != start {
            // The log was truncated behind a checkpoint whose master record is now lost:
            // analysis from a later record would miss pages and transactions.
            return Err(Error::BadLogRecord {
                lsn: start,
                source: RecordError::Invalid("the log starts after where analysis must start"),
            });
        }
        report.records_analyzed += 1;
        scan.read(lsn, record, report)?;
    }
    if let Some(end) = scan.tables_pending {
        return Err(no_checkpoint_end(end));
    }
    Ok(scan)
}

impl LogScan {
    /// Takes the record at `lsn` through analysis (or the chain, or the wait for the tables),
    /// then keeps it for undo and instant redo.
    fn read(&mut self, lsn: Lsn, mut record: LogRecord, report: &mut RestartReport) -> Result<()> {
        if let Some(master) = self.master.filter(|master| lsn < master.begin) {
            // Before the begin record of a delta: its chain. The record is kept for undo and
            // instant redo below, like those analysed.
            self.chain.read(master, lsn, &mut record)?;
        } else {
            match self.tables_pending {
                Some(end) if lsn < end => {
                    self.waiting_for_tables.push((lsn, record.clone()));
                }
                Some(end) => {
                    let master = self
                        .master
                        .expect("tables are pending only with a master record");
                    if lsn != end {
                        return Err(no_checkpoint_end(end));
                    }
                    let tables = self.take_tables(master, lsn, end, &mut record)?;
                    report.checkpoint = Some(master.begin);
                    self.analysis = Analysis::from_tables(&tables);
                    self.tables_pending = None;
                    for (lsn, record) in std::mem::take(&mut self.waiting_for_tables) {
                        self.analyse(lsn, &record);
                    }
                    self.analyse(lsn, &record);
                }
                None => self.analyse(lsn, &record),
            }
        }
        self.keep(lsn, record);
        Ok(())
    }

    /// The tables of the checkpoint's end record at `lsn` (a full one, or a delta composed
    /// with its chain), taken out of the record.
    fn take_tables(
        &mut self,
        master: Master,
        lsn: Lsn,
        end: Lsn,
        record: &mut LogRecord,
    ) -> Result<CheckpointTables> {
        match &mut record.body {
            LogBody::CheckpointEnd { begin, tables, .. } if *begin == master.begin => {
                Ok(std::mem::take(tables))
            }
            LogBody::CheckpointDelta {
                begin,
                base,
                root,
                changes,
            } if *begin == master.begin && *root == master.root => {
                self.chain.extend(lsn, *base, changes)?;
                self.chain
                    .composed
                    .take()
                    .ok_or_else(|| no_checkpoint_end(master.root))
            }
            _ => Err(no_checkpoint_end(end)),
        }
    }

    fn analyse(&mut self, lsn: Lsn, record: &LogRecord) {
        let foreign_write = matches!(record.body, LogBody::PagesWritten { .. })
            && self.followed_to.is_some_and(|followed| lsn > followed);
        if foreign_write {
            self.analysis.applied_to = self.analysis.applied_to.max(lsn);
        } else {
            self.analysis.apply(lsn, record);
        }
    }

    /// Keeps a running transaction's records for undo, and (instant) page changes for redo.
    fn keep(&mut self, lsn: Lsn, record: LogRecord) {
        let instant = self.mode == RestartMode::Instant;
        match record.body {
            LogBody::Commit | LogBody::Aborted => {
                self.undo_records.remove(&record.txn);
            }
            LogBody::Write { .. } | LogBody::Compensate { .. } => {
                if instant {
                    self.analysed_changes.push((lsn, Arc::new(record.clone())));
                }
                self.undo_records
                    .entry(record.txn)
                    .or_default()
                    .insert(lsn, record);
            }
            LogBody::Structure { .. } if instant => {
                self.analysed_changes.push((lsn, Arc::new(record)));
            }
            _ => {}
        }
    }
}

/// The tables of a delta's chain, composed as restart reads it before the delta's begin record.
#[derive(Default)]
struct ChainTables {
    /// The tables at the last end record of the chain read (`None` before its root).
    composed: Option<CheckpointTables>,
    /// That end record.
    last_end: Lsn,
}

impl ChainTables {
    /// Takes in the record at `lsn`, before the begin record of `master`'s checkpoint: the
    /// chain's full checkpoint at its root, or a delta of the chain. Others are not needed.
    fn read(&mut self, master: Master, lsn: Lsn, record: &mut LogRecord) -> Result<()> {
        match &mut record.body {
            _ if lsn == master.root => {
                let LogBody::CheckpointEnd { tables, .. } = &mut record.body else {
                    return Err(no_checkpoint_end(master.root));
                };
                self.composed = Some(std::mem::take(tables));
                self.last_end = lsn;
            }
            LogBody::CheckpointDelta {
                base,
                root,
                changes,
                ..
            } if *root == master.root && lsn > master.root => self.extend(lsn, *base, changes)?,
            _ => {}
        }
        Ok(())
    }

    /// Applies the delta at `lsn`, on the checkpoint ending at `base`.
    fn extend(&mut self, lsn: Lsn, base: Lsn, changes: &TableChanges) -> Result<()> {
        let Some(composed) = self.composed.as_mut().filter(|_| base == self.last_end) else {
            return Err(Error::BadLogRecord {
                lsn,
                source: RecordError::Invalid(
                    "a checkpoint delta's base is not the checkpoint before it in its chain",
                ),
            });
        };
        composed.apply(changes);
        self.last_end = lsn;
        Ok(())
    }
}

/// The master record names a checkpoint whose end record is not where it says.
fn no_checkpoint_end(end: Lsn) -> Error {
    Error::BadLogRecord {
        lsn: end,
        source: RecordError::Invalid("the master record names no end of checkpoint there"),
    }
}

/// The log was truncated past a change a stored image lacks: redo would silently miss it.
fn log_starts_too_late(redo_from: Lsn) -> Error {
    Error::BadLogRecord {
        lsn: redo_from,
        source: RecordError::Invalid("the log starts after where redo must start"),
    }
}

/// Classical redo: from the oldest LSN a dirty page may lack, every change its page lacks.
fn redo_everything(
    engine: &mut Engine,
    analysis: &Analysis,
    report: &mut RestartReport,
) -> Result<()> {
    let Some(redo_from) = report.redo_start else {
        return Ok(());
    };
    let log = Arc::clone(&engine.log);
    for (at, item) in log.read_from(redo_from)?.enumerate() {
        let (lsn, record) = item?;
        if at == 0 && lsn != redo_from {
            return Err(log_starts_too_late(redo_from));
        }
        for (page, _) in record.pages() {
            if analysis.rec_lsn(page).is_some_and(|since| since <= lsn) {
                let applied = engine
                    .pool
                    .update(page, log.as_ref(), |image| redo(page, image, lsn, &record))?;
                report.redo_applied += u64::from(applied);
                if !applied {
                    engine.pool.confirm_current(page);
                }
            }
        }
    }
    Ok(())
}

/// Instant restart's redo index: for every page analysis found dirty, the changes from its
/// `rec_lsn` on. The records from the analysis start on were kept by analysis. Older ones (a
/// page dirty since before the checkpoint) are left in the log archive when the store keeps
/// one, as far as it reaches: the page's first read takes them from there, by the archive's
/// page index, so open does not read a stretch of log that grows with the dirty set. What the
/// archive does not reach yet is read from the log here, and with it the losers' records
/// among it (so that their rollback, under the engine latch, need not look for them in the
/// log). No page is read.
fn pending_redo(
    engine: &Engine,
    analysis: &Analysis,
    analysis_start: Lsn,
    analysed_changes: Vec<(Lsn, Arc<LogRecord>)>,
    undo_records: &mut HashMap<TxnId, HashMap<Lsn, LogRecord>>,
) -> Result<PendingRedo> {
    let losers: std::collections::HashSet<TxnId> = analysis.active().map(|(txn, _)| txn).collect();
    let mut pending = PendingRedo::default();
    let Some(redo_from) = analysis.redo_start() else {
        return Ok(pending);
    };
    // Changes below `log_from` come from the archive; the archive covers `1..=archived`.
    let log_from = match engine.pool.archive() {
        Some(archive) => archive
            .archived_lsn()
            .next()
            .min(analysis_start)
            .max(redo_from),
        None => redo_from,
    };
    for (page, rec_lsn, page_lsn) in analysis.dirty_pages() {
        if rec_lsn < log_from {
            pending.push_archived(page, rec_lsn, log_from, page_lsn);
        }
    }
    let mut add = |lsn: Lsn, record: Arc<LogRecord>| {
        for (page, _) in record.pages() {
            if analysis.rec_lsn(page).is_some_and(|since| since <= lsn) {
                pending.push(page, lsn, Arc::clone(&record));
            }
        }
    };
    if log_from < analysis_start {
        for (at, item) in engine.log.read_from(log_from)?.enumerate() {
            let (lsn, record) = item?;
            if at == 0 && lsn != log_from {
                return Err(log_starts_too_late(log_from));
            }
            if lsn >= analysis_start {
                break;
            }
            if losers.contains(&record.txn) {
                undo_records
                    .entry(record.txn)
                    .or_default()
                    .insert(lsn, record.clone());
            }
            if record.pages().next().is_some() {
                add(lsn, Arc::new(record));
            }
        }
    }
    for (lsn, record) in analysed_changes {
        add(lsn, record);
    }
    Ok(pending)
}

/// Classical undo: roll back every loser, newest transaction first. Losers held exclusive
/// locks on the keys they wrote, so no two of them wrote the same key and the order among them
/// does not change the result.
fn undo_everything(
    engine: &mut Engine,
    analysis: &Analysis,
    mut undo_records: HashMap<TxnId, HashMap<Lsn, LogRecord>>,
    report: &mut RestartReport,
) -> Result<()> {
    let losers: Vec<(TxnId, Lsn)> = analysis.active().collect();
    for &(txn, last_lsn) in losers.iter().rev() {
        let loser = Loser {
            txn,
            last_lsn,
            keys: Vec::new(),
            records: undo_records.remove(&txn).unwrap_or_default(),
        };
        undo_loser(engine, &loser, &mut report.compensations)?;
        report.losers.push(txn);
    }
    Ok(())
}

/// Rolls back one loser of a restart, with compensation records and its `Aborted` record.
///
/// # Errors
/// As [`rollback`].
pub(crate) fn undo_loser(
    engine: &mut Engine,
    loser: &Loser,
    compensations: &mut u64,
) -> Result<Lsn> {
    let log = Arc::clone(&engine.log);
    rollback(
        engine,
        loser.txn,
        loser.last_lsn,
        |lsn| {
            loser
                .records
                .get(&lsn)
                .cloned()
                .or_else(|| read_one(log.as_ref(), lsn).ok())
        },
        compensations,
    )
}
