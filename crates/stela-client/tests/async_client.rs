//! The async client: many calls in flight on one connection, each answered to its own caller;
//! a daemon that goes away fails every waiting call instead of leaving it hanging.

use std::time::Duration;
use stela_client::{AsyncWal, Durability, Lsn, WalOptions};
use stela_server::{DaemonConfig, Server};

fn server(dir: &std::path::Path) -> Server {
    let mut config = DaemonConfig::new(dir);
    config.assume_write_rate = Some(500 << 20);
    config.flush_interval = Duration::from_millis(20);
    Server::start(config).expect("daemon starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_one_connection_and_each_gets_its_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let wal: AsyncWal<(u32, String)> =
        AsyncWal::open(server.socket_path(), "a", WalOptions::default())
            .await
            .unwrap();
    let mut tasks = Vec::new();
    for task in 0..8u32 {
        let wal = wal.clone();
        tasks.push(tokio::spawn(async move {
            let mut lsns = Vec::new();
            for i in 0..50u32 {
                lsns.push((
                    wal.append(&(task, format!("t{task} r{i}"))).await.unwrap(),
                    i,
                ));
            }
            (task, lsns)
        }));
    }
    let mut acknowledged = Vec::new();
    for task in tasks {
        let (task, lsns) = task.await.unwrap();
        for (lsn, i) in lsns {
            acknowledged.push((lsn, (task, format!("t{task} r{i}"))));
        }
    }
    acknowledged.sort();
    let lsns: Vec<u64> = acknowledged.iter().map(|(l, _)| l.get()).collect();
    assert_eq!(
        lsns,
        (1..=400).collect::<Vec<_>>(),
        "every append got its own LSN"
    );
    let (read, next) = wal.read_from(Lsn::FIRST, 1000).await.unwrap();
    assert_eq!(next, Lsn::new(401));
    assert_eq!(
        read, acknowledged,
        "each LSN holds the record its caller sent"
    );
    wal.commit(Lsn::new(400)).await.unwrap();

    let disk: AsyncWal<(u32, String)> = AsyncWal::open(
        server.socket_path(),
        "a",
        WalOptions::default().durability(Durability::Disk),
    )
    .await
    .unwrap();
    let lsn = disk.append_durable(&(99, "durable".into())).await.unwrap();
    assert!(disk.durable_lsn().await.unwrap() >= lsn);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_goes_away_fails_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let wal: AsyncWal<u64> = AsyncWal::open(
        server.socket_path(),
        "gone",
        WalOptions::default().reconnect_within(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    wal.append(&1).await.unwrap();
    tokio::task::spawn_blocking(move || server.shutdown().unwrap())
        .await
        .unwrap();
    let error = tokio::time::timeout(Duration::from_secs(10), wal.append(&2))
        .await
        .expect("no hang")
        .unwrap_err();
    // Either the call found the connection gone (Disconnected), or the background reader had
    // already seen it close and the call tried to reconnect first (Reconnect): never a hang,
    // never a silent success.
    assert!(
        matches!(
            error,
            stela_client::Error::Disconnected { .. } | stela_client::Error::Reconnect { .. }
        ),
        "{error}"
    );
    // No daemon comes back: the next call tries to reconnect, then names the address.
    let again = wal.append(&3).await.unwrap_err();
    assert!(
        matches!(again, stela_client::Error::Reconnect { .. }),
        "{again}"
    );
}

/// `AsyncWal` has the blocking API's calls, with the same results on the same log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_api_matches_the_blocking_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let socket = server.socket_path().to_str().unwrap().to_owned();
    let wal: AsyncWal<String> = AsyncWal::open(socket.as_str(), "parity", WalOptions::default())
        .await
        .unwrap();
    let first = wal.append(&"one".to_owned()).await.unwrap();
    let batch = wal
        .append_batch_durable(&["two".to_owned(), "three".to_owned()])
        .await
        .unwrap();
    assert_eq!((first.get(), batch.get()), (1, 3));
    wal.commit_at(Lsn::new(3), Durability::Disk).await.unwrap();
    assert_eq!(wal.durable_lsn().await.unwrap(), Lsn::new(3));
    assert_eq!(wal.last_lsn().await.unwrap(), Lsn::new(3));
    let refused = wal.commit_at(Lsn::new(3), Durability::Replicated).await;
    assert!(refused.is_err());

    let mut iter = wal.iter();
    let mut read = Vec::new();
    while let Some(item) = iter.next().await {
        read.push(item.unwrap());
    }
    let mut from_two = Vec::new();
    let mut iter = wal.iter_from(Lsn::new(2));
    while let Some(item) = iter.next().await {
        from_two.push(item.unwrap().1);
    }
    wal.close().await.unwrap();

    // The blocking client sees the same log.
    let blocking: stela_client::Wal<String> =
        stela_client::Wal::open(socket.as_str(), "parity", WalOptions::default()).unwrap();
    let seen: Vec<(Lsn, String)> = blocking.iter().unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(read, seen);
    assert_eq!(from_two, vec!["two".to_owned(), "three".to_owned()]);
    assert_eq!(blocking.last_lsn().unwrap(), Lsn::new(3));
    blocking.close().unwrap();
}
