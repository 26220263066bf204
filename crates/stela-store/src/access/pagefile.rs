//! The page file: the persistent page images, shared by the buffer pool (reads on a miss,
//! writes on eviction and at close) and the page cleaners, which run on their own threads.
//!
//! This module owns every read and write of the file and keeps three invariants:
//! - A page's stored image never goes back in time: a write whose image is older than the last
//!   one written for that page (the classical cleaner's copy, overtaken by an eviction; the
//!   decoupled cleaner's replay, overtaken by the pool) is skipped. Images in the pool are
//!   always at least as new as the stored one, so only writes of this process can be newer.
//! - No read sees half a write: reads and writes of the file are serialised by one mutex.
//! - What was written is reported to the log only once it is synced: [`PageFile::log_writes`]
//!   syncs the file, then appends one `PagesWritten` record for the writes made before the
//!   sync. A durable `PagesWritten` record is therefore always true, which log analysis (the
//!   decoupled checkpoint, restart) relies on to drop a page from its dirty-page table.
//!
//! The write-ahead rule is the writer's: an image with page LSN `L` is handed to
//! [`PageFile::write`] only once the log is durable up to `L`.

use crate::error::Result;
use crate::format::page::{self, Page, PageError, PageId, PAGE_SIZE};
use crate::format::{LogBody, LogRecord, SYSTEM_TXN};
use crate::log::LogDevice;
use crate::sync::{AtomicU64, Mutex};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use stela_format::Lsn;
use stela_wal::storage::{OpenMode, Storage, StorageFile};

thread_local! {
    /// The image a page write encodes into: one buffer per writing thread, not an allocation
    /// per page (the decoupled cleaner writes about one page per transaction at 1 ms rounds).
    static ENCODED: std::cell::RefCell<Box<[u8; PAGE_SIZE]>> =
        std::cell::RefCell::new(Box::new([0; PAGE_SIZE]));
}

/// Bytes a cleaner writes before it starts their writeback ([`PageFile::write_batched`]):
/// PostgreSQL's checkpointer starts writeback every 256 KiB (`checkpoint_flush_after`), RocksDB
/// every `bytes_per_sync` (1 MiB is its suggested value); this is between the two.
pub(crate) const WRITEBACK_AFTER_BYTES: u64 = 512 << 10;

pub struct PageFile {
    /// On the store's storage (the real file system, or the fault-injecting one in tests and
    /// the power-cut benchmark).
    file: Box<dyn StorageFile>,
    /// Whether [`PageFile::sync`] calls fdatasync. Off only where the page file need not
    /// survive the machine (tests, and the `buffered` level, whose log does not either).
    sync: bool,
    /// Held for every read and write; maps each page written by this process to the LSN of
    /// the last image written, so that no write goes back in time.
    written: Mutex<HashMap<PageId, Lsn>>,
    /// Writes made and not yet reported in a `PagesWritten` record, in the order made.
    unreported: Mutex<Vec<(PageId, Lsn)>>,
    /// Writes made so far, and how many of them the last completed sync covers.
    write_seq: AtomicU64,
    synced_seq: AtomicU64,
    /// Bytes the cleaners wrote since they last started the file's writeback
    /// ([`PageFile::write_batched`]). A hint's trigger, not a correctness matter, so std's even
    /// in the loom model.
    unstarted: std::sync::atomic::AtomicU64,
    /// Statistics only (never read to decide anything), so std's even in the loom model.
    pub(crate) reads: std::sync::atomic::AtomicU64,
    pub(crate) writes: std::sync::atomic::AtomicU64,
    pub(crate) syncs: std::sync::atomic::AtomicU64,
}

/// Opens the page file of the store directory `dir` (its `pages`), creating it if absent; a
/// new file's name is made durable (the directory synced) before any page is reported written
/// to it, so a power cut cannot take the file while the log says its pages are there.
pub(crate) fn open_in(storage: &dyn Storage, dir: &Path) -> Result<Box<dyn StorageFile>> {
    let pages = dir.join("pages");
    match storage.open(&pages, OpenMode::ReadWrite) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let file = storage.open(&pages, OpenMode::CreateNew)?;
            storage.sync_dir(dir)?;
            Ok(file)
        }
        opened => Ok(opened?),
    }
}

