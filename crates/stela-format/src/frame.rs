//! Record frames: the unit the log writes, checksums and recovers.
//!
//! ```text
//! offset  size  field
//!      0     4  payload length in bytes, u32 little-endian
//!      4     4  CRC32C of payload ++ bytes 0..4 ++ bytes 8..16, u32 little-endian
//!      8     8  LSN of the record, u64 little-endian (never 0, never u64::MAX)
//!     16     n  payload (the codec's bytes)
//! ```
//!
//! Why these fields:
//! - The CRC covers the payload *and* the length and LSN, so a changed length cannot make the
//!   reader frame garbage as a record, and a frame left behind by an earlier use of the same bytes
//!   (same position, different LSN) can never pass as the record the reader expects.
//! - The LSN is stored, not implied, so a scan that lost its place (after a bad frame) can
//!   recognise a real record at any byte offset without knowing which LSN to expect there.
//! - The CRC is taken over the payload first so a writer can checksum the payload before it
//!   knows the LSN, and only fold in the 12 header bytes once the LSN is assigned.
//! - Sixteen zero bytes are never a frame (LSN 0 names no record): segments are preallocated and
//!   read back as zeros where nothing was written, and that is how the end of the data is seen.

use crate::lsn::Lsn;

/// Bytes before the payload.
pub const HEADER_BYTES: usize = 16;

/// The largest payload the format allows. A length above this is treated as garbage, which
/// bounds how far a corrupted length can make a reader look.
pub const MAX_PAYLOAD_BYTES: u32 = 256 << 20;

/// A frame that checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRecord<'a> {
    pub lsn: Lsn,
    pub payload: &'a [u8],
}

impl FrameRecord<'_> {
    /// Bytes the whole frame occupies.
    pub fn frame_len(&self) -> usize {
        HEADER_BYTES + self.payload.len()
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
    /// Sixteen zero bytes: space that was never written.
    Unwritten,
    /// The buffer ends before the frame does. At the end of a file this is a torn write; in the
    /// middle of a read it means "read more".
    Incomplete { needed: usize },
    /// The bytes are not a record.
    Rejected(Rejection),
}

/// The checksum of a frame, from the CRC of its payload and its header fields.
pub fn checksum(payload_crc: u32, payload_len: u32, lsn: Lsn) -> u32 {
    let mut tail = [0u8; 12];
    tail[..4].copy_from_slice(&payload_len.to_le_bytes());
    tail[4..].copy_from_slice(&lsn.get().to_le_bytes());
    crc32c::crc32c_append(payload_crc, &tail)
}

/// Appends the frame of `payload` at `lsn` to `out`.
///
/// # Panics
/// If `lsn` is 0 or above [`Lsn::MAX`], or the payload exceeds [`MAX_PAYLOAD_BYTES`]; callers
/// check these first.
pub fn encode(out: &mut Vec<u8>, lsn: Lsn, payload: &[u8]) {
    encode_with_crc(out, lsn, payload, crc32c::crc32c(payload));
}

/// Like [`encode`], with the payload's CRC32C already computed by the caller (so it can be done
/// outside a lock).
pub fn encode_with_crc(out: &mut Vec<u8>, lsn: Lsn, payload: &[u8], payload_crc: u32) {
    assert!(lsn != Lsn::ZERO, "LSN 0 names no record");
    assert!(lsn <= Lsn::MAX, "LSN {} is reserved", u64::MAX);
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|len| *len <= MAX_PAYLOAD_BYTES)
        .expect("payload larger than MAX_PAYLOAD_BYTES");
    out.reserve(HEADER_BYTES + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&checksum(payload_crc, len, lsn).to_le_bytes());
    out.extend_from_slice(&lsn.get().to_le_bytes());
    out.extend_from_slice(payload);
}

/// Decodes the frame at the start of `buf`, accepting payloads of at most `max_payload` bytes.
pub fn decode_with_limit(buf: &[u8], max_payload: u32) -> Decoded<'_> {
    let Some(header) = buf.get(..HEADER_BYTES) else {
        // A blank prefix of a header is still unwritten space, not a torn record.
        return if buf.iter().all(|&b| b == 0) && !buf.is_empty() {
            Decoded::Unwritten
        } else {
            Decoded::Incomplete {
                needed: HEADER_BYTES,
            }
        };
    };
    let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    let stored = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let lsn = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    if lsn == 0 {
        return if len == 0 && stored == 0 {
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
    let end = HEADER_BYTES + len as usize;
    let Some(payload) = buf.get(HEADER_BYTES..end) else {
        return Decoded::Incomplete { needed: end };
    };
    let computed = checksum(crc32c::crc32c(payload), len, Lsn::new(lsn));
    if computed != stored {
        return Decoded::Rejected(Rejection::ChecksumMismatch { stored, computed });
    }
    Decoded::Record(FrameRecord {
        lsn: Lsn::new(lsn),
        payload,
    })
}

/// Decodes the frame at the start of `buf` with the format's own length limit.
pub fn decode(buf: &[u8]) -> Decoded<'_> {
    decode_with_limit(buf, MAX_PAYLOAD_BYTES)
}

