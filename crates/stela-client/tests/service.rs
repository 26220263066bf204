//! The client against a real daemon in this process: the typed API end to end.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use stela_client::{Codec, Durability, ErrorCode, Lsn, Wal, WalOptions};
use stela_server::{DaemonConfig, Server};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Entry {
    account: u32,
    delta: i64,
    note: String,
}

fn entry(i: u32) -> Entry {
    Entry {
        account: i % 97,
        delta: i as i64 * 3 - 50,
        note: format!("entry {i}"),
    }
}

fn config(dir: &std::path::Path) -> DaemonConfig {
    let mut config = DaemonConfig::new(dir);
    config.assume_write_rate = Some(500 << 20);
    config.flush_interval = Duration::from_millis(50);
    config
}

fn server(dir: &std::path::Path) -> Server {
    Server::start(config(dir)).expect("daemon starts")
}

#[test]
fn append_commit_iterate_through_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let wal: Wal<Entry> = Wal::open(server.socket_path(), "ledger", WalOptions::default()).unwrap();
    for i in 0..100 {
        let last = wal.append(&entry(i)).unwrap();
        assert_eq!(last, Lsn::new(u64::from(i) + 1));
    }
    let batch: Vec<Entry> = (100..150).map(entry).collect();
    let last = wal.append_batch(&batch).unwrap();
    assert_eq!(last, Lsn::new(150));
    // Records still in the buffers are read back too.
    let read: Vec<(Lsn, Entry)> = wal.iter().unwrap().map(Result::unwrap).collect();
    assert_eq!(read.len(), 150);
    for (i, (lsn, e)) in read.iter().enumerate() {
        assert_eq!(*lsn, Lsn::new(i as u64 + 1));
        assert_eq!(*e, entry(i as u32));
    }
    wal.commit_at(last, Durability::Disk).unwrap();
    assert!(wal.durable_lsn().unwrap() >= last);
    let from_120: Vec<u64> = wal
        .iter_from(Lsn::new(120))
        .unwrap()
        .map(|r| r.unwrap().0.get())
        .collect();
    assert_eq!(from_120, (120..=150).collect::<Vec<_>>());
    drop(wal);
    server.shutdown().unwrap();

    // The directory is an ordinary stela-wal log.
    let embedded: stela_wal::Wal<Entry> = stela_wal::Wal::open(
        dir.path().join("logs/ledger"),
        stela_wal::WalOptions::default().type_tag(std::any::type_name::<Entry>()),
    )
    .unwrap();
    let all: Vec<Entry> = embedded.iter().unwrap().map(|r| r.unwrap().1).collect();
    assert_eq!(all, (0..150).map(entry).collect::<Vec<_>>());
}

#[test]
fn disk_durability_waits_for_the_sync() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let wal: Wal<Entry> = Wal::open(
        server.socket_path(),
        "d",
        WalOptions::default().durability(Durability::Disk),
    )
    .unwrap();
    for i in 0..20 {
        let lsn = wal.append_durable(&entry(i)).unwrap();
        assert!(wal.durable_lsn().unwrap() >= lsn);
    }
}

#[test]
fn a_second_client_with_another_codec_or_type_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let _first: Wal<Entry> = Wal::open(server.socket_path(), "l", WalOptions::default()).unwrap();
    let codec = Wal::<Entry>::open(
        server.socket_path(),
        "l",
        WalOptions::default().codec(Codec::Json),
    )
    .unwrap_err();
    assert_eq!(codec.code(), Some(ErrorCode::OpenFailed), "{codec}");
    assert!(codec.to_string().contains("codec"), "{codec}");
    let wrong_type =
        Wal::<u64>::open(server.socket_path(), "l", WalOptions::default()).unwrap_err();
    assert!(
        wrong_type.to_string().contains("record type"),
        "{wrong_type}"
    );
    let bad_name =
        Wal::<u64>::open(server.socket_path(), "../etc", WalOptions::default()).unwrap_err();
    assert_eq!(bad_name.code(), Some(ErrorCode::BadLogName), "{bad_name}");
}

