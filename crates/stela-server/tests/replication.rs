//! Log shipping to a standby, two daemons in this process on loopback: `replicated` and `all`
//! are acknowledged only once the standby holds the records, a `replicated` commit waits while
//! the standby is down and completes when it comes back, the standby's segment files are the
//! primary's byte for byte, and a daemon without a standby refuses the levels that need one.
//! Over TLS, only an authenticated primary ships, and a reload rotates the replication
//! listener's certificate with the daemon's.

mod common;

use common::{read_back, read_back_from_first, rec, NoHang, RawClient, Rec};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;
use stela_proto::{Durability, ErrorCode, RequestBody, ResponseBody};
use stela_server::{DaemonConfig, Server};
use stela_wal::storage::StdStorage;

fn config(dir: &Path) -> DaemonConfig {
    let mut config = DaemonConfig::new(dir);
    config.assume_write_rate = Some(100 << 20);
    config.segment_bytes = 64 << 10; // several segments in a test
    config.spin = Duration::ZERO;
    config
}

fn standby(dir: &Path, port: u16) -> NoHang {
    let mut config = config(dir);
    config.repl_listen = Some(SocketAddr::from(([127, 0, 0, 1], port)));
    config.node = "standby".into();
    NoHang::new(Server::start(config).expect("the standby starts"))
}

fn primary(dir: &Path, standby: SocketAddr) -> NoHang {
    let mut config = config(dir);
    config.standby = Some(standby);
    config.node = "primary".into();
    NoHang::new(Server::start(config).expect("the primary starts"))
}

use stela_testkit::{eventually, segment_files};

const TEN_S: Duration = Duration::from_secs(10);

fn log_dir(root: &Path, log: &str) -> PathBuf {
    root.join("logs").join(log)
}

