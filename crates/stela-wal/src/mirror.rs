//! Mirroring a log byte for byte: the standby's end of log shipping and the primary's reader of
//! what it must ship, so that both nodes hold identical segment files.
//!
//! A log is shipped as [`Chunk`]s: a stretch of one segment's bytes at an offset, exactly as the
//! primary wrote (or will write) them. A chunk at offset 0 starts with a segment header (the
//! primary's, capacity and numbering included); any other chunk holds whole frames that continue
//! the mirror where it stands. [`Mirror::apply`] checks a chunk completely before it writes a byte
//! of it; [`read_chunk`] cuts the next chunk out of the primary's files (catch-up, when the bytes
//! are no longer in the primary's memory).
//!
//! Invariants:
//! - **Nothing unchecked is written.** A chunk that does not continue the mirror exactly (wrong
//!   segment, wrong offset, a frame that fails its checksum, an LSN out of sequence, a header of
//!   another codec, record type or numbering, bytes beyond the segment's capacity) is refused
//!   with [`MirrorError::Refused`] and changes nothing: a lying or confused peer cannot damage
//!   the mirror, and the mirror stays usable.
//! - **Recovery reads the mirror as it reads the primary.** Before writing a frame whose sync
//!   base (the offset below which the *primary* had synced when it framed it) lies beyond what
//!   the mirror has synced, the mirror syncs what it has written, so a torn write on the standby
//!   is recognised exactly as on the primary (`docs/FORMAT.md`, torn last write).
//! - **The standby keeps its own synced-end mark** (`SYNCED`, never shipped): its writer
//!   publishes after its own syncs, so damage to what it synced is never cut as a torn write.
//! - **Segments are created whole and sealed in order** through [`SegmentWriter::rotate_to`]:
//!   the previous segment is synced before the next exists.
//! - **Fail stop.** A failed write or sync poisons the writer; every later call fails with it.

use crate::error::{Error, Result};
use crate::files::{LogFiles, SegmentSet};
use crate::options::WalOptions;
use crate::storage::OpenMode;
use crate::writer::SegmentWriter;
use std::path::Path;
use std::sync::Arc;
use stela_format::frame::{self, Decoded, Layout};
use stela_format::header::HEADER_BYTES;
use stela_format::{Lsn, SegmentHeader};

/// A stretch of one segment's bytes, as the primary has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// First LSN of the segment the bytes belong to.
    pub segment_start: Lsn,
    /// Offset of `bytes[0]` in that segment; 0 when the chunk starts with the segment header.
    pub offset: u64,
    pub bytes: &'a [u8],
}

/// Where a mirror stands: the next chunk must start here (or at offset 0 of the segment
/// starting at `next_lsn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub segment_start: Lsn,
    /// Where the next frame goes in that segment.
    pub offset: u64,
    /// The LSN the next record must have.
    pub next_lsn: Lsn,
}

/// Why a chunk was not mirrored.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The chunk does not continue the mirror; nothing was written.
    #[error("chunk refused, nothing written: {0}")]
    Refused(String),
    /// Writing or syncing failed: the mirror is stopped (see [`Error::Poisoned`]).
    #[error(transparent)]
    Wal(#[from] Error),
}

/// A log being filled with another log's bytes. See the module documentation.
#[derive(Debug)]
pub struct Mirror {
    writer: SegmentWriter,
    /// Where the mirror stands, and its newest segment's header (as the writer's).
    checker: Checker,
    segments: Arc<SegmentSet>,
    /// Everything below this offset of the newest segment is synced.
    synced_offset: u64,
    /// Every record up to here is synced.
    durable_lsn: Lsn,
}

/// The checks of [`Mirror::apply`] without the writing: where a copy stands and whether a chunk
/// continues it. A standby that takes chunks into memory before writing them checks each with
/// its own `Checker` (taken from the mirror with [`Mirror::checker`]) as it arrives.
#[derive(Debug, Clone)]
pub struct Checker {
    position: Position,
    header: SegmentHeader,
    max_payload: u32,
}

/// A chunk that passed [`Checker`]: the header it starts (if any), where its frames start, and
/// each frame's length and sync base.
struct Checked {
    header: Option<SegmentHeader>,
    frames_at: u64,
    frames: Vec<(usize, u32)>,
}

impl Mirror {
    /// Opens (or creates) the log in `dir` to mirror into, recovering it as
    /// [`crate::Log::open`] would; it continues from where its files end.
    ///
    /// # Errors
    /// As [`LogFiles::open`].
    pub fn open(dir: &Path, options: WalOptions, type_tag: &str) -> Result<Mirror> {
        Mirror::from_files(LogFiles::open(dir, options, type_tag)?)
    }

