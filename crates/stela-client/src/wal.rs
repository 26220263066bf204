//! [`Wal<T>`]: a log in the daemon, typed like the embedded `stela_wal::Wal<T>`.
//!
//! The calls mean what they mean embedded, with "durable" read as the durability the log was
//! opened with: `append` returns once the daemon holds the record (`buffered`: it survives this
//! process), `commit(lsn)` returns once everything up to `lsn` is at the opened durability (for
//! `disk`: fdatasync'ed through the daemon's group commit), `append_durable` is both in one round
//! trip. Records are encoded here with the log's codec; the daemon stores the bytes as they are,
//! so the log directory is an ordinary stela-wal log that `Wal::open` can read embedded too.
//!
//! On the daemon's machine (a Unix socket), appends and commits go through a shared-memory ring
//! by default ([`Transport::Auto`]): the record is written into memory the daemon copies it out
//! of, and the acknowledgement comes back the same way, without a system call when both sides
//! are busy. Reads, positions and truncation always use the socket.

use crate::connection::{unexpected, Address, Connection};
use crate::error::{Error, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use stela_format::{Codec, Lsn};
use stela_net::shm::ShmError;
use stela_proto::ring::EntryKind;
use stela_proto::{Durability, Payload, Positions, RequestBody, ResponseBody};

/// A ring failure as a client error: the daemon went away, or stopped reading the ring.
fn ring_error(error: ShmError) -> Error {
    let kind = match error {
        ShmError::DaemonGone | ShmError::Faulted { .. } => std::io::ErrorKind::BrokenPipe,
        _ => std::io::ErrorKind::Other,
    };
    Error::Io(std::io::Error::new(
        kind,
        format!("shared-memory ring: {error}"),
    ))
}

/// How to open a log in the daemon: a builder over [`WalOptions::default`].
///
/// ```
/// use std::time::Duration;
/// use stela_client::{Codec, Durability, Transport, WalOptions};
///
/// let options = WalOptions::default()
///     .codec(Codec::Json)
///     .durability(Durability::Disk)
///     .transport(Transport::Socket)
///     .reconnect_within(Duration::from_secs(10));
/// assert_eq!(options.durability, Durability::Disk);
/// ```
#[derive(Clone, Debug)]
pub struct WalOptions {
    pub codec: Codec,
    /// MessagePack only: write structs as maps of their field names, so `stela wal dump` shows
    /// them, at the cost of the names' bytes in every record (docs/FORMAT.md). Off by default.
    pub field_names: bool,
    /// What `commit` and `append_durable` wait for.
    pub durability: Durability,
    /// Name of the record type checked against the log's header; defaults to the Rust type name,
    /// as for an embedded open.
    pub type_tag: Option<String>,
    pub create_if_missing: bool,
    /// How long to poll for each answer before sleeping (see [`Connection::connect_with`]).
    pub spin: std::time::Duration,
    /// How appends and commits reach the daemon.
    pub transport: Transport,
    /// Size of the shared-memory ring's data area (0: the daemon's default).
    pub ring_bytes: u32,
    /// After the connection is lost (the daemon restarted), how long the next call keeps
    /// trying to connect and reopen the log before it fails naming the address. Zero: never
    /// reconnect.
    pub reconnect_within: std::time::Duration,
    /// With an endpoint list: how long a request may wait before the other endpoints are asked
    /// whether a newer primary has taken over (then the request is cut and reported in doubt).
    /// A primary that is merely slow is never abandoned: only a newer primary ends the wait.
    pub probe_after: std::time::Duration,
}

/// How appends and commits reach the daemon.
///
/// ```no_run
/// use stela_client::{Transport, Wal, WalOptions};
///
/// # fn main() -> stela_client::Result<()> {
/// let options = WalOptions::default().transport(Transport::Socket);
/// let wal: Wal<u64> = Wal::open("/var/lib/stela/stela.sock", "counters", options)?;
/// assert_eq!(wal.transport(), Transport::Socket.name());
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// A shared-memory ring when the daemon is on this machine (a Unix socket) and gives one;
    /// the socket otherwise.
    #[default]
    Auto,
    /// A shared-memory ring, or an error at `open`.
    SharedMemory,
    /// Always the socket.
    Socket,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::SharedMemory => "shm",
            Transport::Socket => "socket",
        }
    }
}

