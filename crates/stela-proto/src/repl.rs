//! The replication protocol: what a primary daemon and its standby say to each other, one log
//! per connection, in the same frame envelope as the client protocol ([`crate::frame`]).
//!
//! ```text
//! primary                                  standby
//!   Open {term, log, codec, type_tag}  ->
//!                                      <-  Position {term, where its copy stands, history}
//!   Chunk {term, segment, offset, bytes} -> (as appended, not when flushed)
//!                                      <-  Ack {term, received_lsn, durable_lsn}
//!   Heartbeat {term}                   ->  (when there is nothing to ship)
//!                                      <-  Ack {term, ...}  (every heartbeat is answered)
//!   Fetch {term, position}             ->  (a restarted primary that is behind its standby)
//!                                      <-  Chunk ... Position   (the records it lost)
//!                                      <-  Refuse {term, why}   (a stale term, a bad chunk)
//! ```
//!
//! Invariants: every message carries its sender's term, and a receiver that sees a term above its
//! own adopts it (a standby) or steps down (a primary); a standby never writes a chunk from a term
//! below its own. A chunk's bytes are segment bytes exactly as the primary writes them
//! (`stela_wal::mirror`), lz4-compressed only when that saves at least an eighth; the
//! decompressed length is bounded by [`crate::MAX_FRAME_BYTES`] before anything is allocated.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One message of the replication protocol.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ReplMessage {
    /// Primary → standby: start mirroring `log` (created if missing), records of `type_tag`
    /// in `codec`. `token` authenticates the primary when the standby asks for one.
    Open {
        term: u64,
        node: String,
        log: String,
        codec: String,
        type_tag: String,
        #[serde(default)]
        token: Option<String>,
        /// The primary's term history (term, first LSN), so that the standby labels every
        /// record with the term the primary wrote it in, whichever session ships it.
        #[serde(default)]
        history: Vec<(u64, u64)>,
    },
    /// Standby → primary: where its copy of the log stands; shipping starts there.
    Position {
        term: u64,
        segment_start: u64,
        offset: u64,
        next_lsn: u64,
        durable_lsn: u64,
        /// The copy's term history: (term, first LSN).
        history: Vec<(u64, u64)>,
        /// The standby's `--node` name (empty from a daemon that predates it, or one without a
        /// name): how a primary knows which standby a planned switchover may hand its epoch to.
        #[serde(default)]
        node: String,
    },
    /// Primary → standby: segment bytes to mirror (`stela_wal::mirror::Chunk`).
    Chunk {
        term: u64,
        segment_start: u64,
        offset: u64,
        /// The length of `bytes` once decompressed (equal to its length if not compressed).
        raw_len: u32,
        compressed: bool,
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
    /// Standby → primary: records up to `received_lsn` are written to the standby's OS (in its
    /// memory), up to `durable_lsn` synced to its disk.
    Ack {
        term: u64,
        received_lsn: u64,
        durable_lsn: u64,
    },
    /// Primary → standby when idle, so the standby knows its primary is alive.
    Heartbeat { term: u64 },
    /// Primary → standby, before it ships anything: the standby holds records the primary lost
    /// (it crashed after they were acknowledged at `replicated`); send them back from this
    /// position on, as `Chunk`s of the standby's synced files, then a `Position`.
    Fetch {
        term: u64,
        segment_start: u64,
        offset: u64,
        next_lsn: u64,
    },
    /// Primary → standby, before it ships anything: the standby's copy diverged after
    /// `after_lsn` (it was a primary in a term this primary's history does not carry from
    /// there on). The standby keeps its records after `after_lsn` in a salvage folder, cuts its
    /// copy there, and answers with a `Position`.
    Cut { term: u64, after_lsn: u64 },
    /// Primary → standby, while streaming: the primary's copy now begins at `first_lsn` (a
    /// client truncated the log, or retention removed old segments). The standby removes its
    /// own whole segments below it, never past what it holds durably nor past the lowest hold
    /// of a follower reading its copy (`stela_wal::holds`). Sent once a stream has caught up
    /// after it starts, and after each truncation.
    Truncated { term: u64, first_lsn: u64 },
    /// Primary → standby, before it ships anything: the standby's copy ends before the
    /// primary's oldest segment (a new or long-absent standby, and the primary truncated what
    /// lay between), so it cannot be continued. Every record the standby holds is one the
    /// primary held and truncated. The standby removes its segments, begins its copy with an
    /// empty segment of exactly this `header` (the primary's oldest), and answers with a
    /// `Position`.
    Reseed {
        term: u64,
        #[serde(with = "serde_bytes")]
        header: Vec<u8>,
    },
    /// Either way: the other side's message was refused; the connection closes after it.
    Refuse { term: u64, message: String },
}

