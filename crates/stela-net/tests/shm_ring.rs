//! The ring over the real thing: a sealed memfd, a shared mapping, the eventfd doorbell, the
//! futex, and the descriptors passed over a Unix socket; between threads, and between processes
//! for a client killed with SIGKILL.
//!
//! - entries of every shape round trip, through wrap-around and pads, with the daemon sleeping
//!   on the doorbell in `poll` and the client both spinning and sleeping on the futex;
//! - a full area makes the writer wait (it sleeps on the futex) exactly until the daemon
//!   consumes, and a consumption alone wakes it; a client waiting for an answer is not woken
//!   by consumptions;
//! - a published entry corrupted in shared memory (header, payload, length, or `tail`) stops
//!   the ring: it and everything after it is never acknowledged, the client is told, and a
//!   corruption after the daemon's copy changes nothing;
//! - a client killed between writing an entry and publishing it leaves nothing the daemon
//!   reads: the test binary re-runs itself as the client (`--exact killed_client_child` with
//!   `STELA_SHM_CHILD` set; without it that test does nothing), receives the descriptors on
//!   its stdin socket, publishes one entry, writes a second, reports, and sleeps until killed;
//! - `mark_gone` wakes a client sleeping on a completion.
//!
//! No test measures time; every wait ends on an event (the example `ring_rtt` measures).
#![cfg(not(stela_loom))]

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;
use stela_net::shm::{
    recv_with_fds, send_with_fds, ClientRing, Completion, DaemonRing, EntryKind, FaultCode,
    Mapping, RingError, ShmError,
};
use stela_proto::ring::{DATA_OFFSET, ENTRY_HEADER_BYTES, RECORD_HEADER_BYTES, TAIL_OFFSET};
use stela_proto::Durability;

const CHILD_ENV: &str = "STELA_SHM_CHILD";

/// Sends the client's descriptors over `socket`, as the daemon does in its `MapRing` answer.
fn send_fds(socket: &UnixStream, memfd: &OwnedFd, eventfd: &OwnedFd) {
    let sent = send_with_fds(socket.as_fd(), b"R", &[memfd.as_fd(), eventfd.as_fd()]).unwrap();
    assert_eq!(sent, 1);
}

fn receive_fds(socket: impl AsFd) -> (OwnedFd, OwnedFd) {
    let mut fds = Vec::new();
    let mut byte = [0u8; 1];
    assert_eq!(
        recv_with_fds(socket.as_fd(), &mut byte, &mut fds).unwrap(),
        1
    );
    assert_eq!(fds.len(), 2, "memfd and eventfd");
    let eventfd = fds.pop().unwrap();
    (fds.pop().unwrap(), eventfd)
}

/// A daemon and a client over descriptors that went through a socket pair.
fn connected(data_bytes: u64, slots: u32) -> (DaemonRing, ClientRing, OwnedFd) {
    let (ring, memfd, eventfd) = DaemonRing::create(data_bytes, slots).unwrap();
    let wild = memfd.try_clone().unwrap();
    let (daemon_end, client_end) = UnixStream::pair().unwrap();
    send_fds(&daemon_end, &memfd, &eventfd);
    drop((memfd, eventfd));
    let (memfd, eventfd) = receive_fds(&client_end);
    (ring, ClientRing::from_fds(memfd, eventfd).unwrap(), wild)
}

/// The payloads of entry `seq` of the round-trip test: 0 to 4 records of 0 to ~300 bytes,
/// derived from the seq so the daemon can check them.
fn payloads_for(seq: u64) -> Vec<Vec<u8>> {
    let count = (seq % 5) as usize;
    (0..count)
        .map(|i| {
            let len = ((seq * 37 + i as u64 * 101) % 300) as usize;
            (0..len).map(|b| (seq as usize + i + b) as u8).collect()
        })
        .collect()
}

