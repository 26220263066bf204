//! `stela serve --config FILE` and `--print-config`: the printed settings are a file that reads
//! back to the same settings; flags on the command line override the file; a bad file is a
//! clear error naming it; and a daemon runs from a file alone.

mod common;

use common::{stela, text};

fn print_config(args: &[&str]) -> String {
    let mut all = vec!["serve"];
    all.extend_from_slice(args);
    all.push("--print-config");
    let out = stela(&all);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn printed_settings_read_back_and_flags_override_the_file() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let dir_arg = dir.to_str().unwrap();
    let printed = print_config(&[
        "--dir",
        dir_arg,
        "--buffers",
        "8",
        "--buffer-size",
        "256KiB",
        "--socket-mode",
        "660",
        "--no-realtime",
        "--assume-write-rate",
        "123456789",
    ]);
    assert!(printed.contains("buffers = 8\n"), "{printed}");
    assert!(printed.contains("buffer-size = \"256KiB\"\n"), "{printed}");
    assert!(printed.contains("socket-mode = \"660\"\n"), "{printed}");
    assert!(printed.contains("no-realtime = true\n"), "{printed}");
    // Every default is there too, so the file documents what runs.
    assert!(printed.contains("power-window = \"50ms\"\n"), "{printed}");
    assert!(printed.contains("idle-timeout = \"1h\"\n"), "{printed}");
    assert!(
        printed.contains("assume-write-rate = \"123456789B\"\n"),
        "{printed}"
    );

    let file = base.path().join("stela.toml");
    std::fs::write(&file, &printed).unwrap();
    let file_arg = file.to_str().unwrap();
    assert_eq!(print_config(&["--config", file_arg]), printed);
    let overridden = print_config(&["--config", file_arg, "--buffers", "12"]);
    assert!(overridden.contains("buffers = 12\n"), "{overridden}");
    assert_eq!(
        overridden.replace("buffers = 12\n", "buffers = 8\n"),
        printed,
        "a flag changed more than its own setting"
    );

    // A daemon from the file alone.
    let mut daemon = std::process::Command::new(env!("CARGO_BIN_EXE_stela"))
        .args(["serve", "--config", file_arg])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !dir.join("stela.sock").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let status = stela(&["status", "--dir", dir_arg, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["buffers"], 8, "{json}");
    assert_eq!(json["buffer_bytes"], 262144, "{json}");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.join("stela.sock"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o660);
    unsafe {
        // SAFETY: signalling our own child process by its pid.
        libc::kill(daemon.id() as i32, libc::SIGTERM);
    }
    assert!(daemon.wait().unwrap().success());
}

#[test]
fn a_bad_config_file_is_a_clear_error() {
    let base = tempfile::tempdir().unwrap();
    let missing = base.path().join("missing.toml");
    let out = stela(&["serve", "--config", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("missing.toml"), "{}", text(&out));

    let bad = base.path().join("bad.toml");
    std::fs::write(&bad, "buffers = [[1]]\n").unwrap();
    let out = stela(&["serve", "--config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("bad.toml"), "{}", text(&out));

    let unknown = base.path().join("unknown.toml");
    std::fs::write(&unknown, "dir = \"/tmp/x\"\nno-such-setting = 3\n").unwrap();
    let out = stela(&["serve", "--config", unknown.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("unknown.toml:2: unknown setting `no-such-setting`"),
        "{}",
        text(&out)
    );
}

/// Every key is checked against the flags and every value against its flag's parser before
/// anything starts, and the message names the file and the line.
#[test]
fn a_misspelt_key_or_a_bad_value_names_the_file_and_line() {
    let base = tempfile::tempdir().unwrap();
    let refused = |name: &str, body: &str, expected: &str| {
        let file = base.path().join(name);
        std::fs::write(&file, body).unwrap();
        let out = stela(&["serve", "--config", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let said = text(&out);
        assert!(said.contains(&format!("{name}:{expected}")), "{said}");
        assert!(
            !said.contains("--bufers"),
            "a clap error, not the file's: {said}"
        );
    };
    refused(
        "typo.toml",
        "dir = \"/tmp/x\"\n\n# buffers\nbufers = 8\n",
        "4: unknown setting `bufers` (did you mean `buffers`?)",
    );
    refused(
        "size.toml",
        "dir = \"/tmp/x\"\nbuffer-size = \"lots\"\n",
        "2: `buffer-size` = \"lots\": \"lots\" is not a size",
    );
    refused(
        "duration.toml",
        "flush-interval = \"soon\"\ndir = \"/tmp/x\"\n",
        "1: `flush-interval` = \"soon\": \"soon\" is not a duration",
    );
    refused(
        "flag.toml",
        "dir = \"/tmp/x\"\nno-realtime = 3\n",
        "2: `no-realtime` takes true or false (found: integer)",
    );
}

/// Sizes and durations in one spelling (`512KiB`, `50ms`) in flags and the file; the old
/// spellings (bare numbers in each flag's old unit, `--spin-us`, `--heartbeat-ms`) still work.
#[test]
fn units_in_flags_and_files_and_the_old_spellings_still_work() {
    let new = print_config(&[
        "--dir",
        "/tmp/x",
        "--flush-interval",
        "2s",
        "--idle-timeout",
        "90s",
        "--spin",
        "20us",
        "--assume-write-rate",
        "200MB/s",
        "--segment-size",
        "16MiB",
        "--heartbeat",
        "40ms",
    ]);
    let old = print_config(&[
        "--dir",
        "/tmp/x",
        "--flush-interval",
        "2000",
        "--idle-timeout",
        "90",
        "--spin-us",
        "20",
        "--assume-write-rate",
        "200000000",
        "--segment-size",
        "16M",
        "--heartbeat-ms",
        "40",
    ]);
    assert_eq!(new, old);
    for line in [
        "flush-interval = \"2s\"\n",
        "idle-timeout = \"1m 30s\"\n",
        "spin = \"20us\"\n",
        "assume-write-rate = \"200MB\"\n",
        "segment-size = \"16MiB\"\n",
        "heartbeat = \"40ms\"\n",
    ] {
        assert!(new.contains(line), "{line:?} not in:\n{new}");
    }
    // The old key names in a file, too.
    let base = tempfile::tempdir().unwrap();
    let file = base.path().join("old.toml");
    std::fs::write(&file, "dir = \"/tmp/x\"\nspin-us = 20\nheartbeat-ms = 40\n").unwrap();
    let from_file = print_config(&["--config", file.to_str().unwrap()]);
    assert!(from_file.contains("spin = \"20us\"\n"), "{from_file}");
    assert!(from_file.contains("heartbeat = \"40ms\"\n"), "{from_file}");
}

/// `-h` is one short line per flag (`--help` has the detail), and the help says what is true:
/// replication off loopback runs over TLS.
#[test]
fn short_help_is_one_short_line_per_flag_and_long_help_tells_the_truth() {
    for command in [
        &["serve", "-h"][..],
        &["status", "-h"],
        &["wal", "dump", "-h"],
    ] {
        let out = stela(command);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let help = String::from_utf8(out.stdout).unwrap();
        for line in help.lines().filter(|l| l.trim_start().starts_with("--")) {
            let described = line.split(" [default").next().unwrap();
            let described = described.split(" [possible values").next().unwrap();
            let (_, what) = described.trim().split_once("  ").unwrap_or(("", described));
            assert!(
                what.trim().len() <= 90,
                "{command:?}: a short help of {} characters: {line}",
                what.trim().len()
            );
        }
    }
    let long = text(&stela(&["serve", "--help"]));
    assert!(!long.contains("until the stream runs over TLS"), "{long}");
    assert!(long.contains("--standby-ca"), "{long}");
    assert!(long.contains("[default: 512KiB]"), "{long}");
    assert!(long.contains("[default: 50ms]"), "{long}");
}
