//! The standby's door (issue 54, finding 3: a thread per connection to the replication port
//! before it proved anything took a standby to 408 threads under a flood): what a connection
//! must send before it gets a thread, and who waits for it meanwhile.
//!
//! One thread, the door's, accepts connections and keeps those that have not yet sent their
//! whole `Open` in a bounded table, reading them without blocking when `poll(2)` says they
//! sent something: the TLS handshake (when the standby has a certificate) and then the `Open`,
//! at most [`MAX_OPEN_BYTES`], within [`OPEN_WITHIN`]. A whole `Open` is checked at once: the
//! primary must prove itself an administrator of this standby (a client certificate, an admin
//! token, or on plain TCP the kernel's word that the daemon's own user owns the loopback peer);
//! only then does the stream get a thread of its own ([`super::serve`]), its 1 MiB buffer, and
//! the right to touch a log's terms. The decisions of whom to evict are the witness's
//! ([`stela_coord::gate::make_room`]).
//!
//! Invariants:
//! - **No thread, no buffer before proof.** A connection in the table costs its socket, what it
//!   sent of its `Open` (at most [`MAX_OPEN_BYTES`] and a frame header) and, over TLS, its
//!   handshake's state; nothing else is allocated for it.
//! - **Bounded.** The table never holds more than [`LIMITS`]`.pending` connections nor more
//!   than `per_address` from one address; a newcomer is never turned away for room: the oldest
//!   silent connection (of its address, or of all) is closed instead. Every connection leaves
//!   the table within [`OPEN_WITHIN`] of its accept. At most `sessions` authenticated streams
//!   run at once; one more is refused with the reason.

use super::{Security, Shared};
use crate::replication::SessionEnd;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_coord::gate::{self, Limits, Waiting};
use stela_net::tls::rustls::pki_types::CertificateDer;
use stela_net::tls::rustls::ServerConnection;
use stela_proto::repl::ReplMessage;
use stela_proto::{frame, FRAME_HEADER_BYTES};

/// The largest `Open` a primary may send: its names, token and the log's term history (16 bytes
/// a term). Nothing larger is read from a peer that has proved nothing.
pub const MAX_OPEN_BYTES: usize = 256 << 10;
/// A connection must have finished its TLS handshake and sent its whole `Open` within this.
pub(super) const OPEN_WITHIN: Duration = Duration::from_secs(10);
/// Connections awaiting their `Open` (at most 64, 32 from one address: a primary and its
/// attacker may share a host), and authenticated streams (one per log a primary ships, each
/// with three threads). At most 64 × 256 KiB of `Open`s are held.
pub(super) const LIMITS: Limits = Limits {
    pending: 64,
    per_address: 32,
    sessions: 256,
};
/// How long the door sleeps in `poll(2)` at most: how soon it sees that the listener stops.
const POLL_AT_MOST: Duration = Duration::from_millis(50);

/// A connection that has proved itself, and the `Open` it proved itself with: handed to a
/// thread of its own.
pub(super) struct Opened {
    pub(super) stream: TcpStream,
    pub(super) peer: SocketAddr,
    /// Its TLS state, handshake done (none: plain TCP).
    pub(super) tls: Option<Box<ServerConnection>>,
    pub(super) open: ReplMessage,
    /// Plaintext that came after the `Open` (a primary sends nothing more before the standby's
    /// answer; kept so that no byte is lost if one ever does).
    pub(super) after_open: Vec<u8>,
}

/// A connection that has not sent its whole `Open` yet.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    since: Instant,
    tls: Option<Box<ServerConnection>>,
    /// The `Open`'s bytes so far (plaintext).
    bytes: Vec<u8>,
    /// Some bytes (TLS or plaintext) came from it.
    heard: bool,
}

impl Pending {
    fn waiting(&self) -> Waiting {
        Waiting {
            ip: self.peer.ip(),
            since: self.since,
            heard: self.heard,
        }
    }
}

/// What reading a pending connection found.
enum Heard {
    /// Nothing new (or not yet a whole `Open`).
    Waiting,
    /// A whole `Open`, and any plaintext after it.
    Open(Box<ReplMessage>, Vec<u8>),
    /// Closed, or bad bytes: dropped (with the reason to tell it, if any).
    Gone(Option<String>),
}

