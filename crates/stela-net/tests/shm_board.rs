//! The wake board over the real thing: one sealed page shared by several rings' clients, each
//! sleeping on its own bit of a futex word (FUTEX_WAIT_BITSET), woken by the daemon's
//! [`WakeBatch`] with one call per word.
//!
//! - clients of one board word answered into one batch are woken by it, and a client of the
//!   same word that was not answered sleeps on; the rings' own `wake` words are never used;
//! - `mark_gone` wakes a client sleeping on its seat;
//! - a board that is not a sealed one-page memfd is refused.
//!
//! No test measures time; every wait ends on an event.
#![cfg(not(stela_loom))]

use std::thread;
use std::time::Duration;
use stela_net::shm::{
    os, Board, ClientRing, Completion, DaemonRing, EntryKind, ShmError, WakeBatch,
};
use stela_proto::Durability;

/// A ring seated at `seat` on `board`, and its client attached to the board (both ends in this
/// process; the descriptors are the ones the daemon would send).
fn seated(board: &Board, seat: u32) -> (DaemonRing, ClientRing) {
    let (mut ring, memfd, eventfd) = DaemonRing::create(4096, 4).unwrap();
    ring.take_seat(board, seat);
    let mut client = ClientRing::from_fds(memfd, eventfd).unwrap();
    let board = Board::from_fd(board.share().unwrap()).unwrap();
    assert!(client.attach_board(board), "the ring has a seat");
    client.set_spin(Duration::ZERO);
    (ring, client)
}

fn until(what: &str, done: impl FnMut() -> bool) {
    stela_testkit::eventually(what, Duration::from_secs(30), done);
}

#[test]
fn one_batch_wakes_the_answered_clients_of_a_board_word_and_no_other() {
    let board = Board::create().unwrap();
    let mut rings = Vec::new();
    let mut waiters = Vec::new();
    for seat in 0..3 {
        let (ring, mut client) = seated(&board, seat);
        let seq = client
            .submit(0, EntryKind::Append, Durability::Disk, 0, &[b"rec"])
            .unwrap();
        waiters.push(thread::spawn(move || client.wait(seq)));
        rings.push(ring);
    }
    until("all three clients sleep for their answers", || {
        rings.iter().all(DaemonRing::client_waiting)
    });
    let mut scratch = Vec::new();
    for ring in &mut rings {
        ring.next_entry(&mut scratch).unwrap().expect("published");
        ring.consume();
    }
    let mut batch = WakeBatch::default();
    for ring in &rings[..2] {
        ring.completer()
            .complete_in(1, Completion::ok(7, 7), &mut batch);
    }
    drop(batch);
    let mut waiters = waiters.into_iter();
    for waiter in waiters.by_ref().take(2) {
        until("an answered client of the batch returns", || {
            waiter.is_finished()
        });
        assert_eq!(waiter.join().unwrap().unwrap(), Completion::ok(7, 7));
    }
    let third = waiters.next().unwrap();
    // The first two returned; the third, on the same word but not in the batch's mask, sleeps
    // on (a wrong mask would have woken it to find nothing and sleep again: `client_waiting`
    // stays set either way, so this checks only that it did not return).
    assert!(!third.is_finished(), "a client returned without its answer");
    assert!(rings[2].client_waiting());
    rings[2].complete(1, Completion::ok(8, 8));
    until("the third client returns once answered", || {
        third.is_finished()
    });
    assert_eq!(third.join().unwrap().unwrap(), Completion::ok(8, 8));
    for ring in &rings {
        assert_eq!(
            ring.wake_count(),
            0,
            "a client on a board seat was woken on its ring's own word"
        );
    }
}

#[test]
fn mark_gone_wakes_a_client_sleeping_on_its_board_seat() {
    let board = Board::create().unwrap();
    let (ring, mut client) = seated(&board, 5);
    let gone = client.gone_handle();
    let seq = client
        .submit(1, EntryKind::Append, Durability::Disk, 0, &[b"lost"])
        .unwrap();
    let waiter = thread::spawn(move || client.wait(seq));
    until("the client sleeps for its answer", || ring.client_waiting());
    gone.mark_gone();
    assert!(matches!(waiter.join().unwrap(), Err(ShmError::DaemonGone)));
}

#[test]
fn a_board_that_is_not_a_sealed_page_is_refused() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let too_big = os::create_sealed_memfd(c"big", 8192).unwrap();
    assert!(matches!(Board::from_fd(too_big), Err(ShmError::Layout(_))));
    // SAFETY: memfd_create returns a new descriptor that nothing else owns.
    let unsealed = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"plain".as_ptr(), 0)) };
    assert!(matches!(
        Board::from_fd(unsealed),
        Err(ShmError::Unsealed { .. })
    ));
}
