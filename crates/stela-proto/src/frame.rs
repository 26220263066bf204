//! The frame envelope: `[body length: u32 LE][CRC32C of body: u32 LE][body]`.
//!
//! Invariants: a frame's body is never longer than the limit the reader passed in (at most
//! [`MAX_FRAME_BYTES`]), so a hostile length cannot make a reader allocate without bound; a
//! body whose checksum does not match is never decoded. Both are checked before any byte of the
//! body is interpreted.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{Read, Write};
use thiserror::Error;

/// Bytes before the body: length and checksum.
pub const FRAME_HEADER_BYTES: usize = 8;

/// The hard upper bound on a frame body (64 MiB). Readers may pass a lower limit.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// The largest frame body a daemon reads from a connection before its Hello is handled (and
/// the peer authenticated): a Hello's client name and token fit in it many times over, and a
/// peer that has proved nothing cannot make the daemon hold more.
pub const MAX_HELLO_FRAME_BYTES: usize = 4096;

/// Why bytes are not a valid frame or message. Each of these closes the connection it came from:
/// after a bad frame the reader cannot know where the next one starts.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame body of {len} bytes is over the limit of {limit} bytes")]
    TooLarge { len: usize, limit: usize },
    #[error(
        "frame checksum mismatch: header says {expected:#010x}, body hashes to {actual:#010x}"
    )]
    BadChecksum { expected: u32, actual: u32 },
    #[error("frame body is not a valid message: {0}")]
    BadMessage(String),
    #[error("message could not be encoded: {0}")]
    Encode(String),
}

/// The parsed header of a frame: how long its body is and what it must hash to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub body_len: usize,
    pub crc: u32,
}

/// Parses the 8 header bytes and enforces `limit` (clamped to [`MAX_FRAME_BYTES`]).
pub fn parse_header(
    header: [u8; FRAME_HEADER_BYTES],
    limit: usize,
) -> Result<FrameHeader, FrameError> {
    let body_len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let limit = limit.min(MAX_FRAME_BYTES);
    if body_len > limit {
        return Err(FrameError::TooLarge {
            len: body_len,
            limit,
        });
    }
    Ok(FrameHeader { body_len, crc })
}

/// Checks a body against its header's checksum and decodes the message in it.
pub fn decode_body<M: DeserializeOwned>(header: FrameHeader, body: &[u8]) -> Result<M, FrameError> {
    let actual = crc32c::crc32c(body);
    if actual != header.crc {
        return Err(FrameError::BadChecksum {
            expected: header.crc,
            actual,
        });
    }
    rmp_serde::from_slice(body).map_err(|e| FrameError::BadMessage(e.to_string()))
}

/// Appends one framed message to `out`.
pub fn encode<M: Serialize>(message: &M, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    rmp_serde::encode::write(out, message).map_err(|e| FrameError::Encode(e.to_string()))?;
    let body_len = out.len() - start - FRAME_HEADER_BYTES;
    if body_len > MAX_FRAME_BYTES {
        out.truncate(start);
        return Err(FrameError::TooLarge {
            len: body_len,
            limit: MAX_FRAME_BYTES,
        });
    }
    let crc = crc32c::crc32c(&out[start + FRAME_HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Why a blocking read of one frame ([`read_blocking`]) failed.
#[derive(Debug, Error)]
pub enum ReadError {
    /// Reading the header failed (the peer closed before a frame began, a timeout, ...).
    #[error("{0}")]
    Header(std::io::Error),
    /// Reading the body failed.
    #[error("{0}")]
    Body(std::io::Error),
    /// The peer closed the connection after the header, before the whole body.
    #[error("the peer closed the connection inside a frame")]
    Cut,
    /// The frame is too large, fails its checksum or does not decode.
    #[error("{0}")]
    Frame(#[from] FrameError),
}

/// Reads one framed message of at most `limit` body bytes from a blocking reader, into `body`
/// (cleared first; its capacity is reused). The body is read as it arrives, never allocated
/// from the header's length up front: a peer announcing a large body and sending nothing costs
/// no more than what it sent. The one blocking frame reader of the workspace: clients, the
/// witness and the benchmark driver read through it.
pub fn read_blocking_into<M: DeserializeOwned>(
    reader: &mut impl Read,
    limit: usize,
    body: &mut Vec<u8>,
) -> Result<M, ReadError> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    reader.read_exact(&mut header).map_err(ReadError::Header)?;
    let parsed = parse_header(header, limit)?;
    body.clear();
    reader
        .take(parsed.body_len as u64)
        .read_to_end(body)
        .map_err(ReadError::Body)?;
    if body.len() != parsed.body_len {
        return Err(ReadError::Cut);
    }
    Ok(decode_body(parsed, body)?)
}

/// [`read_blocking_into`] with a buffer of its own.
pub fn read_blocking<M: DeserializeOwned>(
    reader: &mut impl Read,
    limit: usize,
) -> Result<M, ReadError> {
    read_blocking_into(reader, limit, &mut Vec::new())
}

/// Why a blocking write of one frame ([`write_blocking`]) failed.
#[derive(Debug, Error)]
pub enum WriteError {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Encodes `message` as one frame and writes it whole to a blocking writer.
pub fn write_blocking<M: Serialize>(
    writer: &mut impl Write,
    message: &M,
) -> Result<(), WriteError> {
    let mut out = Vec::new();
    encode(message, &mut out)?;
    Ok(writer.write_all(&out)?)
}

/// Decodes the first frame in `buf`, if it is complete. `Ok(None)` means "need more bytes";
/// `Ok(Some((message, consumed)))` gives the message and the frame's length. Used by readers
/// that buffer (and by the fuzz target); blocking readers use [`parse_header`] + [`decode_body`].
pub fn decode_from<M: DeserializeOwned>(
    buf: &[u8],
    limit: usize,
) -> Result<Option<(M, usize)>, FrameError> {
    let Some(header_bytes) = buf.get(..FRAME_HEADER_BYTES) else {
        return Ok(None);
    };
    let header = parse_header(header_bytes.try_into().expect("8 bytes"), limit)?;
    let end = FRAME_HEADER_BYTES + header.body_len;
    let Some(body) = buf.get(FRAME_HEADER_BYTES..end) else {
        return Ok(None);
    };
    Ok(Some((decode_body(header, body)?, end)))
}
