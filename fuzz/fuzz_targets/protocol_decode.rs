//! Arbitrary bytes into the daemon's wire decoder, as a stream of frames, read both as requests
//! (what `stela serve` decodes from every client) and as responses (what a client decodes).
//!
//! Oracles:
//! - never panics, whatever the bytes (`frame::decode_from` for `Request` and `Response`, and
//!   the `Display` of every error);
//! - the limit holds before anything else: a header naming more than `LIMIT` body bytes is
//!   `TooLarge`, and only such a header is;
//! - `Ok(None)` ("need more bytes") only when the header or the body is really incomplete, and a
//!   decoded frame is never longer than the input;
//! - a message that decodes round-trips: `frame::encode` accepts it, decoding that gives an equal
//!   message and consumes exactly the encoded bytes, and encoding is stable (encoding the message
//!   decoded from the re-encoding gives the same bytes). The input itself need not be canonical
//!   (MessagePack has several encodings of one integer), so the input bytes are not compared;
//! - a frame whose checksum does not match is never decoded (`BadChecksum` is checked against an
//!   independent CRC32C of the body).
//!
//! Decoding goes on after each complete frame, as a connection does, until an error or the end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use stela_proto::frame::{self, FrameError, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
use stela_proto::{Request, Response};

/// The body limit a reader passes: small, so hostile lengths are cut off quickly and the limit
/// check itself is exercised.
const LIMIT: usize = 4096;

/// Bitwise CRC32C (Castagnoli, reflected 0x82F63B78), independent of the `crc32c` crate.
fn crc32c_bitwise(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn header_fields(buf: &[u8]) -> Option<(usize, u32)> {
    let header = buf.get(..FRAME_HEADER_BYTES)?;
    let len = u32::from_le_bytes(header[0..4].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().unwrap());
    Some((len, crc))
}

/// Decodes frames of `M` from `data` one after the other, checking every oracle.
fn stream<M: Serialize + DeserializeOwned + PartialEq + Debug>(data: &[u8]) {
    let mut rest = data;
    loop {
        let fields = header_fields(rest);
        match frame::decode_from::<M>(rest, LIMIT) {
            Ok(None) => {
                match fields {
                    None => assert!(rest.len() < FRAME_HEADER_BYTES),
                    Some((len, _)) => {
                        assert!(
                            len <= LIMIT,
                            "a body of {len} bytes over the limit was awaited"
                        );
                        assert!(
                            rest.len() < FRAME_HEADER_BYTES + len,
                            "a complete frame is 'incomplete'"
                        );
                    }
                }
                return;
            }
            Ok(Some((message, used))) => {
                let (len, crc) = fields.expect("a decoded frame has a header");
                assert!(len <= LIMIT);
                assert_eq!(used, FRAME_HEADER_BYTES + len);
                assert!(used <= rest.len());
                assert_eq!(crc, crc32c_bitwise(&rest[FRAME_HEADER_BYTES..used]));
                round_trip(&message);
                rest = &rest[used..];
            }
            Err(error) => {
                let _ = error.to_string();
                let (len, crc) = fields.expect("an error needs a header");
                match &error {
                    FrameError::TooLarge { len: l, limit } => {
                        assert_eq!(*l, len);
                        assert_eq!(*limit, LIMIT);
                        assert!(len > LIMIT);
                    }
                    FrameError::BadChecksum { expected, actual } => {
                        assert!(len <= LIMIT);
                        let body = &rest[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len];
                        assert_eq!(*expected, crc);
                        assert_eq!(*actual, crc32c_bitwise(body));
                        assert_ne!(crc, *actual);
                    }
                    FrameError::BadMessage(_) => {
                        assert!(len <= LIMIT);
                        let body = &rest[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len];
                        assert_eq!(crc, crc32c_bitwise(body), "a bad checksum was decoded");
                    }
                    FrameError::Encode(_) => panic!("decoding reported an encode error: {error}"),
                }
                return;
            }
        }
    }
}

/// encode → decode gives the message back, and encoding is deterministic.
fn round_trip<M: Serialize + DeserializeOwned + PartialEq + Debug>(message: &M) {
    let mut encoded = Vec::new();
    frame::encode(message, &mut encoded)
        .unwrap_or_else(|e| panic!("a decoded message does not encode: {e}: {message:?}"));
    let (again, used) = frame::decode_from::<M>(&encoded, MAX_FRAME_BYTES)
        .unwrap_or_else(|e| panic!("the re-encoding does not decode: {e}: {message:?}"))
        .expect("the re-encoding is one complete frame");
    assert_eq!(used, encoded.len(), "the re-encoding is not one frame");
    assert_eq!(&again, message, "decode(encode(m)) != m");
    let mut twice = Vec::new();
    frame::encode(&again, &mut twice).expect("encodes again");
    assert_eq!(twice, encoded, "encoding is not stable");
}

fuzz_target!(|data: &[u8]| {
    stream::<Request>(data);
    stream::<Response>(data);
});
