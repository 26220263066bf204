//! [`AsyncWal<T>`]: the same typed log for async code (tokio). Many calls may be in flight on
//! one connection at once: each request gets an id, a background task reads the answers and
//! hands each to the call that waits for it.
//!
//! Invariants: an id is registered before its request is written, so an answer always finds
//! its caller; if the connection fails, every call in flight gets the error (none waits
//! forever, none is sent again), and the next call reconnects and reopens the log within
//! `WalOptions::reconnect_within`, else fails naming the address. The daemon answers a connection's requests in order, so a `disk`
//! commit delays the answers queued behind it on the same connection; open one `AsyncWal` per
//! independent stream of commits if that matters.
//!
//! Unlike the blocking client this one does not spin while it waits (the runtime's reactor does
//! the waiting), so a round trip includes a thread wake-up (about 60 us on virtual CPUs).

use crate::connection::{unexpected, Address};
use crate::wal::{encode_records, WalOptions};
use crate::{Error, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

    fn is_broken(&self) -> bool {
        self.broken_reason().is_some()
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

/// A typed log held by the daemon, for async callers. Cheap to clone; clones share the
/// connection and may be used from many tasks at once.
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

/// Where the log is and the connection to it now; replaced when a call finds the connection
/// broken (the daemon restarted) and the next call reconnects. Shared by clones.
struct Session {
    address: Address,
    name: String,
    type_tag: String,
    /// The record type's schema sent with each open (`crate::wal::record_schema`).
    schema: Option<String>,
    current: tokio::sync::Mutex<(Arc<Shared>, u32)>,
}

/// Connects, says hello, opens the log. Returns the connection, the handle, where the log
/// stands and the largest record the daemon takes.
async fn connect_session(
    address: &Address,
    name: &str,
    type_tag: &str,
    options: &WalOptions,
    schema: Option<&str>,
) -> Result<(Arc<Shared>, u32, Positions, usize)> {
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
                reason: "AsyncWal takes one daemon; use Wal for an endpoint list".into(),
            })
        }
    };
    let shared = Arc::new(Shared {
        writer: tokio::sync::Mutex::new(writer),
        pending: Mutex::new(Pending::default()),
    });
    tokio::spawn(Arc::clone(&shared).read_answers(reader));
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
        ..
    } = answer
    else {
        return Err(unexpected("Open", answer));
    };
    Ok((shared, handle, positions, max_record_bytes as usize))
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
        let (shared, handle, positions, max_record_bytes) =
            connect_session(&address, name, &type_tag, &options, schema.as_deref()).await?;
        Ok(AsyncWal {
            session: Arc::new(Session {
                address,
                name: name.to_owned(),
                type_tag,
                schema,
                current: tokio::sync::Mutex::new((shared, handle)),
            }),
            options,
            max_record_bytes,
            appended: Arc::new(AtomicU64::new(positions.last_lsn)),
            _records: PhantomData,
        })
    }

    /// Sends the request `make(handle)` on the current connection, reconnecting first if an
    /// earlier call found it broken. A call that finds it broken fails with
    /// [`Error::Disconnected`] and is never sent again (as for the blocking client).
    async fn call(
        &self,
        what: &'static str,
        make: impl FnOnce(u32) -> RequestBody,
    ) -> Result<ResponseBody> {
        let (shared, handle) = {
            let mut current = self.session.current.lock().await;
            if current.0.is_broken() {
                self.reconnect(&mut current).await?;
            }
            (Arc::clone(&current.0), current.1)
        };
        match shared.request(make(handle)).await {
            Err(error) if crate::wal::connection_lost(&error) => Err(Error::Disconnected {
                address: self.session.address.to_string(),
                during: what,
                cause: error.to_string(),
            }),
            other => other,
        }
    }

    async fn reconnect(&self, current: &mut (Arc<Shared>, u32)) -> Result<()> {
        let session = &self.session;
        let cause = current.0.broken_reason().unwrap_or_default();
        let deadline = tokio::time::Instant::now() + self.options.reconnect_within;
        let mut pause = std::time::Duration::from_millis(5);
        loop {
            match connect_session(
                &session.address,
                &session.name,
                &session.type_tag,
                &self.options,
                session.schema.as_deref(),
            )
            .await
            {
                Ok((shared, handle, positions, _)) => {
                    *current = (shared, handle);
                    // What the new daemon holds is what counts as appended now.
                    self.appended.store(positions.last_lsn, Ordering::Relaxed);
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
                    pause = (pause * 2).min(std::time::Duration::from_millis(200));
                }
            }
        }
    }

    async fn append_at(&self, records: &[T], durability: Durability) -> Result<Lsn> {
        let payloads = encode_records(&self.options, self.max_record_bytes, records)?;
        let answer = self
            .call("append", |handle| RequestBody::Append {
                handle,
                durability,
                records: payloads,
            })
            .await
            .map_err(|error| unprotected(error, None))?;
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
        match self
            .call("commit", |handle| RequestBody::Commit {
                handle,
                lsn: lsn.get(),
                durability,
            })
            .await
            .map_err(|error| unprotected(error, Some(lsn.get())))?
        {
            ResponseBody::Committed { .. } => Ok(()),
            other => Err(unexpected("Commit", other)),
        }
    }

    pub async fn positions(&self) -> Result<Positions> {
        match self
            .call("positions", |handle| RequestBody::Positions { handle })
            .await?
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
    pub fn iter(&self) -> AsyncIter<'_, T> {
        self.iter_from(Lsn::FIRST)
    }

    /// As [`crate::Wal::iter_from`].
    pub fn iter_from(&self, lsn: Lsn) -> AsyncIter<'_, T> {
        AsyncIter {
            wal: self,
            next: Lsn::new(lsn.get().max(1)),
            batch: Vec::new().into_iter(),
            done: false,
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
            .await?
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
            .await?;
        let ResponseBody::Records { records, next, .. } = answer else {
            return Err(unexpected("Read", answer));
        };
        let mut out = Vec::with_capacity(records.len());
        for (lsn, payload) in records {
            out.push((Lsn::new(lsn), self.options.codec.decode(&payload.0)?));
        }
        Ok((out, Lsn::new(next)))
    }

    pub async fn truncate_before(&self, lsn: Lsn) -> Result<usize> {
        match self
            .call("truncate", |handle| RequestBody::Truncate {
                handle,
                before: lsn.get(),
            })
            .await?
        {
            ResponseBody::Truncated { segments } => Ok(segments as usize),
            other => Err(unexpected("Truncate", other)),
        }
    }
}

