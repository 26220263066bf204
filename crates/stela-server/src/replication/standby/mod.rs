//! The standby's side of log shipping: a listener that takes one stream per log from its
//! primary and mirrors it byte for byte into `DIR/logs/NAME` (`stela_wal::mirror`), so that the
//! standby's segment files are the primary's and a promoted standby opens them as ordinary logs.
//!
//! Invariants:
//! - **Nothing before proof.** A connection gets a thread, a buffer and a say over a log's
//!   terms only once its `Open` proved its primary an administrator of this standby; until
//!   then it waits at the door ([`door`]), in a bounded table, with no thread of its own.
//! - **Terms fence.** Each log keeps its term state (`stela_wal::TermStore`). A stream from a
//!   term below the log's current term is refused before a byte of it is written; a higher one is
//!   adopted durably before its first chunk is written, and its first LSN enters the history.
//! - **Acknowledged means held.** `received_lsn` is sent only once the chunk is checked (it
//!   continues the copy: offsets, CRCs, LSNs) and held in the standby's memory, from where a
//!   writer thread writes it behind (RapiLog's buffers, on the standby: a sync never holds up the
//!   next chunk); `durable_lsn` only after an fdatasync covered it. The writer writes what is
//!   held, up to 4 MiB at a time, and syncs every `SYNC_BYTES` (the primary's write
//!   threshold), when idle, when a `Fetch` needs it and before it stops, so under load the
//!   standby syncs about as often as the primary rather than once per chunk. At most 64 MiB
//!   are held, counting what the writer has taken and not yet written; beyond that the
//!   standby stops reading and TCP slows the primary.
//! - **One primary per log at a time**: a second stream for a log already being mirrored is
//!   refused.
//! - **Bad input stops the stream, not the daemon**: a malformed frame, a chunk that does not
//!   continue the mirror, a stale term: the primary is told why (`Refuse`) and the connection
//!   closes; what was mirrored stays.

mod door;

use super::{receive, send, Reader, Writer};
use crate::sync::lock;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use stela_format::term::Term;
use stela_net::tls::rustls::pki_types::CertificateDer;
use stela_net::tls::rustls::ServerConfig;
use stela_format::Codec;
use stela_proto::repl::{chunk_bytes, ReplMessage};
use stela_wal::mirror::{Chunk, Mirror};
use stela_wal::storage::Storage;
use stela_wal::{TermStore, WalOptions};

/// The standby's replication listener.
pub struct Standby {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    segment_bytes: u64,
    /// Logs being mirrored now.
    busy: Mutex<HashSet<String>>,
    /// The streams up now, for `stela status`.
    views: Mutex<HashMap<String, StreamView>>,
    stop: Arc<AtomicBool>,
    security: Security,
    /// This node's role and epoch: streams of an older epoch are refused, a newer one is
    /// recorded before a byte of it is mirrored, and a primary seeing a newer one steps down.
    node: Arc<crate::cluster::Node>,
    /// The sockets of the streams up now, to cut them all at a promotion.
    sockets: Mutex<HashMap<String, TcpStream>>,
    /// Where cut suffixes are kept (`DIR/salvage`).
    salvage: PathBuf,
    /// Authenticated streams running now (at most [`door::LIMITS`]`.sessions`).
    sessions: AtomicUsize,
}

