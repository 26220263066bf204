//! The standby's acknowledgements on the primary: read by the event loop while `replicated`
//! commits wait (plain TCP), else by the stream's acknowledgement thread; each releases the
//! waiters it satisfies. A refusal fences the log.
//!
//! Invariants:
//! - **One reader at a time.** Bytes are read only under the link's `acks` lock, and only whole
//!   messages are acted on, so a message is never split between the loop and the thread.
//! - **Released only by an acknowledgement of this stream's term** (or fenced: in doubt).
//! - **Always someone reading.** While the loop has taken the reading over ([`AckReading`]) it
//!   reads at the end of every turn in which commits of the log wait, and it hands the reading
//!   back before it sleeps, when it stops spinning and when the stream ends; meanwhile the
//!   thread takes what came every `PARKED_AT_MOST`, so no acknowledgement is left unread
//!   longer than that (the standby never blocks on a full socket).

use super::{receive, Link, Reader};
use crate::pool::PoolError;
use crate::sync::lock;
use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stela_proto::repl::ReplMessage;
use stela_proto::{frame, MAX_FRAME_BYTES};

/// Longest the acknowledgement thread stays parked while the loop reads, should a hand-back be
/// missed.
const PARKED_AT_MOST: Duration = Duration::from_millis(5);

/// Who reads a plain TCP stream's acknowledgements: the acknowledgement thread, or the event
/// loop, which takes the reading over while `replicated` commits of the log wait and it turns
/// (it reads at the end of each turn anyway). The thread then stays parked instead of being
/// woken by every acknowledgement only to find the loop took it: at 16 committers that was
/// about 15,000 wake-ups a second, and both readers contending for the socket's lock.
#[derive(Default)]
pub(super) struct AckReading {
    by_loop: AtomicBool,
    /// The acknowledgement thread of the session up now.
    thread: Mutex<Option<std::thread::Thread>>,
}

impl AckReading {
    /// The loop reads from now on, at the end of every turn.
    pub(super) fn take_over(&self) {
        if !self.by_loop.load(Ordering::Relaxed) {
            self.by_loop.store(true, Ordering::SeqCst);
        }
    }

    /// The loop stops reading (it sleeps, stops spinning, or the stream ended): the thread
    /// reads again. An unpark before the thread parks is kept as its token, so none is lost.
    pub(super) fn hand_back(&self) {
        if self.by_loop.load(Ordering::Relaxed) && self.by_loop.swap(false, Ordering::SeqCst) {
            if let Some(thread) = lock(&self.thread).as_ref() {
                thread.unpark();
            }
        }
    }
}

/// The receiving end of a plain TCP stream: bytes read but not yet a whole message. Whoever
/// holds the link's `acks` lock reads, so a message is never split between two readers.
pub(super) struct AckInbox {
    pub(super) socket: TcpStream,
    pub(super) pending: Vec<u8>,
    pub(super) term: u64,
    /// The stream ended (closed, failed, refused): the session is over.
    pub(super) ended: bool,
}

/// The standby refused `ours` being at `theirs`: no `replicated` acknowledgement can come for
/// this log any more; its waiters are told their commits are in doubt. A refusal from a newer
/// epoch means a newer primary exists: this node steps down.
pub(super) fn fence(
    link: &Link,
    node: &crate::cluster::Node,
    released: &(dyn Fn() + Send + Sync),
    theirs: u64,
    ours: u64,
    message: String,
) -> String {
    let why = format!("the standby refused term {ours} (it is at term {theirs}): {message}");
    if theirs <= ours {
        return why;
    }
    lock(&link.state).connected = false;
    for waiter in link.protection.fence(why.clone()) {
        waiter.call(Err(PoolError::InDoubt(why.clone())));
    }
    released();
    tracing::error!(log = %link.name, why, "fenced: replicated commits of this log are refused");
    if theirs != u64::MAX && theirs >> 32 > ours >> 32 {
        node.step_down(format!(
            "log {}: the standby is in epoch {} (this node in {}): {message}",
            link.name,
            theirs >> 32,
            ours >> 32
        ));
    }
    why
}

/// The standby of this session acknowledged holding `received`: while the node is
/// unprotected, this log is confirmed once that covers what it acknowledged alone, and the
/// node is protected again once every log is (`super::reprotection`). Called with no lock
/// held but, from the event loop or the acknowledgement thread, the link's `acks` (and the
/// links map): the registry's lock is taken under them, never the other way round.
pub(super) fn confirm_rejoin(link: &Link, received: u64) {
    link.reprotection.standby_acknowledged(&link.name, received);
}

/// Releases the waiters `received` satisfies; whether there were any.
pub(super) fn release(link: &Link, received: u64, durable: u64) -> bool {
    {
        let mut state = lock(&link.state);
        state.last_ack = Some(std::time::Instant::now());
        while let Some(&(last_lsn, segment, end)) = state.sent.front() {
            if last_lsn > received {
                break;
            }
            state.acked_at = Some((segment, end));
            state.sent.pop_front();
        }
    }
    let ready = link.protection.acknowledged(received, durable);
    let any = !ready.is_empty();
    for waiter in ready {
        waiter.call(Ok(()));
    }
    any
}

