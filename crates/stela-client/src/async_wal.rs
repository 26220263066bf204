//! [`AsyncWal<T>`]: the same typed log for async code (tokio). Many calls may be in flight on
//! one connection at once: each request gets an id, a background task reads the answers and
//! hands each to the call that waits for it.
//!
//! Invariants: an id is registered before its request is written, so an answer always finds
//! its caller; if the connection fails, every call in flight gets the error (none waits
//! forever, none is sent again), and the next call reconnects and reopens the log within
//! `WalOptions::reconnect_within`, else fails naming the address.
//!
//! With an endpoint list (`tcp://A,tcp://B`) it follows a failover as [`crate::Wal`] does: the
//! log is opened on whichever endpoint is the primary (all are asked at once); a request that
//! waits longer than `WalOptions::probe_after` has the other endpoints asked whether a newer
//! primary took over, and if one did the request fails in doubt at once
//! ([`Error::InDoubt`], with the term and LSN that [`AsyncWal::resolve`] takes) and the next
//! call opens the log on the new primary. A refusal saying the node is no longer the primary
//! makes the next call look for the primary too. The daemon answers a connection's requests in order, so a `disk`
//! commit delays the answers queued behind it on the same connection; open one `AsyncWal` per
//! independent stream of commits if that matters.
//!
//! Unlike the blocking client this one does not spin while it waits (the runtime's reactor does
//! the waiting), so a round trip includes a thread wake-up (about 60 us on virtual CPUs).

use crate::connection::{unexpected, Address};
use crate::error::{Error, Result};
use crate::wal::{encode_records, in_doubt, WalOptions};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use stela_format::term::Resolution;
use stela_format::Lsn;
use stela_proto::frame::{self, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
use stela_proto::{
    Durability, Positions, Request, RequestBody, Response, ResponseBody, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

type Reply = oneshot::Sender<Result<ResponseBody>>;

struct Shared {
    writer: tokio::sync::Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    next_id: u64,
    waiting: HashMap<u64, Reply>,
    /// Set once the connection failed; every later call gets it.
    broken: Option<String>,
}

fn broken(message: &str) -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        message.to_owned(),
    ))
}

impl Shared {
    async fn request(&self, body: RequestBody) -> Result<ResponseBody> {
        let (reply, answer) = oneshot::channel();
        {
            let mut writer = self.writer.lock().await;
            let id = {
                let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(message) = &pending.broken {
                    return Err(broken(message));
                }
                pending.next_id += 1;
                let id = pending.next_id;
                pending.waiting.insert(id, reply);
                id
            };
            let mut bytes = Vec::new();
            frame::encode(&Request { id, body }, &mut bytes)?;
            if let Err(error) = writer.write_all(&bytes).await {
                self.fail(&format!("writing to the daemon: {error}"));
            }
        }
        match answer.await {
            Ok(result) => result,
            Err(_) => Err(broken("the connection to the daemon closed")),
        }
    }

    fn broken_reason(&self) -> Option<String> {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.broken.clone()
    }

    fn fail(&self, message: &str) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.broken.get_or_insert_with(|| message.to_owned());
        for (_, reply) in pending.waiting.drain() {
            let _ = reply.send(Err(broken(message)));
        }
    }

    async fn read_answers(self: Arc<Self>, mut reader: Box<dyn AsyncRead + Send + Unpin>) {
        let mut body = Vec::new();
        let failure = loop {
            let mut header = [0u8; FRAME_HEADER_BYTES];
            if let Err(error) = reader.read_exact(&mut header).await {
                break format!("reading from the daemon: {error}");
            }
            let header = match frame::parse_header(header, MAX_FRAME_BYTES) {
                Ok(header) => header,
                Err(error) => break error.to_string(),
            };
            body.resize(header.body_len, 0);
            if let Err(error) = reader.read_exact(&mut body).await {
                break format!("reading from the daemon: {error}");
            }
            let response: Response = match frame::decode_body(header, &body) {
                Ok(response) => response,
                Err(error) => break error.to_string(),
            };
            let reply = self
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .waiting
                .remove(&response.id);
            let result = match response.body {
                ResponseBody::Error { code, message } => Err(Error::Server { code, message }),
                body => Ok(body),
            };
            match reply {
                Some(reply) => {
                    let _ = reply.send(result);
                }
                // Id 0 is the daemon's answer to a frame it could not read; it closes next.
                None => {
                    if let Err(error) = result {
                        break error.to_string();
                    }
                }
            }
        };
        self.fail(&failure);
    }
}