/// The door's thread: accepts, reads what pending connections sent, hands proved ones to
/// threads of their own, until the standby stops.
pub(super) fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut pending: Vec<Pending> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        wait_for_input(listener, &pending);
        let mut index = 0;
        while index < pending.len() {
            match read_open(&mut pending[index]) {
                Heard::Waiting if pending[index].since.elapsed() > OPEN_WITHIN => {
                    let gone = pending.swap_remove(index);
                    tracing::debug!(peer = %gone.peer, "standby: no whole Open within {OPEN_WITHIN:?}; connection closed");
                }
                Heard::Waiting => index += 1,
                Heard::Open(open, after_open) => {
                    let connection = pending.swap_remove(index);
                    admit(shared, connection, *open, after_open);
                }
                Heard::Gone(why) => {
                    let mut gone = pending.swap_remove(index);
                    if let Some(why) = why {
                        refuse(&mut gone, &why);
                    }
                }
            }
        }
        accept_some(listener, &shared.security, &mut pending);
        debug_assert!(pending.len() <= LIMITS.pending);
    }
}

/// Sleeps until the listener or a pending connection has something to read (or a pending TLS
/// handshake can send), the oldest pending connection's deadline, or [`POLL_AT_MOST`].
fn wait_for_input(listener: &TcpListener, pending: &[Pending]) {
    use rustix::event::{PollFd, PollFlags};
    let mut fds = Vec::with_capacity(pending.len() + 1);
    fds.push(PollFd::new(listener, PollFlags::IN));
    for connection in pending {
        let wants_write = connection.tls.as_ref().is_some_and(|tls| tls.wants_write());
        let flags = if wants_write {
            PollFlags::IN | PollFlags::OUT
        } else {
            PollFlags::IN
        };
        fds.push(PollFd::new(&connection.stream, flags));
    }
    let oldest = pending.iter().map(|c| c.since).min();
    let left = oldest.map_or(POLL_AT_MOST, |since| {
        (since + OPEN_WITHIN).saturating_duration_since(Instant::now())
    });
    let timeout = left.min(POLL_AT_MOST);
    let timeout = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: timeout.as_nanos() as _,
    };
    if let Err(error) = rustix::event::poll(&mut fds, Some(&timeout)) {
        if error != rustix::io::Errno::INTR {
            tracing::warn!(%error, "standby: poll failed");
            std::thread::sleep(POLL_AT_MOST);
        }
    }
}

/// Accepts what is waiting, a few at a time: each connection accepted is read at the next pass
/// before later newcomers could make room by evicting it.
fn accept_some(listener: &TcpListener, security: &Security, pending: &mut Vec<Pending>) {
    for _ in 0..(LIMITS.per_address / 2).max(1) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                let tls = match start_tls(security) {
                    Ok(tls) => tls,
                    Err(()) => continue,
                };
                let waiting: Vec<Waiting> = pending.iter().map(Pending::waiting).collect();
                if let Some(victim) = gate::make_room(&waiting, peer.ip(), &LIMITS) {
                    let evicted = pending.swap_remove(victim);
                    tracing::debug!(peer = %evicted.peer, "standby: a connection without its Open closed to make room");
                }
                pending.push(Pending {
                    stream,
                    peer,
                    since: Instant::now(),
                    tls,
                    bytes: Vec::new(),
                    heard: false,
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(error) => {
                tracing::warn!(%error, "standby: accept failed");
                std::thread::sleep(Duration::from_millis(20));
                return;
            }
        }
    }
}

/// Reads what has arrived of `connection`'s `Open` (through its TLS handshake, first, when it
/// has one), never more than an `Open` may take.
fn read_open(connection: &mut Pending) -> Heard {
    let result = match connection.tls.as_deref_mut() {
        None => read_plain(&connection.stream, &mut connection.bytes),
        Some(tls) => read_tls(tls, &connection.stream, &mut connection.bytes),
    };
    match result {
        Ok(Progress::Nothing) => {}
        Ok(Progress::Some) => connection.heard = true,
        Ok(Progress::Closed) => return Heard::Gone(None),
        Err(Bad(why)) => return Heard::Gone(why),
    }
    match whole_open(&connection.bytes) {
        Ok(None) => Heard::Waiting,
        Ok(Some((open, used))) => Heard::Open(Box::new(open), connection.bytes.split_off(used)),
        Err(why) => Heard::Gone(Some(why.to_string())),
    }
}

