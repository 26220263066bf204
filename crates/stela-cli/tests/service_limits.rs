//! The daemon's connections at scale and at their limits, against a real `stela serve`
//! process.
//!
//! What it proves:
//! - `five_thousand_idle_connections_while_a_client_commits`: 5,000 connections complete their
//!   Hello and stay open, idle, while another client commits (`buffered` and `disk`); every
//!   commit succeeds, the daemon keeps a fixed, small set of threads, its memory grows by a few
//!   kilobytes per connection at most, and it gives the connections back when they close.
//! - `the_connection_limit_refuses_cleanly`: past `--max-connections` a client's Hello is
//!   answered `TooManyConnections` and the connection closed; `stela status` (an
//!   administrator) is still answered; a freed slot admits the next client.
//! - `idle_attempts_under_a_1024_file_limit_leave_status_answered`: a daemon that cannot raise
//!   its file limit above 1,024 gets 3,000 connection attempts that never say Hello and stay
//!   open; `stela status` is answered throughout, and a client can still connect and commit.
//! - `announced_frame_bodies_cost_only_the_bytes_received`: 200 connections each send a Hello
//!   and then a frame header announcing a 6 MB body, and nothing more: the daemon holds the
//!   bytes it received (a few per connection), not the announced megabytes.
//!
//! Each test raises this process's own file limit (it holds thousands of sockets); if the
//! limit cannot be raised far enough the test fails and says so.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};
use stela_client::{Durability, ErrorCode, Lsn};
use stela_proto::frame::FRAME_HEADER_BYTES;
use stela_proto::{ResponseBody, Role};

mod common;

use common::raw::{connect, raise_own_file_limit, rss_bytes, status_json, threads};
use common::{stela, text, Daemon};

fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn commits(socket: &Path, count: u64) {
    for durability in [Durability::Buffered, Durability::Disk] {
        let wal: stela_client::Wal<(u64, String)> = stela_client::Wal::open(
            socket,
            "limits",
            stela_client::WalOptions::default()
                .durability(durability)
                .type_tag("service_limits"),
        )
        .expect("open a log while the connections are held");
        let mut last = Lsn::ZERO;
        for i in 0..count {
            last = wal.append_durable(&(i, "x".repeat(90))).expect("commit");
        }
        assert!(last > Lsn::ZERO);
        wal.close().unwrap();
    }
}

#[test]
fn five_thousand_idle_connections_while_a_client_commits() {
    const IDLE: usize = 5000;
    raise_own_file_limit(IDLE as u64 + 1000);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("daemon");
    let mut daemon = Daemon::start(&dir, &[]);
    let pid = daemon.child.id();
    // A first log opened starts, once, the threads that serve logs (the keeper of the logs'
    // SYNCED marks); what is measured is what connections add.
    commits(&daemon.socket(), 1);
    let rss_before = rss_bytes(pid);
    let threads_before = threads(pid);
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        let (stream, answer) = connect(&daemon.socket(), Role::Client);
        assert!(matches!(answer, ResponseBody::Welcome { .. }), "{answer:?}");
        idle.push(stream);
    }
    commits(&daemon.socket(), 2000);
    daemon.assert_alive("with 5,000 connections");
    let status = status_json(&daemon);
    assert!(
        status["connections"].as_u64().unwrap() >= IDLE as u64,
        "{status}"
    );
    let rss_with = rss_bytes(pid);
    let threads_with = threads(pid);
    eprintln!(
        "daemon with {IDLE} idle connections: RSS {:.1} MB (before {:.1} MB, {:.0} B per connection), threads {threads_with} (before {threads_before})",
        rss_with as f64 / 1e6,
        rss_before as f64 / 1e6,
        (rss_with.saturating_sub(rss_before)) as f64 / IDLE as f64
    );
    assert_eq!(
        threads_with, threads_before,
        "the daemon's threads must not grow with connections"
    );
    assert!(
        rss_with < rss_before + IDLE as u64 * 8 * 1024,
        "idle connections cost {} B each",
        (rss_with - rss_before) / IDLE as u64
    );
    drop(idle);
    eventually("the connections to be closed", || {
        status_json(&daemon)["connections"].as_u64().unwrap() <= 1
    });
    daemon.terminate();
}

