//! Hostile clients against a real `stela serve` process (issue 54): what one connection does
//! must not stop the daemon from serving the others, nor grow its memory without bound.
//!
//! What it proves:
//! - `unfinished_frames_stop_neither_status_nor_an_honest_client`: 64 connections each send a
//!   frame header announcing a 1 MiB body and then all of it but one byte, far past
//!   `--partial-frame-bytes`. `stela status` is still answered and an honest client still
//!   commits at `disk`; when the attackers leave, the bytes they held are released at once
//!   (their EOF is seen although the daemon was not reading them). On the daemon of 40e0404
//!   every connection was held back at the cap, so `stela status` timed out.
//! - `a_frame_that_never_finishes_costs_its_connection`: the same attackers, staying connected
//!   and silent, are closed after `--frame-timeout`, and their bytes released.
//! - `a_frame_before_hello_may_be_no_larger_than_a_hello`: a peer that has not said Hello may not
//!   announce a frame larger than one (`MAX_HELLO_FRAME_BYTES`): it is refused at the header.
//! - `clients_that_never_read_stay_within_the_output_cap`: 32 clients pipeline reads of 16 MiB
//!   each on a 20 MB log and never read their answers; the daemon holds the answers of all of
//!   them within `--output-bytes` plus a small reserve each (on 40e0404: 16-26 MB each).
//! - `a_flood_of_connection_attempts_costs_the_event_loop_nothing`: thousands of silent TCP
//!   connection attempts are the gate thread's work; the event loop's share of the daemon's CPU
//!   time stays under a fifth, and `stela status` and a real login are answered meanwhile.

mod common;

use common::raw::{connect, framed, read_answer, rss_bytes, status_json};
use common::{stela, text, Daemon};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};
use stela_client::{Durability, Lsn};
use stela_proto::frame::FRAME_HEADER_BYTES;
use stela_proto::{Request, RequestBody, ResponseBody, Role, MAX_HELLO_FRAME_BYTES};

const MIB: usize = 1 << 20;

fn eventually(what: &str, within: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes what the socket takes of `bytes` without blocking; how many it took.
fn write_what_fits(stream: &mut UnixStream, bytes: &[u8]) -> usize {
    stream.set_nonblocking(true).unwrap();
    let mut sent = 0;
    while sent < bytes.len() {
        match stream.write(&bytes[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // The daemon may read a little more in a moment; give it one chance.
                std::thread::sleep(Duration::from_millis(5));
                match stream.write(&bytes[sent..]) {
                    Ok(n) => sent += n,
                    Err(_) => break,
                }
            }
            Err(_) => break,
        }
    }
    stream.set_nonblocking(false).unwrap();
    sent
}

/// `count` admitted clients, each with a frame of `announced` bytes begun and all but its last
/// byte sent (as far as the socket takes it).
fn unfinished_frames(socket: &Path, count: usize, announced: usize) -> Vec<UnixStream> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    header[..4].copy_from_slice(&(announced as u32).to_le_bytes());
    let mut frame = header.to_vec();
    frame.resize(FRAME_HEADER_BYTES + announced - 1, 0xAB);
    (0..count)
        .map(|_| {
            let (mut stream, answer) = connect(socket, Role::Client);
            assert!(matches!(answer, ResponseBody::Welcome { .. }), "{answer:?}");
            write_what_fits(&mut stream, &frame);
            stream
        })
        .collect()
}

/// `stela status` answers, and says so quickly enough to tell from a stalled daemon (whose
/// status waits out the handshake timeout and fails).
fn status_answers(daemon: &Daemon) -> serde_json::Value {
    let started = Instant::now();
    let status = status_json(daemon);
    eprintln!("stela status answered in {:?}", started.elapsed());
    status
}

/// An honest client commits `count` small records at `disk`.
fn honest_commits(socket: &Path, count: u64) {
    let wal: stela_client::Wal<(u64, String)> = stela_client::Wal::open(
        socket,
        "honest",
        stela_client::WalOptions::default()
            .durability(Durability::Disk)
            .type_tag("hostile"),
    )
    .expect("an honest client opens its log");
    let mut last = Lsn::ZERO;
    for i in 0..count {
        last = wal.append_durable(&(i, "x".repeat(90))).expect("commit");
    }
    assert!(last > Lsn::ZERO);
    wal.close().unwrap();
}

