//! Log shipping to a hot standby (RemusDB's commit protection, with the log as the only state
//! shipped): the primary's side. One shipper thread per open log sends the log's framed bytes to
//! the standby as they are appended (from the pool's buffers, or from the segment files when the
//! standby is behind what the buffers still hold); an acknowledgement reader takes the standby's
//! received and durable LSNs and releases the `replicated` and `all` waiters they satisfy.
//! [`standby`] is the other end.
//!
//! When a `replicated` commit waits and the stream is plain TCP, the event loop sends the new
//! bytes itself at the end of its turn ([`Replication::ship_unsent`]), with a send that never
//! blocks, instead of waking the shipper thread: on a machine with few CPUs that wake-up costs
//! more than the network's round trip. Whatever the loop cannot send at once (the socket is
//! full, the bytes are on disk, a new segment's header must be read) is left to the shipper.
//! In the same way, while such commits wait, the loop reads the standby's acknowledgements off
//! a plain TCP stream itself ([`Replication::take_acks`]); the acknowledgement thread, which
//! waits for the socket without holding it, takes them whenever the loop does not.
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
//! - **Protected again for every log or none.** A promoted primary acknowledges alone while a
//!   log's standby is away; it reads as protected again only once each log's standby holds
//!   what that log acknowledged alone ([`reprotection`], which outlives the links).

// The standby's listener uses the event loop's authentication, which the loom build leaves out.
mod acks;
mod hold;
pub mod protection;
mod replicas;
mod reprotection;
mod ship;
#[cfg(not(stela_loom))]
pub mod standby;
mod tally;

use acks::{fence, read_acks, read_acks_polled, release, AckInbox, AckReading};
use hold::StandbyHold;
pub use protection::Holds;
use protection::{Protection, Registered};
pub use replicas::Replicas;
use reprotection::Reprotection;
use ship::{header_for, ship_inline, ship_next, Live, Source, Step};

use crate::pool::{LogId, Pool, PoolError};
use crate::sync::lock;
use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::time::Duration;
use stela_format::term::Term;
use stela_format::{Codec, Lsn};
use stela_proto::repl::{chunk_message, ReplMessage};
use stela_proto::{frame, MAX_FRAME_BYTES};
use stela_wal::mirror::Position;
use stela_wal::{SegmentSet, TermStore};

/// Most bytes one chunk carries.
const CHUNK_BYTES: usize = 1 << 20;
/// How long an idle shipper waits before a heartbeat.
const HEARTBEAT: Duration = Duration::from_millis(50);
/// How long a stream may carry nothing from the other end before it is torn down and opened
/// again: the primary heartbeats an idle stream every `HEARTBEAT` and the standby acknowledges
/// every chunk and every heartbeat, so silence this long is a black-holed or one-way link (or
/// a stopped peer), which TCP's own retransmission backoff would take seconds to notice and
/// recover from after it heals. Also the connection attempt's limit, so that attempts during
/// the fault end quickly and one after it heals goes through at once.
pub(crate) const LINK_DEADLINE: Duration = Duration::from_millis(500);
/// How long a standby has to answer a stream's `Open` with its position.
const HANDSHAKE: Duration = Duration::from_secs(2);
/// How long a shipper waits before trying an unreachable standby again.
const RETRY: Duration = Duration::from_millis(100);
/// Most chunks the event loop sends in one turn before leaving the rest to the shipper.
const INLINE_CHUNKS: usize = 4;
/// Most distinct reasons a shipper logs while its standby stays unreachable.
const WARNED_REASONS: usize = 8;

/// The primary's replication: one [`Link`] per open log.
pub struct Replication {
    standby: SocketAddr,
    node: Arc<crate::cluster::Node>,
    links: Mutex<HashMap<LogId, Arc<Link>>>,
    /// What each log acknowledged alone while the node is unprotected, kept apart from the
    /// links so that a log closed and reopened does not forget it; it decides when the node is
    /// protected again.
    reprotection: Arc<Reprotection>,
    /// The shipper threads, joined at shutdown: each holds its log's files (and their lock).
    shippers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Called once after waiters were released (wakes the event loop once for all of them).
    released: Released,
    /// Logs appended to since the event loop last shipped (see [`Replication::ship_unsent`]).
    unsent: Mutex<Vec<LogId>>,
    any_unsent: AtomicBool,
    /// `--degrade-after`: how long the standby may be unreachable before `replicated` commits
    /// are acknowledged without it.
    degrade_after: Option<Duration>,
    /// TLS to the standby (none: plain TCP).
    tls: Option<StandbyTls>,
    /// Sent in `Open` (one of the standby's admin tokens), over TLS or plain TCP, if this
    /// primary is not proven otherwise (a certificate; its user, on loopback).
    token: Option<String>,
    /// The standby's `--node` name, as its last `Position` said (a planned switchover hands
    /// the epoch to a standby by name).
    standby_name: Mutex<Option<String>>,
}

/// How a primary reaches its standby over TLS.
pub struct StandbyTls {
    pub config: Arc<stela_net::tls::rustls::ClientConfig>,
    /// The name the standby's certificate must carry.
    pub name: stela_net::tls::rustls::pki_types::ServerName<'static>,
}

/// One end of a replication connection (plain TCP, or TLS through `stela_net::duplex`).
pub(crate) type Reader = Box<dyn Read + Send>;
pub(crate) type Writer = Box<dyn Write + Send>;

/// What to call after releasing waiters.
pub type Released = Arc<dyn Fn() + Send + Sync>;

/// Who to tell when a `replicated` wait ends (the same shape as the engine's `disk` waiters,
/// named here so that this module needs nothing from the engine, which uses it).
pub type Waiter = Box<dyn FnOnce(Result<(), PoolError>) + Send>;

/// A wait registered with one standby's link: who to tell, and, for a wait on several
/// standbys ([`Replicas`]), whether it is decided already without this one (K others answered):
/// such a wait is dropped from the link's list uncalled ([`Protection::prune`]) rather than
/// kept for as long as this standby is away.
pub struct LinkWaiter {
    tell: Waiter,
    decided: Option<Arc<AtomicBool>>,
}

impl LinkWaiter {
    fn call(self, outcome: Result<(), PoolError>) {
        (self.tell)(outcome);
    }

    fn decided(&self) -> bool {
        self.decided
            .as_ref()
            .is_some_and(|decided| decided.load(Ordering::Acquire))
    }
}