/// Waits for the doorbell or a hang-up of `socket` (the lead's epoll, reduced to poll).
fn sleep_on_doorbell(ring: &DaemonRing, socket: &UnixStream) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: ring.doorbell_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: socket.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfd entries for descriptors that outlive the call.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
    assert!(ready > 0 || std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted);
    fds[1].revents == 0
}

/// The daemon's loop for one ring: read, check, consume, complete (LSNs counted per ring), and
/// sleep on the doorbell when nothing is published; stop when the client's socket hangs up
/// and the ring is drained. Returns the entries' seqs and records.
fn serve(mut ring: DaemonRing, socket: UnixStream) -> Vec<(u64, EntryKind, Vec<Vec<u8>>)> {
    let mut scratch = Vec::new();
    let mut seen = Vec::new();
    let mut lsn = 0u64;
    let mut client_alive = true;
    loop {
        let entry = ring.next_entry(&mut scratch).expect("no fault");
        let Some(entry) = entry else {
            if !client_alive {
                return seen;
            }
            if ring.set_asleep() {
                client_alive = sleep_on_doorbell(&ring, &socket);
            }
            ring.clear_asleep();
            ring.drain_doorbell().unwrap();
            continue;
        };
        let records: Vec<Vec<u8>> = entry
            .records()
            .map(|(payload, crc)| {
                assert_eq!(crc, crc32c::crc32c(payload));
                payload.to_vec()
            })
            .collect();
        let (seq, kind) = (entry.seq, entry.kind);
        let completion = match kind {
            EntryKind::Append => {
                let first = lsn + 1;
                lsn += records.len() as u64;
                Completion::ok(first, lsn)
            }
            EntryKind::Commit => Completion::ok(entry.lsn, entry.lsn),
        };
        seen.push((seq, kind, records));
        ring.consume();
        ring.complete(seq, completion);
    }
}

#[test]
fn entries_round_trip_through_wrap_around_spinning_and_sleeping() {
    for spin in [Duration::ZERO, stela_net::DEFAULT_SPIN] {
        let (ring, mut client, _) = connected(4096, 8);
        client.set_spin(spin);
        let (daemon_socket, client_socket) = UnixStream::pair().unwrap();
        let daemon = thread::spawn(move || serve(ring, daemon_socket));
        let mut lsn = 0u64;
        let mut in_flight = Vec::new();
        for seq in 1..=400u64 {
            let payloads = payloads_for(seq);
            let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
            let (kind, commit_lsn) = if refs.is_empty() {
                (EntryKind::Commit, lsn)
            } else {
                (EntryKind::Append, 0)
            };
            let got = client
                .submit(3, kind, Durability::Buffered, commit_lsn, &refs)
                .unwrap();
            assert_eq!(got, seq);
            let expected = if kind == EntryKind::Append {
                let first = lsn + 1;
                lsn += refs.len() as u64;
                Completion::ok(first, lsn)
            } else {
                Completion::ok(commit_lsn, commit_lsn)
            };
            in_flight.push((seq, expected));
            // Pipelines up to 4 entries (half the slots), then waits for them in order.
            if in_flight.len() == 4 || seq == 400 {
                for (seq, expected) in in_flight.drain(..) {
                    assert_eq!(client.wait(seq).unwrap(), expected, "entry {seq}");
                }
            }
        }
        drop(client_socket);
        let seen = daemon.join().unwrap();
        assert_eq!(seen.len(), 400);
        for (seq, kind, records) in seen {
            assert_eq!(records, payloads_for(seq), "entry {seq}");
            assert_eq!(kind == EntryKind::Commit, records.is_empty());
        }
    }
}