impl ReplMessage {
    /// The sender's term.
    pub fn term(&self) -> u64 {
        match self {
            ReplMessage::Open { term, .. }
            | ReplMessage::Position { term, .. }
            | ReplMessage::Chunk { term, .. }
            | ReplMessage::Ack { term, .. }
            | ReplMessage::Heartbeat { term }
            | ReplMessage::Fetch { term, .. }
            | ReplMessage::Cut { term, .. }
            | ReplMessage::Truncated { term, .. }
            | ReplMessage::Reseed { term, .. }
            | ReplMessage::Refuse { term, .. } => *term,
        }
    }
}

/// Why a chunk's bytes could not be recovered.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChunkError {
    #[error("a chunk claims {raw_len} bytes decompressed, over the limit of {limit}")]
    TooLarge { raw_len: usize, limit: usize },
    #[error("a compressed chunk does not decompress to its {raw_len} bytes: {why}")]
    Corrupt { raw_len: usize, why: String },
    #[error("an uncompressed chunk of {len} bytes says it has {raw_len}")]
    LengthMismatch { len: usize, raw_len: usize },
}

/// A [`ReplMessage::Chunk`] of `bytes`: lz4-compressed if that saves at least an eighth of them.
/// Its `bytes` are what goes on the wire, `raw_len` what they stand for (the "before and after"
/// counts).
pub fn chunk_message(term: u64, segment_start: u64, offset: u64, bytes: &[u8]) -> ReplMessage {
    // Below a packet's worth, fewer bytes save no packet: not worth compressing (and, on the
    // standby, decompressing) on the way of a waiting commit.
    let compressed = if bytes.len() >= COMPRESS_FROM {
        lz4_flex::block::compress(bytes)
    } else {
        Vec::new()
    };
    let pays = !compressed.is_empty() && compression_pays(bytes.len(), compressed.len());
    ReplMessage::Chunk {
        term,
        segment_start,
        offset,
        raw_len: bytes.len() as u32,
        compressed: pays,
        bytes: if pays { compressed } else { bytes.to_vec() },
    }
}

/// Chunks shorter than this go uncompressed.
pub const COMPRESS_FROM: usize = 1024;

/// Whether `compressed` bytes save at least an eighth of `raw` (and at least one byte).
fn compression_pays(raw: usize, compressed: usize) -> bool {
    compressed < raw && (raw - compressed).saturating_mul(8) >= raw
}

