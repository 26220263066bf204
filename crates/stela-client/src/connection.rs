//! One connection to the daemon: framing, the version handshake, request ids, raw requests
//! for tools (`stela status`, `stela power-fail`), and the negotiation of a shared-memory ring.
//!
//! Invariants: every request carries a fresh id and its answer must carry the same one (a
//! mismatch means the stream is out of step and is an error, never silently accepted); a frame
//! that fails its checksum is an error; [`Connection::pipeline`] sends many requests in one
//! write and reads their answers in order; a ring, once mapped, is watched for the daemon's
//! death (its socket closing) so that a client waiting in the ring learns of it at once.

use crate::error::{Error, Result};
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;
use stela_net::SpinStream;
use stela_proto::frame::{self, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
use stela_proto::{Request, RequestBody, Response, ResponseBody, Role, PROTOCOL_VERSION};

/// Where the daemon listens: parsed from text, or built from a path, a socket address or a
/// [`crate::TlsTarget`].
///
/// ```
/// use stela_client::Address;
///
/// let unix: Address = "/var/lib/stela/stela.sock".parse()?;
/// let pair = Address::parse("tcp://10.0.0.1:7000,tcp://10.0.0.2:7000")?;
/// assert!(matches!(pair, Address::Cluster(ref nodes) if nodes.len() == 2));
/// assert_eq!(unix.to_string(), "/var/lib/stela/stela.sock");
/// # Ok::<(), stela_client::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    Tcp(SocketAddr),
    /// TCP under TLS, with this client's credentials ([`crate::tls`]).
    Tls(Box<crate::tls::TlsTarget>),
    /// The nodes of a failover pair: a [`crate::Wal`] opens its log on whichever is the
    /// primary, and follows a failover to the other. Written `tcp://A,tcp://B`.
    Cluster(Vec<Address>),
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(path) => write!(f, "{}", path.display()),
            Address::Tcp(addr) => write!(f, "tcp://{addr}"),
            Address::Tls(target) => write!(f, "{target}"),
            Address::Cluster(endpoints) => {
                for (i, endpoint) in endpoints.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{endpoint}")?;
                }
                Ok(())
            }
        }
    }
}

impl From<PathBuf> for Address {
    fn from(path: PathBuf) -> Address {
        Address::Unix(path)
    }
}

impl From<&std::path::Path> for Address {
    fn from(path: &std::path::Path) -> Address {
        Address::Unix(path.to_owned())
    }
}

impl From<SocketAddr> for Address {
    fn from(addr: SocketAddr) -> Address {
        Address::Tcp(addr)
    }
}

