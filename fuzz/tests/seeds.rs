//! Checks (or, with `STELA_WRITE_SEEDS=1`, rewrites) the seed corpus in `fuzz/seeds/`.
//!
//! `cargo test` inside `fuzz/` (with `RUSTC_BOOTSTRAP=1`, like every command here).

#[test]
fn seeds_are_the_encoders_output() {
    let total = stela_fuzz::check_or_write_seeds(stela_fuzz::seeds());
    assert!(total < 100 << 10, "the seed corpus is {total} bytes");
}
