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
