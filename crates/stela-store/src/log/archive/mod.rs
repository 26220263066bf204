//! The log archive: the page-changing records of the log, kept in run files sorted by page id
//! within LSN ranges, so that one page's history is a few indexed reads instead of a scan of
//! the log. Single-page recovery reads it (`repair`), and it is what lets the log be truncated:
//! a record below the truncation point is gone from the log but not from the archive.
//!
//! This module owns the directory `dir/archive` and every file in it. Each run file
//! `run-<first>-<last>` holds the entries of the log records `first..=last` (format in
//! `archive_format`); an archiving step reads the log after the last run, sorts, and writes a
//! new run; merging replaces adjacent runs by one covering both. Invariants:
//! - The runs that are named (not `.partial`) cover `1..=archived` without a gap, and each
//!   holds every page change of its range. `archived` only grows, and it is the archive's
//!   durable progress: it is read back from the file names at open.
//! - A run is written to `<name>.partial`, synced, renamed to its name, then the directory is
//!   synced: a named run is always complete. A crash leaves at most a `.partial` file, removed
//!   at open.
//! - Merge inputs are removed only after the merged run is named and the directory synced; a
//!   crash in between leaves runs contained in another, and open removes them.
//! - At most [`MAX_RUNS`] runs remain after each step: merging picks the adjacent pair with the
//!   fewest bytes, so small recent runs are folded in often and large old ones seldom.
//!
//! Readers take a snapshot of the run list (each run keeps its file open), so a merge may
//! remove files they are reading.
//!
//! Pruning ([`LogArchive::backup_and_prune`]): without it the archive would hold every page
//! change since the store was made, because a page is rebuilt from its whole history. A *page
//! backup* `backup-<lsn>` gives that history a later start: a copy of every page, each holding
//! all of its changes up to `lsn` (the backup's LSN; pages past its end had none). Once the
//! backup is synced and named, the runs that end at or below `lsn` are removed, except the
//! newest (whose end says how far the archive goes). Invariants, with `floor` the newest
//! named backup's LSN (zero without one):
//! - the runs cover `first..=archived` without a gap, with `first <= floor + 1`: every page
//!   change after `floor` is in a run or still in the log;
//! - [`LogArchive::base_image`] is each page as of `floor`, so base image plus runs plus log
//!   is the page's whole history;
//! - a backup is written to `<name>.partial`, synced, renamed, and the directory synced before
//!   any run it allows to go is removed; the older backup goes after it is named. A crash
//!   leaves runs a backup covers (removed at open) or an older backup (removed at open), never
//!   a run removed that no named backup covers.

use crate::error::{Error, Result};
use crate::format::page::{Page, PageError, PageId, PAGE_SIZE};
use crate::format::LogRecord;
use crate::format::{self as run_format, Entry, IndexLayout, Pages, RunError, RunIndex, RunRange};
use crate::log::device::LogDevice;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use stela_format::Lsn;
use stela_wal::storage::{OpenMode, Storage, StorageFile};

/// Page changes read from the archive: by page, each page's in LSN order.
pub type PageHistories = BTreeMap<PageId, Vec<(Lsn, LogRecord)>>;

/// Runs kept after a step; past it, adjacent runs are merged.
pub const MAX_RUNS: usize = 8;

/// Most entries one archiving step puts in a run (bounds its memory).
const MAX_RUN_ENTRIES: usize = 1 << 16;
const PARTIAL: &str = ".partial";
/// Bytes a backup writes at once (and between the starts of their writeback).
const BACKUP_CHUNK: usize = 1 << 20;

/// One run file, open for reading, with its summary in memory and its index blocks as they
/// are first read.
struct Run {
    index: RunIndex,
    /// A version-2 run's index blocks, each read and checked the first time a page in it is
    /// looked up, then kept (a run's index is a few bytes per page it holds).
    blocks: Vec<OnceLock<Arc<Pages>>>,
    path: PathBuf,
    file: Box<dyn StorageFile>,
    len: u64,
}

impl Run {
    fn new(index: RunIndex, path: PathBuf, file: Box<dyn StorageFile>, len: u64) -> Run {
        Run {
            blocks: (0..index.blocks()).map(|_| OnceLock::new()).collect(),
            index,
            path,
            file,
            len,
        }
    }