impl Address {
    /// Reads an address written as text: `unix:PATH`, `tcp://HOST:PORT` (the host's first
    /// address when it is a name), or a bare path (a Unix socket). A TLS address needs the
    /// daemon's CA and this client's credentials, so it is built with [`crate::TlsTarget`],
    /// not from text alone.
    ///
    /// # Errors
    /// [`Error::BadAddress`] naming the text and what is wrong with it.
    pub fn parse(text: &str) -> Result<Address> {
        let bad = |reason: &str| Error::BadAddress {
            address: text.to_owned(),
            reason: reason.to_owned(),
        };
        if text.contains(',') {
            let endpoints = text
                .split(',')
                .map(|one| match Address::parse(one.trim())? {
                    Address::Cluster(_) => Err(bad("a list inside a list")),
                    one => Ok(one),
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(Address::Cluster(endpoints));
        }
        if let Some(path) = text.strip_prefix("unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(bad("no socket path after unix:"));
            }
            return Ok(Address::Unix(PathBuf::from(path)));
        }
        if let Some(host_port) = text.strip_prefix("tcp://") {
            let host_port = host_port.strip_suffix('/').unwrap_or(host_port);
            if let Ok(addr) = host_port.parse::<SocketAddr>() {
                return Ok(Address::Tcp(addr));
            }
            if !host_port.contains(':') {
                return Err(bad("no port after the host"));
            }
            use std::net::ToSocketAddrs;
            let mut found = host_port
                .to_socket_addrs()
                .map_err(|e| bad(&format!("cannot resolve the host: {e}")))?;
            return found
                .next()
                .map(Address::Tcp)
                .ok_or_else(|| bad("the host has no address"));
        }
        if text.starts_with("tls://") {
            return Err(bad(
                "a TLS address needs the daemon's CA: build it with stela_client::TlsTarget",
            ));
        }
        if text.contains("://") {
            return Err(bad("unknown scheme"));
        }
        if text.is_empty() {
            return Err(bad("empty"));
        }
        Ok(Address::Unix(PathBuf::from(text)))
    }
}

impl TryFrom<&str> for Address {
    type Error = Error;
    fn try_from(text: &str) -> Result<Address> {
        Address::parse(text)
    }
}

impl TryFrom<String> for Address {
    type Error = Error;
    fn try_from(text: String) -> Result<Address> {
        Address::parse(&text)
    }
}

impl TryFrom<&String> for Address {
    type Error = Error;
    fn try_from(text: &String) -> Result<Address> {
        Address::parse(text)
    }
}

impl std::str::FromStr for Address {
    type Err = Error;
    fn from_str(text: &str) -> Result<Address> {
        Address::parse(text)
    }
}

/// A handshaken connection. Not shared between threads: [`crate::Wal`] wraps it in a mutex.
/// Tools use it for raw requests:
///
/// ```no_run
/// use stela_client::{Address, Connection};
/// use stela_proto::{RequestBody, ResponseBody};
///
/// # fn main() -> stela_client::Result<()> {
/// let mut admin = Connection::connect_admin(&Address::parse("/var/lib/stela/stela.sock")?)?;
/// if let ResponseBody::Status(report) = admin.request(RequestBody::Status)? {
///     println!("{report:?}");
/// }
/// # Ok(()) }
/// ```
pub struct Connection {
    reader: BufReader<Box<dyn Read + Send>>,
    writer: BufWriter<Box<dyn Write + Send>>,
    next_id: u64,
    body: Vec<u8>,
    server: String,
    /// The socket itself, for descriptor passing and for the watcher (Unix only).
    unix: Option<UnixStream>,
    /// The TCP socket (under TLS, the one beneath), so that a request stuck on a primary that
    /// was replaced can be cut.
    tcp: Option<TcpStream>,
    /// The shared-memory ring, once mapped, and its registration with the watcher.
    pub(crate) ring: Option<stela_net::shm::ClientRing>,
    watched: Option<crate::watcher::Watched>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects and says hello, spinning up to [`stela_net::DEFAULT_SPIN`] for each answer.
    pub fn connect(address: &Address) -> Result<Connection> {
        Connection::connect_with(address, stela_net::DEFAULT_SPIN)
    }

    /// Connects and says hello. Each wait for an answer first polls the socket for up to
    /// `spin` (adaptive, see stela-net): far cheaper than a wake-up on virtual CPUs, at the
    /// price of that much CPU per request. Zero never spins.
    pub fn connect_with(address: &Address, spin: Duration) -> Result<Connection> {
        Connection::connect_as(address, spin, Role::Client)
    }

    /// Connects as an administrator: served from a small reserve even when the daemon is at
    /// its connection limit (`stela status`, the power hooks).
    pub fn connect_admin(address: &Address) -> Result<Connection> {
        Connection::connect_as(address, Duration::ZERO, Role::Admin)
    }

    fn connect_as(address: &Address, spin: Duration, role: Role) -> Result<Connection> {
        Connection::connect_within(address, spin, role, None)
    }

