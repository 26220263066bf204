//! The ring's small vocabularies: what went wrong with bytes (`RingError`), why a daemon stopped
//! reading a ring (`FaultCode`), entry kinds and durability codes, completion statuses, and the
//! message area where the daemon explains a refusal.

use super::offsets::*;
use crate::message::{Durability, ErrorCode};
use thiserror::Error;

/// Why bytes are not a valid ring header, entry or publication; each names where it was found.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RingError {
    #[error("ring header magic is {found:02x?}, not \"STELARNG\"")]
    BadMagic { found: [u8; 8] },
    #[error("ring layout version {found} is not the supported {LAYOUT_VERSION}")]
    UnsupportedLayout { found: u32 },
    #[error("ring data area of {data_bytes} bytes is not a power of two in {MIN_DATA_BYTES}..={MAX_DATA_BYTES}")]
    BadDataBytes { data_bytes: u64 },
    #[error("ring has {slots} result slots, not a power of two in 1..={MAX_SLOTS}")]
    BadSlots { slots: u32 },
    #[error("ring region is {found} bytes, the header says {expected}")]
    BadRegionSize { found: u64, expected: u64 },
    #[error("ring tail {tail} is not an 8-aligned position within one area ({data_bytes} bytes) above head {head}")]
    BadTail {
        head: u64,
        tail: u64,
        data_bytes: u64,
    },
    #[error("entry at ring position {at} has entry_len {entry_len}: not a multiple of 8 of at least {ENTRY_HEADER_BYTES}, or past the end of the area or of the {published} published bytes")]
    BadEntryLength {
        at: u64,
        entry_len: u32,
        published: u64,
    },
    #[error("pad marker at ring position {at} is misplaced (position 0 of the area, or its {needed} bytes are not all published: {published})")]
    BadPad {
        at: u64,
        needed: u64,
        published: u64,
    },
    #[error("entry of {len} bytes is shorter than its {ENTRY_HEADER_BYTES}-byte header")]
    Truncated { len: usize },
    #[error("entry_len field says {field} bytes, {copied} were taken for the entry")]
    LengthMismatch { field: u32, copied: usize },
    #[error("entry header checksum mismatch (seq field {seq}): stored {stored:#010x}, computed {computed:#010x}")]
    BadHeaderCrc {
        seq: u64,
        stored: u32,
        computed: u32,
    },
    #[error("entry has seq {found}, the daemon expects {expected}")]
    WrongSeq { expected: u64, found: u64 },
    #[error("entry {seq} has unknown kind {kind}")]
    UnknownKind { seq: u64, kind: u8 },
    #[error("entry {seq} has unknown durability code {code}")]
    UnknownDurability { seq: u64, code: u8 },
    #[error("entry {seq}: field `{field}` must be zero")]
    NonZeroField { seq: u64, field: &'static str },
    #[error(
        "entry {seq} is a {kind:?} with {count} records (append needs at least one, commit none)"
    )]
    BadRecordCount {
        seq: u64,
        kind: EntryKind,
        count: u32,
    },
    #[error("entry {seq}: record {index} at entry offset {offset} runs past the entry's end")]
    RecordOverrun { seq: u64, index: u32, offset: usize },
    #[error("entry {seq}: the padding after record {index} is not zero")]
    NonZeroPadding { seq: u64, index: u32 },
    #[error(
        "entry {seq}: its records end at entry offset {records_end}, the entry at {entry_len}"
    )]
    TrailingBytes {
        seq: u64,
        records_end: usize,
        entry_len: usize,
    },
    #[error("entry {seq}: record {index} payload checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadPayloadCrc {
        seq: u64,
        index: u32,
        stored: u32,
        computed: u32,
    },
    #[error("an entry of {len} bytes does not fit a ring data area of {max} bytes")]
    EntryTooLarge { len: u64, max: u64 },
    #[error("entry needs {needed} bytes, the buffer has {available}")]
    BufferTooSmall { needed: usize, available: usize },
}

impl RingError {
    /// What the daemon writes into the `fault` word when this error stops a ring. Only the
    /// errors of the read path ([`check_published`], [`check_entry_start`], [`parse_entry`])
    /// happen there; the others map to [`FaultCode::Malformed`].
    pub fn fault_code(&self) -> FaultCode {
        match self {
            RingError::BadTail { .. } => FaultCode::BadTail,
            RingError::BadEntryLength { .. }
            | RingError::BadPad { .. }
            | RingError::LengthMismatch { .. } => FaultCode::BadLength,
            RingError::BadHeaderCrc { .. } => FaultCode::BadHeaderCrc,
            RingError::WrongSeq { .. } => FaultCode::WrongSeq,
            RingError::BadPayloadCrc { .. } => FaultCode::BadPayloadCrc,
            _ => FaultCode::Malformed,
        }
    }
}

/// Why the daemon stopped reading a ring: the value of the `fault` word (0 means none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum FaultCode {
    /// The published `tail` went backwards, past a whole area, or off the 8-byte grid.
    BadTail = 1,
    /// An entry's length (or a pad) does not fit the area or the published bytes.
    BadLength = 2,
    BadHeaderCrc = 3,
    /// An entry out of sequence: skipped, repeated or stale bytes.
    WrongSeq = 4,
    /// Any other structural check: unknown kind or durability, non-zero reserved bytes or
    /// padding, a record count that does not fit the kind or the length.
    Malformed = 5,
    BadPayloadCrc = 6,
    /// The daemon closed the ring on purpose (connection closed, shutdown, or the daemon chose
    /// to stop serving it); not the client's fault.
    Closed = 7,
}

