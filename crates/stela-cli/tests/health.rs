//! `stela status` as a health check, against a real `stela serve` process: exit 0 and
//! "health: ok" while the daemon takes writes; exit 3 with the reason (text and JSON) while a
//! power-fail notice is in force; healthy again after power-restore; exit 3 naming the log when a
//! log's sync failed (a daemon in this process whose storage injects the failure, asked by the
//! real `stela status`). A log waiting for space is covered by the unit tests of
//! `service::health_problems` and the daemon's disk-full test. No daemon at all is exit 6, "no
//! daemon answers", not a verdict on its health.

mod common;

use common::{stela, text, Daemon};

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("stela-health")
        .tempdir()
        .unwrap()
}

#[test]
fn status_exit_code_follows_the_daemons_health() {
    let dir = tempdir();
    let daemon = Daemon::start(dir.path(), &[]);
    let dir_arg = daemon.dir_arg().to_owned();

    let healthy = stela(&["status", "--dir", &dir_arg]);
    assert_eq!(healthy.status.code(), Some(0), "{}", text(&healthy));
    let shown = text(&healthy);
    assert!(shown.contains("health: ok"), "{shown}");
    assert!(
        shown.contains("dirty: [") && shown.contains(" %"),
        "no fill bar for the dirty bytes: {shown}"
    );

    let fail = stela(&["power-fail", "--dir", &dir_arg]);
    assert_eq!(fail.status.code(), Some(0), "{}", text(&fail));
    let failing = stela(&["status", "--dir", &dir_arg]);
    assert_eq!(failing.status.code(), Some(3), "{}", text(&failing));
    let shown = text(&failing);
    assert!(shown.contains("health: UNHEALTHY: power failed"), "{shown}");

    let json = stela(&["status", "--dir", &dir_arg, "--json"]);
    assert_eq!(json.status.code(), Some(3), "{}", text(&json));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["healthy"], serde_json::json!(false), "{value}");
    assert!(
        value["problems"][0].as_str().unwrap().contains("power"),
        "{value}"
    );

    let restore = stela(&["power-restore", "--dir", &dir_arg]);
    assert_eq!(restore.status.code(), Some(0), "{}", text(&restore));
    let again = stela(&["status", "--dir", &dir_arg]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    daemon.terminate();
}

#[test]
fn status_of_no_daemon_is_an_error_not_a_health_verdict() {
    let dir = tempdir();
    let out = stela(&["status", "--dir", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    assert!(text(&out).contains("stela serve"), "{}", text(&out));
}

/// A log whose sync failed makes `stela status` (the real command, against a daemon whose
/// storage injects the failure) exit 3, naming the log and the cause.
#[test]
fn a_stopped_log_makes_status_unhealthy() {
    use std::sync::Arc;
    use stela_wal::storage::FaultStorage;
    let socket_dir = tempdir();
    let fault = FaultStorage::new();
    let mut config = stela_server::DaemonConfig::new("/stela");
    config.socket = Some(socket_dir.path().join("stela.sock"));
    config.storage = Arc::new(fault.clone());
    config.assume_write_rate = Some(500 << 20);
    let server = stela_server::Server::start(config).unwrap();
    let socket = server.socket_path().to_str().unwrap().to_owned();
    let healthy = stela(&["status", "--socket", &socket]);
    assert_eq!(healthy.status.code(), Some(0), "{}", text(&healthy));

    let wal: stela_client::Wal<String> = stela_client::Wal::open(
        socket.as_str(),
        "failing",
        stela_client::WalOptions::default().durability(stela_client::Durability::Disk),
    )
    .unwrap();
    wal.append_durable(&"synced".to_owned()).unwrap();
    fault.fail_sync_after(0);
    let refused = wal.append_durable(&"not synced".to_owned()).unwrap_err();
    assert_eq!(
        refused.code(),
        Some(stela_client::ErrorCode::LogStopped),
        "{refused}"
    );

    let out = stela(&["status", "--socket", &socket]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let shown = text(&out);
    assert!(
        shown.contains("failing") && shown.contains("STOPPED"),
        "{shown}"
    );
    assert!(
        shown.contains("health: UNHEALTHY: log failing stopped"),
        "{shown}"
    );
    drop(wal);
    let _ = server.shutdown();
}
