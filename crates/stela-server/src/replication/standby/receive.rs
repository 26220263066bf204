//! The standby's receiving loop: takes the primary's messages off one stream, checks each chunk
//! against the copy as it will be once everything held is written, holds it for the writer
//! ([`super::writer`]) and acknowledges it; answers a `Fetch` with the synced records; follows
//! the primary's truncation; watches the link's deadline.
//!
//! Invariants:
//! - **Acknowledged means held.** `received_lsn` goes out only after the chunk is checked (it
//!   continues the copy: offsets, CRCs, LSNs) and held in the pipe; an acknowledgement is
//!   deferred only while another whole frame is already buffered, and sent before any wait for
//!   input.
//! - **A term enters the history before the first record of it is held** ([`super::fencing`]).
//! - **Truncation follows, never leads**: segments are removed only below what the primary's
//!   copy begins at, what this copy holds synced and every follower's hold.

use super::fencing::{adopt_terms, begin_from_chunk, check_message};
use super::writer::Pipe;
use crate::cluster::Node;
use crate::replication::{receive, send, Reader, SessionEnd};
use crate::sync::lock;
use std::io::BufReader;
use std::net::TcpStream;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use stela_proto::repl::{chunk_bytes, ReplMessage};
use stela_wal::mirror::{Checker, Chunk};
use stela_wal::storage::Storage;
use stela_wal::{SegmentSet, TermStore};

/// How often the standby retries cutting its copy to where the primary's begins while a hold
/// keeps it from getting there.
const RETRY_CUT_EVERY: Duration = Duration::from_secs(1);

/// The receiving side of one stream, between messages.
struct Receiver<'a> {
    reader: &'a mut BufReader<Reader>,
    checker: &'a mut Checker,
    terms: &'a mut TermStore,
    /// The primary's term history, as its `Open` sent it.
    primary_history: &'a [(u64, u64)],
    pipe: &'a Pipe,
    storage: &'a dyn Storage,
    segments: &'a SegmentSet,
    /// The term of chunks held but not yet acknowledged. Acknowledging is deferred only while
    /// another whole frame is already buffered, that is, while this thread is behind the
    /// primary: one acknowledgement then covers them all, and is sent before any wait for input.
    owed_ack: Option<u64>,
    /// Where the primary's copy begins, once it has said, and when this copy was last cut to
    /// it: a follower's hold may move up later, so the cut is retried now and then.
    primary_first: Option<u64>,
    cut_at: Instant,
}

/// The receiving side: checks each chunk against the copy as it will be once everything held
/// is written, holds it, says it is received. Returns only with the reason the stream ends.
pub(super) fn receive_chunks(
    reader: &mut BufReader<Reader>,
    mut first: Option<ReplMessage>,
    checker: &mut Checker,
    (terms, primary_history): (&mut TermStore, &[(u64, u64)]),
    pipe: &Pipe,
    (storage, segments): (&dyn Storage, &SegmentSet),
    node: &Node,
) -> Result<(), SessionEnd> {
    let mut receiver = Receiver {
        reader,
        checker,
        terms,
        primary_history,
        pipe,
        storage,
        segments,
        owed_ack: None,
        primary_first: None,
        cut_at: Instant::now(),
    };
    loop {
        let message = match first.take() {
            Some(message) => message,
            None => receiver.next()?,
        };
        node.heard_from_primary();
        pipe.heard();
        receiver.take(message, node)?;
    }
}