#[test]
fn the_connection_limit_refuses_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("daemon");
    let daemon = Daemon::start(&dir, &["--max-connections", "3"]);
    let mut held: Vec<UnixStream> = (0..3)
        .map(|_| {
            let (stream, answer) = connect(&daemon.socket(), Role::Client);
            assert!(matches!(answer, ResponseBody::Welcome { .. }), "{answer:?}");
            stream
        })
        .collect();
    let (mut refused, answer) = connect(&daemon.socket(), Role::Client);
    match answer {
        ResponseBody::Error { code, message } => {
            assert_eq!(code, ErrorCode::TooManyConnections, "{message}");
            assert!(message.contains("at most 3"), "{message}");
        }
        other => panic!("the fourth client was not refused: {other:?}"),
    }
    let mut rest = Vec::new();
    assert_eq!(
        refused.read_to_end(&mut rest).unwrap(),
        0,
        "a refused connection is closed after its answer"
    );
    let status = status_json(&daemon);
    assert_eq!(status["max_connections"], 3, "{status}");
    assert!(
        status["refused_connections"].as_u64().unwrap() >= 1,
        "{status}"
    );
    // A freed slot admits the next client.
    drop(held.pop());
    eventually("a slot to be free", || {
        let (_stream, answer) = connect(&daemon.socket(), Role::Client);
        matches!(answer, ResponseBody::Welcome { .. })
    });
    drop(daemon);
}

#[test]
fn idle_attempts_under_a_1024_file_limit_leave_status_answered() {
    const ATTEMPTS: usize = 3000;
    raise_own_file_limit(ATTEMPTS as u64 + 1000);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("daemon");
    let mut daemon = Daemon::start_with_file_limit(&dir, &[], Some(1024));
    let status = status_json(&daemon);
    assert_eq!(status["file_limit"], 1024, "{status}");
    let limit = status["max_connections"].as_u64().unwrap();
    assert!(
        limit < 1024 / 2,
        "the connection limit follows the file limit: {status}"
    );
    let mut attempts = Vec::with_capacity(ATTEMPTS);
    for i in 0..ATTEMPTS {
        match UnixStream::connect(daemon.socket()) {
            Ok(stream) => attempts.push(stream),
            Err(error) => panic!("connection attempt {i} failed in this process: {error}"),
        }
        if i % 500 == 499 {
            let out = stela(&["status", "--dir", daemon.dir_arg()]);
            assert!(
                out.status.success(),
                "status after {i} attempts: {}",
                text(&out)
            );
        }
    }
    daemon.assert_alive("after 3,000 idle connection attempts");
    let out = stela(&["status", "--dir", daemon.dir_arg()]);
    assert!(
        out.status.success(),
        "status with the attempts held: {}",
        text(&out)
    );
    commits(&daemon.socket(), 100);
    drop(attempts);
    daemon.terminate();
}

#[test]
fn announced_frame_bodies_cost_only_the_bytes_received() {
    const CONNECTIONS: usize = 200;
    const ANNOUNCED: u32 = 6_356_992;
    raise_own_file_limit(CONNECTIONS as u64 + 1000);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("daemon");
    // A large cap makes a 6 MB frame acceptable, so only arriving bytes can bound memory.
    let mut daemon = Daemon::start(
        &dir,
        &["--buffers", "24", "--assume-write-rate", "100000000000"],
    );
    let pid = daemon.child.id();
    let rss_before = rss_bytes(pid);
    let mut streams = Vec::new();
    for _ in 0..CONNECTIONS {
        let (mut stream, answer) = connect(&daemon.socket(), Role::Client);
        assert!(matches!(answer, ResponseBody::Welcome { .. }), "{answer:?}");
        let mut header = [0u8; FRAME_HEADER_BYTES];
        header[..4].copy_from_slice(&ANNOUNCED.to_le_bytes());
        stream.write_all(&header).unwrap();
        streams.push(stream);
    }
    eventually("the headers to arrive", || {
        status_json(&daemon)["partial_frame_bytes"]
            .as_u64()
            .unwrap()
            >= (CONNECTIONS * FRAME_HEADER_BYTES) as u64
    });
    let status = status_json(&daemon);
    let held = status["partial_frame_bytes"].as_u64().unwrap();
    assert_eq!(held, (CONNECTIONS * FRAME_HEADER_BYTES) as u64, "{status}");
    let rss_with = rss_bytes(pid);
    eprintln!(
        "{CONNECTIONS} announced {ANNOUNCED}-byte bodies: daemon holds {held} B of frames, RSS {:.1} MB -> {:.1} MB",
        rss_before as f64 / 1e6,
        rss_with as f64 / 1e6
    );
    assert!(
        rss_with < rss_before + (16 << 20),
        "announced bodies cost the daemon {} MB",
        (rss_with - rss_before) >> 20
    );
    daemon.assert_alive("holding announced frames");
    drop(streams);
    daemon.terminate();
}
