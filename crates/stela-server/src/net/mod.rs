//! The daemon's connections, served by one event loop thread without a thread per connection.
//!
//! The loop (mio) accepts on the Unix socket, takes TCP connections (if configured) from the
//! [`gate`] once they have sent their Hello (a thread of its own accepts them, runs their TLS
//! handshake and reads their first frame, so that a flood of connection attempts costs the loop
//! nothing), reads each connection's
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
//! Security ([`auth`]): TCP connections run TLS (rustls, driven without blocking, by the gate
//! and then by the loop: a TLS connection costs no thread of its own), unless the listener is an explicit insecure loopback
//! one. A peer that fails the TLS handshake or does not authenticate at its Hello is refused,
//! logged with its address and counted in [`NetCounters::refused_logins`]. Administrative
//! requests are refused to TCP peers not authenticated as administrators.
//!
//! Files: this one owns the loop itself (its state, its setup, the pacing of a turn: spin,
//! poll or sleep); [`admission`] who gets and keeps a connection slot; [`serve`] a
//! connection's turn (read, handle, write, the inbox, the rings); [`closing`] deadlines and
//! closing; [`stream`] the socket under non-blocking TLS; [`conn`] one connection's requests;
//! [`trim`] when freed connection buffers are given back to the system.

mod admission;
pub(crate) mod auth;
mod closing;
pub(crate) mod conn;
mod gate;
pub(crate) mod inbox;
pub mod limits;
pub(crate) mod ring;
mod ring_conn;
mod serve;
mod spin;
mod stream;
mod trim;

use crate::config::DaemonConfig;
use crate::engine::{Engine, NetStats};
use crate::error::StartError;
use crate::workers::Workers;
use auth::Auth;
use conn::Conn;
use inbox::{ConnRef, Event, Inbox};
use mio::{Events, Interest, Poll, Token};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAKER: Token = Token(0);
const UNIX_LISTENER: Token = Token(1);
/// Connection `slot` has token `CONN_BASE + 2 * slot`, its ring's doorbell the next one.
const CONN_BASE: usize = 16;

/// Connections accepted on the Unix socket in one turn at most (the TCP gate's rule, for the
/// loop): past it, the loop serves the connections it has before it accepts more.
const UNIX_ACCEPTS_PER_TURN: usize = 64;
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
    /// Accepting on it stopped at [`UNIX_ACCEPTS_PER_TURN`]: more may wait in the kernel's
    /// queue, so the loop accepts again next turn and does not sleep.
    unix_backlog: bool,
    /// The thread that accepts TCP connections and takes them through their handshake.
    gate: Option<gate::GateHandle>,
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
    /// When to give the buffers closed connections freed back to the system, and how.
    trim: trim::TrimPolicy,
    release_memory: fn(),
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
    let unix = register_unix(&poll, unix).map_err(StartError::EventLoop)?;
    let (counters, mut limits) = start_counters(config);
    let inbox = Arc::new(Inbox::new(Arc::clone(&waker)));
    // With TCP, the handshake slots the file limit was budgeted for are shared: half in the
    // gate (TCP), half in the loop (the Unix socket, and TCP arrivals about to be admitted).
    let gate_slots = if tcp.is_some() {
        limits.handshakes / 2
    } else {
        0
    };
    limits.handshakes -= gate_slots;
    let gate = match tcp {
        Some(listener) => Some(
            gate::start(
                listener,
                Arc::clone(&auth),
                Arc::clone(&inbox),
                Arc::clone(&counters),
                gate_slots,
                config.handshake_timeout,
            )
            .map_err(|source| StartError::Thread {
                name: "stela-gate".into(),
                source,
            })?,
        ),
        None => None,
    };
    let workers =
        Arc::new(
            Workers::start(config.workers).map_err(|source| StartError::Thread {
                name: "stela-worker".into(),
                source,
            })?,
        );
    answer_releases(&engine, &inbox);
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
            unix_backlog: false,
            gate,
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
            trim: trim::TrimPolicy::new(),
            release_memory: config.release_memory.unwrap_or(trim::release_free_memory),
        },
        handle,
    ))
}

/// Makes the Unix listener non-blocking and registers it with the loop's poll.
fn register_unix(
    poll: &Poll,
    unix: std::os::unix::net::UnixListener,
) -> io::Result<mio::net::UnixListener> {
    unix.set_nonblocking(true)?;
    let mut unix = mio::net::UnixListener::from_std(unix);
    poll.registry()
        .register(&mut unix, UNIX_LISTENER, Interest::READABLE)?;
    Ok(unix)
}

/// Raises the file limit, derives the connection limits under it, and starts the counters a
/// reload changes with the configured limits, timeouts and caps.
fn start_counters(config: &DaemonConfig) -> (Arc<NetCounters>, limits::Limits) {
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
    (counters, limits)
}

/// When the engine releases buffers, the loop hears of it: freed space wakes the parked
/// appends; otherwise a pending inbox is nudged.
fn answer_releases(engine: &Engine, inbox: &Arc<Inbox>) {
    let inbox = Arc::clone(inbox);
    engine.on_release(Box::new(move |space_freed| {
        if space_freed {
            inbox.post(Event::SpaceFreed);
        } else if inbox.take_pending() {
            inbox.nudge();
        }
    }));
}

