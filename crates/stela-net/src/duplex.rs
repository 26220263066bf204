//! A TLS connection over TCP that one thread reads while another writes: the replication
//! stream's shape (a primary ships on one thread and takes acknowledgements on another; a
//! standby takes chunks on one and acknowledges from two). rustls keeps one state for both
//! directions, and a blocking read holding it would hold up every write, so one I/O thread owns
//! the socket and the TLS state, and the two ends trade plaintext with it through buffers.
//!
//! Invariants:
//! - Bytes are delivered in order, exactly once; a reader sees end of stream only after every
//!   byte the peer sent before closing, and an error (a failed handshake, a bad record, a reset)
//!   once the bytes before it are read.
//! - A write returns once its bytes are queued; the I/O thread sends them as the socket takes
//!   them. Bytes queued beyond [`MAX_QUEUED`] make writers wait (backpressure, bounded memory).
//! - Dropping the writer closes this side's direction (close_notify) after what was queued; the
//!   other direction stays open. A peer that closes its direction ends this reader's stream and
//!   leaves this writer free to finish: the session ends once both directions are closed, or
//!   this one is and the reader is dropped, or at the first error. Dropping both ends still
//!   sends what was queued first, for at most `LINGER` (a peer that stopped reading does not
//!   keep the thread and the socket).

use rustls::Connection;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Most plaintext bytes queued for sending before writers wait.
pub const MAX_QUEUED: usize = 8 << 20;
/// How long the I/O thread sleeps in poll at most (it is woken by writes through a pipe).
const POLL_MS: i32 = 100;
/// How long the I/O thread goes on sending what was queued after both ends were dropped, before
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
    changed: Condvar,
    /// Written to (one byte) to wake the I/O thread when there is something to send.
    wake: std::os::unix::net::UnixStream,
}

#[derive(Default)]
struct State {
    incoming: VecDeque<u8>,
    outgoing: Vec<u8>,
    handshaken: bool,
    peer_certificates: Option<Vec<rustls::pki_types::CertificateDer<'static>>>,
    /// The peer closed its direction cleanly (end of stream after `incoming`).
    eof: bool,
    /// The I/O thread ended without an error: nothing more is sent.
    done: bool,
    /// The connection failed; readers and writers get this once `incoming` is drained.
    failed: Option<(io::ErrorKind, String)>,
    writer_gone: bool,
    reader_gone: bool,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs TLS `connection` over `tcp` on an I/O thread of its own; returns the two ends once the
/// handshake is done (or its error).
///
/// # Errors
/// The handshake failed, or the socket or thread could not be set up.
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
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        changed: Condvar::new(),
        wake: wake_write,
    });
    let mut connection = connection.into();
    {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("stela-tls-io".into())
            .spawn(move || {
                let result = run(&tcp, &mut connection, &wake_read, &shared);
                let mut state = lock(&shared);
                if let Err(error) = result {
                    state
                        .failed
                        .get_or_insert((error.kind(), error.to_string()));
                } else {
                    state.eof = true;
                    state.done = true;
                }
                drop(state);
                shared.changed.notify_all();
            })?;
    }
    // Wait for the handshake.
    let deadline = std::time::Instant::now() + handshake_timeout;
    let mut state = lock(&shared);
    while !state.handshaken && state.failed.is_none() && !state.eof {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            state.failed = Some((io::ErrorKind::TimedOut, "TLS handshake timed out".into()));
            break;
        }
        state = shared
            .changed
            .wait_timeout(state, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    if !state.handshaken {
        let (kind, message) = state.failed.clone().unwrap_or((
            io::ErrorKind::UnexpectedEof,
            "closed during the TLS handshake".into(),
        ));
        state.reader_gone = true;
        state.writer_gone = true;
        return Err(io::Error::new(kind, message));
    }
    drop(state);
    Ok((
        DuplexReader {
            shared: Arc::clone(&shared),
        },
        DuplexWriter { shared },
    ))
}

