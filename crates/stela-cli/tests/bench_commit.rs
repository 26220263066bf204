//! Black-box tests of `stela bench commit --json` (every line one result with exactly the
//! documented keys) and of `stela demo` (runs with no setup, shows its three modes). Runs are
//! kept short; nothing here asserts on timing.

mod common;

use common::{stela, text};

#[test]
fn bench_commit_json_lines_have_exactly_the_keys() {
    let out = stela(&[
        "bench",
        "commit",
        "--clients",
        "1",
        "--modes",
        "embedded-unsafe,service-buffered",
        "--record-bytes",
        "100",
        "--duration",
        "0.3",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout.clone()).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", text(&out));
    let mut want = vec![
        "mode",
        "clients",
        "record_bytes",
        "commits",
        "seconds",
        "commits_per_s",
        "p50_us",
        "p99_us",
    ];
    want.sort_unstable();
    let mut modes = Vec::new();
    for line in lines {
        let value: serde_json::Value = serde_json::from_str(line).expect(line);
        let object = value.as_object().expect(line);
        let mut keys: Vec<&str> = object.keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(keys, want, "{line}");
        assert!(object["commits"].as_u64().unwrap_or(0) > 0, "{line}");
        assert_eq!(object["clients"].as_u64(), Some(1), "{line}");
        assert_eq!(object["record_bytes"].as_u64(), Some(100), "{line}");
        modes.push(object["mode"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(modes, ["embedded-unsafe", "service-buffered"]);
}

#[test]
fn bench_commit_rejects_a_bad_mode_and_duration() {
    let out = stela(&["bench", "commit", "--modes", "fast"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = stela(&["bench", "commit", "--duration", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--duration"), "{}", text(&out));
}

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
