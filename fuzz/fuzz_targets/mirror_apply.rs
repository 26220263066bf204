//! Arbitrary bytes shipped to a standby's mirror (`stela_wal::mirror::Mirror::apply`) as one
//! chunk: at offset 0 of the first segment (a segment header, then frames) when the first input
//! byte is even, else at offset 256 (frames continuing the mirror's empty first segment). The
//! mirror lives in the in-memory `FaultStorage`, capped at 1 MiB so a header claiming a huge
//! capacity fails preallocation instead of exhausting memory.
//!
//! Oracles:
//! - never panics: every chunk is applied or refused with an error;
//! - a refused chunk changes nothing: the mirror's position is the same, and it reopens empty;
//! - an applied chunk is a log: after a sync the mirror reopens in `Strict` mode holding exactly
//!   the records it reported received, and every one reads back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::Arc;
use stela_format::{Codec, Lsn};
use stela_fuzz::{SEGMENT_BYTES, TYPE_TAG};
use stela_wal::mirror::{Chunk, Mirror, MirrorError};
use stela_wal::storage::FaultStorage;
use stela_wal::WalOptions;

const DIR: &str = "/mirror";

fn options(storage: &FaultStorage) -> WalOptions {
    WalOptions::default()
        .codec(Codec::MessagePack)
        .storage(Arc::new(storage.clone()))
        .segment_bytes(SEGMENT_BYTES)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let storage = FaultStorage::new();
    let mut mirror = Mirror::open(Path::new(DIR), options(&storage), TYPE_TAG).unwrap();
    storage.set_space_limit(Some(1 << 20));
    let before = mirror.position();
    let offset = if mode % 2 == 0 { 0 } else { before.offset };
    let result = mirror.apply(Chunk {
        segment_start: Lsn::FIRST,
        offset,
        bytes,
    });
    let received = match result {
        Ok(last) => {
            assert_eq!(last, mirror.received_lsn());
            if mirror.sync().is_err() {
                return;
            }
            last
        }
        Err(MirrorError::Refused(why)) => {
            assert!(!why.is_empty());
            assert_eq!(mirror.position(), before, "a refused chunk moves nothing");
            0
        }
        // Preallocating a huge segment on the small disk, say.
        Err(MirrorError::Wal(_)) => return,
    };
    drop(mirror);
    let reopened = Mirror::open(Path::new(DIR), options(&storage), TYPE_TAG)
        .expect("a mirror reopens after any applied or refused chunk");
    assert_eq!(reopened.received_lsn(), received);
    let read = reopened
        .segments()
        .reader(Lsn::FIRST, Lsn::new(received + 1))
        .collect::<Result<Vec<_>, _>>()
        .expect("every mirrored record reads back");
    assert_eq!(read.len() as u64, received);
});
