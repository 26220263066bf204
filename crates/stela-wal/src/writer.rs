//! [`SegmentWriter`]: the newest segment of a log, open for writing: positioned writes of
//! framed bytes, fdatasync, and rotation to a new segment. The embedded [`crate::Log`] writes
//! through it, and so do the log daemon's flushers.
//!
//! Invariants (see also [`crate::files`]):
//! - A file named `<lsn>.wal` always has a complete, synced header: a segment is prepared under
//!   a temporary name (allocated to full size, header written, fdatasync'ed) and only then
//!   renamed into place, and the directory is fsync'ed before any record is written into it.
//! - Segments are preallocated to their full capacity, so writing records never grows the file
//!   (fdatasync then flushes data only, and a full disk shows up when a segment is created, not
//!   in the middle of a commit), and unwritten space reads as zeros.
//! - Only the newest segment is written, only between its header and its capacity.
//! - A segment is fdatasync'ed before its successor is created, so only the newest segment can
//!   end in a torn write.
//! - After a failed write or sync the writer refuses every later call ([`Error::Poisoned`]): a
//!   failed fdatasync is never retried on the same file. A next segment that cannot be created
//!   for lack of space is the one failure that does not stop it: nothing written is at stake,
//!   and a later rotation tries again with a new file.

use crate::error::{Error, Result};
use crate::files::SegmentSet;
use crate::segment::SegmentFile;
use crate::storage::{OpenMode, Storage, StorageFile};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stela_format::frame::Layout;
use stela_format::header::HEADER_BYTES;
use stela_format::segment_name::{segment_file_name, temp_file_name};
use stela_format::{Lsn, SegmentHeader};

/// The newest segment of a log, open for writing. See the module documentation.
pub struct SegmentWriter {
    storage: Arc<dyn Storage>,
    segments: Arc<SegmentSet>,
    file: Box<dyn StorageFile>,
    path: PathBuf,
    header: SegmentHeader,
    /// Capacity of the segments this writer creates.
    new_capacity: u64,
    /// The first failure; every later call is refused with it.
    failure: Option<Arc<Error>>,
}

impl fmt::Debug for SegmentWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentWriter")
            .field("path", &self.path)
            .field("segment_start", &self.header.start_lsn)
            .field("capacity", &self.header.capacity)
            .field("failure", &self.failure)
            .finish()
    }
}