/// A daemon whose cap on partly received frames (4 MiB) a few attackers fill, with the given
/// `--frame-timeout` (seconds).
fn small_cap_daemon(tmp: &Path, frame_timeout: &str) -> Daemon {
    Daemon::start(
        &tmp.join("daemon"),
        &[
            "--partial-frame-bytes",
            "4M",
            "--frame-timeout",
            frame_timeout,
            "--assume-write-rate",
            "100000000",
        ],
    )
}

fn held(daemon: &Daemon) -> u64 {
    status_json(daemon)["partial_frame_bytes"].as_u64().unwrap()
}

#[test]
fn unfinished_frames_stop_neither_status_nor_an_honest_client() {
    let tmp = tempfile::tempdir().unwrap();
    let mut daemon = small_cap_daemon(tmp.path(), "3600");
    let attackers = unfinished_frames(&daemon.socket(), 64, MIB);
    eventually(
        "the attackers to fill the cap",
        Duration::from_secs(30),
        || held(&daemon) >= 4 * MIB as u64,
    );
    for _ in 0..5 {
        let status = status_answers(&daemon);
        assert!(status["partial_frame_bytes"].as_u64().unwrap() >= 4 * MIB as u64);
    }
    honest_commits(&daemon.socket(), 200);
    daemon.assert_alive("under 64 unfinished frames");
    // The attackers leave while held back: their EOF is seen and their bytes released.
    drop(attackers);
    eventually(
        "the bytes of the attackers that left to be released",
        Duration::from_secs(30),
        || held(&daemon) == 0,
    );
    daemon.terminate();
}

#[test]
fn a_frame_that_never_finishes_costs_its_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let mut daemon = small_cap_daemon(tmp.path(), "2");
    let mut attackers = unfinished_frames(&daemon.socket(), 16, MIB);
    // They stay connected and say nothing more: the daemon closes them after the frame timeout
    // (telling them why), and what they held is released.
    eventually(
        "the stalled connections to be closed",
        Duration::from_secs(30),
        || status_json(&daemon)["connections"].as_u64() == Some(1) && held(&daemon) == 0,
    );
    let mut told = 0;
    for attacker in &mut attackers {
        attacker
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut answer = Vec::new();
        let _ = attacker.read_to_end(&mut answer);
        told += usize::from(String::from_utf8_lossy(&answer).contains("frame timeout"));
    }
    // Those held back at the cap never had their socket read, so some may not have taken
    // the answer before the close; most did.
    assert!(told > 0, "no attacker was told why it was closed");
    honest_commits(&daemon.socket(), 20);
    daemon.assert_alive("after closing stalled connections");
    daemon.terminate();
}

#[test]
fn a_frame_before_hello_may_be_no_larger_than_a_hello() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("daemon");
    let mut daemon = Daemon::start(&dir, &["--assume-write-rate", "100000000"]);
    let mut stream = UnixStream::connect(daemon.socket()).unwrap();
    let mut header = [0u8; FRAME_HEADER_BYTES];
    header[..4].copy_from_slice(&((MAX_HELLO_FRAME_BYTES + 1) as u32).to_le_bytes());
    stream.write_all(&header).unwrap();
    let answer = read_answer(&mut stream).expect("an answer to the oversized header");
    match answer.body {
        ResponseBody::Error { code, message } => {
            assert_eq!(code, stela_proto::ErrorCode::BadFrame, "{message}");
            assert!(message.contains("over the limit of 4096"), "{message}");
        }
        other => panic!("an oversized frame before Hello was not refused: {other:?}"),
    }
    // A Hello of the largest allowed size is still served.
    let (_ok, answer) = connect(&daemon.socket(), Role::Client);
    assert!(matches!(answer, ResponseBody::Welcome { .. }), "{answer:?}");
    daemon.assert_alive("after refusing an oversized frame before Hello");
    daemon.terminate();
}

/// `clients` clients take the same reads the test's never-reading ones send, answers and all:
/// the daemon's memory then already holds what serving them costs (its allocator keeps what
/// it once used), which is not what the tests measure.
fn serve_reads_once(daemon: &Daemon, clients: usize) {
    for _ in 0..clients {
        let mut stream = pipelined_reads(&daemon.socket(), false);
        for _ in 0..8 {
            read_answer_body(&mut stream);
        }
    }
}

