//! The daemon's end of a ring: it copies each published entry into private memory, checks the
//! copy, hands it to the caller, and publishes consumption (`head`) and completions.
//!
//! Invariants:
//! - **Nothing unpublished is read.** Bytes are read only below the `tail` the client published
//!   (loaded with Acquire, checked by `check_published`), and an entry only after its length
//!   was checked against the area and that tail.
//! - **Only the private copy is trusted.** An entry is parsed from the caller's scratch buffer,
//!   never from the shared bytes, so a client scribbling on its published entry at the same
//!   time changes nothing that was checked (no time-of-check/time-of-use).
//! - **The daemon's own state is private.** `head`, the expected seq, the last completion and
//!   the layout live here; the shared copies are only published, never read back, since the
//!   client can write any byte of the region.
//! - **A bad entry stops the ring.** The first entry that fails a check sets `fault` (and
//!   `fault_seq`, its seq); from then on nothing more is read, and neither it nor anything after
//!   it is ever completed. Entries consumed before it can still be completed.
//! - **Completions are in seq order**, each result slot written before `done_seq` covers it,
//!   and only for consumed entries.

mod report;
mod wake;

pub use report::RingFault;

use super::board::{Seat, WakeBatch};
use super::region::{Doorbell, Region};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32 as PrivateU32, AtomicU64 as PrivateU64};
use std::sync::Arc;
use stela_proto::ring::{
    check_entry_start, check_published, encode_message, encode_result, parse_entry, Completion,
    Entry, EntryStart, FaultCode, RingError, RingLayout,
};
use stela_proto::ErrorCode;
use wake::{notify_client, Change};

/// The daemon's end of one connection's ring.
pub struct DaemonRing {
    region: Region,
    layout: RingLayout,
    doorbell: Doorbell,
    /// Bytes consumed (the authoritative copy; the shared `head` is only published).
    head: u64,
    /// Length of the entry `next_entry` returned last, until `consume` passes it (0: none).
    pending: u64,
    /// The seq the next entry must carry.
    expected_seq: u64,
    /// Shared with the ring's [`Completer`]s.
    completions: Arc<Completions>,
    /// Non-zero once the ring is stopped: the fault code.
    stopped: PrivateU32,
    /// The full report of a fault found by `next_entry`, returned again on later calls.
    fault: Option<RingFault>,
    /// Where the client may sleep for answers, if the ring has a seat on a wake board.
    seat: Option<Seat>,
}

impl DaemonRing {
    pub(crate) fn from_parts(region: Region, doorbell: Doorbell) -> DaemonRing {
        DaemonRing {
            layout: region.layout(),
            region,
            doorbell,
            head: 0,
            pending: 0,
            expected_seq: 1,
            completions: Arc::new(Completions {
                completed: PrivateU64::new(0),
                consumed: PrivateU64::new(0),
            }),
            stopped: PrivateU32::new(0),
            fault: None,
            seat: None,
        }
    }

    /// The stop report, if the ring is stopped.
    pub fn fault_report(&self) -> Option<RingFault> {
        match self.stopped.load(Relaxed) {
            0 => None,
            code => Some(self.fault.clone().unwrap_or(RingFault {
                code: FaultCode::from_u32(code).unwrap_or(FaultCode::Closed),
                seq: self.expected_seq,
                at: self.head,
                error: None,
            })),
        }
    }