/// What one read of a pending connection did.
enum Progress {
    Nothing,
    Some,
    Closed,
}

/// A connection to drop, with the reason to tell it (none: it is gone, or told by TLS).
struct Bad(Option<String>);

/// Reads plaintext off a plain TCP connection, up to the end of the `Open` it announced.
fn read_plain(mut stream: &TcpStream, bytes: &mut Vec<u8>) -> Result<Progress, Bad> {
    let mut read = Progress::Nothing;
    loop {
        let want = open_frame_len(bytes).map_err(|why| Bad(Some(why.to_string())))?;
        if bytes.len() >= want {
            return Ok(read);
        }
        let mut chunk = [0u8; 16 << 10];
        let room = (want - bytes.len()).min(chunk.len());
        match stream.read(&mut chunk[..room]) {
            Ok(0) => return Ok(Progress::Closed),
            Ok(n) => {
                bytes.extend_from_slice(&chunk[..n]);
                read = Progress::Some;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(read),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Ok(Progress::Closed),
        }
    }
}

/// Moves the TLS handshake on and takes the plaintext that arrived, without blocking: never
/// more than the `Open` it announced and what rustls holds past it.
fn read_tls(
    tls: &mut ServerConnection,
    mut stream: &TcpStream,
    bytes: &mut Vec<u8>,
) -> Result<Progress, Bad> {
    let mut read = Progress::Nothing;
    loop {
        while tls.wants_write() {
            match tls.write_tls(&mut stream) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return Ok(Progress::Closed),
            }
        }
        let want = open_frame_len(bytes).map_err(|why| Bad(Some(why.to_string())))?;
        if bytes.len() >= want {
            return Ok(read);
        }
        match tls.read_tls(&mut stream) {
            Ok(0) => return Ok(Progress::Closed),
            Ok(_) => read = Progress::Some,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(read),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Ok(Progress::Closed),
        }
        if let Err(error) = tls.process_new_packets() {
            // rustls queued the alert that tells the peer why; it is sent on the way out.
            let _ = tls.write_tls(&mut stream);
            tracing::warn!(peer = ?stream.peer_addr().ok(), %error, "standby: connection refused: TLS handshake failed");
            return Err(Bad(None));
        }
        let mut chunk = [0u8; 16 << 10];
        loop {
            match tls.reader().read(&mut chunk) {
                Ok(0) => return Ok(Progress::Closed),
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return Ok(Progress::Closed),
            }
        }
    }
}

/// How many bytes the `Open` at the start of `bytes` takes, header included, as far as its
/// header says (a header's length while the header is not whole): the door never reads a
/// connection past it. Pure, public for the fuzz target `repl_open`.
///
/// # Errors
/// The header announces more than [`MAX_OPEN_BYTES`], or is damaged.
pub fn open_frame_len(bytes: &[u8]) -> Result<usize, SessionEnd> {
    let Some(header) = bytes.get(..FRAME_HEADER_BYTES) else {
        return Ok(FRAME_HEADER_BYTES);
    };
    let header: [u8; FRAME_HEADER_BYTES] = header.try_into().expect("a whole header");
    let parsed = frame::parse_header(header, MAX_OPEN_BYTES).map_err(|error| {
        SessionEnd::Protocol(format!(
            "the stream must begin with an Open of at most {MAX_OPEN_BYTES} bytes: {error}"
        ))
    })?;
    Ok(FRAME_HEADER_BYTES + parsed.body_len)
}

