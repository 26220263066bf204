//! The records a mount writes to its log: one per mutation of the file system, in the order
//! the mount applied them.
//!
//! Owns the record type and nothing else. Invariants:
//! - A record carries everything needed to apply it again, times included, so replaying the
//!   log onto the same starting tree gives the same tree byte for byte (the mount, the
//!   materialiser and a restart all replay the same records with [`crate::tree::Tree::apply`]).
//! - A record names inodes by the number the mount gave them when it logged their `Make`;
//!   numbers are never reused, so a record can never land on a later file of the same name.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time as it is logged: seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Time {
    pub secs: i64,
    pub nanos: u32,
}

impl Time {
    pub fn now() -> Time {
        Time::from(SystemTime::now())
    }

    pub fn to_system(self) -> SystemTime {
        if self.secs >= 0 {
            UNIX_EPOCH + Duration::new(self.secs as u64, self.nanos)
        } else {
            UNIX_EPOCH - Duration::from_secs(self.secs.unsigned_abs())
                + Duration::from_nanos(u64::from(self.nanos))
        }
    }
}

impl From<SystemTime> for Time {
    fn from(time: SystemTime) -> Time {
        match time.duration_since(UNIX_EPOCH) {
            Ok(since) => Time {
                secs: since.as_secs() as i64,
                nanos: since.subsec_nanos(),
            },
            Err(before) => {
                let before = before.duration();
                let mut secs = -(before.as_secs() as i64);
                let mut nanos = 0;
                if before.subsec_nanos() > 0 {
                    secs -= 1;
                    nanos = 1_000_000_000 - before.subsec_nanos();
                }
                Time { secs, nanos }
            }
        }
    }
}

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// `fallocate` modes the mount accepts (Linux values).
pub mod falloc {
    pub const KEEP_SIZE: i32 = 0x01;
    pub const PUNCH_HOLE: i32 = 0x02;
    pub const ZERO_RANGE: i32 = 0x10;
    /// Every combination the mount logs; anything else is refused with EOPNOTSUPP before it
    /// is logged.
    pub fn supported(mode: i32) -> bool {
        matches!(
            mode,
            0 | KEEP_SIZE | 0x03 /* PUNCH_HOLE | KEEP_SIZE */ | ZERO_RANGE | 0x11
        )
    }
    /// Whether the mode turns the range into zeros (rather than only reserving space).
    pub fn zeroes(mode: i32) -> bool {
        mode & (PUNCH_HOLE | ZERO_RANGE) != 0
    }
}

/// One mutation of the file system.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsRecord {
    /// A new inode `ino` named `name` in directory `parent` (create, mknod, mkdir, symlink).
    Make {
        parent: u64,
        name: ByteBuf,
        ino: u64,
        kind: Kind,
        /// Permission bits (the low 12 bits of st_mode).
        mode: u32,
        uid: u32,
        gid: u32,
        rdev: u32,
        /// A symlink's target; empty otherwise.
        target: ByteBuf,
        time: Time,
    },
    /// `data` written at `offset` of file `ino`.
    Write {
        ino: u64,
        offset: u64,
        data: ByteBuf,
        time: Time,
    },
    /// chmod, chown, truncate, utimens: the fields that are `Some` change.
    SetAttr {
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<Time>,
        mtime: Option<Time>,
        time: Time,
    },
    /// fallocate with one of the [`falloc`] modes.
    Fallocate {
        ino: u64,
        offset: u64,
        length: u64,
        mode: i32,
        time: Time,
    },
    /// A hard link to `ino` named `name` in `parent`.
    Link {
        ino: u64,
        parent: u64,
        name: ByteBuf,
        time: Time,
    },
    /// unlink or rmdir of `name` in `parent`. The inode stays until its `Drop`, since an open
    /// descriptor may still read and write it.
    Remove {
        parent: u64,
        name: ByteBuf,
        time: Time,
    },
    /// rename; with `exchange`, the two names swap (RENAME_EXCHANGE). A replaced target loses
    /// its name as by `Remove`.
    Rename {
        parent: u64,
        name: ByteBuf,
        new_parent: u64,
        new_name: ByteBuf,
        exchange: bool,
        time: Time,
    },
    /// Inode `ino` has no name left and no open descriptor: its data can go.
    Drop { ino: u64 },
    /// The materialiser's progress: every record up to `applied` is in the backing files and
    /// fsync'ed there, with the tree as of `applied` in the backing directory's snapshot.
    Checkpoint { applied: u64 },
}

impl FsRecord {
    /// The inode whose data (not only metadata) the record changes, for the overlay and the
    /// materialiser.
    pub fn data_inode(&self) -> Option<u64> {
        match self {
            FsRecord::Write { ino, .. } | FsRecord::Fallocate { ino, .. } => Some(*ino),
            FsRecord::SetAttr {
                ino, size: Some(_), ..
            } => Some(*ino),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_before_the_epoch_survive_the_round_trip() {
        for time in [
            UNIX_EPOCH - Duration::new(5, 250_000_000),
            UNIX_EPOCH - Duration::from_secs(7),
            UNIX_EPOCH + Duration::new(1_700_000_000, 999_999_999),
        ] {
            assert_eq!(Time::from(time).to_system(), time);
        }
    }
}
