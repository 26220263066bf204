//! `stela status` as a health check, against a real `stela serve` process: exit 0 and
//! "health: ok" while the daemon takes writes; exit 3 with the reason (text and JSON) while a
//! power-fail notice is in force; healthy again after power-restore. (A stopped log and a log
//! waiting for space are covered by the unit tests of `service::health_problems` over the status
//! report, and the daemon's own tests check that the report shows them.) No daemon at all is
//! exit 6, "no daemon answers", not a verdict on its health.

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
