//! Log shipping to a hot standby (RemusDB's commit protection, with the log as the only state
//! shipped): the primary's side. One shipper thread per open log sends the log's framed bytes to
//! the standby as they are appended (from the pool's buffers, or from the segment files when the
//! standby is behind what the buffers still hold); an acknowledgement reader takes the standby's
//! received and durable LSNs and releases the `replicated` and `all` waiters they satisfy.
//! [`standby`] is the other end.
//!
//! Invariants:
//! - **Only commit acknowledgements wait.** Appends and `buffered`/`disk` commits never touch this
//!   module's locks on their way; shipping runs beside them. A `replicated` waiter is released
//!   only by an acknowledgement from the standby that it holds the LSN (checked and in its
//!   memory, written behind), an `all` waiter only once that is so *and* the LSN is on the
//!   primary's disk.
//! - **Bytes shipped are the bytes written.** The shipper copies frames exactly as the pool framed
//!   them, and segment headers exactly as the flusher creates them, so the standby's segments are
//!   byte-identical (`stela_wal::mirror` checks every chunk).
//! - **Terms.** Every message carries the log's current term (`stela_wal::TermStore`, in the log's
//!   directory); a standby at a higher term refuses the stream and the primary stops shipping.
//! - **Never silent.** While the standby is unreachable, `replicated` waits block (RemusDB's
//!   choice: an acknowledgement is a promise); the shipper retries and says so in the log.

// The standby's listener uses the event loop's authentication, which the loom build leaves out.
#[cfg(not(loom))]
pub mod standby;

use crate::pool::{LogId, Pool, PoolError, Ship};
use crate::sync::lock;
use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use stela_format::header::HEADER_BYTES;
use stela_format::term::Term;
use stela_format::{Codec, Lsn, SegmentHeader, TypeTag};
use stela_proto::repl::{chunk_message, ReplMessage};
use stela_proto::{frame, MAX_FRAME_BYTES};
use stela_wal::mirror::{read_chunk, Position};
use stela_wal::{SegmentSet, TermStore};

/// Most bytes one chunk carries.
const CHUNK_BYTES: usize = 1 << 20;
/// How long an idle shipper waits before a heartbeat.
const HEARTBEAT: Duration = Duration::from_millis(50);
/// How long a shipper waits before trying an unreachable standby again.
const RETRY: Duration = Duration::from_millis(100);

/// The primary's replication: one [`Link`] per open log.
pub struct Replication {
    standby: SocketAddr,
    node: String,
    links: Mutex<HashMap<LogId, Arc<Link>>>,
    /// Called once after waiters were released (wakes the event loop once for all of them).
    released: Released,
    /// `--degrade-after`: how long the standby may be unreachable before `replicated` commits
    /// are acknowledged without it.
    degrade_after: Option<Duration>,
    /// TLS to the standby, and the token that proves this primary (none: plain TCP).
    tls: Option<StandbyTls>,
}

/// How a primary reaches its standby over TLS.
pub struct StandbyTls {
    pub config: Arc<stela_net::tls::rustls::ClientConfig>,
    /// The name the standby's certificate must carry.
    pub name: stela_net::tls::rustls::pki_types::ServerName<'static>,
    /// Sent in `Open` (an administrator's token of the standby), if not proven by certificate.
    pub token: Option<String>,
}

/// One end of a replication connection (plain TCP, or TLS through `stela_net::duplex`).
pub(crate) type Reader = Box<dyn Read + Send>;
pub(crate) type Writer = Box<dyn Write + Send>;

/// What to call after releasing waiters.
pub type Released = Arc<dyn Fn() + Send + Sync>;

/// Who to tell when a `replicated` wait ends (the same shape as the engine's `disk` waiters,
/// named here so that this module needs nothing from the engine, which uses it).
pub type Waiter = Box<dyn FnOnce(Result<(), PoolError>) + Send>;

/// What a log's shipper and its waiters share.
struct Link {
    name: String,
    state: Mutex<LinkState>,
    /// Signalled on every append (the shipper has bytes to send) and on stop.
    appended: Condvar,
    stop: AtomicBool,
}

