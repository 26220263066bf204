//! [`SegmentSet`]: every segment of a log, oldest first, shared by the writer (which adds
//! segments), readers and truncation.
//!
//! It sits below both the opening of a log ([`crate::files`], which builds it from what
//! [`crate::recovery`] found) and the writer ([`crate::writer`], which adds segments to it), so
//! neither reaches back up into the other.
//!
//! Invariants:
//! - The list is ordered by first LSN, oldest first; a segment is only added at the end
//!   ([`SegmentSet::push`], asserted) and only removed from the front.
//! - The newest segment is never removed by truncation.
//! - The directory lock is held as long as the set lives, so no other handle can open the log.

use crate::error::{Error, Result};
use crate::reader::{RawReader, ReadPoint};
use crate::segment::SegmentFile;
use crate::storage::Storage;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use stela_format::Lsn;

/// Every segment of a log, oldest first. Shared by the writer (which adds segments), readers
/// and truncation; holds the directory lock.
pub struct SegmentSet {
    pub(crate) storage: Arc<dyn Storage>,
    dir: PathBuf,
    list: Mutex<Vec<SegmentFile>>,
    pub(crate) max_payload: u32,
    skip_damage: bool,
    /// Where the last reader that asked to be remembered stopped: a reader tailing the log
    /// starts there instead of re-reading the segment from its beginning.
    read_point: Mutex<Option<ReadPoint>>,
    _lock: Box<dyn Send + Sync>,
}

impl fmt::Debug for SegmentSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentSet")
            .field("dir", &self.dir)
            .field("segments", &*self.lock())
            .finish()
    }
}

impl SegmentSet {
    /// The set of `segments` (oldest first) in `dir`, holding the directory `lock`.
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        segments: Vec<SegmentFile>,
        max_payload: u32,
        skip_damage: bool,
        lock: Box<dyn Send + Sync>,
    ) -> SegmentSet {
        debug_assert!(
            segments
                .windows(2)
                .all(|pair| pair[0].start < pair[1].start),
            "segments out of LSN order"
        );
        SegmentSet {
            storage,
            dir,
            list: Mutex::new(segments),
            max_payload,
            skip_damage,
            read_point: Mutex::new(None),
            _lock: lock,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<SegmentFile>> {
        // Nothing panics while the list is locked (plain vector edits and file removals whose
        // errors are returned), so a poisoned lock still guards a consistent list.
        self.list
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The first LSN still in the log (the first segment's first LSN).
    pub fn first_lsn(&self) -> Lsn {
        self.lock().first().map_or(Lsn::FIRST, |s| s.start)
    }

    /// The segment files, oldest first.
    pub fn list(&self) -> Vec<SegmentFile> {
        self.lock().clone()
    }

    /// The header of the segment file at `path`, read through the log's storage (its first
    /// bytes only).
    ///
    /// # Errors
    /// The I/O error of opening or reading it; [`Error::BadHeader`] if it does not decode.
    pub fn read_header(&self, path: &Path) -> Result<stela_format::SegmentHeader> {
        let file = self
            .storage
            .open(path, crate::storage::OpenMode::Read)
            .map_err(|e| Error::io("open", path, e))?;
        crate::segment::read_header(file.as_ref(), path)
    }

    /// A reader of the records `from..end` (from is clamped to the first LSN present), checking
    /// every frame (see [`RawReader`]). The segment list is taken now: segments added later are
    /// not read, so `end` should be at most the first LSN not yet written.
    pub fn reader(&self, from: Lsn, end: Lsn) -> RawReader {
        let segments = self.list();
        let first = segments.first().map_or(Lsn::FIRST, |s| s.start);
        RawReader::new(
            Arc::clone(&self.storage),
            segments,
            from.max(first),
            end,
            self.max_payload,
            self.skip_damage,
        )
    }

    /// As [`SegmentSet::reader`], starting where the last remembered reader stopped when that
    /// is at or before `from` in the same segment (a reader that follows the log's tail then
    /// costs what it reads, not the whole segment before it).
    pub fn tail_reader(&self, from: Lsn, end: Lsn) -> RawReader {
        let point = *self
            .read_point
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut reader = self.reader(from, end);
        if let Some(point) = point {
            reader.start_at(point);
        }
        reader
    }

    /// Remembers where a reader stopped, for the next [`SegmentSet::tail_reader`]; `None`
    /// forgets (after a read from a remembered point failed).
    pub fn remember_read_point(&self, point: Option<ReadPoint>) {
        *self
            .read_point
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = point;
    }

    /// Removes whole segments whose records are all below `lsn` (those whose successor starts at
    /// or before `lsn`), then syncs the directory. The newest segment is never removed. Returns
    /// how many segments were removed.
    ///
    /// # Errors
    /// The I/O error of the removal or the directory sync, naming the path.
    pub fn truncate_before(&self, lsn: Lsn) -> Result<usize> {
        let mut segments = self.lock();
        let removable = segments
            .windows(2)
            .take_while(|pair| pair[1].start <= lsn)
            .count();
        for segment in segments.drain(..removable) {
            self.storage
                .remove(&segment.path)
                .map_err(|e| Error::io("remove", &segment.path, e))?;
        }
        if removable > 0 {
            self.storage
                .sync_dir(&self.dir)
                .map_err(|e| Error::io("fsync directory", &self.dir, e))?;
        }
        Ok(removable)
    }

    /// Removes `segments` in the order given, syncing the directory after each, so that a crash
    /// between two removals leaves the files the order promises (a log that opens, for an order
    /// that keeps one).
    pub(crate) fn remove_one_by_one<'a>(
        storage: &dyn Storage,
        dir: &Path,
        segments: impl IntoIterator<Item = &'a SegmentFile>,
    ) -> Result<()> {
        for segment in segments {
            storage
                .remove(&segment.path)
                .map_err(|e| Error::io("remove", &segment.path, e))?;
            storage
                .sync_dir(dir)
                .map_err(|e| Error::io("fsync directory", dir, e))?;
        }
        Ok(())
    }

    pub(crate) fn push(&self, segment: SegmentFile) {
        let mut list = self.lock();
        debug_assert!(
            list.last()
                .is_none_or(|newest| newest.start < segment.start),
            "a segment added out of LSN order"
        );
        list.push(segment);
    }
}
