//! Record frames: the unit the log writes, checksums and recovers.
//!
//! Version 2, the layout every writer uses:
//!
//! ```text
//! offset  size  field
//!      0     4  payload length n, u32 little-endian (at most 256 MiB)
//!      4     4  CRC32C of payload ++ bytes 0..4 ++ bytes 8..20, u32 little-endian
//!      8     8  LSN of the record, u64 little-endian (never 0, never u64::MAX)
//!     16     4  sync base, u32 little-endian: the offset in this record's segment below which
//!               the segment was durable (fdatasync'ed) when the record was framed; 256 (the
//!               segment header length) when nothing in the segment had been synced yet
//!     20     n  payload (the codec's bytes)
//! ```
//!
//! Version 1 (still read, never written) is the same without the sync base: a 16-byte header,
//! the CRC over payload ++ bytes 0..4 ++ bytes 8..16. A segment's header says which [`Layout`]
//! its frames have; nothing in a frame says it.
//!
//! Why these fields:
//! - The CRC covers the payload *and* every header field, so a changed length cannot make the
//!   reader frame garbage as a record, and a frame left behind by an earlier use of the same bytes
//!   (same position, different LSN) can never pass as the record the reader expects.
//! - The LSN is stored, not implied, so a scan that lost its place (after a bad frame) can
//!   recognise a real record at any byte offset without knowing which LSN to expect there.
//! - The sync base lets recovery recognise the last write of a segment. Damage at offset `p`
//!   followed only by valid frames whose sync base is at most `p` lies in bytes that no completed
//!   fdatasync covered when any of those frames was framed: a write torn by a power cut, not
//!   changed durable data. (`docs/FORMAT.md` gives the whole argument.)
//! - The CRC is taken over the payload first so a writer can checksum the payload before it
//!   knows the LSN and sync base, and only fold in the header bytes once they are assigned.
//! - A header of zero bytes is never a frame (LSN 0 names no record): segments are preallocated
//!   and read back as zeros where nothing was written, and that is how the end of the data is
//!   seen.

use crate::lsn::Lsn;

/// Bytes before the payload in a version 2 frame, the layout writers use.
pub const HEADER_BYTES: usize = 20;

/// Bytes before the payload in a version 1 frame.
pub const V1_HEADER_BYTES: usize = 16;

/// The smallest sync base a frame can carry: the segment header's length (nothing below it is
/// a record, and the header is synced before the segment gets its name). Written out rather than
/// taken from [`crate::header`], which builds on this module's [`Layout`]; the header module
/// asserts at compile time that the two agree.
pub const MIN_SYNC_BASE: u32 = 256;

/// The largest payload the format allows. A length above this is treated as garbage, which
/// bounds how far a corrupted length can make a reader look.
pub const MAX_PAYLOAD_BYTES: u32 = 256 << 20;

/// How the frames of a segment are laid out; the segment header's format version says which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Format version 1: 16-byte frame headers, no sync base. Read, never written.
    V1,
    /// Format version 2: 20-byte frame headers with a sync base.
    V2,
}

impl Layout {
    /// The layout writers use.
    pub const CURRENT: Layout = Layout::V2;

    /// Bytes before the payload.
    pub const fn header_bytes(self) -> usize {
        match self {
            Layout::V1 => V1_HEADER_BYTES,
            Layout::V2 => HEADER_BYTES,
        }
    }

    /// Bytes a frame of a `payload_len`-byte payload occupies.
    pub const fn frame_len(self, payload_len: usize) -> usize {
        self.header_bytes() + payload_len
    }

    /// The segment format version that has this layout.
    pub const fn version(self) -> u16 {
        match self {
            Layout::V1 => 1,
            Layout::V2 => 2,
        }
    }

    /// The layout of a segment format version, if this build reads it.
    pub const fn from_version(version: u16) -> Option<Layout> {
        match version {
            1 => Some(Layout::V1),
            2 => Some(Layout::V2),
            _ => None,
        }
    }
}