#[test]
fn replicated_commits_reach_the_standby_byte_for_byte() {
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (root.path().join("p"), root.path().join("s"));
    let standby = standby(&s_dir, 0);
    let repl = standby.repl_addr().expect("listening");
    let primary = primary(&p_dir, repl);
    let mut client = RawClient::connect(primary.socket_path());
    let handle = client.open("ledger");
    let mut written: Vec<Rec> = Vec::new();
    for seq in 0..400u64 {
        let batch: Vec<Rec> = (0..3)
            .map(|i| rec(1, seq * 3 + i, 50 + (seq as usize * 7) % 300))
            .collect();
        let level = match seq % 4 {
            0 => Durability::Replicated,
            1 => Durability::All,
            2 => Durability::Buffered,
            _ => Durability::Disk,
        };
        let (_, last) = client.append(handle, level, &batch).expect("append");
        written.extend(batch);
        if seq % 10 == 9 {
            client
                .commit(handle, last, Durability::Replicated)
                .expect("replicated commit");
        }
    }
    let (_, last) = client
        .append(handle, Durability::Buffered, &[rec(1, 9999, 10)])
        .unwrap();
    written.push(rec(1, 9999, 10));
    client
        .commit(handle, last, Durability::All)
        .expect("all commit");
    // Both daemons say where the log's shipping stands.
    let status = |socket: &Path| match RawClient::connect(socket).request(RequestBody::Status) {
        Ok(ResponseBody::Status(report)) => report.replication.expect("a replication section"),
        other => panic!("status: {other:?}"),
    };
    let on_primary = status(primary.socket_path());
    assert_eq!(on_primary.role, "primary");
    assert_eq!(on_primary.peer, repl.to_string());
    let ledger = &on_primary.logs[0];
    assert_eq!((ledger.log.as_str(), ledger.connected), ("ledger", true));
    assert!(ledger.term >= 1 && ledger.stopped.is_none());
    assert_eq!(
        (ledger.received_lsn, ledger.lag_records, ledger.lag_bytes),
        (last, 0, 0)
    );
    let on_standby = status(standby.socket_path());
    assert_eq!(on_standby.role, "standby");
    assert_eq!(on_standby.logs[0].log, "ledger");
    assert_eq!(on_standby.logs[0].received_lsn, last);
    assert_eq!(on_standby.logs[0].term, ledger.term);
    drop(client);
    primary.shutdown().expect("primary stops cleanly");
    // The standby syncs what it holds when the primary's stream ends.
    std::thread::sleep(Duration::from_millis(300));
    standby.shutdown().expect("standby stops cleanly");

    let (p_log, s_log) = (log_dir(&p_dir, "ledger"), log_dir(&s_dir, "ledger"));
    let (p_files, s_files) = (segment_files(&p_log), segment_files(&s_log));
    assert!(p_files.len() > 1, "the test crosses segments");
    assert_eq!(
        p_files.iter().map(|f| &f.0).collect::<Vec<_>>(),
        s_files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    for ((name, p), (_, s)) in p_files.iter().zip(&s_files) {
        assert!(p == s, "{name} differs between primary and standby");
    }
    let on_standby = read_back(&s_log, std::sync::Arc::new(StdStorage));
    assert_eq!(on_standby, written);
    assert_eq!(read_back(&p_log, std::sync::Arc::new(StdStorage)), written);
}

#[test]
fn a_replicated_commit_waits_for_a_standby_that_is_down() {
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (root.path().join("p"), root.path().join("s"));
    // Find a free port for the standby, then leave it closed.
    let absent = stela_testkit::free_addr();
    let primary = primary(&p_dir, absent);
    let socket = primary.socket_path().to_path_buf();
    let (done, finished) = mpsc::channel();
    let writer = std::thread::spawn(move || {
        let mut client = RawClient::connect(&socket);
        let handle = client.open("orders");
        let (_, last) = client
            .append(handle, Durability::Buffered, &[rec(2, 1, 100)])
            .unwrap();
        let result = client.commit(handle, last, Durability::Replicated);
        done.send(result).unwrap();
    });
    // No standby: the acknowledgement must not come (a buffered one would have come at once).
    assert!(
        finished.recv_timeout(Duration::from_millis(700)).is_err(),
        "a replicated commit was acknowledged with no standby running"
    );
    // Status says how far behind the absent standby is: the record, and its bytes (its frame
    // holds its 100-byte payload).
    let report = match RawClient::connect(primary.socket_path()).request(RequestBody::Status) {
        Ok(ResponseBody::Status(report)) => report.replication.expect("a replication section"),
        other => panic!("status: {other:?}"),
    };
    let orders = &report.logs[0];
    assert!(!orders.connected);
    assert_eq!(orders.lag_records, 1);
    assert!(orders.lag_bytes > 100, "lag of {} bytes", orders.lag_bytes);
    let standby = standby(&s_dir, absent.port());
    let result = finished
        .recv_timeout(Duration::from_secs(20))
        .expect("the commit completes once the standby is up");
    assert_eq!(result, Ok(()));
    writer.join().unwrap();
    primary.shutdown().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    standby.shutdown().unwrap();
    assert_eq!(
        read_back(&log_dir(&s_dir, "orders"), std::sync::Arc::new(StdStorage)),
        vec![rec(2, 1, 100)]
    );
}

#[test]
fn without_a_standby_replicated_levels_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let server = NoHang::new(Server::start(config(root.path())).unwrap());
    let mut client = RawClient::connect(server.socket_path());
    let handle = client.open("solo");
    for level in [Durability::Replicated, Durability::All] {
        let refused = client.append(handle, level, &[rec(3, 1, 10)]).unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unsupported, "{refused:?}");
    }
    drop(client);
    server.shutdown().unwrap();
}

#[test]
fn a_replication_address_off_loopback_is_refused_until_tls() {
    let root = tempfile::tempdir().unwrap();
    let mut config = config(root.path());
    config.standby = Some("10.1.2.3:7000".parse().unwrap());
    let error = Server::start(config).err().expect("refused").to_string();
    assert!(error.contains("loopback"), "{error}");
}

