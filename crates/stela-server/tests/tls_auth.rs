//! Authentication of TCP peers, counted: every peer refused for failing it (not TLS at all, no
//! token, a wrong token) adds one to `Server::refused_logins`, and an authenticated client adds
//! nothing. In process, with a raw rustls client (the black-box tests of the same rules, with
//! their logging, are in crates/stela-cli/tests/security.rs).

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

/// Sends a Hello (with `token`) over TLS and returns the daemon's answer, or the I/O error.
fn hello_over_tls(
    port: u16,
    ca: &std::path::Path,
    token: Option<&str>,
) -> std::io::Result<ResponseBody> {
    let config = tls::client_config(&ClientTlsFiles {
        ca: ca.to_owned(),
        identity: None,
    })
    .unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let connection =
        rustls::ClientConnection::new(config, tls::server_name("localhost").unwrap()).unwrap();
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    let mut out = Vec::new();
    frame::encode(
        &Request {
            id: 1,
            body: RequestBody::Hello {
                version: stela_proto::PROTOCOL_VERSION,
                client: "tls_auth".into(),
                role: Role::Client,
                token: token.map(str::to_owned),
            },
        },
        &mut out,
    )
    .unwrap();
    stream.write_all(&out)?;
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header)?;
    let header = frame::parse_header(header, MAX_FRAME_BYTES).unwrap();
    let mut body = vec![0u8; header.body_len];
    stream.read_exact(&mut body)?;
    let response: Response = frame::decode_body(header, &body).unwrap();
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
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();

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

fn self_signed(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    let cert = params.self_signed(&key).unwrap();
    let ca = dir.join(format!("{name}.pem"));
    std::fs::write(&ca, cert.pem()).unwrap();
    (ca, cert.pem(), key.serialize_pem())
}

/// SIGHUP's reload (`Server::reload`) rotates the certificate: new connections are served with
/// the new one, a client that trusts only the old one is refused, and files that do not load
/// leave the running certificate in place. The connection limit is lowered the same way: the
/// next connection beyond it gets `TooManyConnections`, the ones already in keep working.
#[test]
fn a_reload_rotates_the_certificate_and_changes_the_connection_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_a, cert_a, key_a) = self_signed(dir.path(), "a");
    let (ca_b, cert_b, key_b) = self_signed(dir.path(), "b");
    let (cert_path, key_path, tokens) = (
        dir.path().join("cert.pem"),
        dir.path().join("key.pem"),
        dir.path().join("tokens"),
    );
    std::fs::write(&cert_path, &cert_a).unwrap();
    std::fs::write(&key_path, &key_a).unwrap();
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();
    let mut config = DaemonConfig::new(dir.path().join("daemon"));
    config.assume_write_rate = Some(500_000_000);
    config.tcp = Some("127.0.0.1:0".parse().unwrap());
    config.tls = Some(ServerTlsFiles {
        cert: cert_path.clone(),
        key: key_path.clone(),
        client_ca: None,
    });
    config.token_file = Some(tokens);
    let server = NoHang::new(Server::start(config.clone()).unwrap());
    let port = server.tcp_addr().unwrap().port();
    let welcomed = |ca: &std::path::Path| {
        matches!(
            hello_over_tls(port, ca, Some(TOKEN)),
            Ok(ResponseBody::Welcome { .. })
        )
    };
    assert!(welcomed(&ca_a) && !welcomed(&ca_b));

    std::fs::write(&cert_path, &cert_b).unwrap();
    std::fs::write(&key_path, &key_b).unwrap();
    let said = server.reload(&config);
    assert!(
        said.iter()
            .any(|l| l.starts_with("TLS: certificate") && l.ends_with("(applied)")),
        "{said:?}"
    );
    assert!(welcomed(&ca_b), "the new certificate is served");
    assert!(
        !welcomed(&ca_a),
        "a client trusting only the old one is refused"
    );

    // A broken certificate file: the reload says so and the running one stays.
    std::fs::write(&cert_path, "not a certificate").unwrap();
    let said = server.reload(&config);
    assert!(
        said.iter().any(|l| l.starts_with("TLS: NOT applied")),
        "{said:?}"
    );
    assert!(welcomed(&ca_b));

    // Lower the connection limit to one: one client in, the next refused, the first still
    // served.
    let mut limited = config.clone();
    limited.max_connections = 1;
    let said = server.reload(&limited);
    assert!(
        said.iter().any(|l| l.starts_with("max-connections = 1 ")),
        "{said:?}"
    );
    let mut first = common::RawClient::connect(server.socket_path());
    let refused = std::os::unix::net::UnixStream::connect(server.socket_path()).unwrap();
    let answer = raw_hello(refused);
    assert!(
        matches!(
            &answer,
            ResponseBody::Error {
                code: ErrorCode::TooManyConnections,
                ..
            }
        ),
        "{answer:?}"
    );
    let handle = first.open("still-served");
    assert!(first.positions(handle).last_lsn == 0);
    drop(first);
    server.shutdown().unwrap();
}

/// A Hello on `stream`; the daemon's answer.
fn raw_hello(mut stream: std::os::unix::net::UnixStream) -> ResponseBody {
    let mut out = Vec::new();
    frame::encode(
        &Request {
            id: 1,
            body: RequestBody::Hello {
                version: stela_proto::PROTOCOL_VERSION,
                client: "tls_auth".into(),
                role: Role::Client,
                token: None,
            },
        },
        &mut out,
    )
    .unwrap();
    stream.write_all(&out).unwrap();
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let header = frame::parse_header(header, MAX_FRAME_BYTES).unwrap();
    let mut body = vec![0u8; header.body_len];
    stream.read_exact(&mut body).unwrap();
    let response: Response = frame::decode_body(header, &body).unwrap();
    response.body
}