/// Waits a link keeps before it drops those decided without it (and again each time the list
/// doubles past it), so that a standby that is away costs a bounded list, not one entry per
/// commit for as long as it is away.
const PRUNE_PAST: usize = 1024;

/// What a log's shipper and its waiters share.
struct Link {
    name: String,
    /// The `replicated` waiters and what the standby acknowledged.
    protection: Protection<LinkWaiter>,
    /// The node's registry of what logs acknowledged alone (shared by every link).
    reprotection: Arc<Reprotection>,
    state: Mutex<LinkState>,
    /// Signalled when the shipper has bytes to send, and on stop.
    appended: Condvar,
    stop: AtomicBool,
    /// Appended since the event loop last shipped or woke the shipper (it is in `unsent`).
    unsent: AtomicBool,
    /// The stream while a session is up: the shipper's, lent to the event loop when it is free.
    live: Mutex<Option<Live>>,
    /// The log's files (for the lag in bytes across segments).
    segments: Arc<SegmentSet>,
    /// The standby's acknowledgements on a plain TCP stream, read by whichever comes first: the
    /// event loop while `replicated` commits wait, or the acknowledgement thread.
    acks: Mutex<Option<AckInbox>>,
    /// Whether the event loop has taken the reading of this link's acknowledgements over (it
    /// spins): the acknowledgement thread then stays parked rather than being woken by each one
    /// only to find the loop took it (see [`AckReading`]).
    acks_reading: AckReading,
}

#[derive(Default)]
struct LinkState {
    /// Appends since the shipper last looked.
    dirty: bool,
    connected: bool,
    /// The term this log is shipped in, its history (as begun at open), and when the standby
    /// last acknowledged anything.
    term: u64,
    history: stela_format::term::TermHistory,
    last_ack: Option<std::time::Instant>,
    /// Segment bytes shipped and the bytes they took on the wire.
    shipped_bytes: u64,
    wire_bytes: u64,
    /// Since when the standby is unreachable (none while connected).
    unreachable_since: Option<std::time::Instant>,
    /// `--degrade-after` passed while unreachable: `replicated` waits are answered at once.
    degraded: bool,
    degraded_acks: u64,
    /// The highest LSN the degrade policy acknowledged without the standby: `stela status`
    /// says so until the standby holds it (the handshake ends the policy, not the exposure).
    degraded_through: u64,
    /// `replicated` commits of this link acknowledged by a promoted primary before a standby
    /// rejoined (shown; the LSNs they reached are kept by [`Reprotection`], which outlives the
    /// link).
    unprotected_acks: u64,
    /// Chunks of this session not yet acknowledged: (last LSN, segment, offset after it), in
    /// order, at most `SENT_KEPT`; and where the standby's copy ends by its acknowledgements.
    /// Only for the lag in bytes that `stela status` shows.
    sent: std::collections::VecDeque<(u64, u64, u64)>,
    acked_at: Option<(u64, u64)>,
}

impl LinkState {
    /// The degrade policy acknowledged `answered` commits without the standby, the highest at
    /// `through`.
    fn count_degraded(&mut self, answered: u64, through: u64) {
        self.degraded_acks += answered;
        self.degraded_through = self.degraded_through.max(through);
    }
}

/// Most chunk ends kept for the lag in bytes; when more are unacknowledged, the oldest are
/// forgotten and the lag is counted from the oldest kept.
const SENT_KEPT: usize = 4096;

/// Sets the replication stream's TCP options (`stela_net::tcp`) on `stream`; says once per
/// process which ones this kernel lacks (the stream then keeps those defaults).
pub(crate) fn tune_stream(stream: &TcpStream) {
    static TOLD: std::sync::Once = std::sync::Once::new();
    let tuned = stela_net::tcp::tune_for_loss(stream);
    if !tuned.all() {
        TOLD.call_once(|| {
            tracing::warn!(?tuned, "this kernel lacks some of the replication stream's TCP settings: a lost segment stalls replicated commits longer");
        });
    }
}

/// A policy that answers `replicated` waits without the standby.
#[derive(Clone, Copy)]
enum Policy {
    /// `--degrade-after`: the standby has been unreachable too long.
    Degraded,
    /// A promoted primary before its old primary has rejoined.
    Unprotected,
}

impl Policy {
    /// The answer a commit this policy takes gets: never `Ok`, which would say a standby holds
    /// the record (`ErrorCode::Unprotected` on the wire).
    fn answer(self, log: &str, lsn: u64) -> PoolError {
        PoolError::Unprotected(match self {
            Policy::Degraded => format!(
                "log {log} LSN {lsn} is on this primary alone: its standby has been unreachable past --degrade-after"
            ),
            Policy::Unprotected => format!(
                "log {log} LSN {lsn} is on this primary alone: it was promoted and no standby holds what it acknowledged since (--after-failover unprotected)"
            ),
        })
    }
}

