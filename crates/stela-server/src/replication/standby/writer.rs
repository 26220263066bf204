//! The pipe between a stream's receiving thread and its writer, and the writer itself: chunks
//! checked and held in memory are written behind, joined when they continue each other, and
//! synced in batches (RapiLog's buffers, on the standby: a sync never holds up the next chunk).
//!
//! Invariants:
//! - **Bounded.** At most [`HELD_BYTES`] are held, counting what the writer has taken and not
//!   yet written; beyond that the receiver stops reading (and TCP slows the primary), telling
//!   the primary every [`ALIVE_WHILE_FULL`] that it is alive.
//! - **Durable means synced.** `durable` moves only to what an fdatasync of the mirror covered,
//!   and never back; it is acknowledged to the primary when it moves.
//! - The writer syncs every [`SYNC_BYTES`], after a burst that woke it from idle, when nothing
//!   more came for a whole [`WRITE_EVERY`], when a `Fetch` asks, and before it stops.
//! - **A failure stops the stream**: the writer records why, and the receiver ends at its next
//!   chunk with that reason.

use crate::replication::{send, SessionEnd, Writer};
use crate::sync::lock;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use stela_format::Lsn;
use stela_proto::repl::ReplMessage;
use stela_wal::mirror::{Chunk, Mirror};

/// How often a busy writer looks for chunks: it is not woken for each one (a wake-up per chunk
/// would compete for the CPU with the receiver and its acknowledgement), only when it was idle
/// or when `WRITE_BATCH` bytes are held.
const WRITE_EVERY: Duration = Duration::from_millis(1);
const WRITE_BATCH: usize = 4 << 20;

/// Bytes written unsynced after which a busy writer syncs: the primary's own write threshold, so
/// under load the standby syncs about as often as the primary does (the frames' sync bases make
/// it sync at least that often anyway). `replicated` acknowledgements never wait for it.
const SYNC_BYTES: usize = crate::config::WRITE_THRESHOLD;

/// How often a standby that holds its limit and waits for its disk tells the primary it is
/// alive (well within the link's deadline).
const ALIVE_WHILE_FULL: Duration = Duration::from_millis(100);

/// Most bytes held in memory before the receiver stops reading (and TCP slows the primary).
const HELD_BYTES: usize = 64 << 20;

/// A chunk held: its segment, its offset there, its bytes.
pub(super) type Held = (Lsn, u64, Vec<u8>);

/// Chunks checked and held in memory, between the receiving thread and the writer.
pub(super) struct Pipe {
    pub(super) state: Mutex<PipeState>,
    pub(super) changed: Condvar,
    /// Acknowledgements go out from both threads.
    pub(super) socket: Mutex<Writer>,
    pub(super) term: u64,
    /// This node: its epoch is checked before every acknowledgement.
    pub(super) node: Arc<crate::cluster::Node>,
    /// When the stream began, and the last message from the primary since then (ms): the
    /// link's deadline is measured from it (`watch_primary`).
    pub(super) started: std::time::Instant,
    pub(super) heard_ms: AtomicU64,
}

#[derive(Default)]
pub(super) struct PipeState {
    pub(super) chunks: VecDeque<Held>,
    pub(super) bytes: usize,
    pub(super) received: u64,
    pub(super) durable: u64,
    pub(super) closed: bool,
    pub(super) failed: Option<SessionEnd>,
    /// The writer sleeps until told (nothing came for a whole `WRITE_EVERY`).
    pub(super) writer_idle: bool,
    /// Someone needs everything held synced (a `Fetch` reads back only synced records); the
    /// writer clears it after that sync.
    pub(super) sync_asked: bool,
}