    /// Connects and says hello; with `within`, a TCP connect and the hello each give up after
    /// that long (a node of a failover pair may be unreachable or stopped).
    pub(crate) fn connect_within(
        address: &Address,
        spin: Duration,
        role: Role,
        within: Option<Duration>,
    ) -> Result<Connection> {
        let connect_err = |source| Error::Connect {
            address: address.to_string(),
            source,
        };
        let mut unix = None;
        let mut tcp = None;
        let mut token = None;
        let (read, write): (Box<dyn Read + Send>, Box<dyn Write + Send>) = match address {
            Address::Unix(path) => {
                let stream = UnixStream::connect(path).map_err(connect_err)?;
                let reader =
                    SpinStream::new(stream.try_clone()?, spin, |s| s.set_nonblocking(true))?;
                unix = Some(stream.try_clone()?);
                (
                    Box::new(reader),
                    Box::new(SpinStream::new(stream, Duration::ZERO, |_| Ok(()))?),
                )
            }
            Address::Tcp(addr) => {
                let stream = match within {
                    Some(within) => TcpStream::connect_timeout(addr, within),
                    None => TcpStream::connect(addr),
                }
                .map_err(connect_err)?;
                stream.set_nodelay(true)?;
                tcp = Some(stream.try_clone()?);
                let reader =
                    SpinStream::new(stream.try_clone()?, spin, |s| s.set_nonblocking(true))?;
                (
                    Box::new(reader),
                    Box::new(SpinStream::new(stream, Duration::ZERO, |_| Ok(()))?),
                )
            }
            Address::Tls(target) => {
                let (read, write, sent, socket) = crate::tls::connect(target, within)?;
                token = sent;
                tcp = Some(socket);
                (read, write)
            }
            Address::Cluster(endpoints) => {
                // A tool's connection: the first endpoint that answers.
                let mut last = None;
                for endpoint in endpoints {
                    match Connection::connect_within(endpoint, spin, role, within) {
                        Ok(connection) => return Ok(connection),
                        Err(error) => last = Some(error),
                    }
                }
                return Err(last.unwrap_or_else(|| Error::BadAddress {
                    address: address.to_string(),
                    reason: "an empty list".into(),
                }));
            }
        };
        let mut connection = Connection {
            reader: BufReader::with_capacity(64 << 10, read),
            writer: BufWriter::with_capacity(64 << 10, write),
            next_id: 1,
            body: Vec::new(),
            server: String::new(),
            unix,
            tcp,
            ring: None,
            watched: None,
        };
        let hello = RequestBody::Hello {
            version: PROTOCOL_VERSION,
            client: format!("stela-client {}", env!("CARGO_PKG_VERSION")),
            role,
            token,
        };
        let answer = match within {
            Some(within) => {
                let cut = connection.cutter();
                crate::deadline::guarded(cut, within, || connection.request(hello))?
            }
            None => connection.request(hello)?,
        };
        match answer {
            ResponseBody::Welcome { server, .. } => connection.server = server,
            other => return Err(unexpected("Hello", other)),
        }
        Ok(connection)
    }

    /// A way to cut this connection from another thread (a request stuck on a primary that a
    /// failover replaced then fails at once): TCP (under TLS too) and Unix sockets.
    pub(crate) fn cutter(&self) -> Option<Box<dyn Fn() + Send + Sync>> {
        if let Some(tcp) = &self.tcp {
            let tcp = tcp.try_clone().ok()?;
            return Some(Box::new(move || {
                let _ = tcp.shutdown(std::net::Shutdown::Both);
            }));
        }
        let unix = self.unix.as_ref()?.try_clone().ok()?;
        Some(Box::new(move || {
            let _ = unix.shutdown(std::net::Shutdown::Both);
        }))
    }

    /// The daemon's name and version, from its welcome.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Sends one request and waits for its answer. A daemon error is returned as
    /// [`Error::Server`].
    pub fn request(&mut self, body: RequestBody) -> Result<ResponseBody> {
        let mut answers = self.pipeline(std::iter::once(body))?;
        answers.pop().expect("one answer per request")
    }

