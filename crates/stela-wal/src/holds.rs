//! Holds on a standby's copy of a log: a process that reads the copy beside the standby daemon
//! (a warm follower: `stela mount-follow`, `stela store-follow`) records the first LSN it still
//! needs, and the daemon, when its primary says it has truncated the log, never cuts its copy
//! past the lowest hold (PostgreSQL's replication slots keep WAL for the same reason).
//!
//! A copy's holds live beside it: for the log directory `DIR/logs/NAME`, in `DIR/holds/NAME/`,
//! one file per holder, named by a hash of the holder's own directory, holding the LSN as text
//! and the holder's path on a second line (for whoever lists them). A follower that is retired
//! for good must have its hold released ([`release`]; `stela logs release-hold`), or the copy
//! keeps everything from its LSN on: `stela logs list` shows every hold, so a forgotten one is
//! seen before it fills the disk.
//!
//! A primary holds its own copy the same way for its standby (holder `standby at HOST:PORT`,
//! [`record_standby`]): from the first LSN the standby has not stored yet, so that a client's
//! truncation or `--retain-bytes` never removes what a lagging or absent standby still has to
//! fetch. Such a hold is the primary's: a node that becomes a standby releases the ones it left
//! ([`release_standby_holds`]), and a standby follows its primary's truncation past them
//! ([`lowest_of_followers`]).
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
    let holder = std::fs::canonicalize(holder).unwrap_or_else(|_| holder.to_owned());
    record_named(
        storage,
        log_dir,
        &holder.display().to_string(),
        first_needed,
    )
}

/// The holder's name a primary records its standby at `standby` (`HOST:PORT`) under.
pub fn standby_holder(standby: &str) -> String {
    format!("{STANDBY_PREFIX}{standby}")
}

const STANDBY_PREFIX: &str = "standby at ";

/// Records on `storage` that the standby at `standby` (`HOST:PORT`) has not stored the copy in
/// `log_dir` from `first_needed` on; see [`record`].
///
/// # Errors
/// The I/O error of creating, writing, syncing or renaming the hold's file.
pub fn record_standby(
    storage: &dyn Storage,
    log_dir: &Path,
    standby: &str,
    first_needed: Lsn,
) -> std::io::Result<bool> {
    record_named(storage, log_dir, &standby_holder(standby), first_needed)
}

fn record_named(
    storage: &dyn Storage,
    log_dir: &Path,
    holder: &str,
    first_needed: Lsn,
) -> std::io::Result<bool> {
    let Some(dir) = holds_dir(log_dir) else {
        return Ok(false);
    };
    let name = file_name(Path::new(holder));
    let path = dir.join(&name);
    let text = format!("{}\n{holder}\n", first_needed.get());
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

/// The name of `holder`'s hold file: a hash of its (canonical) directory.
fn file_name(holder: &Path) -> String {
    format!(
        "{:08x}",
        crc32c::crc32c(holder.as_os_str().as_encoded_bytes())
    )
}

/// One hold on a copy, as [`list`] read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// Its file.
    pub file: PathBuf,
    /// The first LSN it keeps (1 when the file cannot be read: it then keeps everything).
    pub lsn: Lsn,
    /// The holder's directory, as the holder wrote it (`None` if the file does not say).
    pub holder: Option<String>,
    /// Why the file could not be read, if it could not.
    pub unreadable: Option<String>,
}

impl Hold {
    /// Whether a primary recorded this hold for its standby ([`record_standby`]).
    pub fn is_standby(&self) -> bool {
        self.holder
            .as_deref()
            .is_some_and(|holder| holder.starts_with(STANDBY_PREFIX))
    }
}