#[test]
fn clients_that_never_read_stay_within_the_output_cap() {
    const READERS: usize = 32;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("daemon");
    let mut daemon = Daemon::start(
        &dir,
        &["--output-bytes", "8M", "--assume-write-rate", "100000000"],
    );
    fill_big_log(&daemon);
    let pid = daemon.child.id();
    serve_reads_once(&daemon, READERS);
    let rss_before = rss_bytes(pid);
    let readers: Vec<UnixStream> = (0..READERS)
        .map(|_| pipelined_reads(&daemon.socket(), true))
        .collect(); // never read
                    // Let the daemon answer what it will.
    std::thread::sleep(Duration::from_secs(3));
    let status = status_answers(&daemon);
    let output = status["output_bytes"].as_u64().unwrap();
    let rss_with = rss_bytes(pid);
    let grown = rss_with.saturating_sub(rss_before);
    eprintln!(
        "{READERS} clients that never read: the daemon holds {output} B of answers; RSS {:.1} MB -> {:.1} MB",
        rss_before as f64 / 1e6,
        rss_with as f64 / 1e6
    );
    // The documented bound (docs/DAEMON.md, "Memory"): the cap, plus one connection's 2 MiB of
    // unsent answers and one 1 MiB answer crossing it, plus for each other connection a
    // reserve of 64 KiB and an answer of at most 64 KiB or one record (64 KiB here).
    let bound = (8 + 3) * MIB as u64 + READERS as u64 * (192 << 10);
    assert!(output <= bound, "answers held {output} B, bound {bound} B");
    assert!(
        grown < bound + (16 * MIB) as u64,
        "RSS grew by {grown} B with answers bounded at {bound} B"
    );
    honest_commits(&daemon.socket(), 20);
    daemon.assert_alive("beside clients that never read");
    drop(readers);
    let out = stela(&["status", "--dir", daemon.dir_arg()]);
    assert!(out.status.success(), "{}", text(&out));
    daemon.terminate();
}

/// Clients that never read, twice: the first round leaves (closes its sockets), the second
/// stays connected and silent. While they are served, the daemon's RSS stays within the
/// documented bound (docs/DAEMON.md, "Memory"); the ones that stay are cut once their answers
/// have not moved for `--frame-timeout`; after each round the memory their answers took is
/// given back to the system (RSS back within 16 MiB of where it was before), not kept by the
/// allocator. On main at 05e45bc the second round's clients were never cut (their answers were
/// held until the idle timeout, an hour).
#[test]
fn clients_that_never_read_are_cut_and_their_memory_given_back() {
    const READERS: usize = 48;
    const CAP: u64 = 64 * MIB as u64;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("daemon");
    let mut daemon = Daemon::start(
        &dir,
        &[
            "--output-bytes",
            "64M",
            "--frame-timeout",
            "3s",
            "--assume-write-rate",
            "100000000",
        ],
    );
    fill_big_log(&daemon);
    let pid = daemon.child.id();
    serve_reads_once(&daemon, READERS);
    let rss_before = rss_bytes(pid);
    // The documented bound on unsent answers (as in the test above), and what the rest of the
    // daemon may take beside them (its reads in flight, the allocator's slack).
    let bound = CAP + 3 * MIB as u64 + READERS as u64 * (192 << 10);
    let slack = 16 * MIB as u64;
    for round in ["leave", "stay"] {
        let readers: Vec<UnixStream> = (0..READERS)
            .map(|_| pipelined_reads(&daemon.socket(), true))
            .collect(); // never read
        eventually(
            "the answers to reach the output cap",
            Duration::from_secs(30),
            || status_json(&daemon)["output_bytes"].as_u64().unwrap() >= CAP,
        );
        let rss_with = rss_bytes(pid);
        eprintln!(
            "round {round}: {READERS} clients that never read: RSS {:.1} MB -> {:.1} MB",
            rss_before as f64 / 1e6,
            rss_with as f64 / 1e6
        );
        assert!(
            rss_with < rss_before + bound + slack,
            "round {round}: RSS {rss_with} B, {rss_before} B before, answers bounded at {bound} B"
        );
        honest_commits(&daemon.socket(), 20);
        if round == "leave" {
            drop(readers);
        }
        // The status connection itself is the one left.
        eventually(
            "the readers' connections to close",
            Duration::from_secs(60),
            || {
                let status = status_json(&daemon);
                status["output_bytes"].as_u64() == Some(0)
                    && status["connections"].as_u64() == Some(1)
            },
        );
        let mut rss_after = rss_bytes(pid);
        let deadline = Instant::now() + Duration::from_secs(10);
        while rss_after > rss_before + slack && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            rss_after = rss_bytes(pid);
        }
        eprintln!(
            "round {round}: after the readers: RSS {:.1} MB",
            rss_after as f64 / 1e6
        );
        assert!(
            rss_after <= rss_before + slack,
            "round {round}: RSS {rss_after} B once the readers are gone, {rss_before} B before"
        );
    }
    honest_commits(&daemon.socket(), 20);
    daemon.assert_alive("beside clients that never read");
    daemon.terminate();
}

