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
//! The pool is not thread-safe by itself: the store holds it under its engine latch, so a frame
//! is never evicted while an operation uses it.

use crate::error::{Error, Result};
use crate::log::LogDevice;
use crate::page::{self, Page, PageId, PAGE_SIZE};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use stela_format::Lsn;

/// Counters of the pool's I/O, for tests and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Pages read from the page file.
    pub reads: u64,
    /// Pages written to the page file (on eviction and at a clean close).
    pub writes: u64,
    /// Log flushes forced by the write-ahead rule before a page write.
    pub wal_flushes: u64,
}

struct Frame {
    id: PageId,
    page: Page,
    dirty: bool,
    /// The clock's second chance: set on every use, cleared as the hand passes.
    referenced: bool,
}

pub struct BufferPool {
    file: File,
    capacity: usize,
    frames: Vec<Frame>,
    /// Which frame holds which page.
    index: HashMap<PageId, usize>,
    hand: usize,
    stats: PoolStats,
}

impl BufferPool {
    /// A pool of `capacity` frames (at least 8: a split touches up to a root-to-leaf path of
    /// pages plus two new ones, and they are installed one by one) over `file`.
    pub fn new(file: File, capacity: usize) -> BufferPool {
        BufferPool {
            file,
            capacity: capacity.max(8),
            frames: Vec::new(),
            index: HashMap::new(),
            hand: 0,
            stats: PoolStats::default(),
        }
    }

    pub fn stats(&self) -> PoolStats {
        self.stats
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
        let frame = &mut self.frames[frame];
        change(&mut frame.page);
        frame.page.lsn = lsn;
        frame.dirty = true;
        Ok(())
    }

    /// Puts `page` in the pool as page `id` without reading the file (a new page, or a whole
    /// image from a structure change), dirty.
    pub fn install(&mut self, id: PageId, page: Page, log: &dyn LogDevice) -> Result<()> {
        let frame = match self.index.get(&id) {
            Some(&frame) => frame,
            None => self.free_frame(id, Page::empty(), log)?,
        };
        let frame = &mut self.frames[frame];
        frame.page = page;
        frame.dirty = true;
        frame.referenced = true;
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
        self.frames[frame].dirty |= changed;
        Ok(changed)
    }

    /// Writes every dirty page (log first) and syncs the page file: a clean shutdown.
    pub fn flush_all(&mut self, log: &dyn LogDevice) -> Result<()> {
        for frame in 0..self.frames.len() {
            if self.frames[frame].dirty && self.frames[frame].id != PageId::MAX {
                self.write_frame(frame, log)?;
            }
        }
        self.file.sync_data()?;
        Ok(())
    }

    /// Reads the stored image of page `id` (not the cached one).
    pub fn read_stored(&mut self, id: PageId) -> Result<Result<Page, page::PageError>> {
        let mut image = vec![0u8; PAGE_SIZE];
        let offset = id.checked_mul(PAGE_SIZE as u64).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "page id out of range")
        })?;
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
        self.stats.reads += 1;
        Ok(page::decode(id, &image))
    }

    fn fetch(&mut self, id: PageId, log: &dyn LogDevice) -> Result<usize> {
        if let Some(&frame) = self.index.get(&id) {
            self.frames[frame].referenced = true;
            return Ok(frame);
        }
        let page = self
            .read_stored(id)?
            .map_err(|source| Error::Corrupt { page: id, source })?;
        self.free_frame(id, page, log)
    }

    /// A frame for page `id` holding `page`: a new one while the pool is not full, else the
    /// clock's victim, written first if dirty.
    fn free_frame(&mut self, id: PageId, page: Page, log: &dyn LogDevice) -> Result<usize> {
        let frame = if self.frames.len() < self.capacity {
            self.frames.push(Frame {
                id,
                page: Page::empty(),
                dirty: false,
                referenced: false,
            });
            self.frames.len() - 1
        } else {
            let victim = self.clock_victim();
            if self.frames[victim].dirty && self.frames[victim].id != PageId::MAX {
                self.write_frame(victim, log)?;
            }
            self.index.remove(&self.frames[victim].id);
            victim
        };
        self.frames[frame] = Frame {
            id,
            page,
            dirty: false,
            referenced: true,
        };
        self.index.insert(id, frame);
        Ok(frame)
    }

    fn clock_victim(&mut self) -> usize {
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
        let image = page::encode(id, &self.frames[frame].page)
            .map_err(|source| Error::Corrupt { page: id, source })?;
        self.file.write_all_at(&image[..], id * PAGE_SIZE as u64)?;
        self.frames[frame].dirty = false;
        self.stats.writes += 1;
        Ok(())
    }
}