    /// Copies the next published entry into `scratch`, checks the copy, and returns it parsed
    /// (borrowing `scratch`); `Ok(None)` when nothing more is published. Does not consume:
    /// once the entry's records are placed, call [`DaemonRing::consume`]; called again before
    /// that, it returns the same entry. Pads are skipped (and their space freed) on the way.
    ///
    /// # Errors
    /// The first failed check stops the ring: the fault is published to the client and returned,
    /// now and on every later call.
    pub fn next_entry<'s>(
        &mut self,
        scratch: &'s mut Vec<u8>,
    ) -> Result<Option<Entry<'s>>, RingFault> {
        if let Some(fault) = self.fault_report() {
            return Err(fault);
        }
        loop {
            let tail = self.region.tail().load(Acquire);
            if tail == self.head {
                return Ok(None);
            }
            let data_bytes = self.layout.data_bytes;
            let published =
                check_published(self.head, tail, data_bytes).map_err(|e| self.stop(e))?;
            let position = self.layout.position(self.head);
            let mut first = [0u8; 8];
            self.region.read_data(position, &mut first);
            let first = first[..4].try_into().expect("4 bytes");
            match check_entry_start(first, self.head, published, data_bytes)
                .map_err(|e| self.stop(e))?
            {
                EntryStart::Pad(len) => {
                    self.head += len;
                    self.publish_head();
                }
                EntryStart::Entry(len) => {
                    scratch.clear();
                    scratch.resize(len, 0);
                    self.region.read_data(position, scratch);
                    let copy: &'s [u8] = scratch;
                    return match parse_entry(copy, self.expected_seq) {
                        Ok(entry) => {
                            self.pending = len as u64;
                            Ok(Some(entry))
                        }
                        Err(error) => Err(self.stop(error)),
                    };
                }
            }
        }
    }

    /// Moves past the entry [`DaemonRing::next_entry`] returned, freeing its space for the
    /// client (call it once the records are in the daemon's own memory).
    ///
    /// # Panics
    /// If there is no such entry: a bug in the caller.
    pub fn consume(&mut self) {
        assert!(self.pending > 0, "consume without an entry from next_entry");
        self.head += self.pending;
        self.pending = 0;
        self.completions.consumed.store(self.expected_seq, Relaxed);
        self.expected_seq += 1;
        self.publish_head();
    }

    /// Publishes the answer to entry `seq`: its result slot, then `done_seq`, then wakes the
    /// client if it sleeps. Entries are completed one by one in seq order, and only once
    /// consumed.
    ///
    /// # Panics
    /// If `seq` is not the one after the last completed, or not yet consumed: a bug in the
    /// caller, which would otherwise hand the client another entry's answer.
    pub fn complete(&self, seq: u64, completion: Completion) {
        self.completer()
            .complete_in(seq, completion, &mut WakeBatch::default());
    }

    /// The last seq completed.
    pub fn completed(&self) -> u64 {
        self.completions.completed.load(Relaxed)
    }

    /// A handle that completes this ring's entries from another thread (a flusher releasing a
    /// `disk` entry) while this end goes on reading. It keeps the mapping alive, so it may
    /// outlive the ring (a completion then reaches memory the client may no longer map, which
    /// is harmless).
    pub fn completer(&self) -> Completer {
        Completer {
            region: self.region.clone(),
            completions: Arc::clone(&self.completions),
            seat: self.seat.clone(),
        }
    }

    /// Stops reading the ring for the daemon's own reason (usually [`FaultCode::Closed`]:
    /// shutdown, or the daemon will not serve this ring any more) and tells the client, which
    /// gets an error for every entry not yet consumed. Entries already consumed must still be
    /// completed. Does nothing if the ring is already stopped.
    pub fn fault(&self, code: FaultCode) {
        self.publish_fault(code);
    }

    fn stop(&mut self, error: RingError) -> RingFault {
        let fault = RingFault {
            code: error.fault_code(),
            seq: self.expected_seq,
            at: self.head,
            error: Some(error),
        };
        self.fault = Some(fault.clone());
        self.publish_fault(fault.code);
        fault
    }

    fn publish_fault(&self, code: FaultCode) {
        if self
            .stopped
            .compare_exchange(0, code.as_u32(), Relaxed, Relaxed)
            .is_err()
        {
            return;
        }
        self.region.fault_seq().store(self.expected_seq, Relaxed);
        self.region.fault().store(code.as_u32(), Release);
        self.notify(Change::Answer);
    }

    fn publish_head(&self) {
        self.region.head().store(self.head, Release);
        self.notify(Change::Head);
    }
}

/// What the reading end and its completers share: the daemon's private record of how far the
/// ring was consumed and completed (the shared words are only ever published, never read back).
#[derive(Debug)]
struct Completions {
    completed: PrivateU64,
    /// The last seq consumed.
    consumed: PrivateU64,
}

/// Completes a ring's entries from any thread; see [`DaemonRing::completer`].
#[derive(Clone)]
pub struct Completer {
    region: Region,
    completions: Arc<Completions>,
    seat: Option<Seat>,
}

impl Completer {
    /// As [`Completer::complete_in`], for a refusal, with the daemon's explanation (the
    /// client shows it in its error).
    pub fn refuse(&self, seq: u64, code: ErrorCode, message: &str, batch: &mut WakeBatch) {
        self.region.write_message(&encode_message(seq, message));
        self.complete_in(seq, Completion::failed(code, 0), batch);
    }

    /// As [`DaemonRing::complete`], except that a client sleeping on its board seat is woken by
    /// `batch` (with every other seat of its board word answered into the same batch), at the
    /// latest when the batch is dropped. A client sleeping on its ring's `wake` is woken now.
    pub fn complete_in(&self, seq: u64, completion: Completion, batch: &mut WakeBatch) {
        let last = self.completions.completed.load(Relaxed);
        assert_eq!(seq, last + 1, "ring completions must be in seq order");
        assert!(
            seq <= self.completions.consumed.load(Relaxed),
            "entry {seq} completed before it was consumed"
        );
        self.region
            .write_result(seq, &encode_result(seq, &completion));
        self.region.done_seq().store(seq, Release);
        self.completions.completed.store(seq, Relaxed);
        notify_client(&self.region, self.seat.as_ref(), Change::Answer, batch);
    }

    /// The last seq completed.
    pub fn completed(&self) -> u64 {
        self.completions.completed.load(Relaxed)
    }
}
