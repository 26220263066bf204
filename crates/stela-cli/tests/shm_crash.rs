//! Crashes on the shared-memory path, with real processes: a `stela serve` daemon, and clients
//! that append and commit through the per-connection ring (`Transport::SharedMemory`, checked:
//! a client that does not get a ring fails the test instead of quietly using the socket).
//!
//! What it proves:
//! - `ring_client_sigkill_loses_nothing_acknowledged`: round after round against one daemon,
//!   (a) a client process that has published and had acknowledged a few entries, then *written*
//!   three more entries into its ring without publishing them (a batch at `buffered`, a single
//!   at `disk`, a batch; with the doorbell rung so the daemon looks at the ring), is SIGKILLed at
//!   exactly that point; (b) a client process streaming appends through three rings (singles at
//!   `buffered`, batches at `disk`, batches at `buffered`) is SIGKILLed at a random moment.
//!   Meanwhile a client of this process commits at `disk` through its own ring, and must keep
//!   getting acknowledgements after every kill; the daemon must stay up. Then `stela
//!   power-fail` and a SIGKILL of the daemon, and the log read embedded: every acknowledged
//!   record is at its LSN with its content; each writer's records are its seqs in order; the
//!   unpublished entries' records are absent (the killed writer has exactly its acknowledged
//!   records, nothing more); a streaming writer has at most its one entry in flight beyond its
//!   acknowledgements (published but unanswered entries may survive, as for any crash).
//! - `daemon_death_ends_a_ring_wait_with_an_error`: the daemon is stopped (SIGSTOP) so nothing
//!   it owes is ever answered; three clients of this process then block in the ring (a `disk`
//!   append, a `buffered` append, a `disk` commit), each confirmed asleep on the ring's futex
//!   (`/proc/self/task/TID/syscall`); the daemon is SIGKILLed; each call must return an error
//!   saying the daemon is gone. A call still blocked ten seconds later fails the test (a hang
//!   guard, not a timing figure).
//! - `daemon_sigkill_amid_ring_commits`: the daemon is SIGKILLed at a random moment while three
//!   ring clients append (singles at `disk`, singles at `buffered`, batches at `disk`); every
//!   client's call ends with the same error; the restarted daemon recovers a log holding every
//!   `disk` acknowledgement (and so every record before it), each at its LSN.
//!
//! Randomness (kill moments) comes from `STELA_SHM_SEED`, printed by each test. Long versions:
//! `cargo test -p stela --test shm_crash -- --ignored`.
//!
//! The client processes are this test binary itself: it re-runs itself with `--exact shm_child`
//! and the mode, socket and round in `STELA_SHM_CHILD_*`; without them `shm_child` does nothing.

mod common;

