//! Requests racing the close of a log: when the last handle of a log goes (its connection
//! closed), a worker writes out what the pool holds of it, removes it from the pool, then from
//! the table of open logs. Whatever else looks at logs meanwhile must not find a log the pool
//! no longer has.
//!
//! What it proves (each failed before the fix it pins):
//! - `status_while_logs_close`: `status` (what `stela status` and the power hooks ask), called
//!   over and over while clients open a log, append and hang up, never fails. It used to panic
//!   ("a removed log is never used") when it listed a log between its removal from the pool and
//!   from the table, which on the event loop aborts the daemon and loses every buffered record
//!   of every log. Seen first in `stela-cli/tests/shm_power.rs`, whose status polling met a
//!   ring client's hang-up. (Each cycle opens a new log, so that the next bug cannot interfere.)
//! - `reopen_right_after_the_last_close`: the same, reopening the same few
//!   logs: an open that follows the close of the same log must succeed. It fails with
//!   `OpenFailed` ("the log is open in another process or handle") if the close ends while
//!   anything still holds the closed log's entry (here the status that listed it): the entry
//!   owns the directory lock, so the close waits for it to go.
//! - `a_read_job_outlives_its_connection`: a connection whose read of a
//!   long stretch of the log runs on a worker (the records are on disk) is closed by the daemon
//!   meanwhile (its client corrupted its shared-memory ring: the daemon stops the ring and
//!   closes the connection, as `docs/PROTOCOL.md` says, without waiting for the job). The close
//!   used to release the log's last handle at once, so the log left the pool while the read
//!   still ran and the read panicked in `Pool::read`; now a closed connection's handles are
//!   given back only when its outstanding request is answered. The read must end without a
//!   panic (a panic on a daemon thread now stops the daemon). Checked by counting panics.

mod common;

