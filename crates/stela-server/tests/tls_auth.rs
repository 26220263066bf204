//! Authentication of TCP peers, counted: every peer refused for failing it (not TLS at all, no
//! token, a wrong token) adds one to `Server::refused_logins`, and an authenticated client adds
//! nothing. And what a reload (`Server::reload`, SIGHUP's) changes for the connections that
//! come next: the certificate, key and client CA, and the connection limit. In process, with a
//! raw rustls client (the black-box tests of the same rules, with their logging, are in
//! crates/stela-cli/tests/security.rs and reload.rs).

mod common;

use common::NoHang;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use stela_net::tls::{self, rustls, ClientTlsFiles, ServerTlsFiles};
use stela_proto::frame::{self, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
use stela_proto::{ErrorCode, Request, RequestBody, Response, ResponseBody, Role};
use stela_server::{DaemonConfig, Server};

const TOKEN: &str = "a-client-token-of-some-length";

type TlsClient = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// Over TLS, trusting `ca` and presenting `identity` (certificate and key files) if given,
/// sends a Hello with `token`: the session and the daemon's answer, or the I/O error (a
/// handshake refused by either side).
fn tls_session(
    port: u16,
    ca: &std::path::Path,
    identity: Option<(&std::path::Path, &std::path::Path)>,
    token: Option<&str>,
) -> std::io::Result<(TlsClient, ResponseBody)> {
    let config = tls::client_config(&ClientTlsFiles {
        ca: ca.to_owned(),
        identity: identity.map(|(cert, key)| (cert.to_owned(), key.to_owned())),
    })
    .unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let connection =
        rustls::ClientConnection::new(config, tls::server_name("localhost").unwrap()).unwrap();
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    let answer = ask(
        &mut stream,
        1,
        RequestBody::Hello {
            version: stela_proto::PROTOCOL_VERSION,
            client: "tls_auth".into(),
            role: Role::Client,
            token: token.map(str::to_owned),
        },
    )?;
    Ok((stream, answer))
}

/// Sends a Hello (with `token`) over TLS and returns the daemon's answer, or the I/O error.
fn hello_over_tls(
    port: u16,
    ca: &std::path::Path,
    token: Option<&str>,
) -> std::io::Result<ResponseBody> {
    tls_session(port, ca, None, token).map(|(_, answer)| answer)
}

/// Sends request `id` on `stream` and reads its answer.
fn ask(
    stream: &mut (impl Read + Write),
    id: u64,
    body: RequestBody,
) -> std::io::Result<ResponseBody> {
    let mut out = Vec::new();
    frame::encode(&Request { id, body }, &mut out).unwrap();
    stream.write_all(&out)?;
    stream.flush()?;
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header)?;
    let header = frame::parse_header(header, MAX_FRAME_BYTES).unwrap();
    let mut body = vec![0u8; header.body_len];
    stream.read_exact(&mut body)?;
    let response: Response = frame::decode_body(header, &body).unwrap();
    // Refusals of a connection answer with id 0.
    if !matches!(response.body, ResponseBody::Error { .. }) {
        assert_eq!(response.id, id, "{response:?}");
    }
    Ok(response.body)
}

