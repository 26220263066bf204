//! The TCP door, on a thread of its own (`stela-gate`): accepting TCP connections, their TLS
//! handshake, and the bytes of their first frame (the Hello). Only a connection whose first
//! frame has arrived (or whose header already announces more than a Hello may be) is handed to
//! the event loop, through its inbox; the loop then authenticates the Hello and admits it.
//!
//! Why a thread: a flood of connection attempts made the loop spend its turns accepting,
//! setting up TLS and evicting silent sockets (issue 54: `stela status` p99 111 ms, max 450 ms,
//! and honest commits 0.67x during such a flood). Here a flood costs this thread's time, at a
//! lower CPU priority than the loop's, and none of the loop's: the Unix socket (where `stela
//! status` and local clients come) and admitted connections are served as if nothing happened.
//! Past what this thread keeps up with, the kernel's accept queue fills and connecting slows
//! down for everybody on TCP, which is where an attack's cost belongs.
//!
//! Invariants: the table of connections in their handshake never holds more than
//! `limits.pending`, nor more than `limits.per_address` from one address; a newcomer is never
//! refused for room: the oldest silent connection (of its address, then of all) is closed for
//! it ([`stela_coord::gate::make_room`], the witness's rule); each connection is held here at
//! most the handshake timeout and with at most one Hello frame's bytes; every connection is
//! either in the table, handed to the loop, or closed (never leaked, never both).

use super::auth::Auth;
use super::inbox::{Arrival, Event, Inbox};
use super::stream::{Stream, TlsStream};
use super::{NetCounters, HANDSHAKE_HOLD};
use mio::{Events, Interest, Poll, Token};
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_coord::gate::{make_room, Limits, Waiting};
use stela_proto::frame::FRAME_HEADER_BYTES;
use stela_proto::{ErrorCode, Response, ResponseBody, MAX_HELLO_FRAME_BYTES};

const WAKER: Token = Token(0);
const LISTENER: Token = Token(1);
const FIRST_SLOT: usize = 2;
/// Connections accepted at most before the table's sockets are read again: the handshakes in
/// progress (a real login's TLS among them) are not starved by a flood of new ones.
const ACCEPTS_PER_ROUND: usize = 64;
/// How often handshake deadlines are checked.
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// The gate's niceness: under a shortage of CPU the event loop (admitted clients, the Unix
/// socket) goes first, and a flood slows down the door, not the house.
const NICENESS: i32 = 5;

/// A connection in its handshake.
struct Pending {
    stream: Stream,
    first: Vec<u8>,
    ip: IpAddr,
    accepted_at: Instant,
}

/// What the server keeps of the gate to stop it.
pub(crate) struct GateHandle {
    stop: Arc<AtomicBool>,
    waker: Arc<mio::Waker>,
    thread: std::thread::JoinHandle<()>,
}

impl GateHandle {
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        let _ = self.thread.join();
    }
}

pub(crate) struct Gate {
    poll: Poll,
    listener: mio::net::TcpListener,
    auth: Arc<Auth>,
    inbox: Arc<Inbox>,
    counters: Arc<NetCounters>,
    stop: Arc<AtomicBool>,
    limits: Limits,
    handshake_timeout: Duration,
    table: Vec<Option<Pending>>,
    free: Vec<usize>,
    /// Accepting stopped at [`ACCEPTS_PER_ROUND`]: more may wait in the kernel's queue (the
    /// listener is edge-triggered, so no new event would say so).
    backlog: bool,
    spare_fd: Option<std::fs::File>,
    last_accept_error: Option<Instant>,
    scratch: Vec<u8>,
}

/// Starts the gate on `listener`; arrivals are posted to `inbox`.
pub(crate) fn start(
    listener: std::net::TcpListener,
    auth: Arc<Auth>,
    inbox: Arc<Inbox>,
    counters: Arc<NetCounters>,
    handshakes: usize,
    handshake_timeout: Duration,
) -> io::Result<GateHandle> {
    let poll = Poll::new()?;
    let waker = Arc::new(mio::Waker::new(poll.registry(), WAKER)?);
    listener.set_nonblocking(true)?;
    let mut listener = mio::net::TcpListener::from_std(listener);
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let stop = Arc::new(AtomicBool::new(false));
    let gate = Gate {
        poll,
        listener,
        auth,
        inbox,
        counters,
        stop: Arc::clone(&stop),
        limits: Limits {
            pending: handshakes,
            per_address: (handshakes / super::HANDSHAKE_SHARE_PER_ADDRESS).max(1),
            sessions: usize::MAX,
        },
        handshake_timeout,
        table: Vec::new(),
        free: Vec::new(),
        backlog: false,
        spare_fd: std::fs::File::open("/dev/null").ok(),
        last_accept_error: None,
        scratch: vec![0u8; HANDSHAKE_HOLD],
    };
    let thread = std::thread::Builder::new()
        .name("stela-gate".into())
        .spawn(move || gate.run())?;
    Ok(GateHandle {
        stop,
        waker,
        thread,
    })
}