/// Bytes a version 2 frame of a `payload_len`-byte payload occupies.
pub const fn frame_len(payload_len: usize) -> usize {
    HEADER_BYTES + payload_len
}

/// A frame that checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRecord<'a> {
    pub lsn: Lsn,
    pub payload: &'a [u8],
    /// The sync base of a version 2 frame; `None` for version 1.
    pub sync_base: Option<u32>,
}

impl FrameRecord<'_> {
    /// The layout the frame was decoded with.
    pub fn layout(&self) -> Layout {
        match self.sync_base {
            Some(_) => Layout::V2,
            None => Layout::V1,
        }
    }

    /// Bytes the whole frame occupies.
    pub fn frame_len(&self) -> usize {
        self.layout().frame_len(self.payload.len())
    }
}

/// Why the bytes at a position are not a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The length field is beyond [`MAX_PAYLOAD_BYTES`] or the caller's limit.
    ImplausibleLength { length: u32 },
    /// The LSN field is 0 but the rest of the header is not blank.
    ZeroLsn,
    /// The LSN field is `u64::MAX`, which is reserved (see [`Lsn::MAX`]).
    ReservedLsn,
    /// The sync base points into the segment header, where no writer can have synced records.
    ImplausibleSyncBase { sync_base: u32 },
    /// The checksum does not match the bytes.
    ChecksumMismatch { stored: u32, computed: u32 },
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::ImplausibleLength { length } => {
                write!(f, "implausible record length {length}")
            }
            Rejection::ZeroLsn => write!(f, "record header with LSN 0"),
            Rejection::ReservedLsn => write!(f, "record header with the reserved LSN {}", u64::MAX),
            Rejection::ImplausibleSyncBase { sync_base } => write!(
                f,
                "record header with sync base {sync_base}, inside the segment header"
            ),
            Rejection::ChecksumMismatch { stored, computed } => write!(
                f,
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
        }
    }
}

/// What the bytes at the start of a buffer are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole, checksummed record.
    Record(FrameRecord<'a>),
    /// A frame header's worth of zero bytes (or fewer, up to the end of the buffer): space that
    /// was never written.
    Unwritten,
    /// The buffer ends before the frame does. At the end of a file this is a torn write; in the
    /// middle of a read it means "read more".
    Incomplete { needed: usize },
    /// The bytes are not a record.
    Rejected(Rejection),
}

/// The checksum of a version 2 frame, from the CRC of its payload and its header fields.
pub fn checksum(payload_crc: u32, payload_len: u32, lsn: Lsn, sync_base: u32) -> u32 {
    let mut tail = [0u8; 16];
    tail[..4].copy_from_slice(&payload_len.to_le_bytes());
    tail[4..12].copy_from_slice(&lsn.get().to_le_bytes());
    tail[12..].copy_from_slice(&sync_base.to_le_bytes());
    crc32c::crc32c_append(payload_crc, &tail)
}

/// The checksum of a version 1 frame.
pub fn checksum_v1(payload_crc: u32, payload_len: u32, lsn: Lsn) -> u32 {
    let mut tail = [0u8; 12];
    tail[..4].copy_from_slice(&payload_len.to_le_bytes());
    tail[4..].copy_from_slice(&lsn.get().to_le_bytes());
    crc32c::crc32c_append(payload_crc, &tail)
}

/// Appends the version 2 frame of `payload` at `lsn` with `sync_base` to `out`.
///
/// # Panics
/// If `lsn` is 0 or above [`Lsn::MAX`], the payload exceeds [`MAX_PAYLOAD_BYTES`], or
/// `sync_base` is below [`MIN_SYNC_BASE`]; callers check these first.
pub fn encode(out: &mut Vec<u8>, lsn: Lsn, payload: &[u8], sync_base: u32) {
    encode_with_crc(out, lsn, payload, crc32c::crc32c(payload), sync_base);
}

