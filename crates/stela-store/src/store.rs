//! [`Store`] and [`Transaction`]: the public API, and the order in which latches and locks are
//! taken.
//!
//! This module owns the store's concurrency rules:
//! - A transaction takes its key lock (shared to read, exclusive to write) before it touches the
//!   tree, and keeps every lock until it has committed or rolled back (strict 2PL). Lock waits
//!   happen outside the engine latch, so a waiting transaction never blocks the others' work.
//! - Every tree operation runs under the engine latch (one mutex around pool, tree and page
//!   allocation). The lock table's own mutex may be taken under the engine latch, never the
//!   reverse, so the two cannot deadlock.
//! - Commit appends the transaction's commit record and waits for the log to be durable up to
//!   it, at the log's level (that is the store's commit durability), then releases the locks.
//! - A log or page-file failure poisons the store: every later call fails with
//!   [`Error::Poisoned`] until it is reopened, because memory may then be ahead of the log.
//! - The transaction table (running transactions that wrote, with their last LSN) changes only
//!   under the engine latch, together with the log record that changes it, so a classical
//!   checkpoint copying it under the latch sees it agree with the pool and the lock table.
//! - Persistence services (checkpoints, page cleaning) run on background threads when an
//!   interval is set, and on request ([`Store::checkpoint`], [`Store::clean`]). Their kind is
//!   chosen at open; the decoupled ones take no engine latch. Between decoupled checkpoints
//!   their analysis catches up with the log every `ANALYSIS_STEP`, so the in-memory log tail
//!   never holds a whole interval's records. Dropping the store stops them (and is a crash);
//!   [`Store::close`] stops them, then writes every page and checkpoints.
//! - With a log archive (`StoreOptions::archive`), an archiving step ([`Store::archive`], or its
//!   thread) archives the durable log, merges runs, and truncates the log below what
//!   `retention` says every reader still needs; it holds the checkpoint mutex meanwhile, so the
//!   master record it synced stays the one its bound was computed from.
//! - After an instant restart ([`RestartMode::Instant`]) new transactions run while restart's
//!   work is still pending. Redo is the pool's (a page is redone when first read). Each loser
//!   holds the exclusive locks of the keys it wrote, taken under its own id before open
//!   returns, so no new transaction sees its writes; it is rolled back, under the engine latch
//!   like an abort, by whichever comes first: the background restart thread, or a transaction
//!   about to wait for one of its locks, which rolls it back itself rather than wait behind the
//!   whole queue of losers. Its locks are released once its `Aborted` record is appended. The
//!   transaction table holds losers from open until then, so a classical checkpoint taken
//!   meanwhile records them.

use crate::archive::{ArchiveReport, BackupReport, LogArchive};
use crate::btree::Engine;
use crate::checkpoint::{
    self, CheckpointReport, Checkpointer, Decoupled, Master, MasterSlots, Written,
};
use crate::cleaner::{self, CleanReport, CleanerKind};
use crate::error::{Error, Result};
use crate::format::{CheckpointKind, CheckpointTables, LogBody, LogRecord, TxnId};
use crate::lock::{LockManager, LockMode};
use crate::log::LogDevice;
use crate::page::{Page, PageId, MAX_KEY, MAX_VALUE, PAGE_SIZE};
use crate::pagefile::PageFile;
use crate::pool::{BufferPool, PoolStats};
use crate::recovery::{self, Loser, RestartMode, RestartReport};
use crate::repair::PageRepair;
use crate::retention::LogNeeds;
use crate::tail::{Consumer, LogTail};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use stela_format::Lsn;
use stela_wal::{SyncMode, Wal, WalOptions};

/// How a store is opened.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Frames in the buffer pool (8 KiB each); at least 8.
    pub pool_pages: usize,
    /// The embedded log's options, used by [`Store::open`]: its `sync` is the commit durability.
    /// Its `storage` holds the page file and the master record too, whichever log the store
    /// runs on (the fault-injecting storage of `stela_wal`'s `testing` feature makes a power
    /// cut hit the pages and the log alike).
    pub wal: WalOptions,
    /// How checkpoints get their tables.
    pub checkpoints: CheckpointKind,
    /// Which page cleaner runs.
    pub cleaner: CleanerKind,
    /// Take checkpoints on a background thread, pausing this long after each before the next
    /// (`None`: only on request). A pause, not a period: a slower checkpoint runs less often.
    pub checkpoint_interval: Option<Duration>,
    /// Run cleaning rounds on a background thread, pausing this long after each (`None`: only
    /// on request).
    pub clean_interval: Option<Duration>,
    /// fdatasync the page file before reporting page writes to the log. Needed for the store
    /// to survive the machine's crash; `Store::open` turns it off when the log is not synced
    /// either (`SyncMode::None`), whose commits survive only the process.
    pub sync_pages: bool,
    /// Keep a log archive in `dir/archive`: pages that fail their checks are rebuilt from it
    /// (single-page recovery), and the log is truncated behind it. A page is rebuilt from a
    /// page backup and the changes the archive holds after it (see `archive_prune_after`).
    pub archive: bool,
    /// Prune the archive: when its runs that the log's truncation point has passed hold at
    /// least this many bytes, and at least as many as the page file, an archiving step copies
    /// the page file into a page backup and removes those runs. The runs then stay within
    /// about the larger of this and the page file's size, plus the runs the truncation point
    /// has not passed yet, beside one backup of the page file's size. Each backup copies the
    /// whole page file, hence the page file's size as a lower bound: a backup is taken only
    /// when it frees at least as much as it writes. `None`: never prune, and the archive holds
    /// every page change since the store was made.
    pub archive_prune_after: Option<u64>,
    /// Run archiving steps (archive, merge, truncate the log) on a background thread, pausing
    /// this long after each (`None`: only on request). Needs `archive`.
    pub archive_interval: Option<Duration>,
    /// Evict a dirty page whose records are durable without writing it; its next read
    /// rebuilds it from the archive and the log. Needs `archive`.
    pub elide_writes: bool,
    /// How restart after a crash runs: classical ARIES before open returns, or instant (open
    /// after analysis, redo and undo on demand and in the background).
    pub restart: RestartMode,
    /// Instant restart only: whether a background thread finishes restart's redo and undo.
    /// Without it they happen only on demand (a page read, a lock wait), and at
    /// [`Store::close`] or [`Store::finish_recovery`]; tests use that to see the on-demand
    /// paths at work.
    pub recover_in_background: bool,
    /// Run the background threads (persistence services, instant restart's redo and undo)
    /// under `SCHED_BATCH`, so that their wake-ups never preempt a transaction holding the
    /// engine latch (see `background`). On by default; a machine with idle CPUs loses nothing
    /// either way.
    pub batch_services: bool,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            pool_pages: 1024,
            // The log's open must not grow with the log, or instant restart would not be
            // instant: it verifies only the last segment (restart checks every record it
            // reads anyway), and segments of 8 MiB bound what that verification, and every
            // read that starts inside a segment (restart's, at a checkpoint), scans first.
            wal: WalOptions::default()
                .type_tag(crate::log::TYPE_TAG)
                .verify_on_open(false)
                .segment_bytes(8 << 20),
            checkpoints: CheckpointKind::Decoupled,
            cleaner: CleanerKind::Decoupled,
            checkpoint_interval: None,
            clean_interval: None,
            sync_pages: true,
            archive: false,
            archive_prune_after: Some(64 << 20),
            archive_interval: None,
            elide_writes: false,
            restart: RestartMode::Instant,
            recover_in_background: true,
            batch_services: true,
        }
    }
}