#[test]
fn a_full_area_makes_the_writer_wait_until_the_daemon_consumes() {
    let (mut ring, mut client, _) = connected(4096, 16);
    client.set_spin(Duration::ZERO);
    let payload = vec![0x5A; 1000]; // 1048-byte entries: three fit in 4096 bytes, not four
    let submitted = Arc::new(AtomicU64::new(0));
    let progress = submitted.clone();
    let writer = thread::spawn(move || {
        for seq in 1..=10u64 {
            let got = client
                .submit(0, EntryKind::Append, Durability::Buffered, 0, &[&payload])
                .unwrap();
            assert_eq!(got, seq);
            progress.store(seq, Ordering::SeqCst);
        }
        let answers: Vec<_> = (1..=10).map(|seq| client.wait(seq).unwrap()).collect();
        answers
    });
    // The writer sleeps on the futex once the area is full; nothing is consumed until then. (If
    // it did not wait for room it would submit all ten and sleep on an answer instead.)
    while !ring.client_waiting() || submitted.load(Ordering::SeqCst) < 3 {
        thread::yield_now();
    }
    assert_eq!(
        submitted.load(Ordering::SeqCst),
        3,
        "the fourth entry must wait for room"
    );
    let mut scratch = Vec::new();
    let mut completed = 0;
    while completed < 10 {
        match ring.next_entry(&mut scratch).unwrap() {
            Some(entry) => {
                let seq = entry.seq;
                assert_eq!(entry.records().next().unwrap().0.len(), 1000);
                ring.consume();
                ring.complete(seq, Completion::ok(seq, seq));
                completed = seq;
            }
            None => thread::yield_now(),
        }
    }
    let answers = writer.join().unwrap();
    assert_eq!(submitted.load(Ordering::SeqCst), 10);
    for (seq, answer) in (1..=10).zip(answers) {
        assert_eq!(answer, Completion::ok(seq, seq));
    }
}

/// A writer waiting for room is woken by a consumption alone (its answers come later), and a
/// client waiting for an answer sleeps through consumptions: the daemon does not even bump
/// `wake` for it (a `disk` commit would otherwise pay a futex call and two context switches).
#[test]
fn a_consumption_wakes_a_writer_waiting_for_room_but_not_a_client_waiting_for_an_answer() {
    let (mut ring, mut client, _) = connected(4096, 16);
    client.set_spin(Duration::ZERO);
    let payload = vec![0x5A; 1000]; // three 1048-byte entries fit in 4096 bytes, not four
    let submitted = Arc::new(AtomicU64::new(0));
    let progress = submitted.clone();
    let writer = thread::spawn(move || {
        for seq in 1..=4u64 {
            client
                .submit(0, EntryKind::Append, Durability::Disk, 0, &[&payload])
                .unwrap();
            progress.store(seq, Ordering::SeqCst);
        }
        client.wait_patiently(4).unwrap()
    });
    let patience = std::time::Instant::now() + Duration::from_secs(30);
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        while !done() {
            assert!(
                std::time::Instant::now() < patience,
                "never happened: {what}"
            );
            thread::yield_now();
        }
    };
    wait_for("the fourth entry waits for room", &|| {
        ring.client_waiting() && submitted.load(Ordering::SeqCst) == 3
    });
    let mut scratch = Vec::new();
    let mut consume_next = |ring: &mut DaemonRing, seq: u64| {
        let entry = ring.next_entry(&mut scratch).unwrap().expect("published");
        assert_eq!(entry.seq, seq);
        ring.consume();
    };
    // Room, and no answer: the writer must wake for the room alone.
    consume_next(&mut ring, 1);
    wait_for("the writer woke when entry 1 was consumed", &|| {
        submitted.load(Ordering::SeqCst) == 4
    });
    // (Its stores before publishing 4 are visible here: it cleared `client_waiting` after the
    // room wait, so a set flag now is the wait for the answer.)
    wait_for("the client sleeps for the answer to entry 4", &|| {
        ring.client_waiting()
    });
    let wakes = ring.wake_count();
    for seq in 2..=4 {
        consume_next(&mut ring, seq);
    }
    assert_eq!(
        ring.wake_count(),
        wakes,
        "a consumption bumped `wake` for a client waiting for an answer"
    );
    assert!(ring.client_waiting(), "the client woke without an answer");
    for seq in 1..=4 {
        ring.complete(seq, Completion::ok(seq, seq));
    }
    assert_eq!(writer.join().unwrap(), Completion::ok(4, 4));
}

