//! `stela-bench pg-failover` end to end: real PostgreSQL (Debian's packages, run as the
//! postgres user) with its whole data directory on a `stela mount` at `replicated`, a witness
//! and two nodes; the primary node (daemon, mount, PostgreSQL) is SIGKILLed, the standby node
//! promotes, mounts the files its follower kept current and starts PostgreSQL; the old primary
//! rejoins as the standby, and the next fault hits the other node. Every row the client saw
//! acknowledged must be in the table on the new primary, and reprotection must ship less than
//! the whole data directory. Nothing here asserts on timing.
//!
//! Needs root, /dev/fuse, fusermount3 and PostgreSQL: without them the run fails naming what
//! is missing, and so does the test. Needs the `stela` binary next to `stela-bench`
//! (`cargo test --workspace` builds it; after `cargo test -p stela-bench` alone, `cargo build
//! -p stela` first).
//!
//! - `two_failovers_lose_no_acknowledged_row`: a -> b, then b -> a (the returning node's
//!   follower and reprotection are on the second fault's path).
//! - `ten_failovers_lose_no_acknowledged_row` (ignored: about a minute).

mod common;

use common::{stela_bench_within, text};
use serde_json::Value;
use std::time::Duration;

fn failovers(faults: u32, base_port: u16, limit: Duration) {
    let faults_arg = faults.to_string();
    let port_arg = base_port.to_string();
    let out = stela_bench_within(
        &[
            "pg-failover",
            "--faults",
            &faults_arg,
            "--commit-ms",
            "500",
            "--base-port",
            &port_arg,
            "--json",
        ],
        limit,
    );
    assert!(out.status.success(), "pg-failover failed: {}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len() as u32, faults + 1, "{stdout}");
    let mut acked_before = 0;
    for (i, row) in lines[..faults as usize].iter().enumerate() {
        assert_eq!(row["fault"], i as u64 + 1, "{stdout}");
        assert_eq!(row["lost"], 0, "acknowledged rows lost: {stdout}");
        let acked = row["acked"].as_u64().unwrap();
        assert!(
            acked > acked_before,
            "no commits before fault {}: {stdout}",
            i + 1
        );
        acked_before = acked;
        assert!(row["downtime_ms"].as_f64().unwrap() > 0.0, "{stdout}");
        // Reprotection ships the log the old primary lacks, never the whole data directory.
        let (shipped, whole) = (
            row["reprotect_bytes"].as_u64(),
            row["pgdata_bytes"].as_u64(),
        );
        assert!(
            shipped.unwrap() < whole.unwrap(),
            "reprotection after fault {} shipped as much as the data directory: {stdout}",
            i + 1
        );
    }
    let summary = &lines[faults as usize];
    assert_eq!(summary["summary"], true);
    assert_eq!(summary["faults"], faults);
    assert_eq!(summary["lost"], 0);
}

// Back in the default run (2026-11-26): it was out of it after a returning old primary was now
// and then not caught up within 60 s (about one failover in five or ten, debug build). Not seen
// since the promoted primary counts as protected only at the rejoined standby's first
// acknowledgement (2b8dfe2, a fix for a hang with the same trigger) and the harness stopped
// tripping over a zombie postmaster's socket lock: 24 runs by hand (48 failovers, debug build)
// and a 10-fault release run passed. The cause of the old symptom was not pinned down.
// It came back once in CI on 2026-11-28 (fault 1; not reproduced here in 17 runs of 4 faults under
// load). The likely reading, from those runs' logs, where such a request shows at nearly every
// rejoin: the old primary, restarted as the standby, took the new primary's epoch from the
// coordinator at start, counted its own handshake (opening and cutting its copy) as the primary's
// silence and asked to be promoted; it was refused because the new primary had just renewed, but
// one late renewal would have let it take over, and the harness then waits for a primary that
// stepped down. Since then a standby takes an epoch up only from its primary's stream and its
// handshake is not silence (tests/failover.rs in stela-server). The failure message now carries
// both daemons' logs and the new primary's status.
#[test]
fn two_failovers_lose_no_acknowledged_row() {
    failovers(2, 17520, Duration::from_secs(240));
}

#[test]
#[ignore = "about a minute: cargo test -p stela-bench --test pg_failover -- --ignored"]
fn ten_failovers_lose_no_acknowledged_row() {
    failovers(10, 17540, Duration::from_secs(600));
}