    /// A mirror continuing `files`.
    ///
    /// # Errors
    /// Reading the newest segment's header failed.
    pub fn from_files(files: LogFiles) -> Result<Mirror> {
        let path = files.writer.path();
        let mut bytes = [0u8; HEADER_BYTES];
        files
            .segments
            .storage
            .open(path, OpenMode::Read)
            .and_then(|file| file.read_exact_at(&mut bytes, 0))
            .map_err(|e| Error::io("read header of", path, e))?;
        let header = SegmentHeader::decode(&bytes).map_err(|reason| Error::BadHeader {
            segment: path.to_path_buf(),
            reason,
        })?;
        let max_payload = files.max_record_bytes() as u32;
        let position = Position {
            segment_start: files.writer.segment_start(),
            offset: files.write_offset,
            next_lsn: files.next_lsn,
        };
        Ok(Mirror {
            writer: files.writer,
            checker: Checker {
                position,
                header,
                max_payload,
            },
            segments: files.segments,
            synced_offset: files.durable_offset,
            durable_lsn: Lsn::new(files.next_lsn.get() - 1),
        })
    }

    /// Where the next chunk must start.
    pub fn position(&self) -> Position {
        self.checker.position
    }

    /// A copy of the mirror's checks, for chunks taken before they are applied.
    pub fn checker(&self) -> Checker {
        self.checker.clone()
    }

    /// The last LSN written (not necessarily synced); 0 for an empty log.
    pub fn received_lsn(&self) -> u64 {
        self.checker.position.next_lsn.get() - 1
    }

    /// The last LSN synced; 0 for an empty log.
    pub fn durable_lsn(&self) -> u64 {
        self.durable_lsn.get()
    }

    /// The log's segments (for readers).
    pub fn segments(&self) -> &Arc<SegmentSet> {
        &self.segments
    }

    /// Checks `chunk` and writes it; returns the last LSN now written. Not durable until
    /// [`Mirror::sync`].
    ///
    /// # Errors
    /// [`MirrorError::Refused`] if the chunk does not continue the mirror (nothing written);
    /// [`MirrorError::Wal`] if a write or sync failed (the mirror is stopped).
    pub fn apply(&mut self, chunk: Chunk<'_>) -> std::result::Result<u64, MirrorError> {
        let Checked {
            header,
            frames_at,
            frames,
        } = self.checker.examine(chunk)?;
        if let Some(header) = header {
            // The same header again (an empty segment shipped whole): nothing to replace.
            if header.encode() != self.checker.header.encode() {
                self.writer.rotate_to(header.clone())?;
                self.checker.header = header;
            }
            self.checker.position.segment_start = chunk.segment_start;
            self.checker.position.offset = HEADER_BYTES as u64;
            self.synced_offset = HEADER_BYTES as u64;
            // Rotation synced everything before the new segment.
            self.durable_lsn = Lsn::new(self.checker.position.next_lsn.get() - 1);
        }
        debug_assert_eq!(frames_at, self.checker.position.offset);
        // Write in stretches; before a frame whose sync base the mirror has not reached, sync
        // what is written (module invariant: torn writes look the same on both nodes).
        let body = &chunk.bytes[(frames_at - chunk.offset) as usize..];
        let mut stretch_start = 0usize;
        let mut at = 0usize;
        for &(len, sync_base) in &frames {
            let frame_offset = frames_at + at as u64;
            if u64::from(sync_base) > self.synced_offset {
                if at > stretch_start {
                    self.writer.write_at(
                        frames_at + stretch_start as u64,
                        &[&body[stretch_start..at]],
                    )?;
                }
                self.writer.sync()?;
                self.synced_offset = frame_offset;
                self.durable_lsn = Lsn::new(
                    self.checker.position.next_lsn.get() - 1 + count_frames_before(&frames, at),
                );
                stretch_start = at;
            }
            at += len;
        }
        if at > stretch_start {
            self.writer.write_at(
                frames_at + stretch_start as u64,
                &[&body[stretch_start..at]],
            )?;
        }
        self.checker.position.offset = frames_at + at as u64;
        self.checker.position.next_lsn =
            Lsn::new(self.checker.position.next_lsn.get() + frames.len() as u64);
        Ok(self.received_lsn())
    }