/// The records of an [`AsyncWal`], in order: `while let Some(item) = iter.next().await`.
pub struct AsyncIter<'a, T> {
    wal: &'a AsyncWal<T>,
    next: Lsn,
    batch: std::vec::IntoIter<(Lsn, T)>,
    done: bool,
}

impl<T: Serialize + DeserializeOwned> AsyncIter<'_, T> {
    /// The next record, `None` at the end of the log as it is when the iterator reaches it.
    pub async fn next(&mut self) -> Option<Result<(Lsn, T)>> {
        if let Some(item) = self.batch.next() {
            return Some(Ok(item));
        }
        if self.done {
            return None;
        }
        match self.wal.read_from(self.next, 1024).await {
            Ok((records, next)) => {
                if records.is_empty() {
                    self.done = true;
                    return None;
                }
                self.next = next;
                self.batch = records.into_iter();
                self.batch.next().map(Ok)
            }
            Err(error) => {
                self.done = true;
                Some(Err(error))
            }
        }
    }
}

/// A commit the primary answered without a standby is [`Error::Unprotected`] (this handle does
/// not track its term: 0), never a plain refusal a caller might read past.
fn unprotected(error: Error, lsn: Option<u64>) -> Error {
    match error {
        Error::Server {
            code: crate::ErrorCode::Unprotected,
            message,
        } => Error::Unprotected {
            term: 0,
            lsn,
            cause: message,
        },
        other => other,
    }
}
