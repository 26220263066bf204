//! A log's segment files without the group commit: [`LogFiles`] (what open recovered),
//! [`SegmentWriter`] (the newest segment, open for writing) and [`SegmentSet`] (every segment,
//! for readers and truncation).
//!
//! The embedded [`crate::Log`] is built on these, and so is the log daemon, whose pool frames
//! records itself (with [`stela_format::frame::encode_with_crc`]) and hands the bytes to a
//! flusher that writes them unchanged at their offset. Policy (when to write, when to sync, how
//! much to buffer, who waits) lives in the caller; this layer only keeps the files right.
//!
//! The writer lives in [`crate::writer`] (the durability-critical part) and the set of
//! segments in [`crate::segment_set`]; this module opens a log and hands out both.
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

use crate::error::Result;
use crate::options::{RecoveryMode, WalOptions};
use crate::recovery::{self, Expect, RecoveryReport};
pub use crate::segment_set::SegmentSet;
pub use crate::writer::SegmentWriter;
use std::path::Path;
use std::sync::Arc;

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
        let segments = Arc::new(SegmentSet::new(
            Arc::clone(&options.storage),
            dir.to_path_buf(),
            recovered.segments,
            max_record as u32,
            options.recovery == RecoveryMode::SkipCorrupt,
            recovered.lock,
        ));
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
