//! The first bytes a client sends `stela serve`, read as the daemon reads them before a Hello:
//! frames of at most `MAX_HELLO_FRAME_BYTES` (issue 54: nothing larger is read from a peer that
//! has proved nothing), then the handshake's first request.
//!
//! Oracles:
//! - never panics, and (run with `-malloc_limit_mb`) allocates nothing near a hostile length:
//!   a header over the bound is `TooLarge` before any body is looked at, and only such a header;
//! - `Ok(None)` only while the frame within the bound is really incomplete;
//! - a Hello that decodes fits the bound whole (its client name and token inside it), and
//!   round-trips through `frame::encode`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_proto::frame::{self, FrameError, FRAME_HEADER_BYTES, MAX_HELLO_FRAME_BYTES};
use stela_proto::{Request, RequestBody};

fuzz_target!(|data: &[u8]| {
    let announced = data
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize);
    match frame::decode_from::<Request>(data, MAX_HELLO_FRAME_BYTES) {
        Ok(None) => {
            if let Some(len) = announced.filter(|_| data.len() >= FRAME_HEADER_BYTES) {
                assert!(
                    len <= MAX_HELLO_FRAME_BYTES,
                    "a body over the bound awaited"
                );
                assert!(
                    data.len() < FRAME_HEADER_BYTES + len,
                    "a whole frame awaited"
                );
            }
        }
        Ok(Some((request, used))) => {
            assert!(used <= FRAME_HEADER_BYTES + MAX_HELLO_FRAME_BYTES);
            if let RequestBody::Hello { client, token, .. } = &request.body {
                let token = token.as_ref().map_or(0, String::len);
                assert!(client.len() + token <= MAX_HELLO_FRAME_BYTES);
            }
            let mut again = Vec::new();
            frame::encode(&request, &mut again).expect("a decoded request encodes");
            let (back, _) = frame::decode_from::<Request>(&again, usize::MAX)
                .expect("the re-encoded frame decodes")
                .expect("whole");
            assert_eq!(back, request);
        }
        Err(FrameError::TooLarge { len, limit }) => {
            assert_eq!(limit, MAX_HELLO_FRAME_BYTES);
            assert_eq!(Some(len), announced);
            assert!(len > MAX_HELLO_FRAME_BYTES);
        }
        Err(error) => {
            assert!(announced.is_some_and(|len| len <= MAX_HELLO_FRAME_BYTES));
            let _ = error.to_string();
        }
    }
});