use common::{rec, NoHang, RawClient, Rec};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_net::shm::{os, recv_with_fds, Mapping};
use stela_proto::frame::{self, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
use stela_proto::ring::{DATA_OFFSET, TAIL_OFFSET};
use stela_proto::{Durability, Request, RequestBody, Response, ResponseBody, PROTOCOL_VERSION};
use stela_server::{DaemonConfig, Server};
use stela_wal::storage::FaultStorage;

fn daemon(socket_dir: &tempfile::TempDir, segment_bytes: u64) -> NoHang {
    let mut config = DaemonConfig::new("/stela");
    config.socket = Some(socket_dir.path().join("stela.sock"));
    config.storage = Arc::new(FaultStorage::new());
    config.segment_bytes = segment_bytes;
    config.assume_write_rate = Some(1 << 30);
    config.spin = Duration::ZERO;
    NoHang::new(Server::start(config).expect("daemon starts"))
}

/// Opens, appends to and hangs up on `name(cycle)` over and over while another thread asks for
/// `status` without pause; fails if `status` fails or an open is refused.
fn closes_under_status(cycles: u64, name: impl Fn(u64) -> String) {
    const HELD_LOGS: usize = 40;
    let socket_dir = tempfile::tempdir().unwrap();
    // Small segments: every log created costs one in memory.
    let server = daemon(&socket_dir, 16 << 10);
    let socket = server.socket_path().to_owned();
    // Logs that stay open make each status longer: more time to meet a close.
    let mut holder = RawClient::connect(&socket);
    for i in 0..HELD_LOGS {
        holder.open(&format!("held-{i}"));
    }
    let done = AtomicBool::new(false);
    let statuses = AtomicU64::new(0);
    std::thread::scope(|scope| {
        let status = scope.spawn(|| {
            while !done.load(Ordering::SeqCst) {
                let report = server.status();
                assert!(report.logs.len() >= HELD_LOGS);
                statuses.fetch_add(1, Ordering::SeqCst);
            }
        });
        // Should the open panic, the status thread still stops.
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let stop_status = Done(&done);
        let started = Instant::now();
        let mut cycle = 0;
        while cycle < cycles && !status.is_finished() {
            let mut client = RawClient::connect(&socket);
            let handle = client.open(&name(cycle));
            client
                .append(handle, Durability::Buffered, &[rec(0, cycle, 10)])
                .unwrap();
            drop(client); // the hang-up: the log's last handle goes
            cycle += 1;
        }
        drop(stop_status);
        let outcome = status.join();
        eprintln!(
            "{cycle} open/append/hang-up cycles against {} status calls in {} ms",
            statuses.load(Ordering::SeqCst),
            started.elapsed().as_millis()
        );
        if outcome.is_err() {
            panic!("status failed while logs were closing (see the panic above)");
        }
    });
    drop(holder);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn status_while_logs_close() {
    closes_under_status(1000, |cycle| format!("cycling-{cycle}"));
}

#[test]

fn reopen_right_after_the_last_close() {
    closes_under_status(1000, |cycle| format!("cycling-{}", cycle % 3));
}

/// Panics on the daemon's own threads (`stela-*`) since the hook was installed.
static DAEMON_PANICS: AtomicU64 = AtomicU64::new(0);

fn count_daemon_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let name = std::thread::current().name().unwrap_or("").to_owned();
        if name.starts_with("stela-") {
            DAEMON_PANICS.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
}

fn send(stream: &mut UnixStream, id: u64, body: RequestBody) {
    let mut out = Vec::new();
    frame::encode(&Request { id, body }, &mut out).unwrap();
    stream.write_all(&out).unwrap();
}

/// Reads one answer, with the descriptors that came with it.
fn receive(stream: &UnixStream) -> (Response, Vec<std::os::fd::OwnedFd>) {
    let mut fds = Vec::new();
    let mut bytes = vec![0u8; FRAME_HEADER_BYTES];
    let mut filled = 0;
    while filled < bytes.len() {
        let n = recv_with_fds(stream.as_fd(), &mut bytes[filled..], &mut fds).unwrap();
        assert!(n > 0, "the daemon closed the connection");
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
    let response = frame::decode_body(header, &bytes[FRAME_HEADER_BYTES..]).unwrap();
    (response, fds)
}

/// A connection with a 10 s read timeout (a stuck daemon fails the test instead of hanging
/// it) that said Hello and asked to open `log`; the open's refusal message if refused.
fn raw_open(socket: &std::path::Path, log: &str) -> Result<(UnixStream, u32), String> {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    send(
        &mut stream,
        1,
        RequestBody::Hello {
            version: PROTOCOL_VERSION,
            client: "close_races".into(),
            role: stela_proto::Role::Client,
            token: None,
        },
    );
    assert!(matches!(
        receive(&stream).0.body,
        ResponseBody::Welcome { .. }
    ));
    send(
        &mut stream,
        2,
        RequestBody::Open {
            log: log.into(),
            codec: "msgpack".into(),
            type_tag: common::TYPE_TAG.into(),
            create: false,
            durability: None,
            schema: None,
        },
    );
    match receive(&stream).0.body {
        ResponseBody::Opened { handle, .. } => Ok((stream, handle)),
        ResponseBody::Error { message, .. } => Err(message),
        other => panic!("open answered {other:?}"),
    }
}

#[test]

fn a_read_job_outlives_its_connection() {
    const RECORDS: u64 = 5000;
    const ROUNDS: u64 = 3;
    count_daemon_panics();
    let socket_dir = tempfile::tempdir().unwrap();
    let server = daemon(&socket_dir, 64 << 10);
    let socket = server.socket_path().to_owned();
    // About 5 MB of records, all on disk: reading them all is a worker's job, and a long one.
    let mut writer = RawClient::connect(&socket);
    let handle = writer.open("big");
    for seq in (0..RECORDS).step_by(10) {
        let records: Vec<Rec> = (seq..seq + 10).map(|s| rec(0, s, 1000)).collect();
        writer
            .append(handle, Durability::Buffered, &records)
            .unwrap();
    }
    writer.commit(handle, RECORDS, Durability::Disk).unwrap();
    drop(writer);

    for round in 0..ROUNDS {
        // The previous round's read may still hold the log's files (and their lock): until it
        // ends, the log cannot be opened again.
        let deadline = Instant::now() + Duration::from_secs(10);
        let (mut stream, handle) = loop {
            match raw_open(&socket, "big") {
                Ok(opened) => break opened,
                Err(message) => {
                    eprintln!("round {round}: reopening refused: {message}");
                    assert!(Instant::now() < deadline, "the log stays locked");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        send(&mut stream, 3, RequestBody::MapRing { data_bytes: 0 });
        let (answer, fds) = receive(&stream);
        assert!(matches!(answer.body, ResponseBody::RingMapped { .. }));
        // Memory, doorbell, then the user's wake board (not used here).
        let mut fds = fds.into_iter();
        let (memory, doorbell) = (fds.next().unwrap(), fds.next().unwrap());
        let len = os::file_size(memory.as_fd()).unwrap() as usize;
        let region = Mapping::map(memory.as_fd(), len).unwrap();

        // The read (everything, then on into the buffers) goes to a worker...
        send(
            &mut stream,
            4,
            RequestBody::Read {
                handle,
                from: 1,
                max_records: 100_000,
                max_bytes: 64 << 20,
            },
        );
        // ... and, once the job runs, a published entry that fails its header check stops the
        // ring and closes the connection meanwhile. (In the same turn of the event loop the ring
        // would be seen first and the read never started.)
        std::thread::sleep(Duration::from_millis(5));
        // SAFETY: the mapping is `len` bytes, the data area starts at DATA_OFFSET < len and the
        // tail word is 8-aligned at TAIL_OFFSET; the daemon reads these bytes concurrently only
        // through its own atomic loads and copies, which is the protocol's premise.
        unsafe {
            let base = region.as_ptr();
            std::ptr::write_bytes(base.add(DATA_OFFSET), 0, 48);
            std::ptr::write_unaligned(base.add(DATA_OFFSET).cast::<u32>(), 48u32.to_le());
            (*base.add(TAIL_OFFSET).cast::<std::sync::atomic::AtomicU64>())
                .store(48, Ordering::Release);
        }
        std::fs::File::from(doorbell)
            .write_all(&1u64.to_ne_bytes())
            .unwrap();
        // The daemon answers the bad entry and closes (the read's answer never comes).
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
    }

    // The last read has ended once the log can be opened again; then a read from disk works.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut stream, handle) = loop {
        match raw_open(&socket, "big") {
            Ok(opened) => break opened,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(message) => panic!("the log stays locked: {message}"),
        }
    };
    send(
        &mut stream,
        3,
        RequestBody::Read {
            handle,
            from: 1,
            max_records: 10,
            max_bytes: 1 << 20,
        },
    );
    match receive(&stream).0.body {
        ResponseBody::Records { records, .. } => assert_eq!(records.len(), 10),
        other => panic!("a read afterwards: {other:?}"),
    }
    drop(stream);
    assert_eq!(
        DAEMON_PANICS.load(Ordering::SeqCst),
        0,
        "the daemon's threads panicked (see above)"
    );
    server.shutdown().expect("clean shutdown");
}