/// The TLS configuration a new connection gets, read at each accept: a SIGHUP reload that
/// rotates the daemon's certificate rotates it here too, for the streams that connect from
/// then on.
pub(crate) type TlsSource = Arc<dyn Fn() -> Arc<ServerConfig> + Send + Sync>;
/// Whether a peer presenting these certificates (over TLS) and this token is an administrator
/// of this daemon.
pub(crate) type AdminCheck =
    Arc<dyn Fn(Option<&[CertificateDer<'_>]>, Option<&str>) -> bool + Send + Sync>;

/// TLS on the replication listener, and who may ship to it: given by the daemon, which owns
/// its credentials (the client listeners' authentication), so that replication needs nothing
/// of the layers above it.
pub(crate) struct Security {
    /// The daemon's TLS configuration, the TCP listener's. `None`: plain TCP, where a primary
    /// proves itself by the door's rules (`door::plain_primary`).
    pub(crate) tls: Option<TlsSource>,
    pub(crate) is_admin: AdminCheck,
    /// `--repl-insecure`: on plain TCP, a peer that proves nothing is trusted (the operator
    /// said the network is private).
    pub(crate) trust_network: bool,
}

impl Security {
    /// The TLS configuration new connections get now (none: plain TCP).
    fn tls_config(&self) -> Option<Arc<ServerConfig>> {
        self.tls.as_ref().map(|tls| tls())
    }

    fn is_admin(&self, certificates: Option<&[CertificateDer<'_>]>, token: Option<&str>) -> bool {
        (self.is_admin)(certificates, token)
    }
}

impl Standby {
    /// Listens on `addr` and mirrors every stream into `dir/logs/NAME`.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub(crate) fn start(
        addr: SocketAddr,
        dir: &Path,
        storage: Arc<dyn Storage>,
        segment_bytes: u64,
        security: Security,
        node: Arc<crate::cluster::Node>,
    ) -> std::io::Result<Standby> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            dir: dir.join("logs"),
            storage,
            segment_bytes,
            busy: Mutex::new(HashSet::new()),
            views: Mutex::new(HashMap::new()),
            stop: Arc::clone(&stop),
            security,
            node,
            sockets: Mutex::new(HashMap::new()),
            salvage: dir.join("salvage"),
            sessions: AtomicUsize::new(0),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("stela-standby".into())
                .spawn(move || door::accept_loop(&listener, &shared))?
        };
        tracing::info!(%addr, "standby: waiting for the primary's streams");
        Ok(Standby {
            addr,
            stop,
            thread: Some(thread),
            shared,
        })
    }

    /// What `stela status` shows of this standby: the streams it takes now.
    pub fn status_source(&self) -> Box<dyn Fn() -> stela_proto::ReplicationStatus + Send + Sync> {
        let (shared, addr) = (Arc::clone(&self.shared), self.addr);
        Box::new(move || status(&shared, addr))
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A promotion or shutdown: cuts every stream and waits until each has written and synced
    /// what it held, so that the logs open with every record this standby acknowledged.
    pub fn end_streams(&self) {
        for (log, socket) in lock(&self.shared.sockets).drain() {
            tracing::info!(log, "standby: ending the stream");
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !lock(&self.shared.busy).is_empty() {
            if std::time::Instant::now() > deadline {
                tracing::error!(logs = ?lock(&self.shared.busy), "standby: streams still writing after 10 s; going on without them (their logs refuse to open until they finish)");
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Where each log under `logs` (the daemon's `DIR/logs`) ends: the term of its last record
/// and its last LSN, as a node reports them when it promises an epoch. Read from the files
/// (each log's newest segment, [`stela_wal::tools::tail_last_lsn`]: a whole-log check took
/// seconds on large logs and delayed every election): what this node holds, synced, once its
/// streams have ended. A directory that holds no log yet counts as empty.
///
/// # Errors
/// The directory cannot be listed, or a log's terms or segments cannot be read.
pub fn log_positions(
    logs: &Path,
    storage: &Arc<dyn Storage>,
) -> Result<Vec<stela_coord::LogPosition>, String> {
    let names = match std::fs::read_dir(logs) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("listing {}: {e}", logs.display())),
    };
    let mut positions = Vec::with_capacity(names.len());
    for log in names {
        let dir = logs.join(&log);
        let lsn = match stela_wal::tools::tail_last_lsn(&dir, storage.as_ref()) {
            Ok(last) => last.get(),
            Err(stela_wal::Error::NotALog { .. }) => 0,
            Err(e) => return Err(format!("log {log}: {e}")),
        };
        let terms = TermStore::open(Arc::clone(storage), &dir)
            .map_err(|e| format!("log {log}: its terms: {e}"))?;
        let term = terms.history().term_of(lsn).map_or(0, |t| t.0);
        positions.push(stela_coord::LogPosition { log, term, lsn });
    }
    positions.sort_by(|a, b| a.log.cmp(&b.log));
    Ok(positions)
}

fn status(shared: &Shared, addr: SocketAddr) -> stela_proto::ReplicationStatus {
    let mut logs: Vec<stela_proto::ReplicaStatus> = lock(&shared.views)
        .iter()
        .filter_map(|(log, (_, term, pipe))| {
            let pipe = pipe.upgrade()?;
            let state = lock(&pipe.state);
            Some(stela_proto::ReplicaStatus {
                log: log.clone(),
                connected: !state.closed,
                term: *term,
                received_lsn: state.received,
                durable_lsn: state.durable,
                lag_records: 0,
                lag_ms: 0,
                lag_bytes: 0,
                stopped: state.failed.clone(),
                shipped_bytes: 0,
                wire_bytes: 0,
                degraded: false,
                degraded_acks: 0,
                degraded_through: 0,
                unprotected_acks: 0,
                stalled: false,
                last_ack_ms: 0,
            })
        })
        .collect();
    logs.sort_by(|a, b| a.log.cmp(&b.log));
    let (role, epoch, coordinator, last_failover, unprotected_since_ms) = shared.node.status();
    stela_proto::ReplicationStatus {
        role: role.into(),
        peer: addr.to_string(),
        logs,
        epoch,
        coordinator,
        last_failover,
        unprotected_since_ms,
        standbys: Vec::new(),
        replicas: 0,
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // The streams end with the daemon, each after writing and syncing what it held.
        self.end_streams();
    }
}

/// A stream as `stela status` sees it: the primary's node, its term, the stream's state.
type StreamView = (String, u64, std::sync::Weak<Pipe>);

/// Releases a log's "being mirrored" mark when its stream ends, however it ends.
struct Busy<'a>(&'a Shared, String);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        lock(&self.0.sockets).remove(&self.1);
        lock(&self.0.views).remove(&self.1);
        lock(&self.0.busy).remove(&self.1);
    }
}

fn serve(opened: door::Opened, shared: &Shared) -> Result<(), String> {
    let door::Opened {
        stream,
        tls,
        open,
        after_open,
        ..
    } = opened;
    if shared.node.realtime_threads() {
        crate::sched::become_realtime("standby receiver");
    }
    super::tune_stream(&stream);
    // A primary heard from not even by a heartbeat for the link's deadline is behind a
    // black-holed or one-way link, or stopped: the stream ends (every read fails after the
    // deadline), and the primary opens a new one when it can.
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(super::LINK_DEADLINE))
        .map_err(|e| e.to_string())?;
    let socket = stream.try_clone().map_err(|e| e.to_string())?;
    // The primary proved itself at the door (`door::admit`); what it sent after its `Open`
    // comes first.
    let (reader, mut writer): (Reader, Writer) = match tls {
        None => {
            let writer = stream.try_clone().map_err(|e| e.to_string())?;
            (
                Box::new(std::io::Cursor::new(after_open).chain(stream)),
                Box::new(writer),
            )
        }
        Some(tls) => {
            let (reader, writer) =
                stela_net::duplex::duplex(stream, *tls, std::time::Duration::from_secs(10))
                    .map_err(|e| format!("TLS: {e}"))?;
            (
                Box::new(std::io::Cursor::new(after_open).chain(reader)),
                Box::new(writer),
            )
        }
    };
    let ReplMessage::Open {
        term,
        node,
        log,
        codec,
        type_tag,
        history: primary_history,
        ..
    } = open
    else {
        unreachable!("the door hands on only an Open");
    };
    let refuse = |writer: &mut Writer, ours: u64, why: String| {
        let _ = send(
            writer,
            &ReplMessage::Refuse {
                term: ours,
                message: why.clone(),
            },
        );
        Err(why)
    };
    // Authenticated: the stream gets its buffer; only now may its term change this standby's
    // (a higher one is adopted below).
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    if !crate::logs::valid_name(&log) {
        return refuse(&mut writer, 0, format!("{log:?} is not a log name"));
    }
    let Some(codec) = Codec::from_name(&codec) else {
        return refuse(&mut writer, 0, format!("unknown codec {codec:?}"));
    };
    // Marked busy before the epoch is checked: a promise ends the streams and then waits until
    // no log is busy, so a stream is either waited for (and ends itself at its next
    // acknowledgement, `Pipe::ack`) or checked against the promised epoch and refused. Marked
    // after the check, a stream could pass it just before a promise, begin after the promise
    // read this node's position, and acknowledge records the promise did not report.
    if !lock(&shared.busy).insert(log.clone()) {
        return refuse(
            &mut writer,
            0,
            format!("log {log} is already being mirrored"),
        );
    }
    let _busy = Busy(shared, log.clone());
    if let Err(why) = check_epoch(&shared.node, term, &node) {
        return refuse(&mut writer, shared.node.epoch() << 32, why);
    }
    // From here until the copy's position is sent, the primary waits for this node.
    let step = shared.node.handshake_step();
    let watched = socket.try_clone().map_err(|e| e.to_string())?;
    lock(&shared.sockets).insert(log.clone(), socket);
    let dir = shared.dir.join(&log);
    // As for the daemon's own opens: no log directory is followed through a link.
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(format!(
            "{} is a symbolic link, which the standby does not follow",
            dir.display()
        ));
    }
    shared
        .storage
        .create_dir_all(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut terms =
        TermStore::open(Arc::clone(&shared.storage), &dir).map_err(|e| e.to_string())?;
    if Term(term) < terms.current() {
        let ours = terms.current().0;
        return refuse(
            &mut writer,
            ours,
            format!("stale term {term}: this standby's log {log} is at term {ours}"),
        );
    }
    terms.observe(Term(term)).map_err(|e| e.to_string())?;
    // Holds this node recorded for its own standby while it was the primary stand for no one
    // now: whoever ships to it decides what its copy keeps.
    match stela_wal::holds::release_standby_holds(shared.storage.as_ref(), &dir) {
        Ok(0) => {}
        Ok(released) => {
            tracing::info!(
                log,
                released,
                "standby: released the holds this node kept for its own standby as a primary"
            )
        }
        Err(error) => {
            tracing::warn!(log, %error, "standby: could not release the holds this node kept as a primary")
        }
    }
    let options = WalOptions::default()
        .codec(codec)
        .segment_bytes(shared.segment_bytes)
        .storage(Arc::clone(&shared.storage));
    let mut mirror = Mirror::open(&dir, options.clone(), &type_tag).map_err(|e| e.to_string())?;
    // A term that begins beyond what this copy holds (a primary that began a term and crashed
    // before its first record, a cut a crash interrupted) says nothing about any record; it
    // would only stand in the way of the next term's entry.
    let end = mirror.received_lsn();
    if terms
        .history()
        .entries()
        .iter()
        .any(|&(_, first)| first > end + 1)
    {
        terms.truncate_after(end).map_err(|e| e.to_string())?;
    }
    send(
        &mut writer,
        &position_message(term, mirror.position(), mirror.durable_lsn(), &terms),
    )?;
    // Before anything is shipped the primary may ask this copy to cut what diverged (this node
    // was the primary of an older epoch: the suffix goes to salvage), or, when the copy ends
    // before the primary's oldest segment, to begin it again there; then where the copy stands
    // now is sent again.
    //
    // The suspicion clock stands still while this node works on a step (opening its copy,
    // cutting it: the primary waits), never while it waits for the primary. Counted as the
    // primary's silence, opening a large copy made a restarted old primary ask to be promoted
    // in the middle of its own handshake.
    drop(step);
    let mut first = receive(&mut reader)?;
    loop {
        let (asked_term, what) = match &first {
            ReplMessage::Cut { term, .. } => (*term, "a cut"),
            ReplMessage::Reseed { term, .. } => (*term, "a reseed"),
            _ => break,
        };
        if asked_term != term {
            return refuse(
                &mut writer,
                terms.current().0,
                format!("{what} in term {asked_term} on a stream of term {term}"),
            );
        }
        let step = shared.node.handshake_step();
        drop(mirror);
        match first {
            ReplMessage::Cut { after_lsn, .. } => {
                let salvaged = cut_after(
                    &dir,
                    options.clone(),
                    &type_tag,
                    after_lsn,
                    &shared.salvage,
                    &format!("diverged from the primary {node} of term {term}"),
                )?;
                tracing::warn!(log, after_lsn, salvaged, "standby: cut the copy after the point it shares with the new primary; the rest is kept in salvage");
            }
            ReplMessage::Reseed { header, .. } => {
                if let Err(why) = reseed(shared, &dir, options.clone(), &type_tag, &header) {
                    return refuse(&mut writer, terms.current().0, why);
                }
            }
            _ => unreachable!("only a cut or a reseed comes here"),
        }
        terms = TermStore::open(Arc::clone(&shared.storage), &dir).map_err(|e| e.to_string())?;
        terms.observe(Term(term)).map_err(|e| e.to_string())?;
        mirror = Mirror::open(&dir, options.clone(), &type_tag).map_err(|e| e.to_string())?;
        send(
            &mut writer,
            &position_message(term, mirror.position(), mirror.durable_lsn(), &terms),
        )?;
        drop(step);
        first = receive(&mut reader)?;
    }
    // Terms the primary began at or before the next record this copy takes are this copy's
    // too, at the LSNs the primary gives them.
    adopt_terms(&mut terms, &primary_history, mirror.received_lsn() + 1)?;
    tracing::info!(
        log,
        primary = node,
        term,
        from = mirror.position().next_lsn.get(),
        "standby: mirroring"
    );
    // Chunks are checked and taken into memory here, acknowledged as received at once, and
    // written and synced by the writer thread behind (RapiLog's buffers, on the standby): a sync
    // never holds up the next chunk.
    let mut checker = mirror.checker();
    let segments = Arc::clone(mirror.segments());
    let pipe = Arc::new(Pipe {
        state: Mutex::new(PipeState {
            received: mirror.received_lsn(),
            durable: mirror.durable_lsn(),
            ..PipeState::default()
        }),
        changed: Condvar::new(),
        socket: Mutex::new(writer),
        term,
        node: Arc::clone(&shared.node),
        started: std::time::Instant::now(),
        heard_ms: AtomicU64::new(0),
    });
    lock(&shared.views).insert(log.clone(), (node.clone(), term, Arc::downgrade(&pipe)));
    let written = {
        let (pipe, log) = (Arc::clone(&pipe), log.clone());
        std::thread::Builder::new()
            .name("stela-mirror-writer".into())
            .spawn(move || write_behind(mirror, &pipe, &log))
            .map_err(|e| e.to_string())?
    };
    let watch = watch_primary(Arc::clone(&pipe), watched, &log)?;
    let result = receive_chunks(
        &mut reader,
        Some(first),
        &mut checker,
        (&mut terms, &primary_history),
        &pipe,
        (shared.storage.as_ref(), &segments),
        &shared.node,
    );
    if let Err(why) = &result {
        let _ = send(
            &mut *lock(&pipe.socket),
            &ReplMessage::Refuse {
                term: terms.current().0,
                message: why.clone(),
            },
        );
    }
    lock(&pipe.state).closed = true;
    pipe.changed.notify_all();
    watch.thread().unpark();
    let _ = watch.join();
    let _ = written.join();
    result
}

/// Watches a stream's link from the standby's side: once the primary has sent nothing (no
/// chunk, not even a heartbeat) for the link's deadline, cuts the socket, which ends the
/// receiver's read whatever the transport (a socket read timeout does not reach the TLS
/// layer's own I/O thread). The log is then free for the primary's next stream at once,
/// rather than once TCP notices the dead connection. Ends when the stream closes.
fn watch_primary(pipe: Arc<Pipe>, socket: TcpStream, log: &str) -> Result<JoinHandle<()>, String> {
    let log = log.to_owned();
    std::thread::Builder::new()
        .name("stela-mirror-watch".into())
        .spawn(move || loop {
            std::thread::park_timeout(super::LINK_DEADLINE / 4);
            let (closed, syncing_for_fetch) = {
                let state = lock(&pipe.state);
                (state.closed, state.sync_asked)
            };
            if closed {
                return;
            }
            // A `Fetch` waits for this node's own sync, not for the primary.
            if syncing_for_fetch {
                pipe.heard();
                continue;
            }
            let silent = pipe.silent();
            if silent > super::LINK_DEADLINE {
                tracing::warn!(log, silent_ms = silent.as_millis() as u64,
                    "standby: nothing from the primary within the link's deadline; the stream is torn down");
                let _ = socket.shutdown(std::net::Shutdown::Both);
                return;
            }
        })
        .map_err(|e| e.to_string())
}

/// Records the primary's terms that begin at or before `next` (the LSN after what this copy
/// holds, or will once the chunk in hand is held) and after this copy's last term, at the first
/// LSNs the primary's history gives them, so that both histories label every record alike and
/// a commit in doubt resolves the same on either node.
fn adopt_terms(terms: &mut TermStore, primary: &[(u64, u64)], next: u64) -> Result<(), String> {
    for &(term, first) in primary {
        if Term(term) > terms.history().last_term() && first <= next {
            // A copy labelled by an older standby may have an entry past `first`; the new term
            // then begins at that entry (a history never goes back).
            let last_first = terms.history().entries().last().map_or(1, |e| e.1);
            let first = first.max(last_first);
            // Adopted, not begun: the stream's own term, already observed, may be newer
            // (the primary began more than one term while this copy was away).
            terms.adopt(Term(term), first).map_err(|e| {
                format!("recording the primary's term {term} from LSN {first}: {e}")
            })?;
        }
    }
    Ok(())
}

/// Whether a stream of `term` from `primary` may be mirrored by this node: not while this
/// node is the primary (a primary of a newer epoch makes it step down), not from an epoch older
/// than this node's, nor from a second node in one epoch (`Node::accept_stream`; a newer epoch
/// is recorded first).
fn check_epoch(node: &crate::cluster::Node, term: u64, primary: &str) -> Result<(), String> {
    if !node.clustered_node() {
        return Ok(());
    }
    let (theirs, ours) = (term >> 32, node.epoch());
    if !node.is_primary() {
        node.accept_stream(theirs, primary)?;
        node.heard_from_primary();
        return Ok(());
    }
    if theirs > ours {
        node.step_down(format!(
            "{primary} ships as the primary of epoch {theirs}, this node is in epoch {ours}"
        ));
        return Err(format!(
            "this node was the primary of epoch {ours} and is stepping down; retry"
        ));
    }
    Err(format!(
        "this node is the primary of epoch {ours}; {primary} (epoch {theirs}) is not"
    ))
}

/// Cuts the copy in `dir` after `after_lsn`, keeping the rest in `salvage`; how many records
/// were cut.
fn cut_after(
    dir: &Path,
    options: WalOptions,
    type_tag: &str,
    after_lsn: u64,
    salvage: &Path,
    reason: &str,
) -> Result<u64, String> {
    stela_wal::salvage::cut_after(dir, options, type_tag, after_lsn, salvage, reason)
        .map(|kept| kept.map_or(0, |kept| kept.records))
        .map_err(|e| format!("cutting {} after LSN {after_lsn}: {e}", dir.display()))
}

/// Begins the copy in `dir` again with the primary's oldest segment, `header` (a
/// `ReplMessage::Reseed`): the copy ends before it, and the primary truncated every record this
/// copy holds. A follower reading the copy from below it loses what it has not read: it is
/// named in the log.
fn reseed(
    shared: &Shared,
    dir: &Path,
    options: WalOptions,
    type_tag: &str,
    header: &[u8],
) -> Result<(), String> {
    let header = stela_format::SegmentHeader::decode(header)
        .map_err(|why| format!("a reseed with a bad segment header: {why}"))?;
    let start = header.start_lsn.get();
    if let Ok(holds) = stela_wal::holds::list(shared.storage.as_ref(), dir) {
        for hold in holds
            .iter()
            .filter(|h| !h.is_standby() && h.lsn.get() < start)
        {
            tracing::warn!(dir = %dir.display(), holder = ?hold.holder, held = hold.lsn.get(), start,
                "standby: the copy begins again at the primary's oldest segment, above a follower's hold: the follower cannot read the records between");
        }
    }
    let removed = stela_wal::mirror::restart_at(dir, options, type_tag, &header)
        .map_err(|e| format!("beginning {} again at LSN {start}: {e}", dir.display()))?;
    tracing::warn!(dir = %dir.display(), removed, start,
        "standby: this copy ended before the primary's oldest segment (the primary truncated the records between); it begins again there");
    Ok(())
}

/// Chunks checked and held in memory, between the receiving thread and the writer.
struct Pipe {
    state: Mutex<PipeState>,
    changed: Condvar,
    /// Acknowledgements go out from both threads.
    socket: Mutex<Writer>,
    term: u64,
    /// This node: its epoch is checked before every acknowledgement.
    node: Arc<crate::cluster::Node>,
    /// When the stream began, and the last message from the primary since then (ms): the
    /// link's deadline is measured from it (`watch_primary`).
    started: std::time::Instant,
    heard_ms: AtomicU64,
}

#[derive(Default)]
struct PipeState {
    chunks: VecDeque<(stela_format::Lsn, u64, Vec<u8>)>,
    bytes: usize,
    received: u64,
    durable: u64,
    closed: bool,
    failed: Option<String>,
    /// The writer sleeps until told (nothing came for a whole `WRITE_EVERY`).
    writer_idle: bool,
    /// Someone needs everything held synced (a `Fetch` reads back only synced records); the
    /// writer clears it after that sync.
    sync_asked: bool,
}

/// How often a busy writer looks for chunks: it is not woken for each one (a wake-up per chunk
/// would compete for the CPU with the receiver and its acknowledgement), only when it was idle
/// or when `WRITE_BATCH` bytes are held.
const WRITE_EVERY: std::time::Duration = std::time::Duration::from_millis(1);
const WRITE_BATCH: usize = 4 << 20;

/// Bytes written unsynced after which a busy writer syncs: the primary's own write threshold, so
/// under load the standby syncs about as often as the primary does (the frames' sync bases make
/// it sync at least that often anyway). `replicated` acknowledgements never wait for it.
const SYNC_BYTES: usize = crate::config::WRITE_THRESHOLD;

/// How often a standby that holds its limit and waits for its disk tells the primary it is
/// alive (well within the link's deadline).
const ALIVE_WHILE_FULL: std::time::Duration = std::time::Duration::from_millis(100);

/// Most bytes held in memory before the receiver stops reading (and TCP slows the primary).
const HELD_BYTES: usize = 64 << 20;

impl Pipe {
    /// A message from the primary arrived.
    fn heard(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.heard_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// How long the primary has sent nothing.
    fn silent(&self) -> std::time::Duration {
        let heard = std::time::Duration::from_millis(self.heard_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(heard)
    }

    /// Tells the primary what this copy holds, unless this node has seen a newer epoch than the
    /// stream's since the stream began (it promised in an election): what it acknowledges then
    /// could be missing from the position it promised with, so the stream ends instead.
    fn ack(&self, term: u64) -> Result<(), String> {
        let (stream_epoch, ours) = (self.term >> 32, self.node.epoch());
        if self.node.clustered_node() && ours > stream_epoch {
            return Err(format!(
                "this node has seen epoch {ours}: it acknowledges nothing in epoch {stream_epoch} any more"
            ));
        }
        let (received, durable) = {
            let state = lock(&self.state);
            (state.received, state.durable)
        };
        send(
            &mut *lock(&self.socket),
            &ReplMessage::Ack {
                term,
                received_lsn: received,
                durable_lsn: durable,
            },
        )
    }
}

/// The receiving side: checks each chunk against the copy as it will be once everything held
/// is written, holds it, says it is received.
fn receive_chunks(
    reader: &mut BufReader<Reader>,
    mut first: Option<ReplMessage>,
    checker: &mut stela_wal::mirror::Checker,
    (terms, primary_history): (&mut TermStore, &[(u64, u64)]),
    pipe: &Pipe,
    (storage, segments): (&dyn Storage, &stela_wal::SegmentSet),
    node: &crate::cluster::Node,
) -> Result<(), String> {
    // The term of chunks held but not yet acknowledged. Acknowledging is deferred only while
    // another whole frame is already buffered, that is, while this thread is behind the
    // primary: one acknowledgement then covers them all, and is sent before any wait for input.
    let mut owed_ack: Option<u64> = None;
    // Where the primary's copy begins, once it has said, and when this copy was last cut to
    // it: a follower's hold may move up later, so the cut is retried now and then.
    let mut primary_first: Option<u64> = None;
    let mut cut_at = std::time::Instant::now();
    loop {
        let message = match first.take() {
            Some(message) => message,
            None => {
                if !whole_frame_buffered(reader.buffer()) {
                    if let Some(term) = owed_ack.take() {
                        pipe.ack(term)?;
                    }
                }
                receive(reader)?
            }
        };
        node.heard_from_primary();
        pipe.heard();
        if let ReplMessage::Fetch {
            term,
            segment_start,
            offset,
            next_lsn,
        } = message
        {
            send_back(
                term,
                (segment_start, offset, next_lsn),
                checker,
                terms,
                pipe,
                segments,
            )?;
            continue;
        }
        // A standby that has seen a newer epoch (another node's stream, a promotion) never
        // acknowledges again in an older one.
        if message.term() >> 32 < node.epoch() {
            return Err(format!(
                "epoch {} is over: this node is in epoch {}",
                message.term() >> 32,
                node.epoch()
            ));
        }
        if message.term() < terms.current().0 {
            return Err(format!(
                "stale term {}: this standby is at term {}",
                message.term(),
                terms.current().0
            ));
        }
        let told = match &message {
            ReplMessage::Truncated { first_lsn, .. } => {
                primary_first = Some(*first_lsn);
                true
            }
            _ => false,
        };
        // Looked at when told, else at most once a second: the segment list's lock is not
        // taken for every chunk.
        if let Some(first_lsn) =
            primary_first.filter(|_| told || cut_at.elapsed() >= RETRY_CUT_EVERY)
        {
            cut_at = std::time::Instant::now();
            if first_lsn > segments.first_lsn().get() {
                follow_truncation(storage, segments, first_lsn, lock(&pipe.state).durable);
            }
        }
        let ReplMessage::Chunk {
            term: chunk_term,
            segment_start,
            offset,
            raw_len,
            compressed,
            bytes,
        } = message
        else {
            if let ReplMessage::Heartbeat { term } = message {
                // Answered, so that the primary hears from this standby on an idle stream too
                // (links are checked both ways).
                if owed_ack.is_none() {
                    pipe.ack(term)?;
                }
                continue;
            }
            if matches!(message, ReplMessage::Truncated { .. }) {
                continue;
            }
            return Err(format!("unexpected {message:?}"));
        };
        let bytes = chunk_bytes(raw_len, compressed, bytes).map_err(|e| e.to_string())?;
        let before = checker.position().next_lsn.get();
        let segment_start = stela_format::Lsn::new(segment_start);
        let next = match checker.check(Chunk {
            segment_start,
            offset,
            bytes: &bytes,
        }) {
            Ok(next) => next,
            Err(error) => return Err(error.to_string()),
        };
        // A term enters the history before the first record of it is held: at the LSN the
        // primary's history gives it; from a primary that sends none, where its first chunk
        // starts.
        if primary_history.is_empty() {
            if terms.history().last_term() < Term(chunk_term) {
                terms
                    .observe(Term(chunk_term))
                    .and_then(|()| terms.begin(Term(chunk_term), before))
                    .map_err(|e| e.to_string())?;
            }
        } else {
            adopt_terms(terms, primary_history, next)?;
        }
        let wake_writer = {
            let mut state = lock(&pipe.state);
            while state.bytes > HELD_BYTES && state.failed.is_none() {
                let (next, waited) = pipe
                    .changed
                    .wait_timeout(state, ALIVE_WHILE_FULL)
                    .unwrap_or_else(|e| e.into_inner());
                state = next;
                if waited.timed_out() {
                    // Still here, only waiting for this node's disk: the primary hears so
                    // within its link deadline and keeps the stream.
                    drop(state);
                    pipe.ack(chunk_term)?;
                    state = lock(&pipe.state);
                }
            }
            if let Some(why) = &state.failed {
                return Err(why.clone());
            }
            state.bytes += bytes.len();
            state.chunks.push_back((segment_start, offset, bytes));
            state.received = next - 1;
            state.writer_idle || state.bytes >= WRITE_BATCH
        };
        if whole_frame_buffered(reader.buffer()) {
            owed_ack = Some(chunk_term);
        } else {
            // Acknowledged before the writer is woken: the primary's commit waits for this
            // message, and nothing else.
            owed_ack = None;
            pipe.ack(chunk_term)?;
        }
        if wake_writer {
            pipe.changed.notify_all();
        }
    }
}

/// How often the standby retries cutting its copy to where the primary's begins while a hold
/// keeps it from getting there.
const RETRY_CUT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The primary's copy now begins at `first_lsn`: removes this copy's whole segments below it,
/// but never past `durable` (what this copy holds synced) nor past the lowest hold of a follower
/// reading the copy (`stela_wal::holds`). A failure to remove is reported and the stream goes
/// on: the copy keeps more than it must, which loses nothing.
fn follow_truncation(
    storage: &dyn Storage,
    segments: &stela_wal::SegmentSet,
    first_lsn: u64,
    durable: u64,
) {
    let (held, unreadable) = stela_wal::holds::lowest_of_followers(storage, segments.dir());
    for why in &unreadable {
        tracing::warn!(hold = %why, "standby: a follower's hold cannot be read; the copy keeps everything from LSN 1");
    }
    let held = held.map_or(u64::MAX, |lsn| lsn.get());
    let cut = first_lsn.min(durable.saturating_add(1)).min(held);
    match segments.truncate_before(stela_format::Lsn::new(cut)) {
        Ok(0) => {}
        Ok(removed) => tracing::info!(
            dir = %segments.dir().display(),
            removed,
            before = cut,
            primary_first = first_lsn,
            "standby: removed the segments the primary truncated"
        ),
        Err(error) => {
            tracing::warn!(%error, "standby: could not remove segments the primary truncated")
        }
    }
}

/// Whether `buffered` starts with a whole frame (header and body), so reading it cannot wait.
fn whole_frame_buffered(buffered: &[u8]) -> bool {
    let Some(header) = buffered.get(..stela_proto::FRAME_HEADER_BYTES) else {
        return false;
    };
    let body_len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    buffered.len() - stela_proto::FRAME_HEADER_BYTES >= body_len
}

/// Answers a `Fetch`: the synced records from `from` on, as chunks read from the files, then
/// where this copy stands.
fn send_back(
    term: u64,
    (segment_start, offset, next_lsn): (u64, u64, u64),
    checker: &stela_wal::mirror::Checker,
    terms: &TermStore,
    pipe: &Pipe,
    segments: &stela_wal::SegmentSet,
) -> Result<(), String> {
    let mut at = stela_wal::mirror::Position {
        segment_start: stela_format::Lsn::new(segment_start),
        offset,
        next_lsn: stela_format::Lsn::new(next_lsn.max(1)),
    };
    // Only what the writer has synced is read back from the files: have it sync all it holds.
    let durable = {
        let mut state = lock(&pipe.state);
        state.sync_asked = true;
        pipe.changed.notify_all();
        while state.sync_asked && state.failed.is_none() {
            state = pipe.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.durable
    };
    let mut sent = 0u64;
    while let Some((segment, offset, bytes, next)) =
        stela_wal::mirror::read_chunk(segments, at, stela_format::Lsn::new(durable + 1), 1 << 20)
            .map_err(|e| e.to_string())?
    {
        sent += bytes.len() as u64;
        send(
            &mut *lock(&pipe.socket),
            &stela_proto::repl::chunk_message(term, segment.get(), offset, &bytes),
        )?;
        // The primary waits for these and sends nothing meanwhile: the link's deadline runs
        // from each chunk it takes (a send blocked on a dead link holds this up instead).
        pipe.heard();
        at = stela_wal::mirror::Position {
            segment_start: segment,
            offset: offset + bytes.len() as u64,
            next_lsn: next,
        };
    }
    tracing::info!(
        from = next_lsn,
        to = at.next_lsn.get() - 1,
        bytes = sent,
        "standby: sent back what the primary lacked"
    );
    let position = checker.position();
    send(
        &mut *lock(&pipe.socket),
        &position_message(term, position, durable, terms),
    )?;
    pipe.heard();
    Ok(())
}

/// Where this copy stands, as the primary is told it (after `Open`, and after a `Fetch`).
fn position_message(
    term: u64,
    position: stela_wal::mirror::Position,
    durable_lsn: u64,
    terms: &TermStore,
) -> ReplMessage {
    ReplMessage::Position {
        term,
        segment_start: position.segment_start.get(),
        offset: position.offset,
        next_lsn: position.next_lsn.get(),
        durable_lsn,
        history: terms
            .history()
            .entries()
            .iter()
            .map(|&(t, f)| (t.0, f))
            .collect(),
    }
}

/// The writer: takes the chunks held (up to `WRITE_BATCH` at a time), writes those that
/// continue each other as one write, syncs when `SYNC_BYTES` are written unsynced, after a
/// burst that woke it from idle, when nothing more came for a whole `WRITE_EVERY`, when asked
/// (a `Fetch`) and before it stops, and says what is durable. A failure stops it and the
/// stream.
fn write_behind(mut mirror: Mirror, pipe: &Pipe, log: &str) {
    let mut unsynced = 0usize;
    loop {
        // Woken from idle: a lone burst, synced at once (under load the writer never idles).
        let mut was_idle = false;
        let (held, held_bytes, closed, sync_asked) = {
            let mut state = lock(&pipe.state);
            let mut waited_empty = false;
            loop {
                if !state.chunks.is_empty() || state.closed || state.sync_asked {
                    break;
                }
                if waited_empty && unsynced > 0 {
                    // Idle: what is written becomes durable now, not at the next burst.
                    break;
                }
                if waited_empty {
                    state.writer_idle = true;
                    state = pipe.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                    state.writer_idle = false;
                    was_idle = true;
                } else {
                    state = pipe
                        .changed
                        .wait_timeout(state, WRITE_EVERY)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    waited_empty = state.chunks.is_empty();
                }
            }
            // At most `WRITE_BATCH` at a time (and at least a chunk): what is taken stays counted
            // in `bytes` until it is written, so no more than `HELD_BYTES` are ever held, in the
            // queue and in this thread together.
            let mut held = VecDeque::new();
            let mut held_bytes = 0;
            while held_bytes < WRITE_BATCH {
                let Some(chunk) = state.chunks.pop_front() else {
                    break;
                };
                held_bytes += chunk.2.len();
                held.push_back(chunk);
            }
            // Closing, and a `Fetch`'s sync, are acted on once nothing more is held.
            let rest_held = !state.chunks.is_empty();
            (
                held,
                held_bytes,
                state.closed && !rest_held,
                state.sync_asked && !rest_held,
            )
        };
        // Nothing new: the stream went quiet with bytes unsynced (or a sync was asked for).
        let quiet = held.is_empty();
        let durable_before = mirror.durable_lsn();
        let result = contiguous_runs(held)
            .into_iter()
            .try_for_each(|(segment_start, offset, bytes)| {
                unsynced += bytes.len();
                mirror
                    .apply(Chunk {
                        segment_start,
                        offset,
                        bytes: &bytes,
                    })
                    .map(drop)
            })
            .map_err(|e| e.to_string())
            .and_then(|()| {
                if quiet || was_idle || closed || sync_asked || unsynced >= SYNC_BYTES {
                    unsynced = 0;
                    mirror.sync().map(drop).map_err(|e| e.to_string())
                } else {
                    Ok(())
                }
            });
        if let Err(why) = result {
            tracing::error!(
                log,
                why,
                "standby: writing the mirror failed; it is stopped"
            );
            lock(&pipe.state).failed = Some(why);
            pipe.changed.notify_all();
            return;
        }
        // A sync here, or one the mirror made before a frame that needed it, moved what is
        // durable: say so (the primary's status and the standby's followers read it). A sync
        // asked for by a `Fetch` moves nothing (that session receives no chunk) and is not
        // acknowledged: the primary reading the records back takes only chunks.
        let moved = mirror.durable_lsn() > durable_before;
        {
            let mut state = lock(&pipe.state);
            state.bytes -= held_bytes;
            if moved || sync_asked {
                state.durable = mirror.durable_lsn();
                state.sync_asked = false;
            }
        }
        // The receiver may be waiting for room, a `Fetch` for the sync.
        pipe.changed.notify_all();
        if moved {
            let _ = pipe.ack(pipe.term);
        }
        if closed {
            return;
        }
    }
}

/// Chunks in order, those that continue each other (same segment, next offset) joined into one,
/// so that a burst of small chunks costs one write.
fn contiguous_runs(
    chunks: VecDeque<(stela_format::Lsn, u64, Vec<u8>)>,
) -> Vec<(stela_format::Lsn, u64, Vec<u8>)> {
    let mut runs: Vec<(stela_format::Lsn, u64, Vec<u8>)> = Vec::new();
    for (segment_start, offset, bytes) in chunks {
        match runs.last_mut() {
            Some((start, at, run))
                if *start == segment_start && *at + run.len() as u64 == offset =>
            {
                run.extend_from_slice(&bytes);
            }
            _ => runs.push((segment_start, offset, bytes)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::{contiguous_runs, whole_frame_buffered};
    use stela_format::Lsn;

    #[test]
    fn chunks_that_continue_each_other_are_written_as_one() {
        let chunk = |segment: u64, offset: u64, len: usize| {
            (Lsn::new(segment), offset, vec![offset as u8; len])
        };
        let runs = contiguous_runs(
            [
                chunk(1, 0, 40),
                chunk(1, 40, 10),
                chunk(1, 50, 5),
                // A new segment, the same empty segment shipped again, and a gap: each its own.
                chunk(9, 0, 40),
                chunk(9, 0, 40),
                chunk(9, 60, 8),
                chunk(9, 68, 2),
            ]
            .into(),
        );
        let shape: Vec<(u64, u64, usize)> = runs
            .iter()
            .map(|(segment, offset, bytes)| (segment.get(), *offset, bytes.len()))
            .collect();
        assert_eq!(shape, [(1, 0, 55), (9, 0, 40), (9, 0, 40), (9, 60, 10)]);
        let mut joined = vec![0u8; 40];
        joined.extend([40; 10]);
        joined.extend([50; 5]);
        assert_eq!(runs[0].2, joined, "bytes kept in order");
    }
    use stela_proto::repl::ReplMessage;

    #[test]
    fn only_a_whole_buffered_frame_defers_an_acknowledgement() {
        let mut frame = Vec::new();
        stela_proto::frame::encode(&ReplMessage::Heartbeat { term: 7 }, &mut frame).unwrap();
        assert!(whole_frame_buffered(&frame));
        for cut in 0..frame.len() {
            assert!(
                !whole_frame_buffered(&frame[..cut]),
                "{cut} of {} bytes",
                frame.len()
            );
        }
        let mut two = frame.clone();
        two.extend_from_slice(&frame[..3]);
        assert!(whole_frame_buffered(&two));
    }
}
