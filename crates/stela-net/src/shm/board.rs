//! The wake board: one shared page of futex words on which the clients of one user sleep for
//! their answers, each on its own bit of a word's wait mask, so that the daemon wakes every
//! client it answered together with one system call per word ([`WakeBatch`]) instead of one per
//! client (`stela_proto::ring::BoardSeat`; docs/PROTOCOL.md, "Waking many clients at once").
//!
//! Invariants:
//! - **A word is bumped before every wake on it** (Release), and a sleeper reads the word
//!   (Acquire) before it announces `client_waiting` and re-checks its ring, exactly as with the
//!   ring's own `wake` word: a wake can find the sleeper queued, or the sleeper finds the word
//!   changed and does not sleep. A bump also makes every other sleeper on that word that was
//!   about to sleep go round once more (spurious, harmless: each re-checks its own ring).
//! - **The board carries no answers**, only wake-ups. Every client of the user may write to it
//!   (the client bumps its own word when it learns that the daemon is gone, as with `wake`); the
//!   worst a client can do to another is wake it for nothing or, by putting a word back to a
//!   value it had, let one of that user's clients sleep through its answer: boards are per user
//!   for that reason, and a process can already stop its own user's processes.
//! - A [`WakeBatch`] wakes on drop, so a completion recorded in one is never left unwoken.

use std::sync::atomic::Ordering::{Acquire, Release};
use stela_proto::ring::BoardSeat;

#[cfg(not(stela_loom))]
pub use real::Board;

#[cfg(stela_loom)]
pub use model::Board;

#[cfg(not(stela_loom))]
mod real {
    use super::super::error::ShmError;
    use super::super::os::{self, Mapping};
    use super::super::sync::AtomicU32;
    use std::os::fd::{AsFd, OwnedFd};
    use std::sync::Arc;
    use stela_proto::ring::{BoardSeat, RingError, BOARD_BYTES};

    /// A mapped wake board. Cloning shares the mapping.
    #[derive(Clone, Debug)]
    pub struct Board {
        shared: Arc<(Mapping, Option<OwnedFd>)>,
    }

    impl Board {
        /// A new board (the daemon's, one per user): a sealed memfd of one page, mapped here.
        ///
        /// # Errors
        /// [`ShmError::Io`] naming the failed call.
        pub fn create() -> Result<Board, ShmError> {
            let memfd = os::create_sealed_memfd(c"stela-board", BOARD_BYTES as u64)
                .map_err(ShmError::io("memfd_create"))?;
            let map =
                Mapping::map(memfd.as_fd(), BOARD_BYTES).map_err(ShmError::io("mmap board"))?;
            Ok(Board {
                shared: Arc::new((map, Some(memfd))),
            })
        }

        /// A descriptor of the board to send to a client (the daemon's board only).
        ///
        /// # Errors
        /// [`ShmError::Io`] from `dup`.
        pub fn share(&self) -> Result<OwnedFd, ShmError> {
            let fd = self
                .shared
                .1
                .as_ref()
                .expect("only the daemon's board is shared");
            fd.try_clone().map_err(ShmError::io("dup board"))
        }

        /// The client's view of a board the daemon sent: checks that the memfd is sealed and
        /// one page long, and maps it.
        ///
        /// # Errors
        /// [`ShmError::Unsealed`], [`ShmError::Layout`] for a wrong size, [`ShmError::Io`].
        pub fn from_fd(memfd: OwnedFd) -> Result<Board, ShmError> {
            let size = super::super::os::sealed_size(memfd.as_fd())?;
            if size != BOARD_BYTES as u64 {
                return Err(ShmError::Layout(RingError::BadRegionSize {
                    found: size,
                    expected: BOARD_BYTES as u64,
                }));
            }
            let map =
                Mapping::map(memfd.as_fd(), BOARD_BYTES).map_err(ShmError::io("mmap board"))?;
            Ok(Board {
                shared: Arc::new((map, None)),
            })
        }