fn wait_for(server: &Server, refused: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.refused_logins() < refused {
        assert!(
            Instant::now() < deadline,
            "refused logins: {} (expected {refused})",
            server.refused_logins()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(server.refused_logins(), refused);
}

#[test]
fn refused_logins_are_counted_and_authenticated_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (cert_path, key_path, tokens) = (
        dir.path().join("cert.pem"),
        dir.path().join("key.pem"),
        dir.path().join("tokens"),
    );
    std::fs::write(&cert_path, cert.pem()).unwrap();
    stela_testkit::write_secret(&key_path, key.serialize_pem());
    stela_testkit::write_secret(&tokens, format!("{TOKEN}\n"));

    let mut config = DaemonConfig::new(dir.path().join("daemon"));
    config.assume_write_rate = Some(500_000_000);
    config.tcp = Some("127.0.0.1:0".parse().unwrap());
    config.tls = Some(ServerTlsFiles {
        cert: cert_path.clone(),
        key: key_path,
        client_ca: None,
    });
    config.token_file = Some(tokens);
    let server = NoHang::new(Server::start(config).unwrap());
    let port = server.tcp_addr().unwrap().port();
    assert_eq!(server.refused_logins(), 0);

    // Authenticated: welcomed, not counted.
    let welcome = hello_over_tls(port, &cert_path, Some(TOKEN)).unwrap();
    assert!(
        matches!(welcome, ResponseBody::Welcome { .. }),
        "{welcome:?}"
    );

    // Not TLS at all.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let _ = plain.read_to_end(&mut Vec::new());
    wait_for(&server, 1);

    // TLS, no token; then a wrong one.
    for (token, refused) in [(None, 2), (Some("a-client-token-of-some-lengtH"), 3)] {
        match hello_over_tls(port, &cert_path, token).unwrap() {
            ResponseBody::Error { code, message } => {
                assert_eq!(code, ErrorCode::Unauthenticated, "{message}")
            }
            other => panic!("{token:?} was answered {other:?}"),
        }
        wait_for(&server, refused);
    }
    let welcome = hello_over_tls(port, &cert_path, Some(TOKEN)).unwrap();
    assert!(matches!(welcome, ResponseBody::Welcome { .. }));
    assert_eq!(server.refused_logins(), 3);
    server.shutdown().unwrap();
}

/// A self-signed certificate for localhost / 127.0.0.1, named `name`: its files (the
/// certificate file is also the CA that trusts it) and its PEM text.
use stela_testkit::SelfSigned;

fn self_signed(dir: &std::path::Path, name: &str) -> SelfSigned {
    stela_testkit::self_signed(dir, name)
}

fn applied(said: &[String], prefix: &str) -> bool {
    said.iter()
        .any(|l| l.starts_with(prefix) && l.ends_with("(applied)"))
}

/// SIGHUP's reload (`Server::reload`) rotates the daemon's certificate, key and client CA:
/// new connections get the new ones (a client trusting only the old certificate is refused, a
/// client certificate from the old CA too), the session set up before goes on, and files that
/// do not load (a certificate without its key, not a certificate at all) are reported and
/// leave the running configuration in place.
#[test]
fn a_reload_rotates_the_certificate_key_and_client_ca_for_new_connections_only() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b, c] = ["a", "b", "c"].map(|name| self_signed(dir.path(), name));
    // Client certificates, each its own CA.
    let [x, y] = ["client-x", "client-y"].map(|name| self_signed(dir.path(), name));
    let (cert_path, key_path, client_ca, tokens) = (
        dir.path().join("cert.pem"),
        dir.path().join("key.pem"),
        dir.path().join("client-ca.pem"),
        dir.path().join("tokens"),
    );
    std::fs::write(&cert_path, &a.cert_pem).unwrap();
    stela_testkit::write_secret(&key_path, &a.key_pem);
    std::fs::write(&client_ca, &x.cert_pem).unwrap();
    stela_testkit::write_secret(&tokens, format!("{TOKEN}\n"));
    let mut config = DaemonConfig::new(dir.path().join("daemon"));
    config.assume_write_rate = Some(500_000_000);
    config.tcp = Some("127.0.0.1:0".parse().unwrap());
    config.tls = Some(ServerTlsFiles {
        cert: cert_path.clone(),
        key: key_path.clone(),
        client_ca: Some(client_ca.clone()),
    });
    // With tokens, a client certificate is optional; one that does not verify is refused.
    config.token_file = Some(tokens);
    let server = NoHang::new(Server::start(config.clone()).unwrap());
    let port = server.tcp_addr().unwrap().port();
    let session = |ca: &SelfSigned, identity: Option<&SelfSigned>| {
        tls_session(
            port,
            &ca.cert,
            identity.map(|i| (i.cert.as_path(), i.key.as_path())),
            Some(TOKEN),
        )
    };
    let welcomed = |ca: &SelfSigned, identity: Option<&SelfSigned>| {
        matches!(session(ca, identity), Ok((_, ResponseBody::Welcome { .. })))
    };
    let (mut established, answer) = session(&a, Some(&x)).unwrap();
    assert!(matches!(answer, ResponseBody::Welcome { .. }), "{answer:?}");
    assert!(session(&b, None).is_err(), "B is not served yet");
    assert!(!welcomed(&a, Some(&y)), "Y is not from the client CA yet");

    // Rotate all three files.
    std::fs::write(&cert_path, &b.cert_pem).unwrap();
    stela_testkit::write_secret(&key_path, &b.key_pem);
    std::fs::write(&client_ca, &y.cert_pem).unwrap();
    let said = server.reload(&config);
    assert!(applied(&said, "TLS: certificate"), "{said:?}");
    assert!(welcomed(&b, None), "the new certificate is served");
    assert!(welcomed(&b, Some(&y)), "the new client CA is trusted");
    assert!(
        !welcomed(&b, Some(&x)),
        "a client certificate from the old client CA is refused"
    );
    let old = session(&a, None);
    assert!(
        old.is_err(),
        "a client trusting only the old certificate is refused: {:?}",
        old.map(|(_, answer)| answer)
    );
    // The session set up under A goes on.
    let answer = ask(&mut established, 2, RequestBody::ListLogs).unwrap();
    assert!(matches!(answer, ResponseBody::Logs(_)), "{answer:?}");

    // A rotation half done (C's certificate, B's key still there): not applied, B still served.
    std::fs::write(&cert_path, &c.cert_pem).unwrap();
    let said = server.reload(&config);
    assert!(
        said.iter().any(|l| l.starts_with("TLS: NOT applied")),
        "{said:?}"
    );
    assert!(welcomed(&b, Some(&y)));
    assert!(session(&c, None).is_err());
    // Not a certificate at all: the same.
    std::fs::write(&cert_path, "not a certificate").unwrap();
    let said = server.reload(&config);
    assert!(
        said.iter().any(|l| l.starts_with("TLS: NOT applied")),
        "{said:?}"
    );
    assert!(welcomed(&b, Some(&y)));
    // Both files of C in place: applied.
    std::fs::write(&cert_path, &c.cert_pem).unwrap();
    stela_testkit::write_secret(&key_path, &c.key_pem);
    let said = server.reload(&config);
    assert!(applied(&said, "TLS: certificate"), "{said:?}");
    assert!(welcomed(&c, Some(&y)) && session(&b, None).is_err());
    let answer = ask(&mut established, 3, RequestBody::ListLogs).unwrap();
    assert!(matches!(answer, ResponseBody::Logs(_)), "{answer:?}");
    drop(established);
    server.shutdown().unwrap();
}

