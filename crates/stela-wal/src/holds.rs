//! Holds on a standby's copy of a log: a process that reads the copy beside the standby daemon
//! (a warm follower: `stela mount-follow`, `stela store-follow`) records the first LSN it still
//! needs, and the daemon, when its primary says it has truncated the log, never cuts its copy
//! past the lowest hold (PostgreSQL's replication slots keep WAL for the same reason).
//!
//! A copy's holds live beside it: for the log directory `DIR/logs/NAME`, in `DIR/holds/NAME/`,
//! one file per holder, named by a hash of the holder's own directory, holding the LSN as text
//! and the holder's path on a second line (for whoever lists them). A follower that is retired
//! for good must have its file removed by hand, or the copy keeps everything from its LSN on.
//!
//! Invariants:
//! - **A hold that exists survives a crash.** Its file is created synced, with its directory
//!   synced; later updates are renamed over it unsynced, so after a crash it says the new LSN
//!   or an older one, both safe (a hold only ever keeps more).
//! - **An unreadable hold keeps everything.** A file that cannot be read or parsed counts as
//!   LSN 1, and is reported.

use crate::storage::{OpenMode, Storage};
use std::path::{Path, PathBuf};
use stela_format::Lsn;

/// Where the holds on the copy in `log_dir` (`DIR/logs/NAME`) live: `DIR/holds/NAME`. `None`
/// for a directory that is not a daemon's `logs/NAME`, which no daemon truncates.
pub fn holds_dir(log_dir: &Path) -> Option<PathBuf> {
    let name = log_dir.file_name()?;
    let logs = log_dir.parent()?;
    if logs.file_name()? != "logs" {
        return None;
    }
    Some(logs.parent()?.join("holds").join(name))
}

/// Records on `storage` that `holder` (the follower's own directory) needs the copy in
/// `log_dir` from `first_needed` on. `false`: `log_dir` is not a daemon's `DIR/logs/NAME`, so
/// there is nothing to hold (no daemon truncates it).
///
/// # Errors
/// The I/O error of creating, writing, syncing or renaming the hold's file.
pub fn record(
    storage: &dyn Storage,
    log_dir: &Path,
    holder: &Path,
    first_needed: Lsn,
) -> std::io::Result<bool> {
    let Some(dir) = holds_dir(log_dir) else {
        return Ok(false);
    };
    let holder = std::fs::canonicalize(holder).unwrap_or_else(|_| holder.to_owned());
    let name = format!(
        "{:08x}",
        crc32c::crc32c(holder.as_os_str().as_encoded_bytes())
    );
    let path = dir.join(&name);
    let text = format!("{}\n{}\n", first_needed.get(), holder.display());
    let new = !storage.list(&dir).is_ok_and(|names| names.contains(&name));
    if new {
        storage.create_dir_all(&dir)?;
    }
    let temporary = dir.join(format!("{name}.new"));
    match storage.remove(&temporary) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let file = storage.open(&temporary, OpenMode::CreateNew)?;
    file.write_all_at(text.as_bytes(), 0)?;
    if new {
        file.sync_data()?;
    }
    drop(file);
    storage.rename(&temporary, &path)?;
    if new {
        storage.sync_dir(&dir)?;
        if let Some(parent) = dir.parent() {
            storage.sync_dir(parent)?;
        }
    }
    Ok(true)
}

/// The lowest hold on the copy in `log_dir`, if there is any. A hold that cannot be read
/// counts as LSN 1 and is named in the second value.
pub fn lowest(storage: &dyn Storage, log_dir: &Path) -> (Option<Lsn>, Vec<String>) {
    let mut unreadable = Vec::new();
    let Some(dir) = holds_dir(log_dir) else {
        return (None, unreadable);
    };
    let names = match storage.list(&dir) {
        Ok(names) => names,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (None, unreadable),
        Err(e) => return (Some(Lsn::new(1)), vec![format!("{}: {e}", dir.display())]),
    };
    let mut lowest: Option<Lsn> = None;
    // A hold being replaced (`.new`) is skipped: its final name follows.
    for name in names.iter().filter(|name| !name.ends_with(".new")) {
        let path = dir.join(name);
        let held = storage
            .open(&path, OpenMode::Read)
            .and_then(|file| file.read_to_vec())
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                let text = String::from_utf8_lossy(&bytes);
                let first = text.lines().next().unwrap_or_default().trim().to_owned();
                first
                    .parse::<u64>()
                    .map_err(|_| format!("{first:?} is not an LSN"))
            });
        let held = match held {
            Ok(lsn) => Lsn::new(lsn.max(1)),
            Err(why) => {
                unreadable.push(format!("{}: {why}", path.display()));
                Lsn::new(1)
            }
        };
        lowest = Some(lowest.map_or(held, |was| was.min(held)));
    }
    (lowest, unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StdStorage;

    #[test]
    fn holds_are_kept_beside_the_copy_and_the_lowest_wins() {
        let daemon = tempfile::tempdir().unwrap();
        let log_dir = daemon.path().join("logs").join("orders");
        std::fs::create_dir_all(&log_dir).unwrap();
        assert_eq!(lowest(&StdStorage, &log_dir), (None, vec![]));
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        assert!(record(&StdStorage, &log_dir, a.path(), Lsn::new(500)).unwrap());
        assert!(record(&StdStorage, &log_dir, b.path(), Lsn::new(90)).unwrap());
        assert_eq!(lowest(&StdStorage, &log_dir), (Some(Lsn::new(90)), vec![]));
        // A holder moves on: its own file is replaced, the other's kept.
        record(&StdStorage, &log_dir, b.path(), Lsn::new(700)).unwrap();
        assert_eq!(lowest(&StdStorage, &log_dir), (Some(Lsn::new(500)), vec![]));
        let held = holds_dir(&log_dir).unwrap();
        assert_eq!(held, daemon.path().join("holds").join("orders"));
        assert_eq!(std::fs::read_dir(&held).unwrap().count(), 2);
        // Outside a daemon's `logs` there is nothing to hold, and nothing is written.
        let loose = daemon.path().join("elsewhere");
        assert!(!record(&StdStorage, &loose, a.path(), Lsn::new(3)).unwrap());
        assert_eq!(lowest(&StdStorage, &loose), (None, vec![]));
    }

    #[test]
    fn an_unreadable_hold_keeps_everything_and_is_reported() {
        let daemon = tempfile::tempdir().unwrap();
        let log_dir = daemon.path().join("logs").join("orders");
        let holder = tempfile::tempdir().unwrap();
        record(&StdStorage, &log_dir, holder.path(), Lsn::new(500)).unwrap();
        let dir = holds_dir(&log_dir).unwrap();
        std::fs::write(dir.join("garbled"), "not a number\n").unwrap();
        let (held, unreadable) = lowest(&StdStorage, &log_dir);
        assert_eq!(held, Some(Lsn::new(1)));
        assert_eq!(unreadable.len(), 1, "{unreadable:?}");
        assert!(unreadable[0].contains("garbled"), "{unreadable:?}");
    }
}