#[test]
fn replicated_is_refused_at_open_until_a_standby_exists() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    for level in [Durability::Replicated, Durability::All] {
        let error = Wal::<u32>::open(
            server.socket_path(),
            "r",
            WalOptions::default().durability(level),
        )
        .unwrap_err();
        assert_eq!(error.code(), Some(ErrorCode::Unsupported), "{error}");
        assert!(error.to_string().contains("standby"), "{error}");
    }
    // Opened at a level it serves, a commit asking for more is still refused, at the commit.
    let wal: Wal<u32> = Wal::open(server.socket_path(), "r", WalOptions::default()).unwrap();
    let lsn = wal.append(&7).unwrap();
    let error = wal.commit_at(lsn, Durability::Replicated).unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::Unsupported), "{error}");
    // And a string is an address.
    let by_text: Wal<u32> = Wal::open(
        server.socket_path().to_str().unwrap(),
        "r2",
        WalOptions::default(),
    )
    .unwrap();
    by_text.append_durable(&1).unwrap();
}

/// An endpoint list whose first node is hung (it accepts connections and never answers, as a
/// stopped or cut-off daemon does) opens on the second without waiting out the first: the
/// endpoints are asked at once. Asked one after another, the open would return only after
/// giving up on the hung node, which closes its connection first; here that connection is
/// still open when the open returns.
#[test]
fn an_endpoint_list_opens_on_the_live_node_without_waiting_for_a_hung_one() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.tcp = Some("127.0.0.1:0".parse().unwrap());
    config.tcp_insecure = true;
    let server = Server::start(config).expect("daemon starts");
    let live = server.tcp_addr().expect("listens on TCP");
    // Never accepted while the open runs: the kernel completes the connection and queues the
    // client's hello, and nothing ever answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoints = format!("tcp://{},tcp://{live}", hung.local_addr().unwrap());

    let wal: Wal<u32> = Wal::open(endpoints.as_str(), "listed", WalOptions::default()).unwrap();
    let (mut to_hung, _) = hung.accept().unwrap();
    to_hung.set_nonblocking(true).unwrap();
    let mut hello = [0u8; 4096];
    let closed = loop {
        match to_hung.read(&mut hello) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(e) => panic!("reading the hung node's connection: {e}"),
        }
    };
    assert!(
        !closed,
        "the open gave up on the hung node before it opened the log on the live one"
    );
    let lsn = wal.append(&7).unwrap();
    wal.commit_at(lsn, Durability::Disk).unwrap();

    // With no node answering at all, the error names each endpoint with its reason.
    drop(server);
    let error = Wal::<u32>::open(endpoints.as_str(), "listed", WalOptions::default()).unwrap_err();
    let text = error.to_string();
    assert!(text.starts_with("no endpoint is the primary"), "{text}");
    assert!(
        text.contains(&hung.local_addr().unwrap().to_string()),
        "{text}"
    );
    assert!(text.contains(&live.to_string()), "{text}");
}

#[test]
fn records_survive_a_restart_of_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    {
        let server = server(dir.path());
        let wal: Wal<Entry> = Wal::open(server.socket_path(), "r", WalOptions::default()).unwrap();
        for i in 0..500 {
            wal.append(&entry(i)).unwrap();
        }
        drop(wal);
        server.shutdown().unwrap(); // SIGTERM path: flushes everything buffered
    }
    let server = server(dir.path());
    let wal: Wal<Entry> = Wal::open(server.socket_path(), "r", WalOptions::default()).unwrap();
    assert_eq!(wal.last_lsn().unwrap(), Lsn::new(500));
    assert_eq!(wal.append(&entry(500)).unwrap(), Lsn::new(501));
    let all: Vec<Entry> = wal.iter().unwrap().map(|r| r.unwrap().1).collect();
    assert_eq!(all, (0..=500).map(entry).collect::<Vec<_>>());
}

/// Does `work` until `shown` of the daemon's status is `wanted`; fails saying `what` after 20 s.
fn until_status(
    server: &Server,
    shown: impl Fn(&stela_proto::StatusReport) -> bool,
    wanted: bool,
    what: &str,
    work: &dyn Fn(),
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while shown(&server.status()) != wanted {
        assert!(std::time::Instant::now() < deadline, "{what}");
        work();
    }
}

/// Runs `commit` back to back on each of `wals`, each on its own thread, while `check` runs;
/// the committers stop however `check` ends (it may panic).
fn while_committing(wals: &[Wal<Entry>], commit: fn(&Wal<Entry>, u32), check: impl FnOnce()) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        let _stop = Stop(&stop);
        for wal in wals {
            let stop = &stop;
            scope.spawn(move || {
                for i in 0.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    commit(wal, i);
                }
            });
        }
        check();
    });
}

