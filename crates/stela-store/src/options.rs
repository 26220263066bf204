//! [`StoreOptions`]: how a store is opened, and what each default costs.

use crate::format::CheckpointKind;
use crate::recovery::restart::RestartMode;
use std::time::Duration;
use stela_wal::WalOptions;

/// Which page cleaner a store runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanerKind {
    Classical,
    Decoupled,
}

/// The default pause between background checkpoints.
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// The default pause between background cleaning rounds.
pub const DEFAULT_CLEAN_INTERVAL: Duration = Duration::from_millis(100);
/// The default pause between background archiving steps.
pub const DEFAULT_ARCHIVE_INTERVAL: Duration = Duration::from_secs(1);
/// The default longest wait for one key's lock.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// How a store is opened.
///
/// The defaults are meant to be kept: a store opened with them bounds its own log, its restart
/// time and its lock waits without the application calling anything.
/// - **Checkpoints: decoupled, every second** ([`DEFAULT_CHECKPOINT_INTERVAL`]). Restart analyses
///   the log from the latest checkpoint, so it reads at most about a second of records plus the
///   pages' redo. Cost: one thread; a decoupled checkpoint takes no latch and analyses the log
///   tail every 10 ms in between (the tail then holds about 10 ms of records); a checkpoint
///   soon after another logs only what changed.
/// - **Page cleaning: decoupled, every 100 ms** ([`DEFAULT_CLEAN_INTERVAL`]). Redo after a crash
///   starts about one interval back, and the log can be truncated behind the cleaner. Cost: one
///   thread that replays the log onto the stored images (no latch, never the pool), page writes
///   and an fdatasync of the page file per round that changed a page, and the log tail keeps
///   about one interval of records in memory for it.
/// - **Log archive on, a step every second** ([`DEFAULT_ARCHIVE_INTERVAL`]): archive the durable
///   log into page-sorted runs in `dir/archive`, merge runs, truncate the log behind what every
///   reader needs. The log then stays a few segments long, and a page that fails its checks is
///   rebuilt from its history instead of failing the read. Cost: one thread; disk for the runs
///   (pruned behind a page backup once they pass `archive_prune_after`, 64 MiB, and the page
///   file's size: about twice that plus one copy of the page file at most) and the I/O of
///   writing, merging and backing up. Without the archive the embedded log is never truncated.
/// - **Lock waits end after 10 s** ([`DEFAULT_LOCK_TIMEOUT`]) with [`Error::LockTimeout`](crate::error::Error::LockTimeout):
///   deadlocks are found at once on the waits-for graph, so the timeout catches a holder that
///   does not end (a transaction left open by a stuck thread). Cost: none until it fires; a
///   transaction that legitimately waits longer must be retried (or the timeout raised).
/// - Instant restart, with the rest of restart's work on a background thread; the services'
///   threads under `SCHED_BATCH`; `sync_pages` (needed to survive a machine crash).
///
/// [`StoreOptions::on_request`] turns every background service off (checkpoints, cleaning and
/// archiving only when the application calls `Store::checkpoint`,
/// `Store::clean`, `Store::archive`); the log
/// then grows until one of them runs or the store is closed.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Frames in the buffer pool (8 KiB each); at least 8.
    pub pool_pages: usize,
    /// The embedded log's options, used by `Store::open`: its `sync` is the commit durability.
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
    /// `Store::close` or `Store::finish_recovery`; tests use that to see the on-demand
    /// paths at work.
    pub recover_in_background: bool,
    /// Run the background threads (persistence services, instant restart's redo and undo)
    /// under `SCHED_BATCH`, so that their wake-ups never preempt a transaction holding the
    /// engine latch (see `background`). On by default; a machine with idle CPUs loses nothing
    /// either way.
    pub batch_services: bool,
    /// The longest a transaction waits for one key's lock before the call fails with
    /// [`Error::LockTimeout`](crate::error::Error::LockTimeout) (`None`: wait until granted).
    pub lock_timeout: Option<Duration>,
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
            checkpoint_interval: Some(DEFAULT_CHECKPOINT_INTERVAL),
            clean_interval: Some(DEFAULT_CLEAN_INTERVAL),
            sync_pages: true,
            archive: true,
            archive_prune_after: Some(64 << 20),
            archive_interval: Some(DEFAULT_ARCHIVE_INTERVAL),
            elide_writes: false,
            restart: RestartMode::Instant,
            recover_in_background: true,
            batch_services: true,
            lock_timeout: Some(DEFAULT_LOCK_TIMEOUT),
        }
    }
}

impl StoreOptions {
    /// The defaults without any background service: checkpoints, cleaning and archiving run
    /// only when asked for (`Store::checkpoint`,
    /// `Store::clean`, `Store::archive`), and
    /// the log grows until then (the archive is still kept). For tests that count what each
    /// call does, and for applications that schedule the services themselves.
    pub fn on_request() -> StoreOptions {
        StoreOptions::default()
            .checkpoint_interval(None)
            .clean_interval(None)
            .archive_interval(None)
    }

    pub fn lock_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.lock_timeout = timeout;
        self
    }

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
