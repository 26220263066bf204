//! The durability-critical core stays small: the files listed under `## Critical core` in
//! `docs/DURABILITY.md` hold at most [`BUDGET`] lines of code, not counting tests, comments and
//! blank lines (RapiLog's durability-critical part was 1,619 lines). Run with `--nocapture` to
//! see the count per file:
//!
//! ```sh
//! cargo test -p stela-server --test critical_core -- --nocapture
//! ```

use std::path::{Path, PathBuf};

/// 2,350 until 2026-12-08; 2,360 since, for the pool's rule that a log stuck on a full disk does
/// not hold the others' appends under the live cap (`tests/disk_full.rs` hung without it).
const BUDGET: usize = 2360;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The backticked paths of the `## Critical core` section, one per table row.
fn listed() -> Vec<String> {
    let doc =
        std::fs::read_to_string(repo().join("docs/DURABILITY.md")).expect("docs/DURABILITY.md");
    let section = doc
        .split("\n## Critical core")
        .nth(1)
        .expect("DURABILITY.md has a `## Critical core` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter(|l| l.starts_with('|'))
        .filter_map(|l| {
            let start = l.find('`')? + 1;
            let end = start + l[start..].find('`')?;
            Some(l[start..end].to_owned())
        })
        .filter(|p| p.ends_with(".rs"))
        .collect()
}

/// Lines of code: not blank, not a comment, not inside the file's `#[cfg(test)]` module.
fn code_lines(text: &str) -> usize {
    let mut count = 0;
    let mut in_block_comment = false;
    for line in text.lines() {
        let line = line.trim();
        if line == "#[cfg(test)]" {
            break; // the test module closes every critical file
        }
        if in_block_comment {
            if line.contains("*/") {
                in_block_comment = false;
            }
            continue;
        }
        if line.starts_with("/*") {
            in_block_comment = !line.contains("*/");
            continue;
        }
        if line.is_empty() || line.starts_with("//") {
            continue;
        }
        count += 1;
    }
    count
}

#[test]
fn the_critical_core_is_within_its_budget() {
    let files = listed();
    assert!(
        files.len() >= 5,
        "the section lists too few files: {files:?}"
    );
    let mut total = 0;
    for file in &files {
        let text = std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| {
            panic!("{file} is listed in the critical core but unreadable: {e}")
        });
        let lines = code_lines(&text);
        println!("{lines:>6}  {file}");
        total += lines;
    }
    println!("{total:>6}  total (budget {BUDGET})");
    assert!(
        total <= BUDGET,
        "the critical core has {total} lines of code, over its budget of {BUDGET}"
    );
}

#[test]
fn the_counter_skips_comments_blanks_and_tests() {
    let text = "//! top\n\nfn a() {\n    // why\n    b();\n}\n/* block\n still */\n#[cfg(test)]\nmod tests {\n fn t() {}\n}\n";
    assert_eq!(code_lines(text), 3);
}