#[test]
fn degrade_after_acknowledges_without_an_unreachable_standby_loudly_until_it_is_back() {
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (root.path().join("p"), root.path().join("s"));
    let absent = stela_testkit::free_addr();
    let mut config = config(&p_dir);
    config.standby = Some(absent);
    config.degrade_after = Some(Duration::from_millis(300));
    let primary = NoHang::new(Server::start(config).unwrap());
    let mut client = RawClient::connect(primary.socket_path());
    let handle = client.open("orders");
    let started = std::time::Instant::now();
    // No standby: the first replicated append waits until the standby has been unreachable for
    // 300 ms, then is answered without it: `Unprotected`, never `Ok` (issue 52); the next ones
    // at once.
    let unprotected = |answer: Result<(u64, u64), common::Refused>| match answer {
        Err(refused) if refused.code == stela_proto::ErrorCode::Unprotected => {}
        other => panic!("degraded: answered {other:?}"),
    };
    unprotected(client.append(handle, Durability::Replicated, &[rec(4, 1, 50)]));
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "answered before the standby had been unreachable for --degrade-after"
    );
    unprotected(client.append(handle, Durability::All, &[rec(4, 2, 50)]));
    let status = |client: &mut RawClient| match client.request(RequestBody::Status) {
        Ok(ResponseBody::Status(report)) => report.replication.unwrap().logs[0].clone(),
        other => panic!("status: {other:?}"),
    };
    let degraded = status(&mut client);
    assert!(degraded.degraded && !degraded.connected, "{degraded:?}");
    assert_eq!(degraded.degraded_acks, 2, "{degraded:?}");
    assert_eq!(degraded.degraded_through, 2, "{degraded:?}");
    // The standby comes up: shipping resumes, everything reaches it, and replicated commits
    // wait for it again.
    let standby = standby(&s_dir, absent.port());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = status(&mut client);
        if now.connected && !now.degraded && now.received_lsn >= 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    client
        .append(handle, Durability::Replicated, &[rec(4, 3, 50)])
        .expect("replicated with the standby back");
    let back = status(&mut client);
    assert_eq!(back.degraded_acks, 2, "{back:?}");
    // What the policy acknowledged alone is still named, and the standby now holds it.
    assert!(
        back.degraded_through == 2 && back.received_lsn >= 2,
        "{back:?}"
    );
    drop(client);
    primary.shutdown().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    standby.shutdown().unwrap();
    assert_eq!(
        read_back(&log_dir(&s_dir, "orders"), std::sync::Arc::new(StdStorage)),
        vec![rec(4, 1, 50), rec(4, 2, 50), rec(4, 3, 50)]
    );
}

/// A self-signed certificate for localhost / 127.0.0.1 in `dir`: (cert, key) paths.
fn certificate(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let made = stela_testkit::self_signed(dir, name);
    (made.cert, made.key)
}

/// Over TLS the standby takes a stream only from a primary that trusts its certificate and
/// proves itself one of its administrators (here with an admin token); then `replicated` works
/// as on plain TCP. A primary with no token, or one that does not trust the standby, never
/// gets a `replicated` acknowledgement, and the standby writes nothing it sends.
#[test]
fn over_tls_only_an_authenticated_primary_replicates() {
    let root = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(root.path(), "standby");
    let (other_ca, _) = certificate(root.path(), "other");
    let admin_tokens = root.path().join("admin-tokens");
    stela_testkit::write_secret(&admin_tokens, "an-admin-token-of-some-length\n");
    let s_dir = root.path().join("s");
    let mut standby_config = config(&s_dir);
    standby_config.repl_listen = Some("127.0.0.1:0".parse().unwrap());
    standby_config.tls = Some(stela_server::ServerTlsFiles {
        cert: cert.clone(),
        key,
        client_ca: None,
    });
    standby_config.admin_token_file = Some(admin_tokens.clone());
    let standby = NoHang::new(Server::start(standby_config).expect("the standby starts"));
    let repl = standby.repl_addr().unwrap();

    let primary_with = |dir: &str, ca: &Path, token: Option<&Path>| {
        let mut config = config(&root.path().join(dir));
        config.standby = Some(repl);
        config.standby_tls = Some(stela_server::ClientTlsFiles {
            ca: ca.to_owned(),
            identity: None,
        });
        config.standby_name = Some("localhost".into());
        config.standby_token_file = token.map(Path::to_owned);
        NoHang::new(Server::start(config).expect("a primary starts"))
    };
    // The right CA and an admin token: replicated commits are acknowledged.
    let good = primary_with("p", &cert, Some(&admin_tokens));
    let mut client = RawClient::connect(good.socket_path());
    let handle = client.open("secure");
    client
        .append(handle, Durability::Replicated, &[rec(5, 1, 40)])
        .expect("replicated over TLS");
    drop(client);
    good.shutdown().unwrap();

    // No token, or a standby it does not trust: the replicated commit never comes back.
    for (dir, ca, token) in [
        ("no-token", cert.as_path(), None),
        ("wrong-ca", other_ca.as_path(), Some(admin_tokens.as_path())),
    ] {
        let primary = primary_with(dir, ca, token);
        let socket = primary.socket_path().to_path_buf();
        let (done, finished) = mpsc::channel();
        std::thread::spawn(move || {
            let mut client = RawClient::connect(&socket);
            let handle = client.open("intruder");
            let _ = done.send(client.append(handle, Durability::Replicated, &[rec(6, 1, 40)]));
        });
        assert!(
            finished.recv_timeout(Duration::from_millis(700)).is_err(),
            "{dir}: acknowledged at replicated by a standby that should refuse it"
        );
        let status = match RawClient::connect(primary.socket_path()).request(RequestBody::Status) {
            Ok(ResponseBody::Status(report)) => report.replication.unwrap().logs[0].clone(),
            other => panic!("status: {other:?}"),
        };
        assert!(
            !status.connected && status.received_lsn == 0,
            "{dir}: {status:?}"
        );
        std::mem::forget(primary); // its commit still waits; the process ends the test
    }
    standby.shutdown().unwrap();
    assert!(
        !log_dir(&s_dir, "intruder")
            .join("00000000000000000001.wal")
            .exists()
            || read_back(
                &log_dir(&s_dir, "intruder"),
                std::sync::Arc::new(StdStorage)
            )
            .is_empty(),
        "the standby wrote what an unauthenticated primary sent"
    );
    assert_eq!(
        read_back(&log_dir(&s_dir, "secure"), std::sync::Arc::new(StdStorage)),
        vec![rec(5, 1, 40)]
    );
}