/// The `Open` at the start of `bytes` and the bytes it took, once it is whole (`None` while
/// it is not). Pure, public for the fuzz target `repl_open`.
///
/// # Errors
/// The frame is over [`MAX_OPEN_BYTES`], damaged, or not an `Open`.
pub fn whole_open(bytes: &[u8]) -> Result<Option<(ReplMessage, usize)>, SessionEnd> {
    let want = open_frame_len(bytes)?;
    if bytes.len() < want {
        return Ok(None);
    }
    let header: [u8; FRAME_HEADER_BYTES] = bytes[..FRAME_HEADER_BYTES]
        .try_into()
        .expect("a whole header");
    let parsed = frame::parse_header(header, MAX_OPEN_BYTES)?;
    let open = frame::decode_body(parsed, &bytes[FRAME_HEADER_BYTES..want]).map_err(|error| {
        SessionEnd::Protocol(format!("the stream's first frame cannot be read: {error}"))
    })?;
    if !matches!(open, ReplMessage::Open { .. }) {
        return Err(SessionEnd::Protocol(
            "the stream did not start with Open".into(),
        ));
    }
    Ok(Some((open, want)))
}

/// A whole `Open` came: the stream gets a thread of its own if its primary proves itself and
/// fewer than `LIMITS.sessions` streams run; it is refused, with the reason, otherwise.
fn admit(shared: &Arc<Shared>, mut connection: Pending, open: ReplMessage, after_open: Vec<u8>) {
    let ReplMessage::Open {
        node, log, token, ..
    } = &open
    else {
        unreachable!("whole_open takes only an Open");
    };
    let certificates = connection
        .tls
        .as_ref()
        .and_then(|tls| tls.peer_certificates());
    if !proven(
        &shared.security,
        &connection.stream,
        certificates,
        token.as_deref(),
    ) {
        tracing::warn!(
            primary = node,
            log,
            peer = %connection.peer,
            "standby: stream refused: the primary is not authenticated as an administrator"
        );
        let why = not_authenticated(&shared.security);
        shared.session_ends.count(&why);
        refuse(&mut connection, &why.to_string());
        return;
    }
    let sessions = shared.sessions.fetch_add(1, Ordering::SeqCst);
    if sessions >= LIMITS.sessions {
        shared.sessions.fetch_sub(1, Ordering::SeqCst);
        let why =
            SessionEnd::Rejected(format!("{sessions} streams are open, this standby's limit"));
        tracing::warn!(primary = node, log, peer = %connection.peer, why = %why, "standby: stream refused");
        shared.session_ends.count(&why);
        refuse(&mut connection, &why.to_string());
        return;
    }
    let log = log.clone();
    let Pending {
        stream, peer, tls, ..
    } = connection;
    let opened = Opened {
        stream,
        peer,
        tls,
        open,
        after_open,
    };
    let thread_shared = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("stela-mirror".into())
        .spawn(move || {
            let (peer, shared) = (opened.peer, thread_shared);
            if let Err(why) = super::serve(opened, &shared) {
                tracing::warn!(%peer, why = %why, kind = why.kind(), "standby: stream ended");
                shared.session_ends.record(&log, &why);
            }
            shared.sessions.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(error) = spawned {
        shared.sessions.fetch_sub(1, Ordering::SeqCst);
        tracing::error!(%peer, %error, "standby: cannot start a mirror thread; stream refused");
    }
}

/// Whether the primary behind `stream` is an administrator of this standby: over TLS by its
/// certificate or its token; on plain TCP by [`plain_primary`]'s rules.
fn proven(
    security: &Security,
    stream: &TcpStream,
    certificates: Option<&[CertificateDer<'_>]>,
    token: Option<&str>,
) -> bool {
    if security.tls.is_some() {
        security.is_admin(certificates, token)
    } else {
        plain_primary(security, stream, token)
    }
}

/// Whether a primary on plain TCP has proved itself (issue 54, finding 4: any local user could
/// open a log with a huge term and fence the real primary out of it). A token, when sent,
/// decides (one of this daemon's admin tokens); without one, a loopback peer whose socket the
/// kernel says this daemon's own user owns is the operator's process; anything else only under
/// `--repl-insecure`.
fn plain_primary(security: &Security, socket: &TcpStream, token: Option<&str>) -> bool {
    if token.is_some() {
        return security.is_admin(None, token);
    }
    match stela_net::peer::loopback_peer_uid(socket) {
        Ok(Some(uid)) if uid == rustix::process::geteuid().as_raw() => return true,
        Ok(owner) => {
            tracing::debug!(
                ?owner,
                "standby: plain-TCP peer not owned by this daemon's user"
            )
        }
        Err(error) => tracing::warn!(%error, "standby: cannot tell who owns a loopback peer"),
    }
    security.trust_network
}

/// What a primary that did not prove itself is told.
fn not_authenticated(security: &Security) -> SessionEnd {
    let how = if security.tls.is_some() {
        "send one of its admin tokens (--standby-token-file) or a client certificate it \
         names (--tls-admin-name)"
    } else {
        "without TLS a primary must run as this daemon's user on loopback, or send one of \
         its admin tokens (--standby-token-file)"
    };
    SessionEnd::Rejected(format!(
        "not authenticated as an administrator of this standby: {how}"
    ))
}

/// Tells `connection` why it is refused, without blocking (a `Refuse` is a few hundred bytes:
/// an empty socket buffer takes it whole), and closes it.
fn refuse(connection: &mut Pending, why: &str) {
    let mut out = Vec::new();
    let refusal = ReplMessage::Refuse {
        term: 0,
        message: why.to_owned(),
    };
    if frame::encode(&refusal, &mut out).is_err() {
        return;
    }
    let mut stream = &connection.stream;
    match connection.tls.as_deref_mut() {
        None => {
            let _ = stream.write(&out);
        }
        Some(tls) => {
            if !tls.is_handshaking() {
                let _ = tls.writer().write_all(&out);
            }
            tls.send_close_notify();
            while tls.wants_write() {
                if tls.write_tls(&mut stream).is_err() {
                    break;
                }
            }
        }
    }
    tracing::debug!(peer = %connection.peer, why, "standby: connection refused");
}

/// A new connection's TLS state, when the standby has a certificate (`Ok(None)`: plain TCP).
/// `Err`: the connection is dropped (TLS could not be started for it; said in the log).
fn start_tls(security: &Security) -> Result<Option<Box<ServerConnection>>, ()> {
    let Some(config) = security.tls_config() else {
        return Ok(None);
    };
    match ServerConnection::new(config) {
        Ok(connection) => Ok(Some(Box::new(connection))),
        Err(error) => {
            tracing::error!(%error, "standby: cannot start TLS for a connection");
            Err(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_frame(token: Option<&str>) -> Vec<u8> {
        let mut out = Vec::new();
        frame::encode(
            &ReplMessage::Open {
                term: 1,
                node: "p".into(),
                log: "l".into(),
                codec: "json".into(),
                type_tag: "t".into(),
                token: token.map(str::to_owned),
                history: vec![(1, 1)],
            },
            &mut out,
        )
        .unwrap();
        out
    }

    #[test]
    fn an_open_is_taken_only_whole_and_only_within_its_bound() {
        let frame = open_frame(Some("secret"));
        for cut in 0..frame.len() {
            assert!(matches!(whole_open(&frame[..cut]), Ok(None)), "{cut} bytes");
        }
        let mut more = frame.clone();
        more.extend_from_slice(b"next");
        let (open, used) = whole_open(&more).unwrap().unwrap();
        assert_eq!(used, frame.len());
        assert!(matches!(open, ReplMessage::Open { token: Some(t), .. } if t == "secret"));
        // A header announcing more than an Open may take is refused before its body is read.
        let mut big = [0u8; FRAME_HEADER_BYTES];
        big[..4].copy_from_slice(&(64u32 << 20).to_le_bytes());
        let refused = open_frame_len(&big).unwrap_err();
        assert!(refused.to_string().contains("at most"), "{refused}");
        assert_eq!(refused.kind(), "protocol");
        // Any other first frame is refused.
        let mut heartbeat = Vec::new();
        frame::encode(&ReplMessage::Heartbeat { term: 1 }, &mut heartbeat).unwrap();
        assert!(whole_open(&heartbeat)
            .unwrap_err()
            .to_string()
            .contains("Open"));
    }
}
