//! Where a log keeps its record schema (`stela_format::schema`): the file `SCHEMA.json` in the
//! log's directory, written when a typed log is opened (by the embedded [`crate::Wal`], and by
//! the daemon with the schema a client sends), read by `stela wal dump`.
//!
//! Invariant: the file is replaced whole (temporary file, fdatasync, rename, directory fsync)
//! and only when it changes; it is never needed to read the log, and a missing or unreadable one
//! only makes a dump show arrays.

use crate::error::{Error, Result};
use crate::storage::{OpenMode, Storage};
use std::path::Path;
pub use stela_format::schema::{render, Schema};

/// The file a log's schema lives in, in the log's directory.
pub const FILE: &str = "SCHEMA.json";

/// Reads the schema of the log in `dir`, if it has one that reads.
pub fn load(storage: &dyn Storage, dir: &Path) -> Option<Schema> {
    let file = storage.open(&dir.join(FILE), OpenMode::Read).ok()?;
    let bytes = file.read_to_vec().ok()?;
    Schema::from_json(std::str::from_utf8(&bytes).ok()?)
}

/// Stores `schema` (JSON, as [`Schema::to_json`] writes it) as the schema of the log in `dir`,
/// unless it already is.
///
/// # Errors
/// The I/O error writing it.
pub fn store(storage: &dyn Storage, dir: &Path, schema: &str) -> Result<()> {
    let path = dir.join(FILE);
    if let Ok(file) = storage.open(&path, OpenMode::Read) {
        if file.read_to_vec().is_ok_and(|old| old == schema.as_bytes()) {
            return Ok(());
        }
    }
    let temp = dir.join("SCHEMA.json.tmp");
    let _ = storage.remove(&temp);
    let file = storage
        .open(&temp, OpenMode::CreateNew)
        .map_err(|e| Error::io("create", &temp, e))?;
    file.write_all_at(schema.as_bytes(), 0)
        .map_err(|e| Error::io("write", &temp, e))?;
    file.sync_data()
        .map_err(|e| Error::io("fdatasync", &temp, e))?;
    storage
        .rename(&temp, &path)
        .map_err(|e| Error::io("rename", &temp, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| Error::io("fsync directory", dir, e))
}
