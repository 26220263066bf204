//! Arbitrary bytes into the frame decoder.
//!
//! Oracles:
//! - never panics (`decode`, `decode_with_limit`, `find_next_valid`);
//! - a decoded record re-encodes, with its LSN and payload, to exactly the bytes it was decoded
//!   from (length, checksum, LSN, payload), and its LSN is not 0;
//! - `Unwritten` only for zeros, `Incomplete { needed }` only when `needed` bytes are not there;
//! - the payload limit is exact: a record of `n` bytes decodes with limit `n`, not with `n - 1`;
//! - `find_next_valid` finds a record at offset 0 when there is one, and anything it returns is
//!   a record with an LSN at least the one asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_format::frame::{self, Decoded, Rejection, HEADER_BYTES, MAX_PAYLOAD_BYTES};
use stela_format::Lsn;

fuzz_target!(|data: &[u8]| {
    match frame::decode(data) {
        Decoded::Record(rec) => {
            assert_ne!(rec.lsn, Lsn::ZERO);
            assert!(rec.frame_len() <= data.len());
            let mut again = Vec::new();
            frame::encode(&mut again, rec.lsn, rec.payload);
            assert_eq!(again, &data[..rec.frame_len()], "re-encoding differs");

            let len = rec.payload.len() as u32;
            assert_eq!(frame::decode_with_limit(data, len), Decoded::Record(rec));
            if len > 0 {
                assert_eq!(
                    frame::decode_with_limit(data, len - 1),
                    Decoded::Rejected(Rejection::ImplausibleLength { length: len })
                );
            }
            assert_eq!(
                frame::find_next_valid(data, 0, rec.lsn, u32::MAX),
                Some(0),
                "a record at offset 0 is not found"
            );
        }
        Decoded::Unwritten => {
            assert!(!data.is_empty());
            assert!(data[..data.len().min(HEADER_BYTES)].iter().all(|&b| b == 0));
        }
        Decoded::Incomplete { needed } => {
            assert!(needed > data.len(), "needs {needed}, has {}", data.len());
            assert!(needed <= HEADER_BYTES + MAX_PAYLOAD_BYTES as usize);
        }
        Decoded::Rejected(why) => {
            // Display must not panic either.
            let _ = why.to_string();
        }
    }

    // Resynchronisation from every kind of starting point.
    for (from, min_lsn, limit) in [(0, 1, u32::MAX), (1, 0, 64), (3, u64::MAX, 0)] {
        if let Some(at) = frame::find_next_valid(data, from, Lsn::new(min_lsn), limit) {
            assert!(at >= from);
            match frame::decode_with_limit(&data[at..], limit) {
                Decoded::Record(rec) => assert!(rec.lsn.get() >= min_lsn.max(1)),
                other => panic!("find_next_valid returned {at}, which decodes as {other:?}"),
            }
        }
    }
});