impl StoreOptions {
    pub fn pool_pages(mut self, pages: usize) -> Self {
        self.pool_pages = pages;
        self
    }

    pub fn wal(mut self, wal: WalOptions) -> Self {
        self.wal = wal;
        self
    }

    pub fn checkpoints(mut self, kind: CheckpointKind) -> Self {
        self.checkpoints = kind;
        self
    }

    pub fn cleaner(mut self, kind: CleanerKind) -> Self {
        self.cleaner = kind;
        self
    }

    pub fn checkpoint_interval(mut self, interval: Option<Duration>) -> Self {
        self.checkpoint_interval = interval;
        self
    }

    pub fn clean_interval(mut self, interval: Option<Duration>) -> Self {
        self.clean_interval = interval;
        self
    }

    pub fn sync_pages(mut self, sync: bool) -> Self {
        self.sync_pages = sync;
        self
    }

    pub fn archive(mut self, archive: bool) -> Self {
        self.archive = archive;
        self
    }

    pub fn archive_prune_after(mut self, bytes: Option<u64>) -> Self {
        self.archive_prune_after = bytes;
        self
    }

    pub fn archive_interval(mut self, interval: Option<Duration>) -> Self {
        self.archive_interval = interval;
        self
    }

    pub fn elide_writes(mut self, elide: bool) -> Self {
        self.elide_writes = elide;
        self
    }

    pub fn restart(mut self, mode: RestartMode) -> Self {
        self.restart = mode;
        self
    }

    pub fn recover_in_background(mut self, background: bool) -> Self {
        self.recover_in_background = background;
        self
    }

    pub fn batch_services(mut self, batch: bool) -> Self {
        self.batch_services = batch;
        self
    }
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

/// Pages the background restart thread redoes per hold of the engine latch: small enough that
/// a transaction waits at most a few page reads for the latch.
const DRAIN_BATCH: usize = 16;

/// How often decoupled checkpoints' analysis catches up with the log between checkpoints.
const ANALYSIS_STEP: Duration = Duration::from_millis(10);

/// Most records the in-memory log tail holds for the decoupled services (about 200 bytes
/// each); past it they read the log files.
const TAIL_CAP: usize = 1 << 21;

/// What the store's threads share.
struct Shared {
    engine: Mutex<Engine>,
    locks: LockManager,
    /// Running transactions that have written, with their first and last LSN. See the module
    /// documentation for when it changes.
    txns: Mutex<BTreeMap<TxnId, (Lsn, Lsn)>>,
    next_txn: AtomicU64,
    poisoned: AtomicBool,
    /// The log, through the in-memory tail the decoupled services read.
    log: Arc<LogTail>,
    file: Arc<PageFile>,
    /// The decoupled cleaner's clean LSN (stays zero with the classical cleaner).
    clean_lsn: Arc<crate::sync::AtomicU64>,
    options: StoreOptions,
    /// Serialises checkpoints and the log's truncation; the master record's slots, and the
    /// decoupled checkpoint's tables between checkpoints.
    checkpointer: Mutex<Checkpointer>,
    /// Serialises cleaning rounds; the decoupled cleaner's images, and its buffer for reading
    /// the log tail, between rounds.
    cleaning: Mutex<(crate::image_cache::ImageCache, crate::tail::RecordBuffer)>,
    /// The log archive, if the store keeps one.
    archive: Option<Arc<LogArchive>>,
    /// Losers of an instant restart not yet being rolled back. One is taken out of the map by
    /// the thread that rolls it back, so no loser is rolled back twice.
    losers: Mutex<BTreeMap<TxnId, Loser>>,
    /// Losers whose rollback has not completed (includes one being rolled back); zero lets
    /// lock acquisition skip looking for losers.
    losers_left: AtomicUsize,
}

/// A transactional key-value store. See the crate documentation.
///
/// Dropping a store without [`Store::close`] is a crash: the dirty pages in the pool are lost
/// and the next open recovers from the log.
pub struct Store {
    shared: Arc<Shared>,
    restart: RestartReport,
    /// Set to stop the background services; they wait on the condition variable.
    stop: Arc<(Mutex<bool>, Condvar)>,
    services: Vec<JoinHandle<()>>,
}

impl Store {
    /// Opens (or creates) the store in `dir`: pages in `dir/pages`, the embedded log in
    /// `dir/log`. Runs restart recovery first.
    ///
    /// # Errors
    /// Log errors (damage, locked by another process), [`Error::Corrupt`] for a page restart
    /// cannot read, I/O errors.
    pub fn open(dir: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        let dir = dir.as_ref();
        options.wal.storage.create_dir_all(dir)?;
        let started = Instant::now();
        let wal: Wal<LogRecord> = Wal::open(dir.join("log"), options.wal.clone())?;
        tracing::debug!(elapsed = ?started.elapsed(), "log opened");
        let options = if options.wal.sync == SyncMode::None {
            options.sync_pages(false)
        } else {
            options
        };
        Store::open_with_log(dir, Arc::new(wal), options)
    }

