//! docs/POSTGRES.md's mount recipe, run as written: `contrib/postgres/recipe-check` extracts
//! every `<!-- recipe:NAME -->` block of the doc and runs it verbatim (in a mount and network
//! namespace of its own), checking that every committed row survives a clean stop, a SIGKILL of
//! the mount and a power-fail notice with a SIGKILL of the daemon, for pg_wal on the mount and
//! for the whole data directory. A recipe that stops working as written fails this test.
//!
//! Needs root, /dev/fuse, fusermount3 and PostgreSQL; without them the script fails saying
//! which is missing.

use std::path::Path;
use std::process::Command;

#[test]
fn the_postgres_recipe_in_the_docs_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let stela = Path::new(env!("CARGO_BIN_EXE_stela"));
    let out = Command::new(root.join("contrib/postgres/recipe-check"))
        .arg(root.join("docs/POSTGRES.md"))
        .env("STELA_BIN", stela.parent().unwrap())
        .output()
        .expect("running contrib/postgres/recipe-check (needs bash)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "recipe-check failed:\n{text}");
    assert!(text.contains("ran as written"), "{text}");
}
