//! Admission: who gets a connection slot and who keeps it through the handshake. Accepting on
//! the Unix socket (TCP connections arrive from [`super::gate`] with their Hello's bytes, TLS
//! done, and enter here), the handshake slots (one address holds at
//! most its share; a full table evicts the oldest silent handshake first), the Hello (a TCP
//! peer authenticates there; clients and administrators are counted against their limits, read
//! per Hello so a reload applies to the next one), and running out of descriptors (a spare one
//! is kept to tell one more peer why it is refused).
//!
//! Invariants: every accepted connection is either registered with the poll and listed in
//! `handshakes` until its Hello, or refused and closed at once (none is dropped silently); an
//! evicted connection is still in its handshake; `clients` and `admins` count the admitted
//! connections of each role (the closing side gives them back).

use super::auth::{self, Identity};
use super::conn::{Conn, Phase};
use super::inbox::ConnRef;
use super::stream::Stream;
use super::{EventLoop, CONN_BASE, HANDSHAKE_SHARE_PER_ADDRESS, UNIX_ACCEPTS_PER_TURN};
use mio::{Interest, Token};
use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use stela_proto::{ErrorCode, Role};

impl EventLoop {
    /// Accepts on the Unix socket, at most [`UNIX_ACCEPTS_PER_TURN`] connections a turn: a
    /// local flood of connections must not keep the loop accepting while the connections it
    /// already has wait (it never returned while peers connected faster than it accepted).
    /// `unix_backlog` stays set while more may wait in the kernel's queue (the listener is
    /// edge-triggered: no new event says so); the loop accepts again next turn, without
    /// sleeping. TCP connections come through the gate, whole Hello first ([`super::gate`]).
    pub(super) fn accept(&mut self) {
        self.unix_backlog = true;
        for _ in 0..UNIX_ACCEPTS_PER_TURN {
            match self.unix.accept() {
                Ok((stream, _)) => self.add_conn(Stream::Unix(stream), Vec::new(), Instant::now()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.unix_backlog = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_out_of_descriptors(&e) => {
                    // Tried again next turn: each refuses one more queued peer, with the reason,
                    // on the spare descriptor.
                    self.out_of_descriptors(&e);
                    return;
                }
                Err(error) => {
                    self.unix_backlog = false;
                    self.log_accept_error(&error);
                    return;
                }
            }
        }
    }

    /// The process has no descriptor left: free the spare one, accept one connection to tell it
    /// why, close it, and take the spare back. The error is logged (at most once a second).
    pub(super) fn out_of_descriptors(&mut self, error: &io::Error) {
        self.log_accept_error(error);
        drop(self.spare_fd.take());
        let refused = self.unix.accept().ok().map(|(s, _)| Stream::Unix(s));
        if let Some(stream) = refused {
            self.refuse_now(stream, "the daemon has no file descriptor left");
        }
        self.spare_fd = std::fs::File::open("/dev/null").ok();
    }

    pub(super) fn log_accept_error(&mut self, error: &io::Error) {
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
    pub(super) fn refuse_now(&mut self, stream: Stream, why: &str) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        let mut conn = Conn::new(0, stream);
        conn.refuse(ErrorCode::TooManyConnections, why.to_owned());
        let _ = conn.flush();
        tracing::warn!(peer = %conn.peer, why, "connection refused");
    }

    /// Admits a connection to its handshake: from the Unix socket (`first` empty), or from the
    /// TCP gate with the bytes of its first frame (`first`) and when it was accepted.
    pub(super) fn add_conn(&mut self, stream: Stream, first: Vec<u8>, accepted_at: Instant) {
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
        let first_bytes = first.len();
        conn.arrived_with(first, accepted_at);
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
        self.held += first_bytes;
        self.handshakes.push_back(ConnRef { slot, serial });
        self.counters.connections.fetch_add(1, Ordering::Relaxed);
        self.ready.push_back(slot);
    }

    /// The connections in their handshake from `ip` (TCP), oldest first.
    pub(super) fn handshakes_from(
        &self,
        ip: Option<std::net::IpAddr>,
    ) -> impl Iterator<Item = ConnRef> + '_ {
        self.handshakes.iter().copied().filter(move |c| {
            self.conns[c.slot]
                .as_ref()
                .is_some_and(|conn| conn.peer_ip == ip)
        })
    }

    /// Of `candidates` (oldest first), the oldest that has sent nothing, else the oldest.
    pub(super) fn oldest_handshake(&mut self, candidates: &[ConnRef]) -> Option<ConnRef> {
        let first = *candidates.first()?;
        let silent = candidates.iter().copied().find(|c| {
            self.conns[c.slot]
                .as_mut()
                .is_some_and(|conn| !conn.has_spoken())
        });
        Some(silent.unwrap_or(first))
    }

    /// Closes a connection still in its handshake to make room for a newer one.
    pub(super) fn evict_handshake(&mut self, victim: Option<ConnRef>, why: &str) {
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

    pub(super) fn count_refused_login(&self) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        self.counters.refused_logins.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn hello(&mut self, slot: usize, id: u64, role: Role, token: Option<String>) {
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
}

fn is_out_of_descriptors(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE)
    )
}
