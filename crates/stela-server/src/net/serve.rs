//! One connection's turn: reading its bytes (within the cap on bytes held for unfinished
//! frames), handling its requests through [`super::conn`], writing its answers (within the cap
//! on unsent answer bytes), taking the answers that come back through the inbox, and copying
//! entries out of the shared-memory rings.
//!
//! Invariants: `held` is the sum of every connection's held bytes and `output` the sum of
//! their unsent answer charges (each change to a connection's is applied to the total at
//! once); a connection is read only while nothing of its own waits and it is not closing
//! (requests are answered in order); a turn steps only the connections ready when it began, so
//! one that keeps sending does not starve the rest.

use super::conn::{Conn, Ctx, Phase, Progress, Waiting};
use super::inbox::{Answer, ConnRef, Effect, Event};
use super::{
    ring, EventLoop, CONN_BASE, HANDSHAKE_HOLD, OUTPUT_RESERVE, READ_ANSWER_BYTES, READ_BUDGET,
    SMALL_FRAME_RESERVE,
};
use mio::{Interest, Token};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use stela_net::shm::WakeBatch;
use stela_proto::{ErrorCode, ResponseBody};

impl EventLoop {
    pub(super) fn on_socket(
        &mut self,
        slot: usize,
        readable: bool,
        read_closed: bool,
        writable: bool,
    ) {
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
    pub(super) fn read_allowance(&self, conn: &Conn) -> usize {
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
    pub(super) fn read(&mut self, slot: usize) {
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

    pub(super) fn flush(&mut self, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let (before, capacity_before) = (conn.output_charge(), conn.buffer_capacity());
        let flushed = conn.flush();
        self.output -= before.saturating_sub(conn.output_charge()).min(self.output);
        self.trim
            .freed(capacity_before.saturating_sub(conn.buffer_capacity()));
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
    pub(super) fn run_ready(&mut self) -> bool {
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

    pub(super) fn step(&mut self, slot: usize) {
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
        let capacity_before = conn.buffer_capacity();
        let progress = conn.process(&ctx);
        self.trim
            .freed(capacity_before.saturating_sub(conn.buffer_capacity()));
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

    pub(super) fn register_doorbell(&mut self, slot: usize) {
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
    pub(super) fn take_inbox(&mut self) -> bool {
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
                Event::SpaceFreed => self.retry_parked(),
                Event::Arrived(arrival) => {
                    let super::inbox::Arrival {
                        stream,
                        first,
                        accepted_at,
                    } = *arrival;
                    self.add_conn(stream, first, accepted_at);
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

    /// Appends parked for space (on sockets and rings) are tried again: space was freed, or
    /// the sweep retries them as a safety net.
    pub(super) fn retry_parked(&mut self) {
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

    /// Copies entries out of every ring that has some; says whether it did anything, and how
    /// many entries were answered at once and how many went to wait (for the disk or a
    /// standby).
    pub(super) fn scan_rings(&mut self) -> (bool, (u64, u64)) {
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
}
