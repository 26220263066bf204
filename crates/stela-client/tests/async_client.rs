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

/// The records come as a `futures::Stream` (combinators work on them) and through `next()`
/// alike, across batch boundaries (the iterator reads 1024 at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_iterator_is_a_stream() {
    use futures_util::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let wal: AsyncWal<u64> = AsyncWal::open(server.socket_path(), "stream", WalOptions::default())
        .await
        .unwrap();
    let records: Vec<u64> = (1..=2500).collect();
    wal.append_batch(&records).await.unwrap();
    let streamed: Vec<(Lsn, u64)> = wal
        .iter()
        .map(|item| item.unwrap())
        .collect::<Vec<_>>()
        .await;
    assert_eq!(streamed.len(), 2500);
    assert!(streamed.iter().all(|(lsn, record)| lsn.get() == *record));
    let from: Vec<u64> = wal
        .iter_from(Lsn::new(2400))
        .filter_map(|item| async move { item.ok().map(|(_, r)| r) })
        .collect()
        .await;
    assert_eq!(from, (2400..=2500).collect::<Vec<_>>());
    let mut by_next = wal.iter_from(Lsn::new(1020));
    let mut seen = Vec::new();
    while let Some(item) = by_next.next().await {
        seen.push(item.unwrap().1);
    }
    assert_eq!(seen, (1020..=2500).collect::<Vec<_>>());
    // A stream can be sent to another task.
    let wal = std::sync::Arc::new(wal);
    let counted = tokio::spawn({
        let wal = std::sync::Arc::clone(&wal);
        async move { wal.iter().count().await }
    });
    assert_eq!(counted.await.unwrap(), 2500);
}

/// An endpoint list whose first node is hung (it accepts connections and never answers) opens
/// on the live node, the hung one asked too, as the blocking client does; the handle
/// prints where it is; without replication its term is 0. With no node answering, the error
/// names each endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_list_opens_on_the_live_node_without_waiting_for_a_hung_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = stela_server::DaemonConfig::new(dir.path());
    config.assume_write_rate = Some(500 << 20);
    config.flush_interval = Duration::from_millis(20);
    config.tcp = Some("127.0.0.1:0".parse().unwrap());
    config.tcp_insecure = true;
    let server = Server::start(config).expect("daemon starts");
    let live = server.tcp_addr().expect("listens on TCP");
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoints = format!("tcp://{},tcp://{live}", hung.local_addr().unwrap());

    let wal: AsyncWal<u32> = AsyncWal::open(endpoints.as_str(), "listed", WalOptions::default())
        .await
        .unwrap();
    // The hung node was asked too (its connection carries the hello). Unlike the blocking
    // client's threads, the open drops the attempts that lost as it returns, so whether that
    // connection is still open says nothing about waiting; the open returning at all while
    // the hung node never answers shows it did not wait for it alone.
    let (mut to_hung, _) = hung.accept().unwrap();
    let mut hello = [0u8; 8];
    std::io::Read::read_exact(&mut to_hung, &mut hello).expect("the hung node got a hello");
    assert_eq!(wal.term(), 0, "a daemon without replication has no term");
    let shown = format!("{wal:?}");
    assert!(
        shown.contains("AsyncWal") && shown.contains("listed") && shown.contains(&live.to_string()),
        "{shown}"
    );
    let lsn = wal.append(&7).await.unwrap();
    wal.commit_at(lsn, Durability::Disk).await.unwrap();

    drop(wal);
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
    let error = AsyncWal::<u32>::open(endpoints.as_str(), "listed", WalOptions::default())
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.starts_with("no endpoint is the primary"), "{text}");
    assert!(
        text.contains(&hung.local_addr().unwrap().to_string()),
        "{text}"
    );
    assert!(text.contains(&live.to_string()), "{text}");
}

/// A daemon restarted on the same socket: the call that finds the connection gone fails (its
/// outcome unknown, never resent), the next one reconnects and reopens the log, and the
/// records written before the restart are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_call_after_a_restart_reconnects() {
    let dir = tempfile::tempdir().unwrap();
    let first = server(dir.path());
    let socket = first.socket_path().to_owned();
    let wal: AsyncWal<u64> = AsyncWal::open(socket.as_path(), "again", WalOptions::default())
        .await
        .unwrap();
    let lsn = wal.append(&1).await.unwrap();
    wal.commit_at(lsn, Durability::Disk).await.unwrap();
    tokio::task::spawn_blocking(move || first.shutdown().unwrap())
        .await
        .unwrap();
    let second = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || server(&dir)
    })
    .await
    .unwrap();
    // The first call may find the old connection gone (reported, not retried) or reconnect.
    let after = match wal.append(&2).await {
        Ok(lsn) => lsn,
        Err(stela_client::Error::Disconnected { .. }) => wal.append(&2).await.unwrap(),
        Err(other) => panic!("{other}"),
    };
    assert_eq!(
        after,
        Lsn::new(2),
        "appended after the record of before the restart"
    );
    let (read, _) = wal.read_from(Lsn::FIRST, 10).await.unwrap();
    assert_eq!(read, vec![(Lsn::new(1), 1), (Lsn::new(2), 2)]);
    tokio::task::spawn_blocking(move || drop(second))
        .await
        .unwrap();
}
