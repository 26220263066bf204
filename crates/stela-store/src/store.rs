//! [`Store`] and [`Transaction`]: the public API, and the order in which latches and locks are
//! taken.
//!
//! This module owns the store's concurrency rules:
//! - A transaction takes its key lock (shared to read, exclusive to write) before it touches the
//!   tree, and keeps every lock until it has committed or rolled back (strict 2PL). Lock waits
//!   happen outside the engine latch, so a waiting transaction never blocks the others' work.
//!   A wait ends in [`Error::Deadlock`] if it would close a cycle, and in [`Error::LockTimeout`]
//!   past `StoreOptions::lock_timeout`; either way the transaction holds what it held before.
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
//! - After an instant restart ([`RestartMode::Instant`](restart::RestartMode::Instant)) new transactions run while restart's
//!   work is still pending. Redo is the pool's (a page is redone when first read). Each loser
//!   holds the exclusive locks of the keys it wrote, taken under its own id before open
//!   returns, so no new transaction sees its writes; it is rolled back, under the engine latch
//!   like an abort, by whichever comes first: the background restart thread, or a transaction
//!   about to wait for one of its locks, which rolls it back itself rather than wait behind the
//!   whole queue of losers. Its locks are released once its `Aborted` record is appended. The
//!   transaction table holds losers from open until then, so a classical checkpoint taken
//!   meanwhile records them.

use crate::access::btree::{Engine, Read};
use crate::access::lock::LockMode;
use crate::access::pool::PoolStats;
use crate::error::{Error, Result};
use crate::format::page::{MAX_KEY, MAX_VALUE};
use crate::format::{CheckpointKind, LogBody, LogRecord, TxnId};
use crate::log::archive::{ArchiveReport, LogArchive};
use crate::log::LogDevice;
use crate::options::StoreOptions;
use crate::recovery::restart::{self, RecoveryPending, RestartReport};
use crate::services::checkpoint::CheckpointReport;
use crate::services::cleaner::CleanReport;
use crate::services::open::Services;
use crate::services::shared::Shared;
use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_format::Lsn;
use stela_wal::{SyncMode, Wal};

