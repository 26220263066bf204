//! The synced-end mark: a log's durable record of how far its newest segment was synced.
//!
//! Frames carry a sync base (`frame`), but that tells recovery only about syncs that returned
//! *before the next frame was framed*: nothing in the segment says that the last sync returned.
//! So damage inside the last synced write looks exactly like a torn write. The mark closes that
//! gap: after an fdatasync of the newest segment returns, the writer records "segment S is
//! durable below offset O" in the log's `SYNCED` file and syncs that file. Recovery then calls
//! any bad byte below O corruption, never a torn tail.
//!
//! Layout (`docs/FORMAT.md`, "The synced-end mark"), little-endian, in a file of two 512-byte
//! sectors; slot *i* is at offset 512·*i*, and the writer alternates between them so that a torn
//! write of one slot leaves the other whole:
//!
//! ```text
//! 0       8        10        12        20              28              36      40
//! | magic | version| reserved| seq     | segment start | synced offset | CRC32C |
//! ```
//!
//! The mark with the highest sequence number among the slots whose checksum holds is the mark;
//! a file with no valid slot (or none at all, as in logs written before the mark) claims
//! nothing. Pure: bytes in, values out.

use crate::lsn::Lsn;

/// The file in a log directory that holds the mark.
pub const FILE_NAME: &str = "SYNCED";
/// Bytes of one slot.
pub const SLOT_BYTES: usize = 40;
/// Distance between slots: each in its own 512-byte sector.
pub const SLOT_STRIDE: u64 = 512;
/// Number of slots, and the file's length.
pub const SLOTS: u64 = 2;
pub const FILE_BYTES: u64 = SLOT_STRIDE * SLOTS;

const MAGIC: &[u8; 8] = b"STELASYN";
const VERSION: u16 = 1;

/// One mark: segment `segment_start` was durable below `synced_offset` (a returned fdatasync
/// covered every byte below it), the `seq`-th mark written to the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncedEnd {
    pub seq: u64,
    pub segment_start: Lsn,
    pub synced_offset: u64,
}

/// Why a slot does not hold a mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    #[error("slot shorter than {SLOT_BYTES} bytes")]
    Short,
    #[error("empty slot")]
    Empty,
    #[error("bad magic")]
    Magic,
    #[error("unknown version {0}")]
    Version(u16),
    #[error("checksum mismatch")]
    Checksum,
    #[error("segment start 0 names no segment")]
    ZeroStart,
}

impl SyncedEnd {
    /// The slot bytes of this mark.
    pub fn encode(&self) -> [u8; SLOT_BYTES] {
        let mut out = [0u8; SLOT_BYTES];
        out[0..8].copy_from_slice(MAGIC);
        out[8..10].copy_from_slice(&VERSION.to_le_bytes());
        out[12..20].copy_from_slice(&self.seq.to_le_bytes());
        out[20..28].copy_from_slice(&self.segment_start.get().to_le_bytes());
        out[28..36].copy_from_slice(&self.synced_offset.to_le_bytes());
        let crc = crc32c::crc32c(&out[..36]);
        out[36..40].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a slot (its first [`SLOT_BYTES`] bytes; the rest of the sector is ignored).
    ///
    /// # Errors
    /// A [`SlotError`] saying why the slot holds no mark.
    pub fn decode(bytes: &[u8]) -> Result<SyncedEnd, SlotError> {
        let slot = bytes.get(..SLOT_BYTES).ok_or(SlotError::Short)?;
        if slot.iter().all(|&b| b == 0) {
            return Err(SlotError::Empty);
        }
        if &slot[0..8] != MAGIC {
            return Err(SlotError::Magic);
        }
        let u64_at = |at: usize| u64::from_le_bytes(slot[at..at + 8].try_into().expect("8 bytes"));
        let version = u16::from_le_bytes([slot[8], slot[9]]);
        if version != VERSION {
            return Err(SlotError::Version(version));
        }
        let stored = u32::from_le_bytes(slot[36..40].try_into().expect("4 bytes"));
        if stored != crc32c::crc32c(&slot[..36]) {
            return Err(SlotError::Checksum);
        }
        let start = u64_at(20);
        if start == 0 {
            return Err(SlotError::ZeroStart);
        }
        Ok(SyncedEnd {
            seq: u64_at(12),
            segment_start: Lsn::new(start),
            synced_offset: u64_at(28),
        })
    }

    /// The slot this mark goes to: they alternate with the sequence number.
    pub fn slot_offset(&self) -> u64 {
        (self.seq % SLOTS) * SLOT_STRIDE
    }
}

/// The mark a `SYNCED` file's bytes hold: the valid slot with the highest sequence number, or
/// `None` when no slot is valid (a missing or short file included).
pub fn newest(file: &[u8]) -> Option<SyncedEnd> {
    (0..SLOTS)
        .filter_map(|slot| file.get((slot * SLOT_STRIDE) as usize..))
        .filter_map(|bytes| SyncedEnd::decode(bytes).ok())
        .max_by_key(|mark| mark.seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn file_with(marks: &[SyncedEnd]) -> Vec<u8> {
        let mut file = vec![0u8; FILE_BYTES as usize];
        for mark in marks {
            let at = mark.slot_offset() as usize;
            file[at..at + SLOT_BYTES].copy_from_slice(&mark.encode());
        }
        file
    }

    fn mark(seq: u64, offset: u64) -> SyncedEnd {
        SyncedEnd {
            seq,
            segment_start: Lsn::new(41),
            synced_offset: offset,
        }
    }

    #[test]
    fn the_newest_valid_slot_wins_and_a_torn_one_falls_back() {
        let mut file = file_with(&[mark(6, 1000), mark(7, 2000)]);
        assert_eq!(newest(&file), Some(mark(7, 2000)));
        // Slot of seq 7 torn: the older mark is what is left, never garbage.
        file[SLOT_STRIDE as usize + 30] ^= 0x10;
        assert_eq!(newest(&file), Some(mark(6, 1000)));
        assert_eq!(newest(&[]), None);
        assert_eq!(newest(&[0; 1024]), None);
    }

    proptest! {
        /// Every mark round-trips, and any single flipped bit makes its slot invalid.
        #[test]
        fn marks_round_trip_and_any_flip_is_rejected(
            seq in any::<u64>(),
            start in 1u64..,
            offset in any::<u64>(),
            bit in 0usize..SLOT_BYTES * 8,
        ) {
            let m = SyncedEnd { seq, segment_start: Lsn::new(start), synced_offset: offset };
            let mut bytes = m.encode();
            prop_assert_eq!(SyncedEnd::decode(&bytes), Ok(m));
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(SyncedEnd::decode(&bytes).is_err());
        }

        /// Arbitrary bytes never panic, and what decodes re-encodes to the slot.
        #[test]
        fn arbitrary_slots_decode_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(m) = SyncedEnd::decode(&bytes) {
                prop_assert_eq!(&m.encode()[..], &bytes[..SLOT_BYTES]);
            }
            let _ = newest(&bytes);
        }
    }
}
