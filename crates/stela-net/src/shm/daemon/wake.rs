//! How a ring is made, how the daemon's end sleeps and is woken (the doorbell and the
//! `daemon_asleep` handshake), and how it wakes the client (its ring's `wake` word, or its seat
//! on a wake board). Liveness, not the hand-off of records ([`super`]).

use super::super::board::{Board, Seat, WakeBatch};
use super::super::error::ShmError;
use super::super::region::{Doorbell, Region};
use super::super::sync::fence;
use super::DaemonRing;
use std::sync::atomic::Ordering::{Relaxed, Release, SeqCst};
use stela_proto::ring::{BoardSeat, WAITING_FOR_ANSWER, WAITING_ON_BOARD};

impl DaemonRing {
    /// Creates a ring of `data_bytes` (a power of two, 4 KiB..64 MiB) with `slots` result slots
    /// (a power of two, at most 64): a sealed memfd, mapped here, and an eventfd doorbell.
    /// Returns the ring, the memfd and a second descriptor of the eventfd: send both to the
    /// client (`os::send_with_fds`), which opens its end with `ClientRing::from_fds`, then drop
    /// them (the daemon keeps its own mapping and doorbell descriptor).
    ///
    /// # Errors
    /// [`ShmError::Layout`] for sizes out of bounds; [`ShmError::Io`] naming the failed call.
    #[cfg(not(stela_loom))]
    pub fn create(
        data_bytes: u64,
        slots: u32,
    ) -> Result<(DaemonRing, std::os::fd::OwnedFd, std::os::fd::OwnedFd), ShmError> {
        use super::super::os;
        use super::super::region::Region;
        use std::os::fd::AsFd;
        use stela_proto::ring::RingLayout;
        let layout = RingLayout::new(data_bytes, slots).map_err(ShmError::Layout)?;
        let memfd = os::create_sealed_memfd(c"stela-ring", layout.region_bytes())
            .map_err(ShmError::io("memfd_create"))?;
        let map = os::Mapping::map(memfd.as_fd(), layout.region_bytes() as usize)
            .map_err(ShmError::io("mmap"))?;
        let region = Region::new(map, layout);
        region.write_line0(&layout.encode_line0());
        let eventfd = os::eventfd().map_err(ShmError::io("eventfd"))?;
        let client_eventfd = eventfd.try_clone().map_err(ShmError::io("dup eventfd"))?;
        let ring = DaemonRing::from_parts(region, Doorbell::new(eventfd));
        Ok((ring, memfd, client_eventfd))
    }

    /// The doorbell's descriptor, to register for reading in the event loop (epoll/mio). It
    /// becomes readable when the client published while [`DaemonRing::set_asleep`] was set.
    #[cfg(not(stela_loom))]
    pub fn doorbell_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.doorbell.fd()
    }

    /// The model's doorbell, for the loom harness to wait on.
    #[cfg(stela_loom)]
    pub fn model_doorbell(&self) -> Doorbell {
        self.doorbell.clone()
    }

    /// Resets the doorbell after a wake-up (level-triggered epoll would otherwise report it
    /// again).
    ///
    /// # Errors
    /// [`ShmError::Io`] from `read`, which only fails if the descriptor is broken.
    pub fn drain_doorbell(&self) -> Result<(), ShmError> {
        self.doorbell
            .drain()
            .map_err(ShmError::io("read eventfd"))?;
        Ok(())
    }

    /// Announces that the daemon is about to sleep until the doorbell rings. Returns true if
    /// that is safe: nothing is published that it has not consumed (checked after a SeqCst
    /// fence, so a client publishing concurrently either is seen here or sees the flag and
    /// rings). On false, call [`DaemonRing::clear_asleep`] and keep reading.
    pub fn set_asleep(&self) -> bool {
        self.region.daemon_asleep().store(1, Relaxed);
        fence(SeqCst);
        self.stopped.load(Relaxed) != 0 || self.region.tail().load(Relaxed) == self.head
    }

    /// Gives the ring seat `n` on `board` (written into line 0, where the client finds it once
    /// it has the board). Call before the client maps the ring, and before taking completers.
    pub fn take_seat(&mut self, board: &Board, n: u32) {
        let seat = BoardSeat::of(n);
        self.region.board_seat().store(seat.encode(), Relaxed);
        self.seat = Some(Seat {
            board: board.clone(),
            seat,
        });
    }

    /// Wakes the client if it sleeps for `change` (stored before this call).
    pub(super) fn notify(&self, change: Change) {
        notify_client(
            &self.region,
            self.seat.as_ref(),
            change,
            &mut WakeBatch::default(),
        );
    }

    /// Clears the flag of [`DaemonRing::set_asleep`] after waking (clients stop ringing).
    pub fn clear_asleep(&self) {
        self.region.daemon_asleep().store(0, Relaxed);
    }
}

/// What changed, for [`notify_client`]: a client waiting only for an answer
/// ([`WAITING_FOR_ANSWER`]) sleeps through a new `head`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// `head`: room was freed.
    Head,
    /// `done_seq` or `fault`: an answer, or the news that none will come.
    Answer,
}

/// After a change the client may wait for (stored before this call): a SeqCst fence that pairs
/// with the client's between setting `client_waiting` and re-checking, then, if the client
/// sleeps (or is about to) waiting for this kind of change, bump `wake` and FUTEX_WAKE it.
/// Either the client's re-check sees the change, or this load sees its `client_waiting`; and the
/// bump comes before the wake, so a client that read `wake` before it finds it changed when it
/// calls FUTEX_WAIT. A client that sleeps for an answer is neither woken nor has `wake` bumped by
/// a new `head` (it would only check and sleep again: a futex call and two context switches per
/// `disk` commit, or a FUTEX_WAIT that returns at once); any other nonzero value wakes on
/// everything.
///
/// A client sleeping on its board seat ([`WAITING_ON_BOARD`]) is woken through the board, by
/// `batch` (when the caller drops it, with the other seats answered into it). A client that
/// claims to sleep on a board its ring has no seat on is woken on `wake` (its claim costs it
/// nothing but a wake-up).
pub(super) fn notify_client(
    region: &Region,
    seat: Option<&Seat>,
    change: Change,
    batch: &mut WakeBatch,
) {
    fence(SeqCst);
    let waiting = region.client_waiting().load(Relaxed);
    if let (WAITING_ON_BOARD, Some(seat)) = (waiting, seat) {
        if change == Change::Answer {
            batch.add(seat);
        }
        return;
    }
    if waiting != 0 && (change == Change::Answer || waiting != WAITING_FOR_ANSWER) {
        region.wake().fetch_add(1, Release);
        region.futex_wake();
    }
}
