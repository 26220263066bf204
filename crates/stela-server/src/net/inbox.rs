//! What other threads tell the event loop: answers to requests that waited (a `disk` commit
//! released by a flusher, a job finished by a worker), that buffer space was freed, that the
//! daemon stops. Posting is cheap while the loop is polling; only a loop that sleeps is woken
//! (one eventfd write), and a flusher that releases a whole round wakes it once.
//!
//! Invariant (no lost wake-up): the loop sets `asleep` and then looks at the queue before it
//! sleeps; a poster pushes and then looks at `asleep`; both with sequentially consistent
//! ordering, so at least one of them sees the other.

use crate::engine::Opened;
use crate::error::Error;
use crate::sync::lock;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use stela_proto::ResponseBody;

/// A TCP connection whose first frame has arrived (the gate's thread took it that far), for
/// the loop to admit.
pub(crate) struct Arrival {
    pub stream: super::stream::Stream,
    /// The plaintext received so far: a whole Hello frame (or a header announcing too much).
    pub first: Vec<u8>,
    pub accepted_at: std::time::Instant,
}

/// A connection, as a slot and the serial of the connection that had it (slots are reused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnRef {
    pub slot: usize,
    pub serial: u64,
}

/// What the loop does with a finished request beyond sending its answer.
#[derive(Debug)]
pub(crate) enum Effect {
    None,
    /// The log was opened for this connection: give it a handle (or, if the connection is gone,
    /// give the log back).
    Opened(Opened),
}

/// The answer to request `id` of `conn`, which waited.
#[derive(Debug)]
pub(crate) struct Answer {
    pub conn: ConnRef,
    pub id: u64,
    pub result: Result<ResponseBody, Error>,
    pub effect: Effect,
}

/// A ring's `disk` entry settled: the ring, the entry's seq, its log, and its LSNs or why it
/// failed (told in the log's terms by the loop: rare, so the flusher does not look names up).
pub(crate) type RingDone = (
    stela_net::shm::Completer,
    u64,
    crate::pool::LogId,
    Result<(u64, u64), crate::pool::PoolError>,
);

pub(crate) enum Event {
    Answer(Box<Answer>),
    /// A ring's `disk` entry is settled: publish its completion (and wake its client).
    RingDone(Box<RingDone>),
    SpaceFreed,
    /// A TCP connection through the gate's handshake, its first frame received: admit it.
    Arrived(Box<Arrival>),
}

pub(crate) struct Inbox {
    events: Mutex<Vec<Event>>,
    waker: Arc<mio::Waker>,
    asleep: AtomicBool,
    /// Events were pushed quietly since the last nudge.
    pending: AtomicBool,
}

impl Inbox {
    pub fn new(waker: Arc<mio::Waker>) -> Inbox {
        Inbox {
            events: Mutex::new(Vec::new()),
            waker,
            asleep: AtomicBool::new(false),
            pending: AtomicBool::new(false),
        }
    }

    /// Posts and wakes the loop if it sleeps.
    pub fn post(&self, event: Event) {
        self.push_quiet(event);
        self.nudge();
    }

    /// Posts without waking; the poster calls [`Inbox::nudge`] once after a batch.
    pub fn push_quiet(&self, event: Event) {
        lock(&self.events).push(event);
        self.pending.store(true, Ordering::Release);
    }

    /// Wakes the loop if something is pending and it sleeps (or is about to).
    pub fn nudge(&self) {
        fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::SeqCst) {
            if let Err(error) = self.waker.wake() {
                tracing::error!(%error, "waking the event loop failed");
            }
        }
    }

    /// Whether a quiet push happened since the last call.
    pub fn take_pending(&self) -> bool {
        self.pending.swap(false, Ordering::AcqRel)
    }

    pub fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *lock(&self.events))
    }

    /// The loop is about to sleep: returns `false` (stay awake) if events are waiting.
    pub fn prepare_sleep(&self) -> bool {
        self.asleep.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !lock(&self.events).is_empty() {
            self.asleep.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    pub fn woke(&self) {
        self.asleep.store(false, Ordering::SeqCst);
    }
}