impl SegmentWriter {
    /// The writer of `file`, the newest segment at `path`, as recovery left it.
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        segments: Arc<SegmentSet>,
        file: Box<dyn StorageFile>,
        path: PathBuf,
        header: SegmentHeader,
        new_capacity: u64,
    ) -> SegmentWriter {
        SegmentWriter {
            storage,
            segments,
            file,
            path,
            header,
            new_capacity,
            failure: None,
        }
    }

    /// The first LSN of the newest segment.
    pub fn segment_start(&self) -> Lsn {
        self.header.start_lsn
    }

    /// The capacity of the newest segment: frames must end at or before it.
    pub fn capacity(&self) -> u64 {
        self.header.capacity
    }

    /// The newest segment's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The segments of the log (the same set [`LogFiles::segments`] holds).
    pub fn segments(&self) -> &Arc<SegmentSet> {
        &self.segments
    }

    /// Writes `bufs` back to back at `offset` of the newest segment, as one positioned write.
    /// Not durable until [`SegmentWriter::sync`].
    ///
    /// # Errors
    /// The I/O error naming the segment ([`Error::DiskFull`] for a full device); then, and
    /// after any earlier failure, [`Error::Poisoned`] for every later call.
    ///
    /// # Panics
    /// If the bytes would not lie between the segment header and the segment's capacity, or
    /// the newest segment is a version 1 segment (rotate first): both are caller bugs that
    /// would break the format.
    pub fn write_at(&mut self, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        self.check_failure()?;
        let len: u64 = bufs.iter().map(|buf| buf.len() as u64).sum();
        assert!(
            self.header.layout == Layout::CURRENT,
            "{}: a version {} segment is never written; rotate first",
            self.path.display(),
            self.header.layout.version()
        );
        assert!(
            offset >= HEADER_BYTES as u64 && offset + len <= self.header.capacity,
            "{}: a write of {len} bytes at offset {offset} leaves the segment (capacity {})",
            self.path.display(),
            self.header.capacity
        );
        if len == 0 {
            return Ok(());
        }
        let result = self
            .file
            .write_all_vectored_at(bufs, offset)
            .map_err(|e| Error::io("write", &self.path, e));
        self.record(result)
    }

    /// Makes everything written to the newest segment durable (fdatasync).
    ///
    /// # Errors
    /// As [`SegmentWriter::write_at`]. A failed sync is never retried: the writer is poisoned.
    pub fn sync(&mut self) -> Result<()> {
        self.check_failure()?;
        let result = self
            .file
            .sync_data()
            .map_err(|e| Error::io("fdatasync", &self.path, e));
        self.record(result)
    }

    /// Seals the newest segment (fdatasync) and creates the next one, whose first LSN is
    /// `start`, durably (temporary name, preallocation, header, fdatasync, rename, directory
    /// fsync), and adds it to the [`SegmentSet`]. The new segment's data starts at offset 256.
    ///
    /// If `start` is the newest segment's own first LSN, that segment holds no record (a
    /// version 1 segment, or one too small for the next frame): the new segment replaces it
    /// under the same name, atomically.
    ///
    /// # Errors
    /// As [`SegmentWriter::write_at`]; a full device shows up here as [`Error::DiskFull`].
    ///
    /// # Panics
    /// If `start` is below the newest segment's first LSN.
    pub fn rotate(&mut self, start: Lsn) -> Result<()> {
        let replaces = start == self.header.start_lsn;
        self.rotate_to(SegmentHeader {
            layout: Layout::CURRENT,
            codec: self.header.codec,
            segment_seq: self.header.segment_seq + u64::from(!replaces),
            start_lsn: start,
            capacity: self.new_capacity,
            type_tag: self.header.type_tag.clone(),
        })
    }

    /// As [`SegmentWriter::rotate`], creating exactly `header`: a standby mirroring its
    /// primary byte for byte takes the primary's capacity and numbering
    /// ([`crate::mirror`], which checks that `header` continues this log).
    ///
    /// # Errors
    /// As [`SegmentWriter::rotate`].
    ///
    /// # Panics
    /// If `header` starts below the newest segment.
    pub fn rotate_to(&mut self, header: SegmentHeader) -> Result<()> {
        self.check_failure()?;
        assert!(
            header.start_lsn >= self.header.start_lsn,
            "segment starting at {} after one starting at {}",
            header.start_lsn,
            self.header.start_lsn
        );
        // Seal: a failed fdatasync stops the writer for good, like any other.
        let sealed = self
            .file
            .sync_data()
            .map_err(|e| Error::io("fdatasync", &self.path, e));
        self.record(sealed)?;
        // Create: nothing written is at stake any more. If the next segment cannot be made for
        // lack of space, the writer stays on its sealed segment and a later `rotate` tries
        // again with a new file; any other failure stops the writer as usual.
        match self.create_exact(header) {
            Err(error @ Error::DiskFull { .. }) => Err(error),
            result => self.record(result),
        }
    }

    fn create_exact(&mut self, header: SegmentHeader) -> Result<()> {
        let start = header.start_lsn;
        let replaces = start == self.header.start_lsn;
        let dir = self.segments.dir();
        self.file = create(self.storage.as_ref(), dir, &header)?;
        self.path = dir.join(segment_file_name(start));
        self.header = header;
        if !replaces {
            self.segments.push(SegmentFile {
                start,
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    fn check_failure(&self) -> Result<()> {
        match &self.failure {
            Some(cause) => Err(Error::Poisoned {
                cause: Arc::clone(cause),
            }),
            None => Ok(()),
        }
    }

    /// Keeps a copy of the first failure, and hands the caller the error itself.
    fn record(&mut self, result: Result<()>) -> Result<()> {
        let Err(error) = result else {
            return Ok(());
        };
        match error.duplicate_io() {
            Some(copy) => {
                self.failure = Some(Arc::new(copy));
                Err(error)
            }
            // Only I/O errors come from storage calls, but should another kind appear, the
            // caller still learns that the writer stopped.
            None => {
                let error = Arc::new(error);
                self.failure = Some(Arc::clone(&error));
                Err(Error::Poisoned { cause: error })
            }
        }
    }
}

/// Creates the segment described by `header` in `dir`, durably, and returns it open for writing.
pub(crate) fn create(
    storage: &dyn Storage,
    dir: &Path,
    header: &SegmentHeader,
) -> Result<Box<dyn StorageFile>> {
    let temp = dir.join(temp_file_name(header.start_lsn));
    let path = dir.join(segment_file_name(header.start_lsn));
    // A leftover from a crash during an earlier attempt is incomplete by definition.
    let _ = storage.remove(&temp);
    let file = storage
        .open(&temp, OpenMode::CreateNew)
        .map_err(|e| Error::io("create", &temp, e))?;
    let result = (|| {
        file.allocate(header.capacity)
            .map_err(|e| Error::io("preallocate", &temp, e))?;
        file.write_all_at(&header.encode(), 0)
            .map_err(|e| Error::io("write header of", &temp, e))?;
        file.sync_data()
            .map_err(|e| Error::io("fdatasync", &temp, e))?;
        storage
            .rename(&temp, &path)
            .map_err(|e| Error::io("rename", &temp, e))?;
        storage
            .sync_dir(dir)
            .map_err(|e| Error::io("fsync directory", dir, e))
    })();
    if let Err(error) = result {
        // Leave no half-made segment behind (best effort: the error we report is the first one).
        let _ = storage.remove(&temp);
        return Err(error);
    }
    Ok(file)
}
