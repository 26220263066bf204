//! Checkpoints: the records that bound how much log restart must analyse, and the master
//! record that names the latest complete one.
//!
//! A checkpoint is a `CheckpointBegin` record, then a `CheckpointEnd` record carrying the
//! dirty-page, transaction and lock tables for the begin record, then (once the end is durable)
//! a master record naming both ([`MasterSlots`]). Restart trusts only what a master record
//! names, so a checkpoint cut short by a crash is simply not used. Two ways to get the tables,
//! chosen at open:
//! - classical: the store copies them from the buffer pool, the transaction table and the lock
//!   table under the engine latch (`Store::checkpoint`), after syncing the page file so that
//!   every page the pool holds clean is clean on disk too;
//! - decoupled ([`Decoupled`]): log analysis from where the previous checkpoint's analysis
//!   stopped to the new begin record, over tables kept in memory between checkpoints (the
//!   previous checkpoint's, so the log before it is never read again). It takes no latch.
//!   Taken soon after another, it logs its end record as a delta (`CheckpointDelta`: the
//!   entries that changed since the previous checkpoint), so that checkpoints every
//!   millisecond do not each log a table of thousands of pages; the deltas since the last full
//!   end record form a chain, whose full record (its root) the master record names too.
//!
//! This module owns the decoupled checkpoint's cached tables; the master record's two files are
//! `recovery::master`'s.
//! Invariants:
//! - Every intact master record names a begin and an end record that were durable when it was
//!   written, and the end record's tables (for a delta: the root's, with every delta of the
//!   chain up to the end record applied in order) are correct for analysis starting at that
//!   begin. Each delta names the end record before it in its chain as its base, and the root.
//! - The slot the log's truncation relies on ([`MasterSlots::pin`]) is durable and is not
//!   overwritten until the other slot, naming a newer checkpoint, has been made durable in its
//!   place; restart takes the intact slot naming the newest checkpoint, so whatever a crash
//!   does to the other slot, restart never starts before what the truncated log still holds.

use crate::error::{Error, Result};
use crate::format::{
    CheckpointKind, CheckpointTables, LogBody, LogRecord, TableChanges, SYSTEM_TXN,
};
use crate::log::tail::{Consumer, LogTail, RecordBuffer};
use crate::log::LogDevice;
use crate::recovery::analysis::Analysis;
use crate::recovery::master::{Master, MasterSlots};
use stela_format::Lsn;
use stela_wal::storage::Storage;

/// What one checkpoint recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointReport {
    pub kind: CheckpointKind,
    pub begin: Lsn,
    pub end: Lsn,
    /// The checkpoint's tables (whole, also when its record logged only their changes).
    pub tables: CheckpointTables,
    /// Log records the decoupled checkpoint analysed (0 for a classical one).
    pub records_analyzed: u64,
    /// For a delta, the dirty-page entries it logged; `None` for a full checkpoint.
    pub delta_entries: Option<usize>,
}

/// What a checkpoint wrote, before its report: a delta's whole tables are built only for a
/// report that is asked for ([`Written::into_report`]); the background's checkpoints, every
/// millisecond at the shortest interval, never build them.
pub(crate) struct Written {
    kind: CheckpointKind,
    begin: Lsn,
    end: Lsn,
    /// The tables, when the checkpoint logged them whole.
    tables: Option<CheckpointTables>,
    records_analyzed: u64,
    delta_entries: Option<usize>,
}

impl Written {
    /// The report, with the tables whole. `decoupled` must not have analysed past the
    /// checkpoint's begin record since it was written (the checkpoint mutex held throughout).
    pub fn into_report(self, decoupled: &Decoupled) -> CheckpointReport {
        CheckpointReport {
            kind: self.kind,
            begin: self.begin,
            end: self.end,
            tables: self.tables.unwrap_or_else(|| decoupled.analysis.tables()),
            records_analyzed: self.records_analyzed,
            delta_entries: self.delta_entries,
        }
    }
}

/// Appends a checkpoint's begin record.
pub(crate) fn begin(log: &dyn LogDevice) -> Result<Lsn> {
    log.append(&LogRecord {
        txn: SYSTEM_TXN,
        prev_txn_lsn: Lsn::ZERO,
        body: LogBody::CheckpointBegin,
    })
}

