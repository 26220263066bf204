//! Arbitrary bytes into the frame decoder, read as a frame of each layout (version 2 with the
//! sync base, and version 1 without).
//!
//! Oracles, for each layout:
//! - never panics (`decode`, `decode_with_limit`, `find_next_valid`);
//! - a decoded record re-encodes, with its LSN, payload and (v2) sync base, to exactly the bytes
//!   it was decoded from (length, checksum, LSN, sync base, payload), its LSN is not 0, it has a
//!   sync base exactly in version 2, and that sync base is not inside the segment header;
//! - `Unwritten` only for zeros, `Incomplete { needed }` only when `needed` bytes are not there;
//! - the payload limit is exact: a record of `n` bytes decodes with limit `n`, not with `n - 1`;
//! - `find_next_valid` finds a record at offset 0 when there is one, and anything it returns is
//!   a record with an LSN at least the one asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_format::frame::{self, Decoded, Layout, Rejection, MAX_PAYLOAD_BYTES, MIN_SYNC_BASE};
use stela_format::resync;
use stela_format::Lsn;

fuzz_target!(|data: &[u8]| {
    for layout in [Layout::V2, Layout::V1] {
        check(layout, data);
    }
});

fn check(layout: Layout, data: &[u8]) {
    let header_bytes = layout.header_bytes();
    match frame::decode(layout, data) {
        Decoded::Record(rec) => {
            assert_ne!(rec.lsn, Lsn::ZERO);
            assert_eq!(rec.layout(), layout);
            assert!(rec.frame_len() <= data.len());
            let mut again = Vec::new();
            match rec.sync_base {
                Some(base) => {
                    assert!(base >= MIN_SYNC_BASE, "sync base {base} accepted");
                    frame::encode(&mut again, rec.lsn, rec.payload, base);
                }
                None => resync::encode_v1(&mut again, rec.lsn, rec.payload),
            }
            assert_eq!(again, &data[..rec.frame_len()], "re-encoding differs");

            let len = rec.payload.len() as u32;
            assert_eq!(
                frame::decode_with_limit(layout, data, len),
                Decoded::Record(rec)
            );
            if len > 0 {
                assert_eq!(
                    frame::decode_with_limit(layout, data, len - 1),
                    Decoded::Rejected(Rejection::ImplausibleLength { length: len })
                );
            }
            assert_eq!(
                resync::find_next_valid(layout, data, 0, rec.lsn, u32::MAX),
                Some(0),
                "a record at offset 0 is not found"
            );
        }
        Decoded::Unwritten => {
            assert!(!data.is_empty());
            assert!(data[..data.len().min(header_bytes)].iter().all(|&b| b == 0));
        }
        Decoded::Incomplete { needed } => {
            assert!(needed > data.len(), "needs {needed}, has {}", data.len());
            assert!(needed <= header_bytes + MAX_PAYLOAD_BYTES as usize);
        }
        Decoded::Rejected(why) => {
            // Display must not panic either.
            let _ = why.to_string();
        }
    }

    // Resynchronisation from every kind of starting point.
    for (from, min_lsn, limit) in [(0, 1, u32::MAX), (1, 0, 64), (3, u64::MAX, 0)] {
        if let Some(at) = resync::find_next_valid(layout, data, from, Lsn::new(min_lsn), limit) {
            assert!(at >= from);
            match frame::decode_with_limit(layout, &data[at..], limit) {
                Decoded::Record(rec) => assert!(rec.lsn.get() >= min_lsn.max(1)),
                other => panic!("find_next_valid returned {at}, which decodes as {other:?}"),
            }
        }
    }
}