/// What a wild write does to the published entry 2 (entry 1 is 56 bytes at position 0; entry
/// 2 holds one 8-byte record at 56..112).
#[derive(Clone, Copy, Debug)]
enum Damage {
    PayloadByte,
    HandleByte,
    LengthWord,
    TailBackwards,
}

#[test]
fn a_corrupted_published_entry_stops_the_ring_and_is_never_acknowledged() {
    for damage in [
        Damage::PayloadByte,
        Damage::HandleByte,
        Damage::LengthWord,
        Damage::TailBackwards,
    ] {
        let (mut ring, mut client, memfd) = connected(4096, 4);
        let wild = Mapping::map(memfd.as_fd(), DATA_OFFSET + 4096).unwrap();
        let mut scratch = Vec::new();

        let seq = client
            .submit(1, EntryKind::Append, Durability::Buffered, 0, &[b"one"])
            .unwrap();
        let entry = ring.next_entry(&mut scratch).unwrap().unwrap();
        assert_eq!(entry.seq, seq);
        ring.consume();
        ring.complete(seq, Completion::ok(1, 1));
        assert_eq!(client.wait(1).unwrap(), Completion::ok(1, 1));

        client
            .submit(
                1,
                EntryKind::Append,
                Durability::Buffered,
                0,
                &[b"two-two!"],
            )
            .unwrap();
        let entry2 = DATA_OFFSET + 56;
        // SAFETY: every offset lies inside the wild mapping (header page + 4096-byte area), and
        // no other thread touches the region while this runs.
        unsafe {
            match damage {
                Damage::PayloadByte => {
                    *wild
                        .as_ptr()
                        .add(entry2 + ENTRY_HEADER_BYTES + RECORD_HEADER_BYTES) ^= 0x01
                }
                Damage::HandleByte => *wild.as_ptr().add(entry2 + 16) ^= 0x80,
                Damage::LengthWord => *wild.as_ptr().add(entry2) = 0xF8,
                Damage::TailBackwards => {
                    (wild.as_ptr().add(TAIL_OFFSET) as *mut u64).write_volatile(8)
                }
            }
        }
        let fault = ring.next_entry(&mut scratch).unwrap_err();
        let expected_code = match damage {
            Damage::PayloadByte => FaultCode::BadPayloadCrc,
            Damage::HandleByte => FaultCode::BadHeaderCrc,
            Damage::LengthWord => FaultCode::BadLength,
            Damage::TailBackwards => FaultCode::BadTail,
        };
        assert_eq!((fault.code, fault.seq), (expected_code, 2), "{damage:?}");
        if let Damage::PayloadByte = damage {
            assert!(matches!(
                fault.error,
                Some(RingError::BadPayloadCrc {
                    seq: 2,
                    index: 0,
                    ..
                })
            ));
        }
        // Stopped for good: nothing more is read or acknowledged.
        assert!(!ring.has_published());
        assert_eq!(ring.next_entry(&mut scratch).unwrap_err(), fault);
        assert_eq!(ring.completed(), 1);
        let error = client.wait(2).unwrap_err();
        assert!(
            matches!(
                error,
                ShmError::Faulted {
                    fault_seq: 2,
                    seq: 2,
                    ..
                }
            ),
            "{damage:?}: {error}"
        );
        assert_eq!(error.fault_code(), Some(expected_code));
        let refused = client
            .submit(1, EntryKind::Append, Durability::Buffered, 0, &[b"three"])
            .unwrap_err();
        assert!(
            matches!(refused, ShmError::Faulted { seq: 3, .. }),
            "{refused}"
        );
    }
}