    fn damaged(&self, source: RunError) -> Error {
        Error::Archive {
            path: self.path.clone(),
            source,
        }
    }

    /// The byte range of `page`'s entries in this run and how many there are, or `None` if
    /// the run holds none; reads the index block that would name it the first time.
    fn locate(&self, page: PageId) -> Result<Option<(std::ops::Range<u64>, u32)>> {
        match &self.index.layout {
            IndexLayout::Whole(pages) => Ok(pages.locate(page)),
            IndexLayout::Blocked(_) => match self.index.block_for(page) {
                Some(block) => Ok(self.block(block)?.locate(page)),
                None => Ok(None),
            },
        }
    }

    fn block(&self, block: usize) -> Result<Arc<Pages>> {
        let Some(cell) = self.blocks.get(block) else {
            return Err(self.damaged(RunError::Malformed {
                offset: self.index.index_offset,
                what: "no such index block",
            }));
        };
        if let Some(pages) = cell.get() {
            return Ok(Arc::clone(pages));
        }
        // Two readers may both read a block the first time; the second one's copy is dropped.
        let span = self.index.block_span(block);
        let mut bytes = vec![0u8; (span.end - span.start) as usize];
        self.file.read_exact_at(&mut bytes, span.start)?;
        let pages = Arc::new(
            run_format::decode_block(&self.index, block, &bytes).map_err(|e| self.damaged(e))?,
        );
        Ok(Arc::clone(cell.get_or_init(|| pages)))
    }
}

/// What one archiving step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArchiveReport {
    /// Runs written from the log.
    pub runs_written: u64,
    /// Entries (record, page) they hold.
    pub entries: u64,
    /// Merges done (each replaces two runs by one).
    pub merges: u64,
    /// The last LSN archived after the step.
    pub archived_lsn: Lsn,
    /// Runs after the step.
    pub runs: usize,
    /// Log segments removed by the truncation that followed.
    pub log_segments_removed: usize,
    /// A page backup the step took, and the runs it let go (see [`LogArchive::backup_and_prune`]).
    pub backup: Option<BackupReport>,
}

/// What taking a page backup and pruning behind it did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackupReport {
    /// The backup's LSN: every page in it holds its changes up to here.
    pub lsn: Lsn,
    /// Pages copied.
    pub pages: u64,
    /// Pages that failed their checks in the page file and were rebuilt for the copy.
    pub rebuilt: u64,
    /// Runs removed, and their bytes.
    pub runs_removed: u64,
    pub bytes_removed: u64,
}

/// The newest named page backup: page images as of its LSN.
struct Backup {
    lsn: Lsn,
    pages: u64,
    path: PathBuf,
    file: Box<dyn StorageFile>,
}

fn backup_name(lsn: Lsn) -> String {
    format!("backup-{:020}", lsn.get())
}

fn parse_backup_name(name: &str) -> Option<Lsn> {
    let digits = name.strip_prefix("backup-")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Lsn::new(digits.parse().ok()?))
}

/// The log archive of one store. See the module documentation.
pub struct LogArchive {
    /// Where the runs live: the store's storage (the real file system, or the
    /// fault-injecting one under a simulated power cut).
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    /// Whether run files and the directory are fsynced (off where nothing survives the machine).
    sync: bool,
    /// Ascending and contiguous, from at or below the backup's LSN + 1.
    runs: Mutex<Vec<Arc<Run>>>,
    /// The newest named backup (`None`: the runs start at LSN 1).
    backup: Mutex<Option<Arc<Backup>>>,
    /// Held by whoever writes runs or backups (archiving, merging, pruning): one at a time.
    writer: Mutex<()>,
}

fn run_name(range: RunRange) -> String {
    format!("run-{:020}-{:020}", range.first.get(), range.last.get())
}

fn parse_run_name(name: &str) -> Option<RunRange> {
    let rest = name.strip_prefix("run-")?;
    let (first, last) = rest.split_once('-')?;
    let digits = |s: &str| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(first) || !digits(last) {
        return None;
    }
    Some(RunRange {
        first: Lsn::new(first.parse().ok()?),
        last: Lsn::new(last.parse().ok()?),
    })
}

