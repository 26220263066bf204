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
//!
//! The rooms: [`session`] (connecting, the handshake that settles the standby's copy, the
//! shipping loop and its retries), [`ship`] (the bytes sent, by the shipper or the event loop),
//! [`acks`] (the standby's acknowledgements and fencing), [`policy`] (answers without the
//! standby), [`catch_up`] (records fetched back after a crash), [`status`], [`wire`] (frames on
//! the connection), [`error`] (why a session ends) and [`ends`] (the ends kept for status); [`replicas`] and [`tally`] wait on
//! several standbys; [`protection`], [`reprotection`] and [`hold`] keep what waits and what is
//! owed. This file owns the links (one per open log) and the entry points the engine calls.

mod acks;
mod catch_up;
mod ends;
mod error;
mod hold;
mod policy;
pub mod protection;
mod replicas;
mod reprotection;
mod session;
mod ship;
// The standby's listener (sockets, TLS, threads) is left out of the loom build.
#[cfg(not(stela_loom))]
pub mod standby;
mod status;
mod tally;
mod wire;

use acks::{AckInbox, AckReading};
pub use error::SessionEnd;
use hold::StandbyHold;
pub use protection::Holds;
use protection::Protection;
pub use replicas::Replicas;
use reprotection::Reprotection;
use ship::{ship_inline, Live};
pub(crate) use wire::{receive, send, tune_stream, Reader, Writer};

use crate::pool::{LogId, Pool, PoolError};
use crate::sync::lock;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::time::Duration;
use stela_format::term::Term;
use stela_format::Codec;
use stela_proto::repl::chunk_message;
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
    /// Why this standby's sessions ended, for `stela status` and the metrics.
    ends: ends::SessionEnds,
}

/// How a primary reaches its standby over TLS.
pub struct StandbyTls {
    pub config: Arc<stela_net::tls::rustls::ClientConfig>,
    /// The name the standby's certificate must carry.
    pub name: stela_net::tls::rustls::pki_types::ServerName<'static>,
}

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
            ends: ends::SessionEnds::default(),
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
    ) -> Result<(u64, stela_format::term::TermHistory, u64), SessionEnd> {
        let mut terms = TermStore::open(storage, &log.dir)
            .map_err(|e| SessionEnd::Storage(format!("the log's terms: {e}")))?;
        let (next, _) = pool.positions(log.id);
        let first = if terms.history().entries().is_empty() {
            1
        } else {
            next
        };
        let term = self.next_term(terms.current())?;
        terms
            .begin(term, first)
            .map_err(|e| SessionEnd::Storage(format!("recording the log's new term: {e}")))?;
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
    fn next_term(&self, current: Term) -> Result<Term, SessionEnd> {
        let Some(epoch) = self.node.primary_epoch() else {
            return Err(SessionEnd::Fenced(format!(
                "this node is not the primary of its newest epoch {}: it begins no term",
                self.epoch()
            )));
        };
        if current.0 >> 32 > epoch {
            return Err(SessionEnd::Fenced(format!(
                "the log is at term {} of epoch {}, above this node's epoch {epoch}: a newer primary exists",
                current.0,
                current.0 >> 32
            )));
        }
        let next = Term((current.0 + 1).max(epoch << 32 | 1));
        debug_assert!(next > current, "a term only goes up");
        Ok(next)
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
}
