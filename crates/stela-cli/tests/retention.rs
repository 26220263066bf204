//! `stela serve --retain-bytes`: a log written well past the retention keeps about that many
//! bytes of its newest segments; the oldest whole segments go, the log still reads from its new
//! first LSN to its last, and nothing acknowledged after that point is lost.

mod common;

use common::{stela, Daemon};
use std::time::{Duration, Instant};
use stela_client::{Durability, Lsn, Wal, WalOptions};

#[test]
fn old_segments_beyond_the_retention_are_removed() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(
        &dir,
        &["--segment-size", "64KiB", "--retain-bytes", "256KiB"],
    );
    let wal: Wal<String> = Wal::open(
        daemon.socket(),
        "kept",
        WalOptions::default().durability(Durability::Disk),
    )
    .unwrap();
    let record = |i: u32| format!("{i:06} {}", "r".repeat(1000));
    for i in 0..1500 {
        wal.append(&record(i)).unwrap();
    }
    let last = wal.last_lsn().unwrap();
    wal.commit(last).unwrap();

    let d = daemon.dir_arg().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    let listing = loop {
        let out = stela(&["logs", "list", "--dir", &d, "--json"]);
        let logs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let kept = logs[0].clone();
        // Retention runs every second; the writes above outran some passes.
        if kept["bytes_on_disk"].as_u64().unwrap() <= (256 << 10) + 2 * (64 << 10) {
            break kept;
        }
        assert!(
            Instant::now() < deadline,
            "not cut to the retention: {kept}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let bytes = listing["bytes_on_disk"].as_u64().unwrap();
    // At least the retention is kept, and at most it plus one segment (the one that crosses it)
    // plus the newest being filled.
    assert!(
        (256 << 10..=(256 << 10) + 2 * (64 << 10)).contains(&bytes),
        "{listing}"
    );
    let first = listing["first_lsn"].as_u64().unwrap();
    let read: Vec<(Lsn, String)> = wal
        .iter_from(Lsn::new(first))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(read.first().unwrap().0, Lsn::new(first));
    assert_eq!(read.last().unwrap().0, last);
    for (lsn, text) in &read {
        assert_eq!(*text, record(lsn.get() as u32 - 1));
    }
    wal.close().unwrap();
    daemon.terminate();
}
