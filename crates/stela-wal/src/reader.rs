//! Reading records in log order, lazily, segment after segment.
//!
//! A [`RawReader`] works on a snapshot: the segment list and the LSN bound taken when it was
//! made. It never reads past that bound, so records being written concurrently are neither
//! half-read nor missed in a later reader. It reads segments in large chunks (1 MiB) and checks
//! every frame's checksum and LSN as it goes: at damage it yields one error naming the segment and
//! offset, then stops, unless it was made in skip mode, where it resumes at the next valid record.

use crate::error::{Corruption, Error, Result};
use crate::segment::{self, SegmentFile};
use crate::storage::{OpenMode, Storage, StorageFile};
use std::sync::Arc;
use stela_format::frame::{self, Decoded, Layout};
use stela_format::header::HEADER_BYTES;
use stela_format::resync;
use stela_format::Lsn;

const CHUNK_BYTES: usize = 1 << 20;

/// Where a reader stood: the LSN of the next record and the offset of its frame in the segment
/// that begins at `segment_start`. A later reader of the same segments may start there instead
/// of reading the segment from its beginning; the frame there is checked like any other (its
/// CRC and its LSN), so a point that is no longer true shows up as damage, never as a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPoint {
    pub segment_start: Lsn,
    pub offset: u64,
    pub lsn: Lsn,
}

/// An ordered reader of raw record payloads. See the module documentation.
pub struct RawReader {
    storage: Arc<dyn Storage>,
    segments: Vec<SegmentFile>,
    /// Records below this LSN are read (to find their end) but not returned.
    from: Lsn,
    /// Exclusive upper bound: the reader stops before this LSN.
    end: Lsn,
    max_payload: u32,
    skip_damage: bool,
    position: Option<Position>,
    next_segment: usize,
    expected: Lsn,
    done: bool,
    /// Where to begin in the first segment opened, if not at its first frame (a [`ReadPoint`]).
    start_offset: Option<u64>,
    /// Reading a log another process is appending to: in the newest segment, zeros or a frame
    /// that fails its checks are where the writer has got to (the end, quietly), not damage
    /// (whose search for the next valid frame would read the rest of the segment every time).
    at_tail_ends: bool,
}

struct Position {
    file: Box<dyn StorageFile>,
    segment: usize,
    /// The frame layout, from the segment's header.
    layout: Layout,
    file_len: u64,
    /// Bytes of the file starting at `buf_offset`.
    buf: Vec<u8>,
    buf_offset: u64,
    /// Read position within `buf`.
    pos: usize,
}

impl Position {
    fn file_offset(&self) -> u64 {
        self.buf_offset + self.pos as u64
    }

    fn at_file_end(&self) -> bool {
        self.buf_offset + self.buf.len() as u64 >= self.file_len
    }

    /// Reads more of the file so at least `want` bytes are available from `pos` (or the file
    /// ends).
    fn refill(&mut self, want: usize) -> std::io::Result<()> {
        self.buf.drain(..self.pos);
        self.buf_offset += self.pos as u64;
        self.pos = 0;
        let remaining = self.file_len - (self.buf_offset + self.buf.len() as u64);
        let read = (want.max(CHUNK_BYTES) as u64).min(remaining) as usize;
        let old = self.buf.len();
        self.buf.resize(old + read, 0);
        let at = self.buf_offset + old as u64;
        self.file.read_exact_at(&mut self.buf[old..], at)
    }
}