/// Finds the first offset at or after `from` where a whole, valid frame with an LSN of at least
/// `min_lsn` starts. Used after a bad frame, to tell a torn tail (nothing valid follows) from
/// corruption in the middle of the log (valid records follow). Tries every byte offset, because
/// after a bad length field the reader no longer knows where frames start.
pub fn find_next_valid(buf: &[u8], from: usize, min_lsn: Lsn, max_payload: u32) -> Option<usize> {
    let last_start = buf.len().checked_sub(HEADER_BYTES)?;
    (from..=last_start).find(|&offset| {
        // Cheap checks first: most offsets fail on the LSN range or the length.
        let lsn = u64::from_le_bytes(buf[offset + 8..offset + 16].try_into().expect("8 bytes"));
        if lsn < min_lsn.get().max(1) {
            return false;
        }
        matches!(
            decode_with_limit(&buf[offset..], max_payload),
            Decoded::Record(_)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(lsn: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(&mut out, Lsn::new(lsn), payload);
        out
    }

    #[test]
    fn blank_space_is_unwritten_not_a_record() {
        assert_eq!(decode(&[0u8; 64]), Decoded::Unwritten);
        assert_eq!(decode(&[0u8; 5]), Decoded::Unwritten);
        assert_eq!(decode(&[]), Decoded::Incomplete { needed: 16 });
    }

    #[test]
    fn a_frame_from_another_lsn_does_not_pass() {
        let mut bytes = framed(7, b"hello");
        bytes[8] = 8; // same payload and CRC, LSN rewritten
        assert!(matches!(
            decode(&bytes),
            Decoded::Rejected(Rejection::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn the_reserved_lsn_is_never_a_record() {
        let mut bytes = framed(Lsn::MAX.get(), b"last");
        assert!(matches!(decode(&bytes), Decoded::Record(rec) if rec.lsn == Lsn::MAX));
        // The same frame one LSN later, with a checksum that matches it.
        let crc = checksum(crc32c::crc32c(b"last"), 4, Lsn::new(u64::MAX));
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(&bytes), Decoded::Rejected(Rejection::ReservedLsn));
        assert_eq!(find_next_valid(&bytes, 0, Lsn::FIRST, 1024), None);
    }

    #[test]
    #[should_panic(expected = "reserved")]
    fn the_reserved_lsn_cannot_be_encoded() {
        framed(u64::MAX, b"");
    }

    #[test]
    fn resync_finds_the_next_record_after_garbage() {
        let mut bytes = framed(1, b"one");
        let second_at = bytes.len() + 5;
        bytes.extend_from_slice(&[0xAB; 5]);
        bytes.extend_from_slice(&framed(2, b"two"));
        assert_eq!(
            find_next_valid(&bytes, 1, Lsn::new(2), 1024),
            Some(second_at)
        );
        assert_eq!(find_next_valid(&bytes, 1, Lsn::new(3), 1024), None);
    }

    proptest! {
        #[test]
        fn frames_round_trip(lsn in 1..=Lsn::MAX.get(), payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let bytes = framed(lsn, &payload);
            match decode(&bytes) {
                Decoded::Record(rec) => {
                    prop_assert_eq!(rec.lsn, Lsn::new(lsn));
                    prop_assert_eq!(rec.payload, &payload[..]);
                    prop_assert_eq!(rec.frame_len(), bytes.len());
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }

        #[test]
        fn every_single_bit_flip_is_detected(
            lsn in 1u64..1_000_000,
            payload in proptest::collection::vec(any::<u8>(), 0..200),
            bit in any::<proptest::sample::Index>(),
        ) {
            let mut bytes = framed(lsn, &payload);
            let bit = bit.index(bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(!matches!(decode(&bytes), Decoded::Record(_)), "flip of bit {} accepted", bit);
        }

        #[test]
        fn every_cut_is_incomplete_never_a_record(
            payload in proptest::collection::vec(any::<u8>(), 1..200),
            cut in any::<proptest::sample::Index>(),
        ) {
            let bytes = framed(3, &payload);
            let cut = cut.index(bytes.len());
            prop_assert!(!matches!(decode(&bytes[..cut]), Decoded::Record(_)));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = decode(&bytes);
            let _ = find_next_valid(&bytes, 0, Lsn::new(1), 64);
        }
    }
}