/// The event loop runs realtime while commits wait for it alone and gives the CPU back to the
/// committers while several of them wait for the disk (`stela_server::sched`, docs/DAEMON.md):
/// `stela status` follows it both ways. Needs realtime scheduling to be permitted (root or
/// CAP_SYS_NICE), as in CI; elsewhere it fails saying so.
#[test]
fn the_event_loop_gives_up_realtime_while_commits_wait_for_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let realtime = |status: &stela_proto::StatusReport| status.realtime_loop;
    until_status(
        &server,
        realtime,
        true,
        "at start: realtime scheduling is not permitted here (run as root or with CAP_SYS_NICE)",
        &|| std::thread::sleep(Duration::from_millis(10)),
    );

    let disk: Vec<Wal<Entry>> = (0..4)
        .map(|i| {
            let options = WalOptions::default().durability(Durability::Disk);
            Wal::open(server.socket_path(), &format!("disk-{i}"), options).unwrap()
        })
        .collect();
    while_committing(
        &disk,
        |wal, i| {
            wal.append_durable(&entry(i)).unwrap();
        },
        || {
            until_status(
                &server,
                realtime,
                false,
                "the event loop's scheduling did not become normal under disk commits",
                &|| std::thread::sleep(Duration::from_millis(5)),
            )
        },
    );

    let buffered: Wal<Entry> =
        Wal::open(server.socket_path(), "buffered", WalOptions::default()).unwrap();
    assert_eq!(buffered.transport(), "shm");
    let next = std::cell::Cell::new(0);
    until_status(
        &server,
        realtime,
        true,
        "the event loop's scheduling did not become realtime under buffered commits",
        &|| {
            for _ in 0..1000 {
                next.set(next.get() + 1);
                buffered.append(&entry(next.get())).unwrap();
            }
        },
    );
    server.shutdown().unwrap();
}

/// The event loop spins after a turn with work only while that has paid lately (`--spin-us`,
/// `stela_server::net::spin`): `stela status` shows which, and follows it both ways.
#[test]
fn stela_status_shows_whether_the_event_loop_spins_after_work() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let spins = |status: &stela_proto::StatusReport| status.loop_spins;
    let busy: Vec<Wal<Entry>> = (0..4)
        .map(|i| {
            Wal::open(
                server.socket_path(),
                &format!("busy-{i}"),
                WalOptions::default(),
            )
        })
        .collect::<Result<_, _>>()
        .unwrap();
    // Four committers back to back: every gap is short, spinning pays.
    let back_to_back = |what: &str| {
        while_committing(
            &busy,
            |wal, i| {
                wal.append(&entry(i)).unwrap();
            },
            || {
                until_status(&server, spins, true, what, &|| {
                    std::thread::sleep(Duration::from_millis(5))
                })
            },
        )
    };
    back_to_back("back-to-back requests did not make the loop spin");
    // A request every 5 ms: the loop spun up to 50 us after each and caught none.
    let spaced: Wal<Entry> =
        Wal::open(server.socket_path(), "spaced", WalOptions::default()).unwrap();
    let next = std::cell::Cell::new(0);
    until_status(
        &server,
        spins,
        false,
        "requests 5 ms apart never stopped the spin",
        &|| {
            next.set(next.get() + 1);
            spaced.append(&entry(next.get())).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        },
    );
    back_to_back("back-to-back requests never brought the spin back");
    server.shutdown().unwrap();
}

/// A record that does not decode as the reader's type is named by its LSN, by the blocking and
/// the async client alike.
#[test]
fn a_record_that_does_not_decode_is_named_by_its_lsn() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let tag = std::any::type_name::<Entry>();
    let wal: Wal<Entry> = Wal::open(server.socket_path(), "typed", WalOptions::default()).unwrap();
    wal.append(&entry(1)).unwrap();
    wal.append(&entry(2)).unwrap();
    // Another type under the same tag (a type changed incompatibly): the daemon cannot tell.
    let wrong: Wal<(String, bool)> = Wal::open(
        server.socket_path(),
        "typed",
        WalOptions::default().type_tag(tag),
    )
    .unwrap();
    let error = wrong.iter().unwrap().next().unwrap().unwrap_err();
    assert!(
        matches!(error, stela_client::Error::Decode { lsn, .. } if lsn == Lsn::FIRST),
        "{error}"
    );
    assert!(error.to_string().contains("LSN 1"), "{error}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let wrong: stela_client::AsyncWal<(String, bool)> = stela_client::AsyncWal::open(
            server.socket_path(),
            "typed",
            WalOptions::default().type_tag(tag),
        )
        .await
        .unwrap();
        let error = wrong
            .iter_from(Lsn::new(2))
            .next()
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(error, stela_client::Error::Decode { lsn, .. } if lsn == Lsn::new(2)),
            "{error}"
        );
    });
}