impl Default for WalOptions {
    fn default() -> WalOptions {
        WalOptions {
            codec: Codec::MessagePack,
            field_names: false,
            durability: Durability::Buffered,
            type_tag: None,
            create_if_missing: true,
            spin: stela_net::DEFAULT_SPIN,
            transport: Transport::Auto,
            ring_bytes: 0,
            reconnect_within: std::time::Duration::from_secs(5),
            // About the standby's suspicion period: no newer primary can exist sooner.
            probe_after: std::time::Duration::from_millis(250),
        }
    }
}

impl WalOptions {
    /// The level `append` acknowledges at: `buffered`, or `unsafe` if the log was opened so.
    pub(crate) fn append_level(&self) -> Durability {
        if self.durability == Durability::Unsafe {
            Durability::Unsafe
        } else {
            Durability::Buffered
        }
    }

    pub fn codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// MessagePack structs as maps with their field names (see [`WalOptions::field_names`]).
    pub fn field_names(mut self, on: bool) -> Self {
        self.field_names = on;
        self
    }

    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    pub fn type_tag(mut self, tag: impl Into<String>) -> Self {
        self.type_tag = Some(tag.into());
        self
    }

    pub fn spin(mut self, spin: std::time::Duration) -> Self {
        self.spin = spin;
        self
    }

    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    pub fn transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    pub fn ring_bytes(mut self, bytes: u32) -> Self {
        self.ring_bytes = bytes;
        self
    }

    pub fn probe_after(mut self, after: std::time::Duration) -> Self {
        self.probe_after = after;
        self
    }

    pub fn reconnect_within(mut self, within: std::time::Duration) -> Self {
        self.reconnect_within = within;
        self
    }
}

/// How long one endpoint of a list may take to connect, say hello, or open the log before the
/// next is tried: long enough for a loaded node, short against a failover's few hundred ms.
pub(crate) const ENDPOINT_WITHIN: std::time::Duration = std::time::Duration::from_millis(500);

/// Encodes records with the log's codec, refusing any larger than the daemon accepts (before
/// anything is sent, so a batch is all or nothing).
pub(crate) fn encode_records<T: Serialize>(
    options: &WalOptions,
    max: usize,
    records: &[T],
) -> Result<Vec<Payload>> {
    records
        .iter()
        .map(|record| {
            let mut bytes = Vec::new();
            options
                .codec
                .encode_into_named(record, &mut bytes, options.field_names)?;
            if bytes.len() > max {
                return Err(Error::RecordTooLarge {
                    bytes: bytes.len(),
                    max,
                });
            }
            Ok(Payload(bytes))
        })
        .collect()
}

/// A typed log held by the daemon. `Send + Sync`; calls from many threads share one connection
/// one request at a time, so give each busy thread its own `Wal` (they may name the same log).
///
/// ```no_run
/// use stela_client::{Durability, Lsn, Wal, WalOptions};
///
/// # fn main() -> stela_client::Result<()> {
/// let options = WalOptions::default().durability(Durability::Disk);
/// let wal: Wal<(u64, String)> = Wal::open("/var/lib/stela/stela.sock", "ledger", options)?;
/// let lsn = wal.append_durable(&(1, "opened".to_owned()))?; // fdatasync'ed when it returns
/// for item in wal.iter_from(Lsn::FIRST)? {
///     let (at, (id, what)) = item?;
///     println!("{at}: {id} {what}");
/// }
/// wal.truncate_before(lsn)?; // after a checkpoint
/// wal.close()?;
/// # Ok(()) }
/// ```
pub struct Wal<T> {
    session: Mutex<Session>,
    address: Address,
    name: String,
    type_tag: String,
    /// The record type's schema sent with each open, for the daemon to keep (dumps).
    schema: Option<String>,
    options: WalOptions,
    max_record_bytes: usize,
    /// The highest LSN this client has had acknowledged, so `commit` at `buffered` of an LSN
    /// it appended needs no round trip.
    appended: AtomicU64,
    /// With an endpoint list: the watch that cuts a request stuck on a replaced primary.
    watch: Option<std::sync::Arc<crate::failover::Watch>>,
    _records: PhantomData<fn() -> T>,
}

