//! A connection's ring as the event loop handles it: making one, its doorbell, the sleep
//! handshake, parking while the pool is full. The hand-off of entries is in [`super::ring`].

use super::inbox::Inbox;
use super::ring::RingConn;
use crate::engine::Engine;
use crate::pool::LogId;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use stela_net::shm::DaemonRing;
use stela_net::shm::RingFault;
use stela_proto::ResponseBody;

/// Result slots per ring: a blocking client has one entry in flight; more let a pipelining one
/// keep several.
const RESULT_SLOTS: u32 = 16;

impl RingConn {
    /// Creates a ring of `data_bytes`; returns it, the descriptors for the client (memory,
    /// doorbell) and the answer that goes with them.
    pub fn create(data_bytes: usize) -> io::Result<(RingConn, Vec<OwnedFd>, ResponseBody)> {
        let (ring, memory, doorbell) =
            DaemonRing::create(data_bytes as u64, RESULT_SLOTS).map_err(io::Error::other)?;
        let completer = ring.completer();
        let answer = ResponseBody::RingMapped {
            data_bytes: data_bytes as u32,
            slots: RESULT_SLOTS,
        };
        Ok((
            RingConn {
                ring,
                completer,
                pending: None,
                parked: false,
                scratch: Vec::new(),
            },
            vec![memory, doorbell],
            answer,
        ))
    }

    /// As [`RingConn::step`], also counting what the loop's scheduling follows
    /// (`crate::sched::LoopPriority`): the entries this step answered at once (their
    /// completions, all published by the step itself on this thread) and whether it sent one
    /// to wait (for the disk or a standby).
    pub fn step_counted(
        &mut self,
        engine: &Engine,
        inbox: &Arc<Inbox>,
        handles: &[Option<LogId>],
    ) -> Result<(bool, (u64, u64)), RingFault> {
        let (completed, pending) = (self.completer.completed(), self.pending);
        let did = self.step(engine, inbox, handles)?;
        let answered_at_once = self.completer.completed() - completed;
        let waited = u64::from(self.pending.is_some() && self.pending != pending);
        Ok((did, (answered_at_once, waited)))
    }

    pub fn doorbell_fd(&self) -> BorrowedFd<'_> {
        self.ring.doorbell_fd()
    }

    pub fn drain_doorbell(&self) {
        if let Err(error) = self.ring.drain_doorbell() {
            tracing::error!(%error, "reading a ring's doorbell failed");
        }
    }

    /// Asks the client to ring the doorbell from now on; `false` if an entry is already
    /// published (then do not sleep).
    pub fn prepare_sleep(&self) -> bool {
        self.ring.set_asleep()
    }

    pub fn woke(&self) {
        self.ring.clear_asleep();
    }

    pub fn unpark(&mut self) {
        self.parked = false;
    }

    /// Nothing in flight (for the idle timeout).
    pub fn idle(&self) -> bool {
        self.pending.is_none() && !self.parked
    }

    /// An entry waits for the disk.
    pub fn awaits_disk(&self) -> bool {
        self.pending.is_some()
    }
}