    /// Sends every request in one write, then reads the answers in order. Each answer is its
    /// own result: an error answer to one request does not hide the others.
    pub fn pipeline(
        &mut self,
        bodies: impl IntoIterator<Item = RequestBody>,
    ) -> Result<Vec<Result<ResponseBody>>> {
        let mut ids = Vec::new();
        let mut out = Vec::new();
        for body in bodies {
            let id = self.next_id;
            self.next_id += 1;
            frame::encode(&Request { id, body }, &mut out)?;
            ids.push(id);
        }
        self.writer.write_all(&out)?;
        self.writer.flush()?;
        let mut answers = Vec::with_capacity(ids.len());
        for id in ids {
            let response = self.read_response()?;
            if response.id != id {
                // A bad-frame answer carries id 0: surface the daemon's message.
                if let ResponseBody::Error { code, message } = response.body {
                    return Err(Error::Server { code, message });
                }
                return Err(unexpected(
                    "an id",
                    ResponseBody::Error {
                        code: stela_proto::ErrorCode::BadRequest,
                        message: format!("answer id {} for request {id}", response.id),
                    },
                ));
            }
            answers.push(match response.body {
                ResponseBody::Error { code, message } => Err(Error::Server { code, message }),
                body => Ok(body),
            });
        }
        Ok(answers)
    }

    /// Asks for a shared-memory ring of `data_bytes` (0: the daemon's default) and maps it.
    /// Unix sockets only. The daemon's death is watched from then on: a wait in the ring ends
    /// with an error as soon as the socket closes.
    pub fn map_ring(&mut self, data_bytes: u32, spin: Duration) -> Result<()> {
        let Some(unix) = &self.unix else {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "a shared-memory ring needs a Unix socket",
            )));
        };
        let fd = unix.try_clone()?;
        debug_assert!(self.reader.buffer().is_empty(), "no answer may be pending");
        let id = self.next_id;
        self.next_id += 1;
        let mut out = Vec::new();
        frame::encode(
            &Request {
                id,
                body: RequestBody::MapRing { data_bytes },
            },
            &mut out,
        )?;
        self.writer.write_all(&out)?;
        self.writer.flush()?;
        // The answer carries the ring's descriptors: read it with recvmsg, not through the
        // buffered reader.
        let mut frame_bytes = Vec::new();
        let mut fds = Vec::new();
        let mut chunk = [0u8; 4096];
        let frame_len = loop {
            if let Some(header) = frame_bytes.get(..FRAME_HEADER_BYTES) {
                let header =
                    frame::parse_header(header.try_into().expect("8 bytes"), MAX_FRAME_BYTES)?;
                let len = FRAME_HEADER_BYTES + header.body_len;
                if frame_bytes.len() >= len {
                    break len;
                }
            }
            let want = match frame_bytes.get(..FRAME_HEADER_BYTES) {
                Some(_) => chunk.len(),
                None => FRAME_HEADER_BYTES - frame_bytes.len(),
            };
            let n = loop {
                use std::os::fd::AsFd;
                match stela_net::shm::recv_with_fds(fd.as_fd(), &mut chunk[..want], &mut fds) {
                    Ok(n) => break n,
                    // The socket is non-blocking (it spins for answers): wait for the answer.
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => wait_readable(&fd)?,
                    Err(e) => return Err(Error::Io(e)),
                }
            };
            if n == 0 {
                return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            frame_bytes.extend_from_slice(&chunk[..n]);
        };
        debug_assert_eq!(frame_bytes.len(), frame_len, "one answer, nothing after it");
        let header = frame::parse_header(
            frame_bytes[..FRAME_HEADER_BYTES]
                .try_into()
                .expect("8 bytes"),
            MAX_FRAME_BYTES,
        )?;
        let response: Response = frame::decode_body(header, &frame_bytes[FRAME_HEADER_BYTES..])?;
        if response.id != id {
            return Err(unexpected("MapRing", response.body));
        }
        match response.body {
            ResponseBody::RingMapped { .. } => {}
            other => return Err(unexpected("MapRing", other)),
        }
        let mut fds = fds.into_iter();
        let (Some(memory), Some(doorbell)) = (fds.next(), fds.next()) else {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the daemon's ring answer came without its two descriptors",
            )));
        };
        let mut ring = stela_net::shm::ClientRing::from_fds(memory, doorbell)
            .map_err(|e| Error::Io(std::io::Error::other(e)))?;
        // A third descriptor is the daemon's wake board for this user (a daemon without boards
        // sends two): answers are then waited for on the ring's seat there.
        if let Some(board) = fds.next() {
            let board = stela_net::shm::Board::from_fd(board)
                .map_err(|e| Error::Io(std::io::Error::other(e)))?;
            ring.attach_board(board);
        }
        ring.set_spin(spin);
        self.watched = Some(crate::watcher::watch(fd, ring.gone_handle())?);
        self.ring = Some(ring);
        Ok(())
    }

    fn read_response(&mut self) -> Result<Response> {
        frame::read_blocking_into(&mut self.reader, MAX_FRAME_BYTES, &mut self.body).map_err(
            |error| match error {
                frame::ReadError::Header(e) | frame::ReadError::Body(e) => Error::Io(e),
                // As a short read of the body always was: the daemon went away mid-answer.
                frame::ReadError::Cut => Error::Io(std::io::ErrorKind::UnexpectedEof.into()),
                frame::ReadError::Frame(e) => Error::Frame(e),
            },
        )
    }
}

