//! Black-box tests of `stela wal verify|dump|repair` on real log directories: exit codes, and
//! that every report names the file and offset of the problem.

use std::path::Path;
mod common;

use common::{stela, text};
use stela_wal::{Codec, Wal, WalOptions};

/// Each record is committed on its own, so every record but the last was framed after a sync
/// covered its predecessor: damage to one is then corruption, not a torn last write.
fn make_log(dir: &Path, records: u32) {
    let wal: Wal<(u32, String)> = Wal::open(
        dir,
        WalOptions::default()
            .codec(Codec::MessagePack)
            .segment_bytes(64 << 10),
    )
    .unwrap();
    for i in 0..records {
        wal.append_durable(&(i, format!("record {i}"))).unwrap();
    }
    wal.close().unwrap();
}

fn first_segment(dir: &Path) -> std::path::PathBuf {
    dir.join("00000000000000000001.wal")
}

#[test]
fn verify_of_a_clean_log_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    make_log(dir.path(), 100);
    let out = stela(&["wal", "verify", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("100 record(s)"), "{}", text(&out));
}

#[test]
fn verify_of_a_corrupt_middle_exits_one_naming_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    make_log(dir.path(), 100);
    let path = first_segment(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[256 + 20 + 2] ^= 0x40; // inside the payload of record 1
    std::fs::write(&path, bytes).unwrap();
    let out = stela(&["wal", "verify", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = text(&out);
    assert!(report.contains("00000000000000000001.wal"), "{report}");
    assert!(report.contains("offset 256"), "{report}");
}

#[test]
fn verify_reports_a_torn_tail_but_exits_zero_and_repair_keeps_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    make_log(dir.path(), 10);
    let path = first_segment(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    let end = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
    bytes[end..end + 7].copy_from_slice(&[9, 0, 0, 0, 1, 2, 3]); // half a frame header
    std::fs::write(&path, bytes).unwrap();

    let out = stela(&["wal", "verify", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("torn tail"), "{}", text(&out));

    let out = stela(&["wal", "repair", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("removed a torn write of 7 bytes"),
        "{}",
        text(&out)
    );
    let salvage = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("salvage-")
        })
        .expect("salvage folder");
    let kept: Vec<_> = std::fs::read_dir(&salvage).unwrap().collect();
    assert_eq!(kept.len(), 1);

    let out = stela(&["wal", "verify", dir.path().to_str().unwrap()]);
    assert!(!text(&out).contains("torn tail"), "{}", text(&out));
}

#[test]
fn repair_with_corrupt_suffix_keeps_the_valid_prefix() {
    let dir = tempfile::tempdir().unwrap();
    make_log(dir.path(), 50);
    let path = first_segment(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    // Damage record 11: skip ten frames.
    let mut at = 256;
    for _ in 0..10 {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 20 + len;
    }
    bytes[at + 20] ^= 1;
    std::fs::write(&path, bytes).unwrap();

    let out = stela(&["wal", "repair", dir.path().to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "plain repair refuses corruption (exit 1, damaged): {}",
        text(&out)
    );
    assert!(
        text(&out).contains(&format!("offset {at}")),
        "{}",
        text(&out)
    );

    let out = stela(&[
        "wal",
        "repair",
        "--corrupt-suffix",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("LSNs 1..=10"), "{}", text(&out));
    let out = stela(&["wal", "verify", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn dump_prints_json_lines_with_lsns() {
    let dir = tempfile::tempdir().unwrap();
    make_log(dir.path(), 3);
    let out = stela(&["wal", "dump", dir.path().to_str().unwrap(), "--from", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines,
        vec![
            serde_json::json!({"lsn": 2, "record": [1, "record 1"]}),
            serde_json::json!({"lsn": 3, "record": [2, "record 2"]}),
        ]
    );
}

#[test]
fn a_missing_directory_is_a_clear_error() {
    let out = stela(&["wal", "verify", "/nonexistent/stela-log"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("/nonexistent/stela-log: not a log: no such file or directory"),
        "{}",
        text(&out)
    );
}

/// `docs/DAEMON.md` lists every daemon setting with its default; the defaults live in
/// `stela_server::config`. The page must say what the code does.
#[test]
fn the_settings_page_gives_the_defaults_the_daemon_has() {
    use stela_server::config;
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/DAEMON.md"))
            .expect("docs/DAEMON.md");
    let documented: std::collections::HashMap<String, String> = page
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let flag = cells.get(1)?.strip_prefix("`--")?.strip_suffix('`')?;
            Some((flag.to_owned(), cells.get(2)?.to_string()))
        })
        .collect();
    use stela::units::{Dur, Size};
    let size = |bytes: u64| Size(bytes).to_string();
    let expected: Vec<(&str, String)> = vec![
        ("buffers", config::BUFFERS.to_string()),
        ("buffer-size", size(config::BUFFER_BYTES as u64)),
        ("write-threshold", size(config::WRITE_THRESHOLD as u64)),
        ("flush-interval", Dur(config::FLUSH_INTERVAL).to_string()),
        ("power-window", Dur(config::POWER_WINDOW).to_string()),
        ("segment-size", size(config::SEGMENT_BYTES)),
        ("flushers", config::FLUSHERS.to_string()),
        ("workers", config::WORKERS.to_string()),
        ("max-connections", config::MAX_CONNECTIONS.to_string()),
        ("admin-connections", config::ADMIN_CONNECTIONS.to_string()),
        (
            "handshake-timeout",
            Dur(config::HANDSHAKE_TIMEOUT).to_string(),
        ),
        ("frame-timeout", Dur(config::FRAME_TIMEOUT).to_string()),
        ("idle-timeout", Dur(config::IDLE_TIMEOUT).to_string()),
        (
            "partial-frame-bytes",
            size(config::PARTIAL_FRAME_BYTES as u64),
        ),
        ("output-bytes", size(config::OUTPUT_BYTES as u64)),
        ("ring-size", size(config::RING_BYTES as u64)),
        ("spin", Dur(config::SPIN).to_string()),
        (
            "no-realtime",
            if config::REALTIME_LOOP { "off" } else { "on" }.to_string(),
        ),
    ];
    for (flag, value) in &expected {
        assert_eq!(
            documented.get(*flag),
            Some(value),
            "docs/DAEMON.md gives --{flag} another default than stela_server::config"
        );
    }
    // And `stela serve --help` shows the same defaults (clap takes them from the constants).
    let help = common::text(&common::stela(&["serve", "--help"]));
    for (flag, value) in expected.iter().filter(|(f, _)| *f != "no-realtime") {
        let shown = format!("[default: {value}]");
        let at = help
            .find(&format!("--{flag} "))
            .unwrap_or_else(|| panic!("--{flag} missing from `stela serve --help`"));
        assert!(
            help[at..].contains(&shown),
            "--{flag}: {shown} not shown:\n{help}"
        );
    }
}

/// A log written with `field_names` dumps its MessagePack records with their field names; the
/// default (compact) log dumps them as arrays.
#[test]
fn dump_shows_field_names_of_a_log_written_with_them() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Withdrawal {
        account: u32,
        amount: i64,
        memo: String,
    }
    // With field names in every record, or compact records and the names kept once in the
    // log's SCHEMA.json: the dump shows them either way. Without the schema file, arrays.
    let expected = serde_json::json!({"account": 2, "amount": -5, "memo": "withdraw"});
    for (named, drop_schema, expected) in [
        (true, false, expected.clone()),
        (false, false, expected),
        (false, true, serde_json::json!([2, -5, "withdraw"])),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let wal: stela_wal::Wal<Withdrawal> = stela_wal::Wal::open(
            dir.path(),
            stela_wal::WalOptions::default().field_names(named),
        )
        .unwrap();
        let lsn = wal
            .append(&Withdrawal {
                account: 2,
                amount: -5,
                memo: "withdraw".into(),
            })
            .unwrap();
        wal.commit(lsn).unwrap();
        wal.close().unwrap();
        let schema = dir.path().join("SCHEMA.json");
        assert_eq!(
            schema.exists(),
            !named,
            "the schema is kept for compact records only"
        );
        if drop_schema {
            std::fs::remove_file(&schema).unwrap();
        }
        let out = stela(&["wal", "dump", dir.path().to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(line["record"], expected, "field_names {named}");
    }
}

/// A client's typed log in the daemon gets its schema too (sent with the open): the daemon's
/// compact MessagePack records dump with their field names.
#[test]
fn dump_of_a_daemon_log_shows_the_field_names_the_client_sent() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Deposit {
        account: u32,
        amount: i64,
    }
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = common::Daemon::start(&dir, &[]);
    let wal: stela_client::Wal<Deposit> = stela_client::Wal::open(
        daemon.socket(),
        "deposits",
        stela_client::WalOptions::default(),
    )
    .unwrap();
    let lsn = wal
        .append(&Deposit {
            account: 9,
            amount: 40,
        })
        .unwrap();
    wal.commit_at(lsn, stela_client::Durability::Disk).unwrap();
    drop(wal);
    daemon.terminate();
    let out = stela(&["wal", "dump", dir.join("logs/deposits").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        line["record"],
        serde_json::json!({"account": 9, "amount": 40})
    );
}

/// Issue 54, finding 8: a bit flipped in the last acknowledged record of a closed log. Before
/// the synced-end mark, `verify` called it a torn tail and exited 0, and opening cut the record.
/// Now `verify` exits 1 naming the file and offset, and plain `repair` (an open) refuses and
/// changes nothing.
#[test]
fn a_flipped_bit_in_the_last_synced_record_exits_one_and_nothing_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    make_log(dir.path(), 10);
    let path = first_segment(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    let mut at = 256;
    for _ in 0..9 {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 20 + len;
    }
    bytes[at + 21] ^= 0x08; // inside record 10's payload
    std::fs::write(&path, &bytes).unwrap();

    let out = stela(&["wal", "verify", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("offset {at}")),
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains("torn tail"), "{}", text(&out));
    let out = stela(&["wal", "repair", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("expected record LSN 10"),
        "{}",
        text(&out)
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing was cut");
}

/// Issue 54: 3,000 records written without syncs, one bit flipped a third of the way in. An
/// open would cut the 1,999 valid records after it as part of a torn write: `verify` says so
/// with exit 7 (before: "clean", exit 0), `repair` keeps them as a log in its salvage folder
/// and counts what it dropped, and the log is clean afterwards.
#[test]
fn verify_counts_the_valid_records_an_open_would_cut_and_repair_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let wal: Wal<(u32, String)> = Wal::open(
        dir.path(),
        WalOptions::default()
            .codec(Codec::MessagePack)
            .sync(stela_wal::SyncMode::None),
    )
    .unwrap();
    for i in 0..3000 {
        wal.append(&(i, format!("record {i}"))).unwrap();
    }
    wal.close().unwrap();
    let path = first_segment(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    let mut at = 256;
    for _ in 0..1000 {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 20 + len;
    }
    bytes[at + 22] ^= 0x01; // record 1001
    std::fs::write(&path, &bytes).unwrap();

    let out = stela(&["wal", "verify", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    assert!(
        text(&out).contains("would cut 1999 record(s)"),
        "{}",
        text(&out)
    );
    let out = stela(&["wal", "verify", "--json", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    assert!(
        text(&out).contains("\"would_cut_records\":1999"),
        "{}",
        text(&out)
    );

    let out = stela(&["wal", "repair", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("dropped, unreadable: 1 record(s), LSNs 1001..=1001"),
        "{said}"
    );
    assert!(said.contains("kept records 1002..=3000"), "{said}");
    let kept = said
        .lines()
        .find_map(|l| l.strip_prefix("kept records 1002..=3000 as a log in "))
        .and_then(|l| l.strip_suffix(" (stela wal dump reads it)"))
        .expect("the kept log's directory")
        .to_owned();
    let out = stela(&["wal", "dump", &kept]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1999);
    let out = stela(&["wal", "verify", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("1000 record(s)"), "{}", text(&out));
}

/// `wal dump` with pg_waldump's habits: a range (`--from`, `--to`), `--limit`, a readable
/// `--text` line per record, and `--stats` alone; a range that stops before the damage is a
/// clean dump, one that reaches it exits 1.
#[test]
fn dump_takes_a_range_a_limit_a_text_view_and_stats() {
    let dir = tempfile::tempdir().unwrap();
    make_log(dir.path(), 10);
    let log = dir.path().to_str().unwrap();
    let lines = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["wal", "dump", log];
        all.extend_from_slice(args);
        let out = stela(&all);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let lsns = |lines: &[String]| -> Vec<u64> {
        lines
            .iter()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["lsn"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(lsns(&lines(&["--from", "3", "--to", "5"])), vec![3, 4, 5]);
    assert_eq!(
        lsns(&lines(&["--from", "8", "--limit", "5"])),
        vec![8, 9, 10]
    );
    assert_eq!(lsns(&lines(&["--limit", "2"])), vec![1, 2]);
    let text_view = lines(&["--from", "2", "--to", "2", "--text"]);
    assert_eq!(text_view.len(), 1, "{text_view:?}");
    assert!(
        text_view[0].starts_with("lsn 2  len ") && text_view[0].ends_with("[1,\"record 1\"]"),
        "{text_view:?}"
    );
    let stats = lines(&["--stats", "--from", "4"]).join("\n");
    assert!(
        stats.contains("records: 7, LSNs 4..=10, codec msgpack"),
        "{stats}"
    );
    assert!(stats.contains("payload bytes: "), "{stats}");

    // Damage at record 6: a range before it is clean, one reaching it exits 1.
    let path = first_segment(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    let sixth = find_record(&bytes, "record 5");
    bytes[sixth] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    assert_eq!(lsns(&lines(&["--to", "5"])), vec![1, 2, 3, 4, 5]);
    assert_eq!(lsns(&lines(&["--limit", "5"])), vec![1, 2, 3, 4, 5]);
    let reaching = stela(&["wal", "dump", log, "--to", "8"]);
    assert_eq!(reaching.status.code(), Some(1), "{}", text(&reaching));
}

/// Where a record's text begins in a segment's bytes.
fn find_record(bytes: &[u8], needle: &str) -> usize {
    bytes
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .unwrap_or_else(|| panic!("{needle:?} not in the segment"))
}

/// Issue 55: `repair` says what it will cut before cutting (and with `--dry-run` changes
/// nothing), points a damaged log's plain repair to `--corrupt-suffix`, accounts for every LSN
/// from the cut on (kept in salvage, or counted as dropped), says an emptied log holds no
/// records (it said "LSNs 0..=0"), and names the salvage folder by LSN and ISO time.
#[test]
fn repair_says_what_it_cuts_first_and_accounts_for_every_record() {
    for (damaged, cut_at) in [("record 4", 5u64), ("record 0", 1)] {
        let dir = tempfile::tempdir().unwrap();
        make_log(dir.path(), 10);
        let path = first_segment(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        let at = find_record(&bytes, damaged);
        bytes[at] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        let log = dir.path().to_str().unwrap();

        let plain = stela(&["wal", "repair", log]);
        assert_eq!(plain.status.code(), Some(1), "{}", text(&plain));
        assert!(
            text(&plain).contains("--corrupt-suffix"),
            "{}",
            text(&plain)
        );
        assert!(
            text(&plain).contains("nothing was changed"),
            "{}",
            text(&plain)
        );

        let dry = stela(&["wal", "repair", "--corrupt-suffix", "--dry-run", log]);
        assert_eq!(dry.status.code(), Some(0), "{}", text(&dry));
        assert!(
            text(&dry).contains(&format!("would cut the log at LSN {cut_at}")),
            "{}",
            text(&dry)
        );
        let still = stela(&["wal", "verify", log]);
        assert_eq!(still.status.code(), Some(1), "--dry-run changed the log");

        let cut = stela(&["wal", "repair", "--corrupt-suffix", log]);
        assert_eq!(cut.status.code(), Some(0), "{}", text(&cut));
        let said = text(&cut);
        let plan = said
            .find(&format!("will cut the log at LSN {cut_at}"))
            .unwrap_or_else(|| panic!("no plan in: {said}"));
        let done = said.find("cut the log at offset").expect("the cut");
        assert!(plan < done, "the plan after the cut: {said}");
        // Every LSN from the cut to the old end: kept in salvage or counted as dropped.
        let mut accounted = Vec::new();
        for line in said.lines() {
            let range = line
                .strip_prefix("kept records ")
                .map(|rest| rest.split(' ').next().unwrap())
                .or_else(|| {
                    line.split("LSNs ")
                        .nth(1)
                        .filter(|_| line.starts_with("dropped"))
                });
            if let Some(range) = range {
                let (first, last) = range.split_once("..=").unwrap();
                let (first, last): (u64, u64) = (first.parse().unwrap(), last.parse().unwrap());
                accounted.extend(first..=last);
            }
        }
        accounted.sort_unstable();
        assert_eq!(accounted, (cut_at..=10).collect::<Vec<_>>(), "{said}");
        if cut_at == 1 {
            assert!(said.contains("log now holds no records"), "{said}");
        } else {
            assert!(
                said.contains(&format!("log now holds LSNs 1..={}", cut_at - 1)),
                "{said}"
            );
        }
        assert!(!said.contains("0..=0"), "{said}");
        let salvage: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("salvage"))
            .collect();
        assert_eq!(salvage.len(), 1, "{salvage:?}");
        let name = &salvage[0];
        let prefix = format!("salvage-lsn-{cut_at}-20");
        assert!(name.starts_with(&prefix) && name.ends_with('Z'), "{name}");
        assert!(name.contains('T') && !name.contains(':'), "{name}");
    }
}

/// Issue 54: a witness reachable from other machines authenticates its nodes by token; without
/// a token file it refuses to start there (on loopback it serves its own user's nodes).
#[test]
fn a_witness_off_loopback_needs_a_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("w");
    let output = stela(&[
        "witness",
        "--listen",
        "0.0.0.0:0",
        "--dir",
        state.to_str().unwrap(),
    ]);
    assert!(!output.status.success(), "{}", text(&output));
    assert!(
        text(&output).contains("needs --token-file"),
        "{}",
        text(&output)
    );
}

/// Each command's short help, as `stela --help` (and each command group's `--help`) lists it,
/// is one short line; the detail is in the command's own long help.
#[test]
fn every_commands_short_help_is_one_short_line() {
    for group in [&[][..], &["wal"], &["logs"], &["cluster"]] {
        let out = stela(&[group, &["--help"][..]].concat());
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        let commands = help
            .split("Commands:\n")
            .nth(1)
            .and_then(|rest| rest.split("\n\n").next())
            .unwrap_or_else(|| panic!("no commands in {group:?}'s help:\n{help}"));
        let long: Vec<&str> = commands
            .lines()
            .filter(|line| line.chars().count() > 100)
            .collect();
        assert!(
            long.is_empty(),
            "`stela {} --help`: short helps over 100 characters:\n{}",
            group.join(" "),
            long.join("\n")
        );
    }
}
