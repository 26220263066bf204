//! Where every word of a ring region lives, the region's size, and the result slots the daemon
//! answers in. Both ends agree on these; the daemon writes only what this says is its own.

use super::codes::{status_of, RingError};
use crate::message::ErrorCode;

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
/// In line 0: the ring's seat on its daemon's wake board plus one (0: no board; see
/// `BoardSeat`).
pub const BOARD_SEAT_OFFSET: usize = 24;
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

/// `client_waiting` while the client sleeps (or is about to) until it has room for an entry:
/// any change wakes it (`head`, `done_seq`, `fault`). Any value but 0 and
/// [`WAITING_FOR_ANSWER`] means this, so a client written before that value existed is woken
/// as it expects.
pub const WAITING_FOR_ROOM: u32 = 1;
/// `client_waiting` while the client sleeps until an entry is answered: only a new `done_seq`
/// or a `fault` wakes it. A `disk` commit sleeps through the fdatasync; waking it when its entry
/// was merely copied out (`head`) would cost the daemon a futex call per commit for nothing.
pub const WAITING_FOR_ANSWER: u32 = 2;
/// `client_waiting` while the client sleeps until an entry is answered, on its seat of the wake
/// board rather than on `wake`: the daemon sets the seat's bit in the mask of one
/// FUTEX_WAKE_BITSET for every client of that board word it answered together, instead of one
/// FUTEX_WAKE per client. Only a new `done_seq` or a `fault` wakes it.
pub const WAITING_ON_BOARD: u32 = 3;

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
pub(crate) const MESSAGE_TEXT_BYTES: usize = MESSAGE_BYTES - 16;

const _: () = assert!(RESULTS_OFFSET + MAX_SLOTS as usize * RESULT_BYTES <= MESSAGE_OFFSET);

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

/// Bytes a record of `payload_len` takes in an entry: header, payload, zeros to 8.
pub fn record_bytes(payload_len: usize) -> usize {
    RECORD_HEADER_BYTES + payload_len.next_multiple_of(ENTRY_ALIGN)
}

pub(crate) fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}