        pub(crate) fn word(&self, seat: BoardSeat) -> &AtomicU32 {
            let offset = seat.offset();
            assert!(
                offset + 4 <= BOARD_BYTES,
                "board word {offset} outside the page"
            );
            // SAFETY: the mapping is page-aligned and one page long (checked at creation or
            // `from_fd`), `offset` is a multiple of 64 inside it, so the pointer is valid and
            // aligned for an AtomicU32 while `self` keeps the mapping. Every process accesses
            // the board's words only with atomic instructions and futex calls.
            unsafe { AtomicU32::from_ptr(self.shared.0.as_ptr().add(offset).cast()) }
        }

        pub(crate) fn futex_wait(&self, seat: BoardSeat, seen: u32) {
            os::futex_wait_bitset(self.word(seat), seen, seat.mask);
        }

        pub(crate) fn futex_wake(&self, seat: BoardSeat) {
            os::futex_wake_bitset(self.word(seat), seat.mask);
        }

        pub(crate) fn same(&self, other: &Board) -> bool {
            Arc::ptr_eq(&self.shared, &other.shared)
        }
    }
}

#[cfg(stela_loom)]
mod model {
    use super::super::sync::{Arc, AtomicU32};
    use loom::sync::{Condvar, Mutex};
    use stela_proto::ring::{BoardSeat, BOARD_WORDS};

    struct Shared {
        words: Box<[AtomicU32]>,
        /// The kernel's futex hash bucket; a wake wakes every sleeper (a mask only narrows who
        /// is woken, which the model need not: waking more is always allowed).
        futex: Mutex<()>,
        sleepers: Condvar,
    }

    /// The in-memory wake board of the loom model.
    #[derive(Clone)]
    pub struct Board {
        shared: Arc<Shared>,
    }

    impl Board {
        pub fn model() -> Board {
            Board {
                shared: Arc::new(Shared {
                    words: (0..BOARD_WORDS).map(|_| AtomicU32::new(0)).collect(),
                    futex: Mutex::new(()),
                    sleepers: Condvar::new(),
                }),
            }
        }

        pub(crate) fn word(&self, seat: BoardSeat) -> &AtomicU32 {
            &self.shared.words[seat.word]
        }

        pub(crate) fn futex_wait(&self, seat: BoardSeat, seen: u32) {
            use std::sync::atomic::Ordering::Relaxed;
            let guard = self.shared.futex.lock().unwrap();
            if self.word(seat).load(Relaxed) == seen {
                drop(self.shared.sleepers.wait(guard).unwrap());
            }
        }

        pub(crate) fn futex_wake(&self, _seat: BoardSeat) {
            drop(self.shared.futex.lock().unwrap());
            self.shared.sleepers.notify_all();
        }

        pub(crate) fn same(&self, other: &Board) -> bool {
            Arc::ptr_eq(&self.shared, &other.shared)
        }
    }
}

impl Board {
    /// Bumps the word of `seat` and wakes the sleepers on it whose bit is in `seat.mask` (which
    /// may hold several seats' bits).
    pub(crate) fn wake(&self, seat: BoardSeat) {
        self.word(seat).fetch_add(1, Release);
        self.futex_wake(seat);
    }

    /// The value to pass to [`Board::futex_wait`] for `seat`: read before announcing the wait.
    pub(crate) fn seen(&self, seat: BoardSeat) -> u32 {
        self.word(seat).load(Acquire)
    }
}

/// A ring's seat on a board.
#[derive(Clone)]
pub(crate) struct Seat {
    pub board: Board,
    pub seat: BoardSeat,
}

/// Board wake-ups gathered while answering several rings, made at the latest when dropped:
/// one bump and one FUTEX_WAKE_BITSET per board word, covering every seat recorded on it.
#[derive(Default)]
pub struct WakeBatch {
    pending: Vec<Seat>,
}

impl WakeBatch {
    pub(crate) fn add(&mut self, seat: &Seat) {
        match self
            .pending
            .iter_mut()
            .find(|p| p.seat.word == seat.seat.word && p.board.same(&seat.board))
        {
            Some(pending) => pending.seat.mask |= seat.seat.mask,
            None => self.pending.push(seat.clone()),
        }
    }

    /// Makes the wake-ups recorded so far.
    pub fn wake(&mut self) {
        for pending in self.pending.drain(..) {
            pending.board.wake(pending.seat);
        }
    }
}

impl Drop for WakeBatch {
    fn drop(&mut self) {
        self.wake();
    }
}