/// The I/O thread: moves ciphertext between the socket and rustls, plaintext between rustls
/// and the buffers. Returns at a clean end of both directions, or the first error.
fn run(
    tcp: &TcpStream,
    connection: &mut Connection,
    wake: &std::os::unix::net::UnixStream,
    shared: &Shared,
) -> io::Result<()> {
    let mut sock = tcp;
    let mut closing = false;
    // The peer closed its direction (close_notify, or the socket's end): nothing more to read.
    let mut peer_closed = false;
    // When both ends were found dropped: the thread lingers at most `LINGER` after it.
    let mut abandoned: Option<std::time::Instant> = None;
    loop {
        // Plaintext to send goes into rustls (whole, as far as it takes it).
        let plaintext_left = {
            let mut state = lock(shared);
            if closing && !connection.wants_write() && (peer_closed || state.reader_gone) {
                // This side's direction closed (what was queued, then close_notify, all sent),
                // and the peer's closed too or no one is left to read it.
                return Ok(());
            }
            if state.reader_gone && state.writer_gone {
                let since = *abandoned.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= LINGER {
                    return Ok(());
                }
            }
            let mut taken = 0;
            if !state.outgoing.is_empty() && !connection.is_handshaking() {
                taken = connection.writer().write(&state.outgoing)?;
                state.outgoing.drain(..taken);
                shared.changed.notify_all();
            }
            if state.writer_gone && state.outgoing.is_empty() && !closing {
                connection.send_close_notify();
                closing = true;
            }
            taken > 0 && !state.outgoing.is_empty()
        };
        // Ciphertext out, as far as the socket takes it.
        while connection.wants_write() {
            match connection.write_tls(&mut sock) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        if plaintext_left && !connection.wants_write() {
            // rustls took only part of what is queued and the socket took all it gave: feed it
            // the rest now rather than sleep until the next wake-up.
            continue;
        }
        if !connection.is_handshaking() {
            let mut state = lock(shared);
            if !state.handshaken {
                state.handshaken = true;
                state.peer_certificates = connection
                    .peer_certificates()
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect());
                shared.changed.notify_all();
            }
        }
        // Wait for the socket or a wake-up.
        let mut fds = [
            libc::pollfd {
                fd: tcp.as_raw_fd(),
                events: if peer_closed { 0 } else { libc::POLLIN }
                    | if connection.wants_write() {
                        libc::POLLOUT
                    } else {
                        0
                    },
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
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if fds[1].revents != 0 {
            let mut drain = [0u8; 64];
            while matches!((&*wake).read(&mut drain), Ok(n) if n > 0) {}
        }
        if peer_closed {
            if fds[0].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                // The socket is gone both ways while this side still had a direction open.
                return Err(socket_error(tcp));
            }
            continue;
        }
        if fds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            match connection.read_tls(&mut sock) {
                Ok(read) => {
                    // At the socket's end (0), what rustls holds is the rest.
                    let state = connection.process_new_packets().map_err(io::Error::other)?;
                    deliver(connection, shared, state.plaintext_bytes_to_read())?;
                    if read == 0 || state.peer_has_closed() {
                        peer_closed = true;
                        lock(shared).eof = true;
                        shared.changed.notify_all();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Why a socket that polled as hung up or in error is: its pending error, else a broken pipe.
fn socket_error(tcp: &TcpStream) -> io::Error {
    match tcp.take_error() {
        Ok(Some(error)) => error,
        _ => io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the peer closed the connection before this side's stream ended",
        ),
    }
}

/// Moves `bytes` of plaintext from rustls to the readers' buffer (or drops them, once no reader
/// is left to take them: the thread may outlive both ends while it sends what was queued).
fn deliver(connection: &mut Connection, shared: &Shared, bytes: usize) -> io::Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let mut buf = vec![0u8; bytes];
    connection.reader().read_exact(&mut buf)?;
    let mut state = lock(shared);
    if !state.reader_gone {
        state.incoming.extend(buf);
        shared.changed.notify_all();
    }
    Ok(())
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
        let mut state = lock(&self.shared);
        loop {
            if !state.incoming.is_empty() {
                let n = buf.len().min(state.incoming.len());
                for (slot, byte) in buf.iter_mut().zip(state.incoming.drain(..n)) {
                    *slot = byte;
                }
                return Ok(n);
            }
            // The peer's direction ended cleanly: a later failure is of this side's.
            if state.eof {
                return Ok(0);
            }
            if let Some((kind, message)) = &state.failed {
                return Err(io::Error::new(*kind, message.clone()));
            }
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Write for DuplexWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut state = lock(&self.shared);
        loop {
            if let Some((kind, message)) = &state.failed {
                return Err(io::Error::new(*kind, message.clone()));
            }
            if state.done {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            if state.outgoing.len() < MAX_QUEUED {
                break;
            }
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        state.outgoing.extend_from_slice(buf);
        drop(state);
        let _ = (&self.shared.wake).write(&[1]);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for DuplexWriter {
    fn drop(&mut self) {
        lock(&self.shared).writer_gone = true;
        let _ = (&self.shared.wake).write(&[1]);
    }
}

impl Drop for DuplexReader {
    fn drop(&mut self) {
        lock(&self.shared).reader_gone = true;
        let _ = (&self.shared.wake).write(&[1]);
    }
}
