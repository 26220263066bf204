//! The daemon's connections, served by one event loop thread without a thread per connection.
//!
//! The loop (mio) accepts on the Unix socket (and TCP, if configured), reads each connection's
//! bytes as they arrive, hands complete requests to [`conn`], copies entries out of the
//! shared-memory rings ([`ring`]), and writes answers. Requests that wait for the disk go to a
//! worker or to the pool's `disk` waiters and come back through the [`inbox`]. While there is
//! traffic the loop keeps polling (sockets and rings) instead of sleeping, so a commit costs a
//! memory hand-off rather than a thread wake-up; after [`crate::config::SPIN`] without any, it
//! tells the rings' clients to ring the doorbell and sleeps in `epoll_wait`.
//!
//! Limits it keeps ([`limits`]): the file limit is raised to the hard limit at start; clients
//! beyond the connection limit are refused with `TooManyConnections`, administrators are
//! served from a small reserve beyond it (both read per Hello from [`NetCounters`], so a SIGHUP
//! reload changes them for the next connection and drops none already served); connections
//! that do not complete their Hello within the handshake timeout, or whose handshake slot a
//! newer connection needs, are closed with `Timeout`; so are connections idle past the idle
//! timeout; the bytes held for partly received frames of all connections together stay under a
//! cap (a connection past it is not read until the others' bytes are handled). Failures to
//! accept are logged, never dropped silently.
//!
//! Security ([`auth`]): TCP connections run TLS (rustls, driven without blocking inside the
//! loop: a TLS connection costs no thread), unless the listener is an explicit insecure loopback
//! one. A peer that fails the TLS handshake or does not authenticate at its Hello is refused,
//! logged with its address and counted in [`NetCounters::refused_logins`]. Administrative
//! requests are refused to TCP peers not authenticated as administrators.

pub(crate) mod auth;
pub(crate) mod conn;
pub(crate) mod inbox;
pub mod limits;
pub(crate) mod ring;
mod ring_conn;
mod spin;

use crate::config::DaemonConfig;
use crate::engine::{Engine, NetStats};
use crate::error::StartError;
use crate::workers::Workers;
use auth::{Auth, Identity};
use conn::{Conn, Ctx, Phase, Progress, Stream, TlsStream, Waiting};
use inbox::{Answer, ConnRef, Effect, Event, Inbox};
use mio::{Events, Interest, Poll, Token};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_net::shm::WakeBatch;
use stela_proto::{ErrorCode, ResponseBody, Role};

const WAKER: Token = Token(0);
const UNIX_LISTENER: Token = Token(1);
const TCP_LISTENER: Token = Token(2);
/// Connection `slot` has token `CONN_BASE + 2 * slot`, its ring's doorbell the next one.
const CONN_BASE: usize = 16;

/// Bytes read from one connection before the loop turns to the others.
const READ_BUDGET: usize = 256 << 10;
/// Bytes of a partly received frame any connection may hold even when all connections together
/// hold the cap (`--partial-frame-bytes`): small requests (a Hello, `stela status`, a commit of
/// small records) are read and answered whatever larger frames others leave unfinished. Only
/// the connections holding more than this wait for room.
const SMALL_FRAME_RESERVE: usize = 16 << 10;
/// What a connection may hold before its Hello is handled: one Hello frame.
const HANDSHAKE_HOLD: usize = stela_proto::FRAME_HEADER_BYTES + stela_proto::MAX_HELLO_FRAME_BYTES;
/// The most one `Read` answer carries while the output is at its cap (at least one record):
/// the reserve a connection may hold then ([`conn::OUTPUT_RESERVE`]).
const OUTPUT_RESERVE: usize = conn::OUTPUT_RESERVE;
/// The most one `Read` answer carries otherwise (at least one record).
const READ_ANSWER_BYTES: usize = 1 << 20;
/// The share of the handshake slots connections from one address (TCP) may hold: past it, one
/// of that address's own makes room, so one address cannot take the others' slots.
const HANDSHAKE_SHARE_PER_ADDRESS: usize = 2;
/// While polling, sockets are asked for events at least this often (rings every turn).
const SOCKET_POLL_EVERY: Duration = Duration::from_micros(20);
/// How long the loop keeps polling while a ring waits for the disk (past it, it sleeps and the
/// completion wakes it). Not when the loop runs realtime: then it would hold a CPU the flushers
/// and the clients need.
const DISK_SPIN: Duration = Duration::from_millis(5);
/// How often deadlines are checked.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// Counters the loop keeps for `stela status` (read from other threads).
#[derive(Debug, Default)]
pub struct NetCounters {
    pub connections: AtomicU32,
    pub rings: AtomicU32,
    pub refused: AtomicU64,
    /// TCP peers refused for failing authentication: a TLS handshake that failed (no or a
    /// wrong client certificate, not TLS at all) or a Hello without the right token. Also
    /// counted in `refused`.
    pub refused_logins: AtomicU64,
    pub partial_bytes: AtomicU64,
    /// Clients served at once (changeable by a SIGHUP reload, under the file limit).
    pub max_connections: AtomicU32,
    /// Administrator connections served beyond the limit (changeable, like the limit, by a
    /// SIGHUP reload; lowering either drops no connection, it only refuses new ones).
    pub admin_connections: AtomicU32,
    /// The idle timeout in milliseconds (0: never), changeable while running (SIGHUP reload).
    pub idle_timeout_ms: AtomicU64,
    /// The event loop got realtime scheduling.
    pub realtime: AtomicBool,
    /// The event loop spins after a turn with work, nothing being owed (its spin policy finds
    /// that it pays lately; [`spin::SpinPolicy`]).
    pub spins_after_work: AtomicBool,
    pub file_limit: AtomicU64,
    pub partial_cap: AtomicU64,
    pub output_bytes: AtomicU64,
    pub output_cap: AtomicU64,
}