pub(super) fn read_acks(
    mut reader: BufReader<Reader>,
    link: &Arc<Link>,
    node: &crate::cluster::Node,
    term: u64,
    released: &(dyn Fn() + Send + Sync),
) {
    if node.realtime_threads() {
        crate::sched::become_realtime("replication acknowledgements");
    }
    loop {
        match receive(&mut reader) {
            Ok(ReplMessage::Ack {
                term: theirs,
                received_lsn,
                durable_lsn,
            }) if theirs == term => {
                // Released first: once the node says it is protected, the standby's
                // acknowledged LSN it shows already covers what was acknowledged without it.
                if release(link, received_lsn, durable_lsn) {
                    released();
                }
                confirm_rejoin(link, received_lsn);
            }
            Ok(ReplMessage::Refuse {
                term: theirs,
                message,
            }) => {
                tracing::warn!(log = %link.name, theirs, message, "the standby refused the stream");
                fence(link, node, released, theirs, term, message);
                return;
            }
            Ok(other) => {
                tracing::warn!(log = %link.name, ?other, "unexpected message from the standby; reconnecting");
                return;
            }
            Err(_) => return,
        }
    }
}

/// The acknowledgement thread of a plain TCP stream: waits for bytes without holding the
/// inbox (the event loop may take them first), then takes what is there. Returns when the
/// stream ends.
pub(super) fn read_acks_polled(
    link: &Arc<Link>,
    node: &crate::cluster::Node,
    released: &(dyn Fn() + Send + Sync),
) {
    if node.realtime_threads() {
        crate::sched::become_realtime("replication acknowledgements");
    }
    let Some(watch) = lock(&link.acks)
        .as_ref()
        .and_then(|inbox| inbox.socket.try_clone().ok())
    else {
        return;
    };
    *lock(&link.acks_reading.thread) = Some(std::thread::current());
    // The loop reads, and the session is not over (this thread ends it).
    let loop_reads = || {
        link.acks_reading.by_loop.load(Ordering::SeqCst)
            && lock(&link.acks).as_ref().is_some_and(|inbox| !inbox.ended)
    };
    // Takes what the socket holds; `false`: the session is over.
    let take = || {
        let mut guard = lock(&link.acks);
        let Some(inbox) = guard.as_mut() else {
            return false;
        };
        let any = inbox.take(link, node, released);
        let ended = inbox.ended;
        drop(guard);
        if any {
            released();
        }
        !ended
    };
    loop {
        if loop_reads() {
            std::thread::park_timeout(PARKED_AT_MOST);
            if loop_reads() {
                // Still the loop's, but it reads only while commits wait (and keeps the
                // reading while it spins between them): take what came meanwhile.
                if !take() {
                    return;
                }
                continue;
            }
        }
        let mut ready = [rustix::event::PollFd::new(
            &watch,
            rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut ready, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
        if loop_reads() {
            // Woken by an acknowledgement the loop reads: park until it hands back.
            continue;
        }
        if !take() {
            return;
        }
    }
}

impl AckInbox {
    /// Reads what the socket holds without blocking and acts on every whole message in it.
    /// `true`: waiters were released (the caller makes sure the event loop publishes them).
    pub(super) fn take(
        &mut self,
        link: &Link,
        node: &crate::cluster::Node,
        released: &(dyn Fn() + Send + Sync),
    ) -> bool {
        let mut buffer = [0u8; 4096];
        loop {
            match rustix::net::recv(&self.socket, &mut buffer, rustix::net::RecvFlags::DONTWAIT) {
                Ok((0, _)) => {
                    self.ended = true;
                    break;
                }
                Ok((read, _)) => self.pending.extend_from_slice(&buffer[..read]),
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {
                    self.ended = true;
                    break;
                }
            }
        }
        let mut any = false;
        let mut used = 0;
        while !self.ended {
            let rest = &self.pending[used..];
            let Some(header) = rest.get(..stela_proto::FRAME_HEADER_BYTES) else {
                break;
            };
            let header = frame::parse_header(header.try_into().expect("8 bytes"), MAX_FRAME_BYTES);
            let Ok(header) = header else {
                tracing::warn!(log = %link.name, "a malformed frame from the standby; reconnecting");
                self.ended = true;
                break;
            };
            let whole = stela_proto::FRAME_HEADER_BYTES + header.body_len;
            if rest.len() < whole {
                break;
            }
            let body = &rest[stela_proto::FRAME_HEADER_BYTES..whole];
            used += whole;
            match frame::decode_body::<ReplMessage>(header, body) {
                Ok(ReplMessage::Ack {
                    term: theirs,
                    received_lsn,
                    durable_lsn,
                }) if theirs == self.term => {
                    any |= release(link, received_lsn, durable_lsn);
                    confirm_rejoin(link, received_lsn);
                }
                Ok(ReplMessage::Refuse {
                    term: theirs,
                    message,
                }) => {
                    tracing::warn!(log = %link.name, theirs, message, "the standby refused the stream");
                    fence(link, node, released, theirs, self.term, message);
                    self.ended = true;
                }
                other => {
                    tracing::warn!(log = %link.name, ?other, "unexpected message from the standby; reconnecting");
                    self.ended = true;
                }
            }
        }
        self.pending.drain(..used);
        if self.ended {
            // The shipper sees the thread end and reconnects; cutting the socket also ends a
            // send it is blocked in.
            let _ = self.socket.shutdown(std::net::Shutdown::Both);
        }
        any
    }
}
