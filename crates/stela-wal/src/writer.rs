//! [`SegmentWriter`]: the newest segment of a log, open for writing: positioned writes of
//! framed bytes, fdatasync, and rotation to a new segment. The embedded [`crate::Log`] writes
//! through it, and so do the log daemon's flushers.
//!
//! Invariants (see also [`crate::files`]):
//! - A file named `<lsn>.wal` always has a complete, synced header: a segment is prepared under
//!   a temporary name (allocated to full size, header written, fdatasync'ed) and only then
//!   renamed into place, and the directory is fsync'ed before any record is written into it.
//! - Segments are preallocated to their full capacity, so writing records never grows the file
//!   (a full disk shows up when a segment is created, not in the middle of a commit), and
//!   unwritten space reads as zeros.
//! - Zeros are written ahead of the data (`WalOptions::zero_ahead_bytes`), so that a commit's
//!   fdatasync rarely finds unwritten extents to convert (see [`SegmentWriter::zero_ahead`]).
//!   They go only above the highest byte this writer has written, above the highest byte
//!   written through its [`WrittenAhead`] (the daemon's primary copy of `replicated` records,
//!   which writes the same framed bytes ahead of the flushers), and below the capacity: they
//!   never overwrite a record, and unwritten space reads as the same zeros, so recovery and the
//!   format cannot tell whether they were written.
//! - Only the newest segment is written, only between its header and its capacity.
//! - A segment is fdatasync'ed before its successor is created, so only the newest segment can
//!   end in a torn write.
//! - After every fdatasync that returns, the synced end of the newest segment (the end of the
//!   data written contiguously from the recovered end) is published to the log's
//!   [`SyncedMark`]; nothing is published before the call returns, so the mark never claims a
//!   byte a power cut could still tear.
//! - After a failed write or sync the writer refuses every later call ([`Error::Poisoned`]): a
//!   failed fdatasync is never retried on the same file. A next segment that cannot be created
//!   for lack of space is the one failure that does not stop it: nothing written is at stake,
//!   and a later rotation tries again with a new file.

use crate::error::{Error, Result};
use crate::segment::SegmentFile;
use crate::segment_set::SegmentSet;
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::synced::SyncedMark;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
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
    /// `WalOptions::zero_ahead_bytes`.
    zero_ahead: u64,
    /// In the newest segment: the end of the highest write of data by this writer, and the
    /// end of the zeros written ahead of it (0 for none yet).
    written_to: u64,
    zeroed_to: u64,
    /// In the newest segment: the end of the data written without a hole from where recovery
    /// left it (or from the header of a segment this writer created). What a sync makes
    /// durable below this is what the mark may claim.
    contiguous_to: u64,
    /// The log's synced-end mark (see [`crate::synced`]).
    mark: Arc<SyncedMark>,
    /// The first failure; every later call is refused with it.
    failure: Option<Arc<Error>>,
    /// Bytes another writer put ahead of this one's data: zeros go above them.
    ahead: Arc<WrittenAhead>,
}

/// Writes into the newest segment made ahead of its [`SegmentWriter`] by someone else (the
/// daemon writes the framed bytes of a `replicated` record before the flusher writes them
/// again with their sync, `stela-server/src/engine/local_copy.rs`), and how far they reach: the
/// writer's zeros ahead of its data start above them. Both take one lock, so zeros are never
/// written over such bytes, whichever comes first. (Without it, the writer's zeros ahead wiped
/// records written ahead of it, and a daemon killed before the flusher wrote them again came
/// back without them: `stela-bench failover --nodes 3`, pause-new, 2026-12-07.)
#[derive(Debug, Default)]
pub struct WrittenAhead {
    /// The segment written into (its first LSN) and the end of the highest write in it.
    reach: Mutex<(u64, u64)>,
}

