//! Checkpoints: the records that bound how much log restart must analyse, and the master
//! record that names the latest complete one.
//!
//! A checkpoint is a `CheckpointBegin` record, then a `CheckpointEnd` record carrying the
//! dirty-page, transaction and lock tables for the begin record, then (once the end is durable)
//! the master record `dir/checkpoint` rewritten to name both. Restart trusts only what the
//! master record names, so a checkpoint cut short by a crash is simply not used. Two ways to
//! get the tables, chosen at open:
//! - classical: the store copies them from the buffer pool, the transaction table and the lock
//!   table under the engine latch (`Store::checkpoint`), after syncing the page file so that
//!   every page the pool holds clean is clean on disk too;
//! - decoupled ([`Decoupled`]): log analysis from where the previous checkpoint's analysis
//!   stopped to the new begin record, over tables kept in memory between checkpoints (the
//!   previous checkpoint's, so the log before it is never read again). It takes no latch.
//!
//! This module owns the master record's bytes and the decoupled checkpoint's cached tables.
//! Invariant: the master record names a begin and an end record that are both durable, and the
//! end record's tables are correct for analysis starting at that begin record.

use crate::analysis::Analysis;
use crate::error::{Error, Result};
use crate::format::{CheckpointKind, CheckpointTables, LogBody, LogRecord, SYSTEM_TXN};
use crate::log::LogDevice;
use crate::tail::{Consumer, LogTail};
use std::path::Path;
use stela_format::Lsn;
use stela_wal::storage::{OpenMode, Storage};

// The master record, `dir/checkpoint`, 20 bytes, little-endian:
//   0   8   LSN of the checkpoint's begin record
//   8   8   LSN of its end record
//   16  4   CRC32C of bytes 0..16
const MASTER_FILE: &str = "checkpoint";
const MASTER_LEN: usize = 20;

/// The latest complete checkpoint: where restart's analysis starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Master {
    pub begin: Lsn,
    pub end: Lsn,
}

/// A small file holding a payload followed by its CRC32C, little-endian (the master record,
/// the standby follower's progress), as read.
pub(crate) enum Sealed {
    Absent,
    /// Of another length, or failing its checksum.
    Damaged,
    /// The payload.
    Intact(Vec<u8>),
}

/// Reads the sealed file at `path`, whose payload is `payload_len` bytes.
///
/// # Errors
/// I/O errors other than the file's absence.
pub(crate) fn read_sealed(
    storage: &dyn Storage,
    path: &Path,
    payload_len: usize,
) -> Result<Sealed> {
    let mut bytes = match storage
        .open(path, OpenMode::Read)
        .and_then(|file| file.read_to_vec())
    {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Sealed::Absent),
        Err(e) => return Err(e.into()),
    };
    let intact = bytes.len() == payload_len + 4
        && u32::from_le_bytes(bytes[payload_len..].try_into().expect("4 bytes"))
            == crc32c::crc32c(&bytes[..payload_len]);
    if !intact {
        return Ok(Sealed::Damaged);
    }
    bytes.truncate(payload_len);
    Ok(Sealed::Intact(bytes))
}