/// The holds' directory of a copy could not be listed (so every hold on it counts as LSN 1).
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", dir.display())]
pub struct ListError {
    /// The holds' directory (`DIR/holds/NAME`).
    pub dir: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Every hold on the copy in `log_dir`, in file name order.
///
/// # Errors
/// The error of listing the holds' directory (its absence is no error: no holds).
pub fn list(storage: &dyn Storage, log_dir: &Path) -> Result<Vec<Hold>, ListError> {
    let Some(dir) = holds_dir(log_dir) else {
        return Ok(Vec::new());
    };
    let mut names = match storage.list(&dir) {
        Ok(names) => names,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(ListError { dir, source }),
    };
    names.sort();
    // A hold being replaced (`.new`) is skipped: its final name follows.
    let holds = names.iter().filter(|name| !name.ends_with(".new"));
    Ok(holds
        .map(|name| read_hold(storage, dir.join(name)))
        .collect())
}

fn read_hold(storage: &dyn Storage, file: PathBuf) -> Hold {
    let text = storage
        .open(&file, OpenMode::Read)
        .and_then(|file| file.read_to_vec())
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
    let (lsn, holder, unreadable) = match text {
        Err(e) => (Lsn::new(1), None, Some(e.to_string())),
        Ok(text) => {
            let mut lines = text.lines();
            let first = lines.next().unwrap_or_default().trim();
            let holder = lines.next().map(str::to_owned);
            match first.parse::<u64>() {
                Ok(lsn) => (Lsn::new(lsn.max(1)), holder, None),
                Err(_) => (
                    Lsn::new(1),
                    holder,
                    Some(format!("{first:?} is not an LSN")),
                ),
            }
        }
    };
    Hold {
        file,
        lsn,
        holder,
        unreadable,
    }
}

/// The lowest hold on the copy in `log_dir`, if there is any. A hold that cannot be read
/// counts as LSN 1 and is named in the second value.
pub fn lowest(storage: &dyn Storage, log_dir: &Path) -> (Option<Lsn>, Vec<String>) {
    lowest_where(storage, log_dir, |_| true)
}

/// [`lowest`] without the holds a primary recorded for its standby: what a standby's copy
/// keeps when its primary truncates (a standby hold in it is left from when this node was the
/// primary, and no longer stands for anyone it ships to).
pub fn lowest_of_followers(storage: &dyn Storage, log_dir: &Path) -> (Option<Lsn>, Vec<String>) {
    lowest_where(storage, log_dir, |hold| !hold.is_standby())
}

fn lowest_where(
    storage: &dyn Storage,
    log_dir: &Path,
    counts: impl Fn(&Hold) -> bool,
) -> (Option<Lsn>, Vec<String>) {
    match list(storage, log_dir) {
        Err(why) => (Some(Lsn::new(1)), vec![why.to_string()]),
        Ok(holds) => {
            let holds: Vec<&Hold> = holds.iter().filter(|hold| counts(hold)).collect();
            let unreadable = holds.iter().filter_map(|hold| {
                let why = hold.unreadable.as_ref()?;
                Some(format!("{}: {why}", hold.file.display()))
            });
            let unreadable = unreadable.collect();
            (holds.iter().map(|hold| hold.lsn).min(), unreadable)
        }
    }
}

/// Releases every hold a primary recorded on the copy in `log_dir` for its standby: this node
/// is now the standby, and whoever ships to it decides what it keeps. Returns how many.
///
/// # Errors
/// The I/O error of listing the holds, or of removing a file and syncing the directory.
pub fn release_standby_holds(storage: &dyn Storage, log_dir: &Path) -> std::io::Result<usize> {
    release_where(storage, log_dir, Hold::is_standby)
}

/// Releases every hold on the copy in `log_dir`: the log is deleted (a log created later under
/// the same name must not inherit them). Returns how many.
///
/// # Errors
/// As [`release_standby_holds`].
pub fn release_all(storage: &dyn Storage, log_dir: &Path) -> std::io::Result<usize> {
    release_where(storage, log_dir, |_| true)
}

fn release_where(
    storage: &dyn Storage,
    log_dir: &Path,
    released_if: impl Fn(&Hold) -> bool,
) -> std::io::Result<usize> {
    let holds = list(storage, log_dir).map_err(std::io::Error::other)?;
    let mut released = 0;
    for hold in holds.iter().filter(|hold| released_if(hold)) {
        storage.remove(&hold.file)?;
        released += 1;
    }
    if released > 0 {
        if let Some(dir) = holds_dir(log_dir) {
            storage.sync_dir(&dir)?;
        }
    }
    Ok(released)
}

/// Releases the hold of a follower retired for good, named by its directory as the listing
/// shows it (or by the hold file's name), so the copy can again be cut behind its primary.
/// Returns the hold released, `None` if there was none by that name.
///
/// # Errors
/// The I/O error of listing the holds, or of removing the file and syncing its directory.
pub fn release(
    storage: &dyn Storage,
    log_dir: &Path,
    holder: &str,
) -> std::io::Result<Option<Hold>> {
    let holds = list(storage, log_dir).map_err(std::io::Error::other)?;
    // The directory as written, as given, canonical if it still exists, or the file's name.
    let canonical = std::fs::canonicalize(holder).ok();
    let named = |hold: &&Hold| {
        hold.holder.as_deref() == Some(holder)
            || canonical
                .as_ref()
                .is_some_and(|c| hold.file.ends_with(file_name(c)))
            || hold.file.file_name().is_some_and(|name| name == holder)
    };
    let Some(hold) = holds.iter().find(named).cloned() else {
        return Ok(None);
    };
    storage.remove(&hold.file)?;
    if let Some(dir) = hold.file.parent() {
        storage.sync_dir(dir)?;
    }
    Ok(Some(hold))
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
    fn holds_are_listed_with_their_holders_and_released_by_name() {
        let daemon = tempfile::tempdir().unwrap();
        let log_dir = daemon.path().join("logs").join("orders");
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        record(&StdStorage, &log_dir, a.path(), Lsn::new(500)).unwrap();
        record(&StdStorage, &log_dir, b.path(), Lsn::new(90)).unwrap();
        let holds = list(&StdStorage, &log_dir).unwrap();
        let mut shown: Vec<(u64, String)> = holds
            .iter()
            .map(|h| (h.lsn.get(), h.holder.clone().unwrap()))
            .collect();
        shown.sort();
        let canonical = |p: &Path| std::fs::canonicalize(p).unwrap().display().to_string();
        assert_eq!(
            shown,
            [(90, canonical(b.path())), (500, canonical(a.path()))]
        );
        assert!(holds.iter().all(|h| h.unreadable.is_none()));

        // Nothing by a name nobody holds under.
        assert_eq!(
            release(&StdStorage, &log_dir, "/no/such/follower").unwrap(),
            None
        );
        assert_eq!(list(&StdStorage, &log_dir).unwrap().len(), 2);
        // A retired follower whose directory is gone is released by the path the listing shows.
        let b_shown = canonical(b.path());
        drop(b);
        let released = release(&StdStorage, &log_dir, &b_shown).unwrap().unwrap();
        assert_eq!(released.lsn, Lsn::new(90));
        assert_eq!(lowest(&StdStorage, &log_dir), (Some(Lsn::new(500)), vec![]));
        // A live one by its directory as given, then nothing is left to hold.
        release(&StdStorage, &log_dir, a.path().to_str().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(lowest(&StdStorage, &log_dir), (None, vec![]));
        // By the file's name too (for a hold whose file no longer says whose it is).
        record(&StdStorage, &log_dir, a.path(), Lsn::new(7)).unwrap();
        let file = list(&StdStorage, &log_dir).unwrap()[0].file.clone();
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(release(&StdStorage, &log_dir, &name).unwrap().is_some());
        assert!(list(&StdStorage, &log_dir).unwrap().is_empty());
    }

    #[test]
    fn a_standby_hold_counts_on_the_primary_and_not_once_the_node_is_a_standby() {
        let daemon = tempfile::tempdir().unwrap();
        let log_dir = daemon.path().join("logs").join("orders");
        let follower = tempfile::tempdir().unwrap();
        record(&StdStorage, &log_dir, follower.path(), Lsn::new(500)).unwrap();
        assert!(record_standby(&StdStorage, &log_dir, "10.0.0.2:7000", Lsn::new(90)).unwrap());
        assert_eq!(lowest(&StdStorage, &log_dir), (Some(Lsn::new(90)), vec![]));
        assert_eq!(
            lowest_of_followers(&StdStorage, &log_dir),
            (Some(Lsn::new(500)), vec![])
        );
        let holds = list(&StdStorage, &log_dir).unwrap();
        let standby: Vec<_> = holds.iter().filter(|h| h.is_standby()).collect();
        assert_eq!(standby.len(), 1);
        assert_eq!(
            standby[0].holder.as_deref(),
            Some("standby at 10.0.0.2:7000")
        );
        // It moves up in place, and is released by the name the listing shows.
        record_standby(&StdStorage, &log_dir, "10.0.0.2:7000", Lsn::new(700)).unwrap();
        assert_eq!(lowest(&StdStorage, &log_dir), (Some(Lsn::new(500)), vec![]));
        assert_eq!(list(&StdStorage, &log_dir).unwrap().len(), 2);
        let released = release(&StdStorage, &log_dir, "standby at 10.0.0.2:7000").unwrap();
        assert_eq!(released.map(|h| h.lsn), Some(Lsn::new(700)));
        // A node turned standby drops the ones it left as a primary, and only those.
        record_standby(&StdStorage, &log_dir, "10.0.0.2:7000", Lsn::new(9)).unwrap();
        record_standby(&StdStorage, &log_dir, "10.0.0.3:7000", Lsn::new(8)).unwrap();
        assert_eq!(release_standby_holds(&StdStorage, &log_dir).unwrap(), 2);
        let left = list(&StdStorage, &log_dir).unwrap();
        assert_eq!(left.len(), 1);
        assert!(!left[0].is_standby());
        assert_eq!(release_standby_holds(&StdStorage, &log_dir).unwrap(), 0);
        // A deleted log's holds all go.
        record_standby(&StdStorage, &log_dir, "10.0.0.2:7000", Lsn::new(9)).unwrap();
        assert_eq!(release_all(&StdStorage, &log_dir).unwrap(), 2);
        assert!(list(&StdStorage, &log_dir).unwrap().is_empty());
        assert_eq!(release_all(&StdStorage, &log_dir).unwrap(), 0);
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

    #[test]
    fn a_holds_directory_that_cannot_be_listed_keeps_everything_and_is_named() {
        let daemon = tempfile::tempdir().unwrap();
        let log_dir = daemon.path().join("logs").join("orders");
        let dir = holds_dir(&log_dir).unwrap();
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        // A file where the holds' directory belongs: listing it fails (not a directory).
        std::fs::write(&dir, "").unwrap();
        let error = list(&StdStorage, &log_dir).unwrap_err();
        assert_eq!(error.dir, dir);
        assert_eq!(error.source.kind(), std::io::ErrorKind::NotADirectory);
        let (held, unreadable) = lowest(&StdStorage, &log_dir);
        assert_eq!(held, Some(Lsn::new(1)));
        assert_eq!(unreadable, vec![error.to_string()]);
        assert!(unreadable[0].starts_with(&format!("{}: ", dir.display())));
    }
}