#[test]
fn damage_after_the_daemons_copy_changes_nothing() {
    let (mut ring, mut client, memfd) = connected(4096, 4);
    let wild = Mapping::map(memfd.as_fd(), DATA_OFFSET + 4096).unwrap();
    client
        .submit(1, EntryKind::Append, Durability::Disk, 0, &[b"checked"])
        .unwrap();
    let mut scratch = Vec::new();
    let entry = ring.next_entry(&mut scratch).unwrap().unwrap();
    // The client scribbles over its published entry after the daemon's copy was checked.
    // SAFETY: inside the mapping; no other thread touches the region.
    unsafe { std::ptr::write_bytes(wild.as_ptr().add(DATA_OFFSET), 0xFF, 56) };
    assert_eq!(entry.records().next().unwrap().0, b"checked");
    assert_eq!(entry.durability, Durability::Disk);
    ring.consume();
    ring.complete(1, Completion::ok(1, 1));
    assert_eq!(client.wait(1).unwrap(), Completion::ok(1, 1));
}

#[test]
fn mark_gone_wakes_a_client_sleeping_on_a_completion() {
    let (ring, mut client, _) = connected(4096, 4);
    client.set_spin(Duration::ZERO);
    let gone = client.gone_handle();
    let seq = client
        .submit(1, EntryKind::Append, Durability::Buffered, 0, &[b"lost"])
        .unwrap();
    let waiter = thread::spawn(move || client.wait(seq));
    while !ring.client_waiting() {
        thread::yield_now();
    }
    gone.mark_gone();
    assert!(matches!(waiter.join().unwrap(), Err(ShmError::DaemonGone)));
    assert!(gone.is_gone());
}

#[test]
fn mark_gone_before_waiting_still_returns_published_answers() {
    let (mut ring, mut client, _) = connected(4096, 4);
    let seq = client
        .submit(1, EntryKind::Append, Durability::Buffered, 0, &[b"kept"])
        .unwrap();
    let seq2 = client
        .submit(1, EntryKind::Append, Durability::Buffered, 0, &[b"lost"])
        .unwrap();
    let mut scratch = Vec::new();
    ring.next_entry(&mut scratch).unwrap().unwrap();
    ring.consume();
    ring.complete(seq, Completion::ok(1, 1));
    client.mark_gone();
    assert_eq!(client.wait(seq).unwrap(), Completion::ok(1, 1));
    assert!(matches!(client.wait(seq2), Err(ShmError::DaemonGone)));
    assert!(matches!(
        client.submit(1, EntryKind::Append, Durability::Buffered, 0, &[b"x"]),
        Err(ShmError::DaemonGone)
    ));
}

#[test]
fn entries_that_cannot_go_by_ring_are_refused_with_a_reason() {
    let (_ring, mut client, _) = connected(4096, 4);
    let big = vec![0u8; 4096];
    assert!(matches!(
        client.submit(0, EntryKind::Append, Durability::Buffered, 0, &[&big]),
        Err(ShmError::EntryTooLarge { max: 4096, .. })
    ));
    assert!(matches!(
        client.submit(0, EntryKind::Append, Durability::Buffered, 0, &[]),
        Err(ShmError::BadEntry(RingError::BadRecordCount { .. }))
    ));
    assert!(matches!(
        client.submit(0, EntryKind::Commit, Durability::Disk, 9, &[b"x"]),
        Err(ShmError::BadEntry(RingError::BadRecordCount { .. }))
    ));
    assert!(matches!(
        client.wait(1),
        Err(ShmError::NotSubmitted { seq: 1, next: 1 })
    ));
    // The refusals used no seq: the next entry is still 1.
    assert_eq!(client.next_seq(), 1);
}

