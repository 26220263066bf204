//! The daemon on a disk that loses power without notice (the power-cut layer of
//! stela-testkit: only what was fsynced survives, names only by their directory's fsync): a
//! record acknowledged at `disk` is there after the cut and a restart, including in a log the
//! daemon created just before. Needs /dev/fuse and root; fails, saying so, without them.

mod common;

use common::Daemon;
use std::fs;
use stela_client::{Durability, WalOptions};
use stela_testkit::powercut::{Namespace, PowerCutLayer};

fn open(daemon: &Daemon, log: &str) -> stela_client::Wal<String> {
    let options = WalOptions::default().durability(Durability::Disk);
    stela_client::Wal::open(daemon.socket(), log, options)
        .unwrap_or_else(|e| panic!("open {log}: {e}"))
}

/// Every name the daemon makes (its `logs` directory, a new log's directory, its segments) is
/// made durable before a `disk` acknowledgement depends on it. Before 2026-12-07 a new log's
/// directory was created without an fsync of `logs/`: on this disk the whole log, with every
/// record acknowledged at `disk`, was gone after the cut.
#[test]
fn records_acknowledged_at_disk_in_new_logs_survive_a_power_cut_without_notice() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = tmp.path().join("disk");
    fs::create_dir(&disk).unwrap();
    let mut layer = PowerCutLayer::mount(&disk, Namespace::Strict);
    let dir = layer.path().join("stela");
    let daemon = Daemon::start(&dir, &[]);
    let mut acknowledged = Vec::new();
    for log in ["first", "second"] {
        let wal = open(&daemon, log);
        for i in 0..20 {
            let record = format!("{log} {i}");
            let lsn = wal.append_durable(&record).unwrap();
            acknowledged.push((log, lsn, record));
        }
    }
    let mut daemon = daemon;
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
    drop(daemon);
    let report = layer.cut();
    eprintln!("cut: {report:?}");
    let daemon = Daemon::start(&dir, &[]);
    let wals = [
        ("first", open(&daemon, "first")),
        ("second", open(&daemon, "second")),
    ];
    for (log, lsn, record) in &acknowledged {
        let wal = &wals.iter().find(|(name, _)| name == log).expect("opened").1;
        let found = wal
            .iter_from(*lsn)
            .unwrap()
            .next()
            .map(|item| item.unwrap());
        assert_eq!(
            found.as_ref().map(|(at, r)| (*at, r.as_str())),
            Some((*lsn, record.as_str())),
            "{log}: the record acknowledged at disk at {lsn:?} after the cut"
        );
    }
    drop(wals);
    daemon.terminate();
}