impl PageFile {
    pub fn new(file: Box<dyn StorageFile>, sync: bool) -> PageFile {
        PageFile {
            file,
            sync,
            written: Mutex::new(HashMap::new()),
            unreported: Mutex::new(Vec::new()),
            write_seq: AtomicU64::new(0),
            synced_seq: AtomicU64::new(0),
            unstarted: std::sync::atomic::AtomicU64::new(0),
            reads: std::sync::atomic::AtomicU64::new(0),
            writes: std::sync::atomic::AtomicU64::new(0),
            syncs: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Pages the file spans (a page past the end reads as never written).
    pub fn pages(&self) -> Result<u64> {
        Ok(self.file.len()?.div_ceil(PAGE_SIZE as u64))
    }

    /// Reads and checks the stored image of page `id`. The outer error is I/O; the inner one
    /// says the image failed its checks.
    pub fn read(&self, id: PageId) -> Result<Result<Page, PageError>> {
        let mut image = vec![0u8; PAGE_SIZE];
        let offset = id.checked_mul(PAGE_SIZE as u64).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "page id out of range")
        })?;
        let _serialised = self.written.lock().unwrap_or_else(|p| p.into_inner());
        let mut filled = 0;
        while filled < PAGE_SIZE {
            match self
                .file
                .read_at(&mut image[filled..], offset + filled as u64)
            {
                // Past the end of the file: a page never written reads as zeros.
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(page::decode(id, &image))
    }

    /// Reads page `id`'s bytes and drops them: it only brings them into the OS's cache, so that
    /// a read under a latch soon after does not wait for the disk. Not serialised with writes
    /// (what it reads is never used) and not counted.
    pub fn warm(&self, id: PageId) -> Result<()> {
        let mut image = vec![0u8; PAGE_SIZE];
        let Some(offset) = id.checked_mul(PAGE_SIZE as u64) else {
            return Ok(());
        };
        match self.file.read_at(&mut image, offset) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `page` as page `id` unless a newer image of it was written already. Returns
    /// whether it wrote. The log must be durable up to `page.lsn`.
    pub fn write(&self, id: PageId, page: &Page) -> Result<bool> {
        self.write_unless_newer(id, page, false)
    }

    /// [`PageFile::write`] for a cleaner writing a batch it syncs at the end: after every
    /// [`WRITEBACK_AFTER_BYTES`] written it starts their writeback (when the file is synced at
    /// all), so that the batch goes to the device while it is written, not all at once in the
    /// sync. Why: a log sync issued while that sync drains the batch waited behind all of it
    /// (at `disk` with 16 TPC-B clients and a 1 s interval, 120-170 MiB a round), and every
    /// commit with it. Not for the pool's eviction writes, made under the engine latch:
    /// starting writeback may wait for room in the device's queue.
    pub fn write_batched(&self, id: PageId, page: &Page) -> Result<bool> {
        let wrote = self.write(id, page)?;
        if wrote && self.sync {
            let step = PAGE_SIZE as u64;
            let pending = self.unstarted.fetch_add(step, Ordering::Relaxed) + step;
            if pending >= WRITEBACK_AFTER_BYTES {
                self.unstarted.store(0, Ordering::Relaxed);
                self.file.start_writeback()?;
            }
        }
        Ok(wrote)
    }

    /// Writes a page rebuilt by single-page recovery over its stored image, even if an image
    /// of the same LSN was written before (that image was since found damaged); never over a
    /// newer one. The log must be durable up to `page.lsn`.
    pub fn write_repaired(&self, id: PageId, page: &Page) -> Result<bool> {
        self.write_unless_newer(id, page, true)
    }

    fn write_unless_newer(&self, id: PageId, page: &Page, same_lsn_too: bool) -> Result<bool> {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        let stale = |stored: Lsn| stored > page.lsn || (stored == page.lsn && !same_lsn_too);
        if written.get(&id).is_some_and(|&stored| stale(stored)) {
            return Ok(false);
        }
        // Encoded and written in one borrow of this thread's buffer, with no lock taken in
        // between (loom's threads may share a thread-local).
        ENCODED.with_borrow_mut(|image| -> Result<()> {
            page::encode_into(id, page, image)
                .map_err(|source| crate::error::Error::Corrupt { page: id, source })?;
            // What reaches the file is the image given: it decodes back to the same page.
            debug_assert!(
                page::decode(id, &image[..]).is_ok_and(|decoded| decoded == *page),
                "page {id} does not decode to the image written"
            );
            Ok(self.file.write_all_at(&image[..], id * PAGE_SIZE as u64)?)
        })?;
        written.insert(id, page.lsn);
        self.write_seq.fetch_add(1, Ordering::AcqRel);
        drop(written);
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.unreported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, page.lsn));
        Ok(true)
    }