/// Appends the end record with `tables`, waits until it is durable, then writes a master
/// record naming the checkpoint.
pub(crate) fn end(
    log: &dyn LogDevice,
    storage: &dyn Storage,
    master: &mut MasterSlots,
    begin: Lsn,
    kind: CheckpointKind,
    tables: CheckpointTables,
    records_analyzed: u64,
) -> Result<Written> {
    let record = LogRecord {
        txn: SYSTEM_TXN,
        prev_txn_lsn: Lsn::ZERO,
        body: LogBody::CheckpointEnd {
            begin,
            kind,
            tables,
        },
    };
    let end = log.append(&record)?;
    // The tables go on to the report: taken back from the record rather than copied (a few
    // thousand dirty pages at every checkpoint).
    let LogBody::CheckpointEnd { tables, .. } = record.body else {
        unreachable!("built as a checkpoint's end record above")
    };
    log.flush(end)?;
    master.write(storage, Master::full(begin, end))?;
    Ok(Written {
        kind,
        begin,
        end,
        tables: Some(tables),
        records_analyzed,
        delta_entries: None,
    })
}

/// Appends a decoupled checkpoint's end record as the changes from the checkpoint `last`
/// recorded, waits until it is durable, then writes a master record naming it.
fn end_delta(
    log: &dyn LogDevice,
    storage: &dyn Storage,
    master: &mut MasterSlots,
    begin: Lsn,
    last: &LastCheckpoint,
    changes: TableChanges,
) -> Result<Lsn> {
    let end = log.append(&LogRecord {
        txn: SYSTEM_TXN,
        prev_txn_lsn: Lsn::ZERO,
        body: LogBody::CheckpointDelta {
            begin,
            base: last.end,
            root: last.root,
            changes,
        },
    })?;
    log.flush(end)?;
    master.write(
        storage,
        Master {
            begin,
            end,
            root: last.root,
        },
    )?;
    Ok(end)
}

/// What a store's checkpoint mutex guards: the master record's slots, which checkpoints write
/// and the log's truncation pins, and the decoupled checkpoint's tables.
pub(crate) struct Checkpointer {
    pub master: MasterSlots,
    pub decoupled: Decoupled,
}

/// Longest stretch of log, in records, from a chain's full checkpoint to the begin record of
/// a delta on it: restart reads the log from the full checkpoint, so this bounds what a
/// chain adds to restart's reading (a few milliseconds of decoding).
pub(crate) const MAX_CHAIN_RECORDS: u64 = 16_384;

/// The last checkpoint written, as the next decoupled one may log its changes from.
pub(crate) struct LastCheckpoint {
    /// Its end record.
    end: Lsn,
    /// The end record of the full checkpoint its chain starts from.
    root: Lsn,
    /// Dirty-page entries of the full checkpoint at the root.
    root_entries: usize,
    /// Dirty-page entries the chain's deltas have logged so far.
    chain_entries: usize,
}

/// The decoupled checkpoint's state: analysis tables for every record up to
/// `analysis.applied_to`, carried from one checkpoint to the next (and, at open, from
/// restart's analysis), and the last checkpoint written, which the next may be a delta of.
/// The analysis is marked ([`Analysis::mark`]) at every decoupled checkpoint written, so that
/// what it lists as changed is what changed since `last`.
pub(crate) struct Decoupled {
    pub analysis: Analysis,
    /// `None` after open and after a classical checkpoint: the next one is logged whole.
    pub last: Option<LastCheckpoint>,
    /// The analysis's reads of the log tail, reused from one checkpoint to the next.
    pub records: RecordBuffer,
}