/// Opens "big" on a connection that said Hello; its handle.
fn open_big(stream: &mut UnixStream) -> u32 {
    let open = Request {
        id: 2,
        body: RequestBody::Open {
            log: "big".into(),
            codec: "msgpack".into(),
            type_tag: "hostile".into(),
            create: false,
            durability: None,
            schema: None,
        },
    };
    stream.write_all(&framed(&open)).unwrap();
    match read_answer(stream).unwrap().body {
        ResponseBody::Opened { handle, .. } => handle,
        other => panic!("open: {other:?}"),
    }
}

/// Writes a 20 MB log "big": 320 records of 64 KiB.
fn fill_big_log(daemon: &Daemon) {
    let wal: stela_client::Wal<String> = stela_client::Wal::open(
        daemon.socket(),
        "big",
        stela_client::WalOptions::default()
            .durability(Durability::Disk)
            .type_tag("hostile"),
    )
    .unwrap();
    let record = "r".repeat(64 << 10);
    for _ in 0..40 {
        let batch: Vec<String> = (0..8).map(|_| record.clone()).collect();
        let last = wal.append_batch(&batch).unwrap();
        wal.commit(last).unwrap();
    }
    wal.close().unwrap();
}

/// A client that opens "big" and pipelines eight reads of 16 MiB from its start (with a small
/// receive buffer: one that means never to read them).
fn pipelined_reads(socket: &Path, small_receive_buffer: bool) -> UnixStream {
    let (mut stream, answer) = connect(socket, Role::Client);
    assert!(matches!(answer, ResponseBody::Welcome { .. }), "{answer:?}");
    if small_receive_buffer {
        rustix::net::sockopt::set_socket_recv_buffer_size(&stream, 4096).unwrap();
    }
    let handle = open_big(&mut stream);
    let mut reads = Vec::new();
    for id in 0..8 {
        reads.extend(framed(&Request {
            id: 10 + id,
            body: RequestBody::Read {
                handle,
                from: 1,
                max_records: 1 << 20,
                max_bytes: 16 << 20,
            },
        }));
    }
    stream.write_all(&reads).unwrap();
    stream
}

/// Reads one answer whatever its size (a read's), without decoding it.
fn read_answer_body(stream: &mut UnixStream) {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).unwrap();
}

