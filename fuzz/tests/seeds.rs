//! Checks (or, with `STELA_WRITE_SEEDS=1`, rewrites) the seed corpus in `fuzz/seeds/`.
//!
//! `cargo test` inside `fuzz/` (with `RUSTC_BOOTSTRAP=1`, like every command here).

use std::path::Path;

#[test]
fn seeds_are_the_encoders_output() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let write = std::env::var_os("STELA_WRITE_SEEDS").is_some();
    let mut total = 0;
    for (target, name, bytes) in stela_fuzz::seeds() {
        let path = root.join(target).join(&name);
        total += bytes.len();
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else {
            let stored = std::fs::read(&path).unwrap_or_else(|e| {
                panic!("{}: {e} (run with STELA_WRITE_SEEDS=1)", path.display())
            });
            assert!(stored == bytes, "{} is stale", path.display());
        }
    }
    assert!(total < 100 << 10, "the seed corpus is {total} bytes");
}