/// A Hello with `role` on a new connection to the Unix socket; the daemon's answer.
fn hello_on(socket: &std::path::Path, role: Role) -> ResponseBody {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    ask(
        &mut stream,
        1,
        RequestBody::Hello {
            version: stela_proto::PROTOCOL_VERSION,
            client: "tls_auth".into(),
            role,
            token: None,
        },
    )
    .unwrap()
}

/// A reload lowers the connection limit: the connections already served keep working, the
/// next client beyond the new limit is refused with `TooManyConnections` (administrators still
/// have their reserve), and raising it again lets clients in. The file limit found at start
/// still caps what a reload asks for.
#[test]
fn a_reload_lowers_the_connection_limit_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DaemonConfig::new(dir.path().join("daemon"));
    config.assume_write_rate = Some(500_000_000);
    config.max_connections = 3;
    let server = NoHang::new(Server::start(config.clone()).unwrap());
    let socket = server.socket_path().to_owned();
    let mut first = common::RawClient::connect(&socket);
    let mut second = common::RawClient::connect(&socket);
    let (h1, h2) = (first.open("one"), second.open("two"));

    let mut lowered = config.clone();
    lowered.max_connections = 1;
    let said = server.reload(&lowered);
    assert!(applied(&said, "max-connections = 1 "), "{said:?}");
    assert_eq!(server.status().max_connections, 1);
    match hello_on(&socket, Role::Client) {
        ResponseBody::Error {
            code: ErrorCode::TooManyConnections,
            message,
        } => assert!(message.contains("at most 1 connections"), "{message}"),
        other => panic!("a client beyond the lowered limit got {other:?}"),
    }
    assert!(
        matches!(hello_on(&socket, Role::Admin), ResponseBody::Welcome { .. }),
        "administrators keep their reserve"
    );
    // The two served before the reload (one more than the limit now) go on.
    for (client, handle) in [(&mut first, h1), (&mut second, h2)] {
        client
            .append(
                handle,
                stela_proto::Durability::Disk,
                &[common::rec(1, 1, 10)],
            )
            .expect("an established connection is still served");
    }
    // One of the two gone: still at the limit. Both gone: room again.
    let connections_fall_to = |n: u32| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while server.status().connections > n {
            assert!(
                Instant::now() < deadline,
                "{:?}",
                server.status().connections
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    drop(first);
    connections_fall_to(1);
    assert!(matches!(
        hello_on(&socket, Role::Client),
        ResponseBody::Error {
            code: ErrorCode::TooManyConnections,
            ..
        }
    ));
    drop(second);
    connections_fall_to(0);
    assert!(matches!(
        hello_on(&socket, Role::Client),
        ResponseBody::Welcome { .. }
    ));

    // Raised: clients are let in up to the new limit; the file limit still caps it.
    let mut raised = config.clone();
    raised.max_connections = 5;
    assert!(applied(&server.reload(&raised), "max-connections = 5 "));
    let clients: Vec<_> = (0..5)
        .map(|_| common::RawClient::connect(&socket))
        .collect();
    assert!(matches!(
        hello_on(&socket, Role::Client),
        ResponseBody::Error {
            code: ErrorCode::TooManyConnections,
            ..
        }
    ));
    drop(clients);
    let file_limit = server.status().file_limit;
    raised.max_connections = usize::MAX / 2;
    let said = server.reload(&raised);
    let capped = stela_server::limits::limits(file_limit, raised.max_connections, 8).clients;
    assert!(
        applied(&said, &format!("max-connections = {capped} ")) && (capped as u64) < file_limit,
        "{said:?}"
    );

    // A limit `check` refuses (zero) is not applied at all.
    raised.max_connections = 0;
    let said = server.reload(&raised);
    assert!(
        said.len() == 1 && said[0].starts_with("NOT applied"),
        "{said:?}"
    );
    assert_eq!(server.status().max_connections as usize, capped);
    server.shutdown().unwrap();
}
