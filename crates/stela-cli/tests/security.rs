//! Security of `stela serve` (docs/DAEMON.md, "Security"), tested on real daemon processes:
//! TCP only with TLS and client authentication (or an explicit insecure loopback listener),
//! refused logins logged with the peer's address, administrative requests refused to TCP
//! clients not authenticated as administrators and logged with their peer, and a Unix socket
//! reached through its group by a process of another user.
//!
//! Certificates are made here with rcgen: a CA, the daemon's certificate (for `localhost` and
//! 127.0.0.1), client certificates, and a second, unrelated CA.

mod common;

use common::{stela, text, Daemon};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use stela_client::{Address, Connection, Durability, ErrorCode, TlsTarget, Wal, WalOptions};
use stela_proto::RequestBody;

const CLIENT_TOKEN: &str = "client-token-5d1c0e9a7b3f4e21";
const ADMIN_TOKEN: &str = "admin-token-8f2a61c4d09b7e35";

/// A CA and what it issued, written as PEM files into a directory.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert: PathBuf,
}

impl Ca {
    fn new(dir: &Path, name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, cert.pem()).unwrap();
        Ca {
            issuer: Issuer::new(params, key),
            cert: path,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses): (cert, key) files.
    fn issue(&self, dir: &Path, file: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, file);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{file}.pem")),
            dir.join(format!("{file}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        stela_testkit::write_secret(&key_path, key.serialize_pem());
        (cert_path, key_path)
    }
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The TCP address the daemon printed (`--tcp 127.0.0.1:0` picks a free port).
fn tcp_addr(daemon: &mut Daemon) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let output = daemon.output();
        if let Some(addr) = output
            .lines()
            .find_map(|l| l.strip_prefix("stela serve: listening on tcp://"))
        {
            return addr.trim().to_owned();
        }
        daemon.assert_alive("before printing its TCP address");
        assert!(Instant::now() < deadline, "no TCP address in:\n{output}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the daemon's log shows `what` (its log lines are written as they happen).
fn wait_logged(daemon: &Daemon, what: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let output = daemon.output();
        if let Some(line) = output.lines().find(|l| what.iter().all(|w| l.contains(w))) {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not log a line with {what:?}:\n{output}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn lines_with(daemon: &Daemon, what: &str) -> usize {
    daemon.output().lines().filter(|l| l.contains(what)).count()
}

struct Setup {
    _temp: tempfile::TempDir,
    dir: PathBuf,
    pki: PathBuf,
    ca: Ca,
    server: (PathBuf, PathBuf),
    client_tokens: PathBuf,
    admin_tokens: PathBuf,
    wrong_token: PathBuf,
}

fn setup() -> Setup {
    let temp = tempfile::tempdir().unwrap();
    let pki = temp.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    let ca = Ca::new(&pki, "stela-test-ca");
    let server = ca.issue(&pki, "daemon", &["localhost", "127.0.0.1"]);
    let client_tokens = pki.join("client.tokens");
    let admin_tokens = pki.join("admin.tokens");
    let wrong_token = pki.join("wrong.token");
    stela_testkit::write_secret(&client_tokens, format!("# clients\n{CLIENT_TOKEN}\n"));
    stela_testkit::write_secret(&admin_tokens, format!("{ADMIN_TOKEN}\n"));
    stela_testkit::write_secret(&wrong_token, "client-token-5d1c0e9a7b3f4e22\n");
    Setup {
        dir: temp.path().join("daemon"),
        _temp: temp,
        pki,
        ca,
        server,
        client_tokens,
        admin_tokens,
        wrong_token,
    }
}

#[test]
fn tcp_without_tls_is_refused_unless_explicitly_insecure_on_loopback() {
    let setup = setup();
    let dir = s(&setup.dir);
    let plain = stela(&["serve", "--dir", dir, "--tcp", "127.0.0.1:0"]);
    assert!(!plain.status.success(), "{}", text(&plain));
    assert!(text(&plain).contains("needs TLS"), "{}", text(&plain));

    let wide = stela(&[
        "serve",
        "--dir",
        dir,
        "--tcp",
        "0.0.0.0:0",
        "--tcp-insecure",
    ]);
    assert!(!wide.status.success(), "{}", text(&wide));
    assert!(
        text(&wide).contains("only on a loopback address"),
        "{}",
        text(&wide)
    );

    // TLS without any way to authenticate clients would let anyone in.
    let (cert, key) = &setup.server;
    let open = stela(&[
        "serve",
        "--dir",
        dir,
        "--tcp",
        "127.0.0.1:0",
        "--tls-cert",
        s(cert),
        "--tls-key",
        s(key),
    ]);
    assert!(!open.status.success(), "{}", text(&open));
    assert!(
        text(&open).contains("authenticate clients"),
        "{}",
        text(&open)
    );

    // Explicitly insecure on loopback: served, with a warning; its clients are no admins.
    let mut daemon = Daemon::start(&setup.dir, &["--tcp", "127.0.0.1:0", "--tcp-insecure"]);
    let addr = tcp_addr(&mut daemon);
    wait_logged(&daemon, &["WITHOUT TLS"]);
    let status = stela(&["status", "--tcp", &addr, "--tcp-insecure"]);
    assert!(status.status.success(), "{}", text(&status));
    let power = stela(&["power-fail", "--tcp", &addr, "--tcp-insecure"]);
    assert!(!power.status.success(), "{}", text(&power));
    assert!(text(&power).contains("Forbidden"), "{}", text(&power));
    daemon.terminate();
}

/// A daemon on TCP with TLS, client and administrator tokens.
fn tls_daemon_with_tokens(setup: &Setup) -> Daemon {
    let (cert, key) = &setup.server;
    Daemon::start(
        &setup.dir,
        &[
            "--tcp",
            "127.0.0.1:0",
            "--tls-cert",
            s(cert),
            "--tls-key",
            s(key),
            "--token-file",
            s(&setup.client_tokens),
            "--admin-token-file",
            s(&setup.admin_tokens),
        ],
    )
}

#[test]
fn tokens_over_tls_authenticate_and_only_admins_administer() {
    let setup = setup();
    let mut daemon = tls_daemon_with_tokens(&setup);
    let addr = tcp_addr(&mut daemon);
    let port = addr.rsplit_once(':').unwrap().1.to_owned();
    let ca = s(&setup.ca.cert);

    // Plain TCP to the TLS port: a Hello in clear gets no Welcome, and the refusal is logged
    // with the peer's address.
    let mut raw = std::net::TcpStream::connect(&addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = Vec::new();
    stela_proto::frame::encode(
        &stela_proto::Request {
            id: 1,
            body: RequestBody::Hello {
                version: stela_proto::PROTOCOL_VERSION,
                client: "plain".into(),
                role: stela_proto::Role::Client,
                token: Some(ADMIN_TOKEN.into()),
            },
        },
        &mut hello,
    )
    .unwrap();
    let local = raw.local_addr().unwrap().to_string();
    raw.write_all(&hello).unwrap();
    let mut answer = Vec::new();
    let _ = raw.read_to_end(&mut answer);
    assert!(
        !String::from_utf8_lossy(&answer).contains("Welcome"),
        "a plaintext client was welcomed"
    );
    wait_logged(&daemon, &["TLS handshake failed", &local]);

    // TLS without a token: refused, logged, counted.
    let anonymous = stela(&["status", "--tcp", &addr, "--tls-ca", ca]);
    assert!(!anonymous.status.success(), "{}", text(&anonymous));
    assert!(
        text(&anonymous).contains("not authenticated"),
        "{}",
        text(&anonymous)
    );
    wait_logged(&daemon, &["not authenticated", "no token", "127.0.0.1:"]);

    // A wrong token (one character off): refused.
    let wrong = stela(&[
        "status",
        "--tcp",
        &addr,
        "--tls-ca",
        ca,
        "--token-file",
        s(&setup.wrong_token),
    ]);
    assert!(!wrong.status.success(), "{}", text(&wrong));
    assert!(text(&wrong).contains("wrong token"), "{}", text(&wrong));
    wait_logged(&daemon, &["not authenticated", "wrong token", "127.0.0.1:"]);

    // The certificate names localhost: a client checking another name refuses the daemon.
    let misnamed = stela(&[
        "status",
        "--tcp",
        &addr,
        "--tls-ca",
        ca,
        "--token-file",
        s(&setup.client_tokens),
        "--tls-server-name",
        "elsewhere.example",
    ]);
    assert!(!misnamed.status.success(), "{}", text(&misnamed));

    // A client token: the client commits, reads its status, but power-fail and truncate are
    // refused (Forbidden) and logged with its address.
    let client = TlsTarget::new(&format!("tls://localhost:{port}"), &setup.ca.cert)
        .unwrap()
        .token_file(&setup.client_tokens);
    let wal: Wal<String> = Wal::open(
        Address::Tls(Box::new(client.clone())),
        "orders",
        WalOptions::default().durability(Durability::Disk),
    )
    .unwrap();
    for i in 0..100 {
        let lsn = wal.append(&format!("order {i}")).unwrap();
        wal.commit(lsn).unwrap();
    }
    let records: Vec<(u64, String)> = wal
        .iter()
        .unwrap()
        .map(|r| r.map(|(lsn, rec)| (lsn.get(), rec)).unwrap())
        .collect();
    assert_eq!(records.len(), 100);
    assert_eq!(records[99].1, "order 99");
    // Megabytes each way: more than a socket buffer holds, so the daemon's TLS writes must
    // wait for the socket and go on at its next writable event.
    let big: Vec<String> = (0..64).map(|i| format!("{i:08}").repeat(8 << 10)).collect();
    for half in big.chunks(32) {
        let last = wal.append_batch(half).unwrap();
        wal.commit(last).unwrap();
    }
    let read: Vec<String> = wal
        .iter_from(stela_client::Lsn::new(101))
        .unwrap()
        .map(|r| r.unwrap().1)
        .collect();
    assert_eq!(read, big, "records read back over TLS");
    slow_reader_gets_every_answer(&port, &setup);
    let refused = wal.truncate_before(stela_client::Lsn::new(50));
    assert_eq!(
        refused.as_ref().err().and_then(|e| e.code()),
        Some(ErrorCode::Forbidden),
        "{refused:?}"
    );
    let mut conn = Connection::connect(&Address::Tls(Box::new(client))).unwrap();
    let power = conn.request(RequestBody::PowerFail);
    assert_eq!(
        power.as_ref().err().and_then(|e| e.code()),
        Some(ErrorCode::Forbidden),
        "{power:?}"
    );
    // The connection stays usable after the refusal; and a commit still works (power was
    // not failed).
    assert!(matches!(
        conn.request(RequestBody::Status),
        Ok(stela_proto::ResponseBody::Status(_))
    ));
    let lsn = wal.append(&"after the refusals".to_owned()).unwrap();
    wal.commit(lsn).unwrap();
    wait_logged(
        &daemon,
        &[
            "administrative request refused",
            "truncate",
            "tls 127.0.0.1:",
        ],
    );
    wait_logged(
        &daemon,
        &[
            "administrative request refused",
            "power-fail",
            "tls 127.0.0.1:",
        ],
    );
    let cli_power = stela(&[
        "power-fail",
        "--tcp",
        &addr,
        "--tls-ca",
        ca,
        "--token-file",
        s(&setup.client_tokens),
    ]);
    assert!(!cli_power.status.success(), "{}", text(&cli_power));
    assert!(
        text(&cli_power).contains("Forbidden"),
        "{}",
        text(&cli_power)
    );
    let status = stela(&[
        "status",
        "--tcp",
        &addr,
        "--tls-ca",
        ca,
        "--token-file",
        s(&setup.client_tokens),
    ]);
    assert!(status.status.success(), "{}", text(&status));
    assert!(text(&status).contains("orders"), "{}", text(&status));

    // The admin token: power-fail and power-restore are served, and logged with the peer.
    let admin = |command: &str| {
        stela(&[
            command,
            "--tcp",
            &addr,
            "--tls-ca",
            ca,
            "--token-file",
            s(&setup.admin_tokens),
        ])
    };
    let failed = admin("power-fail");
    assert!(failed.status.success(), "{}", text(&failed));
    let line = wait_logged(
        &daemon,
        &["administrative request", "power-fail", "identity=\"admin\""],
    );
    assert!(line.contains("tls 127.0.0.1:"), "{line}");
    let append = wal.append(&"while power fails".to_owned());
    assert_eq!(
        append.as_ref().err().and_then(|e| e.code()),
        Some(ErrorCode::PowerFailing),
        "{append:?}"
    );
    let restored = admin("power-restore");
    assert!(restored.status.success(), "{}", text(&restored));
    wait_logged(
        &daemon,
        &["administrative request", "power-restore", "tls 127.0.0.1:"],
    );

    // Over the Unix socket the peer is trusted, and logged by its uid.
    let local = stela(&["power-restore", "--dir", s(&setup.dir)]);
    assert!(local.status.success(), "{}", text(&local));
    wait_logged(
        &daemon,
        &["administrative request", "power-restore", "uid "],
    );
    assert!(lines_with(&daemon, "connection refused") >= 3);
    daemon.terminate();
}

#[test]
fn mutual_tls_identifies_clients_and_admins_and_refuses_other_cas() {
    let setup = setup();
    let (cert, key) = &setup.server;
    let pki = &setup.pki;
    let app = setup.ca.issue(pki, "app", &["app.clients.stela"]);
    let ops = setup.ca.issue(pki, "ops", &["ops.admins.stela"]);
    let stranger_ca = Ca::new(pki, "stranger-ca");
    let stranger = stranger_ca.issue(pki, "stranger", &["ops.admins.stela"]);
    let mut daemon = Daemon::start(
        &setup.dir,
        &[
            "--tcp",
            "127.0.0.1:0",
            "--tls-cert",
            s(cert),
            "--tls-key",
            s(key),
            "--tls-client-ca",
            s(&setup.ca.cert),
            "--tls-admin-name",
            "ops.admins.stela",
        ],
    );
    let addr = tcp_addr(&mut daemon);
    let ca = s(&setup.ca.cert);
    let with_cert = |command: &str, (cert, key): &(PathBuf, PathBuf)| {
        stela(&[
            command,
            "--tcp",
            &addr,
            "--tls-ca",
            ca,
            "--tls-cert",
            s(cert),
            "--tls-key",
            s(key),
        ])
    };

    // No client certificate: the handshake fails; logged with the address.
    let before = lines_with(&daemon, "TLS handshake failed");
    let none = stela(&["status", "--tcp", &addr, "--tls-ca", ca]);
    assert!(!none.status.success(), "{}", text(&none));
    wait_logged(&daemon, &["TLS handshake failed", "127.0.0.1:"]);

    // A certificate of another CA (even naming an admin): refused in the handshake.
    let foreign = with_cert("power-fail", &stranger);
    assert!(!foreign.status.success(), "{}", text(&foreign));
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines_with(&daemon, "TLS handshake failed") < before + 2 {
        assert!(Instant::now() < deadline, "{}", daemon.output());
        std::thread::sleep(Duration::from_millis(10));
    }

    // The application's certificate: a client. Status yes, power-fail no.
    let status = with_cert("status", &app);
    assert!(status.status.success(), "{}", text(&status));
    let refused = with_cert("power-fail", &app);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("Forbidden"), "{}", text(&refused));
    wait_logged(&daemon, &["administrative request refused", "power-fail"]);

    // The operator's certificate names an admin: served.
    let failed = with_cert("power-fail", &ops);
    assert!(failed.status.success(), "{}", text(&failed));
    wait_logged(
        &daemon,
        &["administrative request", "identity=\"admin\"", "power-fail"],
    );
    let restored = with_cert("power-restore", &ops);
    assert!(restored.status.success(), "{}", text(&restored));
    daemon.terminate();
}

/// A process of another user reaches the socket through the socket's group, and is refused
/// without it; through the group it is a client, not an administrator (issue 54, finding 6:
/// it ran power-fail and deleted another user's log): its power-fail and delete are refused
/// `Forbidden`, while the daemon's own user (root here) is still served. Needs root (to run
/// the client as another uid); fails, saying so, otherwise.
#[test]
fn the_socket_group_lets_another_user_in() {
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    assert!(
        root,
        "this test runs a client as another user, which needs root (the CI runs as root)"
    );
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    const GROUP: u32 = 47_211;
    const USER: u32 = 47_212;
    const OTHER_GROUP: u32 = 47_213;
    let setup = setup();
    let top = setup.dir.parent().unwrap();
    // The other user must be able to reach the socket's directory and run the binary.
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(&setup.dir).unwrap();
    std::fs::set_permissions(&setup.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let binary = top.join("stela");
    std::fs::copy(env!("CARGO_BIN_EXE_stela"), &binary).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();

    let unknown = stela(&[
        "serve",
        "--dir",
        s(&setup.dir),
        "--socket-group",
        "no-such-group-stela-test",
    ]);
    assert!(!unknown.status.success(), "{}", text(&unknown));
    assert!(
        text(&unknown).contains("no such group"),
        "{}",
        text(&unknown)
    );

    let group = GROUP.to_string();
    let daemon = Daemon::start(
        &setup.dir,
        &["--socket-group", &group, "--socket-mode", "0660"],
    );
    let socket = daemon.socket();
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.gid(), GROUP, "the socket's group");
    assert_eq!(meta.mode() & 0o777, 0o660, "the socket's mode");

    let as_user = |gid: u32, command: &str| {
        std::process::Command::new(&binary)
            .args(command.split(' '))
            .args(["--socket", s(&socket)])
            .uid(USER)
            .gid(gid)
            .output()
            .unwrap()
    };
    let member = as_user(GROUP, "status");
    assert!(member.status.success(), "{}", text(&member));
    let outsider = as_user(OTHER_GROUP, "status");
    assert!(!outsider.status.success(), "{}", text(&outsider));
    assert!(
        text(&outsider).contains("Permission denied"),
        "{}",
        text(&outsider)
    );
    // A group member is a client: its administrative requests are refused, and logged with
    // its uid.
    let victim: stela_client::Wal<String> = stela_client::Wal::open(
        socket.clone(),
        "victim",
        stela_client::WalOptions::default(),
    )
    .unwrap();
    victim.append_durable(&"kept".to_owned()).unwrap();
    drop(victim);
    for command in ["power-fail", "logs delete victim"] {
        let refused = as_user(GROUP, command);
        assert!(
            !refused.status.success(),
            "a socket-group member ran {command}: {}",
            text(&refused)
        );
        assert!(text(&refused).contains("Forbidden"), "{}", text(&refused));
    }
    wait_logged(
        &daemon,
        &[
            "administrative request refused",
            "power-fail",
            &format!("uid {USER}"),
        ],
    );
    assert!(
        setup.dir.join("logs/victim").exists(),
        "the log was deleted"
    );
    let appended = as_user(GROUP, "status");
    assert!(appended.status.success(), "{}", text(&appended));
    // The daemon's own user (root) is its administrator.
    for command in ["power-fail", "power-restore"] {
        let served = stela(&[command, "--socket", s(&socket)]);
        assert!(served.status.success(), "{command}: {}", text(&served));
    }
    daemon.terminate();
}

/// A client that pipelines reads of megabytes and reads nothing for a while: the daemon's TLS
/// writes fill the socket, wait (`WouldBlock`), and go on at the socket's writable events;
/// every answer arrives whole and in order.
fn slow_reader_gets_every_answer(port: &str, setup: &Setup) {
    use stela_net::tls::{self, rustls, ClientTlsFiles};
    use stela_proto::frame::{self, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
    use stela_proto::{Request, Response, ResponseBody};
    let config = tls::client_config(&ClientTlsFiles {
        ca: setup.ca.cert.clone(),
        identity: None,
    })
    .unwrap();
    let tcp = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    let tls =
        rustls::ClientConnection::new(config, tls::server_name("localhost").unwrap()).unwrap();
    let mut stream = rustls::StreamOwned::new(tls, tcp);
    let send = |requests: Vec<RequestBody>, first_id: u64| {
        let mut out = Vec::new();
        for (i, body) in requests.into_iter().enumerate() {
            frame::encode(
                &Request {
                    id: first_id + i as u64,
                    body,
                },
                &mut out,
            )
            .unwrap();
        }
        out
    };
    const READS: u64 = 8;
    let mut out = send(
        vec![
            RequestBody::Hello {
                version: stela_proto::PROTOCOL_VERSION,
                client: "slow reader".into(),
                role: stela_proto::Role::Client,
                token: Some(CLIENT_TOKEN.into()),
            },
            RequestBody::Open {
                log: "orders".into(),
                codec: "msgpack".into(),
                type_tag: std::any::type_name::<String>().into(),
                create: false,
                durability: None,
                schema: None,
            },
        ],
        1,
    );
    out.extend(send(
        (0..READS)
            .map(|_| RequestBody::Read {
                handle: 0,
                from: 101,
                max_records: 1 << 20,
                max_bytes: 16 << 20,
            })
            .collect(),
        3,
    ));
    stream.write_all(&out).unwrap();
    stream.flush().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    for id in 1..3 + READS {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        stream.read_exact(&mut header).unwrap();
        let header = frame::parse_header(header, MAX_FRAME_BYTES).unwrap();
        let mut body = vec![0u8; header.body_len];
        stream.read_exact(&mut body).unwrap();
        let response: Response = frame::decode_body(header, &body).unwrap();
        assert_eq!(response.id, id);
        if id >= 3 {
            match response.body {
                // A read answers with as many records as fit in 1 MiB (docs/DAEMON.md, "Fair
                // writing"; these are a little over 64 KiB each once encoded): about 8 MiB in
                // all, still far more than the socket holds.
                ResponseBody::Records { records, .. } => {
                    let each = records[0].1 .0.len();
                    assert_eq!(records.len(), (1 << 20) / each, "answer {id}");
                }
                other => panic!("answer {id}: {other:?}"),
            }
        }
    }
}

/// Token rotation: with the daemon started from a config file, SIGHUP reads the token files
/// again; the old token is refused from then on and the new one accepted, without a restart.
#[test]
fn sighup_rotates_the_tokens() {
    let setup = setup();
    let (cert, key) = &setup.server;
    let config = setup.pki.join("stela.toml");
    std::fs::write(
        &config,
        format!(
            "tcp = \"127.0.0.1:0\"\ntls-cert = {:?}\ntls-key = {:?}\ntoken-file = {:?}\n",
            s(cert),
            s(key),
            s(&setup.client_tokens)
        ),
    )
    .unwrap();
    let mut daemon = Daemon::start(&setup.dir, &["--config", s(&config)]);
    let addr = tcp_addr(&mut daemon);
    let ca = s(&setup.ca.cert);
    let status_with = |tokens: &Path| {
        stela(&[
            "status",
            "--tcp",
            &addr,
            "--tls-ca",
            ca,
            "--token-file",
            s(tokens),
        ])
    };
    let before = status_with(&setup.client_tokens);
    assert_eq!(before.status.code(), Some(0), "{}", text(&before));

    // Rotate: the client token file now holds another token.
    let old = setup.pki.join("old.token");
    std::fs::copy(&setup.client_tokens, &old).unwrap();
    stela_testkit::write_secret(&setup.client_tokens, "rotated-client-token-0123456789\n");
    // SAFETY: signalling our own child process by its pid.
    unsafe {
        libc::kill(daemon.child.id() as i32, libc::SIGHUP);
    }
    wait_logged(&daemon, &["tokens: token files read again (applied)"]);
    let refused = status_with(&old);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("wrong token"), "{}", text(&refused));
    let accepted = status_with(&setup.client_tokens);
    assert_eq!(accepted.status.code(), Some(0), "{}", text(&accepted));
    daemon.terminate();
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Issue 54: a world-readable admin token file was accepted. A token file or a TLS key that
/// group or others may read is refused at start, and at a SIGHUP reload (the running tokens
/// stay), with its path and mode in the error.
#[test]
fn credentials_others_may_read_are_refused_at_start_and_at_reload() {
    let setup = setup();
    let (cert, key) = &setup.server;
    let serve = |key: &Path, admin_tokens: &Path| {
        stela(&[
            "serve",
            "--dir",
            s(&setup.dir),
            "--assume-write-rate",
            "500000000",
            "--tcp",
            "127.0.0.1:0",
            "--tls-cert",
            s(cert),
            "--tls-key",
            s(key),
            "--admin-token-file",
            s(admin_tokens),
        ])
    };
    chmod(&setup.admin_tokens, 0o644);
    let tokens_open = serve(key, &setup.admin_tokens);
    assert!(!tokens_open.status.success(), "{}", text(&tokens_open));
    for what in [s(&setup.admin_tokens), "0644", "others"] {
        assert!(text(&tokens_open).contains(what), "{}", text(&tokens_open));
    }
    chmod(&setup.admin_tokens, 0o600);
    chmod(key, 0o660);
    let key_open = serve(key, &setup.admin_tokens);
    assert!(!key_open.status.success(), "{}", text(&key_open));
    for what in [s(key), "0660", "group"] {
        assert!(text(&key_open).contains(what), "{}", text(&key_open));
    }
    chmod(key, 0o600);

    let config = setup.pki.join("stela.toml");
    std::fs::write(
        &config,
        format!(
            "tcp = \"127.0.0.1:0\"\ntls-cert = {:?}\ntls-key = {:?}\ntoken-file = {:?}\n",
            s(cert),
            s(key),
            s(&setup.client_tokens)
        ),
    )
    .unwrap();
    let mut daemon = Daemon::start(&setup.dir, &["--config", s(&config)]);
    let addr = tcp_addr(&mut daemon);
    // The client's own copy of the token, private (the client refuses an open one too).
    let client_copy = setup.pki.join("client-copy.tokens");
    stela_testkit::write_secret(&client_copy, format!("{CLIENT_TOKEN}\n"));
    chmod(&setup.client_tokens, 0o644);
    // SAFETY: signalling our own child process by its pid.
    unsafe {
        libc::kill(daemon.child.id() as i32, libc::SIGHUP);
    }
    wait_logged(&daemon, &[s(&setup.client_tokens), "0644"]);
    let status = stela(&[
        "status",
        "--tcp",
        &addr,
        "--tls-ca",
        s(&setup.ca.cert),
        "--token-file",
        s(&client_copy),
    ]);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    daemon.terminate();
}

/// Certificate rotation: with the daemon started from a config file, SIGHUP reads its
/// certificate and key again (replaced in place, here by one from another CA); new clients get
/// the new certificate, a client trusting only the old CA is refused, a session set up before
/// goes on, and a certificate whose key is not (yet) in place is reported and not applied.
#[test]
fn sighup_rotates_the_certificate() {
    let setup = setup();
    let next_ca = Ca::new(&setup.pki, "stela-next-ca");
    let next = next_ca.issue(&setup.pki, "daemon-next", &["localhost", "127.0.0.1"]);
    let (cert, key) = (setup.pki.join("live.pem"), setup.pki.join("live.key"));
    std::fs::copy(&setup.server.0, &cert).unwrap();
    std::fs::copy(&setup.server.1, &key).unwrap();
    let config = setup.pki.join("stela.toml");
    std::fs::write(
        &config,
        format!(
            "tcp = \"127.0.0.1:0\"\ntls-cert = {:?}\ntls-key = {:?}\ntoken-file = {:?}\n",
            s(&cert),
            s(&key),
            s(&setup.client_tokens)
        ),
    )
    .unwrap();
    let mut daemon = Daemon::start(&setup.dir, &["--config", s(&config)]);
    let addr = tcp_addr(&mut daemon);
    let port = addr.rsplit_once(':').unwrap().1.to_owned();
    let status_trusting = |ca: &Path| {
        stela(&[
            "status",
            "--tcp",
            &addr,
            "--tls-ca",
            s(ca),
            "--token-file",
            s(&setup.client_tokens),
        ])
    };
    let before = status_trusting(&setup.ca.cert);
    assert_eq!(before.status.code(), Some(0), "{}", text(&before));
    let early = status_trusting(&next_ca.cert);
    assert!(!early.status.success(), "{}", text(&early));
    let mut established = Connection::connect(&Address::Tls(Box::new(
        TlsTarget::new(&format!("tls://localhost:{port}"), &setup.ca.cert)
            .unwrap()
            .token_file(&setup.client_tokens),
    )))
    .unwrap();

    std::fs::copy(&next.0, &cert).unwrap();
    std::fs::copy(&next.1, &key).unwrap();
    // SAFETY: signalling our own child process by its pid.
    unsafe {
        libc::kill(daemon.child.id() as i32, libc::SIGHUP);
    }
    wait_logged(&daemon, &["SIGHUP reload: TLS: certificate", "(applied)"]);
    let after = status_trusting(&next_ca.cert);
    assert_eq!(after.status.code(), Some(0), "{}", text(&after));
    let old = status_trusting(&setup.ca.cert);
    assert!(!old.status.success(), "{}", text(&old));
    assert!(
        matches!(
            established.request(RequestBody::Status),
            Ok(stela_proto::ResponseBody::Status(_))
        ),
        "the session set up before the rotation goes on"
    );

    // The old certificate back without its key: not applied, the new one stays.
    std::fs::copy(&setup.server.0, &cert).unwrap();
    // SAFETY: as above.
    unsafe {
        libc::kill(daemon.child.id() as i32, libc::SIGHUP);
    }
    wait_logged(&daemon, &["SIGHUP reload: TLS: NOT applied"]);
    let kept = status_trusting(&next_ca.cert);
    assert_eq!(kept.status.code(), Some(0), "{}", text(&kept));
    daemon.terminate();
}

/// `AsyncWal` speaks TLS with a token as the blocking client does: it commits through a TLS
/// daemon, and a wrong token is refused.
#[test]
fn the_async_client_speaks_tls() {
    let setup = setup();
    let (cert, key) = &setup.server;
    let mut daemon = Daemon::start(
        &setup.dir,
        &[
            "--tcp",
            "127.0.0.1:0",
            "--tls-cert",
            s(cert),
            "--tls-key",
            s(key),
            "--token-file",
            s(&setup.client_tokens),
        ],
    );
    let addr = tcp_addr(&mut daemon);
    let port = addr.rsplit_once(':').unwrap().1.to_owned();
    let target = |tokens: &Path| {
        TlsTarget::new(&format!("tls://localhost:{port}"), &setup.ca.cert)
            .unwrap()
            .token_file(tokens)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let wal: stela_client::AsyncWal<String> = stela_client::AsyncWal::open(
            stela_client::Address::Tls(Box::new(target(&setup.client_tokens))),
            "async-tls",
            stela_client::WalOptions::default(),
        )
        .await
        .unwrap();
        let lsn = wal.append_durable(&"over tls".to_owned()).await.unwrap();
        wal.commit_at(lsn, stela_client::Durability::Disk)
            .await
            .unwrap();
        let mut records = wal.iter();
        let first = records.next().await.unwrap().unwrap();
        assert_eq!(first.1, "over tls");
        wal.close().await.unwrap();

        let refused = stela_client::AsyncWal::<String>::open(
            stela_client::Address::Tls(Box::new(target(&setup.wrong_token))),
            "async-tls",
            stela_client::WalOptions::default(),
        )
        .await;
        let error = refused.expect_err("a wrong token was let in");
        assert!(error.to_string().contains("wrong token"), "{error}");
    });
    daemon.terminate();
}

/// A flood of connection attempts that send nothing, from the address real clients use too
/// (loopback), must not keep real TLS logins out: the handshake slots they fill are given up
/// first. On the daemon of 40e0404, which closed the oldest handshake whatever it was doing,
/// 3 of 13 real logins got through such a flood.
#[test]
fn a_flood_of_silent_connections_lets_real_logins_through() {
    let setup = setup();
    let mut daemon = tls_daemon_with_tokens(&setup);
    let addr = tcp_addr(&mut daemon);
    let port = addr.rsplit_once(':').unwrap().1.to_owned();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let made = std::sync::atomic::AtomicUsize::new(0);
    let (logins, flooded) = std::thread::scope(|scope| {
        // Four threads keep connecting, a few hundred sockets held by each at a time, none
        // saying anything: thousands of attempts a second, so that many arrive while a real
        // login is in its TLS handshake.
        let floods: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let mut held = std::collections::VecDeque::new();
                    let target: std::net::SocketAddr = addr.parse().unwrap();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let attempt = std::net::TcpStream::connect_timeout(
                            &target,
                            Duration::from_millis(200),
                        );
                        if let Ok(socket) = attempt {
                            held.push_back(socket);
                            made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        if held.len() > 250 {
                            held.pop_front();
                        }
                    }
                })
            })
            .collect();
        // The handshake slots (64) are full of silent connections before the first login.
        let deadline = Instant::now() + Duration::from_secs(30);
        while made.load(std::sync::atomic::Ordering::Relaxed) < 200 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let client = TlsTarget::new(&format!("tls://localhost:{port}"), &setup.ca.cert)
            .unwrap()
            .token_file(&setup.client_tokens);
        // Failures are collected, not panicked on: the flood must be stopped first.
        let logins: Vec<Result<(), String>> = (0..13)
            .map(|_| {
                let mut conn = Connection::connect(&Address::Tls(Box::new(client.clone())))
                    .map_err(|e| format!("login: {e}"))?;
                conn.request(RequestBody::Status)
                    .map(drop)
                    .map_err(|e| format!("status: {e:?}"))
            })
            .collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for flood in floods {
            flood.join().unwrap();
        }
        (logins, made.load(std::sync::atomic::Ordering::Relaxed))
    });
    let failed: Vec<&String> = logins.iter().filter_map(|r| r.as_ref().err()).collect();
    eprintln!(
        "{} of 13 real logins through a flood of {flooded} silent connections",
        13 - failed.len()
    );
    assert!(
        failed.is_empty(),
        "real logins refused during the flood: {failed:?}"
    );
    assert!(flooded >= 200, "the flood made only {flooded} connections");
    daemon.assert_alive("after a flood of silent connections");
    daemon.terminate();
}

/// `stela cluster list` reaches nodes served over TLS (`tls://HOST:PORT` with `--tls-ca`), with
/// a token or a client certificate; without a credential the node is listed unreachable (the
/// login is refused), and a tls:// node without `--tls-ca` is an error naming the flag.
#[test]
fn cluster_list_reaches_tls_nodes_with_a_token_or_a_certificate() {
    let setup = setup();
    let (cert, key) = &setup.server;
    let client_ca = setup.ca.cert.clone();
    let (client_cert, client_key) = setup.ca.issue(&setup.pki, "ops", &["ops"]);
    let mut daemon = Daemon::start(
        &setup.dir,
        &[
            "--tcp",
            "127.0.0.1:0",
            "--tls-cert",
            s(cert),
            "--tls-key",
            s(key),
            "--tls-client-ca",
            s(&client_ca),
            "--token-file",
            s(&setup.client_tokens),
        ],
    );
    let node = format!("tls://{}", tcp_addr(&mut daemon));
    let ca = s(&setup.ca.cert);
    let list = |more: &[&str]| stela(&[&["cluster", "list", "--node", &node][..], more].concat());

    for credential in [
        &["--token-file", s(&setup.client_tokens)][..],
        &["--tls-cert", s(&client_cert), "--tls-key", s(&client_key)][..],
    ] {
        let listed = list(&[&["--tls-ca", ca][..], credential].concat());
        assert_eq!(listed.status.code(), Some(0), "{}", text(&listed));
        let row = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .find(|l| l.contains(&node))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no row for {node}: {}", text(&listed)));
        // A daemon outside a failover pair: it answered, with its own health.
        assert!(row.contains("no pair"), "{row}");
        assert!(row.ends_with(" ok"), "{row}");
    }

    let anonymous = list(&["--tls-ca", ca]);
    assert_eq!(anonymous.status.code(), Some(0), "{}", text(&anonymous));
    assert!(
        text(&anonymous).contains("unreachable"),
        "{}",
        text(&anonymous)
    );
    let wrong = list(&["--tls-ca", ca, "--token-file", s(&setup.wrong_token)]);
    assert!(text(&wrong).contains("unreachable"), "{}", text(&wrong));

    let no_ca = list(&[]);
    assert!(!no_ca.status.success(), "{}", text(&no_ca));
    assert!(text(&no_ca).contains("--tls-ca"), "{}", text(&no_ca));
    daemon.terminate();
}
