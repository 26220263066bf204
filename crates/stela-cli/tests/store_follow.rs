//! `stela store-follow`: the warm standby store's follower as a command, against a standby
//! daemon (a primary and its standby in this process). It keeps the directory current while
//! the primary's store commits, stops on SIGTERM with its progress written, and a store opened
//! on the directory starts from that progress with every commit there.

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use stela_client::{Address, Connection, Durability, WalOptions};
use stela_proto::{RequestBody, ResponseBody};
use stela_server::{DaemonConfig, Server};
use stela_store::{Store, StoreOptions};

const LOG: &str = "bank";

fn config(dir: &Path) -> DaemonConfig {
    let mut config = DaemonConfig::new(dir);
    config.assume_write_rate = Some(100 << 20);
    config.spin = Duration::ZERO;
    config
}

/// The standby's durable LSN for the log once it has synced everything it received (its writer
/// syncs a quiet stream within about a millisecond).
fn standby_durable(socket: &Path) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut connection = Connection::connect_admin(&Address::from(socket)).unwrap();
        let (received, durable) = match connection.request(RequestBody::Status) {
            Ok(ResponseBody::Status(report)) => report
                .replication
                .and_then(|r| r.logs.into_iter().find(|l| l.log == LOG))
                .map_or((0, 0), |l| (l.received_lsn, l.durable_lsn)),
            other => panic!("status: {other:?}"),
        };
        if durable > 0 && durable == received {
            return durable;
        }
        assert!(
            Instant::now() < deadline,
            "the standby never synced what it received ({durable} of {received})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn progress(dir: &Path) -> u64 {
    std::fs::read(dir.join("follower"))
        .ok()
        .filter(|bytes| bytes.len() >= 8)
        .map_or(0, |bytes| {
            u64::from_le_bytes(bytes[..8].try_into().unwrap())
        })
}

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:05}").into_bytes()
}

#[test]
fn store_follow_keeps_a_directory_current_and_stops_on_sigterm() {
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir, warm) = (
        root.path().join("p"),
        root.path().join("s"),
        root.path().join("warm"),
    );
    let mut standby_config = config(&s_dir);
    standby_config.repl_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    let standby = Server::start(standby_config).unwrap();
    let mut primary_config = config(&p_dir);
    primary_config.standby = standby.repl_addr();
    let primary = Server::start(primary_config).unwrap();
    let wal = || WalOptions::default().durability(Durability::Replicated);
    let store = Store::open_on_daemon(
        root.path().join("store"),
        primary.socket_path(),
        LOG,
        wal(),
        StoreOptions::on_request()
            .archive(false)
            .lock_timeout(None)
            .pool_pages(16),
    )
    .unwrap();
    for round in 0..20u32 {
        let mut txn = store.begin();
        for i in 0..50 {
            txn.put(&key(round * 50 + i), format!("{round}").as_bytes())
                .unwrap();
        }
        txn.commit().unwrap();
    }

    let mut follower = Command::new(env!("CARGO_BIN_EXE_stela"))
        .arg("store-follow")
        .arg("--log-dir")
        .arg(s_dir.join("logs").join(LOG))
        .arg("--socket")
        .arg(standby.socket_path())
        .arg(&warm)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let durable = standby_durable(standby.socket_path());
    assert!(durable > 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while progress(&warm) < durable {
        if Instant::now() > deadline || follower.try_wait().unwrap().is_some() {
            let _ = follower.kill();
            let output = follower.wait_with_output().unwrap();
            panic!(
                "the follower never caught up to {durable} (at {}): {}{}",
                progress(&warm),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let terminated = Command::new("kill")
        .args(["-TERM", &follower.id().to_string()])
        .status()
        .unwrap();
    assert!(terminated.success());
    let status = follower.wait().unwrap();
    let mut out = String::new();
    follower
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "{status:?}: {out}");
    assert!(out.contains("stopped; every change up to"), "{out}");
    let applied = progress(&warm);

    // The primary's store dies; a store on the follower's directory (on the same log) starts
    // from the follower's progress.
    drop(store);
    let store = Store::open_on_daemon(
        &warm,
        primary.socket_path(),
        LOG,
        wal(),
        StoreOptions::on_request().archive(false).lock_timeout(None),
    )
    .unwrap();
    assert_eq!(
        store.restart_report().followed_to.map(|l| l.get()),
        Some(applied)
    );
    let mut txn = store.begin();
    for round in 0..20u32 {
        for i in 0..50 {
            let value = txn.get(&key(round * 50 + i)).unwrap();
            assert_eq!(value, Some(format!("{round}").into_bytes()));
        }
    }
    txn.commit().unwrap();
    store.close().unwrap();
    primary.shutdown().unwrap();
    standby.shutdown().unwrap();
}