impl Receiver<'_> {
    /// The next message, once what is owed is acknowledged if reading may wait.
    fn next(&mut self) -> Result<ReplMessage, SessionEnd> {
        if !whole_frame_buffered(self.reader.buffer()) {
            if let Some(term) = self.owed_ack.take() {
                self.pipe.ack(term)?;
            }
        }
        receive(self.reader)
    }

    /// Acts on one message of the primary's.
    fn take(&mut self, message: ReplMessage, node: &Node) -> Result<(), SessionEnd> {
        if let ReplMessage::Fetch {
            term,
            segment_start,
            offset,
            next_lsn,
        } = message
        {
            let from = (segment_start, offset, next_lsn);
            return send_back(
                term,
                from,
                self.checker,
                self.terms,
                self.pipe,
                self.segments,
                &node.name,
            );
        }
        check_message(node, self.terms, message.term())?;
        if let ReplMessage::Truncated { first_lsn, .. } = &message {
            self.primary_first = Some(*first_lsn);
        }
        self.follow_truncation(matches!(message, ReplMessage::Truncated { .. }));
        match message {
            ReplMessage::Chunk {
                term,
                segment_start,
                offset,
                raw_len,
                compressed,
                bytes,
            } => {
                let bytes =
                    chunk_bytes(raw_len, compressed, bytes).map_err(SessionEnd::protocol)?;
                self.hold(term, stela_format::Lsn::new(segment_start), offset, bytes)
            }
            // Answered, so that the primary hears from this standby on an idle stream too
            // (links are checked both ways).
            ReplMessage::Heartbeat { term } if self.owed_ack.is_none() => self.pipe.ack(term),
            ReplMessage::Heartbeat { .. } | ReplMessage::Truncated { .. } => Ok(()),
            message => Err(SessionEnd::Protocol(format!("unexpected {message:?}"))),
        }
    }

    /// Cuts this copy to where the primary's begins: when told, else at most once a second
    /// (the segment list's lock is not taken for every chunk).
    fn follow_truncation(&mut self, told: bool) {
        let Some(first_lsn) = self.primary_first else {
            return;
        };
        if !told && self.cut_at.elapsed() < RETRY_CUT_EVERY {
            return;
        }
        self.cut_at = Instant::now();
        if first_lsn > self.segments.first_lsn().get() {
            let durable = lock(&self.pipe.state).durable;
            follow_truncation(self.storage, self.segments, first_lsn, durable);
        }
    }

    /// Checks a chunk, enters its term, holds it and acknowledges it (or owes the
    /// acknowledgement while the next frame is already buffered).
    fn hold(
        &mut self,
        chunk_term: u64,
        segment_start: stela_format::Lsn,
        offset: u64,
        bytes: Vec<u8>,
    ) -> Result<(), SessionEnd> {
        let before = self.checker.position().next_lsn.get();
        let chunk = Chunk {
            segment_start,
            offset,
            bytes: &bytes,
        };
        let next = self.checker.check(chunk)?;
        debug_assert!(next >= before, "a checked chunk never moves the copy back");
        // A term enters the history before the first record of it is held: at the LSN the
        // primary's history gives it; from a primary that sends none, where its first chunk
        // starts.
        if self.primary_history.is_empty() {
            begin_from_chunk(self.terms, chunk_term, before)?;
        } else {
            adopt_terms(self.terms, self.primary_history, next)?;
        }
        let wake_writer = self
            .pipe
            .hold((segment_start, offset, bytes), next - 1, chunk_term)?;
        if whole_frame_buffered(self.reader.buffer()) {
            self.owed_ack = Some(chunk_term);
        } else {
            // Acknowledged before the writer is woken: the primary's commit waits for this
            // message, and nothing else.
            self.owed_ack = None;
            self.pipe.ack(chunk_term)?;
        }
        if wake_writer {
            self.pipe.changed.notify_all();
        }
        Ok(())
    }
}

/// The primary's copy now begins at `first_lsn`: removes this copy's whole segments below it,
/// but never past `durable` (what this copy holds synced) nor past the lowest hold of a follower
/// reading the copy (`stela_wal::holds`). A failure to remove is reported and the stream goes
/// on: the copy keeps more than it must, which loses nothing.
fn follow_truncation(storage: &dyn Storage, segments: &SegmentSet, first_lsn: u64, durable: u64) {
    let (held, unreadable) = stela_wal::holds::lowest_of_followers(storage, segments.dir());
    for why in &unreadable {
        tracing::warn!(hold = %why, "standby: a follower's hold cannot be read; the copy keeps everything from LSN 1");
    }
    let held = held.map_or(u64::MAX, |lsn| lsn.get());
    let cut = first_lsn.min(durable.saturating_add(1)).min(held);
    match segments.truncate_before(stela_format::Lsn::new(cut)) {
        Ok(0) => {}
        Ok(removed) => tracing::info!(
            dir = %segments.dir().display(),
            removed,
            before = cut,
            primary_first = first_lsn,
            "standby: removed the segments the primary truncated"
        ),
        Err(error) => {
            tracing::warn!(%error, "standby: could not remove segments the primary truncated")
        }
    }
}

/// Whether `buffered` starts with a whole frame (header and body), so reading it cannot wait.
pub(super) fn whole_frame_buffered(buffered: &[u8]) -> bool {
    let Some(header) = buffered.get(..stela_proto::FRAME_HEADER_BYTES) else {
        return false;
    };
    let body_len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    buffered.len() - stela_proto::FRAME_HEADER_BYTES >= body_len
}

