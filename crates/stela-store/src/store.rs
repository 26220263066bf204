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

use crate::btree::Engine;
use crate::error::{Error, Result};
use crate::format::{LogBody, LogRecord, TxnId};
use crate::lock::{LockManager, LockMode};
use crate::log::LogDevice;
use crate::page::{MAX_KEY, MAX_VALUE, PAGE_SIZE};
use crate::pool::{BufferPool, PoolStats};
use crate::recovery::{self, RestartReport};
use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use stela_format::Lsn;
use stela_wal::{Wal, WalOptions};

/// How a store is opened.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Frames in the buffer pool (8 KiB each); at least 8.
    pub pool_pages: usize,
    /// The embedded log's options, used by [`Store::open`]: its `sync` is the commit durability.
    pub wal: WalOptions,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            pool_pages: 1024,
            wal: WalOptions::default().type_tag("stela-store"),
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
}

/// A transactional key-value store. See the crate documentation.
///
/// Dropping a store without [`Store::close`] is a crash: the dirty pages in the pool are lost
/// and the next open recovers from the log.
pub struct Store {
    engine: Mutex<Engine>,
    locks: LockManager,
    next_txn: AtomicU64,
    poisoned: AtomicBool,
    restart: RestartReport,
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
        std::fs::create_dir_all(dir)?;
        let wal: Wal<LogRecord> = Wal::open(dir.join("log"), options.wal.clone())?;
        Store::open_with_log(dir, Arc::new(wal), options)
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
        std::fs::create_dir_all(dir)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("pages"))?;
        let pages_in_file = file.metadata()?.len().div_ceil(PAGE_SIZE as u64);
        let mut engine = Engine {
            pool: BufferPool::new(file, options.pool_pages),
            log: Arc::clone(&log),
            next_page: pages_in_file.max(1),
        };
        let restart = recovery::restart(&mut engine)?;
        tracing::debug!(?restart, "store restarted");
        Ok(Store {
            next_txn: AtomicU64::new(restart.max_txn + 1),
            engine: Mutex::new(engine),
            locks: LockManager::default(),
            poisoned: AtomicBool::new(false),
            restart,
        })
    }

    /// Starts a transaction.
    pub fn begin(&self) -> Transaction<'_> {
        Transaction {
            store: self,
            id: self.next_txn.fetch_add(1, Ordering::Relaxed),
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
        self.engine().map(|e| e.pool.stats()).unwrap_or_default()
    }

    /// Writes every dirty page and syncs the page file: the next open then has nothing to redo
    /// (it still reads the log, which has no checkpoints yet). Running transactions must have
    /// ended.
    ///
    /// # Errors
    /// I/O and log errors; [`Error::Poisoned`].
    pub fn close(self) -> Result<()> {
        let mut engine = self.engine()?;
        let log = Arc::clone(&engine.log);
        let last = log.last_lsn();
        if last > log.durable_lsn() {
            log.flush(last)?;
        }
        engine.pool.flush_all(log.as_ref())
    }

    fn engine(&self) -> Result<MutexGuard<'_, Engine>> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        Ok(self.engine.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Poisons the store on errors after which memory may be ahead of the log.
    fn check<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(Error::Log(_) | Error::Io(_)) = &result {
            self.poisoned.store(true, Ordering::Release);
        }
        result
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
    writes: HashMap<Lsn, LogRecord>,
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
        self.store.locks.acquire(self.id, key, LockMode::Shared)?;
        let store = self.store;
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
        self.store
            .locks
            .acquire(self.id, key, LockMode::Exclusive)?;
        let store = self.store;
        let mut engine = store.engine()?;
        let written = self.write(&mut engine, key, Some(value));
        store.check(written)
    }

    /// Removes `key`; returns whether it was there.
    ///
    /// # Errors
    /// As [`Transaction::get`].
    pub fn delete(&mut self, key: &[u8]) -> Result<bool> {
        check_key(key)?;
        self.store
            .locks
            .acquire(self.id, key, LockMode::Exclusive)?;
        let store = self.store;
        let mut engine = store.engine()?;
        let deleted = match engine.get(key) {
            Ok(None) => Ok(false),
            Ok(Some(_)) => self.write(&mut engine, key, None).map(|()| true),
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
        let store = self.store;
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
                store.locks.acquire(self.id, &key, LockMode::Shared)?;
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
        let store = self.store;
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
        let store = self.store;
        let result = if self.last_lsn == Lsn::ZERO {
            Ok(())
        } else {
            let writes = std::mem::take(&mut self.writes);
            store.engine().and_then(|mut engine| {
                let mut compensations = 0;
                recovery::rollback(
                    &mut engine,
                    self.id,
                    self.last_lsn,
                    |lsn| writes.get(&lsn).cloned(),
                    &mut compensations,
                )
                .map(|_| ())
            })
        };
        store.locks.release_all(self.id);
        store.check(result)
    }

    fn write(&mut self, engine: &mut Engine, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        let (txn, prev_txn_lsn) = (self.id, self.last_lsn);
        let (lsn, record) = engine.set(key, value, |page, prev_page_lsn, before| LogRecord {
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
