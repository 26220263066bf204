//! stela-store: a transactional key-value store on 8 KiB pages that logs through stela.
//!
//! A tour, from the top down:
//! - [`store`]: [`Store`] and [`Transaction`] (`begin`, `get`, `put`, `update`, `delete`,
//!   `scan`, `commit`, `abort`), and the order in which locks and the engine latch are taken.
//! - [`lock`]: key locks for strict two-phase locking; deadlocks found on a waits-for graph.
//! - [`btree`]: the B+tree over the buffer pool; splits as single logged structure changes.
//! - [`checkpoint`]: classical and decoupled checkpoints, and the master record naming the
//!   latest; [`analysis`]: the log analysis that restart and the decoupled checkpoint share.
//! - [`cleaner`]: the classical page cleaner (over the pool) and the decoupled one (replaying
//!   the log, or the archive's runs where it lags behind them, onto the stored images).
//! - [`tail`]: the records appended since open, kept in memory for the decoupled services.
//! - [`archive`]: the log archive, runs of page changes sorted by page within LSN ranges, built
//!   from the durable log and merged a pair at a time; [`archive_format`]: a run's bytes, pure,
//!   fuzzed (`fuzz/fuzz_targets/store_archive_run.rs`).
//! - [`repair`]: single-page recovery (a damaged or stale image rebuilt from the archive and
//!   the log) and the write elision it allows.
//! - [`retention`]: how far back each reader of the log reads, so that the log is truncated
//!   only below all of them.
//! - [`pagefile`]: the stored page images, shared by the pool and the cleaners.
//! - [`follow`]: the warm standby store, a [`Follower`] replaying a standby daemon's copy of
//!   the log onto a directory of its own, which a store opens after a promotion with little to
//!   redo.
//! - [`recovery`]: restart after a crash, classical ARIES (analysis, redo, undo with
//!   compensation records, all before open returns) or instant (analysis only; the rest on
//!   demand), and the rollback a normal abort shares with it.
//! - [`redo`]: applying a log record to a page image (restart, the pool, the decoupled
//!   cleaner), and the index of redo instant restart leaves pending per page.
//! - [`pool`]: the buffer pool, clock eviction, steal / no-force under the write-ahead rule;
//!   after an instant restart it redoes a page when it first reads it, and every image it
//!   reads goes through [`repair`] when the store keeps an archive.
//! - [`log`]: the small [`LogDevice`] trait the store logs through, implemented by the embedded
//!   `stela_wal::Wal`; [`daemon`]: the same trait over a stela daemon's log
//!   ([`Store::open_on_daemon`]), so the store commits at the daemon's levels.
//! - [`format`] (log records) and [`page`] (page layout): the bytes, pure, no I/O; both decoders
//!   are fuzzed (`fuzz/fuzz_targets/store_*.rs`).
//! - [`error`]: the one error type.
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
//! drop(store); // a crash: no page was written; restart redoes from the log
//! let store = Store::open(dir.path(), StoreOptions::default())?;
//! let mut txn = store.begin();
//! let all = txn.scan(Bound::Unbounded, Bound::Unbounded)?;
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
//! interval or on request ([`Store::checkpoint`], [`Store::clean`], [`Store::archive`]). An
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
//! ([`LogArchive::backup_and_prune`](archive::LogArchive::backup_and_prune)).

pub mod analysis;
pub mod archive;
pub mod archive_format;
mod background;
pub mod btree;
pub mod checkpoint;
pub mod cleaner;
pub mod daemon;
pub mod error;
pub mod follow;
pub mod format;
pub mod image_cache;
pub mod lock;
pub mod log;
pub mod page;
pub mod pagefile;
pub mod pool;
pub mod recovery;
pub mod redo;
pub mod repair;
pub mod retention;
pub mod store;
mod sync;
pub mod tail;

pub use archive::{ArchiveReport, BackupReport, LogArchive};
pub use checkpoint::CheckpointReport;
pub use cleaner::{CleanReport, CleanerKind};
pub use daemon::DaemonLog;
pub use error::{Error, Result};
pub use follow::{Agreement, FollowReport, Follower};
pub use format::{
    CheckpointKind, CheckpointTables, DirtyPage, LogBody, LogRecord, TableChanges, TxnId,
};
pub use log::LogDevice;
pub use page::{PageId, MAX_KEY, MAX_VALUE, PAGE_SIZE};
pub use pool::PoolStats;
pub use recovery::{RestartMode, RestartReport};
pub use store::{RecoveryPending, Store, StoreOptions, Transaction};
