//! Checks (or, with `STELA_WRITE_SEEDS=1`, rewrites) the seeds of the `ring_decode` target in
//! `fuzz/seeds/ring_decode/`: the shared-memory ring's entries from the encoder, a pad, a ring
//! header and a result slot (`stela_fuzz::ring_seeds`).
//!
//! `cargo test` inside `fuzz/` (with `RUSTC_BOOTSTRAP=1`, like every command here).

use stela_proto::ring::parse_entry;

#[test]
fn ring_decode_seeds_are_the_encoders_output() {
    let total = stela_fuzz::check_or_write_target_seeds("ring_decode", stela_fuzz::ring_seeds());
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
