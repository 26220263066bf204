//! `stela logs list|delete` against a running daemon: every log of its directory with its
//! state; a log a client has open cannot be deleted (exit 5, "locked"); a closed one is removed
//! with its files and directory, and is gone from the list.

mod common;

use common::{stela, text, Daemon};
use stela_client::{Wal, WalOptions};

#[test]
fn logs_are_listed_and_a_closed_one_deleted() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    let open: Wal<String> = Wal::open(daemon.socket(), "kept", WalOptions::default()).unwrap();
    for i in 0..5 {
        open.append_durable(&format!("kept {i}")).unwrap();
    }
    let closed: Wal<String> = Wal::open(daemon.socket(), "old", WalOptions::default()).unwrap();
    closed.append_durable(&"old".to_owned()).unwrap();
    closed.close().unwrap();
    let d = daemon.dir_arg().to_owned();

    let list = stela(&["logs", "list", "--dir", &d, "--json"]);
    assert_eq!(list.status.code(), Some(0), "{}", text(&list));
    let logs: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let by_name = |name: &str| {
        logs.as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {logs}"))
            .clone()
    };
    let kept = by_name("kept");
    assert_eq!(kept["state"], "open", "{kept}");
    assert_eq!(kept["handles"], 1, "{kept}");
    assert_eq!(kept["last_lsn"], 5, "{kept}");
    assert_eq!(kept["first_lsn"], 1, "{kept}");
    assert!(kept["bytes_on_disk"].as_u64().unwrap() > 0, "{kept}");
    let old = by_name("old");
    assert_eq!(old["state"], "closed", "{old}");
    assert_eq!(old["segments"], 1, "{old}");
    let human = text(&stela(&["logs", "list", "--dir", &d]));
    assert!(
        human.contains("kept") && human.contains("closed"),
        "{human}"
    );

    let busy = stela(&["logs", "delete", "kept", "--dir", &d]);
    assert_eq!(busy.status.code(), Some(5), "{}", text(&busy));
    assert!(text(&busy).contains("open by 1 client"), "{}", text(&busy));
    assert!(dir.join("logs/kept").exists());

    let deleted = stela(&["logs", "delete", "old", "--dir", &d]);
    assert_eq!(deleted.status.code(), Some(0), "{}", text(&deleted));
    assert!(
        text(&deleted).contains("deleted log old: 1 segment(s)"),
        "{}",
        text(&deleted)
    );
    assert!(
        !dir.join("logs/old").exists(),
        "the log's directory is still there"
    );
    let after = text(&stela(&["logs", "list", "--dir", &d]));
    assert!(!after.contains("old"), "{after}");

    let missing = stela(&["logs", "delete", "never-was", "--dir", &d]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    assert!(
        text(&missing).contains("does not exist"),
        "{}",
        text(&missing)
    );

    // The open log is untouched.
    let read: Vec<String> = open.iter().unwrap().map(|r| r.unwrap().1).collect();
    assert_eq!(read.len(), 5);
    open.close().unwrap();
    daemon.terminate();
}