impl RawReader {
    /// A reader over `segments` (in log order) returning records `from..end`.
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        segments: Vec<SegmentFile>,
        from: Lsn,
        end: Lsn,
        max_payload: u32,
        skip_damage: bool,
    ) -> RawReader {
        // Start in the last segment that begins at or before `from`.
        let first = segments.iter().rposition(|s| s.start <= from).unwrap_or(0);
        let expected = segments.get(first).map_or(from, |s| s.start);
        RawReader {
            storage,
            segments,
            from,
            end,
            max_payload,
            skip_damage,
            position: None,
            next_segment: first,
            expected,
            done: false,
            start_offset: None,
            at_tail_ends: false,
        }
    }

    /// Makes the reader end quietly where the newest segment's complete frames end (see
    /// `at_tail_ends`). Call before the first record is read.
    pub(crate) fn end_at_tail(&mut self) {
        self.at_tail_ends = true;
    }

    /// Starts at `point` instead, when it lies in the segment the reader would start in, at or
    /// before its first LSN (records between the point and that LSN are read, not returned).
    /// Call before the first record is read.
    pub(crate) fn start_at(&mut self, point: ReadPoint) {
        let usable = self.position.is_none()
            && self
                .segments
                .get(self.next_segment)
                .is_some_and(|s| s.start == point.segment_start && s.start <= point.lsn)
            && point.lsn <= self.from
            && point.offset >= HEADER_BYTES as u64;
        if usable {
            self.expected = point.lsn;
            self.start_offset = Some(point.offset);
        }
    }

    /// Where the next record would be read, while the reader is inside a segment.
    pub fn read_point(&self) -> Option<ReadPoint> {
        let position = self.position.as_ref()?;
        Some(ReadPoint {
            segment_start: self.segments[position.segment].start,
            offset: position.file_offset(),
            lsn: self.expected,
        })
    }

    /// The LSN the next record should have.
    pub fn expected_lsn(&self) -> Lsn {
        self.expected
    }

    fn fail(&mut self, error: Error) -> Option<Result<(Lsn, &[u8])>> {
        self.done = true;
        Some(Err(error))
    }

    /// The next record as `(lsn, payload)`; the payload borrows the reader's buffer.
    pub fn next_record(&mut self) -> Option<Result<(Lsn, &[u8])>> {
        loop {
            if self.done || self.expected >= self.end {
                self.done = true;
                return None;
            }
            if self.position.is_none() {
                match self.open_next_segment() {
                    Ok(true) => {}
                    Ok(false) => {
                        self.done = true;
                        return None;
                    }
                    Err(error) => return self.fail(error),
                }
            }
            let position = self.position.as_mut().expect("opened above");
            let layout = position.layout;
            let decoded =
                frame::decode_with_limit(layout, &position.buf[position.pos..], self.max_payload);
            match decoded {
                Decoded::Record(rec) if rec.lsn == self.expected => {
                    let start = position.pos + layout.header_bytes();
                    let len = rec.payload.len();
                    let lsn = rec.lsn;
                    position.pos += rec.frame_len();
                    self.expected = lsn.next();
                    if lsn >= self.from {
                        let position = self.position.as_ref().expect("opened above");
                        return Some(Ok((lsn, &position.buf[start..start + len])));
                    }
                }
                Decoded::Incomplete { needed } if !position.at_file_end() => {
                    if let Err(e) = position.refill(needed) {
                        let path = self.segments[position.segment].path.clone();
                        return self.fail(Error::io("read", path, e));
                    }
                }
                Decoded::Unwritten
                    if position.buf[position.pos..].len() >= layout.header_bytes()
                        || position.at_file_end() =>
                {
                    // The data of this segment ends here, and normally the next segment continues
                    // it. If none does, the records still expected (below `end`) can only be
                    // further on in this segment, behind zeros where data was lost: that is damage,
                    // which skip mode resumes after, as the scan at open did (found by the
                    // `recovery_open` fuzz target: records after a zeroed stretch were counted at
                    // open but never read, and neither were records appended after them). Without
                    // skip, a following segment that does not continue reports the gap itself.
                    let is_last = self.next_segment == self.segments.len();
                    let continued = self
                        .segments
                        .get(self.next_segment)
                        .is_some_and(|s| s.start == self.expected);
                    if continued || (!is_last && !self.skip_damage) {
                        self.position = None;
                    } else if self.at_tail_ends && is_last {
                        self.done = true;
                        return None;
                    } else {
                        let reason =
                            format!("zeros where record LSN {} was expected", self.expected);
                        if let Some(error) = self.damage(reason) {
                            return self.fail(error);
                        }
                    }
                }
                Decoded::Unwritten => {
                    if let Err(e) = position.refill(layout.header_bytes()) {
                        let path = self.segments[position.segment].path.clone();
                        return self.fail(Error::io("read", path, e));
                    }
                }
                Decoded::Incomplete { .. } if position.pos == position.buf.len() => {
                    self.position = None; // exactly at the end of the file
                }
                _ if self.at_tail_ends && position.segment + 1 == self.segments.len() => {
                    self.done = true;
                    return None;
                }
                bad => {
                    let reason = match bad {
                        Decoded::Record(rec) => {
                            format!("found record LSN {} out of sequence", rec.lsn)
                        }
                        Decoded::Rejected(why) => why.to_string(),
                        _ => "record cut short by the end of the segment file".to_string(),
                    };
                    if let Some(error) = self.damage(reason) {
                        return self.fail(error);
                    }
                }
            }
        }
    }

    /// Handles a bad frame at the current position: in skip mode moves past it (returning
    /// `None`), otherwise returns the corruption error.
    fn damage(&mut self, reason: String) -> Option<Error> {
        let position = self.position.as_mut().expect("called with a position");
        let offset = position.file_offset();
        let path = self.segments[position.segment].path.clone();
        if let Err(e) = position.refill(usize::MAX) {
            return Some(Error::io("read", path, e));
        }
        let resumes = resync::find_next_valid(
            position.layout,
            &position.buf,
            1,
            self.expected,
            self.max_payload,
        );
        if self.skip_damage {
            match resumes {
                Some(at) => {
                    position.pos = at;
                    self.expected = resync::lsn_field(&position.buf, at);
                }
                None => self.position = None,
            }
            return None;
        }
        Some(Error::corruption(Corruption {
            segment: path,
            offset,
            expected_lsn: self.expected,
            reason,
            valid_record_at: resumes.map(|at| offset + at as u64),
        }))
    }

    /// Opens the next segment. `Ok(false)` at the end of the log.
    fn open_next_segment(&mut self) -> Result<bool> {
        let Some(segment) = self.segments.get(self.next_segment) else {
            return Ok(false);
        };
        let start_offset = self.start_offset.take();
        if segment.start != self.expected && start_offset.is_none() {
            let missing = format!(
                "records {}..{} are missing before this segment",
                self.expected, segment.start
            );
            if !(self.skip_damage && segment.start > self.expected) {
                return Err(Error::corruption(Corruption {
                    segment: segment.path.clone(),
                    offset: 0,
                    expected_lsn: self.expected,
                    reason: missing,
                    valid_record_at: None,
                }));
            }
            self.expected = segment.start;
        }
        let file = self
            .storage
            .open(&segment.path, OpenMode::Read)
            .map_err(|e| Error::io("open", &segment.path, e))?;
        let file_len = file
            .len()
            .map_err(|e| Error::io("stat", &segment.path, e))?;
        // The header says how the frames are laid out (segments of both versions may follow
        // each other in one log). Recovery checked it; reading it again costs one small read
        // per segment and catches a header damaged since.
        let layout = segment::read_header(file.as_ref(), &segment.path)?.layout;
        let mut position = Position {
            file,
            segment: self.next_segment,
            layout,
            file_len,
            buf: Vec::with_capacity(CHUNK_BYTES),
            buf_offset: start_offset.unwrap_or(HEADER_BYTES as u64).min(file_len),
            pos: 0,
        };
        if file_len > position.buf_offset {
            position
                .refill(0)
                .map_err(|e| Error::io("read", &segment.path, e))?;
        }
        self.position = Some(position);
        self.next_segment += 1;
        Ok(true)
    }
}

