//! Arbitrary bytes decoded as a log's `SYNCED` file (`stela_format::synced`, the synced-end
//! mark in `docs/FORMAT.md`): each slot alone, and the whole file.
//!
//! Oracles: never panics; a slot that decodes re-encodes to exactly its first 40 bytes and names
//! a segment (first LSN not 0); the file's mark is one of the slots that decode, the one with the
//! highest sequence number.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_format::synced::{newest, SyncedEnd, SLOTS, SLOT_BYTES, SLOT_STRIDE};

fuzz_target!(|data: &[u8]| {
    let slots: Vec<SyncedEnd> = (0..SLOTS)
        .filter_map(|i| data.get((i * SLOT_STRIDE) as usize..))
        .filter_map(|bytes| {
            let mark = SyncedEnd::decode(bytes).ok()?;
            assert_eq!(&mark.encode()[..], &bytes[..SLOT_BYTES], "re-encodes to the slot");
            assert!(mark.segment_start.get() != 0);
            Some(mark)
        })
        .collect();
    let mark = newest(data);
    assert_eq!(mark.map(|m| m.seq), slots.iter().map(|m| m.seq).max());
    if let Some(mark) = mark {
        assert!(slots.contains(&mark));
    }
});
