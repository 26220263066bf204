//! Scanning a segment's bytes: which records are there, where the data ends, what is damaged.
//!
//! This is pure (bytes in, findings out) so that open, the reader and `stela wal verify` agree
//! on what a segment holds, and so property tests can cut and flip bytes without a file system.
//!
//! How a bad spot at offset `p` is classified:
//! - A bad frame (checksum, length, cut short, wrong LSN, zeros followed by data) with *no valid
//!   record after it* in the newest segment is a **torn tail**: the remains of a write that was
//!   in flight when the process or machine died. No record behind it was ever acknowledged,
//!   because acknowledgements follow fdatasync and a write that was synced is whole.
//! - In the newest segment of version 2, a bad frame followed by valid records *every one of
//!   which has a sync base of at most `p`* is a **torn last write**, treated exactly like a torn
//!   tail: each of those records was framed when no completed fdatasync had reached `p`, so the
//!   damaged bytes and those records were all in writes that no sync covered when the power
//!   failed (a drive may persist the sectors of a write in any order, so the end of such a
//!   write can survive while its middle does not). Nothing from `p` on was acknowledged.
//! - Otherwise a bad frame *followed by a valid record* (one whose LSN is at least the one
//!   expected) is **damage**: some record after it was framed after a sync covered `p`, so the
//!   bytes at `p` had been durable and have changed since. So is any bad frame in a sealed
//!   segment (one with a successor: it was fdatasync'ed before the first byte went to its
//!   successor), and any bad frame followed by valid records in a version 1 segment (whose
//!   frames carry no sync base).
//! - Zeros where a record was expected end the data; garbage after the zeros of a sealed
//!   segment is damage.
//! - **Below the synced-end mark** (`SYNCED`, see [`crate::synced`]) of the newest segment,
//!   every one of these is damage, and so is the data ending (zeros, or the file's end) before
//!   the mark: a returned fdatasync had made those bytes durable, so they did not tear, they
//!   changed. Only bytes at or above the mark may be a torn tail.
//!
//! `docs/FORMAT.md` (Recovery) gives the argument why the torn-last-write rule never drops an
//! acknowledged record, and the ambiguity the mark removes (without it, bit rot inside the last
//! write of a log looks like a tear).

use stela_format::frame::{self, Decoded, Layout};
use stela_format::header::HEADER_BYTES;
use stela_format::resync;
use stela_format::Lsn;

/// A damaged stretch inside a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Offset of the first bad byte.
    pub offset: u64,
    /// The LSN expected there.
    pub expected_lsn: Lsn,
    pub reason: String,
    /// Where the next valid record starts, if any.
    pub resumes_at: Option<u64>,
}

/// A torn write at the end of the last segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    pub offset: u64,
    /// Bytes from `offset` to the last non-zero byte of the segment.
    pub bytes: u64,
    pub reason: String,
    /// Valid records found after `offset` that belong to the same unsynced write (a torn last
    /// write; 0 for a plain torn tail). They are cut with the rest: none was acknowledged.
    pub unsynced_records: u64,
}

/// What a scan found in one segment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentScan {
    pub records: u64,
    pub first_lsn: Option<Lsn>,
    pub last_lsn: Option<Lsn>,
    /// Offset just past the last valid record: where the next record goes.
    pub end_offset: u64,
    pub damage: Vec<Damage>,
    pub torn_tail: Option<TornTail>,
}

/// Scans the bytes of a whole segment file whose first record should be `start` and whose frames
/// have `layout` (from its header).
///
/// `is_last`: whether this is the newest segment (only there can a torn tail exist).
/// `skip_damage`: keep scanning past damage (resuming at the next valid record) instead of
/// stopping at the first.
pub fn scan_segment(
    bytes: &[u8],
    start: Lsn,
    layout: Layout,
    is_last: bool,
    max_payload: u32,
    skip_damage: bool,
) -> SegmentScan {
    let no_mark = HEADER_BYTES as u64;
    scan_segment_marked(
        bytes,
        start,
        layout,
        is_last,
        max_payload,
        skip_damage,
        no_mark,
    )
}

