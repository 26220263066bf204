//! The buffer pool: a fixed number of frames caching pages of the page file, evicted by the
//! clock algorithm.
//!
//! Policy: steal and no-force. A dirty page may be written (on eviction) while the transaction
//! that changed it is still running, and commit writes no page. What makes both safe is the
//! write-ahead rule this module keeps: before a page image with page LSN `L` reaches the page
//! file, the log is durable up to `L` (every change in the image can then be redone or undone
//! from the log). Pages are checked on every read (checksum, page id, layout); a page that fails
//! is [`Error::Corrupt`], never used.
//!
//! Each dirty frame keeps its `rec_lsn`, the first change since it was last clean: the
//! classical checkpoint copies these into its dirty-page table, and redo starts there.
//!
//! With the decoupled cleaner the pool never hears from the cleaner; it only reads the
//! cleaner's published clean LSN (an atomic): every page whose page LSN is at or below it has a
//! stored image that is current. Eviction prefers such pages and clean ones, and drops a
//! current dirty page without writing it (write elision). With the classical cleaner the clean
//! LSN stays zero.
//!
//! With a log archive, the pool hands every image it reads to single-page recovery
//! ([`PageRepair`]): a damaged or stale image is rebuilt from the page's history instead of
//! failing the read, and, when write elision is on, a dirty page whose records are durable may
//! be evicted without a write at all.
//!
//! After an instant restart the pool owns the [`PendingRedo`] index: a page read from the file
//! that has redo pending gets its records applied before the read returns (so no caller ever
//! sees a stale image), and is then dirty from the first record that changed it, like any page
//! changed in the pool: eviction writes it (the records are durable, being from before the
//! crash) unless the decoupled cleaner made its stored image current. Pages still pending are
//! dirty too, as far as the dirty-page table is concerned.
//!
//! The pool is not thread-safe by itself: the store holds it under its engine latch, so a frame
//! is never evicted while an operation uses it.

use crate::access::pagefile::PageFile;
use crate::access::redo::{self, PendingPage, PendingRedo};
use crate::access::repair::PageRepair;
use crate::error::{Error, Result};
use crate::format::page::{Page, PageId};
use crate::format::{DirtyPage, LogRecord, RecordError};
use crate::log::archive::LogArchive;
use crate::log::LogDevice;
use crate::sync::AtomicU64;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use stela_format::Lsn;

/// Counters of the pool's I/O, for tests and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Pages read from the page file (by the pool and the decoupled cleaner).
    pub reads: u64,
    /// Pages written to the page file (eviction, cleaners, a clean close).
    pub writes: u64,
    /// Log flushes forced by the write-ahead rule before a page write of the pool.
    pub wal_flushes: u64,
    /// Dirty pages evicted without a write (write elision): the decoupled cleaner had made
    /// their stored image current, or, with elision on, single-page recovery will.
    pub elided: u64,
    /// Pages evicted to make room, clean or dirty.
    pub evictions: u64,
    /// Dirty pages the pool wrote to evict them.
    pub eviction_writes: u64,
    /// Pages single-page recovery rebuilt: damaged images (then written back) and images an
    /// elided eviction left stale (then held dirty again).
    pub repaired: u64,
    /// Pages read with redo pending (instant restart) and redone on the read.
    pub redone_on_read: u64,
}

struct Frame {
    id: PageId,
    page: Page,
    dirty: bool,
    /// While dirty: the LSN of the first change since the page was last clean.
    rec_lsn: Lsn,
    /// The clock's second chance: set on every use, cleared as the hand passes.
    referenced: bool,
}

pub struct BufferPool {
    file: Arc<PageFile>,
    capacity: usize,
    frames: Vec<Frame>,
    /// Which frame holds which page.
    index: HashMap<PageId, usize>,
    hand: usize,
    stats: PoolStats,
    /// The decoupled cleaner's clean LSN (zero without it); read, never written, here.
    clean_lsn: Arc<AtomicU64>,
    /// Single-page recovery and write elision, when the store keeps a log archive.
    repair: Option<PageRepair>,
    /// Redo instant restart left for later; no page in `index` is in it.
    pending: PendingRedo,
}

