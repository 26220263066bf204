//! The shared-memory ring between a client and the daemon on one machine: where every word of the
//! region lives, the entry codec, and every check the daemon makes before it believes an entry.
//!
//! Pure, like the rest of this crate: bytes in, values out. `stela-net`'s `shm` module maps the
//! region, does the atomics and the sleeping, and calls these functions; the fuzz target
//! `ring_decode` feeds them arbitrary bytes. `docs/PROTOCOL.md` ("Shared-memory transport")
//! describes the protocol around them.
//!
//! # The region
//!
//! One memfd per connection: a 4096-byte header page, then the data area of `data_bytes` (a power
//! of two, 4 KiB to 64 MiB). Every group of header words sits on its own 64-byte cache line, so
//! the words one side writes in its fast path never share a line with the other side's.
//!
//! ```text
//! offset  size  field            written by   meaning
//! ---- line 0: immutable after creation -------------------------------------------------------
//!    0     8    magic            daemon       "STELARNG"
//!    8     4    version          daemon       LAYOUT_VERSION
//!   12     4    slots            daemon       result slots, a power of two, 1..=64
//!   16     8    data_bytes       daemon       size of the data area
//! ---- line 1: the client's ------------------------------------------------------------------
//!   64     8    tail             client       bytes published (monotonic; position = tail mod data_bytes)
//!   72     4    client_waiting   client       1 while the client sleeps (or is about to) on `wake`
//! ---- line 2: the daemon's ------------------------------------------------------------------
//!  128     8    head             daemon       bytes consumed; [tail, head + data_bytes) is free
//!  136     4    daemon_asleep    daemon       1 while the daemon sleeps: ring the doorbell
//! ---- line 3: completions (the daemon's) ------------------------------------------------------
//!  192     8    done_seq         daemon       every entry with seq <= done_seq is completed
//!  200     4    wake             daemon*      futex word, bumped after every change a client waits for
//!  204     4    fault            daemon       0, or a FaultCode: the daemon stopped reading this ring
//!  208     8    fault_seq        daemon       with fault: the first seq that will never be completed
//! ---- result slots ----------------------------------------------------------------------------
//!  256   32*n   slot[seq mod n]  daemon       seq u64, first_lsn u64, last_lsn u64, status u32, detail u32
//! 4096  data_bytes  data area    client       entries
//! ```
//! (*) the client also bumps `wake` once, when it learns that the daemon is gone, to wake itself.
//!
//! All integers are little-endian. The daemon never trusts a header word the client can write:
//! it keeps `head`, `done_seq` and the layout privately and reads only `tail` (checked with
//! [`check_published`]) and `client_waiting` (which at worst costs the client a wake-up).
//!
//! # Entries
//!
//! Entries are 8-byte aligned and never wrap: when an entry does not fit before the end of the
//! area, the client writes [`PAD_MARKER`] where it would have started and puts the entry at
//! position 0 (publishing both at once). An entry is a 40-byte header and `count` records:
//!
//! ```text
//! offset  size  field
//!    0     4    entry_len     total bytes, header included; a multiple of 8 (or PAD_MARKER)
//!    4     4    header_crc    CRC32C of bytes 0..4 and 8..40
//!    8     8    seq           1, 2, 3, ... per ring
//!   16     4    handle        the client's log handle on this connection
//!   20     1    kind          1 append, 2 commit
//!   21     1    durability    1 unsafe, 2 buffered, 3 disk, 4 replicated, 5 all
//!   22     2    reserved      zero
//!   24     4    count         records: at least 1 for append, 0 for commit
//!   28     4    reserved      zero
//!   32     8    lsn           commit: wait until this LSN; append: zero
//!   40          records, each: len u32, CRC32C(payload) u32, payload, zeros to a multiple of 8
//! ```
//!
//! Invariants the parser enforces (so that an entry is accepted only in its one canonical form,
//! and every single-bit flip of an encoded entry is rejected): the header CRC matches, `seq` is
//! the one the daemon expects next, kind and durability are known, reserved bytes and padding
//! are zero, `count` agrees with the kind, the records exactly fill `entry_len`, and every
//! payload matches its CRC.