impl NetCounters {
    /// Puts `limits` in force for the connections that say Hello from now on.
    pub fn set_limits(&self, limits: &limits::Limits) {
        let saturate = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        self.max_connections
            .store(saturate(limits.clients), Ordering::Relaxed);
        self.admin_connections
            .store(saturate(limits.admins), Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> NetStats {
        NetStats {
            connections: self.connections.load(Ordering::Relaxed),
            max_connections: self.max_connections.load(Ordering::Relaxed),
            file_limit: self.file_limit.load(Ordering::Relaxed),
            rings: self.rings.load(Ordering::Relaxed),
            refused_connections: self.refused.load(Ordering::Relaxed),
            partial_frame_bytes: self.partial_bytes.load(Ordering::Relaxed),
            partial_frame_cap: self.partial_cap.load(Ordering::Relaxed),
            output_bytes: self.output_bytes.load(Ordering::Relaxed),
            output_cap: self.output_cap.load(Ordering::Relaxed),
            realtime_loop: self.realtime.load(Ordering::Relaxed),
            loop_spins: self.spins_after_work.load(Ordering::Relaxed),
        }
    }
}

/// What the server keeps to stop the loop.
pub struct LoopHandle {
    stop: Arc<AtomicBool>,
    waker: Arc<mio::Waker>,
    pub counters: Arc<NetCounters>,
}

impl LoopHandle {
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}

pub(crate) struct EventLoop {
    poll: Poll,
    engine: Arc<Engine>,
    inbox: Arc<Inbox>,
    workers: Arc<Workers>,
    counters: Arc<NetCounters>,
    stop: Arc<AtomicBool>,
    unix: mio::net::UnixListener,
    tcp: Option<mio::net::TcpListener>,
    auth: Arc<Auth>,
    conns: Vec<Option<Conn>>,
    free_slots: Vec<usize>,
    next_serial: u64,
    /// As found at start; only `handshakes` is read from it: the connection limits are the
    /// counters' `max_connections` / `admin_connections`, which a reload changes.
    limits: limits::Limits,
    clients: usize,
    admins: usize,
    /// Connections in their handshake, oldest first (stale entries are skipped).
    handshakes: VecDeque<ConnRef>,
    /// Connections with bytes to handle or an answer that arrived.
    ready: VecDeque<usize>,
    /// Connections held back by the cap on unhandled bytes.
    throttled: VecDeque<usize>,
    /// Connections (and rings) whose append found no space.
    parked: Vec<usize>,
    /// Connections with a ring.
    rings: Vec<usize>,
    /// Handles of connections closed while a request of theirs was still out (a worker job, a
    /// `disk` wait): given back when its answer arrives, so no log is closed under it.
    orphans: Vec<(ConnRef, Vec<crate::pool::LogId>)>,
    /// Rings with an entry waiting for the disk (as of the last scan).
    disk_waits: usize,
    held: usize,
    held_cap: usize,
    /// Unsent answer bytes of all connections together, and their cap (`--output-bytes`): past
    /// it, `Read` answers shrink to [`OUTPUT_RESERVE`] and a connection holding more than that
    /// waits for its answers to go out.
    output: usize,
    output_cap: usize,
    handshake_timeout: Duration,
    /// A frame begun must arrive whole within this.
    frame_timeout: Duration,
    spin: Duration,
    /// Realtime scheduling is asked for; [`crate::sched::LoopPriority`] decides when it is used.
    realtime: bool,
    max_frame: usize,
    ring_bytes: usize,
    /// The wake boards of the users with rings.
    boards: ring_conn::Boards,
    scratch: Vec<u8>,
    /// A descriptor kept open to be closed when the process is out of them, so that one more
    /// connection can be accepted and told why it is refused.
    spare_fd: Option<std::fs::File>,
    last_accept_error: Option<Instant>,
}

/// Sets up the loop on its listeners; [`EventLoop::run`] runs it.
pub(crate) fn create(
    config: &DaemonConfig,
    engine: Arc<Engine>,
    unix: std::os::unix::net::UnixListener,
    tcp: Option<std::net::TcpListener>,
    auth: Arc<Auth>,
) -> Result<(EventLoop, LoopHandle), StartError> {
    let poll = Poll::new().map_err(StartError::EventLoop)?;
    let waker = Arc::new(mio::Waker::new(poll.registry(), WAKER).map_err(StartError::EventLoop)?);
    unix.set_nonblocking(true).map_err(StartError::EventLoop)?;
    let mut unix = mio::net::UnixListener::from_std(unix);
    poll.registry()
        .register(&mut unix, UNIX_LISTENER, Interest::READABLE)
        .map_err(StartError::EventLoop)?;
    let tcp = match tcp {
        Some(listener) => {
            listener
                .set_nonblocking(true)
                .map_err(StartError::EventLoop)?;
            let mut listener = mio::net::TcpListener::from_std(listener);
            poll.registry()
                .register(&mut listener, TCP_LISTENER, Interest::READABLE)
                .map_err(StartError::EventLoop)?;
            Some(listener)
        }
        None => None,
    };
    let file_limit = limits::raise_file_limit();
    let limits = limits::limits(file_limit, config.max_connections, config.admin_connections);
    let counters = Arc::new(NetCounters::default());
    counters.set_limits(&limits);
    counters.file_limit.store(file_limit, Ordering::Relaxed);
    counters
        .idle_timeout_ms
        .store(config.idle_timeout.as_millis() as u64, Ordering::Relaxed);
    counters
        .partial_cap
        .store(config.partial_frame_bytes as u64, Ordering::Relaxed);
    counters
        .output_cap
        .store(config.output_bytes as u64, Ordering::Relaxed);
    let inbox = Arc::new(Inbox::new(Arc::clone(&waker)));
    let workers =
        Arc::new(
            Workers::start(config.workers).map_err(|source| StartError::Thread {
                name: "stela-worker".into(),
                source,
            })?,
        );
    {
        let inbox = Arc::clone(&inbox);
        engine.on_release(Box::new(move |space_freed| {
            if space_freed {
                inbox.post(Event::SpaceFreed);
            } else if inbox.take_pending() {
                inbox.nudge();
            }
        }));
    }
    let cap = engine.dirty_cap().bytes as usize;
    let max_frame = (cap.max(4096) * 2 + (64 << 10)).clamp(1 << 20, stela_proto::MAX_FRAME_BYTES);
    let stop = Arc::new(AtomicBool::new(false));
    let handle = LoopHandle {
        stop: Arc::clone(&stop),
        waker,
        counters: Arc::clone(&counters),
    };
    Ok((
        EventLoop {
            poll,
            engine,
            inbox,
            workers,
            counters,
            stop,
            unix,
            tcp,
            auth,
            conns: Vec::new(),
            free_slots: Vec::new(),
            next_serial: 1,
            limits,
            clients: 0,
            admins: 0,
            handshakes: VecDeque::new(),
            ready: VecDeque::new(),
            throttled: VecDeque::new(),
            parked: Vec::new(),
            rings: Vec::new(),
            orphans: Vec::new(),
            disk_waits: 0,
            held: 0,
            held_cap: config.partial_frame_bytes.max(max_frame),
            output: 0,
            output_cap: config.output_bytes,
            handshake_timeout: config.handshake_timeout,
            frame_timeout: config.frame_timeout,
            spin: config.spin,
            realtime: config.realtime_loop,
            max_frame,
            ring_bytes: config.ring_bytes,
            boards: ring_conn::Boards::default(),
            scratch: vec![0u8; 64 << 10],
            spare_fd: std::fs::File::open("/dev/null").ok(),
            last_accept_error: None,
        },
        handle,
    ))
}

impl EventLoop {
    /// Serves until stopped; then answers what it can and closes every connection.
    pub fn run(mut self) {
        let mut priority = crate::sched::LoopPriority::start(self.realtime);
        self.counters
            .realtime
            .store(priority.realtime(), Ordering::Relaxed);
        let mut events = Events::with_capacity(1024);
        let mut last_activity = Instant::now();
        let mut last_socket_poll = Instant::now();
        let mut last_sweep = Instant::now();
        let mut spin = spin::SpinPolicy::new(self.spin);
        self.counters
            .spins_after_work
            .store(!spin.budget().is_zero(), Ordering::Relaxed);
        // Commits wait for a standby's acknowledgement (as of the end of the last turn).
        let mut standby_owed = false;
        // Since the last work: whether a turn found none, and whether nothing was owed when
        // that work ended (the gaps the spin policy learns from).
        let mut idle_turn = false;
        let mut speculative = false;
        while !self.stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            // While answers are owed the loop polls for them up to the spin limit (a ring
            // waiting for the disk, through the sync: its completion must be published as soon
            // as the flusher settles it); otherwise it spins only while that has paid lately.
            let quiet = now.duration_since(last_activity);
            let realtime = priority.realtime();
            let owed = self.answers_owed(standby_owed);
            let spinning = !self.spin.is_zero()
                && (quiet < spin.budget()
                    || (owed && quiet < self.spin)
                    || (self.disk_waits > 0 && quiet < DISK_SPIN && !realtime));
            let mut sleeping = false;
            let timeout = if spinning {
                if now.duration_since(last_socket_poll) < SOCKET_POLL_EVERY
                    && !self.rings.is_empty()
                {
                    None // rings only this turn
                } else {
                    Some(Some(Duration::ZERO))
                }
            } else if self.prepare_sleep() {
                self.engine.loop_sleeps();
                sleeping = true;
                Some(Some(SWEEP_EVERY))
            } else {
                Some(Some(Duration::ZERO))
            };
            if let Some(timeout) = timeout {
                if let Err(error) = self.poll.poll(&mut events, timeout) {
                    if error.kind() != io::ErrorKind::Interrupted {
                        tracing::error!(%error, "event loop poll failed");
                    }
                }
                last_socket_poll = Instant::now();
            } else {
                events.clear();
            }
            if sleeping {
                self.woke();
            }
            let mut active = false;
            for event in events.iter() {
                active = true;
                match event.token() {
                    WAKER => {}
                    UNIX_LISTENER | TCP_LISTENER => self.accept(event.token()),
                    Token(token) if token >= CONN_BASE => {
                        let slot = (token - CONN_BASE) / 2;
                        let doorbell = (token - CONN_BASE) % 2 == 1;
                        if doorbell {
                            if let Some(Some(conn)) = self.conns.get(slot) {
                                if let Some(ring) = &conn.ring {
                                    ring.drain_doorbell();
                                }
                            }
                        } else {
                            self.on_socket(
                                slot,
                                event.is_readable() || event.is_read_closed(),
                                event.is_read_closed(),
                                event.is_writable(),
                            );
                        }
                    }
                    Token(_) => {}
                }
            }
            active |= self.take_inbox();
            let (scanned, served) = self.scan_rings();
            active |= scanned;
            if priority.served(served.0, served.1, self.disk_waits) {
                self.counters
                    .realtime
                    .store(priority.realtime(), Ordering::Relaxed);
            }
            active |= self.run_ready();
            // Appends of this turn go to the standby now, one send for all of them.
            standby_owed = self.engine.end_turn(spinning);
            if active {
                let now = Instant::now();
                if (idle_turn || sleeping) && speculative {
                    spin.gap(now.duration_since(last_activity), sleeping);
                    self.counters
                        .spins_after_work
                        .store(!spin.budget().is_zero(), Ordering::Relaxed);
                }
                last_activity = now;
                idle_turn = false;
                speculative = !self.answers_owed(standby_owed);
            } else {
                idle_turn = true;
            }
            if last_sweep.elapsed() >= SWEEP_EVERY {
                last_sweep = Instant::now();
                self.sweep();
            }
        }
        self.close_all();
        // The jobs closing connections' logs finish before the daemon reports itself stopped,
        // so every log's files (and directory lock) are released by then.
        self.workers.stop();
    }

    /// Whether answers are owed to commits that wait: for the standby's acknowledgement
    /// (`standby_owed`, as the last turn ended) or for the disk.
    fn answers_owed(&self, standby_owed: bool) -> bool {
        standby_owed || self.disk_waits > 0
    }

    /// Before sleeping: every ring's client must ring the doorbell from now on, and nothing
    /// may be waiting. `false`: something is, poll without sleeping.
    fn prepare_sleep(&mut self) -> bool {
        if !self.inbox.prepare_sleep() {
            return false;
        }
        let mut quiet = true;
        for &slot in &self.rings {
            if let Some(Some(conn)) = self.conns.get(slot) {
                if let Some(ring) = &conn.ring {
                    quiet &= ring.prepare_sleep();
                }
            }
        }
        if !quiet {
            self.woke();
        }
        quiet
    }

    fn woke(&mut self) {
        self.inbox.woke();
        for &slot in &self.rings {
            if let Some(Some(conn)) = self.conns.get(slot) {
                if let Some(ring) = &conn.ring {
                    ring.woke();
                }
            }
        }
    }

    fn accept(&mut self, listener: Token) {
        loop {
            let accepted = if listener == UNIX_LISTENER {
                self.unix.accept().map(|(s, _)| Stream::Unix(s))
            } else {
                match &self.tcp {
                    Some(tcp) => tcp.accept().map(|(s, _)| {
                        let _ = s.set_nodelay(true);
                        s
                    }),
                    None => return,
                }
                .and_then(|s| self.secure(s))
            };
            match accepted {
                Ok(stream) => self.add_conn(stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_out_of_descriptors(&e) => {
                    self.out_of_descriptors(listener, &e);
                    return;
                }
                Err(error) => {
                    self.log_accept_error(&error);
                    return;
                }
            }
        }
    }

    /// A TCP connection as the listener serves it: under TLS unless insecure.
    fn secure(&self, tcp: mio::net::TcpStream) -> io::Result<Stream> {
        let Some(config) = self.auth.tls() else {
            return Ok(Stream::Tcp(tcp));
        };
        let tls =
            stela_net::tls::rustls::ServerConnection::new(config).map_err(io::Error::other)?;
        Ok(Stream::Tls(Box::new(TlsStream::new(tcp, tls))))
    }

    /// The process has no descriptor left: free the spare one, accept one connection to tell it
    /// why, close it, and take the spare back. The error is logged (at most once a second).
    fn out_of_descriptors(&mut self, listener: Token, error: &io::Error) {
        self.log_accept_error(error);
        drop(self.spare_fd.take());
        let refused = if listener == UNIX_LISTENER {
            self.unix.accept().ok().map(|(s, _)| Stream::Unix(s))
        } else {
            self.tcp
                .as_ref()
                .and_then(|t| t.accept().ok().map(|(s, _)| Stream::Tcp(s)))
        };
        if let Some(stream) = refused {
            self.refuse_now(stream, "the daemon has no file descriptor left");
        }
        self.spare_fd = std::fs::File::open("/dev/null").ok();
    }

    fn log_accept_error(&mut self, error: &io::Error) {
        let now = Instant::now();
        if self
            .last_accept_error
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
        {
            self.last_accept_error = Some(now);
            tracing::error!(%error, connections = self.clients + self.admins, "accepting a connection failed");
        }
    }

    /// Tells a connection it is refused and closes it, without keeping it.
    fn refuse_now(&mut self, stream: Stream, why: &str) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        let mut conn = Conn::new(0, stream);
        conn.refuse(ErrorCode::TooManyConnections, why.to_owned());
        let _ = conn.flush();
        tracing::warn!(peer = %conn.peer, why, "connection refused");
    }

    fn add_conn(&mut self, stream: Stream) {
        let conns = &self.conns;
        self.handshakes.retain(|c| {
            conns
                .get(c.slot)
                .and_then(Option::as_ref)
                .is_some_and(|conn| conn.serial == c.serial && conn.phase == Phase::Handshake)
        });
        // One address may not hold more than its share of the handshake slots: one of its own
        // makes room. Then, while the slots are full, one of anybody's. Either way the oldest
        // that has sent nothing goes first (or, when every one has spoken, the oldest).
        let ip = stream.peer_ip();
        if ip.is_some()
            && self.handshakes_from(ip).count()
                >= self.limits.handshakes / HANDSHAKE_SHARE_PER_ADDRESS
        {
            let from_ip: Vec<ConnRef> = self.handshakes_from(ip).collect();
            let evicted = self.oldest_handshake(&from_ip);
            self.evict_handshake(
                evicted,
                "newer connections from the same address need the handshake slot",
            );
        }
        while self.handshakes.len() >= self.limits.handshakes {
            let all: Vec<ConnRef> = self.handshakes.iter().copied().collect();
            let Some(evicted) = self.oldest_handshake(&all) else {
                break;
            };
            self.evict_handshake(Some(evicted), "newer connections need the handshake slot");
        }
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        let serial = self.next_serial;
        self.next_serial += 1;
        let mut conn = Conn::new(serial, stream);
        if let Err(error) = self.poll.registry().register(
            conn.stream.source(),
            Token(CONN_BASE + 2 * slot),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::error!(%error, peer = %conn.peer, "registering a connection failed");
            self.free_slots.push(slot);
            return;
        }
        // At debug until its Hello says what it is: a client is logged at info once admitted,
        // an administrator's probe (`stela status` every few seconds) stays at debug.
        tracing::debug!(peer = %conn.peer, "connection opened");
        self.conns[slot] = Some(conn);
        self.handshakes.push_back(ConnRef { slot, serial });
        self.counters.connections.fetch_add(1, Ordering::Relaxed);
        self.ready.push_back(slot);
    }

    /// The connections in their handshake from `ip` (TCP), oldest first.
    fn handshakes_from(&self, ip: Option<std::net::IpAddr>) -> impl Iterator<Item = ConnRef> + '_ {
        self.handshakes.iter().copied().filter(move |c| {
            self.conns[c.slot]
                .as_ref()
                .is_some_and(|conn| conn.peer_ip == ip)
        })
    }