/// The connection and the log's handle on it; replaced as a whole when the connection is lost
/// and the next call reconnects.
pub(crate) struct Session {
    connection: Connection,
    handle: u32,
    /// Why the connection is unusable, once a call found it so.
    lost: Option<String>,
    /// The term records appended through this handle get (0 without replication).
    term: u64,
    /// Which endpoint of an endpoint list this is (0 for a single address).
    endpoint: usize,
}

impl<T> std::fmt::Debug for Wal<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("address", &self.address)
            .field("log", &self.name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A wait at `disk`, `replicated` or `all` on a replicated log (term above 0) that ended
/// without an answer (the connection was lost or cut, or the daemon said the primary stepped
/// down) is in doubt: reported with its term and LSN for [`Wal::resolve`]. A commit the
/// primary answered without a standby is [`Error::Unprotected`]. Other errors are returned as
/// they are.
pub(crate) fn in_doubt(error: Error, durability: Durability, term: u64, lsn: Option<Lsn>) -> Error {
    if let Error::Server {
        code: stela_proto::ErrorCode::Unprotected,
        message,
    } = error
    {
        return Error::Unprotected {
            term,
            lsn,
            cause: message,
        };
    }
    let waits = matches!(
        durability,
        Durability::Disk | Durability::Replicated | Durability::All
    );
    let doubtful = match &error {
        Error::Disconnected { .. } => true,
        Error::Server { code, .. } => {
            matches!(
                code,
                stela_proto::ErrorCode::InDoubt | stela_proto::ErrorCode::NotPrimary
            )
        }
        _ => false,
    };
    // Without replication (term 0) there is no history to resolve against: the error says
    // the outcome is unknown, as it is.
    if !(waits && doubtful) || term == 0 {
        return error;
    }
    Error::InDoubt {
        term,
        lsn,
        cause: error.to_string(),
    }
}

/// Whether the daemon said it is not (any more) the primary this session opened the log on.
pub(crate) fn node_replaced(error: &Error) -> bool {
    matches!(
        error.code(),
        Some(stela_proto::ErrorCode::InDoubt | stela_proto::ErrorCode::NotPrimary)
    )
}

/// Whether a call's error means the connection itself is gone (the daemon died or restarted,
/// or the stream is out of step), rather than a refusal the connection survives.
pub(crate) fn connection_lost(error: &Error) -> bool {
    matches!(error, Error::Io(_) | Error::Frame(_))
}

impl<T: Serialize + DeserializeOwned> Wal<T> {
    /// Connects to the daemon at `address` and opens the log `name` in it.
    pub fn open<A>(address: A, name: &str, options: WalOptions) -> Result<Wal<T>>
    where
        A: TryInto<Address>,
        Error: From<A::Error>,
    {
        let address = address.try_into()?;
        let type_tag = options
            .type_tag
            .clone()
            .unwrap_or_else(stela_format::default_type_tag::<T>);
        let schema = record_schema::<T>(&options);
        let (session, positions, max_record_bytes) =
            Self::find_primary(&address, 0, name, &type_tag, &options, schema.as_deref())?;
        let watch = match &address {
            Address::Cluster(endpoints) => Some(crate::failover::Watch::start(
                endpoints.clone(),
                options.probe_after,
            )),
            _ => None,
        };
        Ok(Wal {
            session: Mutex::new(session),
            address,
            name: name.to_owned(),
            type_tag,
            schema,
            options,
            max_record_bytes,
            appended: AtomicU64::new(positions.last_lsn),
            watch,
            _records: PhantomData,
        })
    }

    /// Opens the log on the primary: the address itself, or, for an endpoint list, the
    /// endpoint that opens it. Every endpoint is asked at once, each on its own thread, so a
    /// node that is stopped or cut off (its connection or answer waits out `ENDPOINT_WITHIN`)
    /// delays nothing when another is the primary; a standby answers `NotPrimary` and is
    /// passed over. The first endpoint to open the log wins, unless another has opened it by
    /// then too: the one of the newer epoch, then the one nearest `preferred` in list order.
    /// The threads that lose close what they opened and end within `ENDPOINT_WITHIN`.
    fn find_primary(
        address: &Address,
        preferred: usize,
        name: &str,
        type_tag: &str,
        options: &WalOptions,
        schema: Option<&str>,
    ) -> Result<(Session, Positions, usize)> {
        let Address::Cluster(endpoints) = address else {
            return Self::connect_session_within(address, name, type_tag, options, schema, None);
        };
        let (answers, answered) = std::sync::mpsc::channel();
        for (at, endpoint) in endpoints.iter().enumerate() {
            let (endpoint, name, type_tag) =
                (endpoint.clone(), name.to_owned(), type_tag.to_owned());
            let (options, schema) = (options.clone(), schema.map(str::to_owned));
            let to_caller = answers.clone();
            let spawned = std::thread::Builder::new()
                .name("stela-client-find".into())
                .spawn(move || {
                    let opened = Self::connect_session_within(
                        &endpoint,
                        &name,
                        &type_tag,
                        &options,
                        schema.as_deref(),
                        Some(ENDPOINT_WITHIN),
                    );
                    // The caller may have taken another endpoint and gone: then this one's
                    // session is dropped here, which closes it.
                    let _ = to_caller.send((at, opened));
                });
            if let Err(error) = spawned {
                let _ = answers.send((at, Err(Error::Io(error))));
            }
        }
        drop(answers);
        let rank = |at: usize, session: &Session| {
            crate::failover::rank(at, preferred, endpoints.len(), session.term)
        };
        let mut tried = Vec::new();
        let mut best: Option<(usize, (Session, Positions, usize))> = None;
        // Blocks until the first endpoint opens the log (or all have failed), then takes only
        // the answers already in.
        let mut next = answered.recv().ok();
        while let Some((at, opened)) = next {
            match opened {
                Ok(opened) => {
                    let better = best
                        .as_ref()
                        .is_none_or(|(was, kept)| rank(at, &opened.0) > rank(*was, &kept.0));
                    if better {
                        best = Some((at, opened));
                    }
                }
                Err(error) => tried.push((at, endpoints[at].to_string(), error.to_string())),
            }
            next = if best.is_some() {
                answered.try_recv().ok()
            } else {
                answered.recv().ok()
            };
        }
        match best {
            Some((at, (mut session, positions, max))) => {
                session.endpoint = at;
                Ok((session, positions, max))
            }
            None => {
                tried.sort_by_key(|(at, _, _)| *at);
                let tried = tried.into_iter().map(|(_, a, why)| (a, why)).collect();
                Err(Error::NoPrimary { tried })
            }
        }
    }

    /// Connects, opens the log and maps the ring as `options` ask; with `within`, each step
    /// gives up after that long (an endpoint that is down or stopped).
    fn connect_session_within(
        address: &Address,
        name: &str,
        type_tag: &str,
        options: &WalOptions,
        schema: Option<&str>,
        within: Option<std::time::Duration>,
    ) -> Result<(Session, Positions, usize)> {
        let mut connection =
            Connection::connect_within(address, options.spin, stela_proto::Role::Client, within)?;
        let open = RequestBody::Open {
            log: name.to_owned(),
            codec: options.codec.name().to_owned(),
            type_tag: type_tag.to_owned(),
            create: options.create_if_missing,
            durability: Some(options.durability),
            schema: schema.map(str::to_owned),
        };
        let answer = match within {
            Some(within) => {
                let cut = connection.cutter();
                crate::deadline::guarded(cut, within, || connection.request(open))?
            }
            None => connection.request(open)?,
        };
        let ResponseBody::Opened {
            handle,
            positions,
            max_record_bytes,
            term,
        } = answer
        else {
            return Err(unexpected("Open", answer));
        };
        if options.transport != Transport::Socket {
            if let Err(error) = connection.map_ring(options.ring_bytes, options.spin) {
                if options.transport == Transport::SharedMemory {
                    return Err(error);
                }
            }
        }
        let session = Session {
            connection,
            handle,
            lost: None,
            term,
            endpoint: 0,
        };
        Ok((session, positions, max_record_bytes as usize))
    }

    /// Runs `call` on the session, reconnecting first if an earlier call lost the connection.
    /// A call that loses the connection itself fails with [`Error::Disconnected`]: whether the
    /// daemon acted on it is unknown, so it is never sent again by this library.
    fn call<R>(
        &self,
        what: &'static str,
        call: impl FnOnce(&mut Session) -> Result<R>,
    ) -> Result<R> {
        let mut session = self.session.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cause) = session.lost.clone() {
            self.reconnect(&mut session, &cause)?;
        }
        let watched = self.watch.as_ref().map(|watch| {
            watch.begin(
                session.endpoint,
                session.term >> 32,
                session.connection.cutter(),
            )
        });
        let result = call(&mut session);
        drop(watched);
        result.map_err(|error| {
            if connection_lost(&error) {
                session.lost = Some(error.to_string());
                Error::Disconnected {
                    address: self.address.to_string(),
                    during: what,
                    cause: error.to_string(),
                }
            } else {
                if node_replaced(&error) {
                    // This node is no longer the primary (it stepped down, or a newer one took
                    // over): the next call, a `resolve` above all, looks for the current one
                    // rather than asking this node again.
                    session.lost = Some(error.to_string());
                }
                error
            }
        })
    }

    /// Connects again and reopens the log, retrying until `reconnect_within` has passed.
    fn reconnect(&self, session: &mut Session, cause: &str) -> Result<()> {
        let deadline = std::time::Instant::now() + self.options.reconnect_within;
        let mut pause = std::time::Duration::from_millis(5);
        // A failover takes a few hundred milliseconds: look for the new primary often.
        let longest = if self.watch.is_some() {
            std::time::Duration::from_millis(25)
        } else {
            std::time::Duration::from_millis(200)
        };
        loop {
            match Self::find_primary(
                &self.address,
                // The endpoint that was lost is the least likely to be the primary now.
                session.endpoint + 1,
                &self.name,
                &self.type_tag,
                &self.options,
                self.schema.as_deref(),
            ) {
                Ok((fresh, positions, _)) => {
                    *session = fresh;
                    // Buffered records the old daemon had not written are gone: what this
                    // client may treat as acknowledged is what the log holds now.
                    self.appended.store(positions.last_lsn, Ordering::Relaxed);
                    return Ok(());
                }
                Err(error) if std::time::Instant::now() >= deadline => {
                    return Err(Error::Reconnect {
                        address: self.address.to_string(),
                        waited: self.options.reconnect_within,
                        cause: cause.to_owned(),
                        last: error.to_string(),
                    });
                }
                Err(_) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(longest);
                }
            }
        }
    }

    /// The transport appends and commits use: `shm` or `socket`.
    pub fn transport(&self) -> &'static str {
        let session = self.session.lock().unwrap_or_else(|e| e.into_inner());
        if session.connection.ring.is_some() {
            Transport::SharedMemory.name()
        } else {
            Transport::Socket.name()
        }
    }

    /// Sends one entry through the ring; `Ok(None)` if it does not fit there (use the socket).
    fn through_ring(
        connection: &mut Connection,
        handle: u32,
        kind: EntryKind,
        durability: Durability,
        lsn: u64,
        payloads: &[&[u8]],
    ) -> Result<Option<(u64, u64)>> {
        let Some(ring) = connection.ring.as_mut() else {
            return Ok(None);
        };
        let seq = match ring.submit(handle, kind, durability, lsn, payloads) {
            Ok(seq) => seq,
            Err(ShmError::EntryTooLarge { .. }) => return Ok(None),
            Err(error) => return Err(ring_error(error)),
        };
        let done = if durability == Durability::Disk {
            ring.wait_patiently(seq)
        } else {
            ring.wait(seq)
        }
        .map_err(ring_error)?;
        if !done.is_ok() {
            let code = done
                .error_code()
                .unwrap_or(stela_proto::ErrorCode::BadRequest);
            let message = ring.refusal_message(seq).unwrap_or_else(|| {
                format!(
                    "the daemon refused the request ({code:?}, status {})",
                    done.status
                )
            });
            return Err(Error::Server { code, message });
        }
        Ok(Some((done.first_lsn, done.last_lsn)))
    }

    fn append_at(&self, records: &[T], durability: Durability) -> Result<Lsn> {
        let payloads = encode_records(&self.options, self.max_record_bytes, records)?;
        let mut term = 0;
        let last_lsn = self
            .call("append", |session| {
                term = session.term;
                let slices: Vec<&[u8]> = payloads.iter().map(|p| p.0.as_slice()).collect();
                if let Some((_, last)) = Self::through_ring(
                    &mut session.connection,
                    session.handle,
                    EntryKind::Append,
                    durability,
                    0,
                    &slices,
                )? {
                    return Ok(last);
                }
                drop(slices);
                let answer = session.connection.request(RequestBody::Append {
                    handle: session.handle,
                    durability,
                    records: payloads,
                })?;
                match answer {
                    ResponseBody::Appended { last_lsn, .. } => Ok(last_lsn),
                    other => Err(unexpected("Append", other)),
                }
            })
            .map_err(|error| in_doubt(error, durability, term, None))?;
        self.appended.fetch_max(last_lsn, Ordering::Relaxed);
        Ok(Lsn::new(last_lsn))
    }

    /// Sends one record; returns its LSN once the daemon holds it (survives this process).
    /// Opened `unsafe`, returns `Lsn::ZERO` at once: the daemon does not say where it went.
    pub fn append(&self, record: &T) -> Result<Lsn> {
        self.append_at(std::slice::from_ref(record), self.options.append_level())
    }

    /// Sends records as one contiguous run of LSNs; returns the last one.
    pub fn append_batch(&self, records: &[T]) -> Result<Lsn> {
        self.append_at(records, self.options.append_level())
    }

    /// Sends one record and returns once it is at the log's durability, in one round trip.
    pub fn append_durable(&self, record: &T) -> Result<Lsn> {
        self.append_at(std::slice::from_ref(record), self.options.durability)
    }

    /// Sends records and returns once all are at the log's durability, in one round trip.
    pub fn append_batch_durable(&self, records: &[T]) -> Result<Lsn> {
        self.append_at(records, self.options.durability)
    }

    /// Returns once every record up to `lsn` is at the log's durability.
    pub fn commit(&self, lsn: Lsn) -> Result<()> {
        self.commit_at(lsn, self.options.durability)
    }

    /// Returns once every record up to `lsn` is at `durability`.
    pub fn commit_at(&self, lsn: Lsn, durability: Durability) -> Result<()> {
        let appended_here = lsn.get() <= self.appended.load(Ordering::Relaxed);
        if appended_here && matches!(durability, Durability::Buffered | Durability::Unsafe) {
            return Ok(()); // acknowledged at buffered when it was appended
        }
        let mut term = 0;
        let committed = self.call("commit", |session| {
            term = session.term;
            if Self::through_ring(
                &mut session.connection,
                session.handle,
                EntryKind::Commit,
                durability,
                lsn.get(),
                &[],
            )?
            .is_some()
            {
                return Ok(());
            }
            let answer = session.connection.request(RequestBody::Commit {
                handle: session.handle,
                lsn: lsn.get(),
                durability,
            })?;
            match answer {
                ResponseBody::Committed { .. } => Ok(()),
                other => Err(unexpected("Commit", other)),
            }
        });
        committed.map_err(|error| in_doubt(error, durability, term, Some(lsn)))
    }

    /// Returns once every record the log holds when the daemon takes this request (appended by
    /// anyone, on any connection) is at `durability`, and that LSN; `Lsn::ZERO` for an empty
    /// log. Through the ring this is one entry (a commit of
    /// [`stela_proto::ring::COMMIT_END`]) instead of a `Positions` round trip on the socket
    /// followed by a commit; without a ring, or from a daemon that does not know the end marker
    /// (it answers `NotAppended`), it is those two.
    pub fn commit_end(&self, durability: Durability) -> Result<Lsn> {
        let mut term = 0;
        let through_ring = self.call("commit", |session| {
            term = session.term;
            Self::through_ring(
                &mut session.connection,
                session.handle,
                EntryKind::Commit,
                durability,
                stela_proto::ring::COMMIT_END,
                &[],
            )
        });
        match through_ring {
            Ok(Some((_, last))) => return Ok(Lsn::new(last)),
            Ok(None) => {}
            Err(Error::Server {
                code: stela_proto::ErrorCode::NotAppended,
                ..
            }) => {}
            Err(error) => return Err(in_doubt(error, durability, term, None)),
        }
        let last = Lsn::new(self.positions()?.last_lsn);
        if last.get() > 0 {
            self.commit_at(last, durability)?;
        }
        Ok(last)
    }

    /// The term records appended now get (0 from a daemon without replication). With an LSN
    /// it names a record across a failover ([`Wal::resolve`]).
    pub fn term(&self) -> u64 {
        self.session.lock().unwrap_or_else(|e| e.into_inner()).term
    }

    /// What became of the record appended at `lsn` in `term` (from an [`Error::InDoubt`]),
    /// judged by the log's history on the primary this client reaches now: `Kept` (it is in
    /// the log), `Lost` (a newer primary's records took its place), or `NotYet` (the log has
    /// not reached it; ask again later).
    ///
    /// Only the primary of the newest epoch a node knows of answers (a standby, a primary that
    /// stepped down or was superseded refuses with `NotPrimary`); on such a refusal, or a lost
    /// connection, the next endpoint is asked, for up to `reconnect_within` (at least twice).
    /// The primary counts as the log's end only what a second node holds, so `Kept` means the
    /// record is in that primary's history and protected, and `Lost` that a newer primary's
    /// record holds its place, so it can never appear.
    pub fn resolve(&self, term: u64, lsn: Lsn) -> Result<stela_format::term::Resolution> {
        let deadline = std::time::Instant::now() + self.options.reconnect_within;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.resolve_once(term, lsn) {
                Err(error)
                    if (node_replaced(&error) || matches!(error, Error::Disconnected { .. }))
                        && (attempts < 2 || std::time::Instant::now() < deadline) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => return other,
            }
        }
    }

    fn resolve_once(&self, term: u64, lsn: Lsn) -> Result<stela_format::term::Resolution> {
        let answer = self.call("history", |session| {
            session.connection.request(RequestBody::History {
                handle: session.handle,
            })
        })?;
        resolution_from_history(answer, term, lsn)
    }

    /// Where the log stands in the daemon.
    pub fn positions(&self) -> Result<Positions> {
        self.call("positions", |session| {
            match session.connection.request(RequestBody::Positions {
                handle: session.handle,
            })? {
                ResponseBody::Positions(positions) => Ok(positions),
                other => Err(unexpected("Positions", other)),
            }
        })
    }

    /// The highest LSN fdatasync'ed by the daemon.
    pub fn durable_lsn(&self) -> Result<Lsn> {
        Ok(Lsn::new(self.positions()?.durable_lsn))
    }

    /// The highest LSN appended by anyone.
    pub fn last_lsn(&self) -> Result<Lsn> {
        Ok(Lsn::new(self.positions()?.last_lsn))
    }

    /// Every record, in order, fetched lazily in batches.
    pub fn iter(&self) -> Result<Iter<'_, T>> {
        self.iter_from(Lsn::FIRST)
    }

    /// Records from `lsn` on, in order, up to the end of the log as it is when the iterator
    /// reaches it (records still in the daemon's buffers included).
    pub fn iter_from(&self, lsn: Lsn) -> Result<Iter<'_, T>> {
        Ok(Iter {
            wal: self,
            next: lsn.get().max(1),
            batch: Vec::new().into_iter(),
            done: false,
        })
    }

    /// Releases whole segments below `lsn` (after a checkpoint); returns how many.
    pub fn truncate_before(&self, lsn: Lsn) -> Result<usize> {
        self.call("truncate", |session| {
            match session.connection.request(RequestBody::Truncate {
                handle: session.handle,
                before: lsn.get(),
            })? {
                ResponseBody::Truncated { segments } => Ok(segments as usize),
                other => Err(unexpected("Truncate", other)),
            }
        })
    }

    pub fn options(&self) -> &WalOptions {
        &self.options
    }

    /// The largest encoded record the daemon accepts in this log (a larger one is refused).
    pub fn max_record_bytes(&self) -> usize {
        self.max_record_bytes
    }

    /// Commits everything this client appended (at the log's durability) and closes.
    pub fn close(self) -> Result<()> {
        let last = self.appended.load(Ordering::Relaxed);
        if last > 0 && self.options.durability != Durability::Unsafe {
            self.commit(Lsn::new(last))?;
        }
        self.call("close", |session| {
            let handle = session.handle;
            session.connection.request(RequestBody::Close { handle })?;
            Ok(())
        })
    }
}