/// One connection: its shared half and the task that reads its answers. Dropping it fails
/// every call still waiting on it (none waits forever) and ends the reading task, which closes
/// the connection.
struct Link {
    shared: Arc<Shared>,
    reader: tokio::task::AbortHandle,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.fail("the connection was closed by this client");
        self.reader.abort();
    }
}

/// A typed log held by the daemon, for async callers. Cheap to clone; clones share the
/// connection and may be used from many tasks at once.
///
/// ```no_run
/// use stela_client::{AsyncWal, Durability, WalOptions};
///
/// # async fn example() -> stela_client::Result<()> {
/// let options = WalOptions::default().durability(Durability::Replicated);
/// let wal: AsyncWal<String> =
///     AsyncWal::open("tcp://10.0.0.1:7000,tcp://10.0.0.2:7000", "orders", options).await?;
/// let lsn = wal.append(&"order 1".to_owned()).await?;
/// wal.commit(lsn).await?; // on the primary and in its standby's memory
/// # Ok(()) }
/// ```
pub struct AsyncWal<T> {
    session: Arc<Session>,
    options: WalOptions,
    max_record_bytes: usize,
    appended: Arc<AtomicU64>,
    _records: PhantomData<fn() -> T>,
}

impl<T> Clone for AsyncWal<T> {
    fn clone(&self) -> Self {
        AsyncWal {
            session: Arc::clone(&self.session),
            options: self.options.clone(),
            max_record_bytes: self.max_record_bytes,
            appended: Arc::clone(&self.appended),
            _records: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for AsyncWal<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncWal")
            .field("address", &self.session.address)
            .field("log", &self.session.name)
            .field("term", &self.session.term.load(Ordering::Relaxed))
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Where the log is and the connection to it now; replaced when a call finds the connection
/// broken (the daemon restarted) or the node no longer the primary, and the next call
/// reconnects. Shared by clones.
struct Session {
    address: Address,
    name: String,
    type_tag: String,
    /// The record type's schema sent with each open (`crate::wal::record_schema`).
    schema: Option<String>,
    current: tokio::sync::Mutex<Current>,
    /// The term of the current connection's handle, readable without waiting for the lock.
    term: AtomicU64,
}

/// The connection in use and the log's handle on it.
struct Current {
    link: Link,
    handle: u32,
    /// The term records appended through this handle get (0 without replication).
    term: u64,
    /// Which endpoint of an endpoint list this is (0 for a single address).
    endpoint: usize,
    /// Why this connection must not be used again although it is open (its node said it is
    /// no longer the primary).
    lost: Option<String>,
}

impl Current {
    fn unusable(&self) -> Option<String> {
        self.lost
            .clone()
            .or_else(|| self.link.shared.broken_reason())
    }
}

/// A log opened on one endpoint: the connection, handle and term, where the log stands and
/// the largest record the daemon takes.
struct Opened {
    current: Current,
    positions: Positions,
    max_record_bytes: usize,
}

/// Connects to one daemon, says hello, opens the log.
async fn connect_session(
    address: &Address,
    name: &str,
    type_tag: &str,
    options: &WalOptions,
    schema: Option<&str>,
) -> Result<Opened> {
    let connect_err = |source| Error::Connect {
        address: address.to_string(),
        source,
    };
    let mut token = None;
    let (reader, writer): (
        Box<dyn AsyncRead + Send + Unpin>,
        Box<dyn AsyncWrite + Send + Unpin>,
    ) = match address {
        Address::Unix(path) => {
            let (r, w) = tokio::net::UnixStream::connect(path)
                .await
                .map_err(connect_err)?
                .into_split();
            (Box::new(r), Box::new(w))
        }
        Address::Tcp(addr) => {
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(connect_err)?;
            stream.set_nodelay(true)?;
            let (r, w) = stream.into_split();
            (Box::new(r), Box::new(w))
        }
        Address::Tls(target) => {
            let (read, write, sent) = crate::tls::connect_async(target).await?;
            token = sent;
            (read, write)
        }
        Address::Cluster(_) => {
            return Err(Error::BadAddress {
                address: address.to_string(),
                reason: "a list inside a list".into(),
            })
        }
    };
    let shared = Arc::new(Shared {
        writer: tokio::sync::Mutex::new(writer),
        pending: Mutex::new(Pending::default()),
    });
    let reader = tokio::spawn(Arc::clone(&shared).read_answers(reader)).abort_handle();
    let link = Link { shared, reader };
    let shared = &link.shared;
    let hello = shared
        .request(RequestBody::Hello {
            version: PROTOCOL_VERSION,
            client: format!("stela-client async {}", env!("CARGO_PKG_VERSION")),
            role: stela_proto::Role::Client,
            token,
        })
        .await?;
    if !matches!(hello, ResponseBody::Welcome { .. }) {
        return Err(unexpected("Hello", hello));
    }
    let answer = shared
        .request(RequestBody::Open {
            log: name.to_owned(),
            codec: options.codec.name().to_owned(),
            type_tag: type_tag.to_owned(),
            create: options.create_if_missing,
            durability: Some(options.durability),
            schema: schema.map(str::to_owned),
        })
        .await?;
    let ResponseBody::Opened {
        handle,
        positions,
        max_record_bytes,
        term,
    } = answer
    else {
        return Err(unexpected("Open", answer));
    };
    Ok(Opened {
        current: Current {
            link,
            handle,
            term,
            endpoint: 0,
            lost: None,
        },
        positions,
        max_record_bytes: max_record_bytes as usize,
    })
}

/// Opens the log on the primary: the address itself, or, for an endpoint list, the endpoint
/// that opens it, as [`crate::Wal`] finds it: every endpoint is asked at once, each within
/// `ENDPOINT_WITHIN` (a stopped node delays nothing when another is the primary); a standby
/// refuses and is passed over; the first to open the log wins unless another has opened it by
/// then too, ranked by epoch, then nearness to `preferred`. The losers' connections close
/// when their tasks are dropped.
async fn find_primary(
    address: &Address,
    preferred: usize,
    name: &str,
    type_tag: &str,
    options: &WalOptions,
    schema: Option<&str>,
) -> Result<Opened> {
    let Address::Cluster(endpoints) = address else {
        return connect_session(address, name, type_tag, options, schema).await;
    };
    let mut asked = tokio::task::JoinSet::new();
    for (at, endpoint) in endpoints.iter().enumerate() {
        let (endpoint, name, type_tag) = (endpoint.clone(), name.to_owned(), type_tag.to_owned());
        let (options, schema) = (options.clone(), schema.map(str::to_owned));
        asked.spawn(async move {
            let opening = connect_session(&endpoint, &name, &type_tag, &options, schema.as_deref());
            let opened = match tokio::time::timeout(crate::wal::ENDPOINT_WITHIN, opening).await {
                Ok(opened) => opened,
                Err(_) => Err(Error::Connect {
                    address: endpoint.to_string(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {:?}", crate::wal::ENDPOINT_WITHIN),
                    ),
                }),
            };
            (at, opened)
        });
    }
    let rank = |at: usize, opened: &Opened| {
        crate::failover::rank(at, preferred, endpoints.len(), opened.current.term)
    };
    let mut tried = Vec::new();
    let mut best: Option<(usize, Opened)> = None;
    // Waits for the first endpoint to open the log (or all to fail), then takes only the
    // answers already in.
    loop {
        let next = if best.is_some() {
            asked.try_join_next()
        } else {
            asked.join_next().await
        };
        let Some(joined) = next else { break };
        let Ok((at, opened)) = joined else { continue };
        match opened {
            Ok(opened) => {
                if best
                    .as_ref()
                    .is_none_or(|(was, kept)| rank(at, &opened) > rank(*was, kept))
                {
                    best = Some((at, opened));
                }
            }
            Err(error) => tried.push((at, endpoints[at].to_string(), error.to_string())),
        }
    }
    match best {
        Some((at, mut opened)) => {
            opened.current.endpoint = at;
            Ok(opened)
        }
        None => {
            tried.sort_by_key(|(at, _, _)| *at);
            let tried = tried.into_iter().map(|(_, a, why)| (a, why)).collect();
            Err(Error::NoPrimary { tried })
        }
    }
}

/// Whether another endpoint of the list than `endpoint` is the primary of an epoch newer than
/// `epoch` (the blocking probe of [`crate::Wal`]'s watch, on a blocking thread).
async fn newer_primary_elsewhere(endpoints: &[Address], endpoint: usize, epoch: u64) -> bool {
    let others: Vec<Address> = endpoints
        .iter()
        .enumerate()
        .filter(|(at, _)| *at != endpoint)
        .map(|(_, other)| other.clone())
        .collect();
    tokio::task::spawn_blocking(move || {
        others
            .iter()
            .any(|other| crate::failover::primary_epoch(other).is_some_and(|newer| newer > epoch))
    })
    .await
    .unwrap_or(false)
}

impl<T: Serialize + DeserializeOwned> AsyncWal<T> {
    /// Connects to the daemon at `address` and opens the log `name`. Must run inside a tokio
    /// runtime (it spawns the task that reads answers).
    pub async fn open<A>(address: A, name: &str, options: WalOptions) -> Result<AsyncWal<T>>
    where
        A: TryInto<Address>,
        Error: From<A::Error>,
    {
        let address = address.try_into()?;
        let type_tag = options
            .type_tag
            .clone()
            .unwrap_or_else(stela_format::default_type_tag::<T>);
        let schema = crate::wal::record_schema::<T>(&options);
        let opened =
            find_primary(&address, 0, name, &type_tag, &options, schema.as_deref()).await?;
        Ok(AsyncWal {
            session: Arc::new(Session {
                address,
                name: name.to_owned(),
                type_tag,
                schema,
                term: AtomicU64::new(opened.current.term),
                current: tokio::sync::Mutex::new(opened.current),
            }),
            options,
            max_record_bytes: opened.max_record_bytes,
            appended: Arc::new(AtomicU64::new(opened.positions.last_lsn)),
            _records: PhantomData,
        })
    }

    /// Sends the request `make(handle)` on the current connection, reconnecting first if an
    /// earlier call found it broken or its node no longer the primary. A call that finds it
    /// broken fails with [`Error::Disconnected`] and is never sent again (as for the blocking
    /// client). Returns the term of the handle the request went out on, for [`in_doubt`].
    async fn call(
        &self,
        what: &'static str,
        make: impl FnOnce(u32) -> RequestBody,
    ) -> (u64, Result<ResponseBody>) {
        let (shared, handle, term, endpoint) = {
            let mut current = self.session.current.lock().await;
            if let Some(cause) = current.unusable() {
                if let Err(error) = self.reconnect(&mut current, cause).await {
                    return (current.term, Err(error));
                }
            }
            let shared = Arc::clone(&current.link.shared);
            (shared, current.handle, current.term, current.endpoint)
        };
        let answer = self.watched(&shared, endpoint, term, make(handle)).await;
        let answer = match answer {
            Err(error) if crate::wal::connection_lost(&error) => Err(Error::Disconnected {
                address: self.session.address.to_string(),
                during: what,
                cause: error.to_string(),
            }),
            Err(error) if crate::wal::node_replaced(&error) => {
                // This node is no longer the primary: the next call, a `resolve` above all,
                // looks for the current one rather than asking this node again.
                let mut current = self.session.current.lock().await;
                if Arc::ptr_eq(&current.link.shared, &shared) {
                    current.lost.get_or_insert_with(|| error.to_string());
                }
                Err(error)
            }
            other => other,
        };
        (term, answer)
    }

    /// Sends `body` on `shared` and waits for its answer. With an endpoint list, a wait past
    /// `probe_after` has the other endpoints asked, every 20 ms (as the blocking client's
    /// watch: `failover::PROBE_EVERY`), whether a newer primary took
    /// over; if one did, the connection is failed, so the call ends at once (in doubt, for a
    /// commit). A primary that is merely slow is never abandoned.
    async fn watched(
        &self,
        shared: &Shared,
        endpoint: usize,
        term: u64,
        body: RequestBody,
    ) -> Result<ResponseBody> {
        let Address::Cluster(endpoints) = &self.session.address else {
            return shared.request(body).await;
        };
        let request = shared.request(body);
        tokio::pin!(request);
        let newer_primary = async {
            tokio::time::sleep(self.options.probe_after).await;
            while !newer_primary_elsewhere(endpoints, endpoint, term >> 32).await {
                tokio::time::sleep(crate::failover::PROBE_EVERY).await;
            }
        };
        tokio::select! {
            answer = &mut request => answer,
            () = newer_primary => {
                tracing::warn!(endpoint = %endpoints[endpoint], "a newer primary took over: the request waiting on the old one is cut (in doubt)");
                // Every call waiting on this connection gets the error, this one included.
                shared.fail("a newer primary took over while the request waited");
                request.await
            }
        }
    }

    async fn reconnect(&self, current: &mut Current, cause: String) -> Result<()> {
        let session = &self.session;
        let deadline = tokio::time::Instant::now() + self.options.reconnect_within;
        let mut pause = std::time::Duration::from_millis(5);
        // A failover takes a few hundred milliseconds: look for the new primary often.
        let longest = if matches!(session.address, Address::Cluster(_)) {
            std::time::Duration::from_millis(25)
        } else {
            std::time::Duration::from_millis(200)
        };
        loop {
            match find_primary(
                &session.address,
                // The endpoint that was lost is the least likely to be the primary now.
                current.endpoint + 1,
                &session.name,
                &session.type_tag,
                &self.options,
                session.schema.as_deref(),
            )
            .await
            {
                Ok(opened) => {
                    *current = opened.current;
                    session.term.store(current.term, Ordering::Relaxed);
                    // What the new daemon holds is what counts as appended now.
                    self.appended
                        .store(opened.positions.last_lsn, Ordering::Relaxed);
                    return Ok(());
                }
                Err(error) if tokio::time::Instant::now() >= deadline => {
                    return Err(Error::Reconnect {
                        address: session.address.to_string(),
                        waited: self.options.reconnect_within,
                        cause,
                        last: error.to_string(),
                    })
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(longest);
                }
            }
        }
    }

    /// The term records appended now get (0 from a daemon without replication). With an LSN
    /// it names a record across a failover ([`AsyncWal::resolve`]).
    pub fn term(&self) -> u64 {
        self.session.term.load(Ordering::Relaxed)
    }

    /// As [`crate::Wal::resolve`]: what became of the record appended at `lsn` in `term` (from
    /// an [`Error::InDoubt`]), judged by the history of the primary this client reaches now:
    /// `Kept`, `Lost`, or `NotYet`. Only the primary of the newest epoch answers; on a refusal
    /// saying a node is not (any more) the primary, or a lost connection, the next endpoint is
    /// asked, for up to `reconnect_within` (at least twice).
    pub async fn resolve(&self, term: u64, lsn: Lsn) -> Result<Resolution> {
        let deadline = tokio::time::Instant::now() + self.options.reconnect_within;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (_, answer) = self
                .call("history", |handle| RequestBody::History { handle })
                .await;
            match answer.and_then(|answer| crate::wal::resolution_from_history(answer, term, lsn)) {
                Err(error)
                    if (crate::wal::node_replaced(&error)
                        || matches!(error, Error::Disconnected { .. }))
                        && (attempts < 2 || tokio::time::Instant::now() < deadline) =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                other => return other,
            }
        }
    }

    async fn append_at(&self, records: &[T], durability: Durability) -> Result<Lsn> {
        let payloads = encode_records(&self.options, self.max_record_bytes, records)?;
        let (term, answer) = self
            .call("append", |handle| RequestBody::Append {
                handle,
                durability,
                records: payloads,
            })
            .await;
        let answer = answer.map_err(|error| in_doubt(error, durability, term, None))?;
        let ResponseBody::Appended { last_lsn, .. } = answer else {
            return Err(unexpected("Append", answer));
        };
        self.appended.fetch_max(last_lsn, Ordering::Relaxed);
        Ok(Lsn::new(last_lsn))
    }

    /// As [`crate::Wal::append`].
    pub async fn append(&self, record: &T) -> Result<Lsn> {
        self.append_at(std::slice::from_ref(record), self.options.append_level())
            .await
    }

    /// As [`crate::Wal::append_batch`].
    pub async fn append_batch(&self, records: &[T]) -> Result<Lsn> {
        self.append_at(records, self.options.append_level()).await
    }

    /// As [`crate::Wal::append_durable`].
    pub async fn append_durable(&self, record: &T) -> Result<Lsn> {
        self.append_at(std::slice::from_ref(record), self.options.durability)
            .await
    }

    /// As [`crate::Wal::append_batch_durable`].
    pub async fn append_batch_durable(&self, records: &[T]) -> Result<Lsn> {
        self.append_at(records, self.options.durability).await
    }

    /// As [`crate::Wal::commit`]: resolves once everything up to `lsn` is at the log's
    /// durability.
    pub async fn commit(&self, lsn: Lsn) -> Result<()> {
        self.commit_at(lsn, self.options.durability).await
    }

    /// As [`crate::Wal::commit_at`]: resolves once everything up to `lsn` is at `durability`.
    pub async fn commit_at(&self, lsn: Lsn, durability: Durability) -> Result<()> {
        if lsn.get() <= self.appended.load(Ordering::Relaxed)
            && matches!(durability, Durability::Buffered | Durability::Unsafe)
        {
            return Ok(());
        }
        let (term, answer) = self
            .call("commit", |handle| RequestBody::Commit {
                handle,
                lsn: lsn.get(),
                durability,
            })
            .await;
        match answer.map_err(|error| in_doubt(error, durability, term, Some(lsn)))? {
            ResponseBody::Committed { .. } => Ok(()),
            other => Err(unexpected("Commit", other)),
        }
    }

    pub async fn positions(&self) -> Result<Positions> {
        match self
            .call("positions", |handle| RequestBody::Positions { handle })
            .await
            .1?
        {
            ResponseBody::Positions(positions) => Ok(positions),
            other => Err(unexpected("Positions", other)),
        }
    }

    /// As [`crate::Wal::durable_lsn`].
    pub async fn durable_lsn(&self) -> Result<Lsn> {
        Ok(Lsn::new(self.positions().await?.durable_lsn))
    }

    /// As [`crate::Wal::last_lsn`].
    pub async fn last_lsn(&self) -> Result<Lsn> {
        Ok(Lsn::new(self.positions().await?.last_lsn))
    }

    /// As [`crate::Wal::iter`]: every record, in order, fetched in batches as
    /// [`AsyncIter::next`] is awaited.
    pub fn iter(&self) -> AsyncIter<T> {
        self.iter_from(Lsn::FIRST)
    }

    /// As [`crate::Wal::iter_from`].
    pub fn iter_from(&self, lsn: Lsn) -> AsyncIter<T> {
        AsyncIter {
            wal: self.clone(),
            next: Lsn::new(lsn.get().max(1)),
            batch: Vec::new().into_iter(),
            done: false,
            reading: None,
        }
    }

    pub fn options(&self) -> &WalOptions {
        &self.options
    }

    /// As [`crate::Wal::close`]: commits everything this handle (and its clones) appended at
    /// the log's durability, then closes the handle in the daemon.
    pub async fn close(self) -> Result<()> {
        let last = self.appended.load(Ordering::Relaxed);
        if last > 0 && self.options.durability != Durability::Unsafe {
            self.commit(Lsn::new(last)).await?;
        }
        match self
            .call("close", |handle| RequestBody::Close { handle })
            .await
            .1?
        {
            ResponseBody::Closed => Ok(()),
            other => Err(unexpected("Close", other)),
        }
    }

    /// Up to `max_records` records from `from` on, in order (records still in the daemon's
    /// buffers included), and the LSN to ask for next. Empty when `from` is past the end.
    pub async fn read_from(&self, from: Lsn, max_records: u32) -> Result<(Vec<(Lsn, T)>, Lsn)> {
        let answer = self
            .call("read", |handle| RequestBody::Read {
                handle,
                from: from.get().max(1),
                max_records: max_records.max(1),
                max_bytes: 1 << 20,
            })
            .await
            .1?;
        let ResponseBody::Records { records, next, .. } = answer else {
            return Err(unexpected("Read", answer));
        };
        let mut out = Vec::with_capacity(records.len());
        for (lsn, payload) in records {
            let lsn = Lsn::new(lsn);
            let record = (self.options.codec.decode(&payload.0))
                .map_err(|source| Error::Decode { lsn, source })?;
            out.push((lsn, record));
        }
        Ok((out, Lsn::new(next)))
    }

    pub async fn truncate_before(&self, lsn: Lsn) -> Result<usize> {
        match self
            .call("truncate", |handle| RequestBody::Truncate {
                handle,
                before: lsn.get(),
            })
            .await
            .1?
        {
            ResponseBody::Truncated { segments } => Ok(segments as usize),
            other => Err(unexpected("Truncate", other)),
        }
    }
}

/// The records of an [`AsyncWal`], in order, fetched in batches: a [`futures_core::Stream`],
/// or `while let Some(item) = iter.next().await`. Yields an error and ends if the daemon
/// reports damage or goes away; ends at the end of the log as it is when the iterator reaches
/// it.
///
/// ```no_run
/// # async fn example(wal: stela_client::AsyncWal<String>) -> stela_client::Result<()> {
/// let mut records = wal.iter();
/// while let Some(item) = records.next().await {
///     let (lsn, record) = item?;
///     println!("{lsn}: {record}");
/// }
/// # Ok(()) }
/// ```
pub struct AsyncIter<T> {
    /// A clone of the log's handle (it shares the connection), so the iterator borrows
    /// nothing and can be moved to another task.
    wal: AsyncWal<T>,
    next: Lsn,
    batch: std::vec::IntoIter<(Lsn, T)>,
    done: bool,
    /// The read of the next batch, while one is in flight.
    reading: Option<ReadBatch<T>>,
}

type ReadBatch<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(Vec<(Lsn, T)>, Lsn)>> + Send>>;

// No field is ever pinned in place: the batch read in flight is boxed.
impl<T> Unpin for AsyncIter<T> {}

impl<T> std::fmt::Debug for AsyncIter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncIter")
            .field("next", &self.next)
            .field("buffered", &self.batch.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<T: Serialize + DeserializeOwned + Send + 'static> AsyncIter<T> {
    /// The next record, `None` at the end of the log as it is when the iterator reaches it
    /// (the same as `StreamExt::next`).
    pub async fn next(&mut self) -> Option<Result<(Lsn, T)>> {
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(std::pin::Pin::new(self), cx))
            .await
    }
}

impl<T: Serialize + DeserializeOwned + Send + 'static> futures_core::Stream for AsyncIter<T> {
    type Item = Result<(Lsn, T)>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        loop {
            if let Some(item) = this.batch.next() {
                return Poll::Ready(Some(Ok(item)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            let (wal, from) = (this.wal.clone(), this.next);
            let reading = this
                .reading
                .get_or_insert_with(|| Box::pin(async move { wal.read_from(from, 1024).await }));
            let Poll::Ready(read) = std::future::Future::poll(reading.as_mut(), cx) else {
                return Poll::Pending;
            };
            this.reading = None;
            match read {
                Ok((records, next)) => {
                    this.done = records.is_empty();
                    this.next = next;
                    this.batch = records.into_iter();
                }
                Err(error) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(error)));
                }
            }
        }
    }
}
