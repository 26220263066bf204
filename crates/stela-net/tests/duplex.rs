//! `stela_net::duplex`: a TLS connection read by one thread while another writes, over
//! loopback with a certificate made here: every byte arrives in order both ways while both
//! directions run at once, a client that does not trust the server's certificate gets the
//! handshake's error, closing one direction is end of stream at the other end while the other
//! direction goes on, and dropping both ends still sends what was queued.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;
use stela_net::duplex::{duplex, DuplexReader, DuplexWriter};
use stela_net::tls::{self, rustls, ClientTlsFiles, ServerTlsFiles};

fn certificate(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let made = stela_testkit::self_signed(dir, name);
    (made.cert, made.key)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A TLS server on loopback with a certificate made in `dir`: its address, its certificate, and
/// the thread that accepts one connection and returns its two ends (or the handshake's error).
fn serve(
    dir: &std::path::Path,
) -> (
    std::net::SocketAddr,
    std::path::PathBuf,
    std::thread::JoinHandle<std::io::Result<(DuplexReader, DuplexWriter)>>,
) {
    let (cert, key) = certificate(dir, "server");
    let server_config = tls::server_config(
        &ServerTlsFiles {
            cert: cert.clone(),
            key,
            client_ca: None,
        },
        false,
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (tcp, _) = listener.accept().unwrap();
        let connection = rustls::ServerConnection::new(server_config).unwrap();
        duplex(tcp, connection, Duration::from_secs(10))
    });
    (addr, cert, server)
}

/// A TLS client of `addr` that trusts `ca`: its two ends, or the handshake's error.
fn connect(
    addr: std::net::SocketAddr,
    ca: std::path::PathBuf,
) -> std::io::Result<(DuplexReader, DuplexWriter)> {
    let client_config = tls::client_config(&ClientTlsFiles { ca, identity: None }).unwrap();
    let connection =
        rustls::ClientConnection::new(client_config, tls::server_name("localhost").unwrap())
            .unwrap();
    duplex(
        TcpStream::connect(addr).unwrap(),
        connection,
        Duration::from_secs(10),
    )
}

/// Both ends of a TLS connection over loopback, the client's and the server's, handshaken.
fn connected(
    dir: &std::path::Path,
) -> ((DuplexReader, DuplexWriter), (DuplexReader, DuplexWriter)) {
    let (addr, cert, server) = serve(dir);
    let client = connect(addr, cert).unwrap();
    (client, server.join().unwrap().unwrap())
}

#[test]
fn both_directions_at_once_arrive_whole_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let ((mut reader, mut writer), (mut server_reader, mut server_writer)) = connected(dir.path());
    const LEN: usize = 3 << 20;
    let server_sender = std::thread::spawn(move || {
        for chunk in pattern(LEN, 7).chunks(70_000) {
            server_writer.write_all(chunk).unwrap();
        }
    });
    let server_receiver = std::thread::spawn(move || {
        let mut got = Vec::new();
        server_reader.read_to_end(&mut got).unwrap();
        got
    });
    let sender = std::thread::spawn(move || {
        for chunk in pattern(LEN, 3).chunks(50_000) {
            writer.write_all(chunk).unwrap();
        }
        // Dropping the writer closes this direction: end of stream at the server.
    });
    let mut got = vec![0u8; LEN];
    reader.read_exact(&mut got).unwrap();
    assert!(got == pattern(LEN, 7), "server to client");
    sender.join().unwrap();
    server_sender.join().unwrap();
    assert!(
        server_receiver.join().unwrap() == pattern(LEN, 3),
        "client to server"
    );
}

#[test]
fn an_untrusted_certificate_fails_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _, server) = serve(dir.path());
    let (other, _) = certificate(dir.path(), "other");
    let error = connect(addr, other)
        .err()
        .expect("the handshake fails")
        .to_string();
    assert!(error.to_lowercase().contains("certificate"), "{error}");
    assert!(
        server.join().unwrap().is_err(),
        "the server sees it fail too"
    );
}

#[test]
fn a_side_that_closed_its_direction_still_reads_all_the_other_sends() {
    let dir = tempfile::tempdir().unwrap();
    let ((mut client_reader, mut client_writer), (mut server_reader, mut server_writer)) =
        connected(dir.path());
    // The client says all it has to say and closes its direction first.
    client_writer.write_all(b"request").unwrap();
    drop(client_writer);
    let mut request = Vec::new();
    server_reader.read_to_end(&mut request).unwrap();
    assert_eq!(request, b"request");
    // Only then does the server answer, at length: its direction is still open.
    const LEN: usize = 1 << 20;
    for chunk in pattern(LEN, 5).chunks(60_000) {
        server_writer.write_all(chunk).unwrap();
    }
    drop(server_writer);
    let mut answer = Vec::new();
    client_reader.read_to_end(&mut answer).unwrap();
    assert!(answer == pattern(LEN, 5), "{} bytes of {LEN}", answer.len());
}

#[test]
fn dropping_both_ends_still_sends_what_was_queued() {
    let dir = tempfile::tempdir().unwrap();
    let ((mut client_reader, _client_writer), (server_reader, mut server_writer)) =
        connected(dir.path());
    // Queued (a write returns once its bytes are), then both ends dropped at once.
    const LEN: usize = 3 << 20;
    server_writer.write_all(&pattern(LEN, 9)).unwrap();
    drop(server_writer);
    drop(server_reader);
    let mut answer = Vec::new();
    client_reader.read_to_end(&mut answer).unwrap();
    assert!(answer == pattern(LEN, 9), "{} bytes of {LEN}", answer.len());
}

#[test]
fn a_peer_that_never_answers_fails_the_handshake_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, _) = certificate(dir.path(), "server");
    // Accepts and then says nothing: the client's hello is never answered.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = std::thread::spawn(move || listener.accept().unwrap());
    let client_config = tls::client_config(&ClientTlsFiles {
        ca: cert,
        identity: None,
    })
    .unwrap();
    let connection =
        rustls::ClientConnection::new(client_config, tls::server_name("localhost").unwrap())
            .unwrap();
    let error = duplex(
        TcpStream::connect(addr).unwrap(),
        connection,
        Duration::from_millis(200),
    )
    .err()
    .expect("no handshake with a silent peer");
    assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
    drop(silent.join().unwrap());
}