    /// Of `candidates` (oldest first), the oldest that has sent nothing, else the oldest.
    fn oldest_handshake(&mut self, candidates: &[ConnRef]) -> Option<ConnRef> {
        let first = *candidates.first()?;
        let silent = candidates.iter().copied().find(|c| {
            self.conns[c.slot]
                .as_mut()
                .is_some_and(|conn| !conn.has_spoken())
        });
        Some(silent.unwrap_or(first))
    }

    /// Closes a connection still in its handshake to make room for a newer one.
    fn evict_handshake(&mut self, victim: Option<ConnRef>, why: &str) {
        let Some(victim) = victim else { return };
        self.handshakes.retain(|&c| c != victim);
        if let Some(conn) = self.conn_mut(victim.slot) {
            debug_assert_eq!(conn.phase, Phase::Handshake);
            conn.refuse(ErrorCode::Timeout, format!("no Hello, and {why}"));
        }
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        self.flush(victim.slot);
        self.close(victim.slot);
    }

    fn is_current(&self, conn: ConnRef) -> bool {
        matches!(self.conns.get(conn.slot), Some(Some(c)) if c.serial == conn.serial)
    }

    fn conn_mut(&mut self, slot: usize) -> Option<&mut Conn> {
        self.conns.get_mut(slot).and_then(Option::as_mut)
    }