#[test]
fn a_region_that_is_not_a_ring_is_refused() {
    use stela_net::shm::os::{create_sealed_memfd, eventfd};
    // Right size, no header.
    let memfd = create_sealed_memfd(c"blank", 8192).unwrap();
    let error = ClientRing::from_fds(memfd, eventfd().unwrap()).unwrap_err();
    assert!(
        matches!(error, ShmError::Layout(RingError::BadMagic { .. })),
        "{error}"
    );
    // A memfd the daemon forgot to seal.
    // SAFETY: a plain syscall; the descriptor is checked and then owned.
    let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
    let unsealed = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let error = ClientRing::from_fds(unsealed, eventfd().unwrap()).unwrap_err();
    assert!(matches!(error, ShmError::Unsealed { .. }), "{error}");
    // A ring already in use (its tail moved) is not handed to a second client.
    let (_ring, memfd, efd) = DaemonRing::create(4096, 4).unwrap();
    let second = memfd.try_clone().unwrap();
    let second_efd = efd.try_clone().unwrap();
    let mut first = ClientRing::from_fds(memfd, efd).unwrap();
    first
        .submit(0, EntryKind::Append, Durability::Buffered, 0, &[b"a"])
        .unwrap();
    let error = ClientRing::from_fds(second, second_efd).unwrap_err();
    assert!(
        matches!(error, ShmError::Inconsistent { what: "tail", .. }),
        "{error}"
    );
}

/// The child's side of [`a_client_killed_before_publishing_leaves_nothing_to_read`]; a no-op
/// unless `STELA_SHM_CHILD` is set.
#[test]
fn killed_client_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    // SAFETY: fd 0 is the socket the parent gave us as stdin; we only borrow it here.
    let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    let (memfd, eventfd) = receive_fds(stdin);
    let mut client = ClientRing::from_fds(memfd, eventfd).unwrap();
    client
        .submit(
            2,
            EntryKind::Append,
            Durability::Buffered,
            0,
            &[b"published"],
        )
        .unwrap();
    client
        .write_entry(
            2,
            EntryKind::Append,
            Durability::Buffered,
            0,
            &[b"never published"],
        )
        .unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "WRITTEN").unwrap();
    out.flush().unwrap();
    // The parent kills us here; if it did not, publishing would show up as a failure there.
    thread::sleep(Duration::from_secs(60));
    client.publish().unwrap();
}

#[test]
fn a_client_killed_before_publishing_leaves_nothing_to_read() {
    let (mut ring, memfd, eventfd) = DaemonRing::create(4096, 4).unwrap();
    let wild = Mapping::map(memfd.as_fd(), DATA_OFFSET + 4096).unwrap();
    let (daemon_end, child_end) = UnixStream::pair().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "killed_client_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::from(OwnedFd::from(child_end)))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the client child");
    send_fds(&daemon_end, &memfd, &eventfd);
    drop((memfd, eventfd));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = lines
            .next()
            .expect("the child reports before it sleeps")
            .unwrap();
        // (libtest's "test killed_client_child ... " may precede it on the line)
        if line.ends_with("WRITTEN") {
            break;
        }
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child was killed, not finished");

    // The second entry's bytes are in the region (the child wrote them) ...
    let first_len = stela_proto::ring::entry_len(&[b"published"]).unwrap();
    let second = first_len + ENTRY_HEADER_BYTES + RECORD_HEADER_BYTES;
    let mut written = [0u8; 15];
    // SAFETY: inside the mapping; the child is dead, nothing else writes the region.
    unsafe {
        std::ptr::copy_nonoverlapping(
            wild.as_ptr().add(DATA_OFFSET + second),
            written.as_mut_ptr(),
            15,
        )
    };
    assert_eq!(&written, b"never published");
    // ... but the daemon reads only the published one, and then nothing, without a fault.
    let mut scratch = Vec::new();
    let entry = ring
        .next_entry(&mut scratch)
        .unwrap()
        .expect("the published entry");
    assert_eq!(entry.records().next().unwrap().0, b"published");
    ring.consume();
    ring.complete(1, Completion::ok(1, 1));
    assert!(ring.next_entry(&mut scratch).unwrap().is_none());
    assert!(!ring.has_published());
    assert!(ring.set_asleep(), "nothing is published: safe to sleep");
}