impl WrittenAhead {
    /// Runs `write`, which writes `[offset, end)` of the segment that starts at `segment`,
    /// under the lock the writer's zeros take, and records how far it reached.
    ///
    /// # Errors
    /// `write`'s.
    pub fn write(
        &self,
        segment: u64,
        end: u64,
        write: impl FnOnce() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut reach = self.reach.lock().unwrap_or_else(|e| e.into_inner());
        write()?;
        if reach.0 != segment {
            *reach = (segment, 0);
        }
        reach.1 = reach.1.max(end);
        Ok(())
    }
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
    /// The writer of `file`, the newest segment at `path`, as recovery left it: its data ends
    /// at `data_end`, synced.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        segments: Arc<SegmentSet>,
        file: Box<dyn StorageFile>,
        path: PathBuf,
        header: SegmentHeader,
        new_capacity: u64,
        zero_ahead: u64,
        data_end: u64,
        mark: Arc<SyncedMark>,
    ) -> SegmentWriter {
        SegmentWriter {
            contiguous_to: data_end,
            mark,
            storage,
            segments,
            file,
            path,
            header,
            new_capacity,
            zero_ahead,
            written_to: 0,
            zeroed_to: 0,
            failure: None,
            ahead: Arc::default(),
        }
    }

    /// Where writes ahead of this writer go through (see [`WrittenAhead`]).
    pub fn written_ahead(&self) -> Arc<WrittenAhead> {
        Arc::clone(&self.ahead)
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

    /// The log's synced-end mark: [`SyncedMark::request`] it when the log goes idle after a
    /// sync, so that the last sync is recorded too (see [`crate::synced`]).
    pub fn synced_mark(&self) -> &Arc<SyncedMark> {
        &self.mark
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
        self.record(result)?;
        self.written_to = self.written_to.max(offset + len);
        if offset <= self.contiguous_to {
            self.contiguous_to = self.contiguous_to.max(offset + len);
        }
        let result = self.zero_ahead();
        self.record(result)
    }

    /// Writes zeros ahead of the data once the data comes within half of `zero_ahead` of the
    /// last zeros, up to `zero_ahead` past the data (or the capacity); the caller's next sync
    /// makes them durable with its data, and later fdatasyncs find the blocks written (the
    /// saving PostgreSQL gets from filling its WAL segments with zeros, `wal_init_zero`;
    /// figures in `bench/results/commit-changes.txt`). A failure is a failed write like any
    /// other: the writer stops.
    fn zero_ahead(&mut self) -> Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        if self.written_to + self.zero_ahead / 2 < self.zeroed_to {
            return Ok(());
        }
        // Never below `zeroed_to`: that only grows, with `written_to`. Nor below what was
        // written ahead of this writer in this segment: the lock is held until the zeros are
        // written, so no such write lands under them meanwhile.
        let reach = self.ahead.reach.lock().unwrap_or_else(|e| e.into_inner());
        let ahead_to = if reach.0 == self.header.start_lsn.get() {
            reach.1
        } else {
            0
        };
        let to = (self.written_to + self.zero_ahead).min(self.header.capacity);
        let mut at = self.zeroed_to.max(self.written_to).max(ahead_to);
        while at < to {
            let n = (to - at).min(ZEROS.len() as u64);
            self.file
                .write_all_at(&ZEROS[..n as usize], at)
                .map_err(|e| Error::io("write zeros ahead in", &self.path, e))?;
            at += n;
        }
        drop(reach);
        self.zeroed_to = self.zeroed_to.max(to);
        Ok(())
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
        self.record(result)?;
        self.mark.publish(self.header.start_lsn, self.contiguous_to);
        Ok(())
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
        (self.written_to, self.zeroed_to) = (0, 0);
        self.contiguous_to = HEADER_BYTES as u64;
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

impl Drop for SegmentWriter {
    fn drop(&mut self) {
        // No mark may land after the log is closed (or crashed, in a test): a log reopened at
        // once must not see an old write arrive late.
        self.mark.close();
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

#[cfg(test)]
// The expected values are lists of written byte ranges, often of one range.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use crate::files::LogFiles;
    use crate::options::WalOptions;
    use crate::storage::{Call, FaultStorage, Hooked, Hooks};
    use std::io;
    use std::ops::Range;
    use std::sync::Mutex;

    /// Records the range of every write.
    #[derive(Debug, Default)]
    struct SegmentWrites(Mutex<Vec<Range<u64>>>);

    impl Hooks for SegmentWrites {
        fn after(&self, call: &Call<'_>, outcome: std::result::Result<(), &io::Error>) {
            // Only the segment is written while a test looks (its file may still carry the
            // temporary name it was created under).
            if let (Call::Write { offset, len, .. }, Ok(())) = (call, outcome) {
                self.0.lock().unwrap().push(*offset..offset + len);
            }
        }
    }

    const CAPACITY: u64 = 4 << 20;
    const AHEAD: u64 = 1 << 20;

    /// The writes a sequence of data writes (offset, length) caused, and the segment's bytes.
    /// Bytes written ahead of the writer through its [`WrittenAhead`] (as the daemon's primary
    /// copy does) are never wiped by the zeros the writer writes ahead of its own data.
    #[test]
    fn zeros_never_go_over_bytes_written_ahead_of_the_writer() {
        let fault = FaultStorage::new();
        let options = WalOptions::default()
            .storage(Arc::new(fault.clone()))
            .segment_bytes(CAPACITY)
            .zero_ahead_bytes(1 << 20);
        let mut files = LogFiles::open(Path::new("/log"), options, "t").unwrap();
        let start = HEADER_BYTES as u64;
        let segment = files.writer.segment_start().get();
        // The writer's first write zeroes the next MiB; bytes then written ahead, past it.
        files.writer.write_at(start, &[&[7u8; 100]]).unwrap();
        let ahead = files.writer.written_ahead();
        let ahead_at = start + 100;
        let ahead_end = ahead_at + (1536 << 10);
        let (path, storage) = (files.writer.path().to_path_buf(), fault.clone());
        ahead
            .write(segment, ahead_end, || {
                let file = storage.open(&path, OpenMode::ReadWrite)?;
                file.write_all_at(&vec![9u8; (ahead_end - ahead_at) as usize], ahead_at)
            })
            .unwrap();
        // The writer's next write comes within half a MiB of its zeros: it zeroes ahead again,
        // which on its own would start at its data's end, over the bytes written ahead.
        files
            .writer
            .write_at(ahead_at, &[&[9u8; 600 << 10]])
            .unwrap();
        files.writer.sync().unwrap();
        let bytes = fault.read_file(files.writer.path()).unwrap();
        assert!(
            bytes[ahead_at as usize..ahead_end as usize]
                .iter()
                .all(|&b| b == 9),
            "zeros were written over bytes written ahead of the writer"
        );
    }

    fn run(zero_ahead: u64, data: &[(u64, u64)]) -> (Vec<Vec<Range<u64>>>, Vec<u8>) {
        let fault = FaultStorage::new();
        let hooked = Hooked::wrap(Arc::new(fault.clone()), SegmentWrites::default());
        let options = WalOptions::default()
            .storage(Arc::new(hooked.clone()))
            .segment_bytes(CAPACITY)
            .zero_ahead_bytes(zero_ahead);
        let mut files = LogFiles::open(Path::new("/log"), options, "t").unwrap();
        let mut caused = Vec::new();
        for &(offset, len) in data {
            hooked.hooks().0.lock().unwrap().clear();
            files
                .writer
                .write_at(offset, &[&vec![7; len as usize]])
                .unwrap();
            caused.push(hooked.hooks().0.lock().unwrap().clone());
        }
        files.writer.sync().unwrap();
        let bytes = fault.read_file(files.writer.path()).unwrap();
        (caused, bytes)
    }

    /// Zeros go ahead of the data in bulk, only above every byte written and below the
    /// capacity, and never change a byte of data, whatever order the data comes in.
    #[test]
    fn zeros_are_written_ahead_of_the_data_and_never_over_it() {
        let start = HEADER_BYTES as u64;
        let data = [
            (start, 1000),                     // first write: zeros for the next MiB
            (start + 1000, 1000),              // well within them: nothing more
            (start + 2000, 600 << 10),         // past half of them: topped up
            (3 << 20, 100), // ahead of the rest (a flusher may write out of order)
            (start + 2000 + (600 << 10), 100), // a hole below the highest write filled
            (CAPACITY - 500, 500), // the end: zeros stop at the capacity
        ];
        let (caused, bytes) = run(AHEAD, &data);
        let mut highest = 0;
        for (&(offset, len), writes) in data.iter().zip(&caused) {
            assert_eq!(
                writes[0],
                offset..offset + len,
                "the data write comes first"
            );
            highest = u64::max(highest, offset + len);
            for zeros in &writes[1..] {
                assert!(
                    zeros.start >= highest && zeros.end <= CAPACITY,
                    "zeros at {zeros:?} after data up to {highest}"
                );
            }
        }
        // The zeros each data write caused, adjacent writes merged.
        let zeros = |i: usize| -> Vec<Range<u64>> {
            caused[i][1..].iter().fold(Vec::new(), |mut merged, r| {
                match merged.last_mut() {
                    Some(last) if last.end == r.start => last.end = r.end,
                    _ => merged.push(r.clone()),
                }
                merged
            })
        };
        assert_eq!(zeros(0), [start + 1000..start + 1000 + AHEAD]);
        assert_eq!(zeros(1), []);
        let end = start + 2000 + (600 << 10);
        assert_eq!(zeros(2), [start + 1000 + AHEAD..end + AHEAD]);
        // From the highest byte written, and only up to the capacity.
        assert_eq!(zeros(3), [(3 << 20) + 100..CAPACITY]);
        assert_eq!(zeros(4), []);
        assert_eq!(zeros(5), []);
        // Every byte is the data where data was written, zero elsewhere.
        for (at, byte) in bytes.iter().enumerate().skip(HEADER_BYTES) {
            let at = at as u64;
            let in_data = data.iter().any(|&(o, l)| (o..o + l).contains(&at));
            assert_eq!(*byte, if in_data { 7 } else { 0 }, "byte at {at}");
        }
    }

    /// `zero_ahead_bytes(0)` writes nothing but the data.
    #[test]
    fn no_zeros_are_written_when_turned_off() {
        let start = HEADER_BYTES as u64;
        let (caused, _) = run(0, &[(start, 1000), (start + 1000, 700 << 10)]);
        assert_eq!(
            caused,
            [
                vec![start..start + 1000],
                vec![start + 1000..start + 1000 + (700 << 10)]
            ]
        );
    }
}
