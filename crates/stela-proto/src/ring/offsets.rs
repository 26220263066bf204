//! Where every word of a ring region lives: the fixed offsets and sizes both ends agree on, and
//! the little-endian word readers. The lowest floor of the ring's modules: it imports nothing,
//! so the error vocabulary ([`super::codes`]) and the layout ([`super::layout`]) can both name
//! these without importing each other.

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

pub(crate) fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}