    /// Makes everything written durable; returns the last LSN synced.
    ///
    /// # Errors
    /// The failed sync (the mirror is stopped).
    pub fn sync(&mut self) -> Result<u64> {
        self.writer.sync()?;
        // The standby records its own synced end, as a primary does (`crate::synced`): the
        // keeper thread writes it, coalescing requests, off the replication path.
        self.writer.synced_mark().request();
        self.synced_offset = self.checker.position.offset;
        self.durable_lsn = Lsn::new(self.checker.position.next_lsn.get() - 1);
        Ok(self.durable_lsn())
    }
}

impl Checker {
    /// Where the copy stands once every chunk checked so far is written.
    pub fn position(&self) -> Position {
        self.position
    }

    /// Checks that `chunk` continues the copy and, if it does, moves past it; returns the LSN
    /// after its last record.
    ///
    /// # Errors
    /// [`MirrorError::Refused`], as [`Mirror::apply`] would refuse it.
    pub fn check(&mut self, chunk: Chunk<'_>) -> std::result::Result<u64, MirrorError> {
        let checked = self.examine(chunk)?;
        if let Some(header) = checked.header {
            self.header = header;
            self.position.segment_start = chunk.segment_start;
        }
        let body: usize = checked.frames.iter().map(|&(len, _)| len).sum();
        self.position.offset = checked.frames_at + body as u64;
        self.position.next_lsn =
            Lsn::new(self.position.next_lsn.get() + checked.frames.len() as u64);
        Ok(self.position.next_lsn.get())
    }

    /// Checks a chunk without writing: the header it starts (if any), the offset its frames
    /// start at, and each frame's length and sync base.
    fn examine(&self, chunk: Chunk<'_>) -> std::result::Result<Checked, MirrorError> {
        let (header, frames_at, capacity) = if chunk.offset == 0 {
            let header = self.new_segment(chunk)?;
            let capacity = header.capacity;
            (Some(header), HEADER_BYTES as u64, capacity)
        } else {
            let here = self.position;
            if chunk.segment_start != here.segment_start || chunk.offset != here.offset {
                return Err(MirrorError::Refused(format!(
                    "bytes for segment {} at offset {}; the mirror continues segment {} at offset {}",
                    chunk.segment_start, chunk.offset, here.segment_start, here.offset
                )));
            }
            (None, chunk.offset, self.header.capacity)
        };
        let body = &chunk.bytes[(frames_at - chunk.offset) as usize..];
        if frames_at + body.len() as u64 > capacity {
            return Err(MirrorError::Refused(format!(
                "{} bytes at offset {frames_at} go beyond the segment's capacity {capacity}",
                body.len()
            )));
        }
        let frames = self.frames(body, frames_at)?;
        Ok(Checked {
            header,
            frames_at,
            frames,
        })
    }

    /// The header a chunk at offset 0 starts with, if it begins the segment that comes next:
    /// of this log, at the mirror's next LSN, numbered next (or replacing an empty segment that
    /// starts there), with a plausible capacity.
    fn new_segment(&self, chunk: Chunk<'_>) -> std::result::Result<SegmentHeader, MirrorError> {
        let refuse = |why: String| Err(MirrorError::Refused(why));
        let (here, current) = (self.position, &self.header);
        if chunk.bytes.len() < HEADER_BYTES {
            return refuse(format!(
                "a chunk at offset 0 must start with the {HEADER_BYTES}-byte segment header; it has {} bytes",
                chunk.bytes.len()
            ));
        }
        let header = match SegmentHeader::decode(&chunk.bytes[..HEADER_BYTES]) {
            Ok(header) => header,
            Err(error) => return refuse(format!("bad segment header: {error}")),
        };
        if header.start_lsn != chunk.segment_start || header.start_lsn != here.next_lsn {
            return refuse(format!(
                "a segment starting at LSN {} (chunk says {}); the mirror's next LSN is {}",
                header.start_lsn, chunk.segment_start, here.next_lsn
            ));
        }
        if let Err(why) = of_this_log(&header, current) {
            return refuse(why.to_string());
        }
        let replaces = header.start_lsn == current.start_lsn;
        let expected_seq = current.segment_seq + u64::from(!replaces);
        if header.segment_seq != expected_seq {
            return refuse(format!(
                "segment number {} where {} comes next",
                header.segment_seq, expected_seq
            ));
        }
        if replaces && here.offset != HEADER_BYTES as u64 {
            return refuse(format!(
                "a new segment starting at LSN {} would replace one that holds records",
                header.start_lsn
            ));
        }
        if header.capacity < HEADER_BYTES as u64 || header.capacity > u64::from(u32::MAX) {
            return refuse(format!("implausible segment capacity {}", header.capacity));
        }
        Ok(header)
    }