impl Master {
    /// The master record in `dir`, if a checkpoint was ever completed there and the record
    /// survived. It is written without a sync (see [`Master::write`]), so after a machine crash
    /// it may be missing or empty: then there is no checkpoint to start from, and restart
    /// analyses the whole log, which is slower and just as correct.
    ///
    /// # Errors
    /// I/O errors reading it.
    pub fn read(storage: &dyn Storage, dir: &Path) -> Result<Option<Master>> {
        let path = dir.join(MASTER_FILE);
        let bytes = match read_sealed(storage, &path, MASTER_LEN - 4)? {
            Sealed::Absent => return Ok(None),
            Sealed::Damaged => {
                tracing::warn!(path = %path.display(), "damaged master record: analysing the whole log");
                return Ok(None);
            }
            Sealed::Intact(bytes) => bytes,
        };
        let at = |i: usize| Lsn::new(u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8")));
        Ok(Some(Master {
            begin: at(0),
            end: at(8),
        }))
    }

    /// Makes the master record in `dir` durable (file and directory), before the log is
    /// truncated behind the checkpoint it names. The caller keeps checkpoints from replacing it
    /// meanwhile.
    ///
    /// # Errors
    /// I/O errors.
    pub(crate) fn sync(storage: &dyn Storage, dir: &Path) -> Result<()> {
        match storage.open(&dir.join(MASTER_FILE), OpenMode::Read) {
            Ok(file) => file.sync_data()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        storage.sync_dir(dir)?;
        Ok(())
    }

    /// Replaces the master record in `dir` atomically (write a new file, rename it over). No
    /// sync: any master record that survives names a complete checkpoint (its end record was
    /// durable before the record was written), an older one as well as the newest, and the log
    /// is truncated only behind a master record that [`Master::sync`] made durable, so losing
    /// a newer one costs restart time only.
    pub(crate) fn write(&self, storage: &dyn Storage, dir: &Path) -> Result<()> {
        let mut bytes = [0u8; MASTER_LEN];
        bytes[..8].copy_from_slice(&self.begin.get().to_le_bytes());
        bytes[8..16].copy_from_slice(&self.end.get().to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..16]);
        bytes[16..].copy_from_slice(&crc.to_le_bytes());
        let temporary = dir.join("checkpoint.new");
        match storage.remove(&temporary) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        storage
            .open(&temporary, OpenMode::CreateNew)?
            .write_all_at(&bytes, 0)?;
        storage.rename(&temporary, &dir.join(MASTER_FILE))?;
        Ok(())
    }
}

/// What one checkpoint recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointReport {
    pub kind: CheckpointKind,
    pub begin: Lsn,
    pub end: Lsn,
    pub tables: CheckpointTables,
    /// Log records the decoupled checkpoint analysed (0 for a classical one).
    pub records_analyzed: u64,
}

/// Appends a checkpoint's begin record.
pub(crate) fn begin(log: &dyn LogDevice) -> Result<Lsn> {
    log.append(&LogRecord {
        txn: SYSTEM_TXN,
        prev_txn_lsn: Lsn::ZERO,
        body: LogBody::CheckpointBegin,
    })
}

/// Appends the end record with `tables`, waits until it is durable, then points the master
/// record at the checkpoint.
pub(crate) fn end(
    log: &dyn LogDevice,
    storage: &dyn Storage,
    dir: &Path,
    begin: Lsn,
    kind: CheckpointKind,
    tables: CheckpointTables,
    records_analyzed: u64,
) -> Result<CheckpointReport> {
    let end = log.append(&LogRecord {
        txn: SYSTEM_TXN,
        prev_txn_lsn: Lsn::ZERO,
        body: LogBody::CheckpointEnd {
            begin,
            kind,
            tables: tables.clone(),
        },
    })?;
    log.flush(end)?;
    Master { begin, end }.write(storage, dir)?;
    Ok(CheckpointReport {
        kind,
        begin,
        end,
        tables,
        records_analyzed,
    })
}

/// The decoupled checkpoint's state: analysis tables for every record up to
/// `analysis.applied_to`, carried from one checkpoint to the next (and, at open, from
/// restart's analysis).
pub(crate) struct Decoupled {
    pub analysis: Analysis,
}

impl Decoupled {
    /// The tables for the begin record at `begin`: analysis of the records after the last one
    /// analysed, up to and including `begin` (appended; it need not be durable yet).
    pub fn tables_at(&mut self, log: &LogTail, begin: Lsn) -> Result<(CheckpointTables, u64)> {
        let analysed = self.analyse_to(log, begin)?;
        if self.analysis.applied_to < begin {
            return Err(Error::BadLogRecord {
                lsn: begin,
                source: crate::format::RecordError::Invalid(
                    "the checkpoint's begin record could not be read back",
                ),
            });
        }
        Ok((self.analysis.tables(), analysed))
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
        for item in log.records_from(from)? {
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
