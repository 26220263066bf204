//! The first frame a peer sends a standby's replication port, read as the standby reads it
//! before the peer is authenticated: one frame of at most `OPEN_BOUND` bytes (the standby's
//! `MAX_OPEN_BYTES`, issue 54), which must be an `Open`.
//!
//! Oracles:
//! - never panics, and (run with `-malloc_limit_mb`) allocates nothing near a hostile length:
//!   a header over the bound is `TooLarge` before any body is looked at, and only such a header;
//! - an `Open` that decodes fits the bound whole (its names, token and term history inside
//!   it), and round-trips through `frame::encode`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_proto::frame::{self, FrameError, FRAME_HEADER_BYTES};
use stela_proto::repl::ReplMessage;

/// `MAX_OPEN_BYTES` of `stela_server::replication::standby` (private there).
const OPEN_BOUND: usize = 256 << 10;

fuzz_target!(|data: &[u8]| {
    let announced = data
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize);
    match frame::decode_from::<ReplMessage>(data, OPEN_BOUND) {
        Ok(None) => {
            if let Some(len) = announced.filter(|_| data.len() >= FRAME_HEADER_BYTES) {
                assert!(len <= OPEN_BOUND, "a body over the bound awaited");
                assert!(
                    data.len() < FRAME_HEADER_BYTES + len,
                    "a whole frame awaited"
                );
            }
        }
        Ok(Some((message, used))) => {
            assert!(used <= FRAME_HEADER_BYTES + OPEN_BOUND);
            if let ReplMessage::Open {
                node,
                log,
                codec,
                type_tag,
                token,
                history,
                ..
            } = &message
            {
                let names = node.len() + log.len() + codec.len() + type_tag.len();
                let token = token.as_ref().map_or(0, String::len);
                // Each history entry takes at least two bytes (two fixints) in MessagePack.
                assert!(names + token + 2 * history.len() <= OPEN_BOUND);
            }
            let mut again = Vec::new();
            frame::encode(&message, &mut again).expect("a decoded message encodes");
            let (back, _) = frame::decode_from::<ReplMessage>(&again, usize::MAX)
                .expect("the re-encoded frame decodes")
                .expect("whole");
            assert_eq!(back, message);
        }
        Err(FrameError::TooLarge { len, limit }) => {
            assert_eq!(limit, OPEN_BOUND);
            assert_eq!(Some(len), announced);
            assert!(len > OPEN_BOUND);
        }
        Err(error) => {
            assert!(announced.is_some_and(|len| len <= OPEN_BOUND));
            let _ = error.to_string();
        }
    }
});