/// A TLS handshake with the listener at `addr`, trusting `ca` for `localhost`: `Err` if the
/// client does not accept the certificate it is shown.
fn handshake(addr: SocketAddr, ca: &Path) -> Result<(), String> {
    use stela_net::tls::{self, rustls};
    let config = tls::client_config(&stela_server::ClientTlsFiles {
        ca: ca.to_owned(),
        identity: None,
    })
    .unwrap();
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut connection =
        rustls::ClientConnection::new(config, tls::server_name("localhost").unwrap()).unwrap();
    while connection.is_handshaking() {
        connection
            .complete_io(&mut tcp)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A SIGHUP reload that rotates the daemon's certificate rotates the replication listener's
/// too (the same files): a primary's new streams are served with the new certificate, and one
/// trusting only the old one is refused.
#[test]
fn a_reload_rotates_the_replication_listeners_certificate() {
    let root = tempfile::tempdir().unwrap();
    let (cert_a, key_a) = certificate(root.path(), "a");
    let (cert_b, key_b) = certificate(root.path(), "b");
    let (cert, key) = (root.path().join("cert.pem"), root.path().join("key.pem"));
    std::fs::copy(&cert_a, &cert).unwrap();
    std::fs::copy(&key_a, &key).unwrap();
    let admin_tokens = root.path().join("admin-tokens");
    stela_testkit::write_secret(&admin_tokens, "an-admin-token-of-some-length\n");
    let mut standby_config = config(&root.path().join("s"));
    standby_config.repl_listen = Some("127.0.0.1:0".parse().unwrap());
    standby_config.tls = Some(stela_server::ServerTlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: None,
    });
    standby_config.admin_token_file = Some(admin_tokens.clone());
    let standby = NoHang::new(Server::start(standby_config.clone()).expect("the standby starts"));
    let repl = standby.repl_addr().unwrap();
    assert_eq!(handshake(repl, &cert_a), Ok(()));
    assert!(handshake(repl, &cert_b).is_err());

    std::fs::copy(&cert_b, &cert).unwrap();
    std::fs::copy(&key_b, &key).unwrap();
    let said = standby.reload(&standby_config);
    assert!(
        said.iter()
            .any(|l| l.starts_with("TLS: certificate") && l.ends_with("(applied)")),
        "{said:?}"
    );
    assert_eq!(handshake(repl, &cert_b), Ok(()));
    assert!(handshake(repl, &cert_a).is_err());

    // A primary that trusts only the new certificate replicates.
    let mut primary_config = config(&root.path().join("p"));
    primary_config.standby = Some(repl);
    primary_config.standby_tls = Some(stela_server::ClientTlsFiles {
        ca: cert_b.clone(),
        identity: None,
    });
    primary_config.standby_name = Some("localhost".into());
    primary_config.standby_token_file = Some(admin_tokens);
    let primary = NoHang::new(Server::start(primary_config).expect("the primary starts"));
    let mut client = RawClient::connect(primary.socket_path());
    let handle = client.open("rotated");
    client
        .append(handle, Durability::Replicated, &[rec(7, 1, 40)])
        .expect("replicated under the new certificate");
    drop(client);
    primary.shutdown().unwrap();
    standby.shutdown().unwrap();
}

/// Records a standby receives in a later term's session (it was away while the primary wrote
/// them, and the primary restarted since) are labelled with the term the primary wrote them in:
/// both term histories come out identical, so a commit in doubt resolves alike on either node.
#[test]
fn the_standby_labels_records_with_the_term_the_primary_wrote_them_in() {
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (root.path().join("p"), root.path().join("s"));
    let s = standby(&s_dir, 0);
    let repl = s.repl_addr().unwrap();
    let p = primary(&p_dir, repl);
    let mut client = RawClient::connect(p.socket_path());
    let handle = client.open("ledger");
    for seq in 0..50 {
        client
            .append(handle, Durability::Replicated, &[rec(1, seq, 30)])
            .unwrap();
    }
    // The standby goes away; the primary writes 51..100 alone, then restarts (a new term).
    s.shutdown().unwrap();
    for seq in 50..100 {
        client
            .append(handle, Durability::Buffered, &[rec(1, seq, 30)])
            .unwrap();
    }
    drop(client);
    p.shutdown().unwrap();
    let s = standby(&s_dir, repl.port());
    let p = primary(&p_dir, repl);
    let mut client = RawClient::connect(p.socket_path());
    let handle = client.open("ledger");
    for seq in 100..110 {
        client
            .append(handle, Durability::Replicated, &[rec(1, seq, 30)])
            .unwrap();
    }
    drop(client);
    p.shutdown().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    s.shutdown().unwrap();
    let history = |dir: &Path| {
        stela_wal::TermStore::open(std::sync::Arc::new(StdStorage), &log_dir(dir, "ledger"))
            .unwrap()
            .history()
            .entries()
            .to_vec()
    };
    let (ours, theirs) = (history(&p_dir), history(&s_dir));
    assert_eq!(ours.len(), 2, "{ours:?}");
    assert_eq!(
        ours[1].1, 101,
        "the second term begins at the restart: {ours:?}"
    );
    assert_eq!(
        theirs, ours,
        "the standby labels records as the primary wrote them"
    );
}

#[test]
fn a_standby_that_accepts_but_never_answers_is_given_up_on_so_degrade_after_works() {
    let root = tempfile::tempdir().unwrap();
    // A "standby" whose connections the kernel accepts (the backlog) but that never answers:
    // a stopped process, a hung machine.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut config = config(&root.path().join("p"));
    config.standby = Some(silent.local_addr().unwrap());
    config.degrade_after = Some(Duration::from_millis(300));
    let primary = NoHang::new(Server::start(config).unwrap());
    let socket = primary.socket_path().to_path_buf();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let mut client = RawClient::connect(&socket);
        let handle = client.open("orders");
        let result = client.append(handle, Durability::Replicated, &[rec(5, 1, 50)]);
        let _ = done.send(result.map(|_| ()));
    });
    // Shipper blocked for ever in the handshake: never degraded, never acknowledged. Cut after
    // its handshake time: degraded and acknowledged, loudly.
    let result = finished
        .recv_timeout(Duration::from_secs(30))
        .expect("the commit is answered once degraded, although the standby never answers");
    // Answered, and said to be on the primary alone: `Unprotected`, never `Ok` (issue 52).
    assert!(
        matches!(&result, Err(r) if r.code == ErrorCode::Unprotected),
        "{result:?}"
    );
    let report = match RawClient::connect(primary.socket_path()).request(RequestBody::Status) {
        Ok(ResponseBody::Status(report)) => report.replication.unwrap().logs[0].clone(),
        other => panic!("status: {other:?}"),
    };
    assert!(report.degraded && !report.connected, "{report:?}");
    primary.shutdown().unwrap();
    drop(silent);
}

