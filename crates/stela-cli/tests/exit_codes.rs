//! Every exit code of `stela` in docs/DAEMON.md's table, provoked for real: the table and
//! `stela --help` list the same codes, and each code comes out of the case the table names.
//! (1 and 7, a damaged log and a log whose open would cut good records, are provoked in
//! tests/cli.rs: `verify_of_a_corrupt_middle_exits_one_naming_file_and_offset`,
//! `verify_counts_the_valid_records_an_open_would_cut_and_repair_keeps_them`.)

mod common;

use common::{stela, text, Daemon};

/// The codes of docs/DAEMON.md's "Exit codes" table.
fn documented_codes() -> Vec<u8> {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/DAEMON.md"))
            .unwrap();
    let table = page
        .split("## Exit codes")
        .nth(1)
        .expect("docs/DAEMON.md has an \"Exit codes\" section");
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('|').nth(1)?.trim().parse().ok())
        .collect()
}

#[test]
fn the_table_and_the_help_list_the_same_codes() {
    let codes = documented_codes();
    assert_eq!(codes, (0..=7).collect::<Vec<u8>>());
    let help = text(&stela(&["--help"]));
    for code in codes {
        assert!(help.contains(&format!("{code} ")), "{code} not in:\n{help}");
    }
}

#[test]
fn ok_bad_arguments_and_not_a_log() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    let healthy = stela(&["status", "--dir", daemon.dir_arg()]);
    assert_eq!(healthy.status.code(), Some(0), "{}", text(&healthy));
    assert!(text(&healthy).contains("health: ok"));
    daemon.terminate();

    let bad = stela(&["status", "--no-such-flag"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));

    let empty = base.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let not_a_log = stela(&["wal", "verify", empty.to_str().unwrap()]);
    assert_eq!(not_a_log.status.code(), Some(4), "{}", text(&not_a_log));
}

/// Issue 55: no daemon at the address exits 6 (the docs said 2), and `--json` still prints
/// JSON for a monitor to parse.
#[test]
fn no_daemon_exits_six_and_json_says_so_in_json() {
    let base = tempfile::tempdir().unwrap();
    let nowhere = base.path().join("nowhere");
    let plain = stela(&["status", "--dir", nowhere.to_str().unwrap()]);
    assert_eq!(plain.status.code(), Some(6), "{}", text(&plain));
    assert!(
        text(&plain).contains("nowhere/stela.sock"),
        "{}",
        text(&plain)
    );

    let json = stela(&["status", "--dir", nowhere.to_str().unwrap(), "--json"]);
    assert_eq!(json.status.code(), Some(6), "{}", text(&json));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&json)));
    assert_eq!(value["healthy"], false, "{value}");
    assert_eq!(value["reachable"], false, "{value}");
    assert_eq!(value["exit_code"], 6, "{value}");
    assert!(
        value["problems"][0]
            .as_str()
            .is_some_and(|p| p.contains("nowhere/stela.sock")),
        "{value}"
    );
}

/// Issue 55: a second `serve` on a directory a daemon serves exits 5, as the docs say (it
/// exited 2), and leaves the first one serving.
#[test]
fn a_second_daemon_on_the_same_directory_exits_five() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    let second = stela(&[
        "serve",
        "--dir",
        daemon.dir_arg(),
        "--assume-write-rate",
        "500MB",
    ]);
    assert_eq!(second.status.code(), Some(5), "{}", text(&second));
    assert!(
        text(&second).contains("already serving"),
        "{}",
        text(&second)
    );
    let status = stela(&["status", "--dir", daemon.dir_arg()]);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    daemon.terminate();
}

/// Issue 55: a primary whose `--standby` does not exist, with no log open, said `health: ok`;
/// it is unhealthy (exit 3) and says which standby does not answer.
#[test]
fn a_primary_whose_standby_does_not_exist_is_unhealthy_before_any_log_opens() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let nobody = stela_testkit::free_addr();
    let daemon = Daemon::start(&dir, &["--standby", &nobody.to_string()]);
    let status = stela(&["status", "--dir", daemon.dir_arg()]);
    assert_eq!(status.status.code(), Some(3), "{}", text(&status));
    assert!(
        text(&status).contains(&format!("the standby at {nobody} does not answer")),
        "{}",
        text(&status)
    );
    let json = stela(&["status", "--dir", daemon.dir_arg(), "--json"]);
    assert_eq!(json.status.code(), Some(3), "{}", text(&json));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["healthy"], false, "{value}");
    daemon.terminate();
}

/// Issue 55: each `stela status` probe logged two INFO lines (accepted, closed), which a
/// health check every few seconds turns into most of the journal. Probes log at debug; a
/// client's connection is still logged at info (tests/json_logs.rs).
#[test]
fn status_probes_log_nothing_at_info() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    let before = daemon.output();
    for _ in 0..3 {
        let status = stela(&["status", "--dir", daemon.dir_arg()]);
        assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    }
    // A client's connection, which is logged, so that the probes' silence is not the log's.
    let wal: stela_client::Wal<String> =
        stela_client::Wal::open(daemon.socket(), "l", stela_client::WalOptions::default()).unwrap();
    wal.close().unwrap();
    stela_testkit::eventually(
        "the client's connection logged as closed",
        std::time::Duration::from_secs(10),
        || {
            daemon.output().matches("connection closed").count()
                > before.matches("connection closed").count()
        },
    );
    let after = daemon.output();
    let new = &after[before.len()..];
    assert_eq!(new.matches("connection accepted").count(), 1, "{new}");
    assert_eq!(new.matches("connection closed").count(), 1, "{new}");
    daemon.terminate();
}
