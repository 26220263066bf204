//! Black-box tests of `stela demo` (runs with no setup and shows its three modes and what each
//! survives) and of the product's command set (the benchmarks are `stela-bench`'s, not
//! `stela`'s). Runs are kept short; nothing here asserts on timing.

mod common;

use common::{stela, text};

#[test]
fn demo_runs_and_shows_the_three_modes() {
    let out = stela(&["demo", "--seconds", "0.2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for mode in [
        "embedded, fdatasync per commit",
        "stela buffered (daemon)",
        "embedded, no fsync",
    ] {
        assert!(stdout.contains(mode), "{mode} missing:\n{stdout}");
    }
    assert!(stdout.contains("power loss"), "{stdout}");
}

#[test]
fn the_product_commands_are_there_and_the_benchmarks_are_not() {
    let out = stela(&["--help"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let help = text(&out);
    for command in [
        "demo",
        "wal",
        "serve",
        "status",
        "power-fail",
        "power-restore",
    ] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{command} "))),
            "{command} missing:\n{help}"
        );
    }
    let out = stela(&["wal", "--help"]);
    let help = text(&out);
    for command in ["dump", "verify", "repair"] {
        assert!(help.contains(command), "{command} missing:\n{help}");
    }
    for gone in [&["bench", "commit"][..], &["wal", "bench"]] {
        let out = stela(gone);
        assert_eq!(out.status.code(), Some(2), "{gone:?}: {}", text(&out));
    }
}