    /// Records that the stored image of page `id`, as read now, already holds every change
    /// of the page up to `lsn` (the decoupled cleaner replayed the page's records onto it and
    /// they changed nothing): reported with the next [`PageFile::log_writes`], after its sync,
    /// exactly as a write would be. Without it, a page whose `PagesWritten` record a crash
    /// lost while its image survived stays dirty in log analysis for as long as nothing
    /// changes it again (a full history leaf: for ever), and redo's start, and the log
    /// behind it, can never move past it.
    pub fn confirm(&self, id: PageId, lsn: Lsn) {
        self.unreported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, lsn));
    }

    /// Makes every write made so far durable (when syncing is on).
    pub fn sync(&self) -> Result<()> {
        let covers = self.write_seq.load(Ordering::Acquire);
        if self.sync {
            self.file.sync_data()?;
            self.syncs.fetch_add(1, Ordering::Relaxed);
        }
        self.synced_seq.fetch_max(covers, Ordering::AcqRel);
        Ok(())
    }

    /// Syncs only if some write made so far is not covered by a completed sync.
    pub fn sync_if_unsynced(&self) -> Result<()> {
        if self.synced_seq.load(Ordering::Acquire) < self.write_seq.load(Ordering::Acquire) {
            self.sync()?;
        }
        Ok(())
    }

    /// Syncs the file for a writer that must not write to the log it reads (the standby
    /// follower, `follow`): the writes made so far are synced and forgotten instead of
    /// reported. Its progress is recorded elsewhere, after this returns.
    pub fn sync_unlogged(&self) -> Result<()> {
        self.unreported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.sync()
    }

    /// Syncs the file, then logs the writes made before the sync in one `PagesWritten` record
    /// (none if there were none). Returns the record's LSN. The record is not flushed: it only
    /// matters once durable, and being late only makes analysis keep a page dirty for longer.
    pub fn log_writes(&self, log: &dyn LogDevice) -> Result<Option<Lsn>> {
        let pages = std::mem::take(&mut *self.unreported.lock().unwrap_or_else(|p| p.into_inner()));
        if pages.is_empty() {
            return Ok(None);
        }
        if let Err(e) = self.sync() {
            // Not reported: put them back so a later sync reports them.
            self.unreported
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .splice(0..0, pages);
            return Err(e);
        }
        let lsn = log.append(&LogRecord {
            txn: SYSTEM_TXN,
            prev_txn_lsn: Lsn::ZERO,
            body: LogBody::PagesWritten { pages },
        })?;
        Ok(Some(lsn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use stela_wal::storage::{Call, Hooked, Hooks, StdStorage};

    /// Counts the writebacks started on the files it sees.
    #[derive(Debug, Default)]
    struct Writebacks(AtomicUsize);

    impl Hooks for Writebacks {
        fn before(&self, call: &Call<'_>) -> std::io::Result<()> {
            if matches!(call, Call::StartWriteback { .. }) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
    }

    fn page_file(dir: &Path, sync: bool) -> (PageFile, Hooked<Writebacks>) {
        let storage = Hooked::wrap(Arc::new(StdStorage), Writebacks::default());
        let file = PageFile::new(open_in(&storage, dir).unwrap(), sync);
        (file, storage)
    }

    fn started(storage: &Hooked<Writebacks>) -> usize {
        storage.hooks().0.load(Ordering::Relaxed)
    }

    fn page(lsn: u64) -> Page {
        let mut page = Page::empty();
        page.lsn = Lsn::new(lsn);
        page
    }

    #[test]
    fn a_cleaner_starts_writeback_every_half_mebibyte_of_a_synced_file_and_never_otherwise() {
        let per_start = (WRITEBACK_AFTER_BYTES / PAGE_SIZE as u64) as usize;
        let dir = tempfile::tempdir().unwrap();
        let (file, storage) = page_file(dir.path(), true);
        for id in 0..(3 * per_start + 1) as u64 {
            assert!(file.write_batched(id, &page(1)).unwrap());
        }
        assert_eq!(started(&storage), 3, "one per {per_start} pages");
        // Writes skipped as stale write nothing, and count for nothing.
        for id in 0..per_start as u64 {
            assert!(!file.write_batched(id, &page(1)).unwrap());
        }
        assert_eq!(started(&storage), 3);
        // The pool's writes (under the engine latch) never start one.
        for id in 0..(2 * per_start) as u64 {
            assert!(file.write(id, &page(2)).unwrap());
        }
        assert_eq!(started(&storage), 3);
        file.sync().unwrap();
        assert_eq!(file.read(5).unwrap().unwrap().lsn, Lsn::new(2));

        // A file that is never synced (the `buffered` level) is left to the OS's writeback.
        let other = tempfile::tempdir().unwrap();
        let (file, storage) = page_file(other.path(), false);
        for id in 0..(2 * per_start) as u64 {
            file.write_batched(id, &page(1)).unwrap();
        }
        assert_eq!(started(&storage), 0);
    }
}