    /// Opens the store in `dir` (its pages and master record) on the log `log_name` kept by
    /// the stela daemon at `address`, at `wal`'s durability (`buffered`, `disk`, `replicated`,
    /// `replicated-disk`): commits are acknowledged by the daemon's group commit, and a crash of
    /// this process loses no commit the level covers. `options.wal` is unused. At `buffered`
    /// the page file is not fsync'ed, as with the embedded log at `SyncMode::None`.
    ///
    /// # Errors
    /// [`Error::Daemon`] when the daemon cannot be reached or refuses the log,
    /// [`Error::Unsupported`] at `unsafe`; otherwise as [`Store::open`].
    pub fn open_on_daemon<A>(
        dir: impl AsRef<Path>,
        address: A,
        log_name: &str,
        wal: stela_client::WalOptions,
        options: StoreOptions,
    ) -> Result<Store>
    where
        A: TryInto<stela_client::Address>,
        stela_client::Error: From<A::Error>,
    {
        let buffered = wal.durability == stela_client::Durability::Buffered;
        let log = crate::daemon::DaemonLog::open(address, log_name, wal)?;
        let options = if buffered {
            options.sync_pages(false)
        } else {
            options
        };
        Store::open_with_log(dir, Arc::new(log), options)
    }

    /// Opens the store in `dir` on the given log (any [`LogDevice`]); `options.wal` is unused.
    ///
    /// # Errors
    /// As [`Store::open`].
    pub fn open_with_log(
        dir: impl AsRef<Path>,
        log: Arc<dyn LogDevice>,
        options: StoreOptions,
    ) -> Result<Store> {
        let dir = dir.as_ref();
        let storage = Arc::clone(&options.wal.storage);
        storage.create_dir_all(dir)?;
        let file = crate::pagefile::open_in(storage.as_ref(), dir)?;
        let file = Arc::new(PageFile::new(file, options.sync_pages));
        // The tail keeps records only for a decoupled service that runs on its own thread: a
        // service called only on request may not be called for a long time, and would make the
        // tail hold records up to its cap. On request, it reads the log files instead.
        let mut consumers = Vec::new();
        if options.checkpoints == CheckpointKind::Decoupled && options.checkpoint_interval.is_some()
        {
            consumers.push(Consumer::Checkpoint);
        }
        if options.cleaner == CleanerKind::Decoupled && options.clean_interval.is_some() {
            consumers.push(Consumer::Cleaner);
        }
        let log = Arc::new(LogTail::new(log, &consumers, TAIL_CAP));
        let clean_lsn = Arc::new(crate::sync::AtomicU64::new(0));
        let mut engine = Engine {
            pool: BufferPool::new(
                Arc::clone(&file),
                options.pool_pages,
                Arc::clone(&clean_lsn),
            ),
            log: Arc::clone(&log) as Arc<dyn LogDevice>,
            next_page: file.pages()?.max(1),
        };
        let opening = std::time::Instant::now();
        let archive = match options.archive {
            true => Some(Arc::new(LogArchive::open(
                Arc::clone(&storage),
                dir.join("archive"),
                options.sync_pages,
            )?)),
            false => None,
        };
        tracing::debug!(elapsed = ?opening.elapsed(), "archive opened");
        if let Some(archive) = &archive {
            // Before restart: its redo may read a damaged page too.
            engine
                .pool
                .attach_repair(PageRepair::new(Arc::clone(archive), options.elide_writes));
        }
        let (master_slots, master) = MasterSlots::open(storage.as_ref(), dir)?;
        let followed_to = match followed_to(storage.as_ref(), dir, master, log.as_ref())? {
            // An empty page file without a checkpoint, on a log that has records: the log's
            // `PagesWritten` records are about another page file (a directory new to an
            // existing log), and trusting them would skip redo this file needs. It holds every
            // change up to LSN 0, like a follower that applied nothing.
            None if master.is_none() && file.pages()? == 0 && log.last_lsn() > Lsn::ZERO => {
                Some(Lsn::ZERO)
            }
            followed => followed,
        };
        let restarted = recovery::restart(&mut engine, master, followed_to, options.restart)?;
        let (restart, analysis) = (restarted.report, restarted.analysis);
        tracing::debug!(?restart, "store restarted");
        if options.cleaner == CleanerKind::Decoupled {
            // Every change below redo's start is in the stored images (analysis found no page
            // that lacks one); without anything to redo, every change analysed is.
            let clean = restart
                .redo_start
                .map_or(analysis.applied_to, |lsn| Lsn::new(lsn.get() - 1));
            clean_lsn.store(clean.get(), Ordering::Release);
            log.release(Consumer::Cleaner, clean.next());
        }
        log.release(Consumer::Checkpoint, analysis.applied_to.next());
        let shared = Arc::new(Shared {
            next_txn: AtomicU64::new(restart.max_txn + 1),
            engine: Mutex::new(engine),
            locks: LockManager::default(),
            txns: Mutex::new(BTreeMap::new()),
            poisoned: AtomicBool::new(false),
            log,
            file,
            clean_lsn,
            options: options.clone(),
            checkpointer: Mutex::new(Checkpointer {
                master: master_slots,
                decoupled: Decoupled {
                    analysis,
                    last: None,
                    records: Vec::new(),
                },
            }),
            cleaning: Mutex::new((crate::image_cache::ImageCache::default(), Vec::new())),
            archive,
            losers_left: AtomicUsize::new(restarted.losers.len()),
            losers: Mutex::new(BTreeMap::new()),
        });
        {
            // Before any transaction can begin: the losers' locks and transaction-table entries.
            // The lock table is empty, so no acquisition waits.
            let mut txns = shared.txns.lock().unwrap_or_else(|p| p.into_inner());
            let mut losers = shared.losers.lock().unwrap_or_else(|p| p.into_inner());
            for loser in restarted.losers {
                for key in &loser.keys {
                    shared.locks.acquire(loser.txn, key, LockMode::Exclusive)?;
                }
                // Its first record is not known here (the chain may reach before the
                // checkpoint): keep the whole log until it is rolled back, which is soon.
                txns.insert(loser.txn, (Lsn::FIRST, loser.last_lsn));
                losers.insert(loser.txn, loser);
            }
        }
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let mut services = Vec::new();
        if let Some(interval) = options.checkpoint_interval {
            // Decoupled checkpoints keep their analysis up with the log between checkpoints
            // (every `ANALYSIS_STEP`), so the tail does not hold a whole interval of records.
            let decoupled = options.checkpoints == CheckpointKind::Decoupled;
            let step = if decoupled {
                interval.min(ANALYSIS_STEP)
            } else {
                interval
            };
            let mut due = Instant::now() + interval;
            services.push(spawn_service(
                "stela-store-checkpoint",
                &shared,
                &stop,
                step,
                move |s| {
                    let now = Instant::now();
                    if decoupled && now < due {
                        return s.analyse_ahead();
                    }
                    due = now + interval;
                    s.checkpoint_unreported()
                },
            )?);
        }
        if let Some(interval) = options.clean_interval {
            services.push(spawn_service(
                "stela-store-cleaner",
                &shared,
                &stop,
                interval,
                |s| s.clean().map(|_| ()),
            )?);
        }
        if let Some(interval) = options.archive_interval {
            services.push(spawn_service(
                "stela-store-archiver",
                &shared,
                &stop,
                interval,
                |s| s.archive().map(|_| ()),
            )?);
        }
        let pending = shared.recovery_pending();
        if options.recover_in_background && !pending.is_done() {
            services.push(spawn_restart_worker(&shared, &stop)?);
        }
        Ok(Store {
            shared,
            restart,
            stop,
            services,
        })
    }