use crate::message::{Durability, ErrorCode};
use thiserror::Error;

/// The first eight bytes of every ring region.
pub const MAGIC: [u8; 8] = *b"STELARNG";
/// The revision of this layout. A client refuses any other.
pub const LAYOUT_VERSION: u32 = 1;
/// The header page before the data area.
pub const HEADER_BYTES: usize = 4096;
/// The header groups its words by cache line.
pub const LINE_BYTES: usize = 64;
/// The data area's bounds (it is also a power of two).
pub const MIN_DATA_BYTES: u64 = 4096;
pub const MAX_DATA_BYTES: u64 = 64 << 20;
/// At most this many entries in flight per ring: the result slots fill the rest of the header.
pub const MAX_SLOTS: u32 = 64;

pub const MAGIC_OFFSET: usize = 0;
pub const VERSION_OFFSET: usize = 8;
pub const SLOT_COUNT_OFFSET: usize = 12;
pub const DATA_BYTES_OFFSET: usize = 16;
pub const TAIL_OFFSET: usize = LINE_BYTES;
pub const CLIENT_WAITING_OFFSET: usize = LINE_BYTES + 8;
pub const HEAD_OFFSET: usize = 2 * LINE_BYTES;
pub const DAEMON_ASLEEP_OFFSET: usize = 2 * LINE_BYTES + 8;
pub const DONE_SEQ_OFFSET: usize = 3 * LINE_BYTES;
pub const WAKE_OFFSET: usize = 3 * LINE_BYTES + 8;
pub const FAULT_OFFSET: usize = 3 * LINE_BYTES + 12;
pub const FAULT_SEQ_OFFSET: usize = 3 * LINE_BYTES + 16;
pub const RESULTS_OFFSET: usize = 4 * LINE_BYTES;
/// One result slot: seq, first_lsn, last_lsn, status, detail.
pub const RESULT_BYTES: usize = 32;
/// Where the data area starts in the region.
pub const DATA_OFFSET: usize = HEADER_BYTES;

/// Entries start, and are padded, on this boundary.
pub const ENTRY_ALIGN: usize = 8;
pub const ENTRY_HEADER_BYTES: usize = 40;
/// Before each payload: its length and its CRC32C.
pub const RECORD_HEADER_BYTES: usize = 8;
/// In place of `entry_len`: the rest of the area up to its end is unused; the next entry is at 0.
pub const PAD_MARKER: u32 = u32::MAX;

/// A completion status: the entry was accepted. Any other value is an error (see
/// [`Completion::error_code`]).
pub const STATUS_OK: u32 = 0;

/// Where the daemon explains its latest refusal: the entry's seq (u64), the text's length
/// (u32), zero (u32), then the text, UTF-8. Written before the refusal's `done_seq`; a client
/// reads it only for an entry whose completion is an error, and only if the seq matches.
pub const MESSAGE_OFFSET: usize = 3072;
pub const MESSAGE_BYTES: usize = HEADER_BYTES - MESSAGE_OFFSET;
const MESSAGE_TEXT_BYTES: usize = MESSAGE_BYTES - 16;

const _: () = assert!(RESULTS_OFFSET + MAX_SLOTS as usize * RESULT_BYTES <= MESSAGE_OFFSET);

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

/// The size of a ring: the parameters in line 0 of the header. A plain value; [`RingLayout::new`]
/// and [`RingLayout::parse`] check the bounds, while the ring code itself relies only on
/// `data_bytes` and `slots` being powers of two (a model checker may use a smaller area).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    pub data_bytes: u64,
    pub slots: u32,
}

