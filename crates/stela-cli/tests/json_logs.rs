//! `stela serve --log-format json`: every log line is one JSON object, and the events an
//! operator needs are there with their fields — connections accepted and closed with the peer,
//! a log opened and closed, and an administrative request (a power-fail notice) with its sender.

mod common;

use common::{stela, Daemon};
use stela_client::{Wal, WalOptions};

#[test]
fn the_daemon_logs_its_events_as_json_lines() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &["--log-format", "json"]);
    let wal: Wal<String> = Wal::open(daemon.socket(), "audited", WalOptions::default()).unwrap();
    wal.append_durable(&"one".to_owned()).unwrap();
    wal.close().unwrap();
    assert!(stela(&["power-fail", "--dir", daemon.dir_arg()])
        .status
        .success());
    assert!(stela(&["power-restore", "--dir", daemon.dir_arg()])
        .status
        .success());
    let output = daemon.output();
    daemon.terminate();

    // The start-up banner is on stdout; every line on stderr is a JSON object.
    let events: Vec<serde_json::Value> = output
        .lines()
        .filter(|line| !line.starts_with("stela serve:"))
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    let find = |message: &str| {
        events
            .iter()
            .find(|e| e["fields"]["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} event in:\n{output}"))
    };
    let accepted = find("connection accepted");
    assert!(
        accepted["fields"]["peer"]
            .as_str()
            .is_some_and(|p| p.contains("uid")),
        "{accepted}"
    );
    assert!(
        accepted["level"] == "INFO" && accepted["timestamp"].is_string(),
        "{accepted}"
    );
    find("connection closed");
    let opened = find("log opened");
    assert_eq!(opened["fields"]["log"], "audited", "{opened}");
    let closed = find("closed (no handle left)");
    assert_eq!(closed["fields"]["log"], "audited", "{closed}");
    let admin: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["fields"]["message"] == "administrative request")
        .collect();
    assert!(
        admin.iter().any(|e| e["fields"]["request"]
            .as_str()
            .is_some_and(|r| r.contains("power-fail"))
            && e["fields"]["peer"]
                .as_str()
                .is_some_and(|p| p.contains("uid"))),
        "no power-fail request with its sender in:\n{output}"
    );
}