    /// Each frame of a chunk's `body` (which starts at segment offset `frames_at`): its length
    /// and sync base. Every frame must be whole, the record the mirror expects next, and claim
    /// no sync beyond its own offset.
    fn frames(
        &self,
        body: &[u8],
        frames_at: u64,
    ) -> std::result::Result<Vec<(usize, u32)>, MirrorError> {
        let refuse = |why: String| Err(MirrorError::Refused(why));
        let mut frames = Vec::new();
        let mut at = 0usize;
        let mut lsn = self.position.next_lsn.get();
        while at < body.len() {
            let offset = frames_at + at as u64;
            match frame::decode_with_limit(Layout::CURRENT, &body[at..], self.max_payload) {
                Decoded::Record(record) => {
                    if record.lsn.get() != lsn {
                        return refuse(format!(
                            "record {} at offset {offset} where record {lsn} comes next",
                            record.lsn
                        ));
                    }
                    let sync_base = record.sync_base.unwrap_or(HEADER_BYTES as u32);
                    if u64::from(sync_base) > offset {
                        return refuse(format!(
                            "record {lsn} claims its segment was synced up to {sync_base}, beyond its own offset {offset}"
                        ));
                    }
                    frames.push((record.frame_len(), sync_base));
                    at += record.frame_len();
                    lsn += 1;
                }
                Decoded::Unwritten => {
                    return refuse(format!("blank bytes at offset {offset} inside a chunk"))
                }
                Decoded::Incomplete { .. } => {
                    return refuse(format!("the chunk ends inside a record at offset {offset}"))
                }
                Decoded::Rejected(why) => return refuse(format!("at offset {offset}: {why}")),
            }
        }
        Ok(frames)
    }
}

/// How many of `frames` start before byte `at` of the chunk body.
fn count_frames_before(frames: &[(usize, u32)], at: usize) -> u64 {
    let mut seen = 0usize;
    frames
        .iter()
        .take_while(|(len, _)| {
            let before = seen < at;
            seen += len;
            before
        })
        .count() as u64
}

/// A chunk read for shipping: its segment's first LSN, its offset, its bytes, and the LSN after
/// the last record in it.
pub type Shipped = (Lsn, u64, Vec<u8>, Lsn);

/// Begins the copy in `dir` again with an empty segment of exactly `header`: the primary's
/// oldest segment, when this copy ends before it (the primary truncated the records between,
/// so nothing can continue this copy). Every record the copy holds is below `header`'s first
/// LSN, and so one the primary held and truncated; they are removed, as truncation removes them
/// (a caller that must keep them copies them first). Returns how many segments were removed.
///
/// Each step leaves a log that opens: the old segments are removed oldest first (a shorter log
/// each time; once all are gone, an empty directory, which opens as a new log), and only then
/// is the new segment created, durably.
///
/// # Errors
/// [`MirrorError::Refused`] (nothing changed) if `header` is not of the shipped layout and of
/// this log's codec and record type, or does not begin after everything the copy holds and
/// past its newest segment's start; [`MirrorError::Wal`] for a failure to open, remove or create.
pub fn restart_at(
    dir: &Path,
    options: WalOptions,
    type_tag: &str,
    header: &SegmentHeader,
) -> std::result::Result<usize, MirrorError> {
    let mirror = Mirror::open(dir, options, type_tag)?;
    of_this_log(header, &mirror.checker.header)
        .map_err(|why| MirrorError::Refused(why.to_string()))?;
    let next_lsn = mirror.position().next_lsn;
    let segments = mirror.segments.list();
    let newest = segments.last().map_or(Lsn::FIRST, |s| s.start);
    if header.start_lsn < next_lsn || header.start_lsn <= newest {
        return Err(MirrorError::Refused(format!(
            "a copy that ends before LSN {next_lsn} and whose newest segment starts at {newest} \
             cannot begin again at LSN {}",
            header.start_lsn
        )));
    }
    let storage = &mirror.segments.storage;
    SegmentSet::remove_one_by_one(storage.as_ref(), dir, &segments)?;
    crate::writer::create(storage.as_ref(), dir, header)?;
    Ok(segments.len())
}

