//! The client's TLS transport: a daemon reached over TCP under TLS ([`TlsTarget`]), verified
//! against a CA file, with an optional client certificate (mutual TLS) and an optional token
//! sent in the Hello.
//!
//! What it owns: turning a [`TlsTarget`] into a handshaken, blocking TLS stream split into the
//! read and write halves [`crate::Connection`] uses. The rustls configuration itself comes from
//! `stela_net::tls`, shared with the daemon and replication.
//!
//! Invariants: the daemon's certificate must chain to the given CA and name the target's host
//! (a DNS name or an IP address); the TLS handshake completes inside the connect, so a daemon
//! that is not the one expected fails the connect, naming the address, before any request is
//! sent. The token is read from its file at each connect and sent only over TLS.

use crate::error::{Error, Result};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use stela_net::tls::{self, rustls, ClientTlsFiles};

/// A daemon listening on TCP with TLS (`stela serve --tcp ADDR --tls-cert ...`), and how this
/// client proves who it is.
///
/// ```
/// use stela_client::{Address, TlsTarget};
///
/// let target = TlsTarget::new("tls://db.example:7070", "/etc/stela/ca.pem")?
///     .client_cert("/etc/stela/client.pem", "/etc/stela/client.key")
///     .token_file("/etc/stela/token");
/// assert_eq!(target.to_string(), "tls://db.example:7070");
/// let address = Address::Tls(Box::new(target)); // for Wal::open or AsyncWal::open
/// # Ok::<(), stela_client::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsTarget {
    /// The host to connect to; the daemon's certificate must name it (DNS name or IP).
    pub host: String,
    pub port: u16,
    /// The CA certificate(s) the daemon's certificate chains to (PEM).
    pub ca: PathBuf,
    /// A client certificate chain and key (PEM), for a daemon with `--tls-client-ca`.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// A file whose first token is sent in the Hello, for a daemon with `--token-file` or
    /// `--admin-token-file`.
    pub token_file: Option<PathBuf>,
    /// The name to check the daemon's certificate against, if not `host`.
    pub server_name: Option<String>,
}

impl TlsTarget {
    /// A target from `tls://HOST:PORT` (or `HOST:PORT`), trusting the CA in `ca`.
    pub fn new(address: &str, ca: impl Into<PathBuf>) -> Result<TlsTarget> {
        let rest = address.strip_prefix("tls://").unwrap_or(address);
        let bad = || Error::Connect {
            address: address.to_owned(),
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                "expected tls://HOST:PORT (an IPv6 host in brackets)",
            ),
        };
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad());
        }
        Ok(TlsTarget {
            host: host.to_owned(),
            port,
            ca: ca.into(),
            client_cert: None,
            token_file: None,
            server_name: None,
        })
    }

    /// Presents this certificate chain and key (mutual TLS).
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// Sends the first token of this file in the Hello.
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// Checks the daemon's certificate against this name instead of the host.
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }
}

impl std::fmt::Display for TlsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "tls://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "tls://{}:{}", self.host, self.port)
        }
    }
}

type Shared = Arc<Mutex<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>>;

/// The read half. A [`crate::Connection`] reads and writes in turn, never at once, so the lock
/// is never contended.
struct ReadHalf(Shared);
struct WriteHalf(Shared);

impl Read for ReadHalf {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).read(buf)
    }
}

impl Write for WriteHalf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}

/// What [`connect`] gives the connection: its halves and the token for the Hello.
pub(crate) type Connected = (
    Box<dyn Read + Send>,
    Box<dyn Write + Send>,
    Option<String>,
    TcpStream,
);

/// Connects, completes the TLS handshake, and reads the token; the last part is the TCP socket
/// itself (to cut a request stuck on a primary a failover replaced). With `within`, the connect
/// and the handshake each give up after that long.
pub(crate) fn connect(
    target: &TlsTarget,
    within: Option<std::time::Duration>,
) -> Result<Connected> {
    let connect_err = |source: io::Error| Error::Connect {
        address: target.to_string(),
        source,
    };
    let config = tls::client_config(&ClientTlsFiles {
        ca: target.ca.clone(),
        identity: target.client_cert.clone(),
    })?;
    let name = tls::server_name(target.server_name.as_deref().unwrap_or(&target.host))?;
    let token = target
        .token_file
        .as_deref()
        .map(tls::read_client_token)
        .transpose()?;
    let mut tcp = match within {
        None => TcpStream::connect((target.host.as_str(), target.port)),
        Some(within) => {
            use std::net::ToSocketAddrs;
            let addr = (target.host.as_str(), target.port)
                .to_socket_addrs()
                .map_err(connect_err)?
                .next()
                .ok_or_else(|| connect_err(io::Error::other("the host has no address")))?;
            TcpStream::connect_timeout(&addr, within)
        }
    }
    .map_err(connect_err)?;
    tcp.set_nodelay(true).map_err(connect_err)?;
    // The handshake is bounded too (a stopped node accepts a connection and never answers);
    // the socket is blocking here, so its own timeouts apply, lifted once it is done.
    tcp.set_read_timeout(within).map_err(connect_err)?;
    tcp.set_write_timeout(within).map_err(connect_err)?;
    let mut tls = rustls::ClientConnection::new(config, name)
        .map_err(|e| connect_err(io::Error::other(e)))?;
    while tls.is_handshaking() {
        tls.complete_io(&mut tcp).map_err(connect_err)?;
    }
    tcp.set_read_timeout(None).map_err(connect_err)?;
    tcp.set_write_timeout(None).map_err(connect_err)?;
    let socket = tcp.try_clone().map_err(connect_err)?;
    let shared: Shared = Arc::new(Mutex::new(rustls::StreamOwned::new(tls, tcp)));
    Ok((
        Box::new(ReadHalf(Arc::clone(&shared))),
        Box::new(WriteHalf(shared)),
        token,
        socket,
    ))
}

/// The async halves [`crate::AsyncWal`] uses, and the token for its Hello.
pub(crate) type AsyncConnected = (
    Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    Option<String>,
);

/// [`connect`] for async callers: the same configuration and checks, over tokio-rustls.
pub(crate) async fn connect_async(target: &TlsTarget) -> Result<AsyncConnected> {
    let connect_err = |source: io::Error| Error::Connect {
        address: target.to_string(),
        source,
    };
    let config = tls::client_config(&ClientTlsFiles {
        ca: target.ca.clone(),
        identity: target.client_cert.clone(),
    })?;
    let name = tls::server_name(target.server_name.as_deref().unwrap_or(&target.host))?;
    let token = target
        .token_file
        .as_deref()
        .map(tls::read_client_token)
        .transpose()?;
    let tcp = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(connect_err)?;
    tcp.set_nodelay(true).map_err(connect_err)?;
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(connect_err)?;
    let (read, write) = tokio::io::split(stream);
    Ok((Box::new(read), Box::new(write), token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_host_and_port() {
        let t = TlsTarget::new("tls://db.example:7070", "/ca.pem").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("db.example", 7070));
        assert_eq!(t.to_string(), "tls://db.example:7070");
        let t = TlsTarget::new("[::1]:9", "/ca.pem").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9));
        assert_eq!(t.to_string(), "tls://[::1]:9");
        assert!(TlsTarget::new("tls://nohost", "/ca.pem").is_err());
        assert!(TlsTarget::new("tls://:80", "/ca.pem").is_err());
        assert!(TlsTarget::new("tls://h:99999", "/ca.pem").is_err());
    }
}
