//! A TLS connection over TCP that one thread reads while another writes: the replication
//! stream's shape (a primary ships on one thread and takes acknowledgements on another; a
//! standby takes chunks on one and acknowledges from two). rustls keeps one state for both
//! directions, so it sits behind a lock that each end takes only for its own step and never
//! holds while it waits: the reader waits for the socket in `poll` unlocked, then takes the lock
//! to read, decrypt and take its plaintext; a writer encrypts and hands the socket what it
//! takes, unlocked again before it returns. Each end does its own I/O on its own thread, so a
//! message costs no hand-off: an earlier version ran every byte through an I/O thread of its
//! own, and each message paid two thread wake-ups more on each side (a `replicated` round trip
//! over TLS cost ~100 us more than over plain TCP, bench/results/replicated.txt, 2026-12-07).
//! A flusher thread sends only what the socket could not take at once, and lingers after both
//! ends are gone.
//!
//! Invariants:
//! - Bytes are delivered in order, exactly once; a reader sees end of stream only after every
//!   byte the peer sent before closing, and an error (a failed handshake, a bad record, a reset)
//!   once the bytes before it are read.
//! - A write returns once rustls holds its bytes encrypted and the socket took what it could;
//!   the flusher sends the rest as the socket takes it. Ciphertext held beyond [`MAX_QUEUED`]
//!   makes writers wait (backpressure, bounded memory).
//! - The lock is never held across a wait: `poll` and condition waits release it.
//! - Dropping the writer closes this side's direction (close_notify) after what was written;
//!   the other direction stays open. Dropping both ends still sends what was written first, for
//!   at most `LINGER` (a peer that stopped reading does not keep the thread and the socket).

use rustls::Connection;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most ciphertext bytes held for sending before writers wait.
pub const MAX_QUEUED: usize = 8 << 20;
/// How long a wait in `poll` lasts at most before the waiter looks at the state again (the
/// flusher is woken by writes through a pipe; a reader by the socket).
const POLL_MS: i32 = 100;
/// How long the flusher goes on sending what was written after both ends were dropped, before
/// it gives up and closes the socket (a peer that stopped reading, an unreachable one).
const LINGER: Duration = Duration::from_secs(5);

/// The reading end.
pub struct DuplexReader {
    shared: Arc<Shared>,
}

/// The writing end.
pub struct DuplexWriter {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when the flusher sent something (writers waiting for room) or the connection
    /// failed.
    changed: Condvar,
    /// The socket, non-blocking; read by the reader, written by whoever holds the lock.
    tcp: TcpStream,
    /// Written to (one byte) to wake the flusher when ciphertext is left to send.
    wake: std::os::unix::net::UnixStream,
}

struct State {
    connection: Connection,
    peer_certificates: Option<Vec<rustls::pki_types::CertificateDer<'static>>>,
    /// The connection failed; readers and writers get this once what came before is read.
    failed: Option<(io::ErrorKind, String)>,
    writer_gone: bool,
    reader_gone: bool,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs TLS `connection` over `tcp`: the handshake here, on the caller's thread, within
/// `handshake_timeout` in all; then the two ends.
///
/// # Errors
/// The handshake failed or timed out, or the socket or the flusher could not be set up.
pub fn duplex(
    tcp: TcpStream,
    connection: impl Into<Connection>,
    handshake_timeout: Duration,
) -> io::Result<(DuplexReader, DuplexWriter)> {
    let (wake_read, wake_write) = std::os::unix::net::UnixStream::pair()?;
    wake_read.set_nonblocking(true)?;
    wake_write.set_nonblocking(true)?;
    tcp.set_nonblocking(true)?;
    let _ = tcp.set_nodelay(true);
    let mut connection = connection.into();
    connection.set_buffer_limit(Some(MAX_QUEUED));
    handshake(&mut connection, &tcp, Instant::now() + handshake_timeout)?;
    let peer_certificates = connection
        .peer_certificates()
        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect());
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            connection,
            peer_certificates,
            failed: None,
            writer_gone: false,
            reader_gone: false,
        }),
        changed: Condvar::new(),
        tcp,
        wake: wake_write,
    });
    {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("stela-tls-flush".into())
            .spawn(move || flusher(&shared, &wake_read))?;
    }
    Ok((
        DuplexReader {
            shared: Arc::clone(&shared),
        },
        DuplexWriter { shared },
    ))
}