/// As [`scan_segment`], for a segment whose bytes below `synced_mark` were made durable by a
/// returned fdatasync (the log's `SYNCED` mark when it names this segment; the header's end,
/// 256, when nothing is known): any finding below it is damage, never a torn tail.
pub fn scan_segment_marked(
    bytes: &[u8],
    start: Lsn,
    layout: Layout,
    is_last: bool,
    max_payload: u32,
    skip_damage: bool,
    synced_mark: u64,
) -> SegmentScan {
    let mut scan = SegmentScan {
        end_offset: HEADER_BYTES as u64,
        ..SegmentScan::default()
    };
    let mut pos = HEADER_BYTES.min(bytes.len());
    let mut expected = start;
    loop {
        let at = Place {
            bytes,
            pos,
            layout,
            max_payload,
            synced_mark,
        };
        let problem = match at.next_frame(expected) {
            Found::Record { lsn, frame_len } => {
                scan.records += 1;
                scan.first_lsn.get_or_insert(lsn);
                scan.last_lsn = Some(lsn);
                expected = lsn.next();
                pos += frame_len;
                scan.end_offset = pos as u64;
                continue;
            }
            Found::End => break,
            Found::Problem(problem) => at.in_synced_bytes(problem),
        };
        let resumes_at = resync::find_next_valid(layout, bytes, pos + 1, expected, max_payload);
        let unsynced_after = match resumes_at {
            _ if at.below_mark() => None,
            None => Some(0),
            Some(resume) if is_last && layout == Layout::V2 => {
                unsynced_records_from(bytes, resume, pos, max_payload)
            }
            Some(_) => None,
        };
        match unsynced_after {
            Some(unsynced_records) if is_last => {
                scan.torn_tail = torn_tail(bytes, pos, problem, unsynced_records);
                break;
            }
            _ => {
                scan.damage.push(Damage {
                    offset: pos as u64,
                    expected_lsn: expected,
                    reason: if resumes_at.is_none() && !at.below_mark() {
                        format!("{problem} in a sealed segment")
                    } else {
                        problem
                    },
                    resumes_at: resumes_at.map(|at| at as u64),
                });
                match resumes_at {
                    Some(at) if skip_damage => {
                        pos = at;
                        expected = resync::lsn_field(bytes, at);
                    }
                    _ => break,
                }
            }
        }
    }
    scan
}

/// Where a scan stands in a segment's bytes, and what it knows about them.
struct Place<'a> {
    bytes: &'a [u8],
    pos: usize,
    layout: Layout,
    max_payload: u32,
    /// Bytes below this offset were made durable by a returned fdatasync.
    synced_mark: u64,
}

/// What the bytes at a scan's place hold.
enum Found {
    /// The record expected next, `frame_len` bytes long.
    Record { lsn: Lsn, frame_len: usize },
    /// A clean end: the data ends (with no bytes, or only zeros, after it) at or above the
    /// synced mark.
    End,
    /// Anything else, said in words.
    Problem(String),
}

impl Place<'_> {
    fn below_mark(&self) -> bool {
        (self.pos as u64) < self.synced_mark
    }

    /// Decodes the frame here: the record expected, a clean end, or what is wrong.
    fn next_frame(&self, expected: Lsn) -> Found {
        let (bytes, pos) = (self.bytes, self.pos);
        let problem = match frame::decode_with_limit(self.layout, &bytes[pos..], self.max_payload) {
            Decoded::Record(rec) if rec.lsn == expected => {
                return Found::Record {
                    lsn: rec.lsn,
                    frame_len: rec.frame_len(),
                }
            }
            Decoded::Record(rec) => format!("found record LSN {} out of sequence", rec.lsn),
            Decoded::Incomplete { .. } if pos == bytes.len() && self.below_mark() => {
                format!("the segment ends at offset {pos}, below its synced-end mark")
            }
            Decoded::Incomplete { .. } if pos == bytes.len() => return Found::End,
            Decoded::Incomplete { needed } => format!(
                "record needs {needed} bytes but the segment ends after {}",
                bytes.len() - pos
            ),
            Decoded::Unwritten => match first_nonzero(bytes, pos) {
                None if self.below_mark() => {
                    "zeros where a record was expected (the data ends here)".to_owned()
                }
                None => return Found::End, // clean end: only zeros follow
                Some(nonzero) => {
                    format!("unexpected bytes at offset {nonzero} after the end of the data")
                }
            },
            Decoded::Rejected(why) => why.to_string(),
        };
        Found::Problem(problem)
    }

    /// A problem below the synced mark is changed durable bytes, never a torn write: says so.
    fn in_synced_bytes(&self, problem: String) -> String {
        if self.below_mark() {
            format!(
                "{problem}, below offset {}, which the log had synced (its SYNCED \
                 mark): durable bytes changed, this is not a torn write",
                self.synced_mark
            )
        } else {
            problem
        }
    }
}

