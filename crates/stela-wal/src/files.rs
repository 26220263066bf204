//! A log's segment files without the group commit: [`LogFiles`] (what open recovered),
//! [`SegmentWriter`] (the newest segment, open for writing) and [`SegmentSet`] (every segment,
//! for readers and truncation).
//!
//! The embedded [`crate::Log`] is built on these, and so is the log daemon, whose pool frames
//! records itself (with [`stela_format::frame::encode_with_crc`]) and hands the bytes to a
//! flusher that writes them unchanged at their offset. Policy (when to write, when to sync, how
//! much to buffer, who waits) lives in the caller; this layer only keeps the files right.
//!
//! Invariants:
//! - Only the newest segment is ever written, and only at offsets at or above its header and
//!   below its capacity, with version 2 frames. A version 1 newest segment (written by an older
//!   build) is never written: open reports it full, so the first frame starts a new segment.
//! - A segment is fdatasync'ed before its successor is created ([`SegmentWriter::rotate`]), so
//!   every segment but the newest is durable in full, and only the newest can end in a torn
//!   write.
//! - A new segment gets its name only once its header is durable: it is prepared under a
//!   temporary name, preallocated, synced, renamed, and the directory is synced (see
//!   [`crate::segment`]).
//! - After a failed write, sync or rotation the writer refuses every later call
//!   ([`Error::Poisoned`]): a failed fdatasync is never retried on the same file, because Linux
//!   may have dropped the dirty pages and a retry could report success for data that is gone.
//! - The directory lock is held as long as the [`SegmentSet`] lives (the writer holds the set
//!   too), so no other handle can open the log meanwhile.

use crate::error::{Error, Result};
use crate::options::{RecoveryMode, WalOptions};
use crate::reader::RawReader;
use crate::recovery::{self, Expect, RecoveryReport};
use crate::segment::{self, SegmentFile};
use crate::storage::{Storage, StorageFile};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use stela_format::frame::Layout;
use stela_format::header::HEADER_BYTES;
use stela_format::segment_name::segment_file_name;
use stela_format::{Codec, Lsn, SegmentHeader, TypeTag};

/// A log's segment files after recovery, without the embedded group commit.
///
/// ```
/// use stela_format::{frame, Lsn};
/// use stela_wal::files::LogFiles;
/// use stela_wal::WalOptions;
///
/// let dir = tempfile::tempdir()?;
/// let mut files = LogFiles::open(dir.path(), WalOptions::default(), "app::Record")?;
/// // Frame two records the way the daemon's pool does, then write and sync them.
/// let base = files.durable_offset as u32;
/// let mut bytes = Vec::new();
/// frame::encode(&mut bytes, files.next_lsn, b"one", base);
/// frame::encode(&mut bytes, files.next_lsn.next(), b"two", base);
/// files.writer.write_at(files.write_offset, &[&bytes])?;
/// files.writer.sync()?;
/// drop(files);
///
/// let files = LogFiles::open(dir.path(), WalOptions::default(), "app::Record")?;
/// assert_eq!(files.next_lsn, Lsn::new(3));
/// let records: Vec<_> = files.segments.reader(Lsn::FIRST, files.next_lsn).collect::<Result<_, _>>()?;
/// assert_eq!(records, vec![(Lsn::new(1), b"one".to_vec()), (Lsn::new(2), b"two".to_vec())]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct LogFiles {
    /// The newest segment, open for writing.
    pub writer: SegmentWriter,
    /// Every segment: readers, truncation, the first LSN.
    pub segments: Arc<SegmentSet>,
    /// The first LSN not in the files: the LSN the next record must have.
    pub next_lsn: Lsn,
    /// Where the next frame goes in the newest segment. Equal to its capacity when the next
    /// frame must start a new segment (a version 1 segment, or one left damaged by a
    /// `SkipCorrupt` open, which must not be appended to).
    pub write_offset: u64,
    /// Everything below this offset of the newest segment is durable. Open syncs the newest
    /// segment, so this equals `write_offset` after open: the sync base of the next frame.
    pub durable_offset: u64,
    /// What recovery found and did.
    pub report: RecoveryReport,
    codec: Codec,
    max_record: usize,
    segment_bytes: u64,
}

impl LogFiles {
    /// Opens (or creates) the log in `dir`, holding records of `type_tag` encoded with
    /// `options.codec`, and recovers it exactly as [`crate::Log::open`] does.
    ///
    /// # Errors
    /// As [`crate::Log::open`]: [`Error::WrongCodec`] / [`Error::WrongRecordType`],
    /// [`Error::Corruption`] in `Strict` mode, [`Error::Locked`], [`Error::SegmentTooLarge`],
    /// I/O errors naming the file.
    pub fn open(dir: &Path, options: WalOptions, type_tag: &str) -> Result<LogFiles> {
        LogFiles::open_inner(dir, &options, TypeTag::new(type_tag), false)
    }

    pub(crate) fn open_inner(
        dir: &Path,
        options: &WalOptions,
        type_tag: TypeTag,
        keep_removed_bytes: bool,
    ) -> Result<LogFiles> {
        let expect = Expect {
            codec: options.codec,
            type_tag,
        };
        let recovered = recovery::recover(dir, options, &expect, keep_removed_bytes)?;
        let max_record = options.effective_max_record();
        let segments = Arc::new(SegmentSet {
            storage: Arc::clone(&options.storage),
            dir: dir.to_path_buf(),
            list: Mutex::new(recovered.segments),
            max_payload: max_record as u32,
            skip_damage: options.recovery == RecoveryMode::SkipCorrupt,
            _lock: recovered.lock,
        });
        let writer = SegmentWriter {
            storage: Arc::clone(&options.storage),
            segments: Arc::clone(&segments),
            file: recovered.tail,
            path: dir.join(segment_file_name(recovered.tail_header.start_lsn)),
            header: recovered.tail_header,
            new_capacity: options.segment_bytes,
            failure: None,
        };
        Ok(LogFiles {
            writer,
            segments,
            next_lsn: recovered.next_lsn,
            write_offset: recovered.write_offset,
            // Recovery synced the newest segment before returning.
            durable_offset: recovered.write_offset,
            report: recovered.report,
            codec: options.codec,
            max_record,
            segment_bytes: options.segment_bytes,
        })
    }

    /// The codec the records are encoded with.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// The largest payload a record may have (the options' limit, cut to what fits a segment).
    pub fn max_record_bytes(&self) -> usize {
        self.max_record
    }

    /// The capacity new segments are created with.
    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }
}

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
        self.check_failure()?;
        assert!(
            start >= self.header.start_lsn,
            "segment starting at {start} after one starting at {}",
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
        match self.create_next(start) {
            Err(error @ Error::DiskFull { .. }) => Err(error),
            result => self.record(result),
        }
    }

    fn create_next(&mut self, start: Lsn) -> Result<()> {
        let replaces = start == self.header.start_lsn;
        let header = SegmentHeader {
            layout: Layout::CURRENT,
            codec: self.header.codec,
            segment_seq: self.header.segment_seq + u64::from(!replaces),
            start_lsn: start,
            capacity: self.new_capacity,
            type_tag: self.header.type_tag.clone(),
        };
        let dir = self.segments.dir();
        self.file = segment::create(self.storage.as_ref(), dir, &header)?;
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

/// Every segment of a log, oldest first. Shared by the writer (which adds segments), readers
/// and truncation; holds the directory lock.
pub struct SegmentSet {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    list: Mutex<Vec<SegmentFile>>,
    max_payload: u32,
    skip_damage: bool,
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

    fn push(&self, segment: SegmentFile) {
        self.lock().push(segment);
    }
}