/// The handshake, driven by `poll` until it is done and its last flight sent, or `deadline`.
fn handshake(connection: &mut Connection, tcp: &TcpStream, deadline: Instant) -> io::Result<()> {
    loop {
        send_what_socket_takes(connection, tcp)?;
        if !connection.is_handshaking() && !connection.wants_write() {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            ));
        }
        let reading = connection.is_handshaking();
        let events = if reading { libc::POLLIN } else { 0 }
            | if connection.wants_write() {
                libc::POLLOUT
            } else {
                0
            };
        let left_ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
        let revents = poll_one(tcp, events, left_ms)?;
        if !reading || revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) == 0 {
            continue;
        }
        match connection.read_tls(&mut &*tcp) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed during the TLS handshake",
                ))
            }
            Ok(_) => {
                if let Err(error) = connection.process_new_packets() {
                    // The alert saying why goes out if the socket takes it now.
                    let _ = send_what_socket_takes(connection, tcp);
                    return Err(io::Error::other(error));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// Hands the socket the ciphertext rustls holds, as far as it takes it without blocking.
fn send_what_socket_takes(connection: &mut Connection, tcp: &TcpStream) -> io::Result<()> {
    while connection.wants_write() {
        match connection.write_tls(&mut &*tcp) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `poll` on one descriptor for `events`, up to `timeout_ms`; its `revents` (0 on timeout or
/// interruption).
fn poll_one(fd: &impl AsRawFd, events: libc::c_short, timeout_ms: i32) -> io::Result<i16> {
    let mut fds = [libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    }];
    // SAFETY: `fds` is a valid array of one pollfd for the duration of the call; poll only
    // writes its `revents`.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout_ms) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(error);
    }
    Ok(fds[0].revents)
}

impl Shared {
    /// Sends what the socket takes now; anything left is the flusher's, which is woken. A
    /// failure is recorded for both ends.
    fn send_or_hand_to_flusher(&self, state: &mut State) -> io::Result<()> {
        if let Err(error) = send_what_socket_takes(&mut state.connection, &self.tcp) {
            return Err(fail(self, state, error));
        }
        if state.connection.wants_write() {
            let _ = (&self.wake).write(&[1]);
        }
        Ok(())
    }

    fn failure(state: &State) -> Option<io::Error> {
        state
            .failed
            .as_ref()
            .map(|(kind, message)| io::Error::new(*kind, message.clone()))
    }
}

/// Records `error` as the connection's failure (the first one stays) and returns it.
fn fail(shared: &Shared, state: &mut State, error: io::Error) -> io::Error {
    state
        .failed
        .get_or_insert((error.kind(), error.to_string()));
    shared.changed.notify_all();
    error
}

/// The flusher: sends the ciphertext writers left because the socket was full, wakes writers
/// waiting for room; ends once the writer is gone and everything is sent, at a failure, or
/// `LINGER` after both ends were dropped.
fn flusher(shared: &Shared, wake: &std::os::unix::net::UnixStream) {
    let mut abandoned: Option<Instant> = None;
    loop {
        let pending = {
            let mut state = lock(shared);
            if state.failed.is_some() {
                return;
            }
            if let Err(error) = send_what_socket_takes(&mut state.connection, &shared.tcp) {
                fail(shared, &mut state, error);
                return;
            }
            shared.changed.notify_all();
            let pending = state.connection.wants_write();
            if state.writer_gone && !pending {
                return;
            }
            if state.reader_gone && state.writer_gone {
                let since = *abandoned.get_or_insert_with(Instant::now);
                if since.elapsed() >= LINGER {
                    return;
                }
            }
            pending
        };
        let mut fds = [
            libc::pollfd {
                fd: shared.tcp.as_raw_fd(),
                events: if pending { libc::POLLOUT } else { 0 },
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the duration of the call; poll only
        // writes their `revents`.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, POLL_MS) };
        if ready < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
        if fds[1].revents != 0 {
            let mut drain = [0u8; 64];
            while matches!((&*wake).read(&mut drain), Ok(n) if n > 0) {}
        }
    }
}

impl DuplexReader {
    /// The certificates the peer presented (verified by rustls against the configured CA), if
    /// any.
    pub fn peer_certificates(&self) -> Option<Vec<rustls::pki_types::CertificateDer<'static>>> {
        lock(&self.shared).peer_certificates.clone()
    }
}

impl Read for DuplexReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let shared = &*self.shared;
        let mut state = lock(shared);
        loop {
            // Plaintext already decrypted first, then end of stream (Ok(0) after the peer's
            // close_notify), then a failure.
            match state.connection.reader().read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return other,
            }
            if let Some(error) = Shared::failure(&state) {
                return Err(error);
            }
            match state.connection.read_tls(&mut &shared.tcp) {
                // The socket's end: rustls now says whether it came after a close_notify.
                Ok(0) => continue,
                Ok(_) => {
                    if let Err(error) = state.connection.process_new_packets() {
                        let _ = shared.send_or_hand_to_flusher(&mut state);
                        return Err(fail(shared, &mut state, io::Error::other(error)));
                    }
                    // What reading asked to send (an alert, a key update's answer).
                    shared.send_or_hand_to_flusher(&mut state)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drop(state);
                    poll_one(&shared.tcp, libc::POLLIN, POLL_MS)?;
                    state = lock(shared);
                }
                Err(e) => return Err(fail(shared, &mut state, e)),
            }
        }
    }
}

impl Write for DuplexWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let shared = &*self.shared;
        let mut state = lock(shared);
        loop {
            if let Some(error) = Shared::failure(&state) {
                return Err(error);
            }
            // rustls takes what fits under its limit of held ciphertext.
            let taken = state.connection.writer().write(buf)?;
            shared.send_or_hand_to_flusher(&mut state)?;
            if taken > 0 {
                return Ok(taken);
            }
            state = shared
                .changed
                .wait_timeout(state, Duration::from_millis(POLL_MS as u64))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for DuplexWriter {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        state.writer_gone = true;
        if state.failed.is_none() {
            state.connection.send_close_notify();
            let _ = self.shared.send_or_hand_to_flusher(&mut state);
        }
        drop(state);
        let _ = (&self.shared.wake).write(&[1]);
    }
}

impl Drop for DuplexReader {
    fn drop(&mut self) {
        lock(&self.shared).reader_gone = true;
        let _ = (&self.shared.wake).write(&[1]);
    }
}