/// The last LSN the primary at `socket` says its standby received of its one log.
fn standby_received(socket: &Path) -> u64 {
    match RawClient::connect(socket).request(RequestBody::Status) {
        Ok(ResponseBody::Status(report)) => {
            report.replication.map_or(0, |r| r.logs[0].received_lsn)
        }
        other => panic!("status: {other:?}"),
    }
}

/// The first LSNs of the segment files in `dir`, in order.
fn segment_starts(dir: &Path) -> Vec<u64> {
    let mut starts: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            stela_format::segment_name::parse_segment_file_name(&name).map(|lsn| lsn.get())
        })
        .collect();
    starts.sort_unstable();
    starts
}

/// A client truncates the log on the primary: the standby's copy drops the same whole segments,
/// but never one a follower's hold (`stela_wal::holds`) still needs; once the hold moves up (or
/// goes), the copy catches up with the primary's.
#[test]
fn the_standby_follows_the_primarys_truncation_down_to_a_followers_hold() {
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (root.path().join("p"), root.path().join("s"));
    let standby = standby(&s_dir, 0);
    let primary = primary(&p_dir, standby.repl_addr().expect("listening"));
    let mut client = RawClient::connect(primary.socket_path());
    let handle = client.open("ledger");
    let mut last = 0;
    for seq in 0..600u64 {
        (_, last) = client
            .append(handle, Durability::Replicated, &[rec(1, seq, 600)])
            .expect("append");
    }
    // On the primary's disk too, so that its files are all there to compare.
    client
        .commit(handle, last, Durability::All)
        .expect("commit at all");
    let (p_log, s_log) = (log_dir(&p_dir, "ledger"), log_dir(&s_dir, "ledger"));
    let starts = segment_starts(&p_log);
    assert!(starts.len() >= 5, "the test spans segments: {starts:?}");
    eventually("the standby's copy has every segment", TEN_S, || {
        segment_starts(&s_log) == starts
    });
    // A follower on the standby still needs the third segment's second record on.
    let follower = root.path().join("follower");
    std::fs::create_dir_all(&follower).unwrap();
    let held = starts[2] + 1;
    assert!(
        stela_wal::holds::record(&StdStorage, &s_log, &follower, stela_format::Lsn::new(held))
            .unwrap()
    );

    match client.request(RequestBody::Truncate {
        handle,
        before: last,
    }) {
        Ok(ResponseBody::Truncated { segments }) => assert!(segments >= 4, "{segments}"),
        other => panic!("truncate: {other:?}"),
    }
    let after = segment_starts(&p_log);
    assert_eq!(
        after,
        starts[starts.len() - 1..],
        "the primary keeps its newest segment"
    );
    eventually(
        "the standby cuts its copy to the follower's hold",
        TEN_S,
        || segment_starts(&s_log) == starts[2..],
    );
    // Still held: another second changes nothing.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(segment_starts(&s_log), starts[2..]);

    // The follower moves on: the copy follows the primary's all the way.
    assert!(
        stela_wal::holds::record(&StdStorage, &s_log, &follower, stela_format::Lsn::new(last))
            .unwrap()
    );
    eventually(
        "the standby's copy begins where the primary's does",
        TEN_S,
        || segment_starts(&s_log) == after,
    );
    // What is left is still the primary's, byte for byte.
    client
        .commit(handle, last, Durability::Replicated)
        .expect("replicated commit");
    drop(client);
    primary.shutdown().expect("primary stops cleanly");
    std::thread::sleep(Duration::from_millis(300));
    standby.shutdown().expect("standby stops cleanly");
    assert_eq!(segment_files(&p_log), segment_files(&s_log));
}