/// Records in order; yields an error and stops if the daemon reports damage or goes away.
///
/// ```no_run
/// # fn main() -> stela_client::Result<()> {
/// let wal: stela_client::Wal<String> = stela_client::Wal::open(
///     "/var/lib/stela/stela.sock",
///     "notes",
///     stela_client::WalOptions::default(),
/// )?;
/// let notes: Vec<String> = wal.iter()?.map(|item| item.map(|(_, note)| note)).collect::<Result<_, _>>()?;
/// # Ok(()) }
/// ```
pub struct Iter<'a, T> {
    wal: &'a Wal<T>,
    next: u64,
    batch: std::vec::IntoIter<(u64, Payload)>,
    done: bool,
}

const READ_RECORDS: u32 = 4096;
const READ_BYTES: u32 = 1 << 20;

impl<T: Serialize + DeserializeOwned> Iterator for Iter<'_, T> {
    type Item = Result<(Lsn, T)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((lsn, payload)) = self.batch.next() {
                let lsn = Lsn::new(lsn);
                let decoded = self.wal.options.codec.decode(&payload.0);
                return Some(match decoded {
                    Ok(record) => Ok((lsn, record)),
                    Err(source) => Err(Error::Decode { lsn, source }),
                });
            }
            if self.done {
                return None;
            }
            let from = self.next;
            let answer = self.wal.call("read", |session| {
                session.connection.request(RequestBody::Read {
                    handle: session.handle,
                    from,
                    max_records: READ_RECORDS,
                    max_bytes: READ_BYTES,
                })
            });
            match answer {
                Ok(ResponseBody::Records {
                    records,
                    next,
                    at_end,
                }) => {
                    self.done = at_end || records.is_empty();
                    self.next = next;
                    self.batch = records.into_iter();
                }
                Ok(other) => {
                    self.done = true;
                    return Some(Err(unexpected("Read", other)));
                }
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            }
        }
    }
}

