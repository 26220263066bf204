//! The daemon's side of an entry: every check it makes, on its private copy, before it believes
//! one. Nothing here trusts a byte the client wrote until it is checked.

use super::codes::{durability_from_code, EntryKind, RingError};
use super::layout::*;
use super::offsets::*;
use crate::message::Durability;

/// The CRC32C of an entry header: bytes 0..4 (the length) and 8..40 (everything after the CRC).
pub(crate) fn header_crc(header: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&header[0..4]);
    crc32c::crc32c_append(crc, &header[8..ENTRY_HEADER_BYTES])
}

pub(crate) fn check_count(seq: u64, kind: EntryKind, count: u32) -> Result<(), RingError> {
    let fits = match kind {
        EntryKind::Append => count >= 1,
        EntryKind::Commit => count == 0,
    };
    if fits {
        Ok(())
    } else {
        Err(RingError::BadRecordCount { seq, kind, count })
    }
}

/// Checks a published `tail` against the daemon's own `head`: it may not go backwards, run more
/// than one area ahead, or leave the 8-byte grid. Returns the bytes published and unread.
///
/// # Errors
/// [`RingError::BadTail`].
pub fn check_published(head: u64, tail: u64, data_bytes: u64) -> Result<u64, RingError> {
    match tail.checked_sub(head) {
        Some(published) if published <= data_bytes && tail.is_multiple_of(ENTRY_ALIGN as u64) => {
            Ok(published)
        }
        _ => Err(RingError::BadTail {
            head,
            tail,
            data_bytes,
        }),
    }
}

/// What the first 4 bytes at `head` say is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryStart {
    /// A pad: skip this many bytes (to the end of the area).
    Pad(u64),
    /// An entry of this many bytes, which lies inside the area and the published bytes.
    Entry(usize),
}

/// Reads the first word at `head` and checks it against the area and the published bytes
/// (`published = tail - head`, as returned by [`check_published`]) before anything is copied.
///
/// # Errors
/// [`RingError::BadPad`] for a pad at position 0 or one not wholly published;
/// [`RingError::BadEntryLength`] for a length off the 8-byte grid, shorter than a header,
/// running past the end of the area, or past the published bytes.
pub fn check_entry_start(
    first_word: [u8; 4],
    head: u64,
    published: u64,
    data_bytes: u64,
) -> Result<EntryStart, RingError> {
    let entry_len = u32::from_le_bytes(first_word);
    let position = head & (data_bytes - 1);
    let room = data_bytes - position;
    if entry_len == PAD_MARKER {
        if position == 0 || room > published {
            return Err(RingError::BadPad {
                at: head,
                needed: room,
                published,
            });
        }
        return Ok(EntryStart::Pad(room));
    }
    let len = u64::from(entry_len);
    if !len.is_multiple_of(ENTRY_ALIGN as u64)
        || len < ENTRY_HEADER_BYTES as u64
        || len > room
        || len > published
    {
        return Err(RingError::BadEntryLength {
            at: head,
            entry_len,
            published,
        });
    }
    Ok(EntryStart::Entry(entry_len as usize))
}

/// An entry the daemon has checked, borrowed from its private copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    pub seq: u64,
    pub handle: u32,
    pub kind: EntryKind,
    pub durability: Durability,
    pub lsn: u64,
    /// Number of records (0 for a commit).
    pub count: u32,
    /// The whole entry, as copied.
    bytes: &'a [u8],
}

impl<'a> Entry<'a> {
    /// The entry's length in the ring (`entry_len`).
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Never true: an entry holds at least its header. (For clippy's `len_without_is_empty`.)
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The records in order, each as `(payload, CRC32C of the payload)`; every one was checked.
    pub fn records(&self) -> Records<'a> {
        Records {
            rest: &self.bytes[ENTRY_HEADER_BYTES..],
            left: self.count,
        }
    }