impl Pipe {
    /// A message from the primary arrived.
    pub(super) fn heard(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.heard_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// How long the primary has sent nothing.
    pub(super) fn silent(&self) -> Duration {
        let heard = Duration::from_millis(self.heard_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(heard)
    }

    /// Tells the primary what this copy holds, unless this node has seen a newer epoch than the
    /// stream's since the stream began (it promised in an election): what it acknowledges then
    /// could be missing from the position it promised with, so the stream ends instead.
    pub(super) fn ack(&self, term: u64) -> Result<(), SessionEnd> {
        let (stream_epoch, ours) = (self.term >> 32, self.node.epoch());
        if self.node.clustered_node() && ours > stream_epoch {
            return Err(SessionEnd::Fenced(format!(
                "this node has seen epoch {ours}: it acknowledges nothing in epoch {stream_epoch} any more"
            )));
        }
        let (received, durable) = {
            let state = lock(&self.state);
            (state.received, state.durable)
        };
        debug_assert!(
            durable <= received,
            "nothing is durable that was not received"
        );
        send(
            &mut *lock(&self.socket),
            &ReplMessage::Ack {
                term,
                received_lsn: received,
                durable_lsn: durable,
            },
        )
    }

    /// Holds `chunk` (checked; its last LSN `last`), waiting while [`HELD_BYTES`] are held.
    /// Returns whether the writer should be woken for it.
    pub(super) fn hold(&self, chunk: Held, last: u64, chunk_term: u64) -> Result<bool, SessionEnd> {
        let mut state = lock(&self.state);
        while state.bytes > HELD_BYTES && state.failed.is_none() {
            let (next, waited) = self
                .changed
                .wait_timeout(state, ALIVE_WHILE_FULL)
                .unwrap_or_else(|e| e.into_inner());
            state = next;
            if waited.timed_out() {
                // Still here, only waiting for this node's disk: the primary hears so
                // within its link deadline and keeps the stream.
                drop(state);
                self.ack(chunk_term)?;
                state = lock(&self.state);
            }
        }
        if let Some(why) = &state.failed {
            return Err(why.clone());
        }
        debug_assert!(last >= state.received, "held chunks go forward");
        state.bytes += chunk.2.len();
        state.chunks.push_back(chunk);
        state.received = last;
        Ok(state.writer_idle || state.bytes >= WRITE_BATCH)
    }

    /// Has the writer sync all it holds; returns what is durable then.
    pub(super) fn sync_all(&self) -> u64 {
        let mut state = lock(&self.state);
        state.sync_asked = true;
        self.changed.notify_all();
        while state.sync_asked && state.failed.is_none() {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.durable
    }

    /// The stream ended: the writer writes and syncs what is held, then stops.
    pub(super) fn close(&self) {
        lock(&self.state).closed = true;
        self.changed.notify_all();
    }
}

/// What the writer took in one turn.
struct Batch {
    held: VecDeque<Held>,
    /// Their bytes, still counted as held until written.
    bytes: usize,
    /// Woken from idle: a lone burst, synced at once (under load the writer never idles).
    was_idle: bool,
    /// The stream closed and this is the last of what it held.
    closed: bool,
    /// A `Fetch` asked for a sync and this is the last of what is held.
    sync_asked: bool,
}

/// The writer: takes the chunks held (up to `WRITE_BATCH` at a time), writes those that
/// continue each other as one write, syncs when `SYNC_BYTES` are written unsynced, after a
/// burst that woke it from idle, when nothing more came for a whole `WRITE_EVERY`, when asked
/// (a `Fetch`) and before it stops, and says what is durable. A failure stops it and the
/// stream.
/// Returns where the copy ends (its last LSN, written and synced) once the stream closed and
/// everything it held is written; `None` after a failure.
pub(super) fn write_behind(mut mirror: Mirror, pipe: &Pipe, log: &str) -> Option<u64> {
    let mut unsynced = 0usize;
    loop {
        let mut batch = take_batch(pipe, unsynced);
        let durable_before = mirror.durable_lsn();
        if let Err(why) = write_batch(&mut mirror, &mut batch, &mut unsynced) {
            tracing::error!(
                log,
                why = %why,
                "standby: writing the mirror failed; it is stopped"
            );
            lock(&pipe.state).failed = Some(why);
            pipe.changed.notify_all();
            return None;
        }
        // A sync here, or one the mirror made before a frame that needed it, moved what is
        // durable: say so (the primary's status and the standby's followers read it). A sync
        // asked for by a `Fetch` moves nothing (that session receives no chunk) and is not
        // acknowledged: the primary reading the records back takes only chunks.
        let moved = mirror.durable_lsn() > durable_before;
        {
            let mut state = lock(&pipe.state);
            state.bytes -= batch.bytes;
            if moved || batch.sync_asked {
                debug_assert!(
                    mirror.durable_lsn() >= state.durable,
                    "durable never goes back"
                );
                state.durable = mirror.durable_lsn();
                state.sync_asked = false;
            }
        }
        // The receiver may be waiting for room, a `Fetch` for the sync.
        pipe.changed.notify_all();
        if moved {
            let _ = pipe.ack(pipe.term);
        }
        if batch.closed {
            return Some(mirror.received_lsn());
        }
    }
}

/// Waits for something to do and takes it: chunks held, a close, a sync asked for, or (with
/// `unsynced` bytes written) a quiet stream.
fn take_batch(pipe: &Pipe, unsynced: usize) -> Batch {
    let mut was_idle = false;
    let mut state = lock(&pipe.state);
    let mut waited_empty = false;
    loop {
        if !state.chunks.is_empty() || state.closed || state.sync_asked {
            break;
        }
        if waited_empty && unsynced > 0 {
            // Idle: what is written becomes durable now, not at the next burst.
            break;
        }
        if waited_empty {
            state.writer_idle = true;
            state = pipe.changed.wait(state).unwrap_or_else(|e| e.into_inner());
            state.writer_idle = false;
            was_idle = true;
        } else {
            state = pipe
                .changed
                .wait_timeout(state, WRITE_EVERY)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            waited_empty = state.chunks.is_empty();
        }
    }
    // At most `WRITE_BATCH` at a time (and at least a chunk): what is taken stays counted in
    // `bytes` until it is written, so no more than `HELD_BYTES` are ever held, in the queue and
    // in this thread together.
    let mut held = VecDeque::new();
    let mut bytes = 0;
    while bytes < WRITE_BATCH {
        let Some(chunk) = state.chunks.pop_front() else {
            break;
        };
        bytes += chunk.2.len();
        held.push_back(chunk);
    }
    debug_assert!(bytes <= state.bytes, "what is taken was counted as held");
    // Closing, and a `Fetch`'s sync, are acted on once nothing more is held.
    let rest_held = !state.chunks.is_empty();
    Batch {
        held,
        bytes,
        was_idle,
        closed: state.closed && !rest_held,
        sync_asked: state.sync_asked && !rest_held,
    }
}

/// Writes what `batch` holds, and syncs if it is time (counting `unsynced` bytes).
fn write_batch(
    mirror: &mut Mirror,
    batch: &mut Batch,
    unsynced: &mut usize,
) -> Result<(), SessionEnd> {
    let held = std::mem::take(&mut batch.held);
    // Nothing new: the stream went quiet with bytes unsynced (or a sync was asked for).
    let quiet = held.is_empty();
    for (segment_start, offset, bytes) in contiguous_runs(held) {
        *unsynced += bytes.len();
        mirror.apply(Chunk {
            segment_start,
            offset,
            bytes: &bytes,
        })?;
    }
    if quiet || batch.was_idle || batch.closed || batch.sync_asked || *unsynced >= SYNC_BYTES {
        *unsynced = 0;
        mirror.sync().map_err(SessionEnd::storage)?;
    }
    Ok(())
}

/// Chunks in order, those that continue each other (same segment, next offset) joined into one,
/// so that a burst of small chunks costs one write.
fn contiguous_runs(chunks: VecDeque<Held>) -> Vec<Held> {
    let mut runs: Vec<Held> = Vec::new();
    for (segment_start, offset, bytes) in chunks {
        match runs.last_mut() {
            Some((start, at, run))
                if *start == segment_start && *at + run.len() as u64 == offset =>
            {
                run.extend_from_slice(&bytes);
            }
            _ => runs.push((segment_start, offset, bytes)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::contiguous_runs;
    use std::collections::VecDeque;
    use stela_format::Lsn;

    #[test]
    fn chunks_that_continue_each_other_are_written_as_one() {
        let chunk = |segment: u64, offset: u64, len: usize| {
            (Lsn::new(segment), offset, vec![offset as u8; len])
        };
        let chunks = VecDeque::from([
            chunk(1, 0, 40),
            chunk(1, 40, 10),
            chunk(1, 50, 5),
            // A new segment, the same empty segment shipped again, and a gap: each its own.
            chunk(9, 0, 40),
            chunk(9, 0, 40),
            chunk(9, 60, 8),
            chunk(9, 68, 2),
        ]);
        let runs = contiguous_runs(chunks);
        let shape: Vec<(u64, u64, usize)> = runs
            .iter()
            .map(|(segment, offset, bytes)| (segment.get(), *offset, bytes.len()))
            .collect();
        assert_eq!(shape, [(1, 0, 55), (9, 0, 40), (9, 0, 40), (9, 60, 10)]);
        let mut joined = vec![0u8; 40];
        joined.extend([40; 10]);
        joined.extend([50; 5]);
        assert_eq!(runs[0].2, joined, "bytes kept in order");
    }
}