/// Whether a copy whose newest segment has `current` for its header can take a segment of
/// `header`: the layout that is shipped, and the same codec and record type; why not otherwise.
fn of_this_log(
    header: &SegmentHeader,
    current: &SegmentHeader,
) -> std::result::Result<(), ForeignSegment> {
    if header.layout != Layout::CURRENT {
        return Err(ForeignSegment::Layout {
            version: header.layout.version(),
            shipped: Layout::CURRENT.version(),
        });
    }
    if header.codec != current.codec || !header.type_tag.same_as(&current.type_tag) {
        return Err(ForeignSegment::Records {
            shown: header.type_tag.shown.clone(),
            codec: header.codec,
            ours: current.type_tag.shown.clone(),
            our_codec: current.codec,
        });
    }
    Ok(())
}

/// Why a segment cannot join a copy: another layout, or another log's records.
#[derive(Debug, thiserror::Error)]
enum ForeignSegment {
    #[error("a version {version} segment; only version {shipped} is shipped")]
    Layout { version: u16, shipped: u16 },
    #[error(
        "a segment of {shown} records in {codec}; this log holds {ours} records in {our_codec}"
    )]
    Records {
        shown: String,
        codec: stela_format::Codec,
        ours: String,
        our_codec: stela_format::Codec,
    },
}

/// The next chunk to ship to a mirror standing at `from`, read from the primary's files: whole
/// frames of the segment `from` names, from its offset on, at most `max_bytes` of them (at least
/// one frame), and only records below `end` (the first LSN the primary has not made durable:
/// bytes not yet synced may still change on the primary's disk and are shipped from its memory
/// instead). Returns the segment, the offset, the bytes and the LSN after the last record in
/// them. When `from` is at the end of its segment and the next segment exists, the chunk is
/// that segment's header and first frames. `None`: nothing to ship below `end`.
///
/// # Errors
/// An I/O error reading the segment, or [`Error::NotALog`]-style refusal when `from` is not a
/// position in these files (a frame that does not check out where one should be).
pub fn read_chunk(
    segments: &SegmentSet,
    from: Position,
    end: Lsn,
    max_bytes: usize,
) -> Result<Option<Shipped>> {
    if from.next_lsn >= end {
        return Ok(None);
    }
    let list = segments.list();
    let Some(index) = list.iter().position(|s| s.start == from.segment_start) else {
        return Err(Error::Truncated {
            lsn: from.next_lsn,
            first: list.first().map_or(Lsn::FIRST, |s| s.start),
        });
    };
    let storage = &segments.storage;
    let (segment, offset) = match list.get(index + 1) {
        Some(next) if next.start == from.next_lsn => (next, 0u64),
        // Nothing of this segment mirrored yet: its header goes too, since the mirror's empty
        // segment of the same first LSN may have been made with another capacity.
        _ if from.offset <= HEADER_BYTES as u64 => (&list[index], 0u64),
        _ => (&list[index], from.offset),
    };
    let file = storage
        .open(&segment.path, OpenMode::Read)
        .map_err(|e| Error::io("open", &segment.path, e))?;
    let len = file
        .len()
        .map_err(|e| Error::io("stat", &segment.path, e))?;
    let want =
        (max_bytes.max(HEADER_BYTES + frame::HEADER_BYTES) as u64).min(len - offset.min(len));
    let mut buf = vec![0u8; want as usize];
    let mut filled = 0usize;
    while filled < buf.len() {
        let n = file
            .read_at(&mut buf[filled..], offset + filled as u64)
            .map_err(|e| Error::io("read", &segment.path, e))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    buf.truncate(filled);
    let frames_at = if offset == 0 { HEADER_BYTES } else { 0 };
    let mut at = frames_at;
    let mut lsn = from.next_lsn.get();
    while at < buf.len() && lsn < end.get() {
        match frame::decode_with_limit(Layout::CURRENT, &buf[at..], segments.max_payload) {
            Decoded::Record(record) if record.lsn.get() == lsn => {
                at += record.frame_len();
                lsn += 1;
            }
            Decoded::Incomplete { needed } if at == frames_at => {
                // One frame larger than the read: read exactly it.
                let mut whole = vec![0u8; needed];
                file.read_exact_at(&mut whole, offset + at as u64)
                    .map_err(|e| Error::io("read", &segment.path, e))?;
                buf.truncate(at);
                buf.extend_from_slice(&whole);
            }
            _ => break,
        }
    }
    if at == frames_at && offset != 0 {
        return Ok(None);
    }
    buf.truncate(at);
    Ok(Some((segment.start, offset, buf, Lsn::new(lsn))))
}
