//! A log's files are its owner's alone. Issue 54 found directories 0755 and segments 0644 under
//! the usual umask 022, so another user on the machine read a log's records straight from its
//! segments. Every directory the log creates must be 0700 and every file 0600, whatever the
//! umask; and a name in a log's directory is never followed through a symbolic link.
//!
//! One test per binary changes the process's umask, so this target holds only these tests.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use stela_wal::{Codec, Wal, WalOptions};

/// Every entry under `top` (not `top` itself), with its mode bits.
fn modes_under(top: &Path) -> Vec<(std::path::PathBuf, u32, bool)> {
    stela_testkit::tree_entries(top)
        .into_iter()
        .map(|(path, meta)| (path, meta.mode() & 0o7777, meta.is_dir()))
        .collect()
}

#[test]
fn directories_are_0700_and_files_0600_under_umask_022() {
    // SAFETY: umask only sets the process's file creation mask; this binary's one test that
    // depends on it sets it first.
    unsafe { libc::umask(0o022) };
    let top = tempfile::tempdir().unwrap();
    let dir = top.path().join("nested").join("log");
    {
        let options = WalOptions::default()
            .codec(Codec::Json)
            .segment_bytes(64 << 10);
        let wal: Wal<(u32, String)> = Wal::open(&dir, options).unwrap();
        let records: Vec<(u32, String)> = (0..2000).map(|i| (i, "x".repeat(40))).collect();
        let last = wal.append_batch(&records).unwrap();
        wal.commit(last).unwrap();
    }
    let entries = modes_under(top.path());
    let files = entries.iter().filter(|(_, _, is_dir)| !is_dir).count();
    // Several segments (64 KiB each for ~100 KB of records), the lock and the state files.
    assert!(files >= 3, "the log wrote files: {entries:?}");
    for (path, mode, is_dir) in &entries {
        let want = if *is_dir { 0o700 } else { 0o600 };
        assert_eq!(*mode, want, "{} is {mode:o}, not {want:o}", path.display());
    }
}

/// A link planted under a name the log opens is not followed: the open fails instead of
/// writing (or reading) the file it points to.
#[test]
fn a_symlinked_name_in_a_log_directory_is_not_followed() {
    let top = tempfile::tempdir().unwrap();
    let dir = top.path().join("log");
    std::fs::create_dir(&dir).unwrap();
    let outside = top.path().join("outside");
    std::fs::write(&outside, b"").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("LOCK")).unwrap();
    let options = WalOptions::default().codec(Codec::Json);
    let opened = Wal::<u32>::open(&dir, options);
    assert!(opened.is_err(), "a log opened through a symlinked LOCK");
    assert_eq!(std::fs::metadata(&outside).unwrap().len(), 0);
}