    fn on_socket(&mut self, slot: usize, readable: bool, read_closed: bool, writable: bool) {
        if writable {
            self.flush(slot);
        }
        if read_closed && self.throttled.contains(&slot) {
            // The peer stopped sending while held back with an unfinished frame: that frame
            // can never be handled, and its bytes must not stay counted against the others.
            if let Some(conn) = self.conn_mut(slot) {
                let held = conn.held_bytes();
                tracing::info!(peer = %conn.peer, held, "closing a connection that ended inside a frame while held back");
            }
            self.close(slot);
            return;
        }
        if readable {
            self.read(slot);
        }
    }

    /// How many bytes connection `conn` may read now. Below the cap on held bytes, up to the
    /// read budget within the room left; at the cap, only a connection holding less than
    /// [`SMALL_FRAME_RESERVE`] may read, up to it, so one connection's unfinished frames never
    /// stop the others' small requests. Before its Hello, no more than one Hello frame.
    fn read_allowance(&self, conn: &Conn) -> usize {
        let own = conn.held_bytes();
        let allowance = if self.held < self.held_cap {
            READ_BUDGET.min(self.held_cap - self.held)
        } else {
            SMALL_FRAME_RESERVE.saturating_sub(own)
        };
        match conn.phase {
            Phase::Handshake => allowance.min(HANDSHAKE_HOLD.saturating_sub(own)),
            _ => allowance,
        }
    }

