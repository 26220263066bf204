//! The daemon's end of a connection's shared-memory ring: entries copied out, placed in the
//! pool, and acknowledged in place (`docs/PROTOCOL.md`, "Shared-memory transport").
//!
//! Invariants (the isolation argument of RapiLog, for a ring the client can scribble on):
//! - An entry is acknowledged only after its records are framed in the pool, from the daemon's
//!   private copy, which was checked (CRCs, lengths, sequence) after copying; a client's wild
//!   write can therefore only spoil its own entries not yet acknowledged.
//! - Nothing past the client's published tail is ever read; a bad entry stops the ring for
//!   good (nothing after it is acknowledged) and closes the connection.
//! - Completions are published in sequence: while an entry waits for the disk, the entries
//!   after it are not read (as on the socket, a waiting request holds back the connection).
//!   A `disk` entry made durable by a flusher is handed back to the event loop (one inbox
//!   event), which publishes its completion and wakes the client: the flusher makes no wake-up
//!   call per waiter and goes straight on to its next round.
//! - An append that finds no buffer space is left in the ring, unconsumed, and retried when
//!   space is freed: the client simply waits longer (backpressure), nothing is dropped.
//! - A commit of [`COMMIT_END`] stands for the log's last LSN when the entry is read, which is
//!   at or above every append answered before the client published it.

use super::inbox::{Event, Inbox};
use crate::engine::Engine;
use crate::error::Error;
use crate::pool::{LogId, Record};
use std::sync::Arc;
use stela_net::shm::{Completer, Completion, DaemonRing, RingFault, WakeBatch};
use stela_proto::ring::{Entry, EntryKind, COMMIT_END};

pub(crate) struct RingConn {
    pub(super) ring: DaemonRing,
    pub(super) completer: Completer,
    /// The entry waiting for the disk, if one is.
    pub(super) pending: Option<u64>,
    /// An append found no space; retry once space is freed.
    pub(super) parked: bool,
    pub(super) scratch: Vec<u8>,
}

impl RingConn {
    fn complete(&self, seq: u64, result: Result<(u64, u64), &Error>) {
        complete(&self.completer, seq, result, &mut WakeBatch::default());
    }

    /// Handles the published entries; `Ok(true)` if it did anything. `Err`: the ring is bad and
    /// the connection must close.
    pub fn step(
        &mut self,
        engine: &Engine,
        inbox: &Arc<Inbox>,
        handles: &[Option<LogId>],
    ) -> Result<bool, RingFault> {
        if let Some(seq) = self.pending {
            if self.completer.completed() < seq {
                return Ok(false);
            }
            self.pending = None;
        }
        let mut did = false;
        while !self.parked {
            let Some(entry) = self.ring.next_entry(&mut self.scratch)? else {
                break;
            };
            did = true;
            let seq = entry.seq;
            let level = entry.durability;
            let placed = place_entry(engine, handles, &entry);
            if !matches!(placed, Placed::NoSpace) {
                engine.metrics.requested(entry.durability); // once, not at each retry
            }
            match placed {
                Placed::NoSpace => {
                    self.parked = true;
                    break;
                }
                Placed::Refused(error) => {
                    self.ring.consume();
                    self.complete(seq, Err(&error));
                }
                // The records are in the pool: the entry's space goes back to the client. Only
                // then may a flusher complete it, so the disk wait is registered after.
                Placed::At(log, first, last) => {
                    self.ring.consume();
                    if !Engine::waits(level) || last < first || last == 0 {
                        engine.metrics.acked(entry.durability);
                        self.complete(seq, Ok((first, last)));
                        continue;
                    }
                    // The flusher that makes it durable hands the completion to the event loop,
                    // which publishes it and wakes the client, so the flusher goes straight on to
                    // its next round instead of making one wake-up call per waiter.
                    let (completer, inbox) = (self.completer.clone(), Arc::clone(inbox));
                    let metrics = Arc::clone(&engine.metrics);
                    let waiter = Box::new(move |outcome: Result<(), crate::pool::PoolError>| {
                        let _ = outcome.is_ok().then(|| metrics.acked(level));
                        let done = Box::new((completer, seq, log, outcome.map(|()| (first, last))));
                        inbox.push_quiet(Event::RingDone(done));
                    });
                    match engine.when_acked(log, last, level, waiter) {
                        Ok(true) => {
                            engine.metrics.acked(level);
                            self.complete(seq, Ok((first, last)))
                        }
                        Ok(false) => {
                            self.pending = Some(seq);
                            break;
                        }
                        Err(error) => self.complete(seq, Err(&error)),
                    }
                }
            }
        }
        Ok(did)
    }
}

/// Where an entry's records went.
enum Placed {
    /// No buffer space: leave the entry in the ring and retry.
    NoSpace,
    Refused(Error),
    /// In the pool at LSNs `first..=last` of the log (for a commit: the LSN waited for).
    At(LogId, u64, u64),
}

/// Places an append's records in the pool, or checks a commit's LSN.
fn place_entry(engine: &Engine, handles: &[Option<LogId>], entry: &Entry<'_>) -> Placed {
    let log = match handles
        .get(entry.handle as usize)
        .copied()
        .flatten()
        .ok_or(Error::UnknownHandle(entry.handle))
        .and_then(|log| engine.check_level(entry.durability).map(|()| log))
    {
        Ok(log) => log,
        Err(error) => return Placed::Refused(error),
    };
    match entry.kind {
        EntryKind::Append => {
            let records: Vec<Record<'_>> = entry
                .records()
                .map(|(payload, crc)| Record { payload, crc })
                .collect();
            match engine.append(log, &records) {
                Ok((first, last)) => Placed::At(log, first, last),
                Err(Error::NoSpace) => Placed::NoSpace,
                Err(error) => Placed::Refused(error),
            }
        }
        EntryKind::Commit => {
            // The log's end as this entry is read: every append that was answered before the
            // client sent it (on any connection) is placed, so it is at or below.
            let lsn = match entry.lsn {
                COMMIT_END => engine.positions(log).last_lsn,
                lsn => lsn,
            };
            match engine.check_appended(log, lsn) {
                Ok(()) => Placed::At(log, lsn, lsn),
                Err(error) => Placed::Refused(error),
            }
        }
    }
}

/// Publishes the completion of entry `seq` (with the error's message, for a refusal); a client
/// sleeping on its board seat is woken with the others of `batch`.
pub(super) fn complete(
    completer: &Completer,
    seq: u64,
    result: Result<(u64, u64), &Error>,
    batch: &mut WakeBatch,
) {
    match result {
        Ok((first, last)) => completer.complete_in(seq, Completion::ok(first, last), batch),
        Err(error) => completer.refuse(seq, error.code(), &error.to_string(), batch),
    }
}
