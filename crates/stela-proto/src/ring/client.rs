//! What only the client does: encoding entries, checking a region it was handed, reading the
//! daemon's answers. Apart from what the daemon relies on ([`super::layout`], [`super::read`]).

use super::codes::error_of_status;
use super::codes::{durability_code, EntryKind, RingError};
use super::layout::*;
use super::offsets::*;
use super::read::{check_count, header_crc};
use crate::message::Durability;
use crate::message::ErrorCode;

/// The fields of an entry's header that the client chooses (the encoder adds length, CRC, seq
/// and count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    pub handle: u32,
    pub kind: EntryKind,
    pub durability: Durability,
    /// The LSN a commit waits for; must be 0 for an append.
    pub lsn: u64,
}

/// The `entry_len` of an entry holding `payloads`.
///
/// # Errors
/// [`RingError::EntryTooLarge`] if it does not fit the `entry_len` field (or a payload its
/// `len` field); no ring can hold such an entry ([`MAX_DATA_BYTES`] is far below).
pub fn entry_len(payloads: &[&[u8]]) -> Result<usize, RingError> {
    let mut len = ENTRY_HEADER_BYTES as u64;
    for payload in payloads {
        len += record_bytes(payload.len()) as u64;
    }
    if len >= u64::from(PAD_MARKER) {
        return Err(RingError::EntryTooLarge {
            len,
            max: MAX_DATA_BYTES,
        });
    }
    Ok(len as usize)
}

/// Writes one entry at the start of `out` and returns its length.
///
/// # Errors
/// [`RingError::BadRecordCount`] if the payloads do not fit the kind (an append needs at least
/// one, a commit none), [`RingError::NonZeroField`] for an append with an `lsn`,
/// [`RingError::EntryTooLarge`] as [`entry_len`], [`RingError::BufferTooSmall`] if `out` is
/// shorter than the entry. On error `out` is unchanged.
pub fn encode_entry(
    out: &mut [u8],
    seq: u64,
    header: &EntryHeader,
    payloads: &[&[u8]],
) -> Result<usize, RingError> {
    let len = check_entry(seq, header, payloads)?;
    let count = payloads.len() as u32;
    let Some(out) = out.get_mut(..len) else {
        return Err(RingError::BufferTooSmall {
            needed: len,
            available: out.len(),
        });
    };
    out[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    out[16..20].copy_from_slice(&header.handle.to_le_bytes());
    out[20] = header.kind.code();
    out[21] = durability_code(header.durability);
    out[22..24].fill(0);
    out[24..28].copy_from_slice(&count.to_le_bytes());
    out[28..32].fill(0);
    out[32..40].copy_from_slice(&header.lsn.to_le_bytes());
    let crc = header_crc(out);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    let mut at = ENTRY_HEADER_BYTES;
    for payload in payloads {
        let end = at + record_bytes(payload.len());
        out[at..at + 4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        out[at + 4..at + 8].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
        let body = at + RECORD_HEADER_BYTES;
        out[body..body + payload.len()].copy_from_slice(payload);
        out[body + payload.len()..end].fill(0);
        at = end;
    }
    debug_assert_eq!(at, len);
    Ok(len)
}

/// Checks that `payloads` suit `header` (as [`encode_entry`] and the parser require) and returns
/// the length of the entry they make, without writing anything.
///
/// # Errors
/// As [`encode_entry`], except [`RingError::BufferTooSmall`].
pub fn check_entry(seq: u64, header: &EntryHeader, payloads: &[&[u8]]) -> Result<usize, RingError> {
    let count = u32::try_from(payloads.len()).unwrap_or(u32::MAX);
    check_count(seq, header.kind, count)?;
    if header.kind == EntryKind::Append && header.lsn != 0 {
        return Err(RingError::NonZeroField { seq, field: "lsn" });
    }
    entry_len(payloads)
}

/// The 4 bytes a client writes where an entry did not fit before the end of the area.
pub fn pad_bytes() -> [u8; 4] {
    PAD_MARKER.to_le_bytes()
}

impl RingLayout {
    /// Reads line 0 of a header (at least its first 24 bytes) and checks it.
    ///
    /// # Errors
    /// [`RingError::BadMagic`], [`RingError::UnsupportedLayout`], or the errors of
    /// [`RingLayout::new`]; [`RingError::Truncated`] if fewer than 24 bytes are given.
    pub fn parse(line0: &[u8]) -> Result<RingLayout, RingError> {
        let Some(line0) = line0.get(..DATA_BYTES_OFFSET + 8) else {
            return Err(RingError::Truncated { len: line0.len() });
        };
        let magic: [u8; 8] = line0[MAGIC_OFFSET..MAGIC_OFFSET + 8]
            .try_into()
            .expect("8 bytes");
        if magic != MAGIC {
            return Err(RingError::BadMagic { found: magic });
        }
        let version = read_u32(line0, VERSION_OFFSET);
        if version != LAYOUT_VERSION {
            return Err(RingError::UnsupportedLayout { found: version });
        }
        RingLayout::new(
            read_u64(line0, DATA_BYTES_OFFSET),
            read_u32(line0, SLOT_COUNT_OFFSET),
        )
    }
}

impl Completion {
    pub fn is_ok(&self) -> bool {
        self.status == STATUS_OK
    }

    /// The error this completion reports; `None` when it is OK or the status is unknown.
    pub fn error_code(&self) -> Option<ErrorCode> {
        error_of_status(self.status)
    }
}

/// A result slot's seq and completion.
pub fn decode_result(slot: &[u8; RESULT_BYTES]) -> (u64, Completion) {
    (
        read_u64(slot, 0),
        Completion {
            first_lsn: read_u64(slot, 8),
            last_lsn: read_u64(slot, 16),
            status: read_u32(slot, 24),
            detail: read_u32(slot, 28),
        },
    )
}