/// Blocks until `socket` has something to read (or is closed).
fn wait_readable(socket: &UnixStream) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid, initialised pollfd for a descriptor `socket` keeps open.
        if unsafe { libc::poll(&mut fd, 1, -1) } >= 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

pub(crate) fn unexpected(asked: &'static str, got: ResponseBody) -> Error {
    let got = match got {
        ResponseBody::Error { code, message } => return Error::Server { code, message },
        other => format!("{other:?}").chars().take(120).collect(),
    };
    Error::UnexpectedAnswer { asked, got }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_from_text() {
        let unix = |p: &str| Address::Unix(PathBuf::from(p));
        assert_eq!(
            Address::parse("/run/stela.sock").unwrap(),
            unix("/run/stela.sock")
        );
        assert_eq!(Address::parse("stela.sock").unwrap(), unix("stela.sock"));
        assert_eq!(
            Address::parse("unix:/run/s.sock").unwrap(),
            unix("/run/s.sock")
        );
        assert_eq!(
            Address::parse("unix:///run/s.sock").unwrap(),
            unix("/run/s.sock")
        );
        assert_eq!(
            Address::parse("tcp://127.0.0.1:7070").unwrap(),
            Address::Tcp("127.0.0.1:7070".parse().unwrap())
        );
        assert_eq!(
            Address::parse("tcp://[::1]:7070/").unwrap(),
            Address::Tcp("[::1]:7070".parse().unwrap())
        );
        assert!(matches!(
            Address::parse("tcp://localhost:7070").unwrap(),
            Address::Tcp(a) if a.port() == 7070 && a.ip().is_loopback()
        ));
        let a: Address = "/x.sock".try_into().unwrap();
        assert_eq!(a, unix("/x.sock"));
        let b: Address = String::from("tcp://10.0.0.1:1").try_into().unwrap();
        assert_eq!(b.to_string(), "tcp://10.0.0.1:1");
        for (bad, why) in [
            ("", "empty"),
            ("unix:", "no socket path"),
            ("tcp://10.0.0.1", "no port"),
            ("http://x:1", "unknown scheme"),
            ("tls://db:7070", "TlsTarget"),
        ] {
            let error = Address::parse(bad).unwrap_err().to_string();
            assert!(
                error.contains(why) && error.contains("bad daemon address"),
                "{bad}: {error}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn an_address_reads_back_from_its_display(
            path in "/[a-z0-9._-]{1,12}(/[a-z0-9._-]{1,12}){0,3}",
            ip in proptest::array::uniform4(0u8..),
            port in 1u16..,
        ) {
            let unix = Address::Unix(PathBuf::from(&path));
            proptest::prop_assert_eq!(Address::parse(&unix.to_string()).unwrap(), unix);
            let tcp = Address::Tcp(SocketAddr::from((ip, port)));
            proptest::prop_assert_eq!(Address::parse(&tcp.to_string()).unwrap(), tcp);
        }
    }
}
