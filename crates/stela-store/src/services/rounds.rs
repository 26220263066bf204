//! One round of each persistence service on the shared state: a checkpoint (classical or
//! decoupled), a decoupled checkpoint's analysis between checkpoints, a cleaning round, an
//! archiving step (archive, merge, truncate the log, prune the archive behind a page backup).
//! The background threads (`open`) and the store's on-request calls run the same rounds.

use crate::error::{Error, Result};
use crate::format::page::{Page, PageId, PAGE_SIZE};
use crate::format::{CheckpointKind, CheckpointTables, LogBody};
use crate::log::archive::{ArchiveReport, BackupReport, LogArchive};
use crate::log::tail::Consumer;
use crate::log::LogDevice;
use crate::options::CleanerKind;
use crate::services::checkpoint::{self, CheckpointReport, Checkpointer, Decoupled, Written};
use crate::services::cleaner::{self, CleanReport};
use crate::services::retention::LogNeeds;
use crate::services::shared::Shared;
use std::sync::atomic::Ordering;
use stela_format::Lsn;

impl Shared {
    pub(crate) fn checkpoint(&self) -> Result<CheckpointReport> {
        self.checkpoint_of(self.options.checkpoints)
    }

    pub(crate) fn checkpoint_of(&self, kind: CheckpointKind) -> Result<CheckpointReport> {
        self.take_checkpoint(kind, Written::into_report)
    }

    /// A checkpoint nobody reads the report of (the background's, and the one at close): a
    /// decoupled one that logs a delta then costs what changed, not the whole tables.
    pub(crate) fn checkpoint_unreported(&self) -> Result<()> {
        self.take_checkpoint(self.options.checkpoints, |_, _| ())
    }

