//! Scanning a segment's bytes: which records are there, where the data ends, what is damaged.
//!
//! This is pure (bytes in, findings out) so that open, the reader and `stela wal verify` agree
//! on what a segment holds, and so property tests can cut and flip bytes without a file system.
//!
//! How a bad spot is classified:
//! - A bad frame (checksum, length, cut short, wrong LSN) with *no valid record after it* in the
//!   last segment is a **torn tail**: the remains of a write that was in flight when the process
//!   or machine died. No record behind it was ever acknowledged, because acknowledgements follow
//!   fdatasync and a write that was synced is whole.
//! - A bad frame *followed by a valid record* (one whose LSN is at least the one expected), or
//!   any bad frame in a sealed segment (one with a successor: it was fdatasync'ed before the first
//!   byte went to its successor), is **damage**: bytes that were once durable have changed.
//! - Zeros where a record was expected end the data. Zeros followed by valid records are damage
//!   (a lost sector), and so is garbage after the zeros of a sealed segment.

use stela_format::frame::{self, Decoded, Layout};
use stela_format::header::HEADER_BYTES;
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
    let mut scan = SegmentScan {
        end_offset: HEADER_BYTES as u64,
        ..SegmentScan::default()
    };
    let mut pos = HEADER_BYTES.min(bytes.len());
    let mut expected = start;
    loop {
        let problem = match frame::decode_with_limit(layout, &bytes[pos..], max_payload) {
            Decoded::Record(rec) if rec.lsn == expected => {
                scan.records += 1;
                scan.first_lsn.get_or_insert(rec.lsn);
                scan.last_lsn = Some(rec.lsn);
                expected = rec.lsn.next();
                pos += rec.frame_len();
                scan.end_offset = pos as u64;
                continue;
            }
            Decoded::Record(rec) => format!("found record LSN {} out of sequence", rec.lsn),
            Decoded::Incomplete { .. } if pos == bytes.len() => break,
            Decoded::Incomplete { needed } => format!(
                "record needs {needed} bytes but the segment ends after {}",
                bytes.len() - pos
            ),
            Decoded::Unwritten => {
                let Some(nonzero) = first_nonzero(bytes, pos) else {
                    break; // clean end: only zeros follow
                };
                format!("unexpected bytes at offset {nonzero} after the end of the data")
            }
            Decoded::Rejected(why) => why.to_string(),
        };
        let resumes_at = frame::find_next_valid(layout, bytes, pos + 1, expected, max_payload);
        match resumes_at {
            None if is_last => {
                let end = last_nonzero(bytes, pos).map_or(pos, |i| i + 1);
                if end > pos {
                    scan.torn_tail = Some(TornTail {
                        offset: pos as u64,
                        bytes: (end - pos) as u64,
                        reason: problem,
                    });
                }
                break;
            }
            resumes_at => {
                scan.damage.push(Damage {
                    offset: pos as u64,
                    expected_lsn: expected,
                    reason: if resumes_at.is_none() {
                        format!("{problem} in a sealed segment")
                    } else {
                        problem
                    },
                    resumes_at: resumes_at.map(|at| at as u64),
                });
                match resumes_at {
                    Some(at) if skip_damage => {
                        pos = at;
                        expected = frame::lsn_field(bytes, at);
                    }
                    _ => break,
                }
            }
        }
    }
    scan
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
    }
}