use common::records::{
    check_log, key_of, open_ring_client, read_embedded, read_through, rec, summary, Key, Rec, Rng,
    TYPE_TAG,
};
use common::{stela, text, Daemon};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use stela_client::{Codec, Durability, Lsn};
use stela_net::shm::{recv_with_fds, ClientRing, EntryKind};
use stela_proto::frame::{self, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
use stela_proto::{Request, RequestBody, Response, ResponseBody, PROTOCOL_VERSION};
use stela_testkit::child::{self_command, tagged_numbers, SelfChild};

const CHILD_MODE: &str = "STELA_SHM_CHILD_MODE";
const CHILD_SOCKET: &str = "STELA_SHM_CHILD_SOCKET";
const CHILD_ROUND: &str = "STELA_SHM_CHILD_ROUND";

/// The log every client of the first test writes.
const LOG: &str = "ring";
/// The writer number of the client killed with unpublished entries in its ring.
const UNPUBLISHED_WRITER: u32 = 10;
/// The writer number (and round) of the client that keeps committing in this process.
const BYSTANDER: u32 = 100;
const BYSTANDER_ROUND: u32 = u32::MAX;
/// The streaming child's writers: (writer, durability, largest batch).
const STREAM_WRITERS: [(u32, Durability, u64); 3] = [
    (0, Durability::Buffered, 1),
    (1, Durability::Disk, 3),
    (2, Durability::Buffered, 4),
];

/// How long a call may stay blocked after the daemon died before the test calls it a hang.
const HANG: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The child processes.

/// Writes one line to stdout at once, or ends the process if the parent stopped listening.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

fn ack_line(lsn: u64, key: Key) -> String {
    format!("ACK {lsn} {} {} {}", key.round, key.writer, key.seq)
}

/// The client processes' side; a no-op in a normal test run.
#[test]
fn shm_child() {
    let Some(mode) = std::env::var_os(CHILD_MODE) else {
        return;
    };
    let socket = PathBuf::from(std::env::var_os(CHILD_SOCKET).unwrap());
    let round: u32 = std::env::var(CHILD_ROUND).unwrap().parse().unwrap();
    match mode.to_str().unwrap() {
        "stream" => stream_child(&socket, round),
        "unpublished" => unpublished_child(&socket, round),
        other => panic!("unknown child mode {other}"),
    }
}

/// Appends through three rings until killed (or, should nobody kill it, for 20 s).
fn stream_child(socket: &Path, round: u32) {
    let wals: Vec<_> = STREAM_WRITERS
        .iter()
        .map(|&(_, durability, _)| open_ring_client(socket, LOG, durability))
        .collect();
    say("OPENED");
    std::thread::scope(|scope| {
        for (&(writer, durability, batch), wal) in STREAM_WRITERS.iter().zip(&wals) {
            scope.spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(20);
                let mut seq = 0;
                while Instant::now() < deadline {
                    let n = 1 + seq % batch;
                    let records: Vec<Rec> = (seq..seq + n)
                        .map(|s| rec(Key::new(round, writer, s)))
                        .collect();
                    let last = match (durability, n) {
                        (Durability::Disk, _) => wal.append_batch_durable(&records),
                        (_, 1) => wal.append(&records[0]),
                        _ => wal.append_batch(&records),
                    }
                    .expect("child: append through the ring")
                    .get();
                    for i in 0..n {
                        say(&ack_line(
                            last + 1 - n + i,
                            Key::new(round, writer, seq + i),
                        ));
                    }
                    seq += n;
                }
            });
        }
    });
}

/// A connection spoken by hand, for the child that needs the raw ring.
struct RawConnection {
    stream: UnixStream,
    next_id: u64,
}

impl RawConnection {
    fn connect(socket: &Path) -> RawConnection {
        let mut conn = RawConnection {
            stream: UnixStream::connect(socket).expect("connect to the daemon"),
            next_id: 1,
        };
        match conn.request(RequestBody::Hello {
            version: PROTOCOL_VERSION,
            client: "shm_crash raw child".into(),
            role: stela_proto::Role::Client,
            token: None,
        }) {
            ResponseBody::Welcome { .. } => conn,
            other => panic!("Hello answered {other:?}"),
        }
    }

