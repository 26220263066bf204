//! A client survives a restart of the daemon: the call that finds the connection gone fails
//! with `Disconnected` (its outcome unknown, never sent twice), the next call reconnects and
//! reopens the log, and every `disk`-acknowledged record is there, over the shared-memory ring
//! and over the socket, after a SIGTERM and after a SIGKILL of the daemon. With no daemon to
//! come back, the call fails after the reconnect deadline naming the address.

mod common;

use common::Daemon;
use std::time::Duration;
use stela_client::{Durability, Error, Transport, Wal, WalOptions};

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("stela-reconnect")
        .tempdir()
        .unwrap()
}

fn survives_restarts(transport: Transport) {
    let base = tempdir();
    let dir = base.path().join("d");
    let mut daemon = Daemon::start(&dir, &[]);
    let options = WalOptions::default()
        .durability(Durability::Disk)
        .transport(transport)
        .reconnect_within(Duration::from_secs(10));
    let wal: Wal<String> = Wal::open(daemon.socket(), "r", options).unwrap();
    let expected_transport = match transport {
        Transport::Socket => "socket",
        _ => "shm",
    };
    assert_eq!(wal.transport(), expected_transport);
    let mut acked = Vec::new();
    for round in 0..2 {
        for i in 0..20 {
            let record = format!("round {round} record {i}");
            wal.append_durable(&record).unwrap();
            acked.push(record);
        }
        if round == 0 {
            daemon.terminate();
        } else {
            daemon.kill();
        }
        // The first call finds the connection gone: an error, not a hang, not a retry.
        let lost = wal.append_durable(&"lost?".to_owned()).unwrap_err();
        assert!(
            matches!(lost, Error::Disconnected { .. }),
            "round {round}: {lost}"
        );
        assert!(lost.to_string().contains("not retried"), "{lost}");
        daemon = Daemon::start(&dir, &[]);
        // The next call reconnects, reopens the log and maps the ring again.
        let lsn = wal
            .append_durable(&format!("after restart {round}"))
            .unwrap_or_else(|e| panic!("round {round}: no reconnect: {e}"));
        acked.push(format!("after restart {round}"));
        assert_eq!(wal.transport(), expected_transport);
        assert_eq!(wal.last_lsn().unwrap(), lsn);
    }
    let read: Vec<String> = wal.iter().unwrap().map(|r| r.unwrap().1).collect();
    // "lost?" was never sent (the connection was already gone), so the log holds exactly the
    // acknowledged records.
    assert_eq!(read, acked);
    wal.close().unwrap();
    daemon.terminate();
}

#[test]
fn a_ring_client_survives_daemon_restarts() {
    survives_restarts(Transport::SharedMemory);
}

#[test]
fn a_socket_client_survives_daemon_restarts() {
    survives_restarts(Transport::Socket);
}

#[test]
fn without_a_daemon_the_client_gives_up_naming_the_address() {
    let base = tempdir();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    let socket = daemon.socket();
    let wal: Wal<String> = Wal::open(
        socket.as_path(),
        "r",
        WalOptions::default().reconnect_within(Duration::from_millis(300)),
    )
    .unwrap();
    wal.append_durable(&"x".to_owned()).unwrap();
    daemon.kill();
    let first = wal.append_durable(&"y".to_owned()).unwrap_err();
    assert!(matches!(first, Error::Disconnected { .. }), "{first}");
    let second = wal.append_durable(&"z".to_owned()).unwrap_err();
    assert!(matches!(second, Error::Reconnect { .. }), "{second}");
    assert!(
        second.to_string().contains(&socket.display().to_string()),
        "{second}"
    );
}

#[test]
fn an_async_client_survives_a_daemon_restart() {
    let base = tempdir();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    let socket = daemon.socket();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let restarted = runtime.block_on(async {
        let wal: stela_client::AsyncWal<String> = stela_client::AsyncWal::open(
            socket.as_path(),
            "r",
            WalOptions::default()
                .durability(Durability::Disk)
                .reconnect_within(Duration::from_secs(10)),
        )
        .await
        .unwrap();
        wal.append_durable(&"before".to_owned()).await.unwrap();
        daemon.kill();
        // Restart the daemon while the next call may already be reconnecting: it either
        // finds the connection gone (Disconnected, not retried) or reconnects and succeeds.
        let restarted = Daemon::start(&dir, &[]);
        let mut expected = vec!["before".to_owned()];
        match wal.append_durable(&"maybe".to_owned()).await {
            Ok(_) => expected.push("maybe".to_owned()),
            Err(lost) => assert!(matches!(lost, Error::Disconnected { .. }), "{lost}"),
        }
        wal.append_durable(&"after".to_owned()).await.unwrap();
        let mut read = Vec::new();
        let mut records = wal.iter();
        while let Some(item) = records.next().await {
            read.push(item.unwrap().1);
        }
        expected.push("after".to_owned());
        assert_eq!(read, expected);
        wal.close().await.unwrap();
        restarted
    });
    restarted.terminate();
}
