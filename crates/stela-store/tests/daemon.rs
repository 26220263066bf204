//! The store on a log kept by a real stela daemon (in this process, on its own directory):
//! `Store::open_on_daemon` at `disk` and `buffered`.
//!
//! What each test provokes:
//! - the store's process crashing (the `Store` dropped without `close`, its connection gone)
//!   while the daemon lives on: every commit that returned is there after reopening, nothing
//!   uncommitted is, a transaction left running is rolled back;
//! - the daemon restarting under a `disk` store: the commits are in its files;
//! - many small pages evicted under a small pool, so the write-ahead rule (flush before a page
//!   write) runs through the daemon;
//! - `unsafe` refused with a clear error (its appends return no LSN).

use std::ops::Bound;
use std::time::Duration;
use stela_client::{Durability, WalOptions};
use stela_server::{DaemonConfig, Server};
use stela_store::{CheckpointKind, CleanerKind, Error, Store, StoreOptions};

fn server(dir: &std::path::Path) -> Server {
    let mut config = DaemonConfig::new(dir);
    config.assume_write_rate = Some(500 << 20);
    config.flush_interval = Duration::from_millis(20);
    Server::start(config).expect("daemon starts")
}

fn wal(durability: Durability) -> WalOptions {
    WalOptions::default().durability(durability)
}

fn options() -> StoreOptions {
    // A small pool: pages are evicted (stolen) while transactions run.
    StoreOptions::on_request()
        .archive(false)
        .lock_timeout(None)
        .pool_pages(16)
        .checkpoints(CheckpointKind::Decoupled)
        .cleaner(CleanerKind::Decoupled)
}

fn key(i: u32) -> Vec<u8> {
    format!("account-{i:06}").into_bytes()
}

fn value(i: u32, round: u32) -> Vec<u8> {
    let mut v = format!("{round}:{i}").into_bytes();
    v.resize(300, b'.');
    v
}

/// Commits `rounds` transactions of 50 puts each, then leaves one transaction running with
/// writes of its own (a loser), and crashes the store (drop without close).
fn load_then_crash(store: Store, rounds: u32) {
    for round in 0..rounds {
        let mut txn = store.begin();
        for i in 0..50 {
            txn.put(&key(round * 50 + i), &value(round * 50 + i, round))
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let mut loser = store.begin();
    for i in 0..40 {
        loser.put(&key(i), b"never committed").unwrap();
    }
    loser.put(b"loser-only", b"x").unwrap();
    std::mem::forget(loser); // still running when the process dies
    drop(store);
}

fn check(store: &Store, rounds: u32) {
    let mut txn = store.begin();
    let all: Vec<_> = txn
        .scan(Bound::Unbounded, Bound::Unbounded)
        .collect::<Result<_, _>>()
        .unwrap();
    txn.commit().unwrap();
    assert_eq!(
        all.len() as u32,
        rounds * 50,
        "committed rows, and only those"
    );
    for (n, (k, v)) in all.iter().enumerate() {
        let i = n as u32;
        assert_eq!(k, &key(i));
        assert_eq!(v, &value(i, i / 50), "row {i}");
    }
}

#[test]
fn a_crashed_store_on_a_disk_log_loses_no_commit() {
    let daemon_dir = tempfile::tempdir().unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let daemon = server(daemon_dir.path());
    let open = || {
        Store::open_on_daemon(
            store_dir.path(),
            daemon.socket_path(),
            "store",
            wal(Durability::Disk),
            options(),
        )
        .unwrap()
    };
    load_then_crash(open(), 20);
    let store = open();
    assert_eq!(
        store.restart_report().losers.len(),
        1,
        "the running transaction"
    );
    check(&store, 20);
    // The reopened store goes on working, and survives a clean close and a daemon restart.
    let mut txn = store.begin();
    txn.put(&key(20 * 50), &value(20 * 50, 20)).unwrap();
    txn.commit().unwrap();
    drop(store);
    daemon.shutdown().unwrap();
    let daemon = server(daemon_dir.path());
    let store = Store::open_on_daemon(
        store_dir.path(),
        daemon.socket_path(),
        "store",
        wal(Durability::Disk),
        options(),
    )
    .unwrap();
    let mut txn = store.begin();
    assert_eq!(
        txn.get(&key(20 * 50)).unwrap(),
        Some(value(20 * 50, 20)),
        "a disk commit survives the daemon's restart"
    );
    assert_eq!(txn.get(b"loser-only").unwrap(), None);
    txn.commit().unwrap();
    store.close().unwrap();
    daemon.shutdown().unwrap();
}

#[test]
fn a_crashed_store_on_a_buffered_log_loses_no_commit() {
    let daemon_dir = tempfile::tempdir().unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let daemon = server(daemon_dir.path());
    let open = || {
        Store::open_on_daemon(
            store_dir.path(),
            daemon.socket_path(),
            "store",
            wal(Durability::Buffered),
            options(),
        )
        .unwrap()
    };
    load_then_crash(open(), 12);
    let store = open();
    check(&store, 12);
    store.close().unwrap();
    daemon.shutdown().unwrap();
}

#[test]
fn unsafe_is_refused_with_a_reason() {
    let daemon_dir = tempfile::tempdir().unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let daemon = server(daemon_dir.path());
    let opened = Store::open_on_daemon(
        store_dir.path(),
        daemon.socket_path(),
        "store",
        wal(Durability::Unsafe),
        options(),
    );
    match opened {
        Err(Error::Unsupported(why)) => assert!(why.contains("unsafe"), "{why}"),
        Err(other) => panic!("expected Unsupported, got {other}"),
        Ok(_) => panic!("a store opened at unsafe"),
    }
    daemon.shutdown().unwrap();
}
