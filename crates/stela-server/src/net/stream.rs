//! A client's connected socket: Unix, plain TCP (the explicit insecure loopback listener) or
//! TCP under TLS, read and written without blocking inside the event loop.
//!
//! Invariants: a TLS stream reads ciphertext from the socket only when rustls has no plaintext
//! left, and takes more plaintext to send only once the socket took all the ciphertext before
//! it, so what it holds stays bounded; a handshake that fails is `PermissionDenied` (a refused
//! login, counted), a TLS error after it `InvalidData` (a broken connection); `WouldBlock`
//! always means "try again on the next event", never a lost byte.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};

/// A connected socket.
pub(crate) enum Stream {
    Unix(mio::net::UnixStream),
    Tcp(mio::net::TcpStream),
    Tls(Box<TlsStream>),
}

/// A TCP connection under TLS, driven without blocking: ciphertext is read from the socket
/// only when no plaintext is left, and written out as far as the socket takes it; what it does
/// not take waits for the next writable event ([`Stream::flush_pending`]).
pub(crate) struct TlsStream {
    tcp: mio::net::TcpStream,
    tls: stela_net::tls::rustls::ServerConnection,
    /// The peer closed the TCP connection.
    eof: bool,
    /// Ciphertext arrived from the peer (it is not a silent connection attempt).
    heard: bool,
}

impl TlsStream {
    pub fn new(tcp: mio::net::TcpStream, tls: stela_net::tls::rustls::ServerConnection) -> Self {
        TlsStream {
            tcp,
            tls,
            eof: false,
            heard: false,
        }
    }

    /// Ciphertext arrived from the peer (it is not a silent connection attempt).
    pub(super) fn heard(&self) -> bool {
        self.heard
    }

    pub fn connection(&self) -> &stela_net::tls::rustls::ServerConnection {
        &self.tls
    }

    /// Writes pending ciphertext. `Ok(true)`: none is left.
    fn write_pending(&mut self) -> io::Result<bool> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.tcp) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Plaintext the peer sent; `WouldBlock` once neither rustls nor the socket has more. A
    /// failed handshake (a certificate that does not verify, no certificate where one is
    /// required, a peer that does not speak TLS) is `PermissionDenied`, after the alert is sent;
    /// a TLS error after the handshake is `InvalidData`.
    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.tls.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if self.eof {
                return Ok(0);
            }
            match self.tls.read_tls(&mut self.tcp) {
                Ok(0) => self.eof = true,
                Ok(_) => self.heard = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if let Err(error) = self.tls.process_new_packets() {
                // Failing the handshake is a refused login; failing later, a broken connection.
                let kind = if self.tls.is_handshaking() {
                    io::ErrorKind::PermissionDenied
                } else {
                    io::ErrorKind::InvalidData
                };
                let _ = self.write_pending();
                return Err(io::Error::new(kind, format!("TLS: {error}")));
            }
            // Handshake messages to send back.
            self.write_pending()?;
        }
    }

    pub(super) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Keep the ciphertext held here bounded: take more only once the socket took it all.
        if !self.write_pending()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let taken = self.tls.writer().write(buf)?;
        self.write_pending()?;
        if taken == 0 && !buf.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(taken)
    }
}

impl Stream {
    /// Writes what the socket takes of `bytes` now; `None`: nothing, try again when writable.
    pub(super) fn write_some(&mut self, bytes: &[u8]) -> io::Result<Option<usize>> {
        loop {
            match self.write(bytes) {
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }

    pub(super) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    /// Writes what the stream itself holds (TLS ciphertext). `Ok(true)`: nothing is left.
    pub fn flush_pending(&mut self) -> io::Result<bool> {
        match self {
            Stream::Tls(s) => s.write_pending(),
            Stream::Unix(_) | Stream::Tcp(_) => Ok(true),
        }
    }

    /// Says goodbye in TLS (close_notify), as far as the socket takes it.
    pub fn close_notify(&mut self) {
        if let Stream::Tls(s) = self {
            s.tls.send_close_notify();
            let _ = s.write_pending();
        }
    }

    pub fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Unix(s) => s,
            Stream::Tcp(s) => s,
            Stream::Tls(s) => &mut s.tcp,
        }
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
            Stream::Tls(s) => s.tcp.as_fd(),
        }
    }

    pub fn is_unix(&self) -> bool {
        matches!(self, Stream::Unix(_))
    }

    /// The user of a Unix peer (whose rings share a wake board).
    pub fn peer_uid(&self) -> Option<u32> {
        match self {
            Stream::Unix(s) => rustix::net::sockopt::socket_peercred(s.as_fd())
                .ok()
                .map(|cred| cred.uid.as_raw()),
            _ => None,
        }
    }

    /// The IP address of a TCP peer.
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        match self {
            Stream::Unix(_) => None,
            Stream::Tcp(s) => s.peer_addr().ok().map(|a| a.ip()),
            Stream::Tls(s) => s.tcp.peer_addr().ok().map(|a| a.ip()),
        }
    }

    /// Who is on the other end, for the log: the process and user of a Unix peer, the
    /// address of a TCP one.
    pub fn peer(&self) -> String {
        match self {
            Stream::Unix(s) => match rustix::net::sockopt::socket_peercred(s.as_fd()) {
                Ok(cred) => format!(
                    "pid {} uid {}",
                    cred.pid.as_raw_nonzero(),
                    cred.uid.as_raw()
                ),
                Err(_) => "unix peer".into(),
            },
            Stream::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "tcp peer".into(), |a| a.to_string()),
            Stream::Tls(s) => s
                .tcp
                .peer_addr()
                .map_or_else(|_| "tls peer".into(), |a| format!("tls {a}")),
        }
    }
}
