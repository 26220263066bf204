//! The mount point before a mount and the unmount after it: what a killed mount leaves behind,
//! and how a stop gets the file system off its mount point without waiting for ever.
//!
//! Owns no state; each function looks at the kernel's view (`stat`, `/proc/self/mountinfo`)
//! afresh. Invariants:
//! - A mount point whose FUSE server is gone (stat answers ENOTCONN, "Transport endpoint is
//!   not connected") is detached before a new mount is attached there, or the start fails
//!   saying the one command that frees it; it is never mounted over (a mount stacked on a dead
//!   one leaves the dead one behind for the next start).
//! - A live stela mount on the same point is never detached: the start fails naming it.
//! - An unmount first asks the kernel plainly (refused while files are open); only after
//!   [`BUSY_RETRY`] of refusals does it detach lazily, so that a stop ends within a bound.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long an unmount refused as busy is asked again before the file system is detached
/// lazily (PostgreSQL's last files are released asynchronously after it stops, late on a
/// loaded machine).
pub const BUSY_RETRY: Duration = Duration::from_secs(5);

/// What the mount point is now.
#[derive(Debug, PartialEq, Eq)]
pub enum PointState {
    /// Not a FUSE mount (an ordinary directory, or missing).
    Free,
    /// A mount whose FUSE server is gone: every access answers ENOTCONN.
    Stale,
    /// A live FUSE mount of this type (e.g. `fuse.stela`).
    Live(String),
}

/// The file system type of the mount at `point` in this process's mount namespace, from
/// `/proc/self/mountinfo` (the last one mounted there wins, as for path lookup).
fn mounted_type(point: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let wanted = point.as_os_str().as_bytes();
    info.lines().rev().find_map(|line| {
        // "ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER"
        let (left, right) = line.split_once(" - ")?;
        let at = left.split(' ').nth(4)?;
        let kind = right.split(' ').next()?;
        (unescape(at) == wanted).then(|| kind.to_owned())
    })
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo`.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(digits) => {
                out.push(
                    digits
                        .iter()
                        .fold(0u8, |n, d| n.wrapping_mul(8) + (d - b'0')),
                );
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// `point` made absolute without resolving it (resolving a stale mount fails).
fn absolute(point: &Path) -> PathBuf {
    if point.is_absolute() {
        point.to_owned()
    } else {
        std::env::current_dir()
            .map(|cwd| cwd.join(point))
            .unwrap_or_else(|_| point.to_owned())
    }
}

/// Looks at `point`: free, a live FUSE mount, or a dead one.
pub fn state(point: &Path) -> PointState {
    match std::fs::metadata(point) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => PointState::Stale,
        _ => {
            let resolved = point.canonicalize().unwrap_or_else(|_| absolute(point));
            match mounted_type(&resolved) {
                Some(kind) if kind.starts_with("fuse") => PointState::Live(kind),
                _ => PointState::Free,
            }
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Asks the kernel to unmount `point`: `lazy` detaches it even while files are open (they
/// keep working until closed). As root through umount2, else through fusermount3.
pub fn unmount(point: &Path, lazy: bool) -> bool {
    if is_root() {
        let Ok(path) = CString::new(point.as_os_str().as_bytes()) else {
            return false;
        };
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: the path is a NUL-terminated string that outlives the call.
        if unsafe { libc::umount2(path.as_ptr(), flags) } == 0 {
            return true;
        }
    }
    Command::new("fusermount3")
        .arg(if lazy { "-uz" } else { "-u" })
        .arg("--")
        .arg(point)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A dead FUSE mount that could not be detached (the message says how to do it by hand).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{shown} is a dead FUSE mount (\"Transport endpoint is not connected\": the process \
     that served it was killed) and could not be detached; run `fusermount3 -u {shown}` (as \
     root: `umount -l {shown}`), then start stela mount again",
    shown = point.display()
)]
pub struct StaleMount {
    /// The mount point, made absolute.
    pub point: PathBuf,
}

/// Detaches the dead mount at `point`, if there is one; `Err` says why it stays.
pub fn clear_stale(point: &Path) -> Result<(), StaleMount> {
    if state(point) != PointState::Stale {
        return Ok(());
    }
    let point = absolute(point);
    if unmount(&point, true) && state(&point) != PointState::Stale {
        tracing::warn!(
            "stela mount: {} was a dead FUSE mount (\"Transport endpoint is not connected\", \
             left by a mount process that was killed); detached it",
            point.display()
        );
        return Ok(());
    }
    Err(StaleMount { point })
}

/// Unmounts after a stop request: plainly, again and again while the kernel says busy, until
/// [`BUSY_RETRY`] has passed (or `gone` says the session ended on its own), then lazily.
/// Returns whether the lazy detach was needed.
pub fn unmount_for_stop(point: &Path, gone: &dyn Fn() -> bool) -> bool {
    let deadline = Instant::now() + BUSY_RETRY;
    while Instant::now() < deadline {
        if gone() || unmount(point, false) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !gone() && !unmount(point, true) {
        tracing::warn!(
            "stela mount: could not detach {}; unmount it with fusermount3 -u",
            point.display()
        );
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/srv/pg\040wal"), b"/srv/pg wal");
        assert_eq!(unescape(r"/a\134b"), b"/a\\b");
        assert_eq!(unescape(r"/plain\0"), b"/plain\\0");
    }

    #[test]
    fn an_ordinary_directory_is_free() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(state(dir.path()), PointState::Free);
        assert_eq!(clear_stale(dir.path()), Ok(()));
    }
}
