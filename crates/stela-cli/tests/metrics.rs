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

/// A daemon serving metrics on a free port, and that port's address as it printed it.
fn daemon_with_metrics(dir: &std::path::Path) -> (Daemon, String) {
    let daemon = Daemon::start(dir, &["--metrics", "127.0.0.1:0"]);
    let output = daemon.output();
    let addr = output
        .lines()
        .find_map(|l| l.strip_prefix("stela serve: metrics on http://"))
        .and_then(|l| l.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address in:\n{output}"))
        .to_owned();
    (daemon, addr)
}

#[test]
fn a_scrape_shows_what_the_daemon_did() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let (daemon, addr) = daemon_with_metrics(&dir);

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
        value(&after, "stela_written_bytes_total").unwrap() > 0.0,
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

/// The type each metric is declared with, from a scrape's `# TYPE` lines.
fn types(text: &str) -> std::collections::HashMap<String, String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect()
}

/// Issue 55: totals that only grow are counters (`rate()` works on them), the process's own
/// metrics and the build are there, and a client asking for OpenMetrics gets it; promtool
/// passes the classic text.
#[test]
fn counters_are_counters_with_process_and_build_metrics_and_openmetrics_on_request() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let (daemon, addr) = daemon_with_metrics(&dir);
    let wal: Wal<String> = Wal::open(daemon.socket(), "m", WalOptions::default()).unwrap();
    let lsn = wal.append(&"x".to_owned()).unwrap();
    wal.commit_at(lsn, Durability::Disk).unwrap();

    let classic = get(&addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        classic.contains("Content-Type: text/plain; version=0.0.4"),
        "{classic}"
    );
    let classic_types = types(&classic);
    for (name, kind) in [
        ("stela_written_bytes_total", "counter"),
        ("stela_refused_connections_total", "counter"),
        ("stela_refused_logins_total", "counter"),
        ("stela_commits_total", "counter"),
        ("stela_dirty_bytes", "gauge"),
        ("stela_connections", "gauge"),
        ("stela_build_info", "gauge"),
        ("process_cpu_seconds_total", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_threads", "gauge"),
        ("process_start_time_seconds", "gauge"),
    ] {
        assert_eq!(
            classic_types.get(name).map(String::as_str),
            Some(kind),
            "{name} in:\n{classic}"
        );
    }
    assert!(
        value(&classic, "stela_written_bytes_total").unwrap() > 0.0,
        "{classic}"
    );
    assert!(
        value(&classic, "process_resident_memory_bytes").unwrap() > 0.0,
        "{classic}"
    );
    assert!(
        value(&classic, "process_threads").unwrap() >= 1.0,
        "{classic}"
    );
    let version = format!(
        "stela_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(value(&classic, &version), Some(1.0), "{classic}");
    assert!(!classic.contains("# EOF"), "{classic}");
    common::promtool_check(&classic);

    // What Prometheus sends: OpenMetrics first, the classic text as a fallback.
    let openmetrics = get(
        &addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1\r\n\r\n",
    );
    assert!(
        openmetrics.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{openmetrics}"
    );
    assert!(openmetrics.trim_end().ends_with("# EOF"), "{openmetrics}");
    let om_types = types(&openmetrics);
    // OpenMetrics names a counter's family without `_total`; its sample has it.
    assert_eq!(
        om_types.get("stela_written_bytes").map(String::as_str),
        Some("counter")
    );
    assert_eq!(
        om_types.get("process_cpu_seconds").map(String::as_str),
        Some("counter")
    );
    assert!(
        value(&openmetrics, "stela_written_bytes_total").unwrap() > 0.0,
        "{openmetrics}"
    );
    wal.close().unwrap();
    daemon.terminate();
}

/// Issue 54: `/metrics` was one blocking thread, and a client sending its request a byte every
/// 1.5 s (under the 2 s read timeout each time) held it for as long as it liked, so every other
/// scrape waited. Now a slow client holds one handler for at most the request-head deadline,
/// and other scrapes are answered meanwhile: here, before the slow client has finished.
#[test]
fn a_client_dribbling_its_request_blocks_no_other_scrape() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let (daemon, addr) = daemon_with_metrics(&dir);

    let slow_done = Arc::new(AtomicBool::new(false));
    let slow = {
        let (addr, slow_done) = (addr.clone(), Arc::clone(&slow_done));
        std::thread::spawn(move || {
            let mut stream = TcpStream::connect(&addr).unwrap();
            for (i, byte) in b"GET /metrics HTTP/1.1\r\nHost: slow\r\n\r\n"
                .iter()
                .enumerate()
            {
                if i > 0 {
                    std::thread::sleep(Duration::from_millis(1500));
                }
                if stream.write_all(&[*byte]).is_err() {
                    break;
                }
            }
            // Done sending: all of it (the endpoint read it all before answering anyone
            // else), or cut off by the endpoint.
            slow_done.store(true, Ordering::SeqCst);
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer);
            answer
        })
    };
    // The slow client's connection is taken by the endpoint first.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let text = scrape(&addr);
        assert!(text.contains("stela_dirty_cap_bytes"), "{text}");
    }
    assert!(
        !slow_done.load(Ordering::SeqCst),
        "the scrapes were answered only after the slow client had stopped sending"
    );
    let answer = slow.join().unwrap();
    // Cut off at the deadline: told so (if it could still read), never served in full.
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    daemon.terminate();
}
