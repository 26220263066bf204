//! The replication connection's bytes: one framed message written or read (blocking, bounded
//! by the frame limit, a body read only as it arrives), and the TCP settings of the stream.
//!
//! Invariants:
//! - **Bounded before read.** A frame's header is checked against its limit before a byte of
//!   its body is read, and the body buffer grows only with what arrived.

use super::error::SessionEnd;
use std::io::{Read, Write};
use std::net::TcpStream;
use stela_proto::repl::ReplMessage;
use stela_proto::{frame, MAX_FRAME_BYTES};

/// Writes one framed message.
pub(crate) fn send(writer: &mut impl Write, message: &ReplMessage) -> Result<(), SessionEnd> {
    let mut out = Vec::new();
    frame::encode(message, &mut out)?;
    Ok(writer.write_all(&out)?)
}

/// Reads one framed message (blocking).
pub(crate) fn receive(reader: &mut impl Read) -> Result<ReplMessage, SessionEnd> {
    let mut header = [0u8; stela_proto::FRAME_HEADER_BYTES];
    reader.read_exact(&mut header)?;
    let parsed = frame::parse_header(header, MAX_FRAME_BYTES)?;
    debug_assert!(
        parsed.body_len <= MAX_FRAME_BYTES,
        "a body is bounded before it is read"
    );
    // The body is read as it arrives: a peer announcing a large body and sending nothing costs
    // no more than what it sent.
    let mut body = Vec::new();
    reader.take(parsed.body_len as u64).read_to_end(&mut body)?;
    if body.len() != parsed.body_len {
        return Err(SessionEnd::Link(
            "the peer closed the connection inside a frame".into(),
        ));
    }
    Ok(frame::decode_body(parsed, &body)?)
}

/// Sets the replication stream's TCP options (`stela_net::tcp`) on `stream`; says once per
/// process which ones this kernel lacks (the stream then keeps those defaults).
pub(crate) fn tune_stream(stream: &TcpStream) {
    static TOLD: std::sync::Once = std::sync::Once::new();
    let tuned = stela_net::tcp::tune_for_loss(stream);
    if !tuned.all() {
        TOLD.call_once(|| {
            tracing::warn!(?tuned, "this kernel lacks some of the replication stream's TCP settings: a lost segment stalls replicated commits longer");
        });
    }
}

/// One end of a replication connection (plain TCP, or TLS through `stela_net::duplex`).
pub(crate) type Reader = Box<dyn Read + Send>;
pub(crate) type Writer = Box<dyn Write + Send>;