impl RingLayout {
    /// # Errors
    /// [`RingError::BadDataBytes`] or [`RingError::BadSlots`] when out of bounds or not a power
    /// of two.
    pub fn new(data_bytes: u64, slots: u32) -> Result<RingLayout, RingError> {
        if !data_bytes.is_power_of_two() || !(MIN_DATA_BYTES..=MAX_DATA_BYTES).contains(&data_bytes)
        {
            return Err(RingError::BadDataBytes { data_bytes });
        }
        if !slots.is_power_of_two() || slots > MAX_SLOTS {
            return Err(RingError::BadSlots { slots });
        }
        Ok(RingLayout { data_bytes, slots })
    }

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

    /// Line 0 of the header for this layout (the rest of the header starts zeroed).
    pub fn encode_line0(&self) -> [u8; LINE_BYTES] {
        let mut line = [0u8; LINE_BYTES];
        line[MAGIC_OFFSET..MAGIC_OFFSET + 8].copy_from_slice(&MAGIC);
        line[VERSION_OFFSET..VERSION_OFFSET + 4].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
        line[SLOT_COUNT_OFFSET..SLOT_COUNT_OFFSET + 4].copy_from_slice(&self.slots.to_le_bytes());
        line[DATA_BYTES_OFFSET..DATA_BYTES_OFFSET + 8]
            .copy_from_slice(&self.data_bytes.to_le_bytes());
        line
    }

    /// Bytes of the whole region: header page and data area.
    pub fn region_bytes(&self) -> u64 {
        HEADER_BYTES as u64 + self.data_bytes
    }

    /// Where a monotonic byte counter (`head`, `tail`) points in the data area.
    pub fn position(&self, counter: u64) -> usize {
        (counter & (self.data_bytes - 1)) as usize
    }

    /// The region offset of the result slot of entry `seq`.
    pub fn result_offset(&self, seq: u64) -> usize {
        RESULTS_OFFSET + (seq & u64::from(self.slots - 1)) as usize * RESULT_BYTES
    }
}

/// How the daemon answered one entry: written into the entry's result slot before `done_seq`
/// covers it. `status` is [`STATUS_OK`] or an error ([`status_of`]); `detail` is the daemon's
/// (for example the index of a record that was too large).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    pub first_lsn: u64,
    pub last_lsn: u64,
    pub status: u32,
    pub detail: u32,
}

impl Completion {
    pub fn ok(first_lsn: u64, last_lsn: u64) -> Completion {
        Completion {
            first_lsn,
            last_lsn,
            status: STATUS_OK,
            detail: 0,
        }
    }

    pub fn failed(code: ErrorCode, detail: u32) -> Completion {
        Completion {
            first_lsn: 0,
            last_lsn: 0,
            status: status_of(code),
            detail,
        }
    }

    pub fn is_ok(&self) -> bool {
        self.status == STATUS_OK
    }

    /// The error this completion reports; `None` when it is OK or the status is unknown.
    pub fn error_code(&self) -> Option<ErrorCode> {
        error_of_status(self.status)
    }
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
        _ => return None,
    })
}