/// What the shipper needs of a log.
#[derive(Clone)]
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
        node: Arc<crate::cluster::Node>,
        released: Released,
        degrade_after: Option<Duration>,
        tls: Option<StandbyTls>,
        token: Option<String>,
    ) -> Replication {
        Replication {
            standby,
            reprotection: Arc::new(Reprotection::new(Arc::clone(&node))),
            node,
            links: Mutex::new(HashMap::new()),
            shippers: Mutex::new(Vec::new()),
            released,
            unsent: Mutex::new(Vec::new()),
            any_unsent: AtomicBool::new(false),
            degrade_after,
            tls,
            token,
            standby_name: Mutex::new(None),
        }
    }

    /// A connection to the standby: its reading and writing ends, and the socket (to cut it).
    fn connect(&self) -> Result<(Reader, Writer, TcpStream), String> {
        let tcp = TcpStream::connect_timeout(&self.standby, LINK_DEADLINE)
            .map_err(|e| format!("connect {}: {e}", self.standby))?;
        tune_stream(&tcp);
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

    fn epoch(&self) -> u64 {
        self.node.epoch()
    }

    fn token(&self) -> Option<String> {
        self.token.clone()
    }

    /// The term `log`'s records get from now on, begun durably here, before the log takes an
    /// append (once per open log, for every standby together: [`replicas::Replicas::watch`]):
    /// every start of a primary is a new term, because records it lost in a crash may have been
    /// shipped and their LSNs are given to new records now; the new term tells the two apart.
    /// Returns the term, the history as begun, and the first LSN of the term.
    ///
    /// # Errors
    /// The log's TERMS file cannot be read or written (the open fails: a record appended in no
    /// recorded term could not be told apart after a failover).
    pub(crate) fn begin_term<W>(
        &self,
        pool: &Pool<W>,
        log: &LogInfo,
        storage: Arc<dyn stela_wal::storage::Storage>,
    ) -> Result<(u64, stela_format::term::TermHistory, u64), String> {
        let mut terms =
            TermStore::open(storage, &log.dir).map_err(|e| format!("the log's terms: {e}"))?;
        let (next, _) = pool.positions(log.id);
        let first = if terms.history().entries().is_empty() {
            1
        } else {
            next
        };
        let term = self.next_term(terms.current())?;
        terms
            .begin(term, first)
            .map_err(|e| format!("recording the log's new term: {e}"))?;
        Ok((term.0, terms.history().clone(), first))
    }

    /// The term `log` is shipped in to this standby, if it is shipped.
    pub(crate) fn watching(&self, log: LogId) -> Option<u64> {
        lock(&self.links)
            .get(&log)
            .map(|link| lock(&link.state).term)
    }

    /// Starts shipping `log` to this standby in `term` (begun by [`Replication::begin_term`],
    /// with `history` and `first` as it left them).
    pub(crate) fn watch_in<W: Send + 'static>(
        self: &Arc<Self>,
        pool: &Arc<Pool<W>>,
        log: LogInfo,
        storage: Arc<dyn stela_wal::storage::Storage>,
        begun: (u64, stela_format::term::TermHistory, u64),
    ) {
        let (term, history, first) = begun;
        let mut links = lock(&self.links);
        if links.contains_key(&log.id) {
            return;
        }
        let (next, _) = pool.positions(log.id);
        let link = Arc::new(Link {
            name: log.name.clone(),
            protection: Protection::new(),
            reprotection: Arc::clone(&self.reprotection),
            state: Mutex::new(LinkState {
                term,
                history,
                ..LinkState::default()
            }),
            appended: Condvar::new(),
            stop: AtomicBool::new(false),
            unsent: AtomicBool::new(false),
            live: Mutex::new(None),
            segments: Arc::clone(&log.segments),
            acks: Mutex::new(None),
            acks_reading: AckReading::default(),
        });
        // Registered before the link can take a commit, and under the links' lock, so that a
        // standby confirming another log meanwhile cannot end unprotected mode without it.
        self.reprotection
            .log_opened(&log.name, next.saturating_sub(1));
        links.insert(log.id, Arc::clone(&link));
        let mut hold = StandbyHold::open(storage, log.dir.clone(), self.standby.to_string(), first);
        let (me, pool) = (Arc::clone(self), Arc::clone(pool));
        let spawned = std::thread::Builder::new()
            .name(format!("stela-ship-{}", log.id))
            .spawn(move || me.ship_log(&pool, &link, &log, term, &mut hold));
        match spawned {
            Ok(thread) => {
                let mut shippers = lock(&self.shippers);
                shippers.retain(|t| !t.is_finished());
                shippers.push(thread);
            }
            Err(error) => {
                tracing::error!(%error, "could not start a shipper thread; replicated commits of this log will wait")
            }
        }
    }

    /// The term a log at `current` gets when this primary opens it: the next one, within this
    /// node's epoch (terms of epoch E are E << 32 | n, so a promoted node's terms are above
    /// every term of the primaries before it, and two nodes never make the same term).
    fn next_term(&self, current: Term) -> Result<Term, String> {
        let Some(epoch) = self.node.primary_epoch() else {
            return Err(format!(
                "this node is not the primary of its newest epoch {}: it begins no term",
                self.epoch()
            ));
        };
        if current.0 >> 32 > epoch {
            return Err(format!(
                "the log is at term {} of epoch {}, above this node's epoch {epoch}: a newer primary exists",
                current.0,
                current.0 >> 32
            ));
        }
        Ok(Term((current.0 + 1).max(epoch << 32 | 1)))
    }

    /// The term history and last term of `log`, as this primary began it (`History`).
    pub fn history(&self, log: LogId) -> Option<(u64, stela_format::term::TermHistory)> {
        let link = lock(&self.links).get(&log).cloned()?;
        let state = lock(&link.state);
        Some((state.term, state.history.clone()))
    }

    /// The last LSN of `log` held by a second node, as far as this primary knows: what its
    /// standby has acknowledged receiving, and, on a node promoted in this process
    /// (`promoted`), every record the log held when its current term began (they came from
    /// the old primary's stream, which held them before this node did). `u64::MAX` for a log
    /// this node does not ship.
    pub fn protected_through(&self, log: LogId, promoted: bool) -> u64 {
        let Some(link) = lock(&self.links).get(&log).cloned() else {
            return u64::MAX;
        };
        let (received, _) = link.protection.acknowledged_lsns();
        let state = lock(&link.state);
        let term_began = promoted
            .then(|| {
                state
                    .history
                    .entries()
                    .iter()
                    .find(|&&(term, _)| term.0 == state.term)
                    .map(|&(_, first)| first - 1)
            })
            .flatten()
            .unwrap_or(0);
        received.max(term_began)
    }

    /// The standby's `--node` name, once one of its streams has opened (`None` before, or from
    /// a standby that does not say it).
    pub fn standby_name(&self) -> Option<String> {
        lock(&self.standby_name).clone()
    }

    /// The holder's name of the hold this primary keeps for its standby (`standby at ADDR`).
    pub fn standby_holder(&self) -> String {
        stela_wal::holds::standby_holder(&self.standby.to_string())
    }

    /// The first LSN of `log` the standby has not stored, as its acknowledgements stand now.
    /// The hold's file follows them at most once a second ([`hold::MOVE_EVERY`]); a truncation
    /// takes the higher of the two. `None` before the standby has acknowledged anything
    /// durable.
    pub fn standby_stored(&self, log: LogId) -> Option<u64> {
        let link = lock(&self.links).get(&log).cloned()?;
        let (_, durable) = link.protection.acknowledged_lsns();
        (durable > 0).then_some(durable + 1)
    }

    /// The first LSN of `log` the standby has not acknowledged receiving (what `replicated`
    /// waits for); `None` while it has acknowledged nothing (a planned switchover's wait).
    pub fn standby_received(&self, log: LogId) -> Option<u64> {
        let link = lock(&self.links).get(&log).cloned()?;
        let (received, _) = link.protection.acknowledged_lsns();
        (received > 0).then_some(received + 1)
    }

    /// Stops shipping `log` (it was closed); its waiters are told.
    pub fn unwatch(&self, log: LogId) {
        if let Some(link) = lock(&self.links).remove(&log) {
            link.stop.store(true, Ordering::SeqCst);
            link.appended.notify_all();
            for (_, _, waiter) in link.protection.take_all() {
                waiter.call(Err(PoolError::Closed));
            }
            (self.released)();
            self.reprotection.log_closed(&link.name);
        }
    }

    /// The log `name` was deleted (it was closed first): what it acknowledged alone while the
    /// node is unprotected is gone with it, and no longer keeps the node unprotected.
    pub fn forget(&self, name: &str) {
        self.reprotection.log_deleted(name);
    }

    /// This node stepped down: every `replicated` waiter's commit is in doubt, and no log
    /// ships any more.
    pub fn step_down(&self, why: &str) {
        let links: Vec<Arc<Link>> = lock(&self.links).values().cloned().collect();
        for link in links {
            let why = format!("the primary stepped down: {why}");
            let waiters = link.protection.fence(why.clone());
            link.stop.store(true, Ordering::SeqCst);
            link.appended.notify_all();
            for waiter in waiters {
                waiter.call(Err(PoolError::InDoubt(why.clone())));
            }
        }
        (self.released)();
    }

    /// Stops every shipper (the daemon is shutting down, everything is written).
    pub fn stop_all(&self) {
        let logs: Vec<LogId> = lock(&self.links).keys().copied().collect();
        for log in logs {
            self.unwatch(log);
        }
        // Once stopped, every shipper has let go of its log's files.
        let shippers = std::mem::take(&mut *lock(&self.shippers));
        for thread in shippers {
            let _ = thread.join();
        }
    }

    /// Records of `log` were appended (by the event loop): they are shipped at the end of its
    /// turn, by [`Replication::ship_unsent`].
    pub fn appended(&self, log: LogId) {
        if let Some(link) = lock(&self.links).get(&log) {
            if !link.unsent.swap(true, Ordering::AcqRel) {
                lock(&self.unsent).push(log);
                self.any_unsent.store(true, Ordering::Release);
            }
        }
    }

    /// The event loop's turn is over: ships what it appended. A log with `replicated` commits
    /// waiting is sent from here when its stream is plain TCP and free, so the commit does not
    /// wait for the shipper thread to be woken and scheduled; otherwise (and for whatever cannot
    /// be sent without blocking) the shipper is woken.
    pub fn ship_unsent<W>(&self, pool: &Pool<W>) {
        if !self.any_unsent.swap(false, Ordering::AcqRel) {
            return;
        }
        let logs = std::mem::take(&mut *lock(&self.unsent));
        for log in logs {
            let Some(link) = lock(&self.links).get(&log).cloned() else {
                continue;
            };
            link.unsent.store(false, Ordering::Release);
            if link.protection.waiting() > 0 && ship_inline(pool, log, &link) {
                continue;
            }
            lock(&link.state).dirty = true;
            link.appended.notify_one();
        }
    }

    /// Calls `waiter` once the standby holds `lsn` of `log` as `holds` asks (in memory, or
    /// synced). `Ok(true)`: it already does (the waiter is dropped uncalled).
    /// [`PoolError::Unprotected`]: a policy answered without the standby (the waiter is dropped
    /// uncalled; the record stays appended).
    pub fn when_received(
        &self,
        log: LogId,
        lsn: u64,
        holds: Holds,
        waiter: Waiter,
        decided: Option<Arc<AtomicBool>>,
    ) -> Result<bool, PoolError> {
        let Some(link) = lock(&self.links).get(&log).cloned() else {
            return Err(PoolError::Closed);
        };
        let waiting = link.protection.waiting();
        if waiting >= PRUNE_PAST && waiting.is_power_of_two() {
            let dropped = link.protection.prune(|w| !w.decided());
            tracing::debug!(log = %link.name, standby = %self.standby, dropped, "dropped waits decided without this standby");
        }
        let waiter = LinkWaiter {
            tell: waiter,
            decided,
        };
        // Policies that answer without the standby: `--degrade-after` while it is unreachable,
        // and a promoted primary whose old primary has not rejoined (unprotected). Asked under
        // the protection's lock, so a wait never slips past the moment a policy ends or begins.
        // The unprotected policy is asked of `Reprotection`, which records the LSN under the
        // same lock that ends unprotected mode.
        let policy = std::cell::Cell::new(None);
        let answer_now = || {
            let mut state = lock(&link.state);
            if state.degraded {
                self.count_degraded(&link, &mut state, 1, lsn);
                policy.set(Some(Policy::Degraded));
                return true;
            }
            if !state.connected && self.reprotection.acknowledge_alone(&link.name, lsn) {
                state.unprotected_acks += 1;
                policy.set(Some(Policy::Unprotected));
                return true;
            }
            false
        };
        match link.protection.wait(lsn, holds, waiter, answer_now) {
            Registered::Waiting => Ok(false),
            Registered::Already(_) => match policy.get() {
                Some(policy) => Err(policy.answer(&link.name, lsn)),
                None => Ok(true),
            },
            Registered::Fenced(_, why) => Err(PoolError::InDoubt(why)),
        }
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
        if terms.current().0 >> 32 != self.epoch() {
            // This node was not the primary of the log's last term (it was promoted since):
            // its peer can hold no record it acknowledged that this copy lacks.
            return Ok(0);
        }
        let term = terms.current().0;
        let mut mirror =
            stela_wal::mirror::Mirror::open(dir, options, type_tag).map_err(|e| e.to_string())?;
        let (mut reader, mut writer, _socket, theirs) = match self.open_stream(
            log,
            codec,
            type_tag,
            term,
            terms.history(),
        ) {
            Ok(stream) => stream,
            Err(StreamError::Refused { message, .. }) => return Err(message),
            Err(StreamError::Broken(why)) => {
                tracing::warn!(log, standby = %self.standby, why, "standby unreachable at open: records it may hold that this primary lost are not fetched");
                return Ok(0);
            }
        };
        let their_end = theirs.end();
        let theirs = theirs.history;
        let ours_end = mirror.received_lsn();
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

    /// The event loop's turn is over and `replicated` commits wait: reads whatever the standby
    /// has acknowledged, without blocking, and releases those waiters here rather than after
    /// the acknowledgement thread is woken and scheduled (the loop publishes those it released
    /// on its next turn). While the loop spins it takes the reading over from the
    /// acknowledgement thread, which stays parked until the loop hands it back
    /// ([`acks::AckReading`]). `true`: commits still wait for the standby, so the loop keeps
    /// polling.
    pub fn take_acks(&self, loop_spins: bool) -> bool {
        let mut still_waiting = false;
        // No lock is taken under a link's `acks` that is held here (`links`).
        for link in lock(&self.links).values() {
            // Kept between commits while the loop spins, so that a lone committer does not
            // wake the thread after every acknowledgement.
            if loop_spins {
                link.acks_reading.take_over();
            } else {
                link.acks_reading.hand_back();
            }
            if link.protection.waiting() == 0 {
                continue;
            }
            let mut guard = match link.acks.try_lock() {
                Ok(guard) => guard,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    still_waiting = true;
                    continue;
                }
            };
            if let Some(inbox) = guard.as_mut().filter(|inbox| !inbox.ended) {
                inbox.take(link, &self.node, &*self.released);
                if inbox.ended {
                    // The thread ends the session: let it see that now.
                    link.acks_reading.hand_back();
                }
            }
            drop(guard);
            still_waiting |= link.protection.waiting() > 0;
        }
        still_waiting
    }

    /// The event loop is about to sleep: the acknowledgement threads read again.
    pub fn loop_sleeps(&self) {
        for link in lock(&self.links).values() {
            link.acks_reading.hand_back();
        }
    }

    /// Where each log's standby stands, for `stela status`; `end` gives a log's newest LSN and
    /// where its next frame goes ([`Pool::append_place`]).
    pub fn status(
        &self,
        end: impl Fn(LogId) -> (u64, Option<(u64, u64, u64)>),
    ) -> stela_proto::ReplicationStatus {
        // The node's state first: a node that reads as protected again already has each
        // standby's acknowledgement of what it acknowledged without one, which the logs, read
        // after, show.
        let (role, epoch, coordinator, last_failover, unprotected_since_ms) = self.node.status();
        let mut logs: Vec<stela_proto::ReplicaStatus> = lock(&self.links)
            .iter()
            .map(|(&id, link)| {
                // The protection's lock is never taken under the link state's (a wait takes
                // them the other way round).
                let (received, standby_durable) = link.protection.acknowledged_lsns();
                let stopped = link.protection.fenced();
                let (last_lsn, place) = end(id);
                let s = lock(&link.state);
                let lag_records = last_lsn.saturating_sub(received);
                let lag_bytes = match place {
                    Some(place) if lag_records > 0 => {
                        // Never connected: the standby is known to hold nothing of the log.
                        let from = s.acked_at.unwrap_or_else(|| {
                            let first = link.segments.list().first().map(|f| f.start.get());
                            (first.unwrap_or(place.0), 0)
                        });
                        bytes_between(&link.segments, from, place)
                    }
                    _ => 0,
                };
                stela_proto::ReplicaStatus {
                    log: link.name.clone(),
                    connected: s.connected,
                    term: s.term,
                    received_lsn: received,
                    durable_lsn: standby_durable,
                    lag_records,
                    lag_bytes,
                    lag_ms: if lag_records > 0 {
                        s.last_ack.map_or(0, |at| at.elapsed().as_millis() as u64)
                    } else {
                        0
                    },
                    stopped,
                    shipped_bytes: s.shipped_bytes,
                    wire_bytes: s.wire_bytes,
                    degraded: s.degraded,
                    degraded_acks: s.degraded_acks,
                    degraded_through: s.degraded_through,
                    unprotected_acks: s.unprotected_acks,
                    stalled: s.connected
                        && s.last_ack.is_some_and(|at| at.elapsed() > LINK_DEADLINE),
                    last_ack_ms: s.last_ack.map_or(0, |at| at.elapsed().as_millis() as u64),
                }
            })
            .collect();
        logs.sort_by(|a, b| a.log.cmp(&b.log));
        stela_proto::ReplicationStatus {
            role: role.into(),
            peer: self.standby.to_string(),
            logs,
            epoch,
            coordinator,
            last_failover,
            unprotected_since_ms,
            standbys: Vec::new(),
            replicas: 0,
        }
    }

    fn ship_log<W>(
        &self,
        pool: &Pool<W>,
        link: &Arc<Link>,
        log: &LogInfo,
        term: u64,
        hold: &mut StandbyHold,
    ) {
        // The reasons logged since the stream was last up: each is logged once, so a retry
        // that fails the same way adds nothing and one that fails differently is seen (the
        // first reason can hide the one that persists, and two that alternate are not logged
        // every 100 ms). Forgotten once a session gets through its handshake.
        let mut warned: Vec<String> = Vec::new();
        while !link.stop.load(Ordering::SeqCst) {
            match self.session(pool, link, log, term, hold) {
                Ok(()) => return,
                Err(why) => {
                    {
                        let mut state = lock(&link.state);
                        if std::mem::take(&mut state.connected) {
                            warned.clear();
                        }
                        state
                            .unreachable_since
                            .get_or_insert_with(std::time::Instant::now);
                    }
                    self.answer_unprotected(link);
                    if !warned.contains(&why) && warned.len() < WARNED_REASONS {
                        tracing::warn!(log = %log.name, standby = %self.standby, why, "standby unreachable; replicated commits wait; retrying");
                        warned.push(why);
                    }
                    if link.protection.fenced().is_some() {
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
        hold: &mut StandbyHold,
    ) -> Result<(), String> {
        // Cloned first: the link's lock must not be held across the connection's handshake
        // (a stopped standby would hold it, and every commit and `stela status` with it).
        let history = lock(&link.state).history.clone();
        let (mut reader, mut writer, socket, mut theirs) =
            match self.open_stream(&log.name, log.codec, &log.type_tag, term, &history) {
                Ok(stream) => stream,
                Err(StreamError::Refused {
                    term: theirs,
                    message,
                }) => return Err(self.fence(link, theirs, term, message)),
                Err(StreamError::Broken(why)) => return Err(why),
            };
        if !theirs.node.is_empty() {
            *lock(&self.standby_name) = Some(theirs.node.clone());
        }
        // A standby that holds records this primary's history does not carry: cut them (its
        // own salvage keeps them) when they are of an older epoch (it was the primary before a
        // failover); otherwise they may be acknowledged records this primary lost, and
        // shipping stops rather than overwrite them.
        loop {
            let (history, ours_end) = {
                let state = lock(&link.state);
                (state.history.clone(), pool.positions(log.id).0 - 1)
            };
            let their_end = theirs.end();
            let agreed =
                stela_format::term::divergence((&history, ours_end), (&theirs.history, their_end));
            if their_end <= agreed {
                break;
            }
            let their_term = theirs.history.term_of(agreed + 1).map_or(0, |t| t.0);
            if their_term >> 32 >= term >> 32 {
                return Err(self.fence(
                    link,
                    u64::MAX,
                    term,
                    format!(
                        "the standby holds records up to LSN {their_end} (term {their_term}) that \
                         this primary's copy lacks after LSN {agreed}: they may be acknowledged \
                         records this primary lost; shipping stops rather than overwrite them"
                    ),
                ));
            }
            tracing::warn!(log = %log.name, standby = %self.standby, after = agreed, their_end, their_term,
                "the standby diverged (it was a primary in an older epoch): it cuts its copy after the common point and keeps the rest in salvage");
            send(
                &mut writer,
                &ReplMessage::Cut {
                    term,
                    after_lsn: agreed,
                },
            )?;
            theirs = self.position_after(link, term, &mut reader)?;
        }
        // A copy that ends in a segment older than this copy's oldest cannot be continued:
        // this node truncated the records between (a new standby, or one away while a hold
        // for it was released). Every record it holds is one this node truncated (the copy
        // agrees with this history, as settled above), so it begins again at the oldest
        // segment here.
        let oldest = link.segments.list().first().cloned();
        let reseed = oldest.filter(|o| theirs.position.segment_start < o.start);
        if let Some(oldest) = &reseed {
            let header = link
                .segments
                .read_header(&oldest.path)
                .map_err(|e| e.to_string())?;
            tracing::warn!(log = %log.name, standby = %self.standby, their_end = theirs.end(), oldest = oldest.start.get(),
                "the standby's copy ends before this copy's oldest segment: it begins again there");
            send(
                &mut writer,
                &ReplMessage::Reseed {
                    term,
                    header: header.encode().to_vec(),
                },
            )?;
            theirs = self.position_after(link, term, &mut reader)?;
        }
        // Records the standby holds in this primary's own term came from it: they count (not
        // after a reseed: it holds none below where it began again).
        if reseed.is_none()
            && theirs.history.last_term() == Term(term)
            && release(link, theirs.end(), theirs.durable_lsn)
        {
            (self.released)();
        }
        hold.standby_at(theirs.durable_lsn + 1);
        let at = theirs.position;
        {
            let mut state = lock(&link.state);
            state.sent.clear();
            state.acked_at = Some((at.segment_start.get(), at.offset));
            state.connected = true;
            state.unreachable_since = None;
            // The link's deadline runs from the handshake.
            state.last_ack = Some(std::time::Instant::now());
            if std::mem::take(&mut state.degraded) {
                tracing::warn!(log = %log.name, standby = %self.standby, degraded_acks = state.degraded_acks, "standby back: replicated commits wait for it again");
            }
        }
        // After `connected` is set, so that no commit of this log is acknowledged alone past
        // the handshake (until the session ends): a log whose standby already holds what it
        // owes is confirmed here, another once the standby acknowledges it. What the standby
        // holds agrees with this copy (what diverged was cut above); after a reseed it holds
        // nothing yet.
        let standby_holds = if reseed.is_none() { theirs.end() } else { 0 };
        self.reprotection
            .standby_connected(&log.name, standby_holds);
        tracing::info!(log = %log.name, standby = %self.standby, from = at.next_lsn.get(), "shipping to the standby");
        // Acknowledgements arrive on their own thread, so shipping never waits for them; on a
        // plain TCP stream the event loop may take them first (see `Replication::take_acks`).
        if self.tls.is_none() {
            *lock(&link.acks) = Some(AckInbox {
                socket: socket.try_clone().map_err(|e| e.to_string())?,
                pending: reader.buffer().to_vec(),
                term,
                ended: false,
            });
        }
        let acks = {
            let link = Arc::clone(link);
            let polled = self.tls.is_none();
            std::thread::Builder::new()
                .name("stela-ship-acks".into())
                .spawn({
                    let released = Arc::clone(&self.released);
                    let node = Arc::clone(&self.node);
                    move || {
                        if polled {
                            read_acks_polled(&link, &node, &*released);
                        } else {
                            read_acks(reader, &link, &node, term, &*released);
                        }
                    }
                })
                .map_err(|e| e.to_string())?
        };
        let header = header_for(&log.segments, at.segment_start, log, None)?;
        let plain = if self.tls.is_none() {
            socket.try_clone().ok()
        } else {
            None
        };
        *lock(&link.live) = Some(Live {
            writer,
            plain,
            term,
            at,
            header,
            unfinished: Vec::new(),
        });
        // Where the standby last heard this copy begins: told once the stream starts, and again
        // whenever truncation moves it, so the standby's copy does not keep what this one no
        // longer has (`ReplMessage::Truncated`).
        let mut told_first = 0;
        // The link's deadline is watched from a thread of its own as well: the shipper may be
        // blocked in a send that a black-holed link never completes (its socket buffer full),
        // and the acknowledgement reader in a read that never returns; cutting the socket ends
        // both at once, TLS or not.
        let watch = watch_deadline(Arc::clone(link), &socket)?;
        let result = loop {
            if link.stop.load(Ordering::SeqCst) {
                break Ok(());
            }
            if acks.is_finished() {
                break Err("the standby closed the stream".to_owned());
            }
            let step = match lock(&link.live).as_mut() {
                Some(live) => ship_next(pool, log.id, link, live, Source::MemoryOrFiles(log)),
                None => Err("the stream was taken".to_owned()),
            };
            match step {
                Ok(Step::Shipped) => continue,
                Ok(Step::Nothing | Step::LeftToShipper) => {}
                Err(why) => break Err(why),
            }
            hold.acknowledged(|| link.protection.acknowledged_lsns().1 + 1);
            let first_lsn = link.segments.first_lsn().get();
            if first_lsn > told_first {
                let sent = match lock(&link.live).as_mut() {
                    Some(live) => live.send(&ReplMessage::Truncated { term, first_lsn }),
                    None => Err("the stream was taken".to_owned()),
                };
                if let Err(why) = sent {
                    break Err(why);
                }
                told_first = first_lsn;
            }
            let mut state = lock(&link.state);
            if !state.dirty {
                let (next, timeout) = link
                    .appended
                    .wait_timeout(state, HEARTBEAT)
                    .unwrap_or_else(|e| e.into_inner());
                state = next;
                if timeout.timed_out() && !state.dirty {
                    drop(state);
                    let sent = match lock(&link.live).as_mut() {
                        Some(live) => live.send(&ReplMessage::Heartbeat { term }),
                        None => Err("the stream was taken".to_owned()),
                    };
                    if let Err(why) = sent {
                        break Err(why);
                    }
                    continue;
                }
            }
            state.dirty = false;
        };
        // Cutting the socket ends the acknowledgement reader's wait, TLS or not.
        drop(lock(&link.live).take());
        let _ = socket.shutdown(std::net::Shutdown::Both);
        watch.finish();
        let _ = acks.join();
        drop(lock(&link.acks).take());
        result
    }

    /// Connects to the standby and opens `log`'s stream in `term`: where the standby's copy
    /// stands, or its refusal.
    fn open_stream(
        &self,
        log: &str,
        codec: Codec,
        type_tag: &str,
        term: u64,
        history: &stela_format::term::TermHistory,
    ) -> Result<(BufReader<Reader>, Writer, TcpStream, TheirCopy), StreamError> {
        let (reader, mut writer, socket) = self.connect().map_err(StreamError::Broken)?;
        let mut reader = BufReader::new(reader);
        send(
            &mut writer,
            &ReplMessage::Open {
                term,
                node: self.node.name.clone(),
                log: log.to_owned(),
                codec: codec.name().to_owned(),
                type_tag: type_tag.to_owned(),
                token: self.token(),
                history: history.entries().iter().map(|&(t, f)| (t.0, f)).collect(),
            },
        )
        .map_err(StreamError::Broken)?;
        // A standby that is stopped (SIGSTOP, a hung machine) still has its connections accepted
        // by the kernel but never answers: the socket is cut after `HANDSHAKE`, so the shipper
        // retries, and `--degrade-after` can take effect, rather than wait for it for ever.
        let theirs = std::thread::scope(|scope| {
            let (answered, answer) = std::sync::mpsc::channel::<()>();
            let cutter = &socket;
            scope.spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    answer.recv_timeout(HANDSHAKE)
                {
                    let _ = cutter.shutdown(std::net::Shutdown::Both);
                }
            });
            let theirs = read_position(&mut reader);
            drop(answered);
            theirs
        })?;
        Ok((reader, writer, socket, theirs))
    }

    /// `--degrade-after`: once the standby has been unreachable that long, answers every
    /// `replicated` waiter (the records stay in this primary's buffers: `buffered`'s promise) and
    /// every later one at once, loudly, until the standby is back.
    fn degrade_if_due(&self, link: &Link) {
        let Some(after) = self.degrade_after else {
            return;
        };
        {
            let mut state = lock(&link.state);
            let due = state
                .unreachable_since
                .is_some_and(|t| t.elapsed() >= after);
            if !due || state.degraded {
                return;
            }
            state.degraded = true;
        }
        // Waits registered before the flag was set are answered here; later ones see it.
        let waiting = self.answer_all_without_standby(link, Policy::Degraded);
        tracing::error!(log = %link.name, standby = %self.standby, after_ms = after.as_millis() as u64, waiting,
            "standby unreachable too long: replicated commits are acknowledged WITHOUT it (as buffered) until it is back");
    }

    /// The degrade policy acknowledged `answered` commits of `link` without the standby, the
    /// highest at `through`: counted for `stela status`, and on a promoted node not yet
    /// protected again also recorded as acknowledged alone (the policy answers either way).
    /// Called under the link's state lock, which is taken before the registry's.
    fn count_degraded(&self, link: &Link, state: &mut LinkState, answered: u64, through: u64) {
        state.count_degraded(answered, through);
        self.reprotection.acknowledge_alone(&link.name, through);
    }

    /// Answers every registered wait of `link` without the standby, as `policy` does
    /// ([`PoolError::Unprotected`], never `Ok`), and counts them as its acknowledgements.
    /// Returns how many it answered.
    fn answer_all_without_standby(&self, link: &Link, policy: Policy) -> usize {
        let waiters = link.protection.take_all();
        if waiters.is_empty() {
            return 0;
        }
        let highest = waiters.iter().map(|&(lsn, _, _)| lsn).max().unwrap_or(0);
        if let Policy::Unprotected = policy {
            if !self.reprotection.acknowledge_alone(&link.name, highest) {
                // The node was protected again since the caller looked (the other logs'
                // standbys confirmed, and this log's had before its session ended): these
                // commits wait for the standby, as every commit of a protected node does.
                self.wait_again(link, waiters);
                return 0;
            }
        }
        let answered = waiters.len();
        {
            let mut state = lock(&link.state);
            match policy {
                Policy::Degraded => self.count_degraded(link, &mut state, answered as u64, highest),
                Policy::Unprotected => state.unprotected_acks += answered as u64,
            }
        }
        for (lsn, _, waiter) in waiters {
            waiter.call(Err(policy.answer(&link.name, lsn)));
        }
        (self.released)();
        answered
    }

    /// Registers `waiters`, taken from `link`, again: each waits for the standby (or is
    /// answered now if it already holds the LSN, or the log was fenced meanwhile).
    fn wait_again(&self, link: &Link, waiters: Vec<(u64, Holds, LinkWaiter)>) {
        let mut any = false;
        for (lsn, holds, waiter) in waiters {
            match link.protection.wait(lsn, holds, waiter, || false) {
                Registered::Waiting => {}
                Registered::Already(waiter) => {
                    waiter.call(Ok(()));
                    any = true;
                }
                Registered::Fenced(waiter, why) => {
                    waiter.call(Err(PoolError::InDoubt(why)));
                    any = true;
                }
            }
        }
        if any {
            (self.released)();
        }
    }

    /// The session ended while the node is unprotected (promoted, and not every log's standby
    /// has confirmed holding what the log acknowledged alone): the waits registered while the
    /// standby was connected are answered now, as the unprotected policy answers new ones
    /// (`when_received`). Without this, an old primary that answered the handshake and then
    /// exited (stepping down) left them waiting for a standby that was gone. `connected` is
    /// cleared before: a wait registered from then on is answered at once, one registered
    /// before is taken here.
    fn answer_unprotected(&self, link: &Link) {
        if !self.node.unprotected() {
            return;
        }
        let waiting = self.answer_all_without_standby(link, Policy::Unprotected);
        if waiting > 0 {
            tracing::warn!(log = %link.name, standby = %self.standby, waiting,
                "the standby left before confirming its rejoin: replicated commits acknowledged WITHOUT it (unprotected)");
        }
    }

    /// The standby's `Position` after a `Cut` or a `Reseed`; a refusal fences as at the
    /// handshake.
    fn position_after(
        &self,
        link: &Link,
        term: u64,
        reader: &mut impl Read,
    ) -> Result<TheirCopy, String> {
        match read_position(reader) {
            Ok(position) => Ok(position),
            Err(StreamError::Refused {
                term: theirs,
                message,
            }) => Err(self.fence(link, theirs, term, message)),
            Err(StreamError::Broken(why)) => Err(why),
        }
    }

    fn fence(&self, link: &Link, theirs: u64, ours: u64, message: String) -> String {
        fence(link, &self.node, &*self.released, theirs, ours, message)
    }
}

/// A session's deadline watch ([`watch_deadline`]); finished when the session ends.
struct DeadlineWatch {
    over: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl DeadlineWatch {
    fn finish(self) {
        self.over.store(true, Ordering::SeqCst);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

/// Watches a session's link: once the standby has sent nothing for [`LINK_DEADLINE`] (no
/// acknowledgement, not even of a heartbeat), cuts `socket`, which ends the session however
/// its threads are blocked; the shipper then opens a new stream.
fn watch_deadline(link: Arc<Link>, socket: &TcpStream) -> Result<DeadlineWatch, String> {
    let socket = socket.try_clone().map_err(|e| e.to_string())?;
    let over = Arc::new(AtomicBool::new(false));
    let thread = {
        let over = Arc::clone(&over);
        std::thread::Builder::new()
            .name("stela-ship-watch".into())
            .spawn(move || {
                while !over.load(Ordering::SeqCst) {
                    std::thread::park_timeout(LINK_DEADLINE / 4);
                    let silent = lock(&link.state).last_ack.map(|at| at.elapsed());
                    if let Some(silent) = silent.filter(|&s| s > LINK_DEADLINE) {
                        if !over.load(Ordering::SeqCst) {
                            tracing::warn!(log = %link.name, silent_ms = silent.as_millis() as u64,
                                "nothing from the standby within the link's deadline: the stream is torn down and opened again");
                            let _ = socket.shutdown(std::net::Shutdown::Both);
                        }
                        return;
                    }
                }
            })
            .map_err(|e| e.to_string())?
    };
    Ok(DeadlineWatch { over, thread })
}

/// Where the standby's copy of a log stands, as its `Position` says.
struct TheirCopy {
    position: Position,
    durable_lsn: u64,
    history: stela_format::term::TermHistory,
    /// The standby's `--node` name (empty if it does not say).
    node: String,
}

impl TheirCopy {
    /// The last LSN the copy holds.
    fn end(&self) -> u64 {
        self.position.next_lsn.get() - 1
    }
}

/// Why a stream could not be opened.
enum StreamError {
    /// The standby said no, at its term.
    Refused { term: u64, message: String },
    /// The connection failed or the standby answered out of turn.
    Broken(String),
}

/// Reads the standby's `Position` (after `Open` or `Cut`).
fn read_position(reader: &mut impl Read) -> Result<TheirCopy, StreamError> {
    match receive(reader).map_err(StreamError::Broken)? {
        ReplMessage::Position {
            segment_start,
            offset,
            next_lsn,
            durable_lsn,
            history,
            node,
            ..
        } => {
            let history = stela_format::term::TermHistory::from_entries(
                history.into_iter().map(|(t, f)| (Term(t), f)),
            )
            .map_err(|e| StreamError::Broken(format!("the standby's term history: {e}")))?;
            Ok(TheirCopy {
                position: Position {
                    segment_start: Lsn::new(segment_start),
                    offset,
                    next_lsn: Lsn::new(next_lsn.max(1)),
                },
                durable_lsn,
                history,
                node,
            })
        }
        ReplMessage::Refuse { term, message } => Err(StreamError::Refused { term, message }),
        other => Err(StreamError::Broken(format!(
            "expected the standby's position, got {other:?}"
        ))),
    }
}

/// Segment bytes from `from` (segment, offset) to `to` (segment, offset, capacity): within one
/// segment the offsets' difference; across segments the rest of `from`'s segment, the segments
/// between as their files list them (a segment counts its capacity), and `to`'s offset.
fn bytes_between(segments: &SegmentSet, from: (u64, u64), to: (u64, u64, u64)) -> u64 {
    let ((from_segment, from_offset), (to_segment, to_offset, capacity)) = (from, to);
    if from_segment >= to_segment {
        return to_offset.saturating_sub(from_offset);
    }
    let between = segments
        .list()
        .iter()
        .filter(|file| (from_segment + 1..to_segment).contains(&file.start.get()))
        .count() as u64;
    capacity.saturating_sub(from_offset) + between * capacity + to_offset
}

/// Writes one framed message.
pub(crate) fn send(writer: &mut impl Write, message: &ReplMessage) -> Result<(), String> {
    let mut out = Vec::new();
    frame::encode(message, &mut out).map_err(|e| e.to_string())?;
    writer.write_all(&out).map_err(|e| e.to_string())
}

/// Reads one framed message (blocking).
pub(crate) fn receive(reader: &mut impl Read) -> Result<ReplMessage, String> {
    receive_within(reader, MAX_FRAME_BYTES)
}

/// Reads one framed message of at most `limit` bytes (blocking).
pub(crate) fn receive_within(reader: &mut impl Read, limit: usize) -> Result<ReplMessage, String> {
    let mut header = [0u8; stela_proto::FRAME_HEADER_BYTES];
    reader.read_exact(&mut header).map_err(|e| e.to_string())?;
    let parsed = frame::parse_header(header, limit).map_err(|e| e.to_string())?;
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