impl Decoupled {
    /// A decoupled checkpoint at `begin` (appended): analysis up to it, then its end record,
    /// logged as the changes since the last checkpoint when they are fewer than the table's
    /// entries and the chain they extend stays within a full table's entries and
    /// [`MAX_CHAIN_RECORDS`] of log (so a chain costs at most twice the log one full checkpoint
    /// would, and restart reads little more), and whole otherwise.
    pub fn checkpoint(
        &mut self,
        log: &LogTail,
        storage: &dyn Storage,
        master: &mut MasterSlots,
        begin: Lsn,
    ) -> Result<Written> {
        let analysed = self.analyse_through(log, begin)?;
        let dirty_entries = self.analysis.dirty_len();
        let delta = self.last.as_ref().and_then(|last| {
            if begin.get().saturating_sub(last.root.get()) > MAX_CHAIN_RECORDS {
                return None;
            }
            // Built from what analysis listed as changed since the last checkpoint, not by
            // comparing two whole tables.
            let changes = self.analysis.changes();
            // Smaller than the table itself (an empty table is logged whole: a chain would
            // only hold the log back), and the chain within a full table's entries.
            let small = changes.entries() < dirty_entries
                && last.chain_entries + changes.entries() <= last.root_entries;
            small.then_some((last, changes))
        });
        // A checkpoint that fails to be written returns here and leaves `last` and the mark as
        // they were: the next delta is still of the last checkpoint written.
        let written = match delta {
            Some((last, changes)) => {
                let entries = changes.entries();
                let end = end_delta(log, storage, master, begin, last, changes)?;
                Written {
                    kind: CheckpointKind::Decoupled,
                    begin,
                    end,
                    tables: None,
                    records_analyzed: analysed,
                    delta_entries: Some(entries),
                }
            }
            None => end(
                log,
                storage,
                master,
                begin,
                CheckpointKind::Decoupled,
                self.analysis.tables(),
                analysed,
            )?,
        };
        self.wrote(&written, dirty_entries);
        Ok(written)
    }

    /// Remembers the checkpoint written as the one the next may be a delta of, and marks the
    /// analysis there.
    fn wrote(&mut self, written: &Written, dirty_entries: usize) {
        let previous = self.last.take();
        self.last = Some(match (written.delta_entries, previous) {
            (Some(entries), Some(previous)) => LastCheckpoint {
                end: written.end,
                root: previous.root,
                root_entries: previous.root_entries,
                chain_entries: previous.chain_entries + entries,
            },
            _ => LastCheckpoint {
                end: written.end,
                root: written.end,
                root_entries: dirty_entries,
                chain_entries: 0,
            },
        });
        self.analysis.mark();
    }

    /// Analysis of the records after the last one analysed, up to and including `begin`
    /// (appended; it need not be durable yet); returns how many.
    fn analyse_through(&mut self, log: &LogTail, begin: Lsn) -> Result<u64> {
        let analysed = self.analyse_to(log, begin)?;
        if self.analysis.applied_to < begin {
            return Err(Error::BadLogRecord {
                lsn: begin,
                source: crate::format::RecordError::Invalid(
                    "the checkpoint's begin record could not be read back",
                ),
            });
        }
        Ok(analysed)
    }

    /// Analyses the records after the last one analysed, up to `to` or the last one the log
    /// holds now if that is sooner, and releases from the log tail every record analysed (also
    /// when reading fails part way); returns how many. Between checkpoints this keeps the
    /// analysis, and the tail it reads, close to the log's end, so the records of a long
    /// interval are not all held in memory until its checkpoint.
    pub fn analyse_to(&mut self, log: &LogTail, to: Lsn) -> Result<u64> {
        let analysed = self.apply_to(log, to);
        log.release(Consumer::Checkpoint, self.analysis.applied_to.next());
        analysed
    }

    fn apply_to(&mut self, log: &LogTail, to: Lsn) -> Result<u64> {
        let from = Lsn::new(self.analysis.applied_to.get() + 1);
        let mut analysed = 0;
        if from > to {
            return Ok(0);
        }
        // Applied in place: if reading fails half way, the tables are still those of every
        // record up to `applied_to`, and the next call continues from there.
        for item in log.records_reusing(from, &mut self.records)? {
            let (lsn, record) = item?;
            if analysed == 0 && lsn != from {
                // The log was truncated past this analysis (it was not the store's kind).
                return Err(Error::BadLogRecord {
                    lsn: from,
                    source: crate::format::RecordError::Invalid(
                        "the log no longer holds the records after the last analysis",
                    ),
                });
            }
            if lsn > to {
                break;
            }
            self.analysis.apply(lsn, &record);
            analysed += 1;
        }
        Ok(analysed)
    }
}
