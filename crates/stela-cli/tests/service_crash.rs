//! Crashes around the log daemon, with real processes: `stela serve` (the binary this crate
//! builds) is started, signalled and killed; clients run in this process or in a child process
//! that is killed too. After each crash the log is checked against every acknowledgement.
//!
//! What it proves:
//! - `client_sigkill_loses_nothing_acknowledged`: a client process appending at `buffered` as
//!   fast as it can is SIGKILLed at a random moment, round after round, against one daemon.
//!   After `stela power-fail` (the emergency flush) and then a SIGKILL of the daemon itself,
//!   the log files, read with the embedded `stela_wal::Wal`, hold every acknowledged record at
//!   the LSN it was given, in order, and nothing invented: each writer's records are its seqs
//!   0, 1, 2... with at most the one request in flight at the kill beyond its last
//!   acknowledgement.
//! - `daemon_sigkill_keeps_every_disk_acknowledgement`: clients append at `disk` and at
//!   `buffered` while the daemon is SIGKILLed at a random moment; `stela serve` is restarted on
//!   the same directory, round after round. The recovered log is contiguous from LSN 1 (a prefix
//!   of what was appended), contains every LSN acknowledged at `disk` (hence every `buffered` one
//!   before it), every record in it is the one sent under that LSN, and what one restart
//!   recovered is still there at the next.
//! - `sigterm_flushes_every_buffered_acknowledgement`: SIGTERM in the middle of `buffered`
//!   appends (buffers written only when full, never by time): the daemon exits 0 and every
//!   acknowledged record is in the files.
//! - `malformed_input_gets_an_error_and_a_closed_connection`: garbage, a bad checksum, a length
//!   over the limit, a body that is not a request, a frame cut short, a request before `Hello`,
//!   a `Hello` of another protocol revision: each connection gets one `Error` answer naming the
//!   problem, then is closed; a well-behaved client on the same daemon keeps appending
//!   throughout, and the daemon never dies.
//! - `status_json_shows_the_cap_and_crash_semantics`: `stela status --json` gives the dirty cap
//!   with its inputs and derivation (a cap set by the power window, so every number is checked)
//!   and the crash-semantics lines; the socket is a socket of mode 0600.
//!
//! Randomness (kill moments) comes from `STELA_SERVICE_SEED`, printed by each test so a failure
//! can be replayed. The long versions: `cargo test -p stela --test service_crash -- --ignored`.
//!
//! The client process of the first test is this test binary itself: it re-runs itself with
//! `--exact client_child` and the socket in `STELA_SERVICE_CHILD_SOCKET`; without that variable
//! `client_child` does nothing.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use stela_client::{Durability, ErrorCode, Lsn};
use stela_proto::frame::{self, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
use stela_proto::{Request, RequestBody, Response, ResponseBody, PROTOCOL_VERSION};
use stela_testkit::child::{self_command, tagged_numbers, SelfChild};

mod common;

use common::{stela, text, Daemon};

const CHILD_SOCKET: &str = "STELA_SERVICE_CHILD_SOCKET";
const CHILD_ROUND: &str = "STELA_SERVICE_CHILD_ROUND";
const SEED: &str = "STELA_SERVICE_SEED";
/// The record type type tag; the codec is MessagePack on both sides.
const TYPE_TAG: &str = "service_crash::Rec";

/// (round, writer, seq, filler derived from the three).
type Rec = (u32, u32, u64, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    round: u32,
    writer: u32,
    seq: u64,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The record a writer sends as its `seq`-th of a round: the parent can tell a real record
/// from garbage or from one put at the wrong place without being told what was sent.
fn rec(key: Key) -> Rec {
    let mut x = mix(u64::from(key.round) << 40 ^ u64::from(key.writer) << 32 ^ key.seq);
    let len = (x % 120) as usize;
    let filler = (0..len)
        .map(|_| {
            x = mix(x);
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    (key.round, key.writer, key.seq, filler)
}

fn key_of(record: &Rec) -> Key {
    Key {
        round: record.0,
        writer: record.1,
        seq: record.2,
    }
}

/// A small deterministic generator (this crate has no `rand`).
struct Rng(u64);

impl Rng {
    /// Seeded from `STELA_SERVICE_SEED` or the clock; prints the seed.
    fn from_env(test: &str) -> Rng {
        let seed = std::env::var(SEED)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("{test}: {SEED}={seed}");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0) % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

fn client_options(durability: Durability) -> stela_client::WalOptions {
    stela_client::WalOptions::default()
        .durability(durability)
        .type_tag(TYPE_TAG)
}

fn open_client(socket: &Path, log: &str, durability: Durability) -> stela_client::Wal<Rec> {
    stela_client::Wal::open(socket, log, client_options(durability))
        .unwrap_or_else(|e| panic!("open {log} through the daemon: {e}"))
}

/// Every record of `DIR/logs/NAME`, read embedded (no daemon running), checking LSNs run from 1.
fn read_embedded(dir: &Path, log: &str) -> Vec<Rec> {
    let wal: stela_wal::Wal<Rec> = stela_wal::Wal::open(
        dir.join("logs").join(log),
        stela_wal::WalOptions::default()
            .codec(stela_wal::Codec::MessagePack)
            .type_tag(TYPE_TAG)
            .create_if_missing(false),
    )
    .unwrap_or_else(|e| panic!("embedded open of log {log}: {e}"));
    let mut out = Vec::new();
    for item in wal.iter().unwrap() {
        let (lsn, record) = item.unwrap_or_else(|e| panic!("reading log {log}: {e}"));
        assert_eq!(
            lsn.get(),
            out.len() as u64 + 1,
            "LSNs not contiguous from 1"
        );
        out.push(record);
    }
    out
}

/// Every record of a log, read through a daemon (from its files and its buffers).
fn read_through(socket: &Path, log: &str) -> Vec<Rec> {
    let wal = open_client(socket, log, Durability::Buffered);
    let mut out = Vec::new();
    for item in wal.iter().unwrap() {
        let (lsn, record) = item.unwrap_or_else(|e| panic!("reading log {log}: {e}"));
        assert_eq!(
            lsn.get(),
            out.len() as u64 + 1,
            "LSNs not contiguous from 1"
        );
        out.push(record);
    }
    let positions = wal.positions().unwrap();
    assert_eq!(positions.last_lsn, out.len() as u64, "{positions:?}");
    out
}

/// Checks a log's content against the acknowledgements (LSN -> key): every record is a real
/// one; each writer's records in a round are its seqs 0, 1, 2... in LSN order, at most
/// `max_unacked` beyond its last acknowledged seq; every acknowledgement with an LSN inside the
/// log is there. Returns the acknowledged LSNs past the end of the log.
fn check_log(log: &[Rec], acked: &BTreeMap<u64, Key>, max_unacked: u64) -> Vec<u64> {
    let mut next_seq: HashMap<(u32, u32), u64> = HashMap::new();
    for (i, record) in log.iter().enumerate() {
        let lsn = i as u64 + 1;
        let key = key_of(record);
        assert_eq!(
            *record,
            rec(key),
            "LSN {lsn} holds a record nobody sent: {record:?}"
        );
        let expected = next_seq.entry((key.round, key.writer)).or_default();
        assert_eq!(
            key.seq, *expected,
            "LSN {lsn}: writer {}/{} skipped or repeated a record",
            key.round, key.writer
        );
        *expected += 1;
    }
    let mut last_acked: HashMap<(u32, u32), u64> = HashMap::new();
    let mut beyond = Vec::new();
    for (&lsn, &key) in acked {
        let last = last_acked.entry((key.round, key.writer)).or_default();
        *last = (*last).max(key.seq + 1);
        match log.get(lsn as usize - 1) {
            Some(record) => assert_eq!(
                key_of(record),
                key,
                "acknowledged LSN {lsn} holds another record"
            ),
            None => beyond.push(lsn),
        }
    }
    for (writer, records) in next_seq {
        let acked = last_acked.get(&writer).copied().unwrap_or(0);
        assert!(
            records <= acked + max_unacked,
            "writer {writer:?}: {records} records in the log, {acked} acknowledged"
        );
    }
    beyond
}

/// A list of LSNs for a failure message: its first and last few.
fn summary(lsns: &[u64]) -> String {
    if lsns.len() <= 10 {
        return format!("{lsns:?}");
    }
    format!("{:?} ... {:?}", &lsns[..5], &lsns[lsns.len() - 5..])
}

// ---------------------------------------------------------------------------------------------
// a. A client process SIGKILLed mid-stream.

/// Writes one line to stdout at once, or ends the process if the parent stopped listening.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

const CHILD_WRITERS: u32 = 2;
/// Writer 1 appends batches of up to this many records.
const CHILD_BATCH: u64 = 4;

/// The child's side of `client_sigkill_loses_nothing_acknowledged`; a no-op otherwise.
#[test]
fn client_child() {
    let Some(socket) = std::env::var_os(CHILD_SOCKET) else {
        return;
    };
    let socket = PathBuf::from(socket);
    let round: u32 = std::env::var(CHILD_ROUND).unwrap().parse().unwrap();
    let wals: Vec<_> = (0..CHILD_WRITERS)
        .map(|_| open_client(&socket, "clients", Durability::Buffered))
        .collect();
    say("OPENED");
    std::thread::scope(|scope| {
        for (writer, wal) in wals.iter().enumerate() {
            let writer = writer as u32;
            scope.spawn(move || {
                // A child nobody kills (the parent died) stops on its own.
                let deadline = Instant::now() + Duration::from_secs(20);
                let key = |seq| Key { round, writer, seq };
                let mut seq = 0;
                while Instant::now() < deadline {
                    let n = if writer == 0 {
                        1
                    } else {
                        1 + seq % CHILD_BATCH
                    };
                    let records: Vec<Rec> = (seq..seq + n).map(|s| rec(key(s))).collect();
                    let last = if n == 1 {
                        wal.append(&records[0])
                    } else {
                        wal.append_batch(&records)
                    }
                    .expect("child: append")
                    .get();
                    for i in 0..n {
                        say(&format!(
                            "ACK {} {round} {writer} {}",
                            last + 1 - n + i,
                            seq + i
                        ));
                    }
                    seq += n;
                }
            });
        }
    });
}

/// Runs one client child until it is SIGKILLed `delay` after it opened the log; returns its
/// acknowledgements.
fn run_client_child(socket: &Path, round: u32, delay: Duration) -> Vec<(u64, Key)> {
    let mut command = self_command("client_child");
    command
        .env(CHILD_SOCKET, socket)
        .env(CHILD_ROUND, round.to_string());
    let mut child = SelfChild::spawn(format!("client child of round {round}"), command);
    child.wait_for("OPENED", Duration::from_secs(60));
    std::thread::sleep(delay);
    tagged_numbers(&child.kill(), "ACK ")
        .into_iter()
        .map(|f| {
            let key = Key {
                round: f[1] as u32,
                writer: f[2] as u32,
                seq: f[3],
            };
            (f[0], key)
        })
        .collect()
}

fn client_sigkill_rounds(rounds: u32) {
    let mut rng = Rng::from_env("client_sigkill");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    // Buffers are written only when full or at the power-fail: most acknowledged records are
    // only in the daemon's memory when their client dies.
    let mut daemon = Daemon::start(
        &dir,
        &["--write-threshold", "512KiB", "--flush-interval", "600000"],
    );
    let mut acked = BTreeMap::new();
    for round in 0..rounds {
        let delay = rng.millis(5, 80);
        for (lsn, key) in run_client_child(&daemon.socket(), round, delay) {
            assert!(
                acked.insert(lsn, key).is_none(),
                "LSN {lsn} acknowledged twice"
            );
        }
        daemon.assert_alive(&format!("after client round {round}"));
    }
    assert!(!acked.is_empty(), "no client ever got an acknowledgement");

    // The emergency flush, then a SIGKILL: whatever was acknowledged must be in the files now.
    let out = stela(&["power-fail", "--dir", daemon.dir_arg()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("wrote and synced"), "{}", text(&out));
    daemon.kill();

    let log = read_embedded(&dir, "clients");
    // At most one request per writer was in flight at the kill: up to a batch beyond its acks.
    let beyond = check_log(&log, &acked, CHILD_BATCH);
    assert!(
        beyond.is_empty(),
        "{} acknowledged LSNs missing after the power-fail flush: {}",
        beyond.len(),
        summary(&beyond)
    );
    eprintln!(
        "client_sigkill: {rounds} rounds, {} acknowledged, {} in the log",
        acked.len(),
        log.len()
    );
}

#[test]
fn client_sigkill_loses_nothing_acknowledged() {
    client_sigkill_rounds(10);
}

#[test]
#[ignore = "long: 100 client kills"]
fn client_sigkill_loses_nothing_acknowledged_100_rounds() {
    client_sigkill_rounds(100);
}

// ---------------------------------------------------------------------------------------------
// b. The daemon SIGKILLed mid-stream, then restarted.

/// The connections of one round's writers: 0 appends singles at `disk`, 1 singles at
/// `buffered`, 2 batches at `disk`.
fn round_writers(socket: &Path) -> Vec<(stela_client::Wal<Rec>, Durability)> {
    [Durability::Disk, Durability::Buffered, Durability::Disk]
        .into_iter()
        .map(|durability| (open_client(socket, "daemon", durability), durability))
        .collect()
}

/// Runs the writers until each fails (the daemon is gone); returns their acknowledgements.
fn write_until_daemon_dies(
    writers: Vec<(stela_client::Wal<Rec>, Durability)>,
    round: u32,
) -> Vec<(u64, Key, Durability)> {
    std::thread::scope(|scope| {
        let writers: Vec<_> = writers
            .into_iter()
            .enumerate()
            .map(|(writer, (wal, durability))| {
                let writer = writer as u32;
                scope.spawn(move || {
                    let key = |seq| Key { round, writer, seq };
                    let mut acks = Vec::new();
                    let mut seq = 0;
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while Instant::now() < deadline {
                        let n = if writer == 2 { 1 + seq % 3 } else { 1 };
                        let records: Vec<Rec> = (seq..seq + n).map(|s| rec(key(s))).collect();
                        let result = match writer {
                            0 => wal.append_durable(&records[0]),
                            1 => wal.append(&records[0]),
                            _ => wal.append_batch_durable(&records),
                        };
                        let Ok(last) = result else { break };
                        for i in 0..n {
                            acks.push((last.get() + 1 - n + i, key(seq + i), durability));
                        }
                        seq += n;
                    }
                    acks
                })
            })
            .collect();
        writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    })
}

/// What the parent knows across restarts.
#[derive(Default)]
struct Known {
    /// Acknowledgements whose LSN is still meaningful (not lost with the daemon's memory).
    acked: BTreeMap<u64, (Key, Durability)>,
    /// What the last restart recovered.
    recovered: Vec<Rec>,
    disk_acks: usize,
    buffered_lost: usize,
}

impl Known {
    /// Checks a recovered log (see the module documentation) and forgets the `buffered`
    /// acknowledgements it legitimately lost: their LSNs are given to new records from now on.
    fn check(&mut self, log: Vec<Rec>, when: &str) {
        let keys: BTreeMap<u64, Key> = self.acked.iter().map(|(&l, &(k, _))| (l, k)).collect();
        // Records lost with the daemon are a suffix, so any number of a writer's records past
        // its acknowledgements can be missing, but at most one request (3 records) can be there
        // unacknowledged.
        let beyond = check_log(&log, &keys, 3);
        for lsn in beyond {
            let (key, durability) = self.acked.remove(&lsn).unwrap();
            assert_eq!(
                durability,
                Durability::Buffered,
                "{when}: LSN {lsn} ({key:?}) was acknowledged at disk and is lost \
                 (the log recovered {} records)",
                log.len()
            );
            self.buffered_lost += 1;
        }
        assert!(
            log.starts_with(&self.recovered),
            "{when}: records recovered by an earlier restart were lost or changed"
        );
        self.recovered = log;
    }
}

fn daemon_sigkill_rounds(rounds: u32) {
    let mut rng = Rng::from_env("daemon_sigkill");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    // Buffered records are written when a buffer holds 4 KiB, when 200 ms old, or when a disk
    // waiter needs them: a kill finds some in memory, some on disk.
    let args = ["--flush-interval", "200"];
    let mut known = Known::default();
    let mut daemon = Daemon::start(&dir, &args);
    for round in 0..rounds {
        let delay = rng.millis(20, 150);
        // Connected before the kill is timed, so the kill lands among appends.
        let writers = round_writers(&daemon.socket());
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            daemon.kill();
        });
        let acks = write_until_daemon_dies(writers, round);
        killer.join().unwrap();
        for (lsn, key, durability) in acks {
            known.disk_acks += usize::from(durability == Durability::Disk);
            let before = known.acked.insert(lsn, (key, durability));
            assert!(
                before.is_none(),
                "round {round}: LSN {lsn} acknowledged twice"
            );
        }
        // The restart: the daemon recovers the log, and serves what it recovered.
        daemon = Daemon::start(&dir, &args);
        let log = read_through(&daemon.socket(), "daemon");
        known.check(log, &format!("restart after round {round}"));
    }
    // Last: the files themselves, after a clean stop.
    daemon.terminate();
    let log = read_embedded(&dir, "daemon");
    known.check(log, "embedded read after the last restart");
    assert!(known.disk_acks > 0, "nothing was ever acknowledged at disk");
    eprintln!(
        "daemon_sigkill: {rounds} rounds, {} acknowledgements kept ({} at disk over all rounds), \
         {} buffered ones lost with the daemon, {} records in the log",
        known.acked.len(),
        known.disk_acks,
        known.buffered_lost,
        known.recovered.len()
    );
}

#[test]
fn daemon_sigkill_keeps_every_disk_acknowledgement() {
    daemon_sigkill_rounds(5);
}

#[test]
#[ignore = "long: 50 daemon kills and restarts"]
fn daemon_sigkill_keeps_every_disk_acknowledgement_50_rounds() {
    daemon_sigkill_rounds(50);
}

// ---------------------------------------------------------------------------------------------
// c. SIGTERM.

#[test]
fn sigterm_flushes_every_buffered_acknowledgement() {
    let mut rng = Rng::from_env("sigterm");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    // Nothing is written by time and only full buffers otherwise: at the SIGTERM most
    // acknowledged records are in memory only.
    let mut daemon = Daemon::start(
        &dir,
        &["--write-threshold", "512KiB", "--flush-interval", "600000"],
    );
    let socket = daemon.socket();
    let delay = rng.millis(50, 200);
    // The delay counts from the moment every writer has its log open: a SIGTERM during an
    // open (a loaded machine can take longer than the delay to open three) would test the
    // open, not the flush.
    let opened = std::sync::Barrier::new(4);
    let acks: Vec<(u64, Key)> = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..3u32)
            .map(|writer| {
                let socket = &socket;
                let opened = &opened;
                scope.spawn(move || {
                    let wal = open_client(socket, "term", Durability::Buffered);
                    opened.wait();
                    let key = |seq| Key {
                        round: 0,
                        writer,
                        seq,
                    };
                    let mut acks = Vec::new();
                    for seq in 0.. {
                        match wal.append(&rec(key(seq))) {
                            Ok(lsn) => acks.push((lsn.get(), key(seq))),
                            Err(e) => {
                                if let Some(code) = e.code() {
                                    assert_eq!(code, ErrorCode::ShuttingDown, "{e}");
                                }
                                break;
                            }
                        }
                    }
                    acks
                })
            })
            .collect();
        opened.wait();
        std::thread::sleep(delay);
        let status = daemon.signal_and_wait("TERM");
        assert_eq!(status.code(), Some(0), "{status}\n{}", daemon.output());
        writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let output = daemon.output();
    assert!(
        output.contains("every buffer written and synced; stopped"),
        "{output}"
    );
    drop(daemon);
    let acked: BTreeMap<u64, Key> = acks.into_iter().collect();
    assert!(!acked.is_empty());
    let log = read_embedded(&dir, "term");
    let beyond = check_log(&log, &acked, 1);
    assert!(
        beyond.is_empty(),
        "{} acknowledged LSNs lost at SIGTERM: {}",
        beyond.len(),
        summary(&beyond)
    );
    eprintln!(
        "sigterm: {} acknowledged, {} in the log",
        acked.len(),
        log.len()
    );
}

// ---------------------------------------------------------------------------------------------
// d. Malformed input.

fn framed(request: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode(request, &mut out).unwrap();
    out
}

/// Sends `bytes` on a fresh connection (then, with `half_close`, ends its sending side), reads
/// one answer and checks it is an `Error` with `code` whose message contains `names`, and that
/// the daemon then closes the connection.
fn expect_error_then_close(
    socket: &Path,
    what: &str,
    bytes: &[u8],
    half_close: bool,
    code: ErrorCode,
    names: &str,
) {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    if half_close {
        stream.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream
        .read_exact(&mut header)
        .unwrap_or_else(|e| panic!("{what}: no answer: {e}"));
    let header = frame::parse_header(header, MAX_FRAME_BYTES).unwrap();
    let mut body = vec![0u8; header.body_len];
    stream.read_exact(&mut body).unwrap();
    let response: Response = frame::decode_body(header, &body)
        .unwrap_or_else(|e| panic!("{what}: the answer is not a valid frame: {e}"));
    match &response.body {
        ResponseBody::Error { code: got, message } => {
            assert_eq!(*got, code, "{what}: {message}");
            assert!(
                message.contains(names),
                "{what}: the error does not name the problem ({names:?}): {message}"
            );
        }
        other => panic!("{what}: answered {other:?} instead of an error"),
    }
    // The close follows the answer at once; two seconds is only a bound for a busy machine.
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut rest = [0u8; 64];
    match stream.read(&mut rest) {
        Ok(0) => {}
        Ok(n) => panic!("{what}: more after the error: {:?}", &rest[..n]),
        Err(e) => panic!(
            "{what}: the connection was not closed after the error ({:?}): {e}",
            response.body
        ),
    }
}

#[test]
fn malformed_input_gets_an_error_and_a_closed_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let mut daemon = Daemon::start(&dir, &[]);
    let socket = daemon.socket();

    let hello = framed(&Request {
        id: 1,
        body: RequestBody::Hello {
            version: PROTOCOL_VERSION,
            client: "raw".into(),
            role: stela_proto::Role::Client,
            token: None,
        },
    });
    let mut bad_crc = hello.clone();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0x20;
    let mut not_a_request = Vec::new();
    let body = b"\xa5hello"; // a MessagePack string, not a Request
    not_a_request.extend_from_slice(&(body.len() as u32).to_le_bytes());
    not_a_request.extend_from_slice(&crc32c(body).to_le_bytes());
    not_a_request.extend_from_slice(body);
    let mut cut_short = hello.clone();
    cut_short.truncate(hello.len() - 3);
    let mut over_max = Vec::new();
    over_max.extend_from_slice(&((MAX_FRAME_BYTES + 1) as u32).to_le_bytes());
    over_max.extend_from_slice(&[0; 4]);
    let status_first = framed(&Request {
        id: 1,
        body: RequestBody::Status,
    });
    let append_first = framed(&Request {
        id: 1,
        body: RequestBody::Append {
            handle: 0,
            durability: Durability::Buffered,
            records: vec![stela_proto::Payload(b"x".to_vec())],
        },
    });
    let other_version = framed(&Request {
        id: 1,
        body: RequestBody::Hello {
            version: PROTOCOL_VERSION + 1,
            client: "from the future".into(),
            role: stela_proto::Role::Client,
            token: None,
        },
    });

    let version_message = format!("protocol {PROTOCOL_VERSION}, not {}", PROTOCOL_VERSION + 1);

    let stop = AtomicBool::new(false);
    let good_appends = AtomicU64::new(0);
    std::thread::scope(|scope| {
        // The well-behaved client: appends and asks for status all along.
        let good = scope.spawn(|| {
            let wal = open_client(&socket, "good", Durability::Buffered);
            let mut expected = 1;
            while !stop.load(Ordering::SeqCst) {
                let lsn = wal
                    .append(&rec(Key {
                        round: 0,
                        writer: 0,
                        seq: expected - 1,
                    }))
                    .expect("the good client's append");
                assert_eq!(lsn, Lsn::new(expected));
                expected += 1;
                good_appends.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            }
            wal.close().expect("the good client closes");
        });
        let cases: Vec<(&str, &[u8], bool, ErrorCode, &str)> = vec![
            (
                "garbage (an HTTP request)",
                &b"GET / HTTP/1.1\r\nHost: stela\r\n\r\n"[..],
                false,
                ErrorCode::BadFrame,
                "over the limit",
            ),
            (
                "garbage (a short length, random body)",
                &[5, 0, 0, 0, 1, 2, 3, 4, 9, 8, 7, 6, 5][..],
                false,
                ErrorCode::BadFrame,
                "checksum mismatch",
            ),
            (
                "a bad checksum",
                &bad_crc[..],
                false,
                ErrorCode::BadFrame,
                "checksum mismatch",
            ),
            (
                "a length of 4 GiB",
                &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0][..],
                false,
                ErrorCode::BadFrame,
                "4294967295 bytes is over the limit",
            ),
            (
                "a length just over 64 MiB",
                &over_max[..],
                false,
                ErrorCode::BadFrame,
                "over the limit",
            ),
            (
                "a body that is not a request",
                &not_a_request[..],
                false,
                ErrorCode::BadFrame,
                "not a valid message",
            ),
            (
                "a frame cut short",
                &cut_short[..],
                true,
                ErrorCode::BadFrame,
                "connection ended inside a frame",
            ),
            (
                "Status before Hello",
                &status_first[..],
                false,
                ErrorCode::BadRequest,
                "must be Hello",
            ),
            (
                "Append before Hello",
                &append_first[..],
                false,
                ErrorCode::BadRequest,
                "must be Hello",
            ),
            (
                "Hello of another protocol revision",
                &other_version[..],
                false,
                ErrorCode::UnsupportedVersion,
                &version_message,
            ),
        ];
        let mut failures = Vec::new();
        for (what, bytes, half_close, code, names) in cases {
            let before = good_appends.load(Ordering::SeqCst);
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                expect_error_then_close(&socket, what, bytes, half_close, code, names)
            }));
            if let Err(panic) = outcome {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(message);
            }
            daemon.assert_alive(&format!("after {what}"));
            // The good client went on meanwhile.
            let deadline = Instant::now() + Duration::from_secs(10);
            while good_appends.load(Ordering::SeqCst) < before + 2 {
                assert!(
                    Instant::now() < deadline,
                    "the good client stalled after {what}"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        stop.store(true, Ordering::SeqCst);
        good.join().unwrap();
        assert!(
            failures.is_empty(),
            "{} case(s) failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    });
    // Still serving new connections, and still stops cleanly.
    let out = stela(&["status", "--dir", daemon.dir_arg()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    daemon.terminate();
}

/// CRC32C (Castagnoli), bitwise: enough for one test frame.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

// ---------------------------------------------------------------------------------------------
// e. `stela status --json` and the socket's mode.

#[test]
fn status_json_shows_the_cap_and_crash_semantics() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    // 4 x 256 KiB = 1048576 B of buffers; 20 MB/s x 20 ms (half of 40 ms) = 400000 B.
    let daemon = Daemon::start(
        &dir,
        &[
            "--buffers",
            "4",
            "--buffer-size",
            "256KiB",
            "--power-window",
            "40",
            "--assume-write-rate",
            "20000000",
        ],
    );
    let socket = daemon.socket();
    let meta = std::fs::metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "socket mode {:o}",
        meta.permissions().mode()
    );

    let out = stela(&["status", "--dir", daemon.dir_arg(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}): {}", text(&out)));
    let cap = &json["dirty_cap"];
    assert_eq!(cap["pool_bytes"], 1_048_576, "{json:#}");
    assert_eq!(cap["measured_write_bytes_per_s"], 20_000_000, "{json:#}");
    assert_eq!(cap["power_window_ms"], 40, "{json:#}");
    assert_eq!(cap["window_bytes"], 200_000, "{json:#}");
    assert_eq!(cap["bytes"], 200_000, "{json:#}");
    let derivation = cap["derivation"].as_str().unwrap();
    for part in [
        "1048576 B",
        "20.0 MB/s",
        "40 ms",
        "200000 B",
        "power window",
    ] {
        assert!(derivation.contains(part), "{part:?} not in {derivation:?}");
    }
    // No flush has been slow yet: the live cap is the start-up cap, and says so.
    let live = &json["live_dirty_cap"];
    assert_eq!(live["bytes"], 200_000, "{json:#}");
    assert_eq!(live["changes"], 0, "{json:#}");
    assert!(
        live["reason"].as_str().unwrap().contains("start-up cap"),
        "{json:#}"
    );
    assert_eq!(json["buffers"], 4);
    assert_eq!(json["buffer_bytes"], 262_144);
    assert_eq!(json["dirty_bytes"], 0);
    assert_eq!(json["power"], "normal");
    let lines: Vec<&str> = json["crash_semantics"]
        .as_array()
        .expect("crash_semantics is a list")
        .iter()
        .map(|l| l.as_str().expect("each line is a string"))
        .collect();
    let find = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no crash_semantics line about {needle:?}: {lines:#?}"))
    };
    assert!(find("client crash").contains("loses nothing acknowledged"));
    assert!(find("SIGTERM").contains("loses nothing acknowledged"));
    assert!(find("SIGKILL").contains("never disk"));
    let notice = find("power loss with notice");
    assert!(
        notice.contains("at most 200000 B") && notice.contains("within 20 ms"),
        "{notice}"
    );
    find("power loss without notice");

    // The human form says the same.
    let out = stela(&["status", "--dir", daemon.dir_arg()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains(derivation), "{}", text(&out));
    assert!(
        text(&out).contains("power loss with notice"),
        "{}",
        text(&out)
    );
    daemon.terminate();
}