/// The segment bytes a chunk carries, decompressed if need be, at most [`crate::MAX_FRAME_BYTES`].
///
/// # Errors
/// A claimed length over the limit (checked before allocating), bytes that do not decompress to
/// exactly that length, or an uncompressed chunk whose length disagrees.
pub fn chunk_bytes(raw_len: u32, compressed: bool, bytes: Vec<u8>) -> Result<Vec<u8>, ChunkError> {
    let raw_len = raw_len as usize;
    if raw_len > crate::MAX_FRAME_BYTES {
        return Err(ChunkError::TooLarge {
            raw_len,
            limit: crate::MAX_FRAME_BYTES,
        });
    }
    if !compressed {
        if bytes.len() != raw_len {
            return Err(ChunkError::LengthMismatch {
                len: bytes.len(),
                raw_len,
            });
        }
        return Ok(bytes);
    }
    let out = lz4_flex::block::decompress(&bytes, raw_len).map_err(|e| ChunkError::Corrupt {
        raw_len,
        why: e.to_string(),
    })?;
    if out.len() != raw_len {
        return Err(ChunkError::Corrupt {
            raw_len,
            why: format!("got {} bytes", out.len()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame;
    use proptest::prelude::*;

    fn round_trip(message: &ReplMessage) -> ReplMessage {
        let mut out = Vec::new();
        frame::encode(message, &mut out).unwrap();
        let (back, used) = frame::decode_from(&out, crate::MAX_FRAME_BYTES)
            .unwrap()
            .unwrap();
        assert_eq!(used, out.len());
        back
    }

    #[test]
    fn messages_round_trip() {
        let messages = [
            ReplMessage::Open {
                term: 3,
                node: "a".into(),
                log: "ledger".into(),
                codec: "msgpack".into(),
                type_tag: "Entry".into(),
                token: Some("t".into()),
                history: vec![(1, 1), (3, 40)],
            },
            ReplMessage::Position {
                term: 3,
                segment_start: 1,
                offset: 256,
                next_lsn: 1,
                durable_lsn: 0,
                history: vec![(1, 1), (3, 40)],
                node: "b".into(),
            },
            chunk_message(3, 1, 256, &[7; 1000]),
            ReplMessage::Ack {
                term: 3,
                received_lsn: 9,
                durable_lsn: 8,
            },
            ReplMessage::Heartbeat { term: 3 },
            ReplMessage::Fetch {
                term: 3,
                segment_start: 1,
                offset: 300,
                next_lsn: 4,
            },
            ReplMessage::Truncated {
                term: 3,
                first_lsn: 4096,
            },
            ReplMessage::Cut {
                term: 3,
                after_lsn: 17,
            },
            ReplMessage::Reseed {
                term: 3,
                header: vec![9; 256],
            },
            ReplMessage::Refuse {
                term: 4,
                message: "stale term 3".into(),
            },
        ];
        for message in messages {
            assert_eq!(round_trip(&message), message);
            assert_eq!(round_trip(&message).term(), message.term());
        }
    }

    #[test]
    fn compression_is_used_only_when_it_pays() {
        let ReplMessage::Chunk {
            compressed,
            bytes,
            raw_len,
            ..
        } = chunk_message(1, 1, 256, &[0; 4096])
        else {
            unreachable!()
        };
        assert!(compressed && bytes.len() < 4096 / 8);
        assert_eq!(
            chunk_bytes(raw_len, compressed, bytes).unwrap(),
            vec![0; 4096]
        );
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let ReplMessage::Chunk {
            compressed,
            bytes,
            raw_len,
            ..
        } = chunk_message(1, 1, 256, &noise)
        else {
            unreachable!()
        };
        assert!(!compressed);
        assert_eq!(chunk_bytes(raw_len, compressed, bytes).unwrap(), noise);
        // Short chunks go as they are, however well they would compress.
        let ReplMessage::Chunk {
            compressed, bytes, ..
        } = chunk_message(1, 1, 256, &[0; COMPRESS_FROM - 1])
        else {
            unreachable!()
        };
        assert!(!compressed && bytes == vec![0; COMPRESS_FROM - 1]);
    }

    #[test]
    fn compression_must_save_an_eighth() {
        assert!(compression_pays(800, 700)); // saves exactly an eighth
        assert!(!compression_pays(800, 701));
        assert!(!compression_pays(900, 790)); // saves 12.2 %: not enough
        assert!(!compression_pays(0, 0));
        assert!(!compression_pays(0, 1));
        assert!(compression_pays(8, 7)); // one byte of eight
        assert!(!compression_pays(9, 8)); // one byte of nine
    }

    #[test]
    fn a_lying_length_is_refused_before_allocating() {
        assert!(matches!(
            chunk_bytes(u32::MAX, true, vec![0; 10]),
            Err(ChunkError::TooLarge { .. })
        ));
        assert!(matches!(
            chunk_bytes(10, false, vec![0; 9]),
            Err(ChunkError::LengthMismatch { .. })
        ));
        assert!(chunk_bytes(1000, true, vec![0xff; 10]).is_err());
    }

    proptest! {
        #[test]
        fn chunks_round_trip(bytes in prop::collection::vec(prop_oneof![Just(0u8), any::<u8>()], 0..5000)) {
            let ReplMessage::Chunk { compressed, bytes: wire, raw_len, .. } = round_trip(&chunk_message(2, 5, 300, &bytes)) else {
                unreachable!()
            };
            let sent = wire.len();
            prop_assert_eq!(&chunk_bytes(raw_len, compressed, wire).unwrap(), &bytes);
            // Compressed exactly when lz4 saves an eighth.
            let lz4 = lz4_flex::block::compress(&bytes).len();
            let n = bytes.len();
            prop_assert_eq!(compressed, n >= COMPRESS_FROM && lz4 < n && 8 * (n - lz4) >= n);
            prop_assert_eq!(sent, if compressed { lz4 } else { bytes.len() });
        }

        #[test]
        fn decoding_any_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(Some((ReplMessage::Chunk { raw_len, compressed, bytes, .. }, _))) =
                frame::decode_from::<ReplMessage>(&bytes, 1 << 20)
            {
                let _ = chunk_bytes(raw_len, compressed, bytes);
            }
        }
    }
}