impl FaultCode {
    pub fn from_u32(code: u32) -> Option<FaultCode> {
        Some(match code {
            1 => FaultCode::BadTail,
            2 => FaultCode::BadLength,
            3 => FaultCode::BadHeaderCrc,
            4 => FaultCode::WrongSeq,
            5 => FaultCode::Malformed,
            6 => FaultCode::BadPayloadCrc,
            7 => FaultCode::Closed,
            _ => return None,
        })
    }

    pub fn as_u32(self) -> u32 {
        self as u32
    }
}

/// The `lsn` of a commit entry that commits the log's end: every record the log holds when the
/// daemon reads the entry (never a real LSN: the largest is `u64::MAX - 1`). The completion
/// carries the LSN it stood for (0 for an empty log). A daemon older than this marker answers
/// `NotAppended`, which tells a client to ask the end on the socket instead.
pub const COMMIT_END: u64 = u64::MAX;

/// What a ring entry asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// Append the records, like the socket's `Append`.
    Append,
    /// Wait until every record up to `lsn` is at the durability, like the socket's `Commit`.
    Commit,
}

impl EntryKind {
    pub fn code(self) -> u8 {
        match self {
            EntryKind::Append => 1,
            EntryKind::Commit => 2,
        }
    }

    pub fn from_code(code: u8) -> Option<EntryKind> {
        match code {
            1 => Some(EntryKind::Append),
            2 => Some(EntryKind::Commit),
            _ => None,
        }
    }
}

/// The ring's one-byte code of a durability level.
pub fn durability_code(durability: Durability) -> u8 {
    match durability {
        Durability::Unsafe => 1,
        Durability::Buffered => 2,
        Durability::Disk => 3,
        Durability::Replicated => 4,
        Durability::All => 5,
    }
}

pub fn durability_from_code(code: u8) -> Option<Durability> {
    Some(match code {
        1 => Durability::Unsafe,
        2 => Durability::Buffered,
        3 => Durability::Disk,
        4 => Durability::Replicated,
        5 => Durability::All,
        _ => return None,
    })
}

/// The completion status that carries `code`.
pub fn status_of(code: ErrorCode) -> u32 {
    match code {
        ErrorCode::BadFrame => 1,
        ErrorCode::BadRequest => 2,
        ErrorCode::UnsupportedVersion => 3,
        ErrorCode::Unsupported => 4,
        ErrorCode::UnknownHandle => 5,
        ErrorCode::BadLogName => 6,
        ErrorCode::OpenFailed => 7,
        ErrorCode::RecordTooLarge => 8,
        ErrorCode::NotAppended => 9,
        ErrorCode::PowerFailing => 10,
        ErrorCode::ShuttingDown => 11,
        ErrorCode::Io => 12,
        ErrorCode::LogStopped => 13,
        ErrorCode::DiskFull => 14,
        ErrorCode::TooManyConnections => 15,
        ErrorCode::Timeout => 16,
        ErrorCode::LsnExhausted => 17,
        ErrorCode::Unauthenticated => 18,
        ErrorCode::Forbidden => 19,
        ErrorCode::LogInUse => 20,
        ErrorCode::NotPrimary => 21,
        ErrorCode::InDoubt => 22,
        ErrorCode::Unprotected => 23,
        ErrorCode::QuotaExceeded => 24,
    }
}

pub fn error_of_status(status: u32) -> Option<ErrorCode> {
    Some(match status {
        1 => ErrorCode::BadFrame,
        2 => ErrorCode::BadRequest,
        3 => ErrorCode::UnsupportedVersion,
        4 => ErrorCode::Unsupported,
        5 => ErrorCode::UnknownHandle,
        6 => ErrorCode::BadLogName,
        7 => ErrorCode::OpenFailed,
        8 => ErrorCode::RecordTooLarge,
        9 => ErrorCode::NotAppended,
        10 => ErrorCode::PowerFailing,
        11 => ErrorCode::ShuttingDown,
        12 => ErrorCode::Io,
        13 => ErrorCode::LogStopped,
        14 => ErrorCode::DiskFull,
        15 => ErrorCode::TooManyConnections,
        16 => ErrorCode::Timeout,
        17 => ErrorCode::LsnExhausted,
        18 => ErrorCode::Unauthenticated,
        19 => ErrorCode::Forbidden,
        20 => ErrorCode::LogInUse,
        21 => ErrorCode::NotPrimary,
        22 => ErrorCode::InDoubt,
        23 => ErrorCode::Unprotected,
        24 => ErrorCode::QuotaExceeded,
        _ => return None,
    })
}

/// The bytes of the message area for a refusal of entry `seq` (the text cut at a character
/// boundary to fit).
pub fn encode_message(seq: u64, text: &str) -> [u8; MESSAGE_BYTES] {
    let mut end = text.len().min(MESSAGE_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut area = [0u8; MESSAGE_BYTES];
    area[0..8].copy_from_slice(&seq.to_le_bytes());
    area[8..12].copy_from_slice(&(end as u32).to_le_bytes());
    area[16..16 + end].copy_from_slice(&text.as_bytes()[..end]);
    area
}

/// The seq and text of a message area (whatever bytes it holds: lengths are clamped, invalid
/// UTF-8 replaced).
pub fn decode_message(area: &[u8; MESSAGE_BYTES]) -> (u64, String) {
    let len = (read_u32(area, 8) as usize).min(MESSAGE_TEXT_BYTES);
    (
        read_u64(area, 0),
        String::from_utf8_lossy(&area[16..16 + len]).into_owned(),
    )
}
