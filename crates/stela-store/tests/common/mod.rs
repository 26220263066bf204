//! Helpers the store's test targets share: the log that stops (a crash at a chosen record) and
//! the options that make a small pool evict (so steal happens) and the log fast.

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use stela_format::Lsn;
use stela_store::log::RecordIter;
use stela_store::{Error, LogDevice, LogRecord, RestartMode, Result, Store, StoreOptions};
use stela_wal::{SyncMode, Wal};

/// Small pool (the minimum, 8 frames) so that dirty pages are evicted while their transactions
/// run; no fdatasync (a dropped log still loses what was appended but not committed, which is
/// the crash these tests make).
pub fn options() -> StoreOptions {
    let options = StoreOptions::on_request()
        .archive(false)
        .lock_timeout(None)
        .pool_pages(8)
        .sync_pages(false);
    let wal = options.wal.clone().sync(SyncMode::None);
    options.wal(wal)
}

/// The embedded log, made durable record by record, that refuses every record after `limit`:
/// the machine dies just as record `limit + 1` would be written, so the durable log is exactly
/// records 1..=limit.
pub struct StopAfter {
    pub wal: Wal<LogRecord>,
    pub limit: u64,
}

impl StopAfter {
    pub fn open(dir: &Path, limit: u64) -> Arc<StopAfter> {
        StopAfter::open_with(dir, limit, options().wal)
    }

    /// As [`StopAfter::open`], with the log's options (small segments, for truncation).
    pub fn open_with(dir: &Path, limit: u64, wal: stela_wal::WalOptions) -> Arc<StopAfter> {
        let wal = Wal::open(dir.join("log"), wal).expect("open the log");
        Arc::new(StopAfter { wal, limit })
    }
}

impl LogDevice for StopAfter {
    fn append(&self, record: &LogRecord) -> Result<Lsn> {
        if self.wal.last_lsn().get() >= self.limit {
            return Err(Error::Io(std::io::Error::other(
                "simulated crash: the log stops here",
            )));
        }
        let lsn = self.wal.append(record)?;
        self.wal.commit(lsn)?;
        Ok(lsn)
    }

    fn flush(&self, lsn: Lsn) -> Result<()> {
        Ok(self.wal.commit(lsn)?)
    }

    fn durable_lsn(&self) -> Lsn {
        LogDevice::durable_lsn(&self.wal)
    }

    fn last_lsn(&self) -> Lsn {
        self.wal.last_lsn()
    }

    fn read_from(&self, lsn: Lsn) -> Result<RecordIter<'_>> {
        LogDevice::read_from(&self.wal, lsn)
    }

    fn truncate_before(&self, lsn: Lsn) -> Result<usize> {
        LogDevice::truncate_before(&self.wal, lsn)
    }
}

/// Every entry of the store, in one committed read-only transaction.
pub fn contents(store: &Store) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut txn = store.begin();
    let all = txn
        .scan(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded)
        .collect::<Result<Vec<_>>>()
        .expect("scan");
    txn.commit().expect("read-only commit");
    all
}

/// Drops a store as a crash would find it: its transaction never ends, its pool is not written.
pub fn crash<T>(txn: Option<T>) {
    if let Some(txn) = txn {
        // Dropping a transaction aborts it; a crash does not.
        std::mem::forget(txn);
    }
}

/// Both restart modes, for the tests that crash and restart.
pub const MODES: [RestartMode; 2] = [RestartMode::Classical, RestartMode::Instant];

/// A copy of a crashed store's files (log, pages, master record), so that one crash can be
/// restarted in each mode without running the workload again.
pub fn copy_store(from: &Path) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
    let to = tempfile::tempdir().unwrap();
    copy(from, to.path());
    to
}