impl Gate {
    fn run(mut self) {
        lower_priority();
        let mut events = Events::with_capacity(1024);
        let mut last_sweep = Instant::now();
        while !self.stop.load(Ordering::SeqCst) {
            let timeout = if self.backlog {
                Duration::ZERO
            } else {
                SWEEP_EVERY
            };
            if let Err(error) = self.poll.poll(&mut events, Some(timeout)) {
                if error.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(%error, "the TCP gate's poll failed");
                }
            }
            for event in events.iter() {
                match event.token() {
                    WAKER => {}
                    LISTENER => self.backlog = true,
                    Token(token) => self.drive(token - FIRST_SLOT),
                }
            }
            if self.backlog {
                self.accept_some();
            }
            if last_sweep.elapsed() >= SWEEP_EVERY {
                last_sweep = Instant::now();
                self.sweep();
            }
        }
        for slot in 0..self.table.len() {
            self.close(slot);
        }
    }

    /// Accepts up to [`ACCEPTS_PER_ROUND`] connections; `backlog` says whether more may wait.
    fn accept_some(&mut self) {
        for _ in 0..ACCEPTS_PER_ROUND {
            match self.listener.accept() {
                Ok((tcp, address)) => self.admit(tcp, address.ip()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.backlog = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_out_of_descriptors(&e) => {
                    self.out_of_descriptors(&e);
                    return;
                }
                Err(error) => {
                    self.log_accept_error(&error);
                    return;
                }
            }
        }
    }

    /// Puts a new connection in the table, making room for it first if the table (or its
    /// address's share) is full, and reads what it already sent.
    fn admit(&mut self, tcp: mio::net::TcpStream, ip: IpAddr) {
        let _ = tcp.set_nodelay(true);
        let stream = match self.auth.tls() {
            None => Stream::Tcp(tcp),
            Some(config) => match stela_net::tls::rustls::ServerConnection::new(config) {
                Ok(tls) => Stream::Tls(Box::new(TlsStream::new(tcp, tls))),
                Err(error) => {
                    tracing::error!(%error, "setting up TLS for a connection failed");
                    return;
                }
            },
        };
        self.make_room(ip);
        let slot = self.free.pop().unwrap_or_else(|| {
            self.table.push(None);
            self.table.len() - 1
        });
        let mut pending = Pending {
            stream,
            first: Vec::new(),
            ip,
            accepted_at: Instant::now(),
        };
        if let Err(error) = self.poll.registry().register(
            pending.stream.source(),
            Token(FIRST_SLOT + slot),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::error!(%error, "registering a TCP connection failed");
            self.free.push(slot);
            return;
        }
        debug_assert!(self.table[slot].is_none());
        self.table[slot] = Some(pending);
        self.counters.connections.fetch_add(1, Ordering::Relaxed);
        debug_assert!(self.in_table() <= self.limits.pending);
        self.drive(slot);
    }

    fn in_table(&self) -> usize {
        self.table.len() - self.free.len()
    }

    /// Closes the connection a newcomer from `ip` needs the slot of, if the table or that
    /// address's share is full.
    fn make_room(&mut self, ip: IpAddr) {
        let mut slots = Vec::with_capacity(self.in_table());
        let mut waiting = Vec::with_capacity(self.in_table());
        for (slot, pending) in self.table.iter().enumerate() {
            if let Some(p) = pending {
                slots.push(slot);
                waiting.push(Waiting {
                    ip: p.ip,
                    since: p.accepted_at,
                    heard: !p.first.is_empty() || matches!(&p.stream, Stream::Tls(s) if s.heard()),
                });
            }
        }
        // `make_room` wants the oldest first.
        let mut order: Vec<usize> = (0..waiting.len()).collect();
        order.sort_by_key(|&i| waiting[i].since);
        let sorted: Vec<Waiting> = order.iter().map(|&i| waiting[i]).collect();
        if let Some(victim) = make_room(&sorted, ip, &self.limits) {
            let slot = slots[order[victim]];
            self.refuse(
                slot,
                "no Hello, and newer connections need the handshake slot",
            );
        }
    }

    /// Reads what the connection sent; hands it to the loop once its first frame is whole.
    fn drive(&mut self, slot: usize) {
        let Some(pending) = self.table.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if let Err(error) = pending.stream.flush_pending() {
            tracing::debug!(%error, "a TCP connection failed in its handshake");
            self.close(slot);
            return;
        }
        loop {
            let room = HANDSHAKE_HOLD - pending.first.len();
            if room == 0 || first_frame_arrived(&pending.first) {
                self.hand_over(slot);
                return;
            }
            match pending.stream.read(&mut self.scratch[..room]) {
                Ok(0) => {
                    self.close(slot);
                    return;
                }
                Ok(n) => pending.first.extend_from_slice(&self.scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                    tracing::warn!(peer = %pending.stream.peer(), %error, "connection refused: TLS handshake failed");
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                    self.counters.refused_logins.fetch_add(1, Ordering::Relaxed);
                    self.close(slot);
                    return;
                }
                Err(error) => {
                    tracing::debug!(%error, "a TCP connection failed in its handshake");
                    self.close(slot);
                    return;
                }
            }
        }
    }

    /// The connection leaves the gate for the loop (which counts it from now on).
    fn hand_over(&mut self, slot: usize) {
        let Some(mut pending) = self.take(slot) else {
            return;
        };
        let _ = self.poll.registry().deregister(pending.stream.source());
        self.inbox.post(Event::Arrived(Box::new(Arrival {
            stream: pending.stream,
            first: pending.first,
            accepted_at: pending.accepted_at,
        })));
    }

    /// Handshakes past their deadline are refused.
    fn sweep(&mut self) {
        let now = Instant::now();
        let late: Vec<usize> = (0..self.table.len())
            .filter(|&slot| {
                self.table[slot]
                    .as_ref()
                    .is_some_and(|p| now.duration_since(p.accepted_at) >= self.handshake_timeout)
            })
            .collect();
        for slot in late {
            self.refuse(slot, "no Hello within the handshake timeout");
        }
    }

    /// Tells a connection why (as far as its socket takes it now) and closes it.
    fn refuse(&mut self, slot: usize, why: &str) {
        if let Some(pending) = self.table.get_mut(slot).and_then(Option::as_mut) {
            let mut answer = Vec::new();
            let body = ResponseBody::Error {
                code: ErrorCode::Timeout,
                message: why.to_owned(),
            };
            if stela_proto::frame::encode(&Response { id: 0, body }, &mut answer).is_ok() {
                let _ = pending.stream.write_some(&answer);
            }
            tracing::debug!(peer = %pending.stream.peer(), why, "closing a connection");
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
        }
        self.close(slot);
    }

    fn take(&mut self, slot: usize) -> Option<Pending> {
        let pending = self.table.get_mut(slot).and_then(Option::take)?;
        self.free.push(slot);
        self.counters.connections.fetch_sub(1, Ordering::Relaxed);
        Some(pending)
    }

    fn close(&mut self, slot: usize) {
        if let Some(mut pending) = self.take(slot) {
            pending.stream.close_notify();
            let _ = self.poll.registry().deregister(pending.stream.source());
        }
    }

    /// The process has no descriptor left: free the spare one, accept one connection to tell it
    /// why, close it, and take the spare back.
    fn out_of_descriptors(&mut self, error: &io::Error) {
        self.log_accept_error(error);
        drop(self.spare_fd.take());
        if let Ok((tcp, _)) = self.listener.accept() {
            let mut answer = Vec::new();
            let body = ResponseBody::Error {
                code: ErrorCode::TooManyConnections,
                message: "the daemon has no file descriptor left".into(),
            };
            if stela_proto::frame::encode(&Response { id: 0, body }, &mut answer).is_ok() {
                let _ = Stream::Tcp(tcp).write_some(&answer);
            }
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
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
            tracing::error!(%error, "accepting a TCP connection failed");
        }
    }
}