impl Iterator for RawReader {
    type Item = Result<(Lsn, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record()
            .map(|r| r.map(|(lsn, payload)| (lsn, payload.to_vec())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::FaultStorage;
    use std::path::Path;
    use stela_format::segment_name::segment_file_name;
    use stela_format::{Codec, SegmentHeader, TypeTag};

    /// A one-segment log holding `bytes` after its header (padded with zeros to 4 KiB).
    fn segment_of(frames: &[u8]) -> (Arc<dyn Storage>, Vec<SegmentFile>) {
        let header = SegmentHeader {
            layout: Layout::V2,
            codec: Codec::Postcard,
            segment_seq: 0,
            start_lsn: Lsn::FIRST,
            capacity: 4096,
            type_tag: TypeTag::new("t"),
        };
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(frames);
        bytes.resize(4096, 0);
        let storage = FaultStorage::new();
        let dir = Path::new("/log");
        storage.create_dir_all(dir).unwrap();
        let path = dir.join(segment_file_name(Lsn::FIRST));
        let file = storage.open(&path, OpenMode::CreateNew).unwrap();
        file.write_all_at(&bytes, 0).unwrap();
        let segments = vec![SegmentFile {
            start: Lsn::FIRST,
            path,
        }];
        (Arc::new(storage), segments)
    }

    /// Frames of records `lsns`, each with a payload of `size(lsn)` bytes of value `lsn`, laid
    /// out after the header; returns the bytes and each frame's range.
    fn frames(
        lsns: std::ops::RangeInclusive<u64>,
        size: impl Fn(u64) -> usize,
    ) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
        let mut bytes = Vec::new();
        let mut ranges = Vec::new();
        for lsn in lsns {
            let start = bytes.len();
            let sync_base = (HEADER_BYTES + start) as u32;
            frame::encode(
                &mut bytes,
                Lsn::new(lsn),
                &vec![lsn as u8; size(lsn)],
                sync_base,
            );
            ranges.push(start..bytes.len());
        }
        (bytes, ranges)
    }

    /// A one-segment log of records 1..=5 whose record 3 was wiped to zeros (a lost sector).
    fn wiped_middle() -> (Arc<dyn Storage>, Vec<SegmentFile>) {
        let (mut bytes, ranges) = frames(1..=5, |_| 10);
        bytes[ranges[2].clone()].fill(0);
        segment_of(&bytes)
    }

    #[test]
    fn records_behind_zeros_are_skipped_to_not_lost() {
        let (storage, segments) = wiped_middle();
        let reader = RawReader::new(storage, segments, Lsn::FIRST, Lsn::new(6), 1024, true);
        let lsns: Vec<u64> = reader.map(|r| r.unwrap().0.get()).collect();
        assert_eq!(lsns, [1, 2, 4, 5]);
    }

    #[test]
    fn zeros_before_the_end_are_an_error_without_skip() {
        let (storage, segments) = wiped_middle();
        let mut reader = RawReader::new(storage, segments, Lsn::FIRST, Lsn::new(6), 1024, false);
        assert_eq!(reader.next().unwrap().unwrap().0, Lsn::new(1));
        assert_eq!(reader.next().unwrap().unwrap().0, Lsn::new(2));
        match reader.next() {
            Some(Err(Error::Corruption(c))) => {
                assert_eq!(c.expected_lsn, Lsn::new(3));
                assert!(c.valid_record_at.is_some(), "{c:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(reader.next().is_none());
    }

    /// A one-segment log of records 1..=8 of different sizes, nothing damaged.
    fn whole() -> (Arc<dyn Storage>, Vec<SegmentFile>) {
        segment_of(&frames(1..=8, |lsn| lsn as usize * 3).0)
    }

    fn reader_of(storage: &Arc<dyn Storage>, segments: &[SegmentFile], from: u64) -> RawReader {
        RawReader::new(
            Arc::clone(storage),
            segments.to_vec(),
            Lsn::new(from),
            Lsn::new(9),
            1024,
            false,
        )
    }

    #[test]
    fn a_reader_started_at_a_read_point_returns_what_a_reader_from_the_start_returns() {
        let (storage, segments) = whole();
        let all: Vec<(Lsn, Vec<u8>)> = reader_of(&storage, &segments, 1)
            .map(Result::unwrap)
            .collect();
        for stop_after in 1..8usize {
            let mut first = reader_of(&storage, &segments, 1);
            for _ in 0..stop_after {
                first.next_record().unwrap().unwrap();
            }
            let point = first.read_point().unwrap();
            assert_eq!(point.lsn, Lsn::new(stop_after as u64 + 1));
            // From the point itself, and from a later LSN of the same segment.
            for from in [point.lsn.get(), 8] {
                let mut reader = reader_of(&storage, &segments, from);
                reader.start_at(point);
                let rest: Vec<(Lsn, Vec<u8>)> = reader.map(Result::unwrap).collect();
                assert_eq!(
                    rest,
                    all[from as usize - 1..],
                    "stop after {stop_after}, from {from}"
                );
            }
        }
    }

    #[test]
    fn a_read_point_that_no_longer_holds_is_damage_never_a_record() {
        let (storage, segments) = whole();
        let mut reader = reader_of(&storage, &segments, 1);
        reader.next_record().unwrap().unwrap();
        let point = reader.read_point().unwrap();
        // One byte off: inside a frame.
        let wrong = ReadPoint {
            offset: point.offset + 1,
            ..point
        };
        let mut hinted = reader_of(&storage, &segments, point.lsn.get());
        hinted.start_at(wrong);
        assert!(matches!(hinted.next(), Some(Err(_))));
    }
}
