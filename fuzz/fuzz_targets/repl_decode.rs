//! Arbitrary bytes read as the replication protocol (`stela_proto::repl`): frames decoded as
//! `ReplMessage`s one after the other, as a standby or a primary reads its peer, with every
//! chunk's bytes recovered (`chunk_bytes`, lz4 included).
//!
//! Oracles: never panics, never allocates past the frame limit for a chunk's claimed length;
//! a decoded message re-encodes to a frame that decodes to the same message; a chunk's recovered
//! bytes have exactly the length it claimed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_proto::frame;
use stela_proto::repl::{chunk_bytes, ReplMessage};

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let mut at = 0;
    while let Ok(Some((message, used))) = frame::decode_from::<ReplMessage>(&data[at..], LIMIT) {
        at += used;
        let mut again = Vec::new();
        frame::encode(&message, &mut again).expect("a decoded message encodes");
        let (back, _) = frame::decode_from::<ReplMessage>(&again, usize::MAX)
            .expect("re-encoded frame decodes")
            .expect("whole");
        assert_eq!(back, message);
        if let ReplMessage::Chunk {
            raw_len,
            compressed,
            bytes,
            ..
        } = message
        {
            if let Ok(out) = chunk_bytes(raw_len, compressed, bytes) {
                assert_eq!(out.len(), raw_len as usize);
            }
        }
    }
});
