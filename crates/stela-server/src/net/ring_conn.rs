//! A connection's ring as the event loop handles it: making one (with its seat on its user's
//! wake board), its doorbell, the sleep handshake, parking while the pool is full. The hand-off
//! of entries is in [`super::ring`].

use super::inbox::Inbox;
use super::ring::RingConn;
use crate::engine::Engine;
use crate::pool::LogId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use stela_net::shm::RingFault;
use stela_net::shm::{Board, DaemonRing};
use stela_proto::ResponseBody;

/// Result slots per ring: a blocking client has one entry in flight; more let a pipelining one
/// keep several.
const RESULT_SLOTS: u32 = 16;

/// The wake boards (`stela_net::shm::Board`), one per user: the clients of one uid share a
/// board, so a round of `disk` answers wakes up to 32 of them per system call; clients of
/// different users never share one (a client can write to its board). Made when a user's first
/// ring is; a board that cannot be made leaves that user's rings waking one by one, as rings
/// did before boards.
#[derive(Default)]
pub(crate) struct Boards {
    by_user: RefCell<HashMap<u32, Option<Board>>>,
}

impl Boards {
    fn for_user(&self, uid: u32) -> Option<Board> {
        let made = |uid| match Board::create() {
            Ok(board) => Some(board),
            Err(error) => {
                let why = "no wake board for this user's rings: they are woken one by one";
                tracing::warn!(uid, %error, why);
                None
            }
        };
        let mut boards = self.by_user.borrow_mut();
        boards.entry(uid).or_insert_with(|| made(uid)).clone()
    }
}

impl RingConn {
    /// Creates a ring of `data_bytes`, seated at `seat` on the wake board of user `uid` (if
    /// known); returns it, the descriptors for the client (memory, doorbell, and the board if
    /// any) and the answer that goes with them.
    pub fn create(
        data_bytes: usize,
        boards: &Boards,
        uid: Option<u32>,
        seat: u32,
    ) -> io::Result<(RingConn, Vec<OwnedFd>, ResponseBody)> {
        let (mut ring, memory, doorbell) =
            DaemonRing::create(data_bytes as u64, RESULT_SLOTS).map_err(io::Error::other)?;
        let mut fds = vec![memory, doorbell];
        if let Some(board) = uid.and_then(|uid| boards.for_user(uid)) {
            match board.share() {
                Ok(fd) => {
                    ring.take_seat(&board, seat);
                    fds.push(fd);
                }
                Err(error) => tracing::warn!(%error, "a ring without its wake board"),
            }
        }
        let completer = ring.completer();
        let answer = ResponseBody::RingMapped {
            data_bytes: data_bytes as u32,
            slots: RESULT_SLOTS,
        };
        Ok((
            RingConn {
                ring,
                completer,
                pending: None,
                parked: false,
                scratch: Vec::new(),
            },
            fds,
            answer,
        ))
    }

    /// As [`RingConn::step`], also counting what the loop's scheduling follows
    /// (`crate::sched::LoopPriority`): the entries this step answered at once (their
    /// completions, all published by the step itself on this thread) and whether it sent one
    /// to wait (for the disk or a standby).
    pub fn step_counted(
        &mut self,
        engine: &Engine,
        inbox: &Arc<Inbox>,
        handles: &[Option<LogId>],
    ) -> Result<(bool, (u64, u64)), RingFault> {
        let (completed, pending) = (self.completer.completed(), self.pending);
        let did = self.step(engine, inbox, handles)?;
        let answered_at_once = self.completer.completed() - completed;
        let waited = u64::from(self.pending.is_some() && self.pending != pending);
        Ok((did, (answered_at_once, waited)))
    }

    pub fn doorbell_fd(&self) -> BorrowedFd<'_> {
        self.ring.doorbell_fd()
    }

    pub fn drain_doorbell(&self) {
        if let Err(error) = self.ring.drain_doorbell() {
            tracing::error!(%error, "reading a ring's doorbell failed");
        }
    }

    /// Asks the client to ring the doorbell from now on; `false` if an entry is already
    /// published (then do not sleep).
    pub fn prepare_sleep(&self) -> bool {
        self.ring.set_asleep()
    }

    pub fn woke(&self) {
        self.ring.clear_asleep();
    }

    pub fn unpark(&mut self) {
        self.parked = false;
    }

    /// Nothing in flight (for the idle timeout).
    pub fn idle(&self) -> bool {
        self.pending.is_none() && !self.parked
    }

    /// An entry waits for the disk.
    pub fn awaits_disk(&self) -> bool {
        self.pending.is_some()
    }
}
