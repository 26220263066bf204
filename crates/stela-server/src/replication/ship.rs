//! Sending a log's bytes to the standby: from the pool's buffers, or from the files when the
//! standby is further behind, by the log's shipper thread or, without blocking, by the event
//! loop for a waiting `replicated` commit.
//!
//! Invariants:
//! - **One sender at a time.** Bytes go out only under the link's `live` lock; a frame the
//!   event loop could send only in part is finished by the shipper before anything else, so
//!   frames never interleave.
//! - **Byte for byte.** A chunk is the primary's segment bytes at their offset; a segment the
//!   standby has not started goes with the header the flusher writes (or wrote) for it.

use super::{
    chunk_message, send, Link, LogInfo, SessionEnd, Writer, CHUNK_BYTES, INLINE_CHUNKS, SENT_KEPT,
};
use crate::pool::{LogId, Pool, Ship};
use crate::sync::lock;
use std::io::Write;
use std::net::TcpStream;
use std::sync::TryLockError;
use stela_format::header::HEADER_BYTES;
use stela_format::{Lsn, SegmentHeader, TypeTag};
use stela_proto::frame;
use stela_proto::repl::ReplMessage;
use stela_wal::mirror::{read_chunk, Position};
use stela_wal::SegmentSet;

/// The sending end of an open stream and where it stands. Whoever holds the link's `live` lock
/// sends, so frames never interleave and `at` always follows what went out.
pub(super) struct Live {
    pub(super) writer: Writer,
    /// The socket itself when the stream is plain TCP: the event loop sends on it without
    /// blocking (a TLS stream is left to the shipper).
    pub(super) plain: Option<TcpStream>,
    pub(super) term: u64,
    /// Where the next bytes go in the standby's copy.
    pub(super) at: Position,
    /// The header of the segment `at` is in.
    pub(super) header: SegmentHeader,
    /// The rest of a frame the event loop began but could not finish without blocking; the
    /// shipper writes it before anything else.
    pub(super) unfinished: Vec<u8>,
}

/// What one attempt to ship did.
pub(super) enum Step {
    Shipped,
    /// Everything in the pool is shipped.
    Nothing,
    /// There is more, but not for a caller that must not block (the event loop).
    LeftToShipper,
}

/// Where a shipper may take bytes from.
pub(super) enum Source<'a> {
    /// The pool's buffers only, without blocking (the event loop).
    Memory,
    /// The buffers, else the log's files; writes may block (the shipper thread).
    MemoryOrFiles(&'a LogInfo),
}

/// The event loop's part: sends what the pool holds of `link`'s log, if the stream is plain TCP
/// and no one else is sending. `true`: all of it went out; `false`: the shipper must be woken.
pub(super) fn ship_inline<W>(pool: &Pool<W>, log: LogId, link: &Link) -> bool {
    let mut guard = match link.live.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => return false,
    };
    let Some(live) = guard.as_mut().filter(|live| live.plain.is_some()) else {
        return false;
    };
    for _ in 0..INLINE_CHUNKS {
        match ship_next(pool, log, link, live, Source::Memory) {
            Ok(Step::Shipped) => {}
            Ok(Step::Nothing) => return true,
            Ok(Step::LeftToShipper) => return false,
            Err(why) => {
                // The shipper meets the broken stream on its next send and reconnects.
                tracing::debug!(log = %link.name, why = %why, "sending from the event loop failed");
                if let Some(socket) = &live.plain {
                    let _ = socket.shutdown(std::net::Shutdown::Both);
                }
                return false;
            }
        }
    }
    false
}

/// Bytes to ship: (segment, offset, bytes, next LSN, capacity of a new segment or 0).
type Taken = (u64, u64, Vec<u8>, u64, u64);

/// Ships the next bytes of `log` after `live.at`: from the pool's buffers when it still holds
/// them, else (a shipper thread only) from the files.
pub(super) fn ship_next<W>(
    pool: &Pool<W>,
    log: LogId,
    link: &Link,
    live: &mut Live,
    source: Source<'_>,
) -> Result<Step, SessionEnd> {
    let blocking = matches!(source, Source::MemoryOrFiles(_));
    if !live.unfinished.is_empty() {
        if !blocking {
            return Ok(Step::LeftToShipper);
        }
        live.writer.write_all(&live.unfinished)?;
        live.unfinished.clear();
    }
    let (segment, offset, bytes, next_lsn, capacity) = match take_next(pool, log, live, &source)? {
        Ok(taken) => taken,
        Err(step) => return Ok(step),
    };
    let Some((offset, bytes)) = with_header(live, &source, (segment, offset, bytes, capacity))?
    else {
        return Ok(Step::LeftToShipper); // the header may have to be read from a file
    };
    let message = chunk_message(live.term, segment, offset, &bytes);
    if !send_chunk(live, &message, blocking)? {
        return Ok(Step::LeftToShipper); // nothing of the frame went out: as if not tried
    }
    if let ReplMessage::Chunk { bytes: wire, .. } = &message {
        count_sent(link, (segment, offset, &bytes, next_lsn), wire.len());
    }
    let before = live.at;
    live.at = Position {
        segment_start: Lsn::new(segment),
        offset: offset + bytes.len() as u64,
        next_lsn: Lsn::new(next_lsn),
    };
    debug_assert!(
        live.at.next_lsn >= before.next_lsn,
        "shipping never goes back"
    );
    if live.unfinished.is_empty() {
        Ok(Step::Shipped)
    } else {
        Ok(Step::LeftToShipper)
    }
}

