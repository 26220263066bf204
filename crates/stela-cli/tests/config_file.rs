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
    assert!(printed.contains("buffer-size = 262144\n"), "{printed}");
    assert!(printed.contains("socket-mode = \"660\"\n"), "{printed}");
    assert!(printed.contains("no-realtime = true\n"), "{printed}");
    // Every default is there too, so the file documents what runs.
    assert!(printed.contains("power-window = 50\n"), "{printed}");

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
    assert!(text(&out).contains("no-such-setting"), "{}", text(&out));
}