/// Like [`encode`], with the payload's CRC32C already computed by the caller (so it can be done
/// outside a lock). Reserves room for the whole frame first, so a caller that reserved capacity
/// for its buffer never reallocates here.
pub fn encode_with_crc(
    out: &mut Vec<u8>,
    lsn: Lsn,
    payload: &[u8],
    payload_crc: u32,
    sync_base: u32,
) {
    let len = check_encodable(lsn, payload);
    assert!(
        sync_base >= MIN_SYNC_BASE,
        "sync base {sync_base} is inside the segment header"
    );
    out.reserve(HEADER_BYTES + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&checksum(payload_crc, len, lsn, sync_base).to_le_bytes());
    out.extend_from_slice(&lsn.get().to_le_bytes());
    out.extend_from_slice(&sync_base.to_le_bytes());
    out.extend_from_slice(payload);
}

/// The payload length as stored, after checking what every encoder requires.
pub(crate) fn check_encodable(lsn: Lsn, payload: &[u8]) -> u32 {
    assert!(lsn != Lsn::ZERO, "LSN 0 names no record");
    assert!(lsn <= Lsn::MAX, "LSN {} is reserved", u64::MAX);
    u32::try_from(payload.len())
        .ok()
        .filter(|len| *len <= MAX_PAYLOAD_BYTES)
        .expect("payload larger than MAX_PAYLOAD_BYTES")
}

/// Decodes the frame of `layout` at the start of `buf`, accepting payloads of at most
/// `max_payload` bytes.
pub fn decode_with_limit(layout: Layout, buf: &[u8], max_payload: u32) -> Decoded<'_> {
    let header_bytes = layout.header_bytes();
    let Some(header) = buf.get(..header_bytes) else {
        // A blank prefix of a header is still unwritten space, not a torn record.
        return if buf.iter().all(|&b| b == 0) && !buf.is_empty() {
            Decoded::Unwritten
        } else {
            Decoded::Incomplete {
                needed: header_bytes,
            }
        };
    };
    let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    let stored = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let lsn = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    let sync_base = match layout {
        Layout::V1 => None,
        Layout::V2 => Some(u32::from_le_bytes(
            header[16..20].try_into().expect("4 bytes"),
        )),
    };
    if lsn == 0 {
        return if len == 0 && stored == 0 && sync_base.unwrap_or(0) == 0 {
            Decoded::Unwritten
        } else {
            Decoded::Rejected(Rejection::ZeroLsn)
        };
    }
    if lsn > Lsn::MAX.get() {
        // Accepting it would make the reader's next expected LSN overflow (found by the
        // `segment_scan` fuzz target).
        return Decoded::Rejected(Rejection::ReservedLsn);
    }
    if len > max_payload.min(MAX_PAYLOAD_BYTES) {
        return Decoded::Rejected(Rejection::ImplausibleLength { length: len });
    }
    if let Some(base) = sync_base.filter(|&base| base < MIN_SYNC_BASE) {
        return Decoded::Rejected(Rejection::ImplausibleSyncBase { sync_base: base });
    }
    let end = header_bytes + len as usize;
    let Some(payload) = buf.get(header_bytes..end) else {
        return Decoded::Incomplete { needed: end };
    };
    let payload_crc = crc32c::crc32c(payload);
    let lsn = Lsn::new(lsn);
    let computed = match sync_base {
        Some(base) => checksum(payload_crc, len, lsn, base),
        None => checksum_v1(payload_crc, len, lsn),
    };
    if computed != stored {
        return Decoded::Rejected(Rejection::ChecksumMismatch { stored, computed });
    }
    Decoded::Record(FrameRecord {
        lsn,
        payload,
        sync_base,
    })
}