impl LogArchive {
    /// At most this many runs remain after each archiving step.
    pub const MAX_RUNS: usize = MAX_RUNS;

    /// Opens (or creates) the archive in `dir`: removes what a crash left behind (partial runs
    /// and backups, merge inputs whose merged run is complete, runs and backups a newer backup
    /// covers), reads every run's index, and checks that the runs cover the log from the
    /// backup's LSN (or LSN 1) without a gap.
    ///
    /// # Errors
    /// [`Error::Archive`] for a damaged run or a gap between runs or after the backup; I/O
    /// errors.
    pub fn open(
        storage: Arc<dyn Storage>,
        dir: impl AsRef<Path>,
        sync: bool,
    ) -> Result<LogArchive> {
        let dir = dir.as_ref().to_path_buf();
        storage.create_dir_all(&dir)?;
        let mut removed = false;
        let mut runs = Vec::new();
        let mut backups = Vec::new();
        for name in storage.list(&dir)? {
            let path = dir.join(&name);
            if name.ends_with(PARTIAL) {
                tracing::info!(path = %path.display(), "removing a file a crash left unfinished");
                storage.remove(&path)?;
                removed = true;
            } else if let Some(range) = parse_run_name(&name) {
                runs.push(load_run(storage.as_ref(), &path, range)?);
            } else if let Some(lsn) = parse_backup_name(&name) {
                backups.push((lsn, path));
            }
        }
        // The newest backup is the one pruning relied on; an older one a crash left goes.
        backups.sort();
        let backup = match backups.pop() {
            None => None,
            Some((lsn, path)) => {
                let file = storage.open(&path, OpenMode::Read)?;
                let pages = file.len()? / PAGE_SIZE as u64;
                Some(Arc::new(Backup {
                    lsn,
                    pages,
                    path,
                    file,
                }))
            }
        };
        for (_, older) in backups {
            storage.remove(&older)?;
            removed = true;
        }
        let floor = backup.as_ref().map_or(Lsn::ZERO, |b| b.lsn);
        let newest = runs.iter().map(|r| r.index.range.last).max();
        // Widest first among runs that start together, so a merged run precedes its inputs.
        runs.sort_by_key(|r: &Run| (r.index.range.first, std::cmp::Reverse(r.index.range.last)));
        let mut kept: Vec<Arc<Run>> = Vec::with_capacity(runs.len());
        for run in runs {
            let range = run.index.range;
            let archived = kept.last().map(|k| k.index.range.last);
            let covered = match archived {
                // Inside a run already kept: the input of a merge that completed.
                Some(archived) => range.last <= archived,
                // Wholly covered by the backup, and not the newest: pruning removed it, or
                // would have but for a crash.
                None => range.last <= floor && Some(range.last) != newest,
            };
            if covered {
                storage.remove(&run.path)?;
                removed = true;
            } else if range.first <= archived.unwrap_or(floor).next()
                && archived.is_none_or(|a| range.first == a.next())
            {
                kept.push(Arc::new(run));
            } else {
                return Err(Error::Archive {
                    path: run.path,
                    source: RunError::Gap {
                        archived: archived.unwrap_or(floor),
                        next: range.first,
                    },
                });
            }
        }
        let archive = LogArchive {
            storage,
            dir,
            sync,
            runs: Mutex::new(kept),
            backup: Mutex::new(backup),
            writer: Mutex::new(()),
        };
        if removed {
            archive.sync_dir()?;
        }
        Ok(archive)
    }

    /// The archive's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last LSN the archive holds (zero if none).
    pub fn archived_lsn(&self) -> Lsn {
        self.snapshot()
            .last()
            .map_or(Lsn::ZERO, |r| r.index.range.last)
    }

    /// The runs, as `(first, last)` LSN ranges, oldest first.
    pub fn runs(&self) -> Vec<(Lsn, Lsn)> {
        self.snapshot()
            .iter()
            .map(|r| (r.index.range.first, r.index.range.last))
            .collect()
    }