#[derive(Default)]
struct LinkState {
    /// Highest LSN the standby holds in memory / on disk, as it last said.
    received: u64,
    standby_durable: u64,
    /// Appends since the shipper last looked.
    dirty: bool,
    connected: bool,
    /// `replicated` waiters: (LSN, who to tell).
    waiters: Vec<(u64, Waiter)>,
    /// Set when the standby refused this primary's term: no `replicated` acknowledgement can
    /// come from it any more.
    fenced: Option<String>,
    /// The term this log is shipped in, and when the standby last acknowledged anything.
    term: u64,
    last_ack: Option<std::time::Instant>,
    /// Segment bytes shipped and the bytes they took on the wire.
    shipped_bytes: u64,
    wire_bytes: u64,
    /// Since when the standby is unreachable (none while connected).
    unreachable_since: Option<std::time::Instant>,
    /// `--degrade-after` passed while unreachable: `replicated` waits are answered at once.
    degraded: bool,
    degraded_acks: u64,
}

/// What the shipper needs of a log.
pub struct LogInfo {
    pub id: LogId,
    pub name: String,
    pub codec: Codec,
    pub type_tag: String,
    pub segments: Arc<SegmentSet>,
    pub dir: std::path::PathBuf,
}

impl Replication {
    pub fn new(
        standby: SocketAddr,
        node: String,
        released: Released,
        degrade_after: Option<Duration>,
        tls: Option<StandbyTls>,
    ) -> Replication {
        Replication {
            standby,
            node,
            links: Mutex::new(HashMap::new()),
            released,
            degrade_after,
            tls,
        }
    }

    /// A connection to the standby: its reading and writing ends, and the socket (to cut it).
    fn connect(&self) -> Result<(Reader, Writer, TcpStream), String> {
        let tcp = TcpStream::connect_timeout(&self.standby, Duration::from_secs(1))
            .map_err(|e| format!("connect {}: {e}", self.standby))?;
        let _ = tcp.set_nodelay(true);
        let socket = tcp.try_clone().map_err(|e| e.to_string())?;
        match &self.tls {
            None => {
                let writer = tcp.try_clone().map_err(|e| e.to_string())?;
                Ok((Box::new(tcp), Box::new(writer), socket))
            }
            Some(tls) => {
                let connection = stela_net::tls::rustls::ClientConnection::new(
                    Arc::clone(&tls.config),
                    tls.name.clone(),
                )
                .map_err(|e| e.to_string())?;
                let (reader, writer) =
                    stela_net::duplex::duplex(tcp, connection, Duration::from_secs(5))
                        .map_err(|e| format!("TLS to {}: {e}", self.standby))?;
                Ok((Box::new(reader), Box::new(writer), socket))
            }
        }
    }

    fn token(&self) -> Option<String> {
        self.tls.as_ref().and_then(|tls| tls.token.clone())
    }

