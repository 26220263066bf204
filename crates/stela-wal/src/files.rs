//! A log's segment files without the group commit: [`LogFiles`] (what open recovered),
//! [`SegmentWriter`] (the newest segment, open for writing) and [`SegmentSet`] (every segment,
//! for readers and truncation).
//!
//! The embedded [`crate::Log`] is built on these, and so is the log daemon, whose pool frames
//! records itself (with [`stela_format::frame::encode_with_crc`]) and hands the bytes to a
//! flusher that writes them unchanged at their offset. Policy (when to write, when to sync, how
//! much to buffer, who waits) lives in the caller; this layer only keeps the files right.
//!
//! The writer lives in [`crate::writer`] (the durability-critical part); this module opens
//! and lists.
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
use crate::reader::{RawReader, ReadPoint};
use crate::recovery::{self, Expect, RecoveryReport};
use crate::segment::SegmentFile;
use crate::storage::Storage;
pub use crate::writer::SegmentWriter;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use stela_format::segment_name::segment_file_name;
use stela_format::{Codec, Lsn, TypeTag};

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
            read_point: Mutex::new(None),
            _lock: recovered.lock,
        });
        let writer = SegmentWriter::new(
            Arc::clone(&options.storage),
            Arc::clone(&segments),
            recovered.tail,
            dir.join(segment_file_name(recovered.tail_header.start_lsn)),
            recovered.tail_header,
            options.segment_bytes,
            options.zero_ahead_bytes,
            recovered.data_end,
            recovered.mark,
        );
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
        self.lock().push(segment);
    }
}
