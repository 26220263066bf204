//! Black-box tests of the `stela-bench` binary: every `--json` line of `commit`, `wal` and
//! `power-fail` is one result with exactly the documented keys, and bad arguments exit 2 naming
//! the flag. Runs are kept short; nothing here asserts on timing.

mod common;

use common::{stela_bench, text};
use serde_json::{Map, Value};

/// Parses every stdout line as a JSON object and checks it has exactly the keys `want`.
fn json_lines(out: &std::process::Output, want: &[&str]) -> Vec<Map<String, Value>> {
    assert_eq!(out.status.code(), Some(0), "{}", text(out));
    let stdout = String::from_utf8(out.stdout.clone()).expect("utf-8");
    let mut want: Vec<&str> = want.to_vec();
    want.sort_unstable();
    stdout
        .lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).expect(line);
            let object = value.as_object().expect(line).clone();
            let mut keys: Vec<&str> = object.keys().map(|k| k.as_str()).collect();
            keys.sort_unstable();
            assert_eq!(keys, want, "{line}");
            object
        })
        .collect()
}

#[test]
fn commit_json_lines_have_exactly_the_keys() {
    let out = stela_bench(&[
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
    let rows = json_lines(
        &out,
        &[
            "mode",
            "clients",
            "record_bytes",
            "commits",
            "seconds",
            "commits_per_s",
            "p50_us",
            "p99_us",
        ],
    );
    assert_eq!(rows.len(), 2, "{}", text(&out));
    let mut modes = Vec::new();
    for row in &rows {
        assert!(row["commits"].as_u64().unwrap_or(0) > 0, "{row:?}");
        assert_eq!(row["clients"].as_u64(), Some(1), "{row:?}");
        assert_eq!(row["record_bytes"].as_u64(), Some(100), "{row:?}");
        assert!(row["p50_us"].as_f64().unwrap_or(0.0) > 0.0, "{row:?}");
        modes.push(row["mode"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(modes, ["embedded-unsafe", "service-buffered"]);
}

#[test]
fn commit_rejects_a_bad_mode_and_duration() {
    let out = stela_bench(&["commit", "--modes", "fast"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = stela_bench(&["commit", "--duration", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--duration"), "{}", text(&out));
}

#[test]
fn wal_json_lines_have_exactly_the_keys_for_stela_and_the_peers() {
    let out = stela_bench(&[
        "wal",
        "--records",
        "300",
        "--config",
        "C",
        "--codec",
        "msgpack",
        "--writers",
        "2",
        "--peers",
        "--json",
        "--no-progress",
    ]);
    let rows = json_lines(
        &out,
        &[
            "system",
            "codec",
            "config",
            "sync",
            "writers",
            "op",
            "records",
            "seconds",
            "mb_per_s",
            "records_per_s",
            "p50_us",
            "p99_us",
        ],
    );
    let mut seen: Vec<(String, String)> = rows
        .iter()
        .map(|row| {
            assert_eq!(row["records"].as_u64(), Some(300), "{row:?}");
            assert_eq!(row["writers"].as_u64(), Some(2), "{row:?}");
            (
                row["system"].as_str().unwrap_or_default().to_string(),
                row["op"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    seen.sort();
    let mut want = Vec::new();
    for system in ["okaywal", "raft-engine", "stela"] {
        for op in ["read", "write"] {
            want.push((system.to_string(), op.to_string()));
        }
    }
    assert_eq!(seen, want, "{}", text(&out));
}

#[test]
fn power_fail_json_lines_have_exactly_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let out = stela_bench(&[
        "power-fail",
        "--buffers",
        "6",
        "--repeats",
        "1",
        "--json",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    let rows = json_lines(
        &out,
        &[
            "buffers",
            "cap_bytes",
            "flushed_bytes",
            "micros",
            "budget_micros",
            "measured_write_bytes_per_s",
        ],
    );
    assert_eq!(rows.len(), 1, "{}", text(&out));
    assert_eq!(rows[0]["buffers"].as_u64(), Some(6));
    assert!(
        rows[0]["flushed_bytes"].as_u64().unwrap_or(0) > 0,
        "{rows:?}"
    );
}

#[test]
fn every_subcommand_has_help() {
    for command in ["wal", "commit", "power-fail"] {
        let out = stela_bench(&[command, "--help"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(text(&out).contains("--json"), "{command}: {}", text(&out));
    }
    let out = stela_bench(&["bench"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}