/// Once the standby is back: one more record, which the standby receives (it catches up) and
/// acknowledges at `replicated`.
fn caught_up(client: &mut RawClient, handle: u32, primary: &Path) {
    let (_, newest) = client
        .append(handle, Durability::Buffered, &[rec(1, 700, 600)])
        .expect("append");
    eventually("the standby catches up", TEN_S, || {
        standby_received(primary) >= newest
    });
    client
        .commit(handle, newest, Durability::Replicated)
        .expect("the standby acknowledges");
}

/// Appends records `seqs` of 600 bytes to `handle` and commits them at `level`; the last LSN.
fn write_600(
    client: &mut RawClient,
    handle: u32,
    seqs: std::ops::Range<u64>,
    level: Durability,
) -> u64 {
    let mut last = 0;
    for seq in seqs {
        (_, last) = client
            .append(handle, Durability::Buffered, &[rec(1, seq, 600)])
            .expect("append");
    }
    client.commit(handle, last, level).expect("commit");
    last
}

/// The primary keeps, through a client's truncation and its own restart, every segment its
/// standby has not stored yet: the standby was down while the log grew and was truncated, and
/// when it comes back it catches up from the primary's files. Once it has, the hold moves up
/// and the truncation goes through, on both copies.
#[test]
fn the_primary_keeps_what_an_absent_standby_still_needs_through_truncation_and_restart() {
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (root.path().join("p"), root.path().join("s"));
    let standby_node = standby(&s_dir, 0);
    let repl = standby_node.repl_addr().expect("listening");
    let mut primary_node = primary(&p_dir, repl);
    let mut client = RawClient::connect(primary_node.socket_path());
    let mut handle = client.open("ledger");
    let mut last = write_600(&mut client, handle, 0..50, Durability::All);
    let standby_has = last;
    std::thread::sleep(Duration::from_millis(300));
    standby_node.shutdown().expect("the standby stops");

    // The log grows and is truncated while the standby is away.
    last = write_600(&mut client, handle, 50..700, Durability::Disk);
    let p_log = log_dir(&p_dir, "ledger");
    let starts = segment_starts(&p_log);
    assert!(starts.len() >= 6, "the test spans segments: {starts:?}");
    let truncate = |client: &mut RawClient, handle| match client.request(RequestBody::Truncate {
        handle,
        before: last,
    }) {
        Ok(ResponseBody::Truncated { segments }) => segments,
        other => panic!("truncate: {other:?}"),
    };
    truncate(&mut client, handle);
    let kept = |dir: &Path| {
        let starts = segment_starts(dir);
        assert!(
            starts[0] <= standby_has + 1,
            "the primary's copy begins at LSN {} but its standby has only up to {standby_has}",
            starts[0]
        );
        starts
    };
    let held = kept(&p_log);
    // The hold is the primary's, for its standby, and `stela logs list` shows it.
    let holds = stela_wal::holds::list(&StdStorage, &p_log).unwrap();
    assert_eq!(holds.len(), 1, "{holds:?}");
    assert!(holds[0].is_standby(), "{holds:?}");
    assert!(holds[0].lsn.get() <= standby_has + 1, "{holds:?}");
    match client.request(RequestBody::ListLogs) {
        Ok(ResponseBody::Logs(listing)) => {
            let ledger = listing.iter().find(|l| l.name == "ledger").unwrap();
            assert_eq!(ledger.holds.len(), 1, "{ledger:?}");
            assert_eq!(ledger.holds[0].holder, format!("standby at {repl}"));
        }
        other => panic!("list: {other:?}"),
    }

    // It survives the primary's restart.
    drop(client);
    primary_node.shutdown().expect("the primary stops");
    primary_node = primary(&p_dir, repl);
    client = RawClient::connect(primary_node.socket_path());
    handle = client.open("ledger");
    truncate(&mut client, handle);
    assert_eq!(kept(&p_log), held);

    // The standby comes back and catches up from the files the hold kept.
    let standby_node = standby(&s_dir, repl.port());
    caught_up(&mut client, handle, primary_node.socket_path());
    // Then the hold's file moves up (within a second of the acknowledgements: a primary
    // restarted now would hold from there) and truncation goes through, here and, following
    // it, on the standby.
    let newest = client.positions(handle).last_lsn;
    eventually(
        "the hold's file follows the acknowledgements",
        TEN_S,
        || {
            let holds = stela_wal::holds::list(&StdStorage, &p_log).unwrap();
            holds[0].lsn.get() > newest
        },
    );
    let s_log = log_dir(&s_dir, "ledger");
    eventually("the truncation goes through", TEN_S, || {
        truncate(&mut client, handle);
        segment_starts(&p_log)[0] > standby_has + 1
    });
    let after = segment_starts(&p_log);
    eventually("the standby's copy follows", TEN_S, || {
        segment_starts(&s_log) == after
    });
    drop(client);
    primary_node.shutdown().expect("primary stops cleanly");
    std::thread::sleep(Duration::from_millis(300));
    standby_node.shutdown().expect("standby stops cleanly");
    assert_eq!(segment_files(&p_log), segment_files(&s_log));
}