/// Decodes the frame of `layout` at the start of `buf` with the format's own length limit.
pub fn decode(layout: Layout, buf: &[u8]) -> Decoded<'_> {
    decode_with_limit(layout, buf, MAX_PAYLOAD_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resync::{encode_v1, find_next_valid};
    use proptest::prelude::*;

    fn framed(lsn: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(&mut out, Lsn::new(lsn), payload, MIN_SYNC_BASE);
        out
    }

    fn framed_v1(lsn: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_v1(&mut out, Lsn::new(lsn), payload);
        out
    }

    fn layouts() -> impl Strategy<Value = Layout> {
        prop_oneof![Just(Layout::V1), Just(Layout::V2)]
    }

    fn framed_as(layout: Layout, lsn: u64, payload: &[u8], sync_base: u32) -> Vec<u8> {
        let mut out = Vec::new();
        match layout {
            Layout::V1 => encode_v1(&mut out, Lsn::new(lsn), payload),
            Layout::V2 => encode(&mut out, Lsn::new(lsn), payload, sync_base),
        }
        out
    }

    #[test]
    fn the_v2_header_is_laid_out_as_documented() {
        let bytes = {
            let mut out = Vec::new();
            encode(&mut out, Lsn::new(0x0102_0304), b"abc", 0x0A0B_0C0D);
            out
        };
        assert_eq!(bytes.len(), 23);
        assert_eq!(&bytes[0..4], &3u32.to_le_bytes());
        assert_eq!(&bytes[8..16], &0x0102_0304u64.to_le_bytes());
        assert_eq!(&bytes[16..20], &0x0A0B_0C0Du32.to_le_bytes());
        assert_eq!(&bytes[20..], b"abc");
        // The CRC as specified: payload, then bytes 0..4, then bytes 8..20.
        let mut covered = b"abc".to_vec();
        covered.extend_from_slice(&bytes[0..4]);
        covered.extend_from_slice(&bytes[8..20]);
        assert_eq!(&bytes[4..8], &crc32c::crc32c(&covered).to_le_bytes());
    }

    #[test]
    fn the_v1_header_is_laid_out_as_documented() {
        let bytes = framed_v1(9, b"xy");
        assert_eq!(bytes.len(), 18);
        let mut covered = b"xy".to_vec();
        covered.extend_from_slice(&bytes[0..4]);
        covered.extend_from_slice(&bytes[8..16]);
        assert_eq!(&bytes[4..8], &crc32c::crc32c(&covered).to_le_bytes());
        match decode(Layout::V1, &bytes) {
            Decoded::Record(rec) => {
                assert_eq!(
                    (rec.lsn, rec.payload, rec.sync_base),
                    (Lsn::new(9), &b"xy"[..], None)
                );
                assert_eq!(rec.frame_len(), 18);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_frame_is_only_a_record_in_its_own_layout() {
        let v2 = framed(5, b"payload");
        assert!(!matches!(decode(Layout::V1, &v2), Decoded::Record(_)));
        let v1 = framed_v1(5, b"payload");
        assert!(!matches!(decode(Layout::V2, &v1), Decoded::Record(_)));
    }

    #[test]
    fn blank_space_is_unwritten_not_a_record() {
        for layout in [Layout::V1, Layout::V2] {
            assert_eq!(decode(layout, &[0u8; 64]), Decoded::Unwritten);
            assert_eq!(decode(layout, &[0u8; 5]), Decoded::Unwritten);
            assert_eq!(
                decode(layout, &[]),
                Decoded::Incomplete {
                    needed: layout.header_bytes()
                }
            );
        }
        // A sync base alone is not blank.
        let mut header = [0u8; HEADER_BYTES];
        header[16] = 1;
        assert_eq!(
            decode(Layout::V2, &header),
            Decoded::Rejected(Rejection::ZeroLsn)
        );
    }

    #[test]
    fn a_sync_base_inside_the_segment_header_is_rejected() {
        let mut bytes = framed(3, b"abc");
        let crc = checksum(crc32c::crc32c(b"abc"), 3, Lsn::new(3), 255);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        bytes[16..20].copy_from_slice(&255u32.to_le_bytes());
        assert_eq!(
            decode(Layout::V2, &bytes),
            Decoded::Rejected(Rejection::ImplausibleSyncBase { sync_base: 255 })
        );
    }

    #[test]
    #[should_panic(expected = "inside the segment header")]
    fn a_sync_base_inside_the_segment_header_cannot_be_encoded() {
        encode(&mut Vec::new(), Lsn::new(1), b"", 12);
    }

    #[test]
    fn a_frame_from_another_lsn_or_sync_base_does_not_pass() {
        let mut bytes = framed(7, b"hello");
        bytes[8] = 8; // same payload and CRC, LSN rewritten
        assert!(matches!(
            decode(Layout::V2, &bytes),
            Decoded::Rejected(Rejection::ChecksumMismatch { .. })
        ));
        let mut bytes = framed(7, b"hello");
        bytes[18] ^= 1; // sync base rewritten (to one that is plausible)
        assert!(matches!(
            decode(Layout::V2, &bytes),
            Decoded::Rejected(Rejection::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn the_reserved_lsn_is_never_a_record() {
        let mut bytes = framed(Lsn::MAX.get(), b"last");
        assert!(matches!(decode(Layout::V2, &bytes), Decoded::Record(rec) if rec.lsn == Lsn::MAX));
        // The same frame one LSN later, with a checksum that matches it.
        let crc = checksum(
            crc32c::crc32c(b"last"),
            4,
            Lsn::new(u64::MAX),
            MIN_SYNC_BASE,
        );
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            decode(Layout::V2, &bytes),
            Decoded::Rejected(Rejection::ReservedLsn)
        );
        assert_eq!(
            find_next_valid(Layout::V2, &bytes, 0, Lsn::FIRST, 1024),
            None
        );
    }

    #[test]
    #[should_panic(expected = "reserved")]
    fn the_reserved_lsn_cannot_be_encoded() {
        framed(u64::MAX, b"");
    }

    #[test]
    fn resync_finds_the_next_record_after_garbage() {
        for layout in [Layout::V1, Layout::V2] {
            let mut bytes = framed_as(layout, 1, b"one", 300);
            let second_at = bytes.len() + 5;
            bytes.extend_from_slice(&[0xAB; 5]);
            bytes.extend_from_slice(&framed_as(layout, 2, b"two", 300));
            assert_eq!(
                find_next_valid(layout, &bytes, 1, Lsn::new(2), 1024),
                Some(second_at)
            );
            assert_eq!(find_next_valid(layout, &bytes, 1, Lsn::new(3), 1024), None);
        }
    }

    proptest! {
        #[test]
        fn frames_round_trip(
            layout in layouts(),
            lsn in 1..=Lsn::MAX.get(),
            sync_base in MIN_SYNC_BASE..=u32::MAX,
            payload in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let bytes = framed_as(layout, lsn, &payload, sync_base);
            prop_assert_eq!(bytes.len(), layout.frame_len(payload.len()));
            match decode(layout, &bytes) {
                Decoded::Record(rec) => {
                    prop_assert_eq!(rec.lsn, Lsn::new(lsn));
                    prop_assert_eq!(rec.payload, &payload[..]);
                    prop_assert_eq!(rec.layout(), layout);
                    let expected_base = (layout == Layout::V2).then_some(sync_base);
                    prop_assert_eq!(rec.sync_base, expected_base);
                    prop_assert_eq!(rec.frame_len(), bytes.len());
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }

        #[test]
        fn every_single_bit_flip_is_detected(
            layout in layouts(),
            lsn in 1u64..1_000_000,
            payload in proptest::collection::vec(any::<u8>(), 0..200),
            bit in any::<proptest::sample::Index>(),
        ) {
            let mut bytes = framed_as(layout, lsn, &payload, 4096);
            let bit = bit.index(bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(!matches!(decode(layout, &bytes), Decoded::Record(_)), "flip of bit {} accepted", bit);
        }

        #[test]
        fn every_cut_is_incomplete_never_a_record(
            layout in layouts(),
            payload in proptest::collection::vec(any::<u8>(), 1..200),
            cut in any::<proptest::sample::Index>(),
        ) {
            let bytes = framed_as(layout, 3, &payload, 256);
            let cut = cut.index(bytes.len());
            prop_assert!(!matches!(decode(layout, &bytes[..cut]), Decoded::Record(_)));
        }

        #[test]
        fn decode_never_panics(layout in layouts(), bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = decode(layout, &bytes);
            let _ = find_next_valid(layout, &bytes, 0, Lsn::new(1), 64);
        }
    }
}
