//! SIGHUP reloads `stela serve --config FILE`: what can change while running (the idle timeout,
//! the retention, the connection limits) is applied and logged; a change to anything else is
//! reported as needing a restart; a file that no longer reads is refused and the running
//! configuration stays. (Token and certificate rotation: tests/security.rs.)

mod common;

use common::{stela, Daemon};
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

fn hup(daemon: &Daemon) {
    // SAFETY: signalling our own child process by its pid.
    unsafe {
        libc::kill(daemon.child.id() as i32, libc::SIGHUP);
    }
}

fn wait_for(daemon: &Daemon, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemon.output().contains(text) {
        assert!(
            Instant::now() < deadline,
            "no {text:?} in:\n{}",
            daemon.output()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sighup_applies_what_can_change_and_keeps_the_rest() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let file = base.path().join("stela.toml");
    std::fs::write(&file, "idle-timeout = 3600\nbuffers = 6\n").unwrap();
    let daemon = Daemon::start(&dir, &["--config", file.to_str().unwrap()]);

    // A connection that says Hello and then nothing: kept under the hour-long timeout.
    let mut idle = UnixStream::connect(daemon.socket()).unwrap();
    common_hello(&mut idle);

    std::fs::write(
        &file,
        "idle-timeout = 1\nbuffers = 8\nretain-bytes = \"1M\"\n",
    )
    .unwrap();
    hup(&daemon);
    wait_for(&daemon, "idle-timeout = 1 s (applied)");
    wait_for(&daemon, "retain-bytes = 1048576 (applied)");
    wait_for(&daemon, "buffers changed: NOT applied, needs a restart");
    // The new idle timeout closes the silent connection.
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    let closed = idle.read_to_end(&mut rest);
    assert!(
        closed.is_ok(),
        "the idle connection was not closed: {closed:?}"
    );

    // A broken file: refused, and the daemon goes on as it was.
    std::fs::write(&file, "idle-timeout = [[\n").unwrap();
    hup(&daemon);
    wait_for(&daemon, "SIGHUP reload refused");
    // A misspelt key: refused with the file and line, the message `stela serve` gives at start.
    std::fs::write(&file, "idle-timeout = \"1s\"\nbufers = 8\n").unwrap();
    hup(&daemon);
    wait_for(
        &daemon,
        "stela.toml:2: unknown setting `bufers` (did you mean `buffers`?)",
    );
    let status = stela(&["status", "--dir", daemon.dir_arg()]);
    assert_eq!(status.status.code(), Some(0));
    daemon.terminate();
}

/// Lowering max-connections by SIGHUP: the clients already served go on, the next one beyond
/// the new limit is refused with `TooManyConnections`; raising it lets clients in again.
#[test]
fn sighup_changes_the_connection_limit_for_new_connections_only() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let file = base.path().join("stela.toml");
    std::fs::write(&file, "max-connections = 4\n").unwrap();
    let daemon = Daemon::start(&dir, &["--config", file.to_str().unwrap()]);
    let mut served: Vec<UnixStream> = (0..2)
        .map(|_| {
            let mut stream = UnixStream::connect(daemon.socket()).unwrap();
            assert!(matches!(
                hello(&mut stream),
                stela_proto::ResponseBody::Welcome { .. }
            ));
            stream
        })
        .collect();

    std::fs::write(&file, "max-connections = 1\n").unwrap();
    hup(&daemon);
    wait_for(&daemon, "SIGHUP reload: max-connections = 1 ");
    let mut late = UnixStream::connect(daemon.socket()).unwrap();
    match hello(&mut late) {
        stela_proto::ResponseBody::Error {
            code: stela_proto::ErrorCode::TooManyConnections,
            message,
        } => assert!(message.contains("at most 1 connections"), "{message}"),
        other => panic!("a client beyond the lowered limit got {other:?}"),
    }
    for stream in &mut served {
        assert!(
            matches!(
                request(stream, 2, stela_proto::RequestBody::ListLogs),
                stela_proto::ResponseBody::Logs(_)
            ),
            "a connection served before the reload was dropped"
        );
    }
    let status = stela(&["status", "--dir", daemon.dir_arg()]);
    assert_eq!(
        status.status.code(),
        Some(0),
        "administrators keep their reserve"
    );

    std::fs::write(&file, "max-connections = 4\n").unwrap();
    hup(&daemon);
    wait_for(&daemon, "SIGHUP reload: max-connections = 4 ");
    let mut again = UnixStream::connect(daemon.socket()).unwrap();
    assert!(matches!(
        hello(&mut again),
        stela_proto::ResponseBody::Welcome { .. }
    ));
    daemon.terminate();
}

/// Sends a Hello as a client and returns the daemon's answer.
fn hello(stream: &mut UnixStream) -> stela_proto::ResponseBody {
    request(
        stream,
        1,
        stela_proto::RequestBody::Hello {
            version: stela_proto::PROTOCOL_VERSION,
            client: "reload-test".into(),
            role: stela_proto::Role::Client,
            token: None,
        },
    )
}

/// Sends request `id` and reads its answer.
fn request(
    stream: &mut UnixStream,
    id: u64,
    body: stela_proto::RequestBody,
) -> stela_proto::ResponseBody {
    use std::io::Write;
    use stela_proto::frame;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut out = Vec::new();
    frame::encode(&stela_proto::Request { id, body }, &mut out).unwrap();
    stream.write_all(&out).unwrap();
    let mut header = [0u8; stela_proto::FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let header = frame::parse_header(header, stela_proto::MAX_FRAME_BYTES).unwrap();
    let mut body = vec![0u8; header.body_len];
    stream.read_exact(&mut body).unwrap();
    frame::decode_body::<stela_proto::Response>(header, &body)
        .unwrap()
        .body
}

/// Sends a Hello as `stela status` would and reads the answer.
fn common_hello(stream: &mut UnixStream) {
    use std::io::Write;
    let hello = stela_proto::Request {
        id: 1,
        body: stela_proto::RequestBody::Hello {
            version: stela_proto::PROTOCOL_VERSION,
            client: "reload-test".into(),
            role: stela_proto::Role::Client,
            token: None,
        },
    };
    let mut frame = Vec::new();
    stela_proto::frame::encode(&hello, &mut frame).unwrap();
    stream.write_all(&frame).unwrap();
    let mut header = [0u8; stela_proto::FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
}