    /// What an instant restart has left to do (nothing after a classical one).
    pub fn recovery_pending(&self) -> RecoveryPending {
        self.shared.recovery_pending()
    }

    /// Does in this thread whatever an instant restart has left to do (the background thread,
    /// if any, keeps taking its share meanwhile); returns once nothing is left.
    ///
    /// # Errors
    /// Log and page errors of the redo or the undo (the store is then poisoned for log and I/O
    /// errors); [`Error::Poisoned`].
    pub fn finish_recovery(&self) -> Result<()> {
        loop {
            if self.shared.recovery_step()? {
                continue;
            }
            if self.shared.losers_left.load(Ordering::Acquire) == 0 {
                return Ok(());
            }
            // A loser another thread is rolling back: wait for its end.
            if self.shared.poisoned.load(Ordering::Acquire) {
                return Err(Error::Poisoned);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Starts a transaction.
    pub fn begin(&self) -> Transaction<'_> {
        Transaction {
            store: self,
            id: self.shared.next_txn.fetch_add(1, Ordering::Relaxed),
            last_lsn: Lsn::ZERO,
            writes: HashMap::new(),
            finished: false,
        }
    }

    /// What the restart at open found and did.
    pub fn restart_report(&self) -> &RestartReport {
        &self.restart
    }

    /// The buffer pool's I/O counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.shared
            .engine()
            .map(|e| e.pool.stats())
            .unwrap_or_default()
    }

    /// Takes a checkpoint of the kind chosen at open.
    ///
    /// # Errors
    /// Log and page-file errors (the store is then poisoned); [`Error::Poisoned`].
    pub fn checkpoint(&self) -> Result<CheckpointReport> {
        self.shared.checkpoint()
    }

    /// Takes a checkpoint of the given kind, whatever was chosen at open (tests compare them).
    ///
    /// # Errors
    /// As [`Store::checkpoint`].
    pub fn checkpoint_of(&self, kind: CheckpointKind) -> Result<CheckpointReport> {
        self.shared.checkpoint_of(kind)
    }

    /// Runs one round of the page cleaner chosen at open.
    ///
    /// # Errors
    /// As [`Store::checkpoint`], and [`Error::Corrupt`] for a stored page the decoupled cleaner
    /// cannot read.
    pub fn clean(&self) -> Result<CleanReport> {
        self.shared.clean()
    }

    /// Runs one archiving step: archives the durable log, merges runs down to
    /// [`crate::archive::MAX_RUNS`], and truncates the log below what every reader of it still
    /// needs. Does nothing without an archive (`StoreOptions::archive`).
    ///
    /// # Errors
    /// [`Error::Archive`], log and I/O errors; [`Error::Poisoned`].
    pub fn archive(&self) -> Result<ArchiveReport> {
        self.shared.archive()
    }

    /// The log archive, if the store keeps one.
    pub fn log_archive(&self) -> Option<&LogArchive> {
        self.shared.archive.as_deref()
    }

    /// Writes every dirty page, syncs the page file and takes a checkpoint: the next open
    /// then has nothing to redo and analyses only the checkpoint. Running transactions must
    /// have ended.
    ///
    /// # Errors
    /// I/O and log errors; [`Error::Poisoned`].
    pub fn close(mut self) -> Result<()> {
        self.stop_services();
        self.finish_recovery()?;
        let shared = &self.shared;
        {
            let mut engine = shared.engine()?;
            let log = Arc::clone(&engine.log);
            let last = log.last_lsn();
            if last > log.durable_lsn() {
                log.flush(last)?;
            }
            shared.check(engine.pool.flush_all(log.as_ref()))?;
        }
        shared.checkpoint_unreported()
    }

    fn stop_services(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_all();
        for service in self.services.drain(..) {
            let _ = service.join();
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop_services();
    }
}

/// A standby follower's progress in `dir` (`follow`), while it still speaks for the directory:
/// until the store has completed a checkpoint of its own there (the master record then names
/// a begin record past the progress, and restart needs nothing else).
///
/// # Errors
/// [`Error::Follow`] when the pages hold changes the log does not (the log ends below the
/// progress: not the log the follower followed, or one that lost its end).
fn followed_to(
    storage: &dyn stela_wal::storage::Storage,
    dir: &Path,
    master: Option<Master>,
    log: &dyn LogDevice,
) -> Result<Option<Lsn>> {
    let Some(followed) = crate::follow::read_progress(storage, dir)? else {
        return Ok(None);
    };
    if master.is_some_and(|master| master.begin > followed) {
        return Ok(None);
    }
    if followed > log.last_lsn() {
        return Err(Error::Follow(format!(
            "{}: the page images hold every change up to {followed}, but the log ends at {}",
            dir.display(),
            log.last_lsn()
        )));
    }
    Ok(Some(followed))
}

/// Runs `work` every `interval` on a thread of its own until the store stops. Errors are
/// logged (and have poisoned the store where they must), not fatal to the thread.
fn spawn_service(
    name: &str,
    shared: &Arc<Shared>,
    stop: &Arc<(Mutex<bool>, Condvar)>,
    interval: Duration,
    mut work: impl FnMut(&Shared) -> Result<()> + Send + 'static,
) -> Result<JoinHandle<()>> {
    let stop = Arc::clone(stop);
    let name_for_log = name.to_owned();
    spawn_background(name, shared, move |shared| loop {
        {
            let (stopped, wake) = &*stop;
            let guard = stopped.lock().unwrap_or_else(|p| p.into_inner());
            let (guard, _) = wake
                .wait_timeout_while(guard, interval, |stopped| !*stopped)
                .unwrap_or_else(|p| p.into_inner());
            if *guard {
                return;
            }
        }
        if let Err(error) = work(shared) {
            if matches!(error, Error::Poisoned) {
                return;
            }
            tracing::warn!(service = %name_for_log, %error, "persistence service failed");
        }
    })
}

/// The background thread of an instant restart: rolls back the losers, then redoes the pending
/// pages, a step at a time, until nothing is left or the store stops. A failure poisons the
/// store where it must (and is logged); the work left is then the next restart's.
fn spawn_restart_worker(
    shared: &Arc<Shared>,
    stop: &Arc<(Mutex<bool>, Condvar)>,
) -> Result<JoinHandle<()>> {
    let stop = Arc::clone(stop);
    spawn_background("stela-store-restart", shared, move |shared| loop {
        if *stop.0.lock().unwrap_or_else(|p| p.into_inner()) {
            return;
        }
        match shared.recovery_step() {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                tracing::warn!(%error, "background restart failed");
                return;
            }
        }
    })
}

/// Starts one of the store's background threads, named `name`, running `body`; under
/// `SCHED_BATCH` when the store's options ask for it (see `background`).
fn spawn_background(
    name: &str,
    shared: &Arc<Shared>,
    body: impl FnOnce(&Shared) + Send + 'static,
) -> Result<JoinHandle<()>> {
    let shared = Arc::clone(shared);
    let thread_name = name.to_owned();
    Ok(std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            if shared.options.batch_services {
                crate::background::yield_to_transactions(&thread_name);
            }
            body(&shared)
        })?)
}