/// The torn tail of the last segment from `pos` (where `problem` was found) to its last
/// nonzero byte, followed by `unsynced_records` valid records framed before any sync reached
/// `pos`; `None` when only zeros follow `pos`.
fn torn_tail(bytes: &[u8], pos: usize, problem: String, unsynced_records: u64) -> Option<TornTail> {
    let end = last_nonzero(bytes, pos).map_or(pos, |i| i + 1);
    if end <= pos {
        return None;
    }
    let reason = if unsynced_records == 0 {
        problem
    } else {
        format!(
            "{problem}, followed by {unsynced_records} valid record(s) framed \
             before any sync reached offset {pos}: the rest of a last write \
             that never completed"
        )
    };
    Some(TornTail {
        offset: pos as u64,
        bytes: (end - pos) as u64,
        reason,
        unsynced_records,
    })
}

/// Counts the valid version 2 frames from `first` (a valid frame) to the end of `bytes`, found
/// as a reader that resynchronises after every bad stretch finds them (each with an LSN above
/// the one before), if every one was framed when the segment was durable only below `damage`
/// (its sync base is at most `damage`). `None` as soon as one was framed after a sync that
/// covered `damage`.
fn unsynced_records_from(
    bytes: &[u8],
    first: usize,
    damage: usize,
    max_payload: u32,
) -> Option<u64> {
    let mut at = first;
    let mut count = 0;
    loop {
        let Decoded::Record(rec) = frame::decode_with_limit(Layout::V2, &bytes[at..], max_payload)
        else {
            unreachable!("find_next_valid returns only valid frames");
        };
        if rec.sync_base.is_none_or(|base| base as usize > damage) {
            return None;
        }
        count += 1;
        let after = at + rec.frame_len();
        match resync::find_next_valid(Layout::V2, bytes, after, rec.lsn.next(), max_payload) {
            Some(next) => at = next,
            None => return Some(count),
        }
    }
}

/// Whole blocks of this size are tested for zeros at once (the compiler vectorises the OR), so
/// checking the empty rest of a 64 MiB segment runs at memory speed rather than byte by byte.
const ZERO_BLOCK: usize = 256;

fn is_all_zero(block: &[u8]) -> bool {
    block.iter().fold(0u8, |acc, &b| acc | b) == 0
}

fn first_nonzero(bytes: &[u8], from: usize) -> Option<usize> {
    let rest = &bytes[from..];
    let mut skipped = 0;
    for block in rest.chunks(ZERO_BLOCK) {
        if !is_all_zero(block) {
            break;
        }
        skipped += block.len();
    }
    rest[skipped..]
        .iter()
        .position(|&b| b != 0)
        .map(|i| i + from + skipped)
}

