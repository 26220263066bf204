//! The records `stela run` logs: one per change the program made to a file under a durable
//! directory, in the order the changes were made (each record is appended after its change is
//! performed on the file, so the log's order is the files' order wherever the program orders
//! its own changes, e.g. under a lock as PostgreSQL's WAL writer does). A change of names
//! (create, rename, remove) is also made durable (its directories fsynced) before its record
//! is appended, and its call returns once the record is at the log's level
//! ([`RunRecord::waits_for_level`]); a change of data is not (that is what the log is for).
//! See [`crate::replay`].
//!
//! Owns the record type. Files are named by absolute path (the program's files stay on the
//! local file system, which owns their inodes): a replay lands on the same directory. This is
//! why the mount's records (which name inodes the mount numbers itself and replay into the
//! mount's own tree) are not reused here.
//! Invariant: a record carries everything needed to apply it again (no reference to state
//! outside the log but the file it names), so replay is a pure function of the records and
//! the files' names ([`crate::replay`]).

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// The type tag of `stela run`'s logs (checked by the daemon against the log's header, so a
/// log of another kind is refused at open).
pub const TYPE_TAG: &str = "stela-run/RunRecord/1";

/// One change to a file under a durable directory. Paths are absolute and canonical (symlinks
/// of their directories resolved), as bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunRecord {
    /// `data` written at `offset`.
    Write {
        path: ByteBuf,
        offset: u64,
        data: ByteBuf,
    },
    /// `len` zero bytes written at `offset` (a write of zeros, e.g. a new WAL segment filled
    /// before use, logged without its bytes).
    Zeros {
        path: ByteBuf,
        offset: u64,
        len: u64,
    },
    /// The file cut or extended to `size` (ftruncate, truncate, O_TRUNC).
    SetLen { path: ByteBuf, size: u64 },
    /// The file was made (an O_CREAT open that created it, or a rename into a durable
    /// directory), with these permission bits.
    Create { path: ByteBuf, mode: u32 },
    /// `from` renamed to `to` (replacing it).
    Rename { from: ByteBuf, to: ByteBuf },
    /// The name removed (unlink, or rmdir of an empty directory; or renamed out of every
    /// durable directory).
    Remove { path: ByteBuf },
}

impl RunRecord {
    /// The path a data record (write, zeros, length) changes; `None` for a change of names.
    pub fn data_path(&self) -> Option<&[u8]> {
        match self {
            RunRecord::Write { path, .. }
            | RunRecord::Zeros { path, .. }
            | RunRecord::SetLen { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Whether the preload library holds the program until this record is at the log's level
    /// (as it does for an O_DSYNC write) instead of returning once the daemon took it: true
    /// for every change of names. Replay depends on it ([`crate::replay`]): a name the program
    /// ended (a remove, a rename from it or onto it, a rename into a durable directory over
    /// it) and then used again can be on disk only if the log already says the old file is
    /// gone, so the old file's records are never applied to the new one. Without it a crash
    /// of the daemon could keep the new file on disk and lose the record that ended the old
    /// one (SQLite's rollback journal is removed and created again at every transaction: its
    /// last transaction's journal was written into the next one's, and SQLite rolled the
    /// acknowledged transaction back).
    pub fn waits_for_level(&self) -> bool {
        self.data_path().is_none()
    }

    /// For a change of names about to be made that replaces a file (a rename onto a name
    /// `exists` says is taken, or a rename into a durable directory over one, logged as a
    /// create): the end of the replaced file, which the preload library logs (at the level,
    /// after syncing that file) before it makes the change. Replay depends on it: a crash
    /// can land the change on disk and lose its own record (it is in flight), and the old
    /// file's records must then not be applied to the file now under its name; the old file
    /// itself, if the change did not land, holds its data without replay (it was synced).
    pub fn replaced_end(&self, exists: impl Fn(&[u8]) -> bool) -> Option<RunRecord> {
        let name = match self {
            RunRecord::Rename { to, .. } => to,
            RunRecord::Create { path, .. } => path,
            _ => return None,
        };
        exists(name).then(|| RunRecord::Remove { path: name.clone() })
    }
}
