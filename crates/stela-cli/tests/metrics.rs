//! `stela serve --metrics ADDR`: a scrape of a real daemon shows what it did — requests by
//! level over the socket and the shared-memory ring, flushes as histograms, the dirty-byte cap,
//! connections, a power-fail notice — and the endpoint answers bad requests without falling
//! over. The scrape must also pass `promtool check metrics` (Debian's `prometheus` package, which
//! `./test` installs); without promtool the test fails, saying so.

mod common;

use common::{stela, Daemon};
use std::io::{Read, Write};
use std::net::TcpStream;
use stela_client::{Durability, Transport, Wal, WalOptions};

fn get(addr: &str, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

fn scrape(addr: &str) -> String {
    let answer = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    answer.split("\r\n\r\n").nth(1).unwrap().to_owned()
}

/// The value of the sample `name` (with its labels, as written), if present.
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_scrape_shows_what_the_daemon_did() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &["--metrics", "127.0.0.1:0"]);
    let output = daemon.output();
    let addr = output
        .lines()
        .find_map(|l| l.strip_prefix("stela serve: metrics on http://"))
        .and_then(|l| l.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address in:\n{output}"))
        .to_owned();

    let before = scrape(&addr);
    assert_eq!(
        value(&before, "stela_commit_requests_total{level=\"disk\"}"),
        Some(0.0)
    );
    assert!(
        value(&before, "stela_dirty_cap_bytes").unwrap() > 0.0,
        "{before}"
    );

    for transport in [Transport::SharedMemory, Transport::Socket] {
        let wal: Wal<String> = Wal::open(
            daemon.socket(),
            "m",
            WalOptions::default().transport(transport),
        )
        .unwrap();
        for i in 0..10 {
            wal.append(&format!("buffered {i}")).unwrap();
        }
        for i in 0..5 {
            let lsn = wal.append(&format!("disk {i}")).unwrap();
            wal.commit_at(lsn, Durability::Disk).unwrap();
        }
        wal.close().unwrap();
    }
    let after = scrape(&addr);
    let buffered = value(&after, "stela_commit_requests_total{level=\"buffered\"}").unwrap();
    let disk = value(&after, "stela_commit_requests_total{level=\"disk\"}").unwrap();
    assert!(buffered >= 30.0, "buffered {buffered}:\n{after}");
    assert!(disk >= 10.0, "disk {disk}:\n{after}");
    // Acknowledged: every one of them (nothing was refused), by level.
    let acked_buffered = value(&after, "stela_commits_total{level=\"buffered\"}").unwrap();
    let acked_disk = value(&after, "stela_commits_total{level=\"disk\"}").unwrap();
    assert_eq!(acked_buffered, 30.0, "{after}");
    assert_eq!(acked_disk, 10.0, "{after}");
    assert!(
        value(&after, "stela_flush_seconds_count").unwrap() >= 1.0,
        "{after}"
    );
    assert!(
        value(&after, "stela_flush_bytes_sum").unwrap() > 0.0,
        "{after}"
    );
    assert_eq!(value(&after, "stela_failed_writes_total"), Some(0.0));
    assert!(
        value(&after, "stela_written_bytes").unwrap() > 0.0,
        "{after}"
    );
    assert_eq!(value(&after, "stela_power_failing"), Some(0.0));
    assert!(
        after.contains("# TYPE stela_commit_requests_total counter"),
        "{after}"
    );

    let out = stela(&["power-fail", "--dir", daemon.dir_arg()]);
    assert!(out.status.success());
    assert_eq!(value(&scrape(&addr), "stela_power_failing"), Some(1.0));

    // Bad requests get an answer, and the endpoint stays up.
    assert!(get(&addr, "GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(get(&addr, "\u{1}\u{2}garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
    drop(TcpStream::connect(&addr).unwrap()); // connects and says nothing
    let last = scrape(&addr);

    common::promtool_check(&last);
    daemon.terminate();
}
