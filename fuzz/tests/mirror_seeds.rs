//! Checks (or, with `STELA_WRITE_SEEDS=1`, rewrites) the seeds of the `mirror_apply` target in
//! `fuzz/seeds/mirror_apply/` (`stela_fuzz::mirror_seeds`), and that the valid ones are mirrored.
//!
//! `cargo test` inside `fuzz/` (with `RUSTC_BOOTSTRAP=1`, like every command here).

use std::path::Path;
use std::sync::Arc;
use stela_format::{Codec, Lsn};
use stela_wal::mirror::{Chunk, Mirror};
use stela_wal::storage::FaultStorage;
use stela_wal::WalOptions;

#[test]
fn mirror_apply_seeds_are_current() {
    stela_fuzz::check_or_write_target_seeds("mirror_apply", stela_fuzz::mirror_seeds());
}

#[test]
fn the_valid_seeds_are_mirrored() {
    for (name, bytes) in stela_fuzz::mirror_seeds() {
        if name == "segment-zero-capacity" {
            continue; // refused: its header claims no room for frames
        }
        let storage = FaultStorage::new();
        let options = WalOptions::default()
            .codec(Codec::MessagePack)
            .storage(Arc::new(storage))
            .segment_bytes(stela_fuzz::SEGMENT_BYTES);
        let mut mirror = Mirror::open(Path::new("/m"), options, stela_fuzz::TYPE_TAG).unwrap();
        let offset = if bytes[0] % 2 == 0 {
            0
        } else {
            mirror.position().offset
        };
        let last = mirror
            .apply(Chunk {
                segment_start: Lsn::FIRST,
                offset,
                bytes: &bytes[1..],
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(last, stela_fuzz::sample_records().len() as u64, "{name}");
    }
}