    /// The whole entry as it was copied and checked.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// The records of a checked [`Entry`].
#[derive(Clone, Debug)]
pub struct Records<'a> {
    rest: &'a [u8],
    left: u32,
}

impl<'a> Iterator for Records<'a> {
    type Item = (&'a [u8], u32);

    fn next(&mut self) -> Option<(&'a [u8], u32)> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let len = read_u32(self.rest, 0) as usize;
        let crc = read_u32(self.rest, 4);
        let payload = &self.rest[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + len];
        self.rest = &self.rest[record_bytes(len)..];
        Some((payload, crc))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for Records<'_> {}

/// Checks one entry, exactly `bytes` long, that the daemon copied out of the ring into memory
/// the client cannot reach, and returns it. Checking the private copy, never the shared bytes,
/// is what makes a concurrent wild write by the client harmless: what was checked is what is
/// used.
///
/// There is no separate limit on the record count: every record takes at least 8 bytes, so
/// the count is bounded by the length, and the records must fill it exactly.
///
/// # Errors
/// Every violation of the invariants in the module documentation, each naming the seq and
/// where in the entry.
pub fn parse_entry(bytes: &[u8], expected_seq: u64) -> Result<Entry<'_>, RingError> {
    if bytes.len() < ENTRY_HEADER_BYTES {
        return Err(RingError::Truncated { len: bytes.len() });
    }
    let field = read_u32(bytes, 0);
    if field as usize != bytes.len() {
        return Err(RingError::LengthMismatch {
            field,
            copied: bytes.len(),
        });
    }
    let seq = read_u64(bytes, 8);
    let stored = read_u32(bytes, 4);
    let computed = header_crc(bytes);
    if stored != computed {
        return Err(RingError::BadHeaderCrc {
            seq,
            stored,
            computed,
        });
    }
    if seq != expected_seq {
        return Err(RingError::WrongSeq {
            expected: expected_seq,
            found: seq,
        });
    }
    let kind = EntryKind::from_code(bytes[20]).ok_or(RingError::UnknownKind {
        seq,
        kind: bytes[20],
    })?;
    let durability = durability_from_code(bytes[21]).ok_or(RingError::UnknownDurability {
        seq,
        code: bytes[21],
    })?;
    if bytes[22..24] != [0, 0] {
        return Err(RingError::NonZeroField {
            seq,
            field: "reserved (22..24)",
        });
    }
    if bytes[28..32] != [0; 4] {
        return Err(RingError::NonZeroField {
            seq,
            field: "reserved (28..32)",
        });
    }
    let count = read_u32(bytes, 24);
    check_count(seq, kind, count)?;
    let lsn = read_u64(bytes, 32);
    if kind == EntryKind::Append && lsn != 0 {
        return Err(RingError::NonZeroField { seq, field: "lsn" });
    }
    let mut at = ENTRY_HEADER_BYTES;
    for index in 0..count {
        let overrun = RingError::RecordOverrun {
            seq,
            index,
            offset: at,
        };
        if bytes.len() - at < RECORD_HEADER_BYTES {
            return Err(overrun);
        }
        let len = read_u32(bytes, at) as usize;
        let stored = read_u32(bytes, at + 4);
        if record_bytes(len) > bytes.len() - at {
            return Err(overrun);
        }
        let body = at + RECORD_HEADER_BYTES;
        let end = at + record_bytes(len);
        if bytes[body + len..end].iter().any(|&b| b != 0) {
            return Err(RingError::NonZeroPadding { seq, index });
        }
        let computed = crc32c::crc32c(&bytes[body..body + len]);
        if stored != computed {
            return Err(RingError::BadPayloadCrc {
                seq,
                index,
                stored,
                computed,
            });
        }
        at = end;
    }
    if at != bytes.len() {
        return Err(RingError::TrailingBytes {
            seq,
            records_end: at,
            entry_len: bytes.len(),
        });
    }
    Ok(Entry {
        seq,
        handle: read_u32(bytes, 16),
        kind,
        durability,
        lsn,
        count,
        bytes,
    })
}