/// Answers a `Fetch`: the synced records from `from` on, as chunks read from the files, then
/// where this copy stands.
fn send_back(
    term: u64,
    (segment_start, offset, next_lsn): (u64, u64, u64),
    checker: &Checker,
    terms: &TermStore,
    pipe: &Pipe,
    segments: &SegmentSet,
    node: &str,
) -> Result<(), SessionEnd> {
    let mut at = stela_wal::mirror::Position {
        segment_start: stela_format::Lsn::new(segment_start),
        offset,
        next_lsn: stela_format::Lsn::new(next_lsn.max(1)),
    };
    // Only what the writer has synced is read back from the files: have it sync all it holds.
    let durable = pipe.sync_all();
    let mut sent = 0u64;
    let until = stela_format::Lsn::new(durable + 1);
    while let Some((segment, offset, bytes, next)) =
        stela_wal::mirror::read_chunk(segments, at, until, 1 << 20)?
    {
        sent += bytes.len() as u64;
        let chunk = stela_proto::repl::chunk_message(term, segment.get(), offset, &bytes);
        send(&mut *lock(&pipe.socket), &chunk)?;
        // The primary waits for these and sends nothing meanwhile: the link's deadline runs
        // from each chunk it takes (a send blocked on a dead link holds this up instead).
        pipe.heard();
        at = stela_wal::mirror::Position {
            segment_start: segment,
            offset: offset + bytes.len() as u64,
            next_lsn: next,
        };
    }
    tracing::info!(
        from = next_lsn,
        to = at.next_lsn.get() - 1,
        bytes = sent,
        "standby: sent back what the primary lacked"
    );
    let position = position_message(term, checker.position(), durable, terms, node);
    send(&mut *lock(&pipe.socket), &position)?;
    pipe.heard();
    Ok(())
}

/// Where this copy stands, as the primary is told it (after `Open`, and after a `Fetch`), with
/// this node's name (which standby it is, for a planned switchover).
pub(super) fn position_message(
    term: u64,
    position: stela_wal::mirror::Position,
    durable_lsn: u64,
    terms: &TermStore,
    node: &str,
) -> ReplMessage {
    ReplMessage::Position {
        term,
        segment_start: position.segment_start.get(),
        offset: position.offset,
        next_lsn: position.next_lsn.get(),
        durable_lsn,
        history: terms
            .history()
            .entries()
            .iter()
            .map(|&(t, f)| (t.0, f))
            .collect(),
        node: node.to_owned(),
    }
}

/// Watches a stream's link from the standby's side: once the primary has sent nothing (no
/// chunk, not even a heartbeat) for the link's deadline, cuts the socket, which ends the
/// receiver's read whatever the transport (a socket read timeout does not reach the TLS
/// layer's own I/O thread). The log is then free for the primary's next stream at once,
/// rather than once TCP notices the dead connection. Ends when the stream closes.
pub(super) fn watch_primary(
    pipe: Arc<Pipe>,
    socket: TcpStream,
    log: &str,
) -> std::io::Result<JoinHandle<()>> {
    let deadline = crate::replication::LINK_DEADLINE;
    let log = log.to_owned();
    std::thread::Builder::new()
        .name("stela-mirror-watch".into())
        .spawn(move || loop {
            std::thread::park_timeout(deadline / 4);
            let (closed, syncing_for_fetch) = {
                let state = lock(&pipe.state);
                (state.closed, state.sync_asked)
            };
            if closed {
                return;
            }
            // A `Fetch` waits for this node's own sync, not for the primary.
            if syncing_for_fetch {
                pipe.heard();
                continue;
            }
            let silent = pipe.silent();
            if silent > deadline {
                tracing::warn!(log, silent_ms = silent.as_millis() as u64,
                    "standby: nothing from the primary within the link's deadline; the stream is torn down");
                let _ = socket.shutdown(std::net::Shutdown::Both);
                return;
            }
        })
}

#[cfg(test)]
mod tests {
    use super::whole_frame_buffered;
    use stela_proto::repl::ReplMessage;

    #[test]
    fn only_a_whole_buffered_frame_defers_an_acknowledgement() {
        let mut frame = Vec::new();
        stela_proto::frame::encode(&ReplMessage::Heartbeat { term: 7 }, &mut frame).unwrap();
        assert!(whole_frame_buffered(&frame));
        for cut in 0..frame.len() {
            assert!(
                !whole_frame_buffered(&frame[..cut]),
                "{cut} of {} bytes",
                frame.len()
            );
        }
        let mut two = frame.clone();
        two.extend_from_slice(&frame[..3]);
        assert!(whole_frame_buffered(&two));
    }
}