/// What the loop's pacing remembers from turn to turn: when work was last seen, when the
/// sockets and the deadlines were last looked at, and what the spin policy learns from.
struct Pace {
    spin: spin::SpinPolicy,
    last_activity: Instant,
    last_socket_poll: Instant,
    last_sweep: Instant,
    /// Commits wait for a standby's acknowledgement (as of the end of the last turn).
    standby_owed: bool,
    /// Since the last work: whether a turn found none, and whether nothing was owed when that
    /// work ended (the gaps the spin policy learns from).
    idle_turn: bool,
    speculative: bool,
    /// Whether more threads are runnable than there are CPUs (the loop then sleeps rather
    /// than spin: `spin::Crowding`).
    crowding: spin::Crowding,
}

impl EventLoop {
    /// Serves until stopped; then answers what it can and closes every connection.
    pub fn run(mut self) {
        let mut priority = crate::sched::LoopPriority::start(self.realtime);
        self.counters
            .realtime
            .store(priority.realtime(), Ordering::Relaxed);
        let mut events = Events::with_capacity(1024);
        let now = Instant::now();
        let mut pace = Pace {
            spin: spin::SpinPolicy::new(self.spin),
            last_activity: now,
            last_socket_poll: now,
            last_sweep: now,
            standby_owed: false,
            idle_turn: false,
            speculative: false,
            crowding: spin::Crowding::new(),
        };
        self.counters
            .spins_after_work
            .store(!pace.spin.budget().is_zero(), Ordering::Relaxed);
        while !self.stop.load(Ordering::SeqCst) {
            let (spinning, sleeping) = self.wait(&mut events, &mut pace, priority.realtime());
            let mut active = self.dispatch(&events);
            if self.unix_backlog {
                self.accept();
                active = true;
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
            pace.standby_owed = self.engine.end_turn(spinning);
            self.learn(&mut pace, active, sleeping);
            if pace.last_sweep.elapsed() >= SWEEP_EVERY {
                pace.last_sweep = Instant::now();
                self.sweep();
            }
        }
        if let Some(gate) = self.gate.take() {
            gate.stop();
        }
        self.close_all();
        // The jobs closing connections' logs finish before the daemon reports itself stopped,
        // so every log's files (and directory lock) are released by then.
        self.workers.stop();
    }

    /// One turn's wait for events. While answers are owed the loop polls for them up to the
    /// spin limit (a ring waiting for the disk, through the sync: its completion must be
    /// published as soon as the flusher settles it); otherwise it spins only while that has
    /// paid lately, and else sleeps in `epoll_wait` up to [`SWEEP_EVERY`]. Returns whether it
    /// spins and whether it slept.
    fn wait(&mut self, events: &mut Events, pace: &mut Pace, realtime: bool) -> (bool, bool) {
        let now = Instant::now();
        let quiet = now.duration_since(pace.last_activity);
        // A standby's acknowledgement owed is polled for even on a crowded machine (see
        // `spin::spins_for_standby`); the disk's, and speculative spins, only while it is not.
        let spinning = !self.spin.is_zero()
            && (spin::spins_for_standby(pace.standby_owed, quiet, self.spin)
                || (!pace.crowding.crowded(now)
                    && (quiet < pace.spin.budget()
                        || (self.disk_waits > 0 && quiet < self.spin)
                        || (self.disk_waits > 0 && quiet < DISK_SPIN && !realtime))));
        let mut sleeping = false;
        let timeout = if spinning {
            if now.duration_since(pace.last_socket_poll) < SOCKET_POLL_EVERY
                && !self.rings.is_empty()
            {
                None // rings only this turn
            } else {
                Some(Some(Duration::ZERO))
            }
        } else if !self.unix_backlog && self.prepare_sleep() {
            self.engine.loop_sleeps();
            sleeping = true;
            Some(Some(SWEEP_EVERY))
        } else {
            Some(Some(Duration::ZERO))
        };
        if let Some(timeout) = timeout {
            if let Err(error) = self.poll.poll(events, timeout) {
                if error.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(%error, "event loop poll failed");
                }
            }
            pace.last_socket_poll = Instant::now();
        } else {
            events.clear();
        }
        if sleeping {
            self.woke();
        }
        (spinning, sleeping)
    }

    /// Hands each event to what it concerns: a listener, a connection's socket, a ring's
    /// doorbell. Returns whether there was any.
    fn dispatch(&mut self, events: &Events) -> bool {
        let mut active = false;
        for event in events.iter() {
            active = true;
            match event.token() {
                WAKER => {}
                // Accepted once a turn, after the events (see `accept`).
                UNIX_LISTENER => self.unix_backlog = true,
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
        active
    }

    /// After a turn: a turn with work after a gap teaches the spin policy how long the gap
    /// was (only when nothing was owed as the work before it ended).
    fn learn(&self, pace: &mut Pace, active: bool, sleeping: bool) {
        if !active {
            pace.idle_turn = true;
            return;
        }
        let now = Instant::now();
        if (pace.idle_turn || sleeping) && pace.speculative {
            pace.spin
                .gap(now.duration_since(pace.last_activity), sleeping);
            self.counters
                .spins_after_work
                .store(!pace.spin.budget().is_zero(), Ordering::Relaxed);
        }
        pace.last_activity = now;
        pace.idle_turn = false;
        pace.speculative = !self.answers_owed(pace.standby_owed);
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

    fn is_current(&self, conn: ConnRef) -> bool {
        matches!(self.conns.get(conn.slot), Some(Some(c)) if c.serial == conn.serial)
    }

    fn conn_mut(&mut self, slot: usize) -> Option<&mut Conn> {
        self.conns.get_mut(slot).and_then(Option::as_mut)
    }
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