    /// Takes a checkpoint of `kind` and hands what it wrote to `finish`, with the checkpoint
    /// mutex still held (so the decoupled analysis is still at its begin record).
    fn take_checkpoint<R>(
        &self,
        kind: CheckpointKind,
        finish: impl FnOnce(Written, &Decoupled) -> R,
    ) -> Result<R> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        let mut checkpointer = self.checkpointer.lock().unwrap_or_else(|p| p.into_inner());
        let Checkpointer { master, decoupled } = &mut *checkpointer;
        let log: &dyn LogDevice = self.log.as_ref();
        let result = (|| {
            // Report the pool's eviction writes, so analysis sees those pages become clean.
            self.file.log_writes(log)?;
            let begin = checkpoint::begin(log)?;
            let storage = self.options.wal.storage.as_ref();
            match kind {
                CheckpointKind::Classical => {
                    // The next decoupled checkpoint starts a chain of its own: its analysis
                    // has not seen these tables, and the log may be cut behind this one.
                    decoupled.last = None;
                    let tables = self.copy_tables()?;
                    checkpoint::end(log, storage, master, begin, kind, tables, 0)
                }
                // No flush of the begin record first: analysis reads it from the tail (or the
                // log hands it to the OS before reading), and the end record's flush makes it
                // durable with everything before it.
                CheckpointKind::Decoupled => {
                    decoupled.checkpoint(&self.log, storage, master, begin)
                }
            }
        })();
        let written = self.check(result)?;
        Ok(finish(written, decoupled))
    }

    /// Between decoupled checkpoints: analyses the records appended since the last analysis
    /// and releases them from the log tail (the next checkpoint then analyses only what came
    /// after). Nothing is logged.
    pub(crate) fn analyse_ahead(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        let mut checkpointer = self.checkpointer.lock().unwrap_or_else(|p| p.into_inner());
        let result = checkpointer
            .decoupled
            .analyse_to(&self.log, self.log.last_lsn());
        self.check(result.map(drop))
    }

    /// The classical checkpoint's tables, copied under the engine latch (and, inside it, the
    /// transaction table's and the lock table's).
    fn copy_tables(&self) -> Result<CheckpointTables> {
        // Every page the pool holds clean, or has evicted, must be clean on disk too. The sync
        // before the begin record (reporting the pool's eviction writes) usually covers every
        // write; only a write made since is synced under the latch.
        let engine = self.engine()?;
        self.file.sync_if_unsynced()?;
        let dirty_pages = engine.pool.dirty_pages();
        let txns = self.txns.lock().unwrap_or_else(|p| p.into_inner());
        let mut locks = self.locks.exclusive_by_txn();
        let active = txns
            .iter()
            .map(|(&txn, &(_, last_lsn))| crate::format::ActiveTxn {
                txn,
                last_lsn,
                locks: locks.remove(&txn).unwrap_or_default(),
            })
            .collect();
        Ok(CheckpointTables {
            dirty_pages,
            active,
            next_page: engine.next_page,
            max_txn: self.next_txn.load(Ordering::Relaxed).saturating_sub(1),
        })
    }

    pub(crate) fn archive(&self) -> Result<ArchiveReport> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        let Some(archive) = &self.archive else {
            return Ok(ArchiveReport::default());
        };
        let result = (|| {
            let (runs_written, entries) =
                archive.archive_from(self.log.as_ref(), self.log.durable_lsn())?;
            let merges = archive.merge()?;
            let (log_segments_removed, keep_from) = self.truncate_log(archive)?;
            Ok((
                runs_written,
                entries,
                merges,
                log_segments_removed,
                keep_from,
            ))
        })();
        let (runs_written, entries, merges, log_segments_removed, keep_from) =
            self.check(result)?;
        // Not through `check`: a backup that fails (a full disk, a failed fsync of its own
        // file) has removed nothing, since the runs go only after it is named and synced, so
        // the store is whole and goes on; the error is the caller's (the service logs it), and
        // the next step tries again with a new file.
        let backup = self.prune_archive(archive, keep_from)?;
        Ok(ArchiveReport {
            runs_written,
            entries,
            merges,
            archived_lsn: archive.archived_lsn(),
            runs: archive.runs().len(),
            log_segments_removed,
            backup,
        })
    }

    /// Takes a page backup and prunes the archive behind it when `archive_prune_after` says
    /// so. The backup's LSN is the one the log was just truncated before, less one: below it,
    /// every page change is in the page file (restart's redo starts after it) and no reader of
    /// the log or the archive starts there (`retention`), so only single-page recovery still
    /// wants those changes, and it starts from the backup. A page failing its checks in the
    /// page file is rebuilt for the copy from its history up to the durable LSN (never a
    /// change a crash may still lose).
    fn prune_archive(&self, archive: &LogArchive, keep_from: Lsn) -> Result<Option<BackupReport>> {
        let Some(after) = self.options.archive_prune_after else {
            return Ok(None);
        };
        let through = Lsn::new(keep_from.get().saturating_sub(1));
        let pages = self.file.pages()?;
        let prunable = archive.prunable_bytes(through);
        // Nothing to prune covers `through <= floor` too: the runs a backup there would
        // remove are gone already.
        if prunable == 0 || prunable < after.max(pages * PAGE_SIZE as u64) {
            return Ok(None);
        }
        // Instant restart's pending redo may still read a page's older changes from the runs.
        if self.recovery_pending().pages > 0 {
            return Ok(None);
        }
        let log: &dyn LogDevice = self.log.as_ref();
        let mut read = |id: PageId| -> Result<(Page, bool)> {
            match self.file.read(id)? {
                Ok(page) => Ok((page, false)),
                Err(damage) => {
                    tracing::warn!(page = id, %damage, "rebuilding a damaged page for the backup");
                    let durable = log.durable_lsn();
                    let page = crate::access::repair::rebuild_damaged(id, durable, archive, log)?;
                    Ok((page, true))
                }
            }
        };
        Ok(Some(archive.backup_and_prune(through, pages, &mut read)?))
    }

    /// Truncates the log below what its readers need (see `retention`), and returns that
    /// bound. Holds the checkpoint mutex, so the master record pinned here names the
    /// checkpoint the bound comes from.
    fn truncate_log(&self, archive: &LogArchive) -> Result<(usize, Lsn)> {
        let mut checkpointer = self.checkpointer.lock().unwrap_or_else(|p| p.into_inner());
        let log: &dyn LogDevice = self.log.as_ref();
        // For a delta, the chain's full checkpoint bounds both: restart reads from its end
        // record, and no page dirty in the delta's tables has a `rec_lsn` below both the full
        // checkpoint's begin and its table's oldest (a page first dirtied later was changed
        // after that begin; an entry's `rec_lsn` never moves back).
        let checkpoint = match checkpointer.master.pin(self.options.wal.storage.as_ref())? {
            None => None,
            Some(master) => match crate::log::read_one(log, master.root)?.body {
                LogBody::CheckpointEnd { begin, tables, .. } => {
                    Some((begin, tables.dirty_pages.iter().map(|d| d.rec_lsn).min()))
                }
                _ => None,
            },
        };
        // Under the engine latch: a write appends its record and enters the table together.
        let oldest_running = {
            let _engine = self.engine()?;
            let txns = self.txns.lock().unwrap_or_else(|p| p.into_inner());
            txns.values().map(|&(first, _)| first).min()
        };
        let needs = LogNeeds {
            archived: archive.archived_lsn(),
            checkpoint,
            oldest_running,
            // Only the configured kind runs on its own; a decoupled checkpoint asked for anyway
            // after the log moved on finds the gap and fails (`checkpoint`).
            analysis_next: (self.options.checkpoints == CheckpointKind::Decoupled)
                .then(|| checkpointer.decoupled.analysis.applied_to.next()),
            cleaner_next: (self.options.cleaner == CleanerKind::Decoupled)
                .then(|| Lsn::new(self.clean_lsn.load(Ordering::Acquire)).next()),
        };
        let keep_from = needs.keep_from();
        let removed = log.truncate_before(keep_from)?;
        drop(checkpointer);
        Ok((removed, keep_from))
    }

    pub(crate) fn clean(&self) -> Result<CleanReport> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        let mut cleaning = self.cleaning.lock().unwrap_or_else(|p| p.into_inner());
        let (cache, records) = &mut *cleaning;
        let result = match self.options.cleaner {
            // The classical cleaner writes only what the pool holds: pages with redo pending
            // stay as they are stored (and dirty in the tables) until read.
            CleanerKind::Classical => {
                cleaner::classical_round(&self.engine, self.log.as_ref(), &self.file)
            }
            CleanerKind::Decoupled => {
                let round = cleaner::decoupled_round(
                    &self.log,
                    &self.file,
                    &self.clean_lsn,
                    cache,
                    records,
                    self.archive.as_deref(),
                );
                if let Ok(round) = &round {
                    self.log.release(Consumer::Cleaner, round.clean_lsn.next());
                }
                round
            }
        };
        self.check(result)
    }
}