/// Whether `first` holds a whole first frame, or a header that announces more than a Hello
/// may be (the loop refuses that one; nothing more is worth reading here).
fn first_frame_arrived(first: &[u8]) -> bool {
    let Some(header) = first.get(..FRAME_HEADER_BYTES) else {
        return false;
    };
    let announced = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    announced > MAX_HELLO_FRAME_BYTES || first.len() >= FRAME_HEADER_BYTES + announced
}

fn is_out_of_descriptors(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE)
    )
}

/// Lowers this thread's CPU priority (Linux: niceness is per thread). A failure only logs.
fn lower_priority() {
    // SAFETY: gettid takes no argument and cannot fail.
    let tid = unsafe { libc::gettid() };
    let me = rustix::process::Pid::from_raw(tid);
    if let Err(error) = rustix::process::setpriority_process(me, NICENESS) {
        tracing::debug!(%error, "could not lower the TCP gate's priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_frame_is_whole_once_its_announced_body_arrived_or_it_announces_too_much() {
        let mut hello = Vec::new();
        let body = ResponseBody::Error {
            code: ErrorCode::Timeout,
            message: "x".into(),
        };
        stela_proto::frame::encode(&Response { id: 1, body }, &mut hello).unwrap();
        for cut in 0..hello.len() {
            assert!(!first_frame_arrived(&hello[..cut]), "cut at {cut}");
        }
        assert!(first_frame_arrived(&hello));
        let mut too_much = ((MAX_HELLO_FRAME_BYTES + 1) as u32).to_le_bytes().to_vec();
        too_much.extend_from_slice(&0u32.to_le_bytes());
        assert!(first_frame_arrived(&too_much));
    }
}