/// Judges the record at `lsn` in `term` by the primary's answer to a `History` request: its
/// term history and how far a second node holds the log (`last_lsn`), and, from a daemon that
/// says so, where the log ends, so that a record between the two is told apart from one never
/// written (`NotYet`, not `Lost`).
pub(crate) fn resolution_from_history(
    answer: ResponseBody,
    term: u64,
    lsn: Lsn,
) -> Result<stela_format::term::Resolution> {
    let ResponseBody::History {
        entries,
        last_lsn,
        log_end,
    } = answer
    else {
        return Err(unexpected("History", answer));
    };
    let history = stela_format::term::TermHistory::from_entries(
        entries
            .into_iter()
            .map(|(term, first)| (stela_format::term::Term(term), first)),
    )
    .map_err(|e| Error::UnexpectedAnswer {
        asked: "History",
        got: format!("a term history that breaks its rules: {e}"),
    })?;
    Ok(stela_format::term::resolve_protected(
        &history,
        log_end.unwrap_or(last_lsn),
        last_lsn,
        stela_format::term::Term(term),
        lsn.get(),
    ))
}

/// The schema the daemon keeps for a log of `T` (`stela_format::schema`): only for compact
/// MessagePack records, which carry no field names of their own.
pub(crate) fn record_schema<T: DeserializeOwned>(options: &WalOptions) -> Option<String> {
    (options.codec == Codec::MessagePack && !options.field_names)
        .then(stela_format::schema::Schema::of::<T>)
        .flatten()
        .map(|schema| schema.to_json())
}