    /// Reads what a connection sent, within what [`EventLoop::read_allowance`] allows.
    fn read(&mut self, slot: usize) {
        let mut scratch = std::mem::take(&mut self.scratch);
        let Some(conn) = self.conns.get(slot).and_then(Option::as_ref) else {
            self.scratch = scratch;
            return;
        };
        let allowance = self.read_allowance(conn);
        let conn = self.conns[slot].as_mut().expect("present");
        if conn.peer_closed {
            self.scratch = scratch;
            return;
        }
        if conn.waiting.is_some() || conn.phase == Phase::Closing {
            conn.unread = true; // read once the connection can go on
            self.scratch = scratch;
            return;
        }
        if allowance == 0 {
            conn.unread = true;
            if !self.throttled.contains(&slot) {
                self.throttled.push_back(slot);
            }
            self.scratch = scratch;
            return;
        }
        let result = conn.read_some(&mut scratch, allowance);
        self.scratch = scratch;
        match result {
            Ok(n) => {
                self.held += n;
                // Stopped at the allowance: the rest waits until handled bytes make room (or,
                // at the read budget, `step` reads on once these bytes are handled).
                if n == allowance && !self.throttled.contains(&slot) {
                    self.throttled.push_back(slot);
                }
                self.ready.push_back(slot);
            }
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                // The peer closed its end (perhaps only for writing): what it sent is still
                // answered, then the connection closes.
                if let Some(conn) = self.conn_mut(slot) {
                    conn.peer_closed = true;
                }
                self.ready.push_back(slot);
            }
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                if let Some(conn) = self.conn_mut(slot) {
                    tracing::warn!(peer = %conn.peer, %error, "connection refused: TLS handshake failed");
                }
                self.count_refused_login();
                self.close(slot);
            }
            Err(error) => {
                tracing::debug!(%error, "connection failed");
                self.close(slot);
            }
        }
    }

    fn count_refused_login(&self) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        self.counters.refused_logins.fetch_add(1, Ordering::Relaxed);
    }

    fn flush(&mut self, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let before = conn.output_charge();
        let flushed = conn.flush();
        self.output -= before.saturating_sub(conn.output_charge()).min(self.output);
        match flushed {
            Ok(true) if conn.phase == Phase::Closing => self.close(slot),
            Ok(true) if conn.output_full => {
                // A pipelining client's requests waited for its answers to go out.
                conn.output_full = false;
                self.ready.push_back(slot);
            }
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(%error, "writing to a connection failed");
                self.close(slot);
            }
        }
    }

    /// Handles the requests of the connections that have some, and sends their answers.
    fn run_ready(&mut self) -> bool {
        let mut any = false;
        // Held-back connections get their turn once bytes are handled.
        if self.held < self.held_cap {
            while let Some(slot) = self.throttled.pop_front() {
                self.ready.push_back(slot);
            }
        }
        // Only those ready now: a connection that keeps sending must not starve the rest.
        for _ in 0..self.ready.len() {
            let Some(slot) = self.ready.pop_front() else {
                break;
            };
            any = true;
            self.step(slot);
        }
        any
    }

    fn step(&mut self, slot: usize) {
        let stats = self.counters.snapshot();
        let output_at_cap = self.output >= self.output_cap;
        let (engine, inbox, workers) = (
            Arc::clone(&self.engine),
            Arc::clone(&self.inbox),
            Arc::clone(&self.workers),
        );
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let ctx = Ctx {
            engine: &engine,
            inbox: &inbox,
            workers: &workers,
            me: ConnRef {
                slot,
                serial: conn.serial,
            },
            max_frame: self.max_frame,
            read_answer_bytes: if output_at_cap {
                OUTPUT_RESERVE
            } else {
                READ_ANSWER_BYTES
            },
            output_at_cap,
            ring_bytes: self.ring_bytes,
            net: &stats,
            boards: &self.boards,
        };
        let (held_before, output_before) = (conn.held_bytes(), conn.output_charge());
        let progress = conn.process(&ctx);
        let held_after = conn.held_bytes();
        self.output = (self.output + conn.output_charge()).saturating_sub(output_before);
        let had_ring = conn.ring.is_some();
        let unread = conn.unread && conn.waiting.is_none();
        self.held = (self.held + held_after).saturating_sub(held_before);
        match progress {
            Progress::Hello(id, role, token) => self.hello(slot, id, role, token),
            Progress::Waiting => {
                if matches!(
                    self.conns[slot].as_ref().and_then(|c| c.waiting.as_ref()),
                    Some(Waiting::Space { .. })
                ) {
                    self.parked.push(slot);
                }
            }
            Progress::Idle | Progress::Close => {}
        }
        if had_ring && !self.rings.contains(&slot) {
            self.rings.push(slot);
            self.register_doorbell(slot);
        }
        self.flush(slot);
        if unread {
            self.read(slot);
        }
    }

    fn hello(&mut self, slot: usize, id: u64, role: Role, token: Option<String>) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if !conn.stream.is_unix() {
            let tls = match &conn.stream {
                Stream::Tls(s) => Some(s.connection()),
                _ => None,
            };
            match self.auth.identify(tls, token.as_deref()) {
                Ok(identity) => {
                    conn.identity = identity;
                    conn.credential = (!identity.may_administer())
                        .then(|| auth::credential(tls, token.as_deref()));
                    tracing::info!(peer = %conn.peer, identity = identity.name(), "TCP client authenticated");
                }
                Err(why) => {
                    tracing::warn!(peer = %conn.peer, why, "connection refused: not authenticated");
                    conn.refuse(
                        ErrorCode::Unauthenticated,
                        format!("not authenticated: {why}"),
                    );
                    self.count_refused_login();
                    return;
                }
            }
        }
        // The reserve for administrators is theirs only: a TCP client asking for it counts as
        // a client.
        let role = match (role, conn.identity) {
            (Role::Admin, Identity::Client) => Role::Client,
            (role, _) => role,
        };
        let (clients, admins) = (
            self.counters.max_connections.load(Ordering::Relaxed) as usize,
            self.counters.admin_connections.load(Ordering::Relaxed) as usize,
        );
        let admitted = match role {
            Role::Client => self.clients < clients,
            Role::Admin => self.admins < admins || self.clients < clients,
        };
        let Some(conn) = self.conn_mut(slot) else {
            return;
        };
        if !admitted {
            let peer = conn.peer.clone();
            conn.refuse(
                ErrorCode::TooManyConnections,
                format!(
                    "the daemon serves at most {clients} connections (and {admins} administrators); try again later"
                ),
            );
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, ?role, "connection refused: at the limit");
            return;
        }
        match role {
            Role::Client => tracing::info!(peer = %conn.peer, "connection accepted"),
            Role::Admin => tracing::debug!(peer = %conn.peer, "administrator connection accepted"),
        }
        conn.admit(id, role);
        match role {
            Role::Client => self.clients += 1,
            Role::Admin => self.admins += 1,
        }
        // More requests may be buffered behind the Hello.
        self.ready.push_back(slot);
    }

    fn register_doorbell(&mut self, slot: usize) {
        let Some(Some(conn)) = self.conns.get(slot) else {
            return;
        };
        let Some(ring) = &conn.ring else { return };
        let fd = ring.doorbell_fd().as_raw_fd();
        let mut source = mio::unix::SourceFd(&fd);
        if let Err(error) = self.poll.registry().register(
            &mut source,
            Token(CONN_BASE + 2 * slot + 1),
            Interest::READABLE,
        ) {
            tracing::error!(%error, "registering a ring's doorbell failed");
        }
        self.counters.rings.fetch_add(1, Ordering::Relaxed);
    }

    /// Answers that arrived (disk waits, worker jobs) and freed space.
    fn take_inbox(&mut self) -> bool {
        let events = self.inbox.take();
        let any = !events.is_empty();
        // The clients answered here that sleep on a board are woken together, one call per
        // board word, when this is dropped (at the end of this function).
        let mut board_wakes = WakeBatch::default();
        for event in events {
            match event {
                Event::RingDone(done) => {
                    let (completer, seq, log, result) = *done;
                    let result = result.map_err(|e| self.engine.log_error(log, e));
                    let result = result.as_ref().map(|r| *r);
                    ring::complete(&completer, seq, result, &mut board_wakes);
                }
                Event::SpaceFreed => {
                    for slot in std::mem::take(&mut self.parked) {
                        self.ready.push_back(slot);
                    }
                    for &slot in &self.rings {
                        if let Some(Some(conn)) = self.conns.get_mut(slot) {
                            if let Some(ring) = &mut conn.ring {
                                ring.unpark();
                            }
                        }
                    }
                }
                Event::Answer(answer) => {
                    let Answer {
                        conn,
                        id,
                        result,
                        effect,
                    } = *answer;
                    if !self.is_current(conn) {
                        // The connection is gone: give back what the request took for it, and
                        // the handles it held while the request was out.
                        let mut handles = Vec::new();
                        if let Effect::Opened(opened) = effect {
                            handles.push(opened.log);
                        }
                        if let Some(at) = self.orphans.iter().position(|(c, _)| *c == conn) {
                            handles.extend(self.orphans.swap_remove(at).1);
                        }
                        self.release(handles);
                        continue;
                    }
                    let c = self.conns[conn.slot].as_mut().expect("current");
                    let result = match (result, effect) {
                        (
                            Ok(ResponseBody::Opened {
                                positions,
                                max_record_bytes,
                                term,
                                ..
                            }),
                            Effect::Opened(opened),
                        ) => {
                            let handle = c.add_handle(opened.log);
                            Ok(ResponseBody::Opened {
                                handle,
                                positions,
                                max_record_bytes,
                                term,
                            })
                        }
                        (result, _) => result,
                    };
                    let before = c.output_charge();
                    c.finish(id, result);
                    self.output = (self.output + c.output_charge()).saturating_sub(before);
                    self.ready.push_back(conn.slot);
                }
            }
        }
        any
    }

    /// Copies entries out of every ring that has some; says whether it did anything, and how
    /// many entries were answered at once and how many went to wait (for the disk or a
    /// standby).
    fn scan_rings(&mut self) -> (bool, (u64, u64)) {
        let mut any = false;
        let mut served = (0, 0);
        let mut faulted = Vec::new();
        self.disk_waits = 0;
        for index in 0..self.rings.len() {
            let slot = self.rings[index];
            let Some(Some(conn)) = self.conns.get_mut(slot) else {
                continue;
            };
            let Some(ring) = &mut conn.ring else { continue };
            let stepped = ring.step_counted(&self.engine, &self.inbox, &conn.handles);
            self.disk_waits += usize::from(ring.awaits_disk());
            match stepped {
                Ok((did, (at_once, waited))) => {
                    any |= did;
                    served = (served.0 + at_once, served.1 + waited);
                }
                Err(fault) => {
                    tracing::warn!(peer = %conn.peer, %fault, "bad entry in a shared-memory ring; closing the connection");
                    conn.refuse(ErrorCode::BadFrame, format!("shared-memory ring: {fault}"));
                    faulted.push(slot);
                }
            }
        }
        for slot in faulted {
            self.flush(slot);
            self.close(slot);
        }
        (any, served)
    }

    /// Deadlines: handshakes and idle connections; parked appends are retried as a safety net.
    fn sweep(&mut self) {
        let now = Instant::now();
        let idle_timeout =
            Duration::from_millis(self.counters.idle_timeout_ms.load(Ordering::Relaxed));
        let mut expired = Vec::new();
        for (slot, conn) in self.conns.iter().enumerate() {
            let Some(conn) = conn else { continue };
            // A frame begun and not finished, while nothing on our side holds the connection
            // back but the cap (its peer may be slow, or hold bytes to starve the others).
            let stalled_frame = conn.waiting.is_none()
                && !conn.output_full
                && conn
                    .partial_since
                    .is_some_and(|since| now.duration_since(since) >= self.frame_timeout);
            let late = stalled_frame
                || match conn.phase {
                    Phase::Handshake => {
                        now.duration_since(conn.accepted_at) >= self.handshake_timeout
                    }
                    Phase::Ready(_) => {
                        !idle_timeout.is_zero()
                            && conn.waiting.is_none()
                            && conn.ring.as_ref().is_none_or(|r| r.idle())
                            && now.duration_since(conn.last_request) >= idle_timeout
                    }
                    Phase::Closing => false,
                };
            if late {
                expired.push(slot);
            }
        }
        for slot in expired {
            let Some(conn) = self.conn_mut(slot) else {
                continue;
            };
            let stalled_frame = conn.partial_since.is_some();
            let why = if stalled_frame {
                "a frame did not arrive whole within the frame timeout"
            } else if conn.phase == Phase::Handshake {
                "no Hello within the handshake timeout"
            } else {
                "idle for longer than the idle timeout"
            };
            tracing::debug!(peer = %conn.peer, why, "closing a connection");
            conn.refuse(ErrorCode::Timeout, why.into());
            self.flush(slot);
            self.close(slot);
        }
        for slot in std::mem::take(&mut self.parked) {
            self.ready.push_back(slot);
        }
        for &slot in &self.rings {
            if let Some(Some(conn)) = self.conns.get_mut(slot) {
                if let Some(ring) = &mut conn.ring {
                    ring.unpark();
                }
            }
        }
        self.counters
            .partial_bytes
            .store(self.held as u64, Ordering::Relaxed);
        self.counters
            .output_bytes
            .store(self.output as u64, Ordering::Relaxed);
    }

    /// Closes a connection: its handles are given back (on a worker: closing a log writes it).
    fn close(&mut self, slot: usize) {
        let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        conn.stream.close_notify();
        let _ = self.poll.registry().deregister(conn.stream.source());
        if let Some(ring) = &conn.ring {
            let fd = ring.doorbell_fd().as_raw_fd();
            let _ = self
                .poll
                .registry()
                .deregister(&mut mio::unix::SourceFd(&fd));
            self.counters.rings.fetch_sub(1, Ordering::Relaxed);
            self.rings.retain(|&s| s != slot);
        }
        self.held -= conn.held_bytes().min(self.held);
        self.output -= conn.output_charge().min(self.output);
        match conn.admitted {
            Some(Role::Client) => self.clients -= 1,
            Some(Role::Admin) => self.admins -= 1,
            None => {}
        }
        self.counters.connections.fetch_sub(1, Ordering::Relaxed);
        let handles: Vec<_> = conn.handles.drain(..).flatten().collect();
        if matches!(conn.waiting, Some(Waiting::Answer)) {
            let me = ConnRef {
                slot,
                serial: conn.serial,
            };
            self.orphans.push((me, handles));
        } else {
            self.release(handles);
        }
        if conn.admitted == Some(Role::Client) {
            tracing::info!(peer = %conn.peer, "connection closed");
        } else {
            tracing::debug!(peer = %conn.peer, "connection closed");
        }
        self.free_slots.push(slot);
    }

    /// Gives back log handles (on a worker: closing a log writes it out).
    fn release(&self, handles: Vec<crate::pool::LogId>) {
        for log in handles {
            let engine = Arc::clone(&self.engine);
            self.workers.submit(Box::new(move || engine.release(log)));
        }
    }

    fn close_all(&mut self) {
        let _ = self.take_inbox();
        for slot in 0..self.conns.len() {
            if let Some(conn) = self.conn_mut(slot) {
                let _ = conn.flush();
            }
            self.close(slot);
        }
    }
}

fn is_out_of_descriptors(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE)
    )
}

/// Sends `bytes` with `fds` attached (SCM_RIGHTS). `None`: the socket is full, try again.
pub(crate) fn send_with_fds(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[OwnedFd],
) -> io::Result<Option<usize>> {
    use std::os::fd::AsFd;
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|fd| fd.as_fd()).collect();
    match stela_net::shm::send_with_fds(socket, bytes, &borrowed) {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}
