//! stela-store: a transactional key-value store on 8 KiB pages that logs through stela.
//!
//! The rooms, from the top down; each folder's `mod.rs` says what it holds, and no room imports
//! one above it:
//! - `store`: the API, [`Store`] and [`Transaction`] (`begin`, `get`, `get_for_update`, `put`,
//!   `update`, `delete`, `scan`, `commit`, `abort`), and the order in which locks and the engine
//!   latch are taken; `options`: [`StoreOptions`], its defaults and what each costs.
//! - `services/`: the persistence services (classical and decoupled checkpoints, the classical
//!   and decoupled page cleaners, the log's retention, the warm standby [`Follower`], the
//!   threads' scheduling), the state the store's threads share, and opening a store.
//! - `recovery/`: the master record, log analysis, and restart after a crash: classical ARIES
//!   (analysis, redo, undo with compensation records, all before open returns) or instant
//!   (analysis only; the rest on demand), and the rollback a normal abort shares with it.
//! - `access/`: the page file, redo of a record onto a page image, single-page repair, the
//!   buffer pool, the B+tree, the key locks (strict 2PL, deadlocks found on a waits-for graph).
//! - [`log`]: the small [`LogDevice`] trait the store logs through, implemented by the embedded
//!   `stela_wal::Wal` and by [`DaemonLog`] over a stela daemon's log ([`Store::open_on_daemon`]),
//!   the in-memory tail of the log for the decoupled services, and the log archive
//!   ([`LogArchive`]), runs of page changes sorted by page within LSN ranges.
//! - [`format`]: the bytes (log records, pages, archive runs), pure, no I/O, each decoder
//!   fuzzed (`fuzz/fuzz_targets/store_*.rs`); [`error`]: the one error type.
//!
//! Commit durability is the log's: with the embedded log at `SyncMode::Data` a commit returns
//! once its record is fdatasync'ed. Dropping a [`Store`] without [`Store::close`] is a crash;
//! the next open recovers. By default it recovers instantly ([`RestartMode::Instant`]): open
//! returns after log analysis, each page is redone when first read, and the transactions the
//! crash cut short keep their keys locked until they are rolled back (by a background thread,
//! or by a transaction that needs one of those keys). [`RestartMode::Classical`] does all of
//! it before open returns, in time proportional to the dirty pages.
//!
//! ```
//! use std::ops::Bound;
//! use stela_store::{Store, StoreOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path(), StoreOptions::default())?;
//! let mut txn = store.begin();
//! txn.put(b"apple", b"3")?;
//! txn.put(b"pear", b"5")?;
//! txn.commit()?; // durable: the log was fdatasync'ed up to the commit record
//!
//! let mut txn = store.begin();
//! txn.delete(b"apple")?;
//! txn.abort()?; // the delete is undone
//!
//! drop(store); // a crash: restart redoes from the log what the pages lack
//! let store = Store::open(dir.path(), StoreOptions::default())?;
//! let mut txn = store.begin();
//! let all = txn
//!     .scan(Bound::Unbounded, Bound::Unbounded)
//!     .collect::<stela_store::Result<Vec<_>>>()?;
//! assert_eq!(all, vec![(b"apple".to_vec(), b"3".to_vec()), (b"pear".to_vec(), b"5".to_vec())]);
//! txn.commit()?;
//! store.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Persistence services, chosen at open ([`StoreOptions`]): checkpoints classical (tables
//! copied under the latches) or decoupled (computed from the log), page cleaning classical
//! (writes the pool's dirty pages) or decoupled (replays the log onto the stored images, never
//! touching the pool), and, with `archive` set, a log archive: each on its own thread at an
//! interval or on request ([`Store::checkpoint`], [`Store::clean`], [`Store::archive`]). By
//! default all three run in the background (decoupled checkpoints every second, decoupled
//! cleaning every 100 ms, an archiving step every second) and a lock wait ends after 10 s with
//! [`Error::LockTimeout`]: what each of these costs is in [`StoreOptions`]' documentation;
//! [`StoreOptions::on_request`] runs the services only when
//! called. An
//! archiving step also truncates the log, so with the archive the log stays a few segments
//! long; a page that fails its checks is rebuilt from its history rather than failing the
//! read, and with `elide_writes` a dirty page may leave the pool without being written.
//!
//! Not yet here (issue 11): the decoupled cleaner reads runs that overlap its range whole
//! (the index has no per-page LSN bounds to skip pages unchanged in it); runs are merged in
//! memory (a merge holds both inputs); classical restart's redo reads the log, not the archive
//! (instant restart leaves a page's changes that the archive holds there, for the page's first
//! read); a page the pool misses is read and decoded under the engine latch, so a cold pool
//! holds up every transaction while it fills; page merges (deletes leave empty leaves), range
//! locks (a scan can see phantoms). The archive is pruned behind page backups
//! ([`LogArchive::backup_and_prune`]).

pub mod error;
pub mod format;
pub mod log;

mod access;
mod options;
mod recovery;
mod services;
mod store;
mod sync;

pub use access::pool::PoolStats;
pub use error::{Error, Result};
pub use format::page::{PageId, MAX_KEY, MAX_VALUE, PAGE_SIZE};
pub use format::{
    CheckpointKind, CheckpointTables, DirtyPage, LogBody, LogRecord, TableChanges, TxnId,
};
pub use log::{ArchiveReport, BackupReport, DaemonLog, LogArchive, LogDevice};
pub use options::{
    CleanerKind, StoreOptions, DEFAULT_ARCHIVE_INTERVAL, DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_CLEAN_INTERVAL, DEFAULT_LOCK_TIMEOUT,
};
pub use recovery::restart::{RecoveryPending, RestartMode, RestartReport};
pub use services::checkpoint::CheckpointReport;
pub use services::cleaner::CleanReport;
pub use services::follow::{Agreement, FollowReport, Follower};
pub use store::{Scan, Store, Transaction, SCAN_BATCH};

/// The store's internals the loom model of the decoupled cleaner drives
/// (`tests/loom_cleaner.rs`); built only under `--cfg stela_store_loom`.
#[cfg(stela_store_loom)]
#[doc(hidden)]
pub mod loom_model {
    pub use crate::access::pagefile::PageFile;
    pub use crate::access::pool::BufferPool;
    pub use crate::log::tail::{Consumer, LogTail};
    pub use crate::services::cleaner::decoupled_round_for_model;
    pub use crate::services::image_cache::ImageCache;
}