    fn send(&mut self, body: RequestBody) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let mut out = Vec::new();
        frame::encode(&Request { id, body }, &mut out).unwrap();
        self.stream.write_all(&out).expect("send a request");
        id
    }

    fn request(&mut self, body: RequestBody) -> ResponseBody {
        let id = self.send(body);
        let mut header = [0u8; FRAME_HEADER_BYTES];
        self.stream.read_exact(&mut header).expect("read an answer");
        let header = frame::parse_header(header, MAX_FRAME_BYTES).unwrap();
        let mut body = vec![0u8; header.body_len];
        self.stream.read_exact(&mut body).expect("read an answer");
        let response: Response = frame::decode_body(header, &body).expect("a valid answer");
        assert_eq!(response.id, id, "an answer to another request");
        response.body
    }

    /// Asks for a ring; returns it and a copy of its doorbell descriptor.
    fn map_ring(&mut self) -> (ClientRing, OwnedFd) {
        let id = self.send(RequestBody::MapRing { data_bytes: 0 });
        // The answer carries the descriptors: read it with recvmsg, exactly its bytes.
        let mut fds = Vec::new();
        let mut bytes = vec![0u8; FRAME_HEADER_BYTES];
        let mut filled = 0;
        while filled < bytes.len() {
            let n = recv_with_fds(self.stream.as_fd(), &mut bytes[filled..], &mut fds)
                .expect("receive the ring answer");
            assert!(n > 0, "the daemon closed the connection instead of a ring");
            filled += n;
            if filled == FRAME_HEADER_BYTES {
                let header =
                    frame::parse_header(bytes[..].try_into().unwrap(), MAX_FRAME_BYTES).unwrap();
                bytes.resize(FRAME_HEADER_BYTES + header.body_len, 0);
            }
        }
        let header = frame::parse_header(
            bytes[..FRAME_HEADER_BYTES].try_into().unwrap(),
            MAX_FRAME_BYTES,
        )
        .unwrap();
        let response: Response =
            frame::decode_body(header, &bytes[FRAME_HEADER_BYTES..]).expect("a valid answer");
        assert_eq!(response.id, id);
        assert!(
            matches!(response.body, ResponseBody::RingMapped { .. }),
            "MapRing answered {:?}",
            response.body
        );
        assert_eq!(
            fds.len(),
            3,
            "the ring answer carries memory, doorbell and the user's wake board"
        );
        let mut fds = fds.into_iter();
        let (memory, doorbell, board) = (
            fds.next().unwrap(),
            fds.next().unwrap(),
            fds.next().unwrap(),
        );
        let bell = doorbell.try_clone().unwrap();
        let mut ring = ClientRing::from_fds(memory, doorbell).expect("map the ring");
        let board = stela_net::shm::Board::from_fd(board).expect("map the wake board");
        assert!(ring.attach_board(board), "the ring has a seat on the board");
        (ring, bell)
    }
}

fn encode(record: &Rec) -> Vec<u8> {
    Codec::MessagePack.encode(record).unwrap()
}

/// Opens (creating) the test's log on `conn`: its handle.
fn open_log(conn: &mut RawConnection) -> u32 {
    match conn.request(RequestBody::Open {
        log: LOG.into(),
        codec: "msgpack".into(),
        type_tag: TYPE_TAG.into(),
        create: true,
        durability: None,
        schema: None,
    }) {
        ResponseBody::Opened { handle, .. } => handle,
        other => panic!("Open answered {other:?}"),
    }
}

/// Publishes a few entries and reports their acknowledgements, then writes three entries
/// without publishing them, rings the doorbell, reports `WRITTEN`, and waits to be killed.
fn unpublished_child(socket: &Path, round: u32) {
    let key = |seq| Key::new(round, UNPUBLISHED_WRITER, seq);
    let mut conn = RawConnection::connect(socket);
    let handle = open_log(&mut conn);
    let (mut ring, doorbell) = conn.map_ring();
    let published = 1 + u64::from(round % 4);
    for seq in 0..published {
        let payload = encode(&rec(key(seq)));
        let entry = ring
            .submit(
                handle,
                EntryKind::Append,
                Durability::Buffered,
                0,
                &[&payload],
            )
            .expect("publish an entry");
        let done = ring
            .wait(entry)
            .expect("the daemon answers a published entry");
        assert!(done.is_ok(), "the daemon refused entry {entry}: {done:?}");
        assert_eq!(done.first_lsn, done.last_lsn);
        say(&ack_line(done.last_lsn, key(seq)));
    }
    let mut seq = published;
    for (durability, records) in [
        (Durability::Buffered, 3),
        (Durability::Disk, 1),
        (Durability::Buffered, 2),
    ] {
        let payloads: Vec<Vec<u8>> = (seq..seq + records).map(|s| encode(&rec(key(s)))).collect();
        let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        ring.write_entry(handle, EntryKind::Append, durability, 0, &slices)
            .expect("write an entry into the ring");
        seq += records;
    }
    // The daemon looks at the ring now, with the unpublished entries in it.
    std::fs::File::from(doorbell)
        .write_all(&1u64.to_ne_bytes())
        .expect("ring the doorbell");
    say("WRITTEN");
    std::thread::sleep(Duration::from_secs(60));
}

// ---------------------------------------------------------------------------------------------
// The parent's side of a child.

struct ChildProcess(SelfChild);

