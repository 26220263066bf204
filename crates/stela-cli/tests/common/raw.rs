//! Raw protocol helpers for tests that speak to a `stela serve` process byte by byte (the
//! hostile and limit tests): frames, a Hello, one answer with a deadline, and what the daemon
//! process uses (/proc).

use super::{stela, text, Daemon};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;
use stela_proto::frame::{self, FRAME_HEADER_BYTES};
use stela_proto::{Request, RequestBody, Response, ResponseBody, Role, PROTOCOL_VERSION};

/// Raises this process's soft file limit to at least `need` (and the hard one, if allowed).
pub fn raise_own_file_limit(need: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass; setrlimit reads it.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        if limit.rlim_max < need {
            limit.rlim_max = need; // only root may: then it works
        }
        limit.rlim_cur = limit.rlim_max;
        let raised = libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0;
        assert!(
            raised && limit.rlim_cur >= need,
            "this test needs {need} file descriptors; the hard limit is {} and cannot be raised (run as root or raise `ulimit -Hn`)",
            limit.rlim_max
        );
    }
}

pub fn framed(request: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode(request, &mut out).unwrap();
    out
}

pub fn hello(role: Role) -> Vec<u8> {
    framed(&Request {
        id: 1,
        body: RequestBody::Hello {
            version: PROTOCOL_VERSION,
            client: "raw-test-client".into(),
            role,
            token: None,
        },
    })
}

/// Reads one answer (with a deadline).
pub fn read_answer(stream: &mut UnixStream) -> std::io::Result<Response> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header)?;
    let header = frame::parse_header(header, 1 << 20).map_err(std::io::Error::other)?;
    let mut body = vec![0u8; header.body_len];
    stream.read_exact(&mut body)?;
    frame::decode_body(header, &body).map_err(std::io::Error::other)
}

/// Connects and says Hello; returns the stream and the answer.
pub fn connect(socket: &Path, role: Role) -> (UnixStream, ResponseBody) {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream.write_all(&hello(role)).unwrap();
    let answer = read_answer(&mut stream).expect("an answer to Hello");
    (stream, answer.body)
}

/// The daemon's resident memory, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

pub fn threads(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("Threads")
}

pub fn status_json(daemon: &Daemon) -> serde_json::Value {
    let out = stela(&["status", "--dir", daemon.dir_arg(), "--json"]);
    assert!(out.status.success(), "stela status failed: {}", text(&out));
    serde_json::from_slice(&out.stdout).expect("status JSON")
}
