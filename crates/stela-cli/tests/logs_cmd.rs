//! `stela logs list|delete|release-hold` against a running daemon: every log of its directory
//! with its state; a log a client has open cannot be deleted (exit 5, "locked"); a closed one is
//! removed with its files, directory and holds, and is gone from the list; a warm follower's hold on a
//! copy is listed and released by the holder shown.

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
    // A follower once read the closed log: its hold goes with the log.
    let follower = base.path().join("follower");
    std::fs::create_dir_all(&follower).unwrap();
    let storage = stela_wal::storage::StdStorage;
    let old_dir = dir.join("logs/old");
    stela_wal::holds::record(&storage, &old_dir, &follower, stela_format::Lsn::new(1)).unwrap();

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
    assert!(stela_wal::holds::list(&storage, &old_dir)
        .unwrap()
        .is_empty());
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

/// A warm follower's hold on a copy is listed with its holder and LSN, and an administrator
/// releases it by the holder the listing shows; a name nobody holds under is refused with the
/// holds there are.
#[test]
fn a_followers_hold_is_listed_and_released() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    let log: Wal<String> = Wal::open(daemon.socket(), "copy", WalOptions::default()).unwrap();
    log.append_durable(&"one".to_owned()).unwrap();
    log.close().unwrap();
    let d = daemon.dir_arg().to_owned();
    let follower = base.path().join("follower");
    std::fs::create_dir_all(&follower).unwrap();
    let log_dir = dir.join("logs").join("copy");
    let storage = stela_wal::storage::StdStorage;
    stela_wal::holds::record(&storage, &log_dir, &follower, stela_format::Lsn::new(42)).unwrap();
    let holder = std::fs::canonicalize(&follower)
        .unwrap()
        .display()
        .to_string();

    let human = text(&stela(&["logs", "list", "--dir", &d]));
    assert!(
        human.contains(&format!("held from LSN 42 by {holder}")),
        "{human}"
    );
    let list = stela(&["logs", "list", "--dir", &d, "--json"]);
    let logs: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let holds = &logs.as_array().unwrap()[0]["holds"];
    assert_eq!(holds[0]["lsn"], 42, "{logs}");
    assert_eq!(holds[0]["holder"], holder.as_str(), "{logs}");

    let wrong = stela(&[
        "logs",
        "release-hold",
        "copy",
        "/not/a/follower",
        "--dir",
        &d,
    ]);
    assert_ne!(wrong.status.code(), Some(0), "{}", text(&wrong));
    assert!(
        text(&wrong).contains("no hold of") && text(&wrong).contains(&holder),
        "{}",
        text(&wrong)
    );
    let released = stela(&["logs", "release-hold", "copy", &holder, "--dir", &d]);
    assert_eq!(released.status.code(), Some(0), "{}", text(&released));
    assert!(
        text(&released).contains("kept the copy from LSN 42"),
        "{}",
        text(&released)
    );
    let after = text(&stela(&["logs", "list", "--dir", &d]));
    assert!(!after.contains("held from"), "{after}");
    assert_eq!(stela_wal::holds::lowest(&storage, &log_dir), (None, vec![]));
    daemon.terminate();
}

/// Issue 55: `stela logs tail NAME` prints a log's newest records, and `-f` follows it: records
/// committed at `disk` after it started come out as they are written.
#[test]
fn tail_prints_the_newest_records_and_follows_new_ones() {
    use std::io::BufRead;
    use stela_client::Durability;
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    let options = WalOptions::default().durability(Durability::Disk);
    let wal: Wal<String> = Wal::open(daemon.socket(), "orders", options).unwrap();
    for i in 1..=5 {
        wal.append_durable(&format!("order {i}")).unwrap();
    }
    let lsns = |text: &str| -> Vec<u64> {
        text.lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                assert_eq!(
                    v["record"],
                    format!("order {}", v["lsn"]),
                    "the record beside its LSN"
                );
                v["lsn"].as_u64().unwrap()
            })
            .collect()
    };
    let d = daemon.dir_arg();
    let last3 = stela(&["logs", "tail", "orders", "--dir", d, "-n", "3"]);
    assert_eq!(last3.status.code(), Some(0), "{}", text(&last3));
    assert_eq!(lsns(&String::from_utf8_lossy(&last3.stdout)), vec![3, 4, 5]);
    let all = stela(&["logs", "tail", "orders", "--dir", d, "-n", "50"]);
    assert_eq!(
        lsns(&String::from_utf8_lossy(&all.stdout)),
        vec![1, 2, 3, 4, 5]
    );
    let missing = stela(&["logs", "tail", "nosuch", "--dir", d]);
    assert_ne!(missing.status.code(), Some(0), "{}", text(&missing));

    let mut follow = std::process::Command::new(env!("CARGO_BIN_EXE_stela"))
        .args(["logs", "tail", "-f", "orders", "--dir", d, "-n", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(follow.stdout.take().unwrap()).lines();
    let mut next = || lines.next().expect("tail -f ended").unwrap();
    assert_eq!(lsns(&next()), vec![5]);
    for i in 6..=7 {
        wal.append_durable(&format!("order {i}")).unwrap();
    }
    // Each line is read as it comes; a tail that stopped would end the stream instead.
    assert_eq!(lsns(&next()), vec![6]);
    assert_eq!(lsns(&next()), vec![7]);
    follow.kill().unwrap();
    follow.wait().unwrap();
    wal.close().unwrap();
    daemon.terminate();
}