impl ChildProcess {
    fn spawn(mode: &str, socket: &Path, round: u32) -> ChildProcess {
        let mut command = self_command("shm_child");
        command
            .env(CHILD_MODE, mode)
            .env(CHILD_SOCKET, socket)
            .env(CHILD_ROUND, round.to_string());
        ChildProcess(SelfChild::spawn(
            format!("{mode} child of round {round}"),
            command,
        ))
    }

    /// Waits for a line containing `marker`; fails the test if the child ends first or takes
    /// more than 30 s.
    fn wait_for(&mut self, marker: &str) {
        self.0.wait_for(marker, Duration::from_secs(30));
    }

    /// SIGKILLs the child; returns the acknowledgements it reported.
    fn kill(self) -> Vec<(u64, Key)> {
        tagged_numbers(&self.0.kill(), "ACK ")
            .into_iter()
            .map(|f| (f[0], Key::new(f[1] as u32, f[2] as u32, f[3])))
            .collect()
    }
}

fn record_acks(acked: &mut BTreeMap<u64, Key>, acks: Vec<(u64, Key)>) {
    for (lsn, key) in acks {
        let before = acked.insert(lsn, key);
        assert!(
            before.is_none(),
            "LSN {lsn} acknowledged twice: {before:?}, {key:?}"
        );
    }
}