fn last_nonzero(bytes: &[u8], from: usize) -> Option<usize> {
    let rest = &bytes[from..];
    let mut end = rest.len();
    for block in rest.rchunks(ZERO_BLOCK) {
        if !is_all_zero(block) {
            break;
        }
        end -= block.len();
    }
    rest[..end].iter().rposition(|&b| b != 0).map(|i| i + from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::ops::Range;
    use stela_format::{Codec, SegmentHeader, TypeTag};

    const CAPACITY: usize = 4096;

    fn segment(payloads: &[Vec<u8>], start: u64) -> (Vec<u8>, Vec<usize>) {
        let header = SegmentHeader {
            layout: Layout::V2,
            codec: Codec::Postcard,
            segment_seq: 0,
            start_lsn: Lsn::new(start),
            capacity: CAPACITY as u64,
            type_tag: TypeTag::new("t"),
        };
        let mut bytes = header.encode().to_vec();
        let mut ends = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            // As if each record was committed before the next was framed.
            let sync_base = bytes.len() as u32;
            frame::encode(&mut bytes, Lsn::new(start + i as u64), p, sync_base);
            ends.push(bytes.len());
        }
        bytes.resize(CAPACITY, 0);
        (bytes, ends)
    }

    fn payloads() -> impl Strategy<Value = Vec<Vec<u8>>> {
        proptest::collection::vec(proptest::collection::vec(1u8.., 0..60), 0..30)
    }

    /// A segment holding `writes`, in order: each write's frames carry the write's start as
    /// their sync base, as a log leaves them that syncs each write before framing the next.
    /// Returns the bytes (with some zeros after the data), each frame's range and each write's.
    fn in_writes(writes: &[Vec<Vec<u8>>]) -> (Vec<u8>, Vec<Range<usize>>, Vec<Range<usize>>) {
        let (mut bytes, _) = segment(&[], 1);
        bytes.truncate(HEADER_BYTES);
        let (mut frames, mut ranges) = (Vec::new(), Vec::new());
        let mut lsn = 1;
        for write in writes {
            let start = bytes.len();
            for payload in write {
                let at = bytes.len();
                frame::encode(&mut bytes, Lsn::new(lsn), payload, start as u32);
                frames.push(at..bytes.len());
                lsn += 1;
            }
            ranges.push(start..bytes.len());
        }
        bytes.resize(bytes.len().next_multiple_of(SECTOR) + SECTOR, 0);
        (bytes, frames, ranges)
    }

    const SECTOR: usize = 512;

    /// What a drive may leave of a write `range` after a power cut: each 512-byte sector of it
    /// independently holds the new bytes (choice 0), the old ones (1: zeros, the segment was
    /// preallocated) or garbage (2: a sector torn mid-write).
    fn persist_sectors(bytes: &mut [u8], range: Range<usize>, choices: &[u8]) {
        let first = range.start / SECTOR;
        for (i, sector) in (first..range.end.div_ceil(SECTOR)).enumerate() {
            let lo = range.start.max(sector * SECTOR);
            let hi = range.end.min((sector + 1) * SECTOR);
            match choices[i % choices.len()] {
                0 => {}
                1 => bytes[lo..hi].fill(0),
                _ => {
                    for (j, b) in bytes[lo..hi].iter_mut().enumerate() {
                        *b = ((lo + j) as u8).wrapping_mul(151) | 1;
                    }
                }
            }
        }
    }

    fn scan_v2(bytes: &[u8]) -> SegmentScan {
        scan_segment(bytes, Lsn::FIRST, Layout::V2, true, 1000, false)
    }

    fn flip(bytes: &mut [u8], bit: usize) {
        bytes[bit / 8] ^= 1 << (bit % 8);
    }

    /// What the sync bases alone cannot tell: bit rot inside the last write of a segment
    /// (synced, but no later frame says so) looks like a tear and is cut, unless the synced-end
    /// mark covers it; then it is damage, and so is data ending below the mark.
    #[test]
    fn bit_rot_in_the_last_write_is_damage_only_below_the_mark() {
        let writes = vec![vec![b"a".to_vec(), b"b".to_vec()], vec![vec![7; 30]; 4]];
        let (mut bytes, frames, ranges) = in_writes(&writes);
        flip(&mut bytes, (frames[3].start + 25) * 8);
        let scan = scan_v2(&bytes);
        assert!(scan.damage.is_empty(), "{:?}", scan.damage);
        let torn = scan.torn_tail.expect("a torn last write");
        assert_eq!(torn.offset as usize, frames[3].start);
        assert_eq!(torn.unsynced_records, 2);
        assert!(torn.reason.contains("2 valid record(s)"), "{}", torn.reason);
        assert_eq!(scan.records, 3);

        let synced = ranges[1].end as u64;
        let marked = scan_segment_marked(&bytes, Lsn::FIRST, Layout::V2, true, 1000, false, synced);
        assert!(marked.torn_tail.is_none(), "{:?}", marked.torn_tail);
        assert_eq!(marked.damage.len(), 1);
        assert_eq!(marked.damage[0].offset as usize, frames[3].start);
        assert!(
            marked.damage[0].reason.contains("SYNCED"),
            "{}",
            marked.damage[0].reason
        );
        // A mark below the flip leaves the old rule in force above it.
        let below = frames[3].start as u64;
        let above = scan_segment_marked(&bytes, Lsn::FIRST, Layout::V2, true, 1000, false, below);
        assert!(above.damage.is_empty() && above.torn_tail.is_some());

        // The data cut back (zeros) below the mark: synced records are missing.
        let (mut short, frames, _) = in_writes(&writes);
        short[frames[4].start..].fill(0);
        let cut = scan_segment_marked(&short, Lsn::FIRST, Layout::V2, true, 1000, false, synced);
        assert_eq!(cut.damage.len(), 1, "{cut:?}");
        assert_eq!(cut.damage[0].offset as usize, frames[4].start);
        assert_eq!(cut.damage[0].expected_lsn, Lsn::new(5));
    }

    /// Version 1 frames carry no sync base, so damage followed by valid frames stays damage
    /// there, wherever it is.
    #[test]
    fn a_v1_segment_keeps_the_old_rule() {
        let mut bytes = vec![0u8; HEADER_BYTES];
        let mut starts = Vec::new();
        for lsn in 1..=4 {
            starts.push(bytes.len());
            resync::encode_v1(&mut bytes, Lsn::new(lsn), &[lsn as u8; 40]);
        }
        bytes.resize(2048, 0);
        flip(&mut bytes, (starts[2] + 20) * 8);
        let scan = scan_segment(&bytes, Lsn::FIRST, Layout::V1, true, 1000, false);
        assert_eq!(scan.damage.len(), 1);
        assert_eq!(scan.damage[0].offset as usize, starts[2]);
        assert!(scan.torn_tail.is_none());
    }

    /// A tear inside the last write (its middle sector lost) with later records of the same
    /// write intact is a torn tail in the newest segment, damage in a sealed one.
    #[test]
    fn a_torn_last_write_is_only_cut_in_the_newest_segment() {
        let writes = vec![vec![vec![1; 100]], vec![vec![2; 300]; 5]];
        let (mut bytes, frames, ranges) = in_writes(&writes);
        let last = ranges[1].clone();
        persist_sectors(&mut bytes, last, &[0, 1, 0, 0]);
        let newest = scan_v2(&bytes);
        assert!(newest.damage.is_empty(), "{:?}", newest.damage);
        assert!(newest.torn_tail.unwrap().unsynced_records > 0);
        let sealed = scan_segment(&bytes, Lsn::FIRST, Layout::V2, false, 1000, false);
        assert!(sealed.torn_tail.is_none());
        assert_eq!(sealed.damage.len(), 1);
        assert!(sealed.damage[0].offset as usize >= frames[1].start);
    }

    #[test]
    fn a_clean_segment_has_no_findings() {
        let (bytes, ends) = segment(&[b"a".to_vec(), b"bb".to_vec()], 5);
        let scan = scan_segment(&bytes, Lsn::new(5), Layout::V2, true, 1000, false);
        assert_eq!(scan.records, 2);
        assert_eq!(scan.last_lsn, Some(Lsn::new(6)));
        assert_eq!(scan.end_offset as usize, ends[1]);
        assert!(scan.damage.is_empty() && scan.torn_tail.is_none());
    }

    #[test]
    fn zeros_then_a_valid_record_is_damage() {
        let (mut bytes, ends) = segment(&[b"a".to_vec(), b"b".to_vec(), b"c".to_vec()], 1);
        bytes[ends[0]..ends[1]].fill(0); // a lost sector wiped record 2
        let scan = scan_segment(&bytes, Lsn::new(1), Layout::V2, true, 1000, false);
        assert_eq!(scan.damage.len(), 1);
        assert_eq!(scan.damage[0].offset as usize, ends[0]);
        assert_eq!(scan.damage[0].resumes_at, Some(ends[1] as u64));
    }

    proptest! {
        #[test]
        fn block_zero_scans_match_bytewise(
            len in 0usize..2000,
            ones in proptest::collection::vec(any::<prop::sample::Index>(), 0..3),
            from in any::<prop::sample::Index>(),
        ) {
            let mut bytes = vec![0u8; len];
            for one in &ones {
                if len > 0 {
                    bytes[one.index(len)] = 1;
                }
            }
            let from = from.index(len + 1);
            let first = bytes[from..].iter().position(|&b| b != 0).map(|i| i + from);
            let last = bytes[from..].iter().rposition(|&b| b != 0).map(|i| i + from);
            prop_assert_eq!(first_nonzero(&bytes, from), first);
            prop_assert_eq!(last_nonzero(&bytes, from), last);
        }

        /// Cutting the log at any byte recovers exactly the records written in full before the
        /// cut, and reports the rest as a torn tail, never as damage.
        #[test]
        fn any_cut_recovers_exactly_the_whole_records(payloads in payloads(), cut in any::<prop::sample::Index>()) {
            let (full, ends) = segment(&payloads, 1);
            let data_end = ends.last().copied().unwrap_or(HEADER_BYTES);
            let cut = HEADER_BYTES + cut.index(data_end - HEADER_BYTES + 1);
            let mut bytes = full.clone();
            // What a crash leaves: the bytes before the cut, garbage-free zeros after.
            bytes[cut..].fill(0);
            let scan = scan_segment(&bytes, Lsn::new(1), Layout::V2, true, 1000, false);
            // A record survives when every byte it needs is before the cut, or is a zero that
            // the zero fill after the cut supplies anyway (an empty payload's LSN high bytes).
            let survives = |end: usize| full[cut.min(end)..end].iter().all(|&b| b == 0);
            let whole = ends.iter().take_while(|&&e| survives(e)).count();
            prop_assert_eq!(scan.records, whole as u64);
            prop_assert!(scan.damage.is_empty(), "{:?}", scan.damage);
            let kept_end = if whole == 0 { HEADER_BYTES } else { ends[whole - 1] };
            prop_assert_eq!(scan.end_offset as usize, kept_end);
            let leftovers = bytes[kept_end..].iter().any(|&b| b != 0);
            prop_assert_eq!(scan.torn_tail.is_some(), leftovers);
        }

        /// Flipping any single bit of the record area is noticed: as damage if a valid record
        /// follows, as a torn tail if it hit the last record.
        #[test]
        fn any_flipped_bit_is_noticed(payloads in payloads(), bit in any::<prop::sample::Index>()) {
            prop_assume!(!payloads.is_empty());
            let (mut bytes, ends) = segment(&payloads, 1);
            let data_end = *ends.last().unwrap();
            let bit = HEADER_BYTES * 8 + bit.index((data_end - HEADER_BYTES) * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            let scan = scan_segment(&bytes, Lsn::new(1), Layout::V2, true, 1000, false);
            prop_assert!(scan.records < payloads.len() as u64);
            prop_assert!(!scan.damage.is_empty() || scan.torn_tail.is_some());
            let hit_last = ends.len() == 1 || bit / 8 >= ends[ends.len() - 2];
            if !hit_last {
                prop_assert!(!scan.damage.is_empty(), "flip in a middle record must be damage");
            }
        }

        /// Power fails during the last write of the newest segment, after earlier writes were
        /// synced, and the drive keeps any subset of the write's sectors (the rest old or
        /// garbage): the scan never reports damage, keeps every record of the synced writes,
        /// returns exactly the records intact from the start, and cuts whatever follows them
        /// as a torn tail.
        #[test]
        fn any_sectors_of_the_last_write_are_a_torn_tail(
            synced in proptest::collection::vec(
                proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), 1..5),
                0..4,
            ),
            last in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 30..400), 4..12),
            choices in proptest::collection::vec(0u8..3, 16),
        ) {
            let mut writes = synced.clone();
            writes.push(last);
            let (original, frames, ranges) = in_writes(&writes);
            let mut bytes = original.clone();
            persist_sectors(&mut bytes, ranges.last().unwrap().clone(), &choices);
            let scan = scan_v2(&bytes);
            prop_assert!(scan.damage.is_empty(), "{:?}", scan.damage);
            let intact = frames.iter().take_while(|f| bytes[(*f).clone()] == original[(*f).clone()]).count();
            let acknowledged: usize = synced.iter().map(Vec::len).sum();
            prop_assert!(intact >= acknowledged);
            prop_assert_eq!(scan.records, intact as u64);
            let end = frames[..intact].last().map_or(HEADER_BYTES, |f| f.end);
            prop_assert_eq!(scan.end_offset as usize, end);
            let leftovers = bytes[end..].iter().any(|&b| b != 0);
            prop_assert_eq!(scan.torn_tail.is_some(), leftovers, "{:?}", scan.torn_tail);
            if let Some(torn) = &scan.torn_tail {
                prop_assert_eq!(torn.offset as usize, end);
            }
        }

        /// A flipped bit in a write that a later write follows (so the later frames' sync base
        /// says the damaged bytes had been synced) is damage, never a torn tail, even in the
        /// newest segment.
        #[test]
        fn a_flip_in_synced_data_before_later_frames_is_damage(
            writes in proptest::collection::vec(
                proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), 1..5),
                2..6,
            ),
            write in any::<prop::sample::Index>(),
            bit in any::<prop::sample::Index>(),
        ) {
            let (mut bytes, frames, ranges) = in_writes(&writes);
            let hit_write = ranges[write.index(ranges.len() - 1)].clone();
            let bit = hit_write.start * 8 + bit.index(hit_write.len() * 8);
            flip(&mut bytes, bit);
            let hit = frames.iter().position(|f| f.contains(&(bit / 8))).unwrap();
            let scan = scan_v2(&bytes);
            prop_assert!(scan.torn_tail.is_none(), "{:?}", scan.torn_tail);
            prop_assert_eq!(scan.damage.len(), 1);
            prop_assert_eq!(scan.damage[0].offset as usize, frames[hit].start);
            prop_assert_eq!(scan.records, hit as u64);
        }
    }
}