    /// Starts shipping `log` (once per open log).
    pub fn watch<W: Send + 'static>(
        self: &Arc<Self>,
        pool: &Arc<Pool<W>>,
        log: LogInfo,
        storage: Arc<dyn stela_wal::storage::Storage>,
    ) {
        let mut links = lock(&self.links);
        if links.contains_key(&log.id) {
            return;
        }
        let link = Arc::new(Link {
            name: log.name.clone(),
            state: Mutex::new(LinkState::default()),
            appended: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        links.insert(log.id, Arc::clone(&link));
        let (me, pool) = (Arc::clone(self), Arc::clone(pool));
        let spawned = std::thread::Builder::new()
            .name(format!("stela-ship-{}", log.id))
            .spawn(move || me.ship_log(&pool, &link, &log, storage));
        if let Err(error) = spawned {
            tracing::error!(%error, "could not start a shipper thread; replicated commits of this log will wait");
        }
    }

    /// Stops shipping `log` (it was closed); its waiters are told.
    pub fn unwatch(&self, log: LogId) {
        if let Some(link) = lock(&self.links).remove(&log) {
            link.stop.store(true, Ordering::SeqCst);
            link.appended.notify_all();
            let waiters = std::mem::take(&mut lock(&link.state).waiters);
            for (_, waiter) in waiters {
                waiter(Err(PoolError::Closed));
            }
            (self.released)();
        }
    }

    /// Stops every shipper (the daemon is shutting down, everything is written).
    pub fn stop_all(&self) {
        let logs: Vec<LogId> = lock(&self.links).keys().copied().collect();
        for log in logs {
            self.unwatch(log);
        }
    }

    /// Records of `log` were appended: its shipper has work.
    pub fn appended(&self, log: LogId) {
        if let Some(link) = lock(&self.links).get(&log) {
            lock(&link.state).dirty = true;
            link.appended.notify_one();
        }
    }

    /// Calls `waiter` once the standby holds `lsn` of `log`. `Ok(true)`: it already does (the
    /// waiter is dropped uncalled).
    pub fn when_received(&self, log: LogId, lsn: u64, waiter: Waiter) -> Result<bool, PoolError> {
        let Some(link) = lock(&self.links).get(&log).cloned() else {
            return Err(PoolError::Closed);
        };
        let mut state = lock(&link.state);
        if state.received >= lsn {
            return Ok(true);
        }
        if state.degraded {
            state.degraded_acks += 1;
            return Ok(true);
        }
        if let Some(why) = &state.fenced {
            tracing::warn!(log = %link.name, why, "replicated commit refused: fenced");
            return Err(PoolError::Closed);
        }
        state.waiters.push((lsn, waiter));
        Ok(false)
    }

    /// Before `log` is opened (its files in `dir`): if the standby holds records of it that this
    /// primary lost (it crashed after acknowledging them at `replicated`), fetches them into the
    /// files, so that the log opens with every acknowledged record. Returns how many records
    /// came back. Does nothing when the standby is unreachable, not ahead, or diverged (shipping
    /// then reports it).
    pub fn catch_up(
        &self,
        log: &str,
        dir: &std::path::Path,
        type_tag: &str,
        options: stela_wal::WalOptions,
    ) -> Result<u64, String> {
        let storage = Arc::clone(&options.storage);
        let codec = options.codec;
        if storage.list(dir).map_or(true, |names| names.is_empty()) {
            return Ok(0);
        }
        let terms = TermStore::open(Arc::clone(&storage), dir).map_err(|e| e.to_string())?;
        if terms.current() == Term(0) {
            return Ok(0); // never replicated
        }
        let term = terms.current().0;
        let mut mirror =
            stela_wal::mirror::Mirror::open(dir, options, type_tag).map_err(|e| e.to_string())?;
        let (reader, mut writer, _socket) = match self.connect() {
            Ok(ends) => ends,
            Err(why) => {
                tracing::warn!(log, standby = %self.standby, why, "standby unreachable at open: records it may hold that this primary lost are not fetched");
                return Ok(0);
            }
        };
        let mut reader = BufReader::new(reader);
        send(
            &mut writer,
            &ReplMessage::Open {
                term,
                node: self.node.clone(),
                log: log.to_owned(),
                codec: codec.name().to_owned(),
                type_tag: type_tag.to_owned(),
                token: self.token(),
            },
        )?;
        let (theirs, their_end) = match receive(&mut reader)? {
            ReplMessage::Position {
                next_lsn, history, ..
            } => (history, next_lsn - 1),
            ReplMessage::Refuse { message, .. } => return Err(message),
            other => return Err(format!("expected the standby's position, got {other:?}")),
        };
        let ours_end = mirror.received_lsn();
        let theirs = stela_format::term::TermHistory::from_entries(
            theirs.into_iter().map(|(t, f)| (Term(t), f)),
        )
        .map_err(|e| format!("the standby's term history: {e}"))?;
        let agreed =
            stela_format::term::divergence((terms.history(), ours_end), (&theirs, their_end));
        if their_end <= ours_end || agreed < ours_end {
            return Ok(0);
        }
        let at = mirror.position();
        send(
            &mut writer,
            &ReplMessage::Fetch {
                term,
                segment_start: at.segment_start.get(),
                offset: at.offset,
                next_lsn: at.next_lsn.get(),
            },
        )?;
        let mut bytes_back = 0u64;
        loop {
            match receive(&mut reader)? {
                ReplMessage::Chunk {
                    segment_start,
                    offset,
                    raw_len,
                    compressed,
                    bytes,
                    ..
                } => {
                    let bytes = stela_proto::repl::chunk_bytes(raw_len, compressed, bytes)
                        .map_err(|e| e.to_string())?;
                    bytes_back += bytes.len() as u64;
                    mirror
                        .apply(stela_wal::mirror::Chunk {
                            segment_start: Lsn::new(segment_start),
                            offset,
                            bytes: &bytes,
                        })
                        .map_err(|e| e.to_string())?;
                }
                ReplMessage::Position { .. } => break,
                ReplMessage::Refuse { message, .. } => return Err(message),
                other => return Err(format!("unexpected {other:?} while fetching")),
            }
        }
        mirror.sync().map_err(|e| e.to_string())?;
        let fetched = mirror.received_lsn() - ours_end;
        tracing::warn!(
            log,
            fetched,
            bytes = bytes_back,
            from = ours_end + 1,
            "fetched from the standby the records this primary lost"
        );
        Ok(fetched)
    }

    /// Where each log's standby stands, for `stela status`; `last_lsn` gives a log's newest LSN.
    pub fn status(&self, last_lsn: impl Fn(LogId) -> u64) -> stela_proto::ReplicationStatus {
        let mut logs: Vec<stela_proto::ReplicaStatus> = lock(&self.links)
            .iter()
            .map(|(&id, link)| {
                let s = lock(&link.state);
                let lag_records = last_lsn(id).saturating_sub(s.received);
                stela_proto::ReplicaStatus {
                    log: link.name.clone(),
                    connected: s.connected,
                    term: s.term,
                    received_lsn: s.received,
                    durable_lsn: s.standby_durable,
                    lag_records,
                    lag_ms: if lag_records > 0 {
                        s.last_ack.map_or(0, |at| at.elapsed().as_millis() as u64)
                    } else {
                        0
                    },
                    stopped: s.fenced.clone(),
                    shipped_bytes: s.shipped_bytes,
                    wire_bytes: s.wire_bytes,
                    degraded: s.degraded,
                    degraded_acks: s.degraded_acks,
                }
            })
            .collect();
        logs.sort_by(|a, b| a.log.cmp(&b.log));
        stela_proto::ReplicationStatus {
            role: "primary".into(),
            peer: self.standby.to_string(),
            logs,
        }
    }

    fn ship_log<W>(
        &self,
        pool: &Pool<W>,
        link: &Arc<Link>,
        log: &LogInfo,
        storage: Arc<dyn stela_wal::storage::Storage>,
    ) {
        let mut terms = match TermStore::open(Arc::clone(&storage), &log.dir) {
            Ok(terms) => terms,
            Err(error) => {
                tracing::error!(log = %log.name, %error, "cannot read the log's terms; not shipping it");
                return;
            }
        };
        // Every start of a primary is a new term: records it lost in a crash may have been
        // shipped, and their LSNs are given to new records now; the new term tells the two apart.
        let (next, _) = pool.positions(log.id);
        let first = if terms.history().entries().is_empty() {
            1
        } else {
            next
        };
        let term = Term(terms.current().0 + 1);
        if let Err(error) = terms.begin(term, first) {
            tracing::error!(log = %log.name, %error, "cannot record the log's new term; not shipping it");
            return;
        }
        let term = term.0;
        lock(&link.state).term = term;
        let mut warned = false;
        while !link.stop.load(Ordering::SeqCst) {
            match self.session(pool, link, log, term) {
                Ok(()) => return,
                Err(why) => {
                    {
                        let mut state = lock(&link.state);
                        state.connected = false;
                        state
                            .unreachable_since
                            .get_or_insert_with(std::time::Instant::now);
                    }
                    if !warned {
                        tracing::warn!(log = %log.name, standby = %self.standby, why, "standby unreachable; replicated commits wait; retrying");
                        warned = true;
                    }
                    if lock(&link.state).fenced.is_some() {
                        return;
                    }
                    self.degrade_if_due(link);
                    std::thread::sleep(RETRY);
                }
            }
        }
    }

    /// One connection to the standby: handshake, then ship until stopped or broken.
    fn session<W>(
        &self,
        pool: &Pool<W>,
        link: &Arc<Link>,
        log: &LogInfo,
        term: u64,
    ) -> Result<(), String> {
        let (reader, mut writer, socket) = self.connect()?;
        let mut reader = BufReader::new(reader);
        send(
            &mut writer,
            &ReplMessage::Open {
                term,
                node: self.node.clone(),
                log: log.name.clone(),
                codec: log.codec.name().to_owned(),
                type_tag: log.type_tag.clone(),
                token: self.token(),
            },
        )?;
        let mut at = match receive(&mut reader)? {
            ReplMessage::Position {
                segment_start,
                offset,
                next_lsn,
                durable_lsn,
                history,
                ..
            } => {
                let (ours, _) = pool.positions(log.id);
                if next_lsn > ours {
                    return Err(self.fence(
                        link,
                        u64::MAX,
                        term,
                        format!(
                            "the standby holds records up to LSN {} and this primary only up to {}: the copies diverged, and cutting the standby's suffix (reprotection) is not built yet",
                            next_lsn - 1,
                            ours - 1
                        ),
                    ));
                }
                // Records the standby holds in this primary's own term came from it: they count.
                if history.last().is_some_and(|&(t, _)| t == term)
                    && release(link, next_lsn - 1, durable_lsn)
                {
                    (self.released)();
                }
                Position {
                    segment_start: Lsn::new(segment_start),
                    offset,
                    next_lsn: Lsn::new(next_lsn),
                }
            }
            ReplMessage::Refuse {
                term: theirs,
                message,
            } => {
                return Err(self.fence(link, theirs, term, message));
            }
            other => return Err(format!("expected the standby's position, got {other:?}")),
        };
        {
            let mut state = lock(&link.state);
            state.connected = true;
            state.unreachable_since = None;
            if std::mem::take(&mut state.degraded) {
                tracing::warn!(log = %log.name, standby = %self.standby, degraded_acks = state.degraded_acks, "standby back: replicated commits wait for it again");
            }
        }
        tracing::info!(log = %log.name, standby = %self.standby, from = at.next_lsn.get(), "shipping to the standby");
        // Acknowledgements arrive on their own thread, so shipping never waits for them.
        let acks = {
            let link = Arc::clone(link);
            std::thread::Builder::new()
                .name("stela-ship-acks".into())
                .spawn({
                    let released = Arc::clone(&self.released);
                    move || read_acks(reader, &link, term, &*released)
                })
                .map_err(|e| e.to_string())?
        };
        let mut header = header_for(&log.segments, at.segment_start, log, None)?;
        let result = loop {
            if link.stop.load(Ordering::SeqCst) {
                break Ok(());
            }
            if acks.is_finished() {
                break Err("the standby closed the stream".to_owned());
            }
            // Next bytes: from memory if the pool still holds them, else from the files.
            let shipped = match pool.ship(
                log.id,
                (at.segment_start.get(), at.offset, at.next_lsn.get()),
                CHUNK_BYTES,
            ) {
                Ship::Bytes {
                    segment,
                    offset,
                    bytes,
                    next_lsn,
                    new_segment_capacity,
                } => Some((segment, offset, bytes, next_lsn, new_segment_capacity)),
                Ship::OnDisk => {
                    let (_, durable) = pool.positions(log.id);
                    read_chunk(&log.segments, at, Lsn::new(durable + 1), CHUNK_BYTES)
                        .map_err(|e| e.to_string())?
                        .map(|(segment, offset, bytes, next)| {
                            (segment.get(), offset, bytes, next.get(), 0)
                        })
                }
                Ship::Nothing => None,
            };
            let Some((segment, offset, mut bytes, next_lsn, capacity)) = shipped else {
                let mut state = lock(&link.state);
                if !state.dirty {
                    let (next, timeout) = link
                        .appended
                        .wait_timeout(state, HEARTBEAT)
                        .unwrap_or_else(|e| e.into_inner());
                    state = next;
                    if timeout.timed_out() && !state.dirty {
                        drop(state);
                        send(&mut writer, &ReplMessage::Heartbeat { term })?;
                        continue;
                    }
                }
                state.dirty = false;
                continue;
            };
            // A segment the standby has not started yet goes with its header, exactly as the
            // flusher writes it.
            let mut offset = offset;
            if offset == HEADER_BYTES as u64 {
                if segment != header.start_lsn.get() {
                    header = header_for(
                        &log.segments,
                        Lsn::new(segment),
                        log,
                        Some((&header, capacity)),
                    )?;
                }
                let mut whole = header.encode().to_vec();
                whole.append(&mut bytes);
                bytes = whole;
                offset = 0;
            }
            if offset == 0 {
                // A header read from the files: later segments are numbered after it.
                if let Ok(read) = SegmentHeader::decode(&bytes[..HEADER_BYTES.min(bytes.len())]) {
                    header = read;
                }
            }
            let message = chunk_message(term, segment, offset, &bytes);
            if let ReplMessage::Chunk { bytes: wire, .. } = &message {
                let mut state = lock(&link.state);
                state.shipped_bytes += bytes.len() as u64;
                state.wire_bytes += wire.len() as u64;
            }
            send(&mut writer, &message)?;
            at = Position {
                segment_start: Lsn::new(segment),
                offset: offset + bytes.len() as u64,
                next_lsn: Lsn::new(next_lsn),
            };
        };
        // Cutting the socket ends the acknowledgement reader's wait, TLS or not.
        drop(writer);
        let _ = socket.shutdown(std::net::Shutdown::Both);
        let _ = acks.join();
        result
    }

    /// `--degrade-after`: once the standby has been unreachable that long, answers every
    /// `replicated` waiter (the records stay in this primary's buffers: `buffered`'s promise) and
    /// every later one at once, loudly, until the standby is back.
    fn degrade_if_due(&self, link: &Link) {
        let Some(after) = self.degrade_after else {
            return;
        };
        let waiters = {
            let mut state = lock(&link.state);
            let due = state
                .unreachable_since
                .is_some_and(|t| t.elapsed() >= after);
            if !due || state.degraded {
                return;
            }
            state.degraded = true;
            let waiters = std::mem::take(&mut state.waiters);
            state.degraded_acks += waiters.len() as u64;
            tracing::error!(log = %link.name, standby = %self.standby, after_ms = after.as_millis() as u64, waiting = waiters.len(),
                "standby unreachable too long: replicated commits are acknowledged WITHOUT it (as buffered) until it is back");
            waiters
        };
        for (_, waiter) in waiters {
            waiter(Ok(()));
        }
        (self.released)();
    }

    fn fence(&self, link: &Link, theirs: u64, ours: u64, message: String) -> String {
        let why = format!("the standby refused term {ours} (it is at term {theirs}): {message}");
        let mut state = lock(&link.state);
        if theirs > ours {
            state.connected = false;
            state.fenced = Some(why.clone());
            for (_, waiter) in state.waiters.drain(..) {
                waiter(Err(PoolError::Closed));
            }
            drop(state);
            (self.released)();
            tracing::error!(log = %link.name, why, "fenced: a newer primary exists; replicated commits are refused");
        }
        why
    }
}

/// Releases the waiters `received` satisfies; whether there were any.
fn release(link: &Link, received: u64, durable: u64) -> bool {
    let ready: Vec<Waiter> = {
        let mut state = lock(&link.state);
        state.last_ack = Some(std::time::Instant::now());
        state.received = state.received.max(received);
        state.standby_durable = state.standby_durable.max(durable);
        let received = state.received;
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut state.waiters)
            .into_iter()
            .partition(|(lsn, _)| *lsn <= received);
        state.waiters = waiting;
        ready.into_iter().map(|(_, w)| w).collect()
    };
    let any = !ready.is_empty();
    for waiter in ready {
        waiter(Ok(()));
    }
    any
}