/// Waits until `counter` passes `above`: the bystander got another acknowledgement.
fn wait_for_progress(counter: &AtomicU64, above: u64, when: &str) {
    let deadline = Instant::now() + HANG;
    while counter.load(Ordering::SeqCst) <= above {
        assert!(
            Instant::now() < deadline,
            "the bystander client got no acknowledgement for 10 s {when}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Ring clients SIGKILLed.

fn ring_client_sigkill_rounds(rounds: u32) {
    let mut rng = Rng::from_env("ring_client_sigkill");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    // Buffers are written only when full or at the power-fail (or for a `disk` waiter): most
    // acknowledged `buffered` records are only in the daemon's memory when their client dies.
    let mut daemon = Daemon::start(
        &dir,
        &["--write-threshold", "512KiB", "--flush-interval", "600000"],
    );
    let socket = daemon.socket();
    let stop = AtomicBool::new(false);
    let bystander_acks = AtomicU64::new(0);
    let mut acked = BTreeMap::new();
    let mut unpublished_rounds = 0;
    std::thread::scope(|scope| {
        // A failed round must not leave the scope waiting for the bystander for ever.
        let _stop_on_exit = StopOnDrop(&stop);
        let bystander = scope.spawn(|| {
            let wal = open_ring_client(&socket, LOG, Durability::Disk);
            let mut acks = Vec::new();
            let mut seq = 0;
            while !stop.load(Ordering::SeqCst) {
                let key = Key::new(BYSTANDER_ROUND, BYSTANDER, seq);
                let lsn = wal
                    .append_durable(&rec(key))
                    .expect("the bystander's disk append through its ring")
                    .get();
                acks.push((lsn, key));
                bystander_acks.fetch_add(1, Ordering::SeqCst);
                seq += 1;
            }
            acks
        });
        for round in 0..rounds {
            // (a) Killed with entries written but not published.
            let mut child = ChildProcess::spawn("unpublished", &socket, round);
            child.wait_for("WRITTEN");
            let before = bystander_acks.load(Ordering::SeqCst);
            record_acks(&mut acked, child.kill());
            unpublished_rounds += 1;
            daemon.assert_alive(&format!("after the unpublished client of round {round}"));
            wait_for_progress(&bystander_acks, before, "after a client was killed");

            // (b) Killed at a random moment of a stream of appends.
            let delay = rng.millis(5, 80);
            let mut child = ChildProcess::spawn("stream", &socket, round);
            child.wait_for("OPENED");
            std::thread::sleep(delay);
            let before = bystander_acks.load(Ordering::SeqCst);
            record_acks(&mut acked, child.kill());
            daemon.assert_alive(&format!("after the streaming client of round {round}"));
            wait_for_progress(&bystander_acks, before, "after a client was killed");
        }
        stop.store(true, Ordering::SeqCst);
        record_acks(&mut acked, bystander.join().unwrap());
    });
    let streamed = acked
        .values()
        .filter(|k| k.writer < UNPUBLISHED_WRITER)
        .count();
    assert!(streamed > 0, "no streaming client was ever acknowledged");

    // The emergency flush, then a SIGKILL: everything acknowledged must be in the files now.
    let out = stela(&["power-fail", "--dir", daemon.dir_arg()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    daemon.kill();

    let log = read_embedded(&dir, LOG);
    // A streaming writer may have had its one entry (a batch) published and unanswered; the
    // unpublished writer's extra entries were never published; the bystander was not killed.
    let max_batch = STREAM_WRITERS.iter().map(|w| w.2).max().unwrap();
    let beyond = check_log(&log, &acked, |key| match key.writer {
        UNPUBLISHED_WRITER | BYSTANDER => 0,
        _ => max_batch,
    });
    assert!(
        beyond.is_empty(),
        "{} acknowledged LSNs missing after the power-fail flush: {}",
        beyond.len(),
        summary(&beyond)
    );
    let unpublished_in_log = log
        .iter()
        .filter(|r| key_of(r).writer == UNPUBLISHED_WRITER)
        .count();
    let unpublished_acked = acked
        .values()
        .filter(|k| k.writer == UNPUBLISHED_WRITER)
        .count();
    assert_eq!(
        unpublished_in_log, unpublished_acked,
        "records of entries never published are in the log"
    );
    eprintln!(
        "ring_client_sigkill: {rounds} rounds ({unpublished_rounds} kills with unpublished \
         entries), {} acknowledged ({streamed} by streaming clients), {} in the log",
        acked.len(),
        log.len()
    );
}

#[test]
fn ring_client_sigkill_loses_nothing_acknowledged() {
    ring_client_sigkill_rounds(6);
}

#[test]
#[ignore = "long: 100 rounds of ring client kills"]
fn ring_client_sigkill_loses_nothing_acknowledged_100_rounds() {
    ring_client_sigkill_rounds(100);
}

// ---------------------------------------------------------------------------------------------
// 2. The daemon killed while ring clients wait.

/// Whether thread `tid` of this process is blocked in FUTEX_WAIT (the ring's sleep). `false`
/// if the thread is gone (its call returned: the caller finds out why).
fn in_futex_wait(tid: libc::pid_t) -> bool {
    let path = format!("/proc/self/task/{tid}/syscall");
    std::fs::read_to_string(path).is_ok_and(|text| {
        text.split_whitespace().next() == Some(libc::SYS_futex.to_string().as_str())
    })
}

/// SIGSTOPs process `pid` and returns once every thread of it is stopped (the signal takes
/// effect asynchronously: a daemon still running could answer one more entry).
fn stop_process(pid: libc::pid_t) {
    // SAFETY: kill(2) on a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP");
    let deadline = Instant::now() + HANG;
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        let all_stopped = tasks.flatten().all(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state is the first field after the parenthesised command name.
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            matches!(state, Some("T" | "t"))
        });
        if all_stopped {
            return;
        }
        assert!(Instant::now() < deadline, "the daemon did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The error a ring client must get once its daemon is gone.
fn assert_daemon_gone(what: &str, result: &Result<(), stela_client::Error>) {
    match result {
        Ok(()) => panic!("{what}: acknowledged by a daemon that was stopped, then killed"),
        // The connection is lost mid-call: its outcome is unknown, and it says why.
        Err(error @ stela_client::Error::Disconnected { cause, .. }) => assert!(
            cause.contains("daemon is gone"),
            "{what}: the error does not say the daemon is gone: {error}"
        ),
        Err(other) => panic!("{what}: not the ring's error: {other}"),
    }
}

#[test]
fn daemon_death_ends_a_ring_wait_with_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    let socket = daemon.socket();
    let key = |writer, seq| Key::new(0, writer, seq);
    let disk = open_ring_client(&socket, "gone", Durability::Disk);
    let buffered = open_ring_client(&socket, "gone", Durability::Buffered);
    let committer = open_ring_client(&socket, "gone", Durability::Disk);
    // Each ring works before the daemon stops.
    disk.append_durable(&rec(key(0, 0))).unwrap();
    buffered.append(&rec(key(1, 0))).unwrap();
    let to_commit = committer.append(&rec(key(2, 0))).unwrap();

    stop_process(daemon.child.id() as libc::pid_t);
    let (results_tx, results) = mpsc::channel();
    let (tids_tx, tids) = mpsc::channel();
    type Call = Box<dyn FnOnce() -> Result<(), stela_client::Error> + Send>;
    let calls: Vec<(&str, Call)> = vec![
        (
            "a disk append",
            Box::new(move || disk.append_durable(&rec(key(0, 1))).map(drop)),
        ),
        (
            "a buffered append",
            Box::new(move || buffered.append(&rec(key(1, 1))).map(drop)),
        ),
        (
            "a disk commit",
            Box::new(move || committer.commit(Lsn::new(to_commit.get()))),
        ),
    ];
    for (what, call) in calls {
        let (results_tx, tids_tx) = (results_tx.clone(), tids_tx.clone());
        std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tids_tx.send((what, unsafe { libc::gettid() })).unwrap();
            let result = call();
            let _ = results_tx.send((what, result));
        });
    }
    drop(results_tx);
    // Every call is asleep in the ring before the daemon dies (not spinning, not on its way).
    let deadline = Instant::now() + HANG;
    for (what, tid) in tids.iter().take(3) {
        while !in_futex_wait(tid) {
            if let Ok((what, result)) = results.try_recv() {
                panic!("{what} returned while the daemon was stopped: {result:?}");
            }
            assert!(
                Instant::now() < deadline,
                "{what} never went to sleep in the ring"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    daemon.kill();
    for _ in 0..3 {
        let (what, result) = results.recv_timeout(HANG).unwrap_or_else(|_| {
            panic!("a call waiting in the ring was still blocked 10 s after the daemon died")
        });
        assert_daemon_gone(what, &result);
    }
}

fn daemon_sigkill_rounds(rounds: u32) {
    let mut rng = Rng::from_env("daemon_sigkill_amid_ring_commits");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    // Buffered records are written when 200 ms old, when a buffer holds 4 KiB, or for a `disk`
    // waiter: a kill finds some on disk, some in memory only.
    let args = ["--flush-interval", "200"];
    let mut daemon = Daemon::start(&dir, &args);
    let writers = [
        (0u32, Durability::Disk, 1u64),
        (1, Durability::Buffered, 1),
        (2, Durability::Disk, 3),
    ];
    let mut disk_acks = 0;
    for round in 0..rounds {
        let log = format!("r{round}");
        let socket = daemon.socket();
        let (results_tx, results) = mpsc::channel();
        for (writer, durability, batch) in writers {
            let wal = open_ring_client(&socket, &log, durability);
            let results_tx = results_tx.clone();
            std::thread::spawn(move || {
                let mut acks = Vec::new();
                let mut seq = 0;
                let deadline = Instant::now() + Duration::from_secs(20);
                let error = loop {
                    if Instant::now() > deadline {
                        break None;
                    }
                    let n = 1 + seq % batch;
                    let records: Vec<Rec> = (seq..seq + n)
                        .map(|s| rec(Key::new(round, writer, s)))
                        .collect();
                    let result = match durability {
                        Durability::Disk => wal.append_batch_durable(&records),
                        _ => wal.append(&records[0]),
                    };
                    match result {
                        Ok(last) => {
                            for i in 0..n {
                                acks.push((
                                    last.get() + 1 - n + i,
                                    Key::new(round, writer, seq + i),
                                    durability,
                                ));
                            }
                            seq += n;
                        }
                        Err(error) => break Some(error),
                    }
                };
                let _ = results_tx.send((writer, acks, error));
            });
        }
        drop(results_tx);
        std::thread::sleep(rng.millis(20, 150));
        daemon.kill();
        let mut acked = BTreeMap::new();
        let mut durability_of = BTreeMap::new();
        for _ in writers {
            let (writer, acks, error) = results.recv_timeout(HANG).unwrap_or_else(|_| {
                panic!("round {round}: a ring client was still blocked 10 s after the daemon died")
            });
            let error = error.unwrap_or_else(|| {
                panic!("round {round}: writer {writer} never noticed the daemon's death")
            });
            assert_daemon_gone(&format!("round {round}, writer {writer}"), &Err(error));
            for (lsn, key, durability) in acks {
                assert!(acked.insert(lsn, key).is_none(), "LSN {lsn} acked twice");
                durability_of.insert(lsn, durability);
            }
        }
        daemon = Daemon::start(&dir, &args);
        let recovered = read_through(&daemon.socket(), &log);
        let beyond = check_log(&recovered, &acked, |_| 3);
        for lsn in &beyond {
            assert_eq!(
                durability_of[lsn],
                Durability::Buffered,
                "round {round}: LSN {lsn} was acknowledged at disk and is lost ({} recovered)",
                recovered.len()
            );
        }
        disk_acks += durability_of
            .values()
            .filter(|&&d| d == Durability::Disk)
            .count();
        eprintln!(
            "round {round}: {} acknowledged, {} recovered, {} buffered acknowledgements lost",
            acked.len(),
            recovered.len(),
            beyond.len()
        );
    }
    assert!(disk_acks > 0, "nothing was ever acknowledged at disk");
    daemon.terminate();
}

#[test]
fn daemon_sigkill_amid_ring_commits() {
    daemon_sigkill_rounds(3);
}

#[test]
#[ignore = "long: 40 daemon kills and restarts"]
fn daemon_sigkill_amid_ring_commits_40_rounds() {
    daemon_sigkill_rounds(40);
}

/// Sets its flag when dropped: stops the bystander when the test's thread leaves the scope,
/// panicking or not.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// `stela run`'s fsync at `disk` is one ring entry: a commit of the log's end
/// (`stela_proto::ring::COMMIT_END`). It must cover every append answered before it on any
/// connection (another process's WAL write), answer with that LSN, and leave it synced; and it
/// must be answered by the daemon through the ring itself (a daemon that does not know the
/// marker refuses it with `NotAppended`, and the client would then need a socket round trip).
#[test]
fn a_ring_commit_of_the_end_covers_appends_of_other_connections() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    let socket = daemon.socket();
    let (mut writer, mut committer) = (
        RawConnection::connect(&socket),
        RawConnection::connect(&socket),
    );
    let (write_handle, commit_handle) = (open_log(&mut writer), open_log(&mut committer));
    let (mut writes, _) = writer.map_ring();
    let (mut commits, _) = committer.map_ring();
    let end_commit = |commits: &mut ClientRing| {
        let seq = commits
            .submit(
                commit_handle,
                EntryKind::Commit,
                Durability::Disk,
                stela_proto::ring::COMMIT_END,
                &[],
            )
            .expect("publish the commit");
        commits.wait_patiently(seq).expect("the daemon answers")
    };
    // An empty log: the end is LSN 0, nothing to wait for.
    let empty = end_commit(&mut commits);
    assert!(empty.is_ok(), "{empty:?}");
    assert_eq!(empty.last_lsn, 0);
    for round in 0..5u64 {
        let payloads: Vec<Vec<u8>> = (0..3)
            .map(|seq| encode(&rec(Key::new(0, 1, round * 3 + seq))))
            .collect();
        let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        let seq = writes
            .submit(
                write_handle,
                EntryKind::Append,
                Durability::Buffered,
                0,
                &slices,
            )
            .unwrap();
        let appended = writes.wait(seq).unwrap();
        assert!(appended.is_ok(), "{appended:?}");
        let done = end_commit(&mut commits);
        assert!(done.is_ok(), "the end commit was refused: {done:?}");
        assert_eq!(done.last_lsn, appended.last_lsn, "the end it committed");
        match committer.request(RequestBody::Positions {
            handle: commit_handle,
        }) {
            ResponseBody::Positions(p) => assert!(p.durable_lsn >= appended.last_lsn, "{p:?}"),
            other => panic!("Positions answered {other:?}"),
        }
    }
}