/// The next bytes after `live.at`: from the pool, else from the files (a shipper thread only).
/// `Ok(Err(step))`: nothing to take now, and why.
fn take_next<W>(
    pool: &Pool<W>,
    log: LogId,
    live: &Live,
    source: &Source<'_>,
) -> Result<Result<Taken, Step>, SessionEnd> {
    let at = live.at;
    let from = (at.segment_start.get(), at.offset, at.next_lsn.get());
    match pool.ship(log, from, CHUNK_BYTES) {
        Ship::Bytes {
            segment,
            offset,
            bytes,
            next_lsn,
            new_segment_capacity,
        } => Ok(Ok((segment, offset, bytes, next_lsn, new_segment_capacity))),
        Ship::OnDisk => match source {
            Source::Memory => Ok(Err(Step::LeftToShipper)),
            Source::MemoryOrFiles(info) => {
                let (_, durable) = pool.positions(log);
                match read_chunk(&info.segments, at, Lsn::new(durable + 1), CHUNK_BYTES)? {
                    Some((segment, offset, bytes, next)) => {
                        Ok(Ok((segment.get(), offset, bytes, next.get(), 0)))
                    }
                    None => Ok(Err(Step::Nothing)),
                }
            }
        },
        Ship::Nothing => Ok(Err(Step::Nothing)),
    }
}

/// A segment the standby has not started yet goes with its header, exactly as the flusher
/// writes it: the chunk's offset and bytes, header included. `None`: the header would have to
/// be read from a file, which only the shipper thread does.
fn with_header(
    live: &mut Live,
    source: &Source<'_>,
    (segment, mut offset, mut bytes, capacity): (u64, u64, Vec<u8>, u64),
) -> Result<Option<(u64, Vec<u8>)>, SessionEnd> {
    if offset == HEADER_BYTES as u64 {
        if segment != live.header.start_lsn.get() {
            let Source::MemoryOrFiles(info) = source else {
                return Ok(None);
            };
            live.header = header_for(
                &info.segments,
                Lsn::new(segment),
                info,
                Some((&live.header, capacity)),
            )?;
        }
        let mut whole = live.header.encode().to_vec();
        whole.append(&mut bytes);
        bytes = whole;
        offset = 0;
    }
    if offset == 0 {
        // A header read from the files: later segments are numbered after it.
        if let Ok(read) = SegmentHeader::decode(&bytes[..HEADER_BYTES.min(bytes.len())]) {
            live.header = read;
        }
    }
    Ok(Some((offset, bytes)))
}

/// Sends `message`: blocking (the shipper), or without blocking on the plain socket (the event
/// loop), the rest of a frame sent in part left in `live.unfinished`. `false`: nothing of it
/// went out.
fn send_chunk(live: &mut Live, message: &ReplMessage, blocking: bool) -> Result<bool, SessionEnd> {
    let mut out = Vec::new();
    frame::encode(message, &mut out)?;
    if blocking {
        live.writer.write_all(&out)?;
        return Ok(true);
    }
    let socket = live
        .plain
        .as_ref()
        .ok_or_else(|| SessionEnd::Stopped("no plain socket".into()))?;
    let sent = match rustix::net::send(
        socket,
        &out,
        rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL,
    ) {
        Ok(sent) => sent,
        Err(rustix::io::Errno::AGAIN) => 0,
        Err(error) => return Err(SessionEnd::link(error)),
    };
    if sent == 0 {
        return Ok(false);
    }
    // Part of the frame is on the wire: the shipper finishes it before anything else.
    live.unfinished.extend_from_slice(&out[sent..]);
    Ok(true)
}

/// Counts a chunk shipped (its segment bytes, the bytes it took on the wire) and where it ends,
/// for the lag `stela status` shows.
fn count_sent(
    link: &Link,
    (segment, offset, bytes, next_lsn): (u64, u64, &[u8], u64),
    wire: usize,
) {
    let mut state = lock(&link.state);
    state.shipped_bytes += bytes.len() as u64;
    state.wire_bytes += wire as u64;
    if state.sent.len() == SENT_KEPT {
        let forgotten = state
            .sent
            .pop_front()
            .map(|(_, segment, end)| (segment, end));
        state.acked_at = state.acked_at.max(forgotten);
    }
    let end = (next_lsn - 1, segment, offset + bytes.len() as u64);
    state.sent.push_back(end);
    debug_assert!(state.sent.len() <= SENT_KEPT);
}

impl Live {
    /// Sends `message` after whatever the event loop left unfinished (the shipper thread).
    pub(super) fn send(&mut self, message: &ReplMessage) -> Result<(), SessionEnd> {
        if !self.unfinished.is_empty() {
            self.writer.write_all(&self.unfinished)?;
            self.unfinished.clear();
        }
        send(&mut self.writer, message)
    }
}

/// The header of segment `start`: read from its file if the flusher created it, else derived
/// from `previous` (the next sequence number, the capacity new segments get) as the flusher will
/// create it.
pub(super) fn header_for(
    segments: &SegmentSet,
    start: Lsn,
    log: &LogInfo,
    previous: Option<(&SegmentHeader, u64)>,
) -> Result<SegmentHeader, SessionEnd> {
    let list = segments.list();
    if let Some(file) = list.iter().find(|s| s.start == start) {
        // Its first bytes only: this once read the whole 64 MiB file for them.
        return Ok(segments.read_header(&file.path)?);
    }
    let (seq, capacity) = match previous {
        Some((header, capacity)) => (header.segment_seq + 1, capacity),
        None => {
            let newest = list
                .last()
                .ok_or_else(|| SessionEnd::Storage("the log has no segment".into()))?;
            let header = segments.read_header(&newest.path)?;
            (header.segment_seq + 1, header.capacity)
        }
    };
    Ok(SegmentHeader {
        layout: stela_format::frame::Layout::CURRENT,
        codec: log.codec,
        segment_seq: seq,
        start_lsn: start,
        capacity,
        type_tag: TypeTag::new(&log.type_tag),
    })
}
