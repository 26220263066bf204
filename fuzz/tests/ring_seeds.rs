//! Checks (or, with `STELA_WRITE_SEEDS=1`, rewrites) the seeds of the `ring_decode` target in
//! `fuzz/seeds/ring_decode/`: the shared-memory ring's entries from the encoder, a pad, a ring
//! header and a result slot (`stela_fuzz::ring_seeds`).
//!
//! `cargo test` inside `fuzz/` (with `RUSTC_BOOTSTRAP=1`, like every command here).

use std::path::Path;
use stela_proto::ring::parse_entry;

#[test]
fn ring_decode_seeds_are_the_encoders_output() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/ring_decode");
    let write = std::env::var_os("STELA_WRITE_SEEDS").is_some();
    let mut total = 0;
    for (name, bytes) in stela_fuzz::ring_seeds() {
        let path = dir.join(&name);
        total += bytes.len();
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else {
            let stored = std::fs::read(&path).unwrap_or_else(|e| {
                panic!("{}: {e} (run with STELA_WRITE_SEEDS=1)", path.display())
            });
            assert!(stored == bytes, "{} is stale", path.display());
        }
    }
    assert!(total < 8 << 10, "the ring seeds are {total} bytes");
}

#[test]
fn the_entry_seeds_reach_the_end_of_the_parser() {
    for (name, bytes) in stela_fuzz::ring_seeds() {
        if !(name.starts_with("append") || name.starts_with("commit")) {
            continue;
        }
        let input = stela_fuzz::RingInput::parse(&bytes).unwrap();
        let entry = parse_entry(input.bytes, input.expected_seq);
        assert!(entry.is_ok(), "{name}: {entry:?}");
    }
}