/// The bytes of a result slot.
pub fn encode_result(seq: u64, completion: &Completion) -> [u8; RESULT_BYTES] {
    let mut slot = [0u8; RESULT_BYTES];
    slot[0..8].copy_from_slice(&seq.to_le_bytes());
    slot[8..16].copy_from_slice(&completion.first_lsn.to_le_bytes());
    slot[16..24].copy_from_slice(&completion.last_lsn.to_le_bytes());
    slot[24..28].copy_from_slice(&completion.status.to_le_bytes());
    slot[28..32].copy_from_slice(&completion.detail.to_le_bytes());
    slot
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

/// Bytes a record of `payload_len` takes in an entry: header, payload, zeros to 8.
pub fn record_bytes(payload_len: usize) -> usize {
    RECORD_HEADER_BYTES + payload_len.next_multiple_of(ENTRY_ALIGN)
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

/// The CRC32C of an entry header: bytes 0..4 (the length) and 8..40 (everything after the CRC).
fn header_crc(header: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&header[0..4]);
    crc32c::crc32c_append(crc, &header[8..ENTRY_HEADER_BYTES])
}

fn check_count(seq: u64, kind: EntryKind, count: u32) -> Result<(), RingError> {
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

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(payloads: &[&[u8]], seq: u64) -> Vec<u8> {
        let mut out = vec![0u8; entry_len(payloads).unwrap()];
        let header = EntryHeader {
            handle: 3,
            kind: EntryKind::Append,
            durability: Durability::Buffered,
            lsn: 0,
        };
        encode_entry(&mut out, seq, &header, payloads).unwrap();
        out
    }

    #[test]
    fn the_documented_offsets_hold() {
        // The diagram in the module documentation, spelled out: one group per cache line.
        assert_eq!(TAIL_OFFSET / LINE_BYTES, 1);
        assert_eq!(CLIENT_WAITING_OFFSET / LINE_BYTES, 1);
        assert_eq!(HEAD_OFFSET / LINE_BYTES, 2);
        assert_eq!(DAEMON_ASLEEP_OFFSET / LINE_BYTES, 2);
        for offset in [DONE_SEQ_OFFSET, WAKE_OFFSET, FAULT_OFFSET, FAULT_SEQ_OFFSET] {
            assert_eq!(offset / LINE_BYTES, 3);
        }
        for offset in [TAIL_OFFSET, HEAD_OFFSET, DONE_SEQ_OFFSET, FAULT_SEQ_OFFSET] {
            assert_eq!(offset % 8, 0, "u64 words are 8-aligned");
        }
        for offset in [
            CLIENT_WAITING_OFFSET,
            DAEMON_ASLEEP_OFFSET,
            WAKE_OFFSET,
            FAULT_OFFSET,
        ] {
            assert_eq!(offset % 4, 0, "u32 words are 4-aligned");
        }
        let layout = RingLayout::new(4096, MAX_SLOTS).unwrap();
        assert_eq!(layout.result_offset(0), RESULTS_OFFSET);
        assert_eq!(
            layout.result_offset(MAX_SLOTS as u64 + 1),
            RESULTS_OFFSET + RESULT_BYTES
        );
        assert!(layout.result_offset(u64::MAX) + RESULT_BYTES <= HEADER_BYTES);
    }

    #[test]
    fn layout_bounds() {
        assert!(RingLayout::new(4096, 1).is_ok());
        assert!(RingLayout::new(MAX_DATA_BYTES, MAX_SLOTS).is_ok());
        for bad in [0, 2048, 4097, 6144, MAX_DATA_BYTES * 2] {
            assert_eq!(
                RingLayout::new(bad, 4),
                Err(RingError::BadDataBytes { data_bytes: bad })
            );
        }
        for bad in [0, 3, MAX_SLOTS * 2] {
            assert_eq!(
                RingLayout::new(4096, bad),
                Err(RingError::BadSlots { slots: bad })
            );
        }
        let layout = RingLayout::new(1 << 20, 16).unwrap();
        assert_eq!(RingLayout::parse(&layout.encode_line0()), Ok(layout));
        let mut line = layout.encode_line0();
        line[0] = b's';
        assert!(matches!(
            RingLayout::parse(&line),
            Err(RingError::BadMagic { .. })
        ));
        let mut line = layout.encode_line0();
        line[VERSION_OFFSET] = 2;
        assert_eq!(
            RingLayout::parse(&line),
            Err(RingError::UnsupportedLayout { found: 2 })
        );
        assert_eq!(
            RingLayout::parse(&line[..23]),
            Err(RingError::Truncated { len: 23 })
        );
    }

    #[test]
    fn an_entry_reads_back() {
        let bytes = append(&[b"hello", b"", &[7u8; 8]], 9);
        assert_eq!(bytes.len(), 40 + 16 + 8 + 16);
        let entry = parse_entry(&bytes, 9).unwrap();
        assert_eq!(
            (entry.seq, entry.handle, entry.kind, entry.count),
            (9, 3, EntryKind::Append, 3)
        );
        let records: Vec<_> = entry.records().collect();
        assert_eq!(records[0], (&b"hello"[..], crc32c::crc32c(b"hello")));
        assert_eq!(records[1].0, b"");
        assert_eq!(records[2].0, &[7u8; 8]);
        assert_eq!(
            parse_entry(&bytes, 10),
            Err(RingError::WrongSeq {
                expected: 10,
                found: 9
            })
        );
    }

    #[test]
    fn encoder_refuses_what_the_parser_would() {
        let mut out = vec![0u8; 256];
        let commit = EntryHeader {
            handle: 0,
            kind: EntryKind::Commit,
            durability: Durability::Disk,
            lsn: 5,
        };
        assert!(matches!(
            encode_entry(&mut out, 1, &commit, &[b"x"]),
            Err(RingError::BadRecordCount { count: 1, .. })
        ));
        assert_eq!(encode_entry(&mut out, 1, &commit, &[]), Ok(40));
        let append = EntryHeader {
            kind: EntryKind::Append,
            ..commit
        };
        assert!(matches!(
            encode_entry(&mut out, 1, &append, &[]),
            Err(RingError::BadRecordCount { count: 0, .. })
        ));
        assert!(matches!(
            encode_entry(&mut out, 1, &append, &[b"x"]),
            Err(RingError::NonZeroField { field: "lsn", .. })
        ));
        let append = EntryHeader { lsn: 0, ..append };
        assert_eq!(
            encode_entry(&mut out[..47], 1, &append, &[b"x"]),
            Err(RingError::BufferTooSmall {
                needed: 56,
                available: 47
            })
        );
    }

    #[test]
    fn entry_starts_are_bounded_by_area_and_tail() {
        let data = 4096;
        assert_eq!(
            check_entry_start(56u32.to_le_bytes(), 0, 56, data),
            Ok(EntryStart::Entry(56))
        );
        // Past the published bytes, past the area's end, off the grid, shorter than a header.
        for (len, head, published) in [(64, 0, 56), (64, 4040, 4096), (60, 0, 4096), (32, 0, 64)] {
            assert!(matches!(
                check_entry_start(u32::to_le_bytes(len), head, published, data),
                Err(RingError::BadEntryLength { .. })
            ));
        }
        assert_eq!(
            check_entry_start(pad_bytes(), 4096 + 4000, 96 + 8, data),
            Ok(EntryStart::Pad(96))
        );
        assert!(matches!(
            check_entry_start(pad_bytes(), 4000, 64, data),
            Err(RingError::BadPad { .. })
        ));
        assert!(matches!(
            check_entry_start(pad_bytes(), 4096, 4096, data),
            Err(RingError::BadPad { .. })
        ));
        assert_eq!(check_published(8, 8, data), Ok(0));
        assert_eq!(check_published(8, 8 + data, data), Ok(data));
        for (head, tail) in [(16, 8), (0, data + 8), (0, 12)] {
            assert!(matches!(
                check_published(head, tail, data),
                Err(RingError::BadTail { .. })
            ));
        }
    }

    #[test]
    fn result_slots_and_statuses_round_trip() {
        let completion = Completion {
            first_lsn: 5,
            last_lsn: u64::MAX,
            status: status_of(ErrorCode::Io),
            detail: 77,
        };
        assert_eq!(
            decode_result(&encode_result(42, &completion)),
            (42, completion)
        );
        assert_eq!(completion.error_code(), Some(ErrorCode::Io));
        assert!(Completion::ok(1, 2).is_ok());
        for status in 1..=17 {
            assert_eq!(status_of(error_of_status(status).unwrap()), status);
        }
        assert_eq!(error_of_status(18), None);
        let (seq, text) = decode_message(&encode_message(9, &"é".repeat(2000)));
        assert_eq!(seq, 9);
        assert!(text.len() <= MESSAGE_TEXT_BYTES && text.chars().all(|c| c == 'é'));
        for code in 1..=7 {
            assert_eq!(FaultCode::from_u32(code).unwrap().as_u32(), code);
        }
        assert_eq!(FaultCode::from_u32(0), None);
    }
}