impl Shared {
    fn engine(&self) -> Result<MutexGuard<'_, Engine>> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        Ok(self.engine.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Poisons the store on errors after which memory may be ahead of the log.
    fn check<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(Error::Log(_) | Error::Daemon(_) | Error::Io(_)) = &result {
            self.poisoned.store(true, Ordering::Release);
        }
        result
    }

    fn checkpoint(&self) -> Result<CheckpointReport> {
        self.checkpoint_of(self.options.checkpoints)
    }

    fn checkpoint_of(&self, kind: CheckpointKind) -> Result<CheckpointReport> {
        self.take_checkpoint(kind, Written::into_report)
    }

    /// A checkpoint nobody reads the report of (the background's, and the one at close): a
    /// decoupled one that logs a delta then costs what changed, not the whole tables.
    fn checkpoint_unreported(&self) -> Result<()> {
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
    fn analyse_ahead(&self) -> Result<()> {
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

    fn archive(&self) -> Result<ArchiveReport> {
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
                    let page = crate::repair::rebuild_damaged(id, durable, archive, log)?;
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

    fn recovery_pending(&self) -> RecoveryPending {
        RecoveryPending {
            pages: self.engine().map_or(0, |e| e.pool.pending_pages()),
            losers: self.losers_left.load(Ordering::Acquire),
        }
    }

    /// One step of an instant restart's remaining work: roll back the newest loser left, or
    /// else redo a batch of pending pages. Losers first, because new transactions may be
    /// waiting for their locks. Returns whether there was anything to do.
    fn recovery_step(&self) -> Result<bool> {
        let newest = self
            .losers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .next_back()
            .copied();
        if let Some(txn) = newest {
            self.undo_loser(txn)?;
            return Ok(true);
        }
        // The batch and the archive window its redo still has to read, under one latch hold.
        let (pages, window) = {
            let engine = self.engine()?;
            let pages = engine.pool.pending_first(DRAIN_BATCH);
            let window = engine.pool.pending_archived_window(&pages);
            (pages, window)
        };
        if pages.is_empty() {
            return Ok(false);
        }
        // The disk reads outside the engine latch, so that under it the pool finds the pages
        // in the OS's cache and new transactions wait for the latch as little as possible.
        // A failed read here is the pool's to report, when it reads the page for real.
        for &page in &pages {
            let _ = self.file.warm(page);
        }
        // Likewise the changes the pages' redo left in the archive: one read per run for the
        // batch (neighbouring pages in a page-sorted run), outside the latch. A failed read
        // here is left to the pool too, which then reads the archive itself.
        let supply = window
            .zip(self.archive.as_ref())
            .and_then(|(window, archive)| {
                let (histories, archived) =
                    archive.histories_of(&pages, window.0, window.1).ok()?;
                Some((window, histories, archived))
            });
        let mut engine = self.engine()?;
        if let Some((window, histories, archived)) = supply {
            engine
                .pool
                .supply_archived(&pages, window, histories, archived);
        }
        let log = Arc::clone(&engine.log);
        let redone = engine.pool.redo_pending(&pages, log.as_ref());
        self.check(redone)?;
        Ok(true)
    }

    /// Rolls back loser `txn` if no other thread has taken it, then releases its locks.
    fn undo_loser(&self, txn: TxnId) -> Result<()> {
        let Some(loser) = self
            .losers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&txn)
        else {
            return Ok(());
        };
        // As for the drain: the pages it will read, read first outside the latch.
        for page in loser.pages() {
            let _ = self.file.warm(page);
        }
        let result = self.engine().and_then(|mut engine| {
            let mut compensations = 0;
            recovery::undo_loser(&mut engine, &loser, &mut compensations)?;
            // With its end record: see the transaction table's rule.
            self.txns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&txn);
            Ok(())
        });
        match result {
            Ok(()) => {
                self.losers_left.fetch_sub(1, Ordering::AcqRel);
                self.locks.release_all(txn);
                Ok(())
            }
            Err(error) => {
                // Its locks stay held, so its writes stay invisible; another step may retry
                // (unless the store is now poisoned, and the next open rolls it back).
                self.losers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(txn, loser);
                self.check(Err(error))
            }
        }
    }

    /// Takes `txn` its lock on `key`, rolling back first any loser of an instant restart that
    /// holds it (rather than waiting for the background thread to come to it).
    fn lock(&self, txn: TxnId, key: &[u8], mode: LockMode) -> Result<()> {
        if self.losers_left.load(Ordering::Acquire) > 0 {
            for blocker in self.locks.blockers(txn, key, mode) {
                let is_loser = self
                    .losers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(&blocker);
                if is_loser {
                    self.undo_loser(blocker)?;
                }
            }
        }
        self.locks.acquire(txn, key, mode)
    }

    fn clean(&self) -> Result<CleanReport> {
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

/// A transaction. Reads see committed data and the transaction's own writes; its writes are
/// seen by others once it commits. Dropping it without `commit` aborts it.
pub struct Transaction<'s> {
    store: &'s Store,
    id: TxnId,
    /// The LSN of this transaction's last record (the head of its chain).
    last_lsn: Lsn,
    /// Its write records by LSN, for a rollback to walk the chain without reading the log.
    writes: HashMap<Lsn, Arc<LogRecord>>,
    finished: bool,
}

impl Transaction<'_> {
    pub fn id(&self) -> TxnId {
        self.id
    }

    /// The value of `key`.
    ///
    /// # Errors
    /// [`Error::Deadlock`] (abort and retry), [`Error::KeyTooLarge`], page and log errors.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        let store = &*self.store.shared;
        store.lock(self.id, key, LockMode::Shared)?;
        store.check(store.engine()?.get(key))
    }

    /// Sets `key` to `value`.
    ///
    /// # Errors
    /// As [`Transaction::get`], and [`Error::ValueTooLarge`].
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_key(key)?;
        if value.len() > MAX_VALUE {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max: MAX_VALUE,
            });
        }
        let store = &*self.store.shared;
        store.lock(self.id, key, LockMode::Exclusive)?;
        let mut engine = store.engine()?;
        let written = self.write(&mut engine, None, key, Some(value));
        store.check(written)
    }

    /// Sets `key` to what `change` makes of its value (`None` for an absent key; `change`
    /// returning `None` removes it) and returns the new value: a read and a write in one step.
    /// The key is locked exclusively from the read on, so nobody changes it in between and two
    /// transactions doing this to one key queue up rather than deadlock (as `get` then `put`
    /// can, each holding the shared lock the other's write waits for). Read and write happen
    /// under one hold of the engine latch, and that is where `change` runs: it must be quick and
    /// must not use the store.
    ///
    /// # Errors
    /// As [`Transaction::put`]; on an error nothing is written.
    pub fn update(
        &mut self,
        key: &[u8],
        change: impl FnOnce(Option<&[u8]>) -> Option<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        let store = &*self.store.shared;
        store.lock(self.id, key, LockMode::Exclusive)?;
        let mut engine = store.engine()?;
        // One walk down the tree for the read and the write (the latch is held throughout).
        let updated = store.check(engine.read_for_write(key)).and_then(|read| {
            let new = change(read.value.as_deref());
            if read.value.is_none() && new.is_none() {
                return Ok(None); // nothing to remove: no record, as `delete` of an absent key
            }
            if let Some(value) = new.as_deref().filter(|v| v.len() > MAX_VALUE) {
                return Err(Error::ValueTooLarge {
                    len: value.len(),
                    max: MAX_VALUE,
                });
            }
            let written = self.write(&mut engine, Some(read), key, new.as_deref());
            store.check(written).map(|()| new)
        });
        updated
    }

    /// Removes `key`; returns whether it was there.
    ///
    /// # Errors
    /// As [`Transaction::get`].
    pub fn delete(&mut self, key: &[u8]) -> Result<bool> {
        check_key(key)?;
        let store = &*self.store.shared;
        store.lock(self.id, key, LockMode::Exclusive)?;
        let mut engine = store.engine()?;
        let deleted = match engine.read_for_write(key) {
            Ok(read) if read.value.is_none() => Ok(false),
            Ok(read) => self
                .write(&mut engine, Some(read), key, None)
                .map(|()| true),
            Err(e) => Err(e),
        };
        store.check(deleted)
    }

    /// The entries with keys in the range, in key order. Each key returned is locked shared
    /// until the transaction ends, and none is another running transaction's uncommitted
    /// write; keys inserted into the range later by others are not locked out (no range locks:
    /// a repeated scan may see phantoms).
    ///
    /// # Errors
    /// As [`Transaction::get`].
    pub fn scan(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let store = &*self.store.shared;
        loop {
            // Under the engine latch, every key whose state in the tree is uncommitted is
            // exclusively locked by its writer (writers lock before they change the tree and
            // unlock after their end), so the tree and the lock table read together tell which
            // keys need a lock before the entries can be returned.
            let (entries, mut must_lock) = {
                let mut engine = store.engine()?;
                let entries = store.check(engine.scan((start, end)))?;
                let locked_by_others = store.locks.exclusive_keys_in(self.id, (start, end));
                (entries, locked_by_others)
            };
            must_lock.extend(
                entries
                    .iter()
                    .map(|(k, _)| k)
                    .filter(|k| !store.locks.holds(self.id, k))
                    .cloned(),
            );
            if must_lock.is_empty() {
                return Ok(entries);
            }
            let must_lock: BTreeSet<Vec<u8>> = must_lock.into_iter().collect();
            for key in must_lock {
                store.lock(self.id, &key, LockMode::Shared)?;
            }
        }
    }

    /// Commits: returns once the commit record is durable at the log's level.
    ///
    /// # Errors
    /// Log errors: the outcome is then unknown until the store is reopened (the store is
    /// poisoned).
    pub fn commit(mut self) -> Result<()> {
        self.finished = true;
        let store = &*self.store.shared;
        let result = if self.last_lsn == Lsn::ZERO {
            Ok(())
        } else {
            store.engine().and_then(|engine| {
                let log = Arc::clone(&engine.log);
                let lsn = log.append(&LogRecord {
                    txn: self.id,
                    prev_txn_lsn: self.last_lsn,
                    body: LogBody::Commit,
                })?;
                // With its end record: see the transaction table's rule.
                store
                    .txns
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&self.id);
                drop(engine);
                // Outside the latch: concurrent committers share the log's syncs.
                log.flush(lsn)
            })
        };
        store.locks.release_all(self.id);
        store.check(result)
    }

    /// Rolls back every write, logging a compensation for each, then releases the locks.
    ///
    /// # Errors
    /// Log and page errors (the store is then poisoned; restart finishes the rollback).
    pub fn abort(mut self) -> Result<()> {
        self.rollback()
    }

    fn rollback(&mut self) -> Result<()> {
        self.finished = true;
        let store = &*self.store.shared;
        let result = if self.last_lsn == Lsn::ZERO {
            Ok(())
        } else {
            let writes = std::mem::take(&mut self.writes);
            store.engine().and_then(|mut engine| {
                let mut compensations = 0;
                let ended = recovery::rollback(
                    &mut engine,
                    self.id,
                    self.last_lsn,
                    |lsn| writes.get(&lsn).map(|record| LogRecord::clone(record)),
                    &mut compensations,
                );
                // On failure the entry stays, but the store is poisoned: no checkpoint copies it
                // again, and restart finishes the rollback.
                if ended.is_ok() {
                    store
                        .txns
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&self.id);
                }
                ended.map(|_| ())
            })
        };
        store.locks.release_all(self.id);
        store.check(result)
    }

    /// Logs and applies the write of `key`; `read`: what a read of it under the same hold of
    /// the engine latch found (the write then starts from there).
    fn write(
        &mut self,
        engine: &mut Engine,
        read: Option<crate::btree::Read>,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<()> {
        let (txn, prev_txn_lsn) = (self.id, self.last_lsn);
        let (lsn, record) =
            engine.set_from(read, key, value, |page, prev_page_lsn, before| LogRecord {
                txn,
                prev_txn_lsn,
                body: LogBody::Write {
                    page,
                    prev_page_lsn,
                    key: key.to_vec(),
                    before,
                    after: value.map(<[u8]>::to_vec),
                },
            })?;
        self.last_lsn = lsn;
        self.writes.insert(lsn, record);
        // Under the engine latch, with the record: see the transaction table's rule.
        self.store
            .shared
            .txns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(self.id)
            .or_insert((lsn, lsn))
            .1 = lsn;
        Ok(())
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.finished {
            if let Err(error) = self.rollback() {
                tracing::warn!(txn = self.id, %error, "rollback of a dropped transaction failed");
            }
        }
    }
}