/// A standby whose copy ends before the primary's oldest segment (it was away, its hold was
/// released, and the primary truncated what lay between) cannot be continued: the primary has
/// it begin its copy again at that segment, and it then holds the primary's files byte for
/// byte and acknowledges `replicated` commits again.
#[test]
fn a_standby_behind_the_primarys_oldest_segment_begins_its_copy_again_there() {
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (root.path().join("p"), root.path().join("s"));
    let standby_node = standby(&s_dir, 0);
    let repl = standby_node.repl_addr().expect("listening");
    let primary_node = primary(&p_dir, repl);
    let mut client = RawClient::connect(primary_node.socket_path());
    let handle = client.open("ledger");
    write_600(&mut client, handle, 0..20, Durability::All);
    std::thread::sleep(Duration::from_millis(300));
    standby_node.shutdown().expect("the standby stops");
    let last = write_600(&mut client, handle, 20..700, Durability::Disk);
    // The standby is given up on: its hold is released, and truncation goes through.
    let holder = format!("standby at {repl}");
    match client.request(RequestBody::ReleaseHold {
        log: "ledger".into(),
        holder: holder.clone(),
    }) {
        Ok(ResponseBody::HoldReleased { holder: named, .. }) => assert_eq!(named, holder),
        other => panic!("release: {other:?}"),
    }
    match client.request(RequestBody::Truncate {
        handle,
        before: last,
    }) {
        Ok(ResponseBody::Truncated { segments }) => assert!(segments >= 5, "{segments}"),
        other => panic!("truncate: {other:?}"),
    }
    let p_log = log_dir(&p_dir, "ledger");
    let oldest = segment_starts(&p_log)[0];
    assert!(
        oldest > 21,
        "the standby's records are all truncated: {oldest}"
    );

    // It comes back: its copy begins again at the primary's oldest segment.
    let standby_node = standby(&s_dir, repl.port());
    caught_up(&mut client, handle, primary_node.socket_path());
    let s_log = log_dir(&s_dir, "ledger");
    assert_eq!(segment_starts(&s_log)[0], oldest);
    drop(client);
    primary_node.shutdown().expect("primary stops cleanly");
    std::thread::sleep(Duration::from_millis(300));
    standby_node.shutdown().expect("standby stops cleanly");
    assert_eq!(segment_files(&p_log), segment_files(&s_log));
    let records = |dir: &Path| read_back_from_first(dir, std::sync::Arc::new(StdStorage));
    let on_standby = records(&s_log);
    assert_eq!(on_standby, records(&p_log));
    assert_eq!(on_standby.0, oldest);
    assert_eq!(on_standby.1.last(), Some(&rec(1, 700, 600)));
}