fn read_acks(
    mut reader: BufReader<Reader>,
    link: &Arc<Link>,
    term: u64,
    released: &(dyn Fn() + Send + Sync),
) {
    loop {
        match receive(&mut reader) {
            Ok(ReplMessage::Ack {
                term: theirs,
                received_lsn,
                durable_lsn,
            }) if theirs == term => {
                if release(link, received_lsn, durable_lsn) {
                    released();
                }
            }
            Ok(ReplMessage::Refuse {
                term: theirs,
                message,
            }) => {
                tracing::warn!(log = %link.name, theirs, message, "the standby refused the stream");
                if theirs > term {
                    let mut state = lock(&link.state);
                    state.fenced = Some(format!("the standby is at term {theirs}: {message}"));
                    for (_, waiter) in state.waiters.drain(..) {
                        waiter(Err(PoolError::Closed));
                    }
                    drop(state);
                    released();
                }
                return;
            }
            Ok(other) => {
                tracing::warn!(log = %link.name, ?other, "unexpected message from the standby; reconnecting");
                return;
            }
            Err(_) => return,
        }
    }
}

/// The header of segment `start`: read from its file if the flusher created it, else derived
/// from `previous` (the next sequence number, the capacity new segments get) as the flusher will
/// create it.
fn header_for(
    segments: &SegmentSet,
    start: Lsn,
    log: &LogInfo,
    previous: Option<(&SegmentHeader, u64)>,
) -> Result<SegmentHeader, String> {
    let list = segments.list();
    if let Some(file) = list.iter().find(|s| s.start == start) {
        let bytes =
            std::fs::read(&file.path).map_err(|e| format!("{}: {e}", file.path.display()))?;
        return SegmentHeader::decode(bytes.get(..HEADER_BYTES).unwrap_or(&[]))
            .map_err(|e| format!("{}: {e}", file.path.display()));
    }
    let (seq, capacity) = match previous {
        Some((header, capacity)) => (header.segment_seq + 1, capacity),
        None => {
            let newest = list.last().ok_or("the log has no segment")?;
            let bytes = std::fs::read(&newest.path).map_err(|e| e.to_string())?;
            let header = SegmentHeader::decode(bytes.get(..HEADER_BYTES).unwrap_or(&[]))
                .map_err(|e| e.to_string())?;
            (header.segment_seq + 1, header.capacity)
        }
    };
    Ok(SegmentHeader {
        layout: stela_format::frame::Layout::CURRENT,
        codec: log.codec,
        segment_seq: seq,
        start_lsn: start,
        capacity,
        type_tag: TypeTag::new(&log.type_tag),
    })
}

/// Writes one framed message.
pub(crate) fn send(writer: &mut impl Write, message: &ReplMessage) -> Result<(), String> {
    let mut out = Vec::new();
    frame::encode(message, &mut out).map_err(|e| e.to_string())?;
    writer.write_all(&out).map_err(|e| e.to_string())
}

/// Reads one framed message (blocking).
pub(crate) fn receive(reader: &mut impl Read) -> Result<ReplMessage, String> {
    let mut header = [0u8; stela_proto::FRAME_HEADER_BYTES];
    reader.read_exact(&mut header).map_err(|e| e.to_string())?;
    let parsed = frame::parse_header(header, MAX_FRAME_BYTES).map_err(|e| e.to_string())?;
    // The body is read as it arrives: a peer announcing a large body and sending nothing costs
    // no more than what it sent.
    let mut body = Vec::new();
    reader
        .take(parsed.body_len as u64)
        .read_to_end(&mut body)
        .map_err(|e| e.to_string())?;
    if body.len() != parsed.body_len {
        return Err("the peer closed the connection inside a frame".into());
    }
    frame::decode_body(parsed, &body).map_err(|e| e.to_string())
}
