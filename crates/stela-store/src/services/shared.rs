//! The state the store's threads share: the engine (pool, tree, page allocation) under its
//! latch, the lock table, the transaction table, the log tail, and each persistence service's
//! own state behind its own mutex. The rules for touching it are the store's concurrency rules
//! (`store.rs`); the services' rounds (`rounds`) and instant restart's remaining work
//! (`restart_work`) are methods on it, and `open` builds it.

use crate::access::btree::Engine;
use crate::access::lock::LockManager;
use crate::access::pagefile::PageFile;
use crate::error::{Error, Result};
use crate::format::TxnId;
use crate::log::archive::LogArchive;
use crate::log::tail::{LogTail, RecordBuffer};
use crate::options::StoreOptions;
use crate::recovery::restart::Loser;
use crate::services::checkpoint::Checkpointer;
use crate::services::image_cache::ImageCache;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use stela_format::Lsn;

/// Pages the background restart thread redoes per hold of the engine latch: small enough that
/// a transaction waits at most a few page reads for the latch.
pub(crate) const DRAIN_BATCH: usize = 16;

/// How often decoupled checkpoints' analysis catches up with the log between checkpoints.
pub(crate) const ANALYSIS_STEP: Duration = Duration::from_millis(10);

/// Most records the in-memory log tail holds for the decoupled services (about 200 bytes
/// each); past it they read the log files.
pub(crate) const TAIL_CAP: usize = 1 << 21;

/// What the store's threads share.
pub(crate) struct Shared {
    pub(crate) engine: Mutex<Engine>,
    pub(crate) locks: LockManager,
    /// Running transactions that have written, with their first and last LSN. See the module
    /// documentation for when it changes.
    pub(crate) txns: Mutex<BTreeMap<TxnId, (Lsn, Lsn)>>,
    pub(crate) next_txn: AtomicU64,
    pub(crate) poisoned: AtomicBool,
    /// The log, through the in-memory tail the decoupled services read.
    pub(crate) log: Arc<LogTail>,
    pub(crate) file: Arc<PageFile>,
    /// The decoupled cleaner's clean LSN (stays zero with the classical cleaner).
    pub(crate) clean_lsn: Arc<crate::sync::AtomicU64>,
    pub(crate) options: StoreOptions,
    /// Serialises checkpoints and the log's truncation; the master record's slots, and the
    /// decoupled checkpoint's tables between checkpoints.
    pub(crate) checkpointer: Mutex<Checkpointer>,
    /// Serialises cleaning rounds; the decoupled cleaner's images, and its buffer for reading
    /// the log tail, between rounds.
    pub(crate) cleaning: Mutex<(ImageCache, RecordBuffer)>,
    /// The log archive, if the store keeps one.
    pub(crate) archive: Option<Arc<LogArchive>>,
    /// Losers of an instant restart not yet being rolled back. One is taken out of the map by
    /// the thread that rolls it back, so no loser is rolled back twice.
    pub(crate) losers: Mutex<BTreeMap<TxnId, Loser>>,
    /// Losers whose rollback has not completed (includes one being rolled back); zero lets
    /// lock acquisition skip looking for losers.
    pub(crate) losers_left: AtomicUsize,
}

impl Shared {
    pub(crate) fn engine(&self) -> Result<MutexGuard<'_, Engine>> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        Ok(self.engine.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Poisons the store on errors after which memory may be ahead of the log.
    pub(crate) fn check<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(Error::Log(_) | Error::Daemon(_) | Error::Io(_)) = &result {
            self.poisoned.store(true, Ordering::Release);
        }
        result
    }
}
