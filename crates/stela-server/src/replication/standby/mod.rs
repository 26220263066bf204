//! The standby's side of log shipping: a listener that takes one stream per log from its
//! primary and mirrors it byte for byte into `DIR/logs/NAME` (`stela_wal::mirror`), so that the
//! standby's segment files are the primary's and a promoted standby opens them as ordinary logs.
//!
//! The rooms, in the order a stream passes them:
//! - [`door`]: connections wait for their whole `Open` in a bounded table, with no thread, and
//!   only a primary that proves itself gets one;
//! - [`session`]: the stream's transport, the checks of what its `Open` asks, the copy opened,
//!   the cuts and reseeds the primary asks before shipping;
//! - [`fencing`]: terms and epochs, which decide which streams may write a copy;
//! - [`receive`]: the receiving loop (check, hold, acknowledge; `Fetch`; truncation);
//! - [`writer`]: the pipe to the writer thread, which writes and syncs behind.
//!
//! This file owns the listener itself: its state shared by every stream, what `stela status`
//! shows of it, and how its streams end at a promotion or a shutdown.
//!
//! Invariants:
//! - **Nothing before proof.** A connection gets a thread, a buffer and a say over a log's
//!   terms only once its `Open` proved its primary an administrator of this standby.
//! - **One primary per log at a time**: a log is in `busy` while a stream mirrors it, and a
//!   second stream for it is refused; the mark, the stream's socket and its view go together
//!   when the stream ends ([`Busy`]).
//! - **Ended means written**: [`Standby::end_streams`] returns once every stream has written
//!   and synced what it held (or after 10 s, loudly), so a promoted node opens its logs with
//!   every record it acknowledged.
//! - **Bad input stops the stream, not the daemon**: a malformed frame, a chunk that does not
//!   continue the mirror, a stale term: the primary is told why (`Refuse`) and the connection
//!   closes; what was mirrored stays.

mod door;
mod fencing;
mod receive;
mod session;
mod writer;

use crate::sync::lock;
pub use door::{open_frame_len, whole_open, MAX_OPEN_BYTES};
use session::serve;
use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use stela_net::tls::rustls::pki_types::CertificateDer;
use stela_net::tls::rustls::ServerConfig;
use stela_wal::storage::Storage;
use stela_wal::TermStore;
use writer::Pipe;

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
    /// The last LSN each log's copy holds, written and synced, as its last stream in this
    /// process left it: what a promise reports, read in no time. A log is absent while a
    /// stream of it is up (its handshake may cut the copy) and when no stream of it ended
    /// cleanly in this process; its end is read from its files then ([`log_positions`]).
    /// Reading the newest segment whole took 23-373 ms per promise under load, on every
    /// failover's path (`stela-bench failover --nodes 3`, 2026-12-07).
    ends: Mutex<HashMap<String, u64>>,
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
    /// Why streams ended or were refused, for `stela status` and the metrics.
    session_ends: super::ends::SessionEnds,
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
            ends: Mutex::new(HashMap::new()),
            views: Mutex::new(HashMap::new()),
            stop: Arc::clone(&stop),
            security,
            node,
            sockets: Mutex::new(HashMap::new()),
            salvage: dir.join("salvage"),
            sessions: AtomicUsize::new(0),
            session_ends: super::ends::SessionEnds::default(),
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

    /// Where each log of this node ends ([`log_positions`]), taking the ends its streams left
    /// in this process rather than reading them from the files. Meant for after
    /// [`Standby::end_streams`]: a stream up meanwhile is read from its files.
    ///
    /// # Errors
    /// As [`log_positions`].
    pub fn positions(&self) -> Result<Vec<stela_coord::LogPosition>, PositionsError> {
        let known = lock(&self.shared.ends).clone();
        log_positions(&self.shared.dir, &self.shared.storage, &known)
    }
}

/// Where each log under `logs` (the daemon's `DIR/logs`) ends: the term of its last record
/// and its last LSN, as a node reports them when it promises an epoch. Read from the files
/// (each log's newest segment, [`stela_wal::tools::tail_last_lsn`]: a whole-log check took
/// seconds on large logs and delayed every election): what this node holds, synced, once its
/// streams have ended. A directory that holds no log yet counts as empty. A log in `known`
/// ends where it says (the last LSN its copy holds, kept by this process's standby) and its
/// files are not read.
///
/// # Errors
/// The directory cannot be listed, or a log's terms or segments cannot be read.
pub fn log_positions(
    logs: &Path,
    storage: &Arc<dyn Storage>,
    known: &HashMap<String, u64>,
) -> Result<Vec<stela_coord::LogPosition>, PositionsError> {
    let names = match std::fs::read_dir(logs) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => {
            let dir = logs.to_owned();
            return Err(PositionsError::List { dir, error });
        }
    };
    let mut positions = Vec::with_capacity(names.len());
    for log in names {
        let dir = logs.join(&log);
        let read = match known.get(&log) {
            Some(&end) => Ok(stela_format::Lsn::new(end)),
            None => stela_wal::tools::tail_last_lsn(&dir, storage.as_ref()),
        };
        let lsn = match read {
            Ok(last) => last.get(),
            Err(stela_wal::Error::NotALog { .. }) => 0,
            Err(error) => return Err(PositionsError::Tail { log, error }),
        };
        let terms = match TermStore::open(Arc::clone(storage), &dir) {
            Ok(terms) => terms,
            Err(error) => return Err(PositionsError::Terms { log, error }),
        };
        let term = terms.history().term_of(lsn).map_or(0, |t| t.0);
        positions.push(stela_coord::LogPosition { log, term, lsn });
    }
    positions.sort_by(|a, b| a.log.cmp(&b.log));
    Ok(positions)
}

/// Why [`log_positions`] could not say where the logs end.
#[derive(Debug, thiserror::Error)]
pub enum PositionsError {
    #[error("listing {}: {error}", dir.display())]
    List { dir: PathBuf, error: std::io::Error },
    #[error("log {log}: {error}")]
    Tail {
        log: String,
        error: stela_wal::Error,
    },
    #[error("log {log}: its terms: {error}")]
    Terms {
        log: String,
        error: stela_wal::Error,
    },
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
                stopped: state.failed.as_ref().map(ToString::to_string),
                shipped_bytes: 0,
                wire_bytes: 0,
                degraded: false,
                degraded_acks: 0,
                degraded_through: 0,
                unprotected_acks: 0,
                stalled: false,
                last_ack_ms: 0,
                last_end: shared.session_ends.last(log),
            })
        })
        .collect();
    logs.sort_by(|a, b| a.log.cmp(&b.log));
    let ended_streams = ended_streams(&logs, shared);
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
        session_ends: shared.session_ends.counts(),
        ended_streams,
    }
}

/// Each log whose stream ended and is not up again, with how its last stream ended.
fn ended_streams(
    logs: &[stela_proto::ReplicaStatus],
    shared: &Shared,
) -> Vec<stela_proto::EndedStream> {
    let mut ended: Vec<stela_proto::EndedStream> = shared
        .session_ends
        .all_last()
        .into_iter()
        .filter(|(log, _)| !logs.iter().any(|up| &up.log == log))
        .map(|(log, end)| stela_proto::EndedStream { log, end })
        .collect();
    ended.sort_by(|a, b| a.log.cmp(&b.log));
    ended
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