fn check_key(key: &[u8]) -> Result<()> {
    if key.len() > MAX_KEY {
        return Err(Error::KeyTooLarge {
            len: key.len(),
            max: MAX_KEY,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scheduling policy (`/proc`'s field 41: 0 normal, 3 batch) of this process's threads
    /// named `name`.
    fn policies_of_threads_named(name: &str) -> Vec<u32> {
        let mut policies = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let task = task.unwrap().path();
            let Ok(comm) = std::fs::read_to_string(task.join("comm")) else {
                continue; // the thread ended meanwhile
            };
            if comm.trim_end() != name {
                continue;
            }
            let stat = std::fs::read_to_string(task.join("stat")).unwrap();
            // After the command in parentheses, fields 3.. are space-separated.
            let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
            let policy = after_comm.split(' ').nth(41 - 3).unwrap();
            policies.push(policy.parse().unwrap());
        }
        policies
    }

    #[test]
    fn the_services_threads_run_under_sched_batch_unless_told_not_to() {
        for (batch, policy) in [
            (true, libc::SCHED_BATCH as u32),
            (false, libc::SCHED_OTHER as u32),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let options = StoreOptions::default()
                .checkpoint_interval(Some(Duration::from_millis(1)))
                .batch_services(batch);
            let store = Store::open(dir.path(), options).unwrap();
            // The thread sets its policy first thing; wait (bounded) until it has.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let policies = policies_of_threads_named("stela-store-che");
                if policies == [policy] {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "batch_services({batch}): checkpoint thread policies {policies:?}, want {policy}"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            store.close().unwrap();
        }
    }

    /// The encoded sizes of the tree's leaves, in key order.
    fn leaf_sizes(store: &Store) -> Vec<usize> {
        let mut engine = store.shared.engine().unwrap();
        let Engine { pool, log, .. } = &mut *engine;
        let (mut sizes, mut stack) = (Vec::new(), vec![crate::page::ROOT]);
        while let Some(id) = stack.pop() {
            let node = &pool.page(id, log.as_ref()).unwrap().node;
            match node {
                crate::page::Node::Leaf(_) => sizes.push(node.encoded_len()),
                crate::page::Node::Internal(internal) => {
                    stack.extend(internal.children.iter().rev());
                }
            }
        }
        sizes
    }

    #[test]
    fn keys_inserted_in_ascending_order_fill_their_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        for batch in 0..30u64 {
            let mut txn = store.begin();
            for i in batch * 100..(batch + 1) * 100 {
                txn.put(&[b"h".as_slice(), &i.to_be_bytes()].concat(), &[7; 100])
                    .unwrap();
            }
            txn.commit().unwrap();
        }
        let sizes = leaf_sizes(&store);
        let (last, full) = sizes.split_last().unwrap();
        assert!(*last > 0);
        // Each leaf but the last was filled until the next entry did not fit (an entry here
        // takes ~115 bytes), not split in half.
        for &size in full {
            assert!(size > crate::page::PAGE_SIZE - 200, "leaf sizes {sizes:?}");
        }
        // Entries that do not arrive in order still split leaves in half: a key going
        // before the last one of a full leaf.
        let mut txn = store.begin();
        txn.put(
            &[b"h".as_slice(), &50u64.to_be_bytes(), b"x"].concat(),
            &[7; 100],
        )
        .unwrap();
        txn.commit().unwrap();
        let after = leaf_sizes(&store);
        assert_eq!(after.len(), sizes.len() + 1);
        assert!(after[0] < crate::page::PAGE_SIZE / 2 + 200, "{after:?}");
        store.close().unwrap();
    }

    #[test]
    fn an_update_holds_its_key_exclusively_from_the_read_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let mut writer = store.begin();
        let new = writer
            .update(b"k", |old| {
                assert_eq!(old, None);
                Some(b"1".to_vec())
            })
            .unwrap();
        assert_eq!(new.as_deref(), Some(&b"1"[..]));
        // A reader would wait for the writer: the update's read did not take a shared lock
        // to be upgraded later, which two updaters could each hold (and then deadlock on).
        let reader = store.begin();
        assert_eq!(
            store
                .shared
                .locks
                .blockers(reader.id(), b"k", LockMode::Shared),
            [writer.id()]
        );
        writer.commit().unwrap();
        let mut reader = reader;
        assert_eq!(reader.get(b"k").unwrap().as_deref(), Some(&b"1"[..]));
        // `None` removes the key; for a key that is not there, it writes nothing.
        assert_eq!(reader.update(b"k", |_| None).unwrap(), None);
        assert_eq!(reader.get(b"k").unwrap(), None);
        let logged = store.shared.log.last_lsn();
        assert_eq!(reader.update(b"absent", |_| None).unwrap(), None);
        assert_eq!(store.shared.log.last_lsn(), logged);
        reader.commit().unwrap();
        store.close().unwrap();
    }

    #[test]
    fn an_update_to_a_value_too_large_is_refused_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let mut txn = store.begin();
        txn.put(b"k", b"before").unwrap();
        let refused = txn.update(b"k", |_| Some(vec![0; MAX_VALUE + 1]));
        assert!(
            matches!(refused, Err(Error::ValueTooLarge { len, .. }) if len == MAX_VALUE + 1),
            "{refused:?}"
        );
        assert_eq!(txn.get(b"k").unwrap().as_deref(), Some(&b"before"[..]));
        txn.commit().unwrap();
        store.close().unwrap();
    }

    #[test]
    fn concurrent_updates_of_one_key_queue_up_and_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let increment = |old: Option<&[u8]>| {
            let n = old.map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap()));
            Some((n + 1).to_be_bytes().to_vec())
        };
        let (threads, rounds) = (4, 50);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    for _ in 0..rounds {
                        let mut txn = store.begin();
                        // No deadlock to retry: updaters of one key wait in line.
                        txn.update(b"counter", increment).unwrap();
                        txn.commit().unwrap();
                    }
                });
            }
        });
        let mut txn = store.begin();
        let counter = txn.get(b"counter").unwrap().unwrap();
        assert_eq!(
            u64::from_be_bytes(counter.try_into().unwrap()),
            threads * rounds
        );
        txn.commit().unwrap();
        store.close().unwrap();
    }

    #[test]
    fn decoupled_checkpoints_release_the_log_tail_between_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        // A checkpoint that never comes during the test: only the analysis between
        // checkpoints can release what the tail holds for it.
        let options = StoreOptions::default()
            .checkpoints(CheckpointKind::Decoupled)
            .checkpoint_interval(Some(Duration::from_secs(3600)));
        let store = Store::open(dir.path(), options).unwrap();
        for i in 0..200u32 {
            let mut txn = store.begin();
            txn.put(&i.to_be_bytes(), b"value").unwrap();
            txn.commit().unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.shared.log.held() > 0 {
            assert!(
                Instant::now() < deadline,
                "the tail still holds {} records an hour's checkpoint interval would keep",
                store.shared.log.held()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // The analysis is where those records went: a checkpoint now analyses none of them.
        let applied_to = store
            .shared
            .checkpointer
            .lock()
            .unwrap()
            .decoupled
            .analysis
            .applied_to;
        assert!(applied_to.get() >= 200);
    }
}
