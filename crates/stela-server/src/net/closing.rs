//! The end of connections: deadlines (a handshake, an idle connection, a frame begun and not
//! finished, answers a client does not read), closing one (its handles given back on a worker, since closing a log writes it),
//! and closing all at shutdown after taking the answers already in the inbox.
//!
//! Invariants: a connection closed while a request of its own is out keeps its handles as an
//! orphan until that answer arrives, so no log is closed under a running job; closing gives
//! back its share of `held`, `output`, the role counts and the ring count exactly once (the
//! slot is emptied first).

use super::conn::{Phase, Waiting};
use super::inbox::ConnRef;
use super::EventLoop;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_proto::{ErrorCode, Role};

impl EventLoop {
    /// Deadlines: handshakes, idle connections, frames begun and answers not read; parked
    /// appends are retried as a safety net; a trim of freed memory is asked for when due.
    pub(super) fn sweep(&mut self) {
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
            // Answers that have not moved for as long: the client does not read them (what it
            // may make the daemon hold is bounded; holding it forever is not).
            let stalled_output = conn
                .output_stalled_for(now)
                .is_some_and(|stalled| stalled >= self.frame_timeout);
            let late = stalled_frame
                || stalled_output
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
            let unsent = conn.pending_output();
            let why = if conn.output_stalled_for(now).is_some() {
                // Logged where the default filter keeps it: the client loses the answers it
                // asked for, and whoever runs it must be able to find out why.
                tracing::info!(peer = %conn.peer, unsent,
                    "closing a connection that does not read its answers: none of them went out within the frame timeout");
                "answers were not read within the frame timeout"
            } else if stalled_frame {
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
        self.retry_parked();
        if self.trim.due(now) {
            self.workers.submit(Box::new(self.release_memory));
        }
        self.counters
            .partial_bytes
            .store(self.held as u64, Ordering::Relaxed);
        self.counters
            .output_bytes
            .store(self.output as u64, Ordering::Relaxed);
    }

    /// Closes a connection: its handles are given back (on a worker: closing a log writes it).
    pub(super) fn close(&mut self, slot: usize) {
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
        self.trim.freed(conn.buffer_capacity());
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
    pub(super) fn release(&self, handles: Vec<crate::pool::LogId>) {
        for log in handles {
            let engine = Arc::clone(&self.engine);
            self.workers.submit(Box::new(move || engine.release(log)));
        }
    }

    pub(super) fn close_all(&mut self) {
        let _ = self.take_inbox();
        for slot in 0..self.conns.len() {
            if let Some(conn) = self.conn_mut(slot) {
                let _ = conn.flush();
            }
            self.close(slot);
        }
    }
}