impl BufferPool {
    /// A pool of `capacity` frames (at least 8: a split touches up to a root-to-leaf path of
    /// pages plus two new ones, and they are installed one by one) over `file`.
    pub fn new(file: Arc<PageFile>, capacity: usize, clean_lsn: Arc<AtomicU64>) -> BufferPool {
        BufferPool {
            file,
            capacity: capacity.max(8),
            frames: Vec::new(),
            index: HashMap::new(),
            hand: 0,
            stats: PoolStats::default(),
            clean_lsn,
            repair: None,
            pending: PendingRedo::default(),
        }
    }

    /// A pool of exactly `capacity` frames (at least one), for the loom model
    /// (`tests/loom_cleaner.rs`): it never splits, so it does without the floor of 8 that
    /// [`BufferPool::new`] keeps, and a second page already evicts the first. Only under
    /// `--cfg stela_store_loom`.
    #[cfg(stela_store_loom)]
    pub fn with_frames_for_model(
        file: Arc<PageFile>,
        capacity: usize,
        clean_lsn: Arc<AtomicU64>,
    ) -> BufferPool {
        BufferPool {
            capacity: capacity.max(1),
            ..BufferPool::new(file, capacity, clean_lsn)
        }
    }

    /// Reads pages through single-page recovery from now on (and elides writes if it says so).
    pub fn attach_repair(&mut self, repair: PageRepair) {
        self.repair = Some(repair);
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            reads: self.file.reads.load(Ordering::Relaxed),
            writes: self.file.writes.load(Ordering::Relaxed),
            repaired: self.repair.as_ref().map_or(0, |r| r.repaired),
            ..self.stats
        }
    }

    /// Hands the pool the redo instant restart leaves pending. The pool must hold none of
    /// those pages.
    pub fn set_pending(&mut self, pending: PendingRedo) {
        debug_assert!(self.index.is_empty());
        self.pending = pending;
    }

    /// The log archive, when the pool repairs pages from one (`attach_repair`).
    pub fn archive(&self) -> Option<&Arc<LogArchive>> {
        self.repair.as_ref().map(PageRepair::archive)
    }

    /// Pages with redo still pending.
    pub fn pending_pages(&self) -> usize {
        self.pending.pages()
    }

    /// Up to `n` pages with redo pending, lowest ids first.
    pub fn pending_first(&self, n: usize) -> Vec<PageId> {
        self.pending.first_pages(n)
    }

    /// The window of the archive that `pages`' pending redo still has to read: from the
    /// oldest `rec_lsn` to the highest `archived_below` among them (`None`: nothing in it).
    pub fn pending_archived_window(&self, pages: &[PageId]) -> Option<(Lsn, Lsn)> {
        self.pending.archived_window(pages)
    }

    /// Hands `pages`' pending redo the changes the archive held for them in `from..below`
    /// (read by [`LogArchive::histories_of`] outside the engine latch, when the archive
    /// reached `archived`), so that their redo need not read the archive. A page whose
    /// archived stretch the read did not cover keeps it.
    pub fn supply_archived(
        &mut self,
        pages: &[PageId],
        (from, below): (Lsn, Lsn),
        mut histories: crate::log::archive::PageHistories,
        archived: Lsn,
    ) {
        for &page in pages {
            let history = histories.remove(&page).unwrap_or_default();
            self.pending
                .supply_archived(page, (from, below), archived, history);
        }
    }

    /// Reads those of `pages` whose redo is still pending, which redoes them (the background
    /// drain of instant restart).
    pub fn redo_pending(&mut self, pages: &[PageId], log: &dyn LogDevice) -> Result<()> {
        for &id in pages {
            if !self.index.contains_key(&id) {
                self.fetch(id, log)?;
            }
        }
        Ok(())
    }

    fn clean_lsn(&self) -> Lsn {
        Lsn::new(self.clean_lsn.load(Ordering::Acquire))
    }

    /// Whether frame `frame` must be written before its page may leave the pool: dirty, and
    /// newer than its stored image as far as the decoupled cleaner has brought it.
    fn needs_write(&self, frame: usize) -> bool {
        let frame = &self.frames[frame];
        frame.dirty && frame.id != PageId::MAX && frame.page.lsn > self.clean_lsn()
    }

    /// The dirty-page table as the pool knows it (the classical checkpoint's copy): every page
    /// whose stored image may lack changes. Pages the decoupled cleaner made current are
    /// clean. Ascending by page id.
    pub fn dirty_pages(&self) -> Vec<DirtyPage> {
        let mut table: Vec<DirtyPage> = (0..self.frames.len())
            .filter(|&f| self.needs_write(f))
            .map(|f| DirtyPage {
                page: self.frames[f].id,
                // The stored image holds every change up to the clean LSN, so the first one it
                // lacks comes after it, whatever the frame saw first.
                rec_lsn: self.frames[f]
                    .rec_lsn
                    .max(Lsn::new(self.clean_lsn().get() + 1)),
                page_lsn: self.frames[f].page.lsn,
            })
            .collect();
        if let Some(repair) = &self.repair {
            table.extend(repair.elided_dirty(self.clean_lsn()));
        }
        table.extend(self.pending.dirty_pages(self.clean_lsn()));
        table.sort_by_key(|d| d.page);
        table
    }

    /// Copies of the pages that need writing (the classical cleaner's first two latchings:
    /// check the dirty state, copy the image).
    pub fn dirty_copies(&self) -> Vec<(PageId, Page)> {
        (0..self.frames.len())
            .filter(|&f| self.needs_write(f))
            .map(|f| (self.frames[f].id, self.frames[f].page.clone()))
            .collect()
    }

    /// Marks page `id` clean if it is still at `lsn`, the LSN of the image that was written
    /// and synced (the classical cleaner's third latching). A page changed since stays dirty.
    pub fn mark_clean(&mut self, id: PageId, lsn: Lsn) {
        if let Some(&frame) = self.index.get(&id) {
            let frame = &mut self.frames[frame];
            if frame.page.lsn == lsn {
                frame.dirty = false;
            }
        }
    }

    /// Marks frame `frame` dirty by a change at `lsn`.
    fn dirty(&mut self, frame: usize, lsn: Lsn) {
        let frame = &mut self.frames[frame];
        if !frame.dirty {
            frame.dirty = true;
            frame.rec_lsn = lsn;
        }
        // The first change since the page was clean comes before every later one.
        debug_assert!(frame.rec_lsn <= lsn, "page {}: rec_lsn went back", frame.id);
    }

    /// The page `id`, read from the page file if it is not cached.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the stored image fails its checks; I/O and log errors from reading
    /// it or from writing the page evicted to make room.
    pub fn page(&mut self, id: PageId, log: &dyn LogDevice) -> Result<&Page> {
        let frame = self.fetch(id, log)?;
        Ok(&self.frames[frame].page)
    }

    /// Applies `change` to page `id`, stamps it with `lsn` and marks it dirty. The caller has
    /// appended the record at `lsn` that describes the change.
    pub fn modify(
        &mut self,
        id: PageId,
        lsn: Lsn,
        log: &dyn LogDevice,
        change: impl FnOnce(&mut Page),
    ) -> Result<()> {
        let frame = self.fetch(id, log)?;
        change(&mut self.frames[frame].page);
        self.frames[frame].page.lsn = lsn;
        self.dirty(frame, lsn);
        Ok(())
    }

    /// Puts `page` in the pool as page `id` without reading the file (a new page, or a whole
    /// image from a structure change), dirty.
    pub fn install(&mut self, id: PageId, page: Page, log: &dyn LogDevice) -> Result<()> {
        let frame = match self.index.get(&id) {
            Some(&frame) => frame,
            None => self.free_frame(id, Page::empty(), log)?,
        };
        // A whole image at a new LSN: pending records, all older, have nothing left to add.
        self.pending.take(id);
        let lsn = page.lsn;
        self.frames[frame].page = page;
        self.frames[frame].referenced = true;
        self.dirty(frame, lsn);
        Ok(())
    }

    /// Drops page `id` from the pool without writing it.
    #[allow(dead_code)]
    pub fn forget(&mut self, id: PageId) {
        if let Some(frame) = self.index.remove(&id) {
            // Leave the frame as a clean empty slot the clock will reuse.
            self.frames[frame].dirty = false;
            self.frames[frame].referenced = false;
            self.frames[frame].id = PageId::MAX;
        }
    }

    /// Applies `change` to page `id` (read if not cached) and marks it dirty if `change` says
    /// it changed the page. Restart's redo: the change decides from the page LSN.
    pub fn update(
        &mut self,
        id: PageId,
        log: &dyn LogDevice,
        change: impl FnOnce(&mut Page) -> Result<bool>,
    ) -> Result<bool> {
        let frame = self.fetch(id, log)?;
        let changed = change(&mut self.frames[frame].page)?;
        if changed {
            let lsn = self.frames[frame].page.lsn;
            self.dirty(frame, lsn);
        }
        Ok(changed)
    }

    /// Restart's redo found that page `id`'s image already held its records: if the pool
    /// holds it clean (its stored image is the same), tell the page file, which reports it
    /// with its next writes (after their sync). Without this a page whose `PagesWritten`
    /// record a crash lost stays dirty in log analysis (decoupled checkpoints) until something
    /// changes it again, and pins redo's start and the log behind it.
    pub fn confirm_current(&self, id: PageId) {
        if let Some(&frame) = self.index.get(&id) {
            let frame = &self.frames[frame];
            if !frame.dirty {
                self.file.confirm(id, frame.page.lsn);
            }
        }
    }

    /// Writes every dirty page (log first), syncs the page file and logs the writes: a clean
    /// shutdown.
    pub fn flush_all(&mut self, log: &dyn LogDevice) -> Result<()> {
        if let Some(repair) = &mut self.repair {
            repair.write_elided(&self.file, log)?;
        }
        for frame in 0..self.frames.len() {
            if self.needs_write(frame) {
                self.write_frame(frame, log)?;
            }
        }
        self.file.log_writes(log)?;
        Ok(())
    }

    fn fetch(&mut self, id: PageId, log: &dyn LogDevice) -> Result<usize> {
        if let Some(&frame) = self.index.get(&id) {
            self.frames[frame].referenced = true;
            return Ok(frame);
        }
        let stored = self.file.read(id)?;
        let (mut page, dirty_since) = match &mut self.repair {
            Some(repair) => {
                let checked = repair.check(id, stored, &self.file, log)?;
                (checked.page, checked.dirty_since)
            }
            None => (
                stored.map_err(|source| Error::Corrupt { page: id, source })?,
                None,
            ),
        };
        let Some(pending) = self.pending.take(id) else {
            let frame = self.free_frame(id, page, log)?;
            if let Some(rec_lsn) = dirty_since {
                self.dirty(frame, rec_lsn);
            }
            return Ok(frame);
        };
        // Redo first, on the image read (or rebuilt), so that nothing sees the page without
        // its records; on failure the pending redo goes back and the page stays out of the
        // pool.
        let first_redone = self
            .archived_part(id, page.lsn, &pending)
            .and_then(|archived| {
                let first = redo::redo_all(id, &mut page, &archived)?;
                let later = redo::redo_all(id, &mut page, &pending.records)?;
                Ok(first.or(later))
            })
            .and_then(|first| Ok((first, self.free_frame(id, page, log)?)));
        match first_redone {
            Ok((first, frame)) => {
                self.stats.redone_on_read += 1;
                // Dirty from the earlier of what single-page recovery and redo changed.
                let since = match (dirty_since, first) {
                    (Some(repaired), Some(redone)) => Some(repaired.min(redone)),
                    (repaired, redone) => repaired.or(redone),
                };
                match since {
                    Some(since) => self.dirty(frame, since),
                    None => self.confirm_current(id),
                }
                Ok(frame)
            }
            Err(error) => {
                self.pending.restore(id, pending);
                Err(error)
            }
        }
    }

    /// The changes of page `id` (whose image is at `image_lsn`) that its pending redo left in
    /// the archive: those in `rec_lsn..archived_below` above the image, in LSN order.
    fn archived_part(
        &self,
        id: PageId,
        image_lsn: Lsn,
        pending: &PendingPage,
    ) -> Result<Vec<(Lsn, Arc<LogRecord>)>> {
        if pending.archived_below == Lsn::ZERO {
            return Ok(Vec::new());
        }
        let archive = self.archive().ok_or(Error::Unsupported(
            "restart left redo in a log archive the buffer pool does not have",
        ))?;
        let after = image_lsn.max(Lsn::new(pending.rec_lsn.get().saturating_sub(1)));
        let (history, archived) = archive.page_history(id, after)?;
        if archived < Lsn::new(pending.archived_below.get().saturating_sub(1)) {
            return Err(Error::BadLogRecord {
                lsn: pending.archived_below,
                source: RecordError::Invalid("the log archive ends before what restart left in it"),
            });
        }
        Ok(history
            .into_iter()
            .take_while(|(lsn, _)| *lsn < pending.archived_below)
            .map(|(lsn, record)| (lsn, Arc::new(record)))
            .collect())
    }

    /// A frame for page `id` holding `page`: a new one while the pool is not full, else the
    /// clock's victim, written first if dirty.
    fn free_frame(&mut self, id: PageId, page: Page, log: &dyn LogDevice) -> Result<usize> {
        let frame = if self.frames.len() < self.capacity {
            self.frames.push(Frame {
                id,
                page: Page::empty(),
                dirty: false,
                rec_lsn: Lsn::ZERO,
                referenced: false,
            });
            self.frames.len() - 1
        } else {
            let victim = self.clock_victim();
            self.stats.evictions += 1;
            let (id, rec_lsn, page_lsn) = {
                let frame = &self.frames[victim];
                (frame.id, frame.rec_lsn, frame.page.lsn)
            };
            let elided = |repair: &mut PageRepair| repair.may_elide(id, rec_lsn, page_lsn, log);
            if self.needs_write(victim) && self.repair.as_mut().is_some_and(elided) {
                self.stats.elided += 1;
            } else if self.needs_write(victim) {
                self.write_frame(victim, log)?;
                self.stats.eviction_writes += 1;
            } else if self.frames[victim].dirty {
                self.stats.elided += 1;
            }
            self.index.remove(&self.frames[victim].id);
            victim
        };
        self.frames[frame] = Frame {
            id,
            page,
            dirty: false,
            rec_lsn: Lsn::ZERO,
            referenced: true,
        };
        self.index.insert(id, frame);
        Ok(frame)
    }

    /// The clock's victim. Two sweeps look for an unreferenced page that can leave without a
    /// write (clean, or made current by the decoupled cleaner); only if there is none does the
    /// plain clock pick a page that must be written first.
    fn clock_victim(&mut self) -> usize {
        for _ in 0..2 * self.frames.len() {
            let at = self.hand;
            self.hand = (self.hand + 1) % self.frames.len();
            if self.frames[at].referenced {
                self.frames[at].referenced = false;
            } else if !self.needs_write(at) {
                return at;
            }
        }
        loop {
            let at = self.hand;
            self.hand = (self.hand + 1) % self.frames.len();
            let frame = &mut self.frames[at];
            if frame.referenced {
                frame.referenced = false;
            } else {
                return at;
            }
        }
    }

    /// Writes one frame's page, after making its log records durable (the write-ahead rule).
    fn write_frame(&mut self, frame: usize, log: &dyn LogDevice) -> Result<()> {
        let (id, lsn) = (self.frames[frame].id, self.frames[frame].page.lsn);
        if log.durable_lsn() < lsn {
            log.flush(lsn)?;
            self.stats.wal_flushes += 1;
        }
        debug_assert!(
            log.durable_lsn() >= lsn,
            "write-ahead rule: page {id} at {lsn} written with the log durable to {}",
            log.durable_lsn()
        );
        debug_assert!(
            !self.frames[frame].dirty || self.frames[frame].rec_lsn <= lsn,
            "page {id}: rec_lsn after its page LSN {lsn}"
        );
        self.file.write(id, &self.frames[frame].page)?;
        self.frames[frame].dirty = false;
        Ok(())
    }
}