/// With `standby_keep_max`, the primary's truncation passes over a hold for an absent standby
/// that would keep more than that; the standby, back, begins its copy again at the oldest
/// segment left and acknowledges again.
#[test]
fn a_standby_hold_beyond_the_keep_limit_is_passed_over_and_the_standby_begins_again() {
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (root.path().join("p"), root.path().join("s"));
    let standby_node = standby(&s_dir, 0);
    let repl = standby_node.repl_addr().expect("listening");
    let mut p_config = config(&p_dir);
    p_config.standby = Some(repl);
    p_config.standby_keep_max = Some(3 * (64 << 10));
    let primary_node = NoHang::new(Server::start(p_config).expect("the primary starts"));
    let mut client = RawClient::connect(primary_node.socket_path());
    let handle = client.open("ledger");
    let mut last = write_600(&mut client, handle, 0..20, Durability::All);
    let standby_has = last;
    std::thread::sleep(Duration::from_millis(300));
    standby_node.shutdown().expect("the standby stops");
    let truncate = |client: &mut RawClient, before| match client
        .request(RequestBody::Truncate { handle, before })
    {
        Ok(ResponseBody::Truncated { segments }) => segments,
        other => panic!("truncate: {other:?}"),
    };
    // Within the limit the hold is kept...
    last = write_600(&mut client, handle, 20..200, Durability::Disk);
    let p_log = log_dir(&p_dir, "ledger");
    assert!(
        segment_starts(&p_log).len() <= 3,
        "{:?}",
        segment_starts(&p_log)
    );
    assert_eq!(truncate(&mut client, last), 0);
    // ... beyond it, passed over.
    last = write_600(&mut client, handle, 200..700, Durability::Disk);
    assert!(truncate(&mut client, last) >= 5);
    let oldest = segment_starts(&p_log)[0];
    assert!(oldest > standby_has + 1, "{oldest}");

    let standby_node = standby(&s_dir, repl.port());
    caught_up(&mut client, handle, primary_node.socket_path());
    assert_eq!(segment_starts(&log_dir(&s_dir, "ledger"))[0], oldest);
    drop(client);
    primary_node.shutdown().expect("primary stops cleanly");
    std::thread::sleep(Duration::from_millis(300));
    standby_node.shutdown().expect("standby stops cleanly");
}

/// A standby's hold stands only for the standby the daemon ships to: restarted without one,
/// the daemon's truncation passes over the hold its primary days left (the listing still shows
/// it, for `release-hold`).
#[test]
fn a_standby_hold_left_on_a_daemon_that_no_longer_ships_is_not_counted() {
    let root = tempfile::tempdir().unwrap();
    let p_dir = root.path().join("p");
    let absent = stela_testkit::free_addr();
    let primary_node = primary(&p_dir, absent);
    let mut client = RawClient::connect(primary_node.socket_path());
    let handle = client.open("ledger");
    let last = write_600(&mut client, handle, 0..700, Durability::Disk);
    let truncate = |client: &mut RawClient, handle| match client.request(RequestBody::Truncate {
        handle,
        before: last,
    }) {
        Ok(ResponseBody::Truncated { segments }) => segments,
        other => panic!("truncate: {other:?}"),
    };
    assert_eq!(truncate(&mut client, handle), 0, "held for the standby");
    drop(client);
    primary_node.shutdown().expect("the primary stops");

    let alone = NoHang::new(Server::start(config(&p_dir)).expect("the daemon starts"));
    let mut client = RawClient::connect(alone.socket_path());
    let handle = client.open("ledger");
    assert!(truncate(&mut client, handle) >= 5);
    let holds = stela_wal::holds::list(&StdStorage, &log_dir(&p_dir, "ledger")).unwrap();
    assert!(holds.len() == 1 && holds[0].is_standby(), "{holds:?}");
    drop(client);
    alone.shutdown().expect("the daemon stops");
}