/// A transactional key-value store. See the crate documentation.
///
/// Dropping a store without [`Store::close`] is a crash: the dirty pages in the pool are lost
/// and the next open recovers from the log.
pub struct Store {
    shared: Arc<Shared>,
    restart: RestartReport,
    services: Services,
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
        let log = crate::log::daemon::DaemonLog::open(address, log_name, wal)?;
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
        let opened = crate::services::open::open(dir.as_ref(), log, options)?;
        Ok(Store {
            shared: opened.shared,
            restart: opened.restart,
            services: opened.services,
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
    /// [`LogArchive::MAX_RUNS`], and truncates the log below what every reader of it still
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
        self.services.stop();
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop_services();
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

    /// The value of `key`, locked exclusively: as [`Transaction::get`], but nobody else reads or
    /// writes the key until this transaction ends, so a read followed by a write of it cannot
    /// deadlock against another transaction doing the same (as `get` then `put` can, each
    /// holding the shared lock the other's write waits for). SQL's `SELECT ... FOR UPDATE`.
    ///
    /// # Errors
    /// As [`Transaction::get`].
    pub fn get_for_update(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        let store = &*self.store.shared;
        store.lock(self.id, key, LockMode::Exclusive)?;
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

    /// The entries with keys in the range, in key order, as an iterator that reads the tree
    /// [`SCAN_BATCH`] entries per hold of the engine latch, so a scan of a large range neither
    /// holds up the other transactions for its whole length nor holds it all in memory. Each
    /// key returned is locked shared until the transaction ends, and none is another running
    /// transaction's uncommitted write; keys inserted into the range later by others are not
    /// locked out (no range locks: a repeated scan may see phantoms).
    ///
    /// # Errors
    /// Each item: as [`Transaction::get`]; after an error the iterator ends.
    pub fn scan(&mut self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Scan<'_> {
        Scan {
            store: &self.store.shared,
            txn: self.id,
            from: start.map(<[u8]>::to_vec),
            end: end.map(<[u8]>::to_vec),
            batch: std::collections::VecDeque::new(),
            done: false,
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
                let ended = restart::rollback(
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
        read: Option<Read>,
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

/// Entries a [`Scan`] reads per hold of the engine latch: enough that the latch and lock
/// table are taken rarely per entry, few enough that a transaction waiting for the latch waits
/// for a few leaves' worth of copying at most.
pub const SCAN_BATCH: usize = 256;

/// The iterator [`Transaction::scan`] returns: entries in key order, each locked shared.
pub struct Scan<'t> {
    store: &'t Shared,
    txn: TxnId,
    /// Where the next batch starts: after the last key returned.
    from: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
    batch: std::collections::VecDeque<(Vec<u8>, Vec<u8>)>,
    /// The range is read through (or an error ended the scan).
    done: bool,
}

impl Scan<'_> {
    /// Reads the next batch, every key of it locked: see [`Transaction::scan`].
    fn read_batch(&mut self) -> Result<()> {
        let store = self.store;
        let from = as_ref_bound(&self.from);
        loop {
            // Under the engine latch, every key whose state in the tree is uncommitted is
            // exclusively locked by its writer (writers lock before they change the tree and
            // unlock after their end), so the tree and the lock table read together tell which
            // keys need a lock before the entries can be returned. A full batch covers the range
            // up to its last key only; the next batch takes the rest.
            let (entries, mut must_lock) = {
                let mut engine = store.engine()?;
                let range = (from, as_ref_bound(&self.end));
                let entries = store.check(engine.scan(range, SCAN_BATCH))?;
                let covered = match entries.last() {
                    Some((last, _)) if entries.len() == SCAN_BATCH => Bound::Included(&last[..]),
                    _ => as_ref_bound(&self.end),
                };
                let locked_by_others = store.locks.exclusive_keys_in(self.txn, (from, covered));
                (entries, locked_by_others)
            };
            must_lock.extend(
                entries
                    .iter()
                    .map(|(k, _)| k)
                    .filter(|k| !store.locks.holds(self.txn, k))
                    .cloned(),
            );
            if must_lock.is_empty() {
                self.done = entries.len() < SCAN_BATCH;
                if let Some((last, _)) = entries.last() {
                    self.from = Bound::Excluded(last.clone());
                }
                self.batch.extend(entries);
                return Ok(());
            }
            let must_lock: BTreeSet<Vec<u8>> = must_lock.into_iter().collect();
            for key in must_lock {
                store.lock(self.txn, &key, LockMode::Shared)?;
            }
        }
    }
}

impl Iterator for Scan<'_> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.batch.is_empty() && !self.done {
            if let Err(error) = self.read_batch() {
                self.done = true;
                return Some(Err(error));
            }
        }
        self.batch.pop_front().map(Ok)
    }
}

fn as_ref_bound(bound: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match bound {
        Bound::Included(key) => Bound::Included(key.as_slice()),
        Bound::Excluded(key) => Bound::Excluded(key.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
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
            let options = StoreOptions::on_request()
                .archive(false)
                .lock_timeout(None)
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
        let (mut sizes, mut stack) = (Vec::new(), vec![crate::format::page::ROOT]);
        while let Some(id) = stack.pop() {
            let node = &pool.page(id, log.as_ref()).unwrap().node;
            match node {
                crate::format::page::Node::Leaf(_) => sizes.push(node.encoded_len()),
                crate::format::page::Node::Internal(internal) => {
                    stack.extend(internal.children.iter().rev());
                }
            }
        }
        sizes
    }

    #[test]
    fn keys_inserted_in_ascending_order_fill_their_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            dir.path(),
            StoreOptions::on_request().archive(false).lock_timeout(None),
        )
        .unwrap();
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
            assert!(
                size > crate::format::page::PAGE_SIZE - 200,
                "leaf sizes {sizes:?}"
            );
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
        assert!(
            after[0] < crate::format::page::PAGE_SIZE / 2 + 200,
            "{after:?}"
        );
        store.close().unwrap();
    }

    #[test]
    fn an_update_holds_its_key_exclusively_from_the_read_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            dir.path(),
            StoreOptions::on_request().archive(false).lock_timeout(None),
        )
        .unwrap();
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
        let store = Store::open(
            dir.path(),
            StoreOptions::on_request().archive(false).lock_timeout(None),
        )
        .unwrap();
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
        let store = Store::open(
            dir.path(),
            StoreOptions::on_request().archive(false).lock_timeout(None),
        )
        .unwrap();
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
        let options = StoreOptions::on_request()
            .archive(false)
            .lock_timeout(None)
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
