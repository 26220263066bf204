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

use super::{chunk_message, send, Link, LogInfo, Writer, CHUNK_BYTES, INLINE_CHUNKS, SENT_KEPT};
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
                tracing::debug!(log = %link.name, why, "sending from the event loop failed");
                if let Some(socket) = &live.plain {
                    let _ = socket.shutdown(std::net::Shutdown::Both);
                }
                return false;
            }
        }
    }
    false
}

/// Ships the next bytes of `log` after `live.at`: from the pool's buffers when it still holds
/// them, else (a shipper thread only) from the files.
pub(super) fn ship_next<W>(
    pool: &Pool<W>,
    log: LogId,
    link: &Link,
    live: &mut Live,
    source: Source<'_>,
) -> std::result::Result<Step, String> {
    let blocking = matches!(source, Source::MemoryOrFiles(_));
    if !live.unfinished.is_empty() {
        if !blocking {
            return Ok(Step::LeftToShipper);
        }
        live.writer
            .write_all(&live.unfinished)
            .map_err(|e| e.to_string())?;
        live.unfinished.clear();
    }
    let at = live.at;
    let shipped = match pool.ship(
        log,
        (at.segment_start.get(), at.offset, at.next_lsn.get()),
        CHUNK_BYTES,
    ) {
        Ship::Bytes {
            segment,
            offset,
            bytes,
            next_lsn,
            new_segment_capacity,
        } => (segment, offset, bytes, next_lsn, new_segment_capacity),
        Ship::OnDisk => match source {
            Source::Memory => return Ok(Step::LeftToShipper),
            Source::MemoryOrFiles(info) => {
                let (_, durable) = pool.positions(log);
                match read_chunk(&info.segments, at, Lsn::new(durable + 1), CHUNK_BYTES)
                    .map_err(|e| e.to_string())?
                {
                    Some((segment, offset, bytes, next)) => {
                        (segment.get(), offset, bytes, next.get(), 0)
                    }
                    None => return Ok(Step::Nothing),
                }
            }
        },
        Ship::Nothing => return Ok(Step::Nothing),
    };
    let (segment, mut offset, mut bytes, next_lsn, capacity) = shipped;
    // A segment the standby has not started yet goes with its header, exactly as the flusher
    // writes it.
    if offset == HEADER_BYTES as u64 {
        if segment != live.header.start_lsn.get() {
            let Source::MemoryOrFiles(info) = source else {
                return Ok(Step::LeftToShipper); // the header may have to be read from a file
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
    let message = chunk_message(live.term, segment, offset, &bytes);
    let mut out = Vec::new();
    frame::encode(&message, &mut out).map_err(|e| e.to_string())?;
    if blocking {
        live.writer.write_all(&out).map_err(|e| e.to_string())?;
    } else {
        let socket = live.plain.as_ref().ok_or("no plain socket")?;
        let sent = match rustix::net::send(
            socket,
            &out,
            rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL,
        ) {
            Ok(sent) => sent,
            Err(rustix::io::Errno::AGAIN) => 0,
            Err(error) => return Err(error.to_string()),
        };
        if sent == 0 {
            return Ok(Step::LeftToShipper); // nothing of the frame went out: as if not tried
        }
        // Part of the frame is on the wire: the shipper finishes it before anything else.
        live.unfinished.extend_from_slice(&out[sent..]);
    }
    if let ReplMessage::Chunk { bytes: wire, .. } = &message {
        let mut state = lock(&link.state);
        state.shipped_bytes += bytes.len() as u64;
        state.wire_bytes += wire.len() as u64;
        if state.sent.len() == SENT_KEPT {
            let forgotten = state
                .sent
                .pop_front()
                .map(|(_, segment, end)| (segment, end));
            state.acked_at = state.acked_at.max(forgotten);
        }
        let end = (next_lsn - 1, segment, offset + bytes.len() as u64);
        state.sent.push_back(end);
    }
    live.at = Position {
        segment_start: Lsn::new(segment),
        offset: offset + bytes.len() as u64,
        next_lsn: Lsn::new(next_lsn),
    };
    if live.unfinished.is_empty() {
        Ok(Step::Shipped)
    } else {
        Ok(Step::LeftToShipper)
    }
}

impl Live {
    /// Sends `message` after whatever the event loop left unfinished (the shipper thread).
    pub(super) fn send(&mut self, message: &ReplMessage) -> std::result::Result<(), String> {
        if !self.unfinished.is_empty() {
            self.writer
                .write_all(&self.unfinished)
                .map_err(|e| e.to_string())?;
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
) -> Result<SegmentHeader, String> {
    let list = segments.list();
    if let Some(file) = list.iter().find(|s| s.start == start) {
        // Its first bytes only: this once read the whole 64 MiB file for them.
        return segments.read_header(&file.path).map_err(|e| e.to_string());
    }
    let (seq, capacity) = match previous {
        Some((header, capacity)) => (header.segment_seq + 1, capacity),
        None => {
            let newest = list.last().ok_or("the log has no segment")?;
            let header = segments
                .read_header(&newest.path)
                .map_err(|e| e.to_string())?;
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