    fn snapshot(&self) -> Vec<Arc<Run>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn backup(&self) -> Option<Arc<Backup>> {
        self.backup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The LSN of the newest page backup (zero without one): every page change after it is in
    /// the runs or still in the log; [`LogArchive::base_image`] holds those before it.
    pub fn floor(&self) -> Lsn {
        self.backup().map_or(Lsn::ZERO, |b| b.lsn)
    }

    /// Page `id` as of [`LogArchive::floor`], where its history in the archive begins: its
    /// image in the page backup, or the empty page every page is before its first record
    /// (without a backup, or past the backup's end).
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the backup's image fails its checks too (the page cannot be
    /// rebuilt); I/O errors.
    pub fn base_image(&self, id: PageId) -> Result<Page> {
        let Some(backup) = self.backup() else {
            return Ok(Page::empty());
        };
        if id >= backup.pages {
            return Ok(Page::empty());
        }
        let mut image = vec![0u8; PAGE_SIZE];
        backup
            .file
            .read_exact_at(&mut image, id * PAGE_SIZE as u64)?;
        crate::format::page::decode(id, &image).map_err(|damage| {
            tracing::error!(page = id, backup = %backup.path.display(), %damage,
                "the page backup's image is damaged too");
            Error::Corrupt {
                page: id,
                source: PageError::Malformed(
                    "its stored image and its image in the page backup both fail their checks",
                ),
            }
        })
    }

    /// Bytes of the runs a backup at `through` would let go: those ending at or below it,
    /// except the newest.
    pub fn prunable_bytes(&self, through: Lsn) -> u64 {
        let runs = self.snapshot();
        let older = runs.len().saturating_sub(1);
        runs[..older]
            .iter()
            .filter(|r| r.index.range.last <= through)
            .map(|r| r.len)
            .sum()
    }

    /// Takes a page backup at `through` and removes the runs it covers (see the module
    /// documentation). `read` gives page `id` holding every change up to `through` (the page
    /// file's image, or one rebuilt from its history); pages `0..pages` are copied. The caller
    /// guarantees that the page file holds every change up to `through` and that nobody will
    /// read the archive's history of a page from below it, other than through
    /// [`LogArchive::base_image`]: the store passes the LSN it truncates its log before.
    ///
    /// # Errors
    /// What `read` returns; I/O errors. Nothing is removed unless the backup is named and
    /// synced.
    pub fn backup_and_prune(
        &self,
        through: Lsn,
        pages: u64,
        read: &mut dyn FnMut(PageId) -> Result<(Page, bool)>,
    ) -> Result<BackupReport> {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let mut report = BackupReport {
            lsn: through,
            pages,
            ..BackupReport::default()
        };
        if through <= self.floor() {
            return Ok(report);
        }
        let path = self.dir.join(backup_name(through));
        let partial = self.dir.join(format!("{}{PARTIAL}", backup_name(through)));
        match self.storage.remove(&partial) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        let copied = (|| -> Result<()> {
            let file = self.storage.open(&partial, OpenMode::CreateNew)?;
            let mut chunk = Vec::with_capacity(BACKUP_CHUNK);
            let mut image = Box::new([0u8; PAGE_SIZE]);
            let mut offset = 0u64;
            for id in 0..pages {
                let (page, rebuilt) = read(id)?;
                report.rebuilt += u64::from(rebuilt);
                crate::format::page::encode_into(id, &page, &mut image)
                    .map_err(|source| Error::Corrupt { page: id, source })?;
                chunk.extend_from_slice(&image[..]);
                if chunk.len() >= BACKUP_CHUNK || id + 1 == pages {
                    file.write_all_at(&chunk, offset)?;
                    offset += chunk.len() as u64;
                    chunk.clear();
                    if self.sync {
                        // A hint: the sync below then has little left to write.
                        file.start_writeback()?;
                    }
                }
            }
            if self.sync {
                file.sync_data()?;
            }
            Ok(self.storage.rename(&partial, &path)?)
        })();
        if let Err(error) = copied {
            // Not left for the next open: failing again and again (a full disk), each attempt
            // would leave a page file's worth behind.
            if let Err(cleanup) = self.storage.remove(&partial) {
                tracing::warn!(path = %partial.display(), %cleanup, "a failed backup's file stays");
            }
            return Err(error);
        }
        self.sync_dir()?;
        let file = self.storage.open(&path, OpenMode::Read)?;
        let older = self
            .backup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(Arc::new(Backup {
                lsn: through,
                pages,
                path,
                file,
            }));
        // Only now, with the new backup named and the directory synced, may the older backup
        // and the runs it makes needless go.
        let gone: Vec<Arc<Run>> = {
            let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
            let older_runs = runs.len().saturating_sub(1);
            let cut = runs[..older_runs]
                .iter()
                .take_while(|r| r.index.range.last <= through)
                .count();
            runs.drain(..cut).collect()
        };
        if let Some(older) = older {
            self.storage.remove(&older.path)?;
        }
        for run in &gone {
            self.storage.remove(&run.path)?;
            report.runs_removed += 1;
            report.bytes_removed += run.len;
        }
        self.sync_dir()?;
        tracing::info!(
            lsn = through.get(),
            pages,
            runs_removed = report.runs_removed,
            bytes_removed = report.bytes_removed,
            "page backup taken, archive pruned behind it"
        );
        Ok(report)
    }

    /// Archives the log's records after the archive's end up to `upto` (which must be durable
    /// in the log), in runs of at most `MAX_RUN_ENTRIES` entries. Returns runs and entries
    /// written.
    ///
    /// # Errors
    /// [`Error::Archive`] with [`RunError::Gap`] if the log no longer holds the record after
    /// the archive's end; log and I/O errors.
    pub fn archive_from(&self, log: &dyn LogDevice, upto: Lsn) -> Result<(u64, u64)> {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let (mut runs, mut written) = (0, 0);
        loop {
            let from = self.archived_lsn().next();
            if from > upto {
                return Ok((runs, written));
            }
            let mut entries: Vec<Entry> = Vec::new();
            let mut last = None;
            for item in log.read_from(from)? {
                let (lsn, record) = item?;
                if last.is_none() && lsn != from {
                    return Err(Error::Archive {
                        path: self.dir.clone(),
                        source: RunError::Gap {
                            archived: Lsn::new(from.get() - 1),
                            next: lsn,
                        },
                    });
                }
                if lsn > upto {
                    break;
                }
                entries.extend(run_format::entries_of(lsn, &record));
                last = Some(lsn);
                if entries.len() >= MAX_RUN_ENTRIES {
                    break;
                }
            }
            let Some(last) = last else {
                return Ok((runs, written));
            };
            written += entries.len() as u64;
            let run = self.write_run(RunRange { first: from, last }, entries)?;
            self.runs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(run);
            runs += 1;
        }
    }

    /// Merges adjacent runs until at most [`MAX_RUNS`] remain; returns how many merges.
    ///
    /// # Errors
    /// [`Error::Archive`] for a run that no longer reads back intact; I/O errors.
    pub fn merge(&self) -> Result<u64> {
        self.merge_down_to(MAX_RUNS)
    }

    /// [`LogArchive::merge`] with another bound (tests merge everything into one run).
    pub fn merge_down_to(&self, max_runs: usize) -> Result<u64> {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let mut merges = 0;
        loop {
            let runs = self.snapshot();
            if runs.len() <= max_runs.max(1) {
                return Ok(merges);
            }
            let at = (0..runs.len() - 1)
                .min_by_key(|&i| runs[i].len + runs[i + 1].len)
                .expect("at least two runs");
            let (older, newer) = (&runs[at], &runs[at + 1]);
            let mut entries = read_all(older)?;
            entries.extend(read_all(newer)?);
            let range = RunRange {
                first: older.index.range.first,
                last: newer.index.range.last,
            };
            let merged = self.write_run(range, entries)?;
            {
                let mut list = self.runs.lock().unwrap_or_else(|p| p.into_inner());
                list.splice(at..at + 2, [merged]);
            }
            // Only now, with the merged run named and the directory synced, may they go.
            self.storage.remove(&older.path)?;
            self.storage.remove(&newer.path)?;
            self.sync_dir()?;
            merges += 1;
        }
    }

    /// The history of page `page` after `after` that the archive holds, in LSN order, and the
    /// last LSN archived when it was read (the log holds the rest of the history after it).
    ///
    /// # Errors
    /// [`Error::Archive`] for a damaged run; I/O errors.
    pub fn page_history(&self, page: PageId, after: Lsn) -> Result<(Vec<(Lsn, LogRecord)>, Lsn)> {
        let runs = self.snapshot();
        let archived = runs.last().map_or(Lsn::ZERO, |r| r.index.range.last);
        let mut history = Vec::new();
        for run in runs.iter().filter(|r| r.index.range.last > after) {
            let Some((stretch, count)) = run.locate(page)? else {
                continue;
            };
            let mut bytes = vec![0u8; (stretch.end - stretch.start) as usize];
            run.file.read_exact_at(&mut bytes, stretch.start)?;
            let entries = run_format::decode_entries_within(
                &bytes,
                stretch.start,
                page,
                count,
                run.index.range,
                after.next()..=Lsn::MAX,
            )
            .map_err(|source| Error::Archive {
                path: run.path.clone(),
                source,
            })?;
            history.extend(entries.into_iter().map(|e| (e.lsn, e.record)));
        }
        Ok((history, archived))
    }

    /// The changes in `from..below` of each of `pages` (ascending page ids), by page, each
    /// page's in LSN order, and the last LSN archived when they were read. One read per run
    /// that overlaps the window, spanning the stretches of the first to the last of `pages`
    /// (neighbours in a page-sorted run): what instant restart's background redo wants for a
    /// batch of pages, instead of one read per run and page.
    ///
    /// # Errors
    /// [`Error::Archive`] for a damaged run; I/O errors.
    pub fn histories_of(
        &self,
        pages: &[PageId],
        from: Lsn,
        below: Lsn,
    ) -> Result<(PageHistories, Lsn)> {
        let runs = self.snapshot();
        let archived = runs.last().map_or(Lsn::ZERO, |r| r.index.range.last);
        let mut histories = PageHistories::new();
        if below <= from {
            return Ok((histories, archived));
        }
        let upto = Lsn::new(below.get() - 1);
        let overlapping = runs
            .iter()
            .filter(|r| r.index.range.last >= from && r.index.range.first <= upto);
        for run in overlapping {
            let mut located = Vec::with_capacity(pages.len());
            for &page in pages {
                if let Some((at, count)) = run.locate(page)? {
                    located.push((page, at, count));
                }
            }
            let (Some((_, first, _)), Some((_, last, _))) = (located.first(), located.last())
            else {
                continue;
            };
            let span = first.start..last.end;
            let mut bytes = vec![0u8; (span.end - span.start) as usize];
            run.file.read_exact_at(&mut bytes, span.start)?;
            for (page, stretch, count) in &located {
                let within =
                    (stretch.start - span.start) as usize..(stretch.end - span.start) as usize;
                let entries = run_format::decode_entries_within(
                    &bytes[within],
                    stretch.start,
                    *page,
                    *count,
                    run.index.range,
                    from..=upto,
                )
                .map_err(|source| Error::Archive {
                    path: run.path.clone(),
                    source,
                })?;
                if !entries.is_empty() {
                    histories
                        .entry(*page)
                        .or_default()
                        .extend(entries.into_iter().map(|e| (e.lsn, e.record)));
                }
            }
        }
        Ok((histories, archived))
    }

    /// Every page change in `from..=upto` the archive holds, by page, each page's in LSN
    /// order. Reads the runs that overlap the range whole and in order (sequential reads of
    /// page-sorted files: what a cleaner lagging behind the archive wants), and decodes only
    /// the records in the range (a merged run spans most of the log; a cleaner or restart
    /// wants its end).
    ///
    /// # Errors
    /// [`Error::Archive`] for a damaged run; I/O errors.
    pub fn changes_between(
        &self,
        from: Lsn,
        upto: Lsn,
    ) -> Result<BTreeMap<PageId, Vec<(Lsn, LogRecord)>>> {
        let mut changes: BTreeMap<PageId, Vec<(Lsn, LogRecord)>> = BTreeMap::new();
        let overlapping = self
            .snapshot()
            .into_iter()
            .filter(|r| r.index.range.last >= from && r.index.range.first <= upto);
        for run in overlapping {
            let damaged = |source| Error::Archive {
                path: run.path.clone(),
                source,
            };
            // One sequential read of the whole run; its index blocks are checked as they are
            // decoded from it, and so is every stretch they name.
            let mut bytes = vec![0u8; run.len as usize];
            run.file.read_exact_at(&mut bytes, 0)?;
            let index = &run.index;
            let pages = run_format::pages_of(index, &bytes).map_err(damaged)?;
            for page in &pages.pages {
                let Some((stretch, count)) = pages.locate(page.page) else {
                    continue;
                };
                let Some(stretch_bytes) = bytes.get(stretch.start as usize..stretch.end as usize)
                else {
                    return Err(damaged(run_format::RunError::TooShort { len: run.len }));
                };
                let entries = run_format::decode_entries_within(
                    stretch_bytes,
                    stretch.start,
                    page.page,
                    count,
                    index.range,
                    from..=upto,
                )
                .map_err(damaged)?;
                if !entries.is_empty() {
                    changes
                        .entry(page.page)
                        .or_default()
                        .extend(entries.into_iter().map(|e| (e.lsn, e.record)));
                }
            }
        }
        Ok(changes)
    }

    /// Writes a run durably under its name and opens it for reading.
    fn write_run(&self, range: RunRange, entries: Vec<Entry>) -> Result<Arc<Run>> {
        let bytes = run_format::encode_run(range, entries).map_err(|source| Error::Archive {
            path: self.dir.clone(),
            source,
        })?;
        let path = self.dir.join(run_name(range));
        let partial = self.dir.join(format!("{}{PARTIAL}", run_name(range)));
        match self.storage.remove(&partial) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        {
            let file = self.storage.open(&partial, OpenMode::CreateNew)?;
            file.write_all_at(&bytes, 0)?;
            if self.sync {
                file.sync_data()?;
            }
        }
        self.storage.rename(&partial, &path)?;
        self.sync_dir()?;
        let index = run_format::decode_run_summary(&bytes).map_err(|source| Error::Archive {
            path: path.clone(),
            source,
        })?;
        let file = self.storage.open(&path, OpenMode::Read)?;
        Ok(Arc::new(Run::new(index, path, file, bytes.len() as u64)))
    }

    fn sync_dir(&self) -> Result<()> {
        if self.sync {
            self.storage.sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

/// Opens the run at `path` and reads its summary (header, trailer, and the fences of a
/// version-2 run or the whole index of a version-1 run; not the entries).
fn load_run(storage: &dyn Storage, path: &Path, named: RunRange) -> Result<Run> {
    let damaged = |source| Error::Archive {
        path: path.to_path_buf(),
        source,
    };
    let file = storage.open(path, OpenMode::Read)?;
    let len = file.len()?;
    if len < (run_format::HEADER_LEN + run_format::TRAILER_LEN) as u64 {
        return Err(damaged(RunError::TooShort { len }));
    }
    let mut header = [0u8; run_format::HEADER_LEN];
    file.read_exact_at(&mut header, 0)?;
    let mut trailer = [0u8; run_format::TRAILER_LEN];
    file.read_exact_at(&mut trailer, len - run_format::TRAILER_LEN as u64)?;
    let span = run_format::summary_span(len, &header, &trailer).map_err(damaged)?;
    let mut summary = vec![0u8; (span.end - span.start) as usize];
    file.read_exact_at(&mut summary, span.start)?;
    let index = run_format::decode_summary(&header, &summary, &trailer).map_err(damaged)?;
    if index.range != named {
        return Err(damaged(RunError::Malformed {
            offset: 16,
            what: "the run's range is not the one its name says",
        }));
    }
    Ok(Run::new(index, path.to_path_buf(), file, len))
}

/// Every entry of a run, read and checked whole.
fn read_all(run: &Run) -> Result<Vec<Entry>> {
    let mut bytes = vec![0u8; run.len as usize];
    run.file.read_exact_at(&mut bytes, 0)?;
    let (_, _, entries) = run_format::decode_run(&bytes).map_err(|source| Error::Archive {
        path: run.path.clone(),
        source,
    })?;
    Ok(entries)
}

#[cfg(test)]
mod tests;
