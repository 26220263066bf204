//! The wake board's shape: its words, and a ring's seat on it (which word, which bit of the wait
//! mask). Wake-ups only: nothing here carries or acknowledges a record.

use super::offsets::LINE_BYTES;

/// The wake board: one page the daemon shares with the clients of one user, holding futex words
/// (one per 64-byte line, so the words of different seats' groups never share a cache line).
/// Each ring has a seat: a word and a bit of the wait mask. The daemon answers a round of
/// `disk` commits with one bump and one FUTEX_WAKE_BITSET per word, whose mask names every seat
/// it answered: one system call wakes up to 32 clients (measured on this project's 2-vCPU VM:
/// 40 sleepers woken in one call took about 60 % of the time of 40 calls).
pub const BOARD_BYTES: usize = 4096;
pub const BOARD_WORDS: usize = BOARD_BYTES / LINE_BYTES;
/// Seats per word: the bits of a futex wait mask.
pub const SEATS_PER_WORD: usize = 32;

/// A ring's place on the wake board.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoardSeat {
    /// Which word (0..[`BOARD_WORDS`]).
    pub word: usize,
    /// The seat's wait mask: one bit.
    pub mask: u32,
}

impl BoardSeat {
    /// The seat for a ring numbered `n` by the daemon: consecutive numbers share a word, so one
    /// wake call covers many of them; beyond `BOARD_WORDS * SEATS_PER_WORD` rings seats are
    /// shared, which costs only spurious wake-ups (every sleeper re-checks its own ring).
    pub fn of(n: u32) -> BoardSeat {
        let n = n as usize % (BOARD_WORDS * SEATS_PER_WORD);
        BoardSeat {
            word: n / SEATS_PER_WORD,
            mask: 1 << (n % SEATS_PER_WORD),
        }
    }

    /// As stored in line 0 ([`BOARD_SEAT_OFFSET`]): `None` for 0 (no board) or a value out of
    /// range.
    pub fn decode(field: u32) -> Option<BoardSeat> {
        let n = field.checked_sub(1)?;
        ((n as usize) < BOARD_WORDS * SEATS_PER_WORD).then(|| BoardSeat::of(n))
    }

    pub fn encode(self) -> u32 {
        (self.word * SEATS_PER_WORD) as u32 + self.mask.trailing_zeros() + 1
    }

    /// The word's offset in the board.
    pub fn offset(self) -> usize {
        self.word * LINE_BYTES
    }
}
