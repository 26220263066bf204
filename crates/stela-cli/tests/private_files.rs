//! The daemon's files are its owner's alone, and nothing inside its directory is followed
//! through a symbolic link (issue 54, finding 9). Under the usual umask 022 the daemon made its
//! directories 0755 and its segments 0644, so another user read a log's records straight from
//! the disk; and a log directory `DIR/logs/NAME` that was a link to elsewhere was followed, so
//! the log was written outside DIR.
//!
//! The tests set this process's umask to 022 before starting daemons (which inherit it); they
//! are in a target of their own so that no other test sees that.

mod common;

use common::Daemon;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use stela_client::{Wal, WalOptions};

fn umask_022() {
    // SAFETY: umask only sets this process's file creation mask, which the daemons inherit.
    unsafe { libc::umask(0o022) };
}

/// `top` itself and every entry under it, with its mode bits and kind.
fn entries(top: &Path) -> Vec<(PathBuf, u32, std::fs::FileType)> {
    let meta = std::fs::symlink_metadata(top).unwrap();
    let under = stela_testkit::tree_entries(top).into_iter();
    std::iter::once((top.to_owned(), meta))
        .chain(under)
        .map(|(path, meta)| (path, meta.mode() & 0o7777, meta.file_type()))
        .collect()
}

fn write_a_log(daemon: &Daemon, name: &str) {
    let wal: Wal<String> = Wal::open(daemon.socket(), name, WalOptions::default()).unwrap();
    for i in 0..200 {
        wal.append_durable(&format!("record {i} of {name}"))
            .unwrap();
    }
    wal.close().unwrap();
}

/// Under umask 022: DIR, DIR/logs and each log's directory are 0700, every file in them 0600
/// (segments, LOCK, TERMS, SYNCED, ...), the socket 0600. With `--socket-mode 0660` the socket
/// is 0660 and DIR gains only the group's search bit (0710), so the group can reach the socket
/// but not list DIR; the logs below stay 0700 and 0600.
#[test]
fn directories_are_0700_and_files_0600_under_umask_022() {
    umask_022();
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    write_a_log(&daemon, "private");
    let seen = entries(&dir);
    assert!(
        seen.iter()
            .any(|(p, _, _)| p.extension().is_some_and(|e| e == "wal")),
        "no segment written: {seen:?}"
    );
    for (path, mode, kind) in &seen {
        let want = if kind.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(*mode, want, "{} is {mode:o}, not {want:o}", path.display());
    }
    daemon.terminate();

    let shared = base.path().join("shared");
    let daemon = Daemon::start(&shared, &["--socket-mode", "0660"]);
    write_a_log(&daemon, "private");
    for (path, mode, kind) in entries(&shared) {
        let want = if path == shared {
            0o710
        } else if kind.is_socket() {
            0o660
        } else if kind.is_dir() {
            0o700
        } else {
            0o600
        };
        assert_eq!(mode, want, "{} is {mode:o}, not {want:o}", path.display());
    }
    daemon.terminate();
}

/// A log directory planted as a symbolic link to a directory outside DIR is refused: the client
/// is told why (open failed, "symbolic link"), the daemon logs it, and nothing is written where
/// the link points. Other logs go on as before.
#[test]
fn a_symlinked_log_directory_is_refused() {
    umask_022();
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &[]);
    let outside = base.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("logs").join("planted")).unwrap();

    let refused = Wal::<String>::open(daemon.socket(), "planted", WalOptions::default());
    let Err(error) = refused else {
        panic!("a log opened through a symbolic link");
    };
    assert_eq!(
        error.code(),
        Some(stela_client::ErrorCode::OpenFailed),
        "{error}"
    );
    assert!(error.to_string().contains("symbolic link"), "{error}");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "files written through the link"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !daemon.output().contains("symbolic link") {
        assert!(
            std::time::Instant::now() < deadline,
            "not logged:\n{}",
            daemon.output()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    write_a_log(&daemon, "honest");
    daemon.terminate();
}