/// The CPU time (clock ticks: user + system) of the daemon's thread named `name`, or of the
/// whole process when `name` is `None`.
fn cpu_ticks(pid: &str, name: Option<&str>) -> u64 {
    let ticks = |stat: &str| -> u64 {
        // Fields after the command's closing parenthesis: state is the 3rd field, utime the
        // 14th and stime the 15th.
        let rest = &stat[stat.rfind(')').expect("stat") + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let Some(name) = name else {
        return ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap());
    };
    // A thread takes its name when it first runs: just after start (the daemon printed its
    // address), a loaded machine may not have run it yet (seen once in CI).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let task = task.unwrap().path();
            let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if comm.trim() == name {
                return ticks(&std::fs::read_to_string(task.join("stat")).unwrap());
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon has no thread named {name}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The TCP address the daemon printed (`--tcp 127.0.0.1:0` picks a free port).
fn tcp_addr(daemon: &mut Daemon) -> std::net::SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let output = daemon.output();
        if let Some(addr) = output
            .lines()
            .find_map(|l| l.strip_prefix("stela serve: listening on tcp://"))
        {
            return addr.trim().parse().unwrap();
        }
        daemon.assert_alive("before printing its TCP address");
        assert!(Instant::now() < deadline, "no TCP address in:\n{output}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A flood of TCP connection attempts that say nothing costs the event loop (which serves
/// `stela status`, the Unix socket and every admitted client) next to nothing: accepting them
/// and waiting for their Hello is the gate thread's work. Measured as CPU time, not latency: the
/// loop's share of the daemon's CPU time during the flood. On the daemon of abf9279 the loop
/// accepted and evicted every one of them itself (`stela status` p99 111 ms, max 450 ms, and
/// honest commits 0.67x in `stela-bench hostile`). A real client's login and `stela status`
/// must still be answered during the flood.
#[test]
fn a_flood_of_connection_attempts_costs_the_event_loop_nothing() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(
        &tmp.path().join("daemon"),
        &[
            "--tcp",
            "127.0.0.1:0",
            "--tcp-insecure",
            "--assume-write-rate",
            "100000000",
        ],
    );
    let addr = tcp_addr(&mut daemon);
    let pid = daemon.pid();
    let stop = AtomicBool::new(false);
    let made = AtomicUsize::new(0);
    let (loop_before, all_before) = (cpu_ticks(&pid, Some("stela-loop")), cpu_ticks(&pid, None));
    let login = std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let mut held = std::collections::VecDeque::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(socket) =
                        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                    {
                        held.push_back(socket);
                        made.fetch_add(1, Ordering::Relaxed);
                    }
                    if held.len() > 200 {
                        held.pop_front();
                    }
                }
            });
        }
        let started = Instant::now();
        while made.load(Ordering::Relaxed) < 3000 && started.elapsed() < Duration::from_secs(60) {
            status_answers(&daemon);
            std::thread::sleep(Duration::from_millis(100));
        }
        // A real client, in the middle of the flood.
        let login = (|| -> std::io::Result<ResponseBody> {
            let mut tcp = std::net::TcpStream::connect(addr)?;
            tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
            tcp.write_all(&common::raw::hello(Role::Client))?;
            let mut header = [0u8; FRAME_HEADER_BYTES];
            tcp.read_exact(&mut header)?;
            let header =
                stela_proto::frame::parse_header(header, MIB).map_err(std::io::Error::other)?;
            let mut body = vec![0u8; header.body_len];
            tcp.read_exact(&mut body)?;
            let answer: stela_proto::Response =
                stela_proto::frame::decode_body(header, &body).map_err(std::io::Error::other)?;
            Ok(answer.body)
        })();
        stop.store(true, Ordering::Relaxed);
        login
    });
    let (loop_ticks, all_ticks) = (
        cpu_ticks(&pid, Some("stela-loop")) - loop_before,
        cpu_ticks(&pid, None) - all_before,
    );
    let flooded = made.load(Ordering::Relaxed);
    eprintln!(
        "{flooded} silent connections: the daemon used {all_ticks} ticks of CPU, its event loop {loop_ticks}"
    );
    assert!(flooded >= 3000, "the flood made only {flooded} connections");
    assert!(
        matches!(login, Ok(ResponseBody::Welcome { .. })),
        "a real login during the flood: {login:?}"
    );
    assert!(
        loop_ticks <= (all_ticks / 5).max(3),
        "the event loop spent {loop_ticks} of the daemon's {all_ticks} ticks on a flood of {flooded} silent connections"
    );
    daemon.assert_alive("after the flood");
    daemon.terminate();
}

/// Silent connections to the Unix socket, made as fast as four threads can, each keeping its
/// newest 200: the event loop accepts them itself (a local peer needs no gate), but only a
/// bounded number a turn, so that between them it still answers `stela status` and an honest
/// client's `disk` commits. Each status and commit is made while the flood runs (the count of
/// connections it made moves across it).
#[test]
fn a_flood_of_unix_connections_leaves_the_event_loop_time_for_the_others() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const ROUNDS: usize = 5;
    let tmp = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(&tmp.path().join("daemon"), &[]);
    let socket = daemon.socket();
    let stop = AtomicBool::new(false);
    let made = AtomicUsize::new(0);
    let served_during_flood = std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let mut held = std::collections::VecDeque::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(socket) = UnixStream::connect(&socket) {
                        held.push_back(socket);
                        made.fetch_add(1, Ordering::Relaxed);
                    }
                    if held.len() > 200 {
                        held.pop_front();
                    }
                }
            });
        }
        eventually("the flood to begin", Duration::from_secs(30), || {
            made.load(Ordering::Relaxed) >= 1000
        });
        let mut served = 0;
        for _ in 0..ROUNDS {
            let before = made.load(Ordering::Relaxed);
            status_answers(&daemon);
            honest_commits(&socket, 3);
            served += usize::from(made.load(Ordering::Relaxed) > before);
        }
        stop.store(true, Ordering::Relaxed);
        served
    });
    let flooded = made.load(Ordering::Relaxed);
    eprintln!("{flooded} silent Unix connections; {served_during_flood} of {ROUNDS} rounds of status and commits served while they came");
    assert_eq!(
        served_during_flood, ROUNDS,
        "status and commits were served only between the flood's connections"
    );
    daemon.assert_alive("after the flood");
    daemon.terminate();
}
