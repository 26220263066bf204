//! The daemon's table of named logs: each an ordinary stela-wal directory under
//! `DIR/logs/NAME`, opened once (through `stela_wal::files`, without the embedded group commit)
//! and shared by every handle that names it.
//!
//! Invariants: a log is opened at most once per daemon (opens and closes are serialised by one
//! mutex, and stela-wal's directory lock keeps other processes out); a name is a plain file
//! name, so no request reaches outside `DIR/logs`; a log's codec and record type never change
//! while it is open; a log's files are closed only when no handle refers to it and the pool
//! holds nothing of it, so a closed log can be opened by another process at once. Lookups take
//! a short lock that no file I/O is ever done under, so a slow open never stalls a flusher.
//! Nothing inside `DIR` is followed through a symbolic link: a log directory that is one is
//! refused ([`Error::SymlinkedLog`]), and so is `DIR/logs` at start.

use crate::error::{Error, Result};
use crate::measure;
use crate::pool::{LogId, LogSetup, Pool};
use crate::quota::{Credential, Limits, Quotas};
use crate::sync::lock;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use stela_format::TypeTag;
use stela_wal::files::{LogFiles, SegmentSet, SegmentWriter};
use stela_wal::storage::{OpenMode, Storage};
use stela_wal::{Codec, WalOptions};

/// One open log.
pub struct LogEntry {
    pub id: LogId,
    pub name: String,
    pub codec: Codec,
    pub type_tag: String,
    /// The newest segment; locked by the one flusher writing this log at a time.
    pub writer: Mutex<SegmentWriter>,
    pub segments: Arc<SegmentSet>,
}

impl std::fmt::Debug for LogEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogEntry")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("codec", &self.codec)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub struct Logs {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    segment_bytes: u64,
    /// Held across a whole open or close (file I/O), never by a lookup.
    opening: Mutex<()>,
    table: Mutex<Table>,
    /// Who owns which log, and what each credential holds.
    quotas: Quotas,
}

#[derive(Debug, Default)]
struct Table {
    by_id: HashMap<LogId, (Arc<LogEntry>, usize)>,
    by_name: HashMap<String, LogId>,
}

/// Refuses a log directory that is a symbolic link: it would put the log's records wherever
/// the link points, outside `DIR`. The check is not raced by anyone but the daemon's own user:
/// `DIR/logs` is 0700 (stela-wal's `DIR_MODE`), so nobody else can swap the name between this
/// check and the open; and every file inside is opened with `O_NOFOLLOW`.
fn refuse_link(name: &str, dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => {
            tracing::warn!(log = name, path = %dir.display(), "log directory is a symbolic link: refused");
            Err(Error::SymlinkedLog {
                log: name.to_owned(),
                path: dir.to_owned(),
            })
        }
        _ => Ok(()),
    }
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Logs {
    /// The logs of `dir`; reads every log's `OWNER` file (the quotas' ledger).
    pub fn new(dir: &Path, storage: Arc<dyn Storage>, segment_bytes: u64, quota: Limits) -> Logs {
        let logs_dir = dir.join("logs");
        let quotas = Quotas::load(quota, storage.as_ref(), &logs_dir);
        Logs {
            dir: logs_dir,
            storage,
            segment_bytes,
            opening: Mutex::new(()),
            table: Mutex::new(Table::default()),
            quotas,
        }
    }

    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Opens `name` for one more handle, recovering its files and adding it to `pool` if it was
    /// not open. A log it creates belongs to `owner` (`None`: an administrator or the daemon
    /// itself; no quota), which must be under its quota of logs. Blocking (recovery reads the
    /// files): not for the event loop.
    pub fn open<W>(
        &self,
        pool: &Pool<W>,
        name: &str,
        codec_name: &str,
        type_tag: &str,
        create: bool,
        owner: Option<&Credential>,
    ) -> Result<Arc<LogEntry>> {
        if !valid_name(name) {
            return Err(Error::BadLogName(name.to_owned()));
        }
        let codec = Codec::from_name(codec_name)
            .ok_or_else(|| Error::UnknownCodec(codec_name.to_owned()))?;
        let _opening = lock(&self.opening);
        if let Some(entry) = self.open_again(name, codec, type_tag)? {
            return Ok(entry);
        }
        let (files, segment_bytes) = self.open_files(name, codec, type_tag, create, owner)?;
        tracing::info!(log = name, codec = %codec, type_tag, next_lsn = files.next_lsn.get(), "log opened");
        Ok(self.register(pool, name, codec, type_tag, files, segment_bytes))
    }

    /// One more handle on `name` if it is open already, with the codec and record type it was
    /// opened with; a different one is refused. Called under `opening`.
    fn open_again(
        &self,
        name: &str,
        codec: Codec,
        type_tag: &str,
    ) -> Result<Option<Arc<LogEntry>>> {
        let mut table = lock(&self.table);
        let Some(&id) = table.by_name.get(name) else {
            return Ok(None);
        };
        let (entry, handles) = table.by_id.get_mut(&id).expect("named logs are listed");
        if entry.codec != codec
            || !TypeTag::new(&entry.type_tag).names_same_type(&TypeTag::new(type_tag))
        {
            return Err(Error::Mismatch {
                name: name.to_owned(),
                open: entry.codec,
                open_type: entry.type_tag.clone(),
                asked: codec,
                asked_type: type_tag.to_owned(),
            });
        }
        *handles += 1;
        Ok(Some(Arc::clone(entry)))
    }

    /// Opens (recovers) or creates the files of the log `name`, with segments fitted to the
    /// free space; returns its files and that segment size. A log it creates
    /// belongs to `owner` (recorded in its `OWNER` file, after the quota allowed it); a creation
    /// that fails leaves nothing behind.
    fn open_files(
        &self,
        name: &str,
        codec: Codec,
        type_tag: &str,
        create: bool,
        owner: Option<&Credential>,
    ) -> Result<(LogFiles, u64)> {
        let dir = self.dir.join(name);
        refuse_link(name, &dir)?;
        let exists = self.storage.list(&dir).is_ok_and(|names| !names.is_empty());
        if !exists && !create {
            return Err(Error::NoSuchLog(name.to_owned()));
        }
        // Only a creation is charged: reopening a log someone holds already is not.
        let creator = if exists { None } else { owner };
        if let Some(owner) = creator {
            self.quotas.may_create(owner)?;
        }
        let segment_bytes = self.fitted_segment_bytes(name);
        let options = WalOptions::default()
            .codec(codec)
            .segment_bytes(segment_bytes)
            .storage(Arc::clone(&self.storage))
            .create_if_missing(create);
        let files = match LogFiles::open(&dir, options, type_tag) {
            Ok(files) => files,
            Err(source) => {
                if !exists {
                    self.undo_creation(&dir);
                }
                return Err(Error::Open {
                    log: name.to_owned(),
                    source,
                });
            }
        };
        if let Some(owner) = creator {
            if let Err(source) = self
                .quotas
                .record_owner(self.storage.as_ref(), &dir, name, owner)
            {
                drop(files); // its directory lock, before the directory goes
                self.undo_creation(&dir);
                return Err(Error::Io {
                    what: format!("recording the owner of the new log {name:?}"),
                    source,
                });
            }
        }
        Ok((files, segment_bytes))
    }

    /// The segment size for the new segments of `name`: the configured one, or less when the
    /// file system is nearly full (said in a warning).
    fn fitted_segment_bytes(&self, name: &str) -> u64 {
        let segment_bytes = fit_segment_bytes(self.segment_bytes, measure::free_bytes(&self.dir));
        if segment_bytes < self.segment_bytes {
            tracing::warn!(
                log = name,
                segment_bytes,
                configured = self.segment_bytes,
                "little free space: this log's new segments are smaller than configured"
            );
        }
        segment_bytes
    }

    /// Enters the log whose files were just opened into `pool` and the table (one handle), and
    /// into the quotas' count of bytes held when quotas are on.
    fn register<W>(
        &self,
        pool: &Pool<W>,
        name: &str,
        codec: Codec,
        type_tag: &str,
        files: LogFiles,
        segment_bytes: u64,
    ) -> Arc<LogEntry> {
        let records_bytes = self.quotas.limits().any().then(|| {
            // The sealed segments whole, the newest up to where the next frame goes.
            crate::quota::files_bytes(self.storage.as_ref(), &self.dir.join(name))
                .saturating_sub(files.writer.capacity())
                + files.write_offset
        });
        let id = pool.add_log(LogSetup {
            next_lsn: files.next_lsn.get(),
            segment_start: files.writer.segment_start().get(),
            capacity: files.writer.capacity(),
            write_offset: files.write_offset,
            durable_offset: files.durable_offset,
            segment_bytes,
        });
        let entry = Arc::new(LogEntry {
            id,
            name: name.to_owned(),
            codec,
            type_tag: type_tag.to_owned(),
            writer: Mutex::new(files.writer),
            segments: files.segments,
        });
        if let Some(bytes) = records_bytes {
            self.quotas.opened(id, name, bytes);
        }
        let mut table = lock(&self.table);
        debug_assert!(
            !table.by_name.contains_key(name),
            "a log is open at most once"
        );
        table.by_id.insert(id, (Arc::clone(&entry), 1));
        table.by_name.insert(name.to_owned(), id);
        entry
    }

    /// A creation that failed (a full disk, say) leaves nothing behind (issue 54, finding 6:
    /// each failed open had left an empty directory with a `LOCK` file): the files it made in
    /// `dir`, which held nothing before, and the directory. Best effort, logged: the open's
    /// own error is what the client is told.
    fn undo_creation(&self, dir: &Path) {
        for file in self.storage.list(dir).unwrap_or_default() {
            if let Err(error) = self.storage.remove(&dir.join(&file)) {
                tracing::warn!(dir = %dir.display(), file, %error, "cannot remove a file of a failed creation");
            }
        }
        // The storage trait removes files only; the empty directory goes on a real disk.
        let _ = std::fs::remove_dir(dir);
        let _ = self.storage.sync_dir(&self.dir);
    }

    /// Drops one handle of `log`; when it was the last, writes out what the pool holds of the
    /// log (`written` blocks until everything up to the LSN it is given is durable) and closes
    /// its files. Blocking: not for the event loop.
    pub fn release<W>(
        &self,
        pool: &Pool<W>,
        log: LogId,
        written: impl FnOnce(u64) -> Result<(), crate::pool::PoolError>,
    ) {
        let _opening = lock(&self.opening);
        let name = {
            let mut table = lock(&self.table);
            let Some((entry, handles)) = table.by_id.get_mut(&log) else {
                return;
            };
            *handles -= 1;
            if *handles > 0 {
                return;
            }
            entry.name.clone()
        };
        let last = pool.close_log(log);
        if let Err(error) = written(last) {
            tracing::warn!(log = %name, %error, "closing a log whose buffers could not be written");
        }
        if !pool.remove_log(log) {
            // A failed or disk-full log keeps nothing writable; anything else is a bug we
            // would rather see than hide.
            tracing::error!(log = %name, "log still busy after its last handle closed; kept open");
            return;
        }
        let entry = {
            let mut table = lock(&self.table);
            table.by_name.remove(&name);
            table.by_id.remove(&log).map(|(entry, _)| entry)
        };
        self.quotas.closed(log);
        // Everything is written and synced: record how far, so that damage to the last write
        // is never taken for a torn one when the log is next opened.
        if let Some(entry) = &entry {
            if let Err(error) = lock(&entry.writer).synced_mark().persist() {
                tracing::warn!(log = %name, %error, "closing a log whose synced-end mark could not be written");
            }
        }
        // Someone may still hold the entry for a moment (a status report being built); its
        // files, and the directory lock, go with the last holder, and the close is not over
        // before that: whoever opens the log next must find it free.
        let mut entry = entry;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while let Some(held) = entry.take() {
            match Arc::try_unwrap(held) {
                Ok(closed) => drop(closed),
                Err(held) if std::time::Instant::now() < deadline => {
                    entry = Some(held);
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(_) => tracing::warn!(log = %name, "closed, but still held after 10 s"),
            }
        }
        tracing::info!(log = %name, "closed (no handle left)");
    }

    /// The open log with this id.
    /// Whether `name` is open now.
    pub fn is_open(&self, name: &str) -> bool {
        lock(&self.table).by_name.contains_key(name)
    }

    pub fn get(&self, id: LogId) -> Option<Arc<LogEntry>> {
        lock(&self.table).by_id.get(&id).map(|(e, _)| Arc::clone(e))
    }

    /// Every open log, by id.
    /// Every log directory under `DIR/logs`, with what its files hold and how many handles
    /// are open on it. Reads only file names and sizes.
    pub fn on_disk(&self) -> Result<Vec<OnDisk>> {
        let io = |source| Error::Io {
            what: format!("listing {}", self.dir.display()),
            source,
        };
        let mut names = self.storage.list(&self.dir).map_err(io)?;
        names.retain(|n| valid_name(n));
        names.sort();
        let table = lock(&self.table);
        let mut listed = Vec::new();
        for name in names {
            let dir = self.dir.join(&name);
            let Ok(files) = self.storage.list(&dir) else {
                continue; // a file, not a log directory
            };
            let mut segments = 0;
            let mut bytes = 0;
            let mut first = u64::MAX;
            for file in &files {
                if let Some(start) = stela_format::segment_name::parse_segment_file_name(file) {
                    segments += 1;
                    first = first.min(start.get());
                }
                if let Ok(handle) = self.storage.open(&dir.join(file), OpenMode::Read) {
                    bytes += handle.len().unwrap_or(0);
                }
            }
            let handles = table
                .by_name
                .get(&name)
                .and_then(|id| table.by_id.get(id))
                .map_or(0, |(_, handles)| *handles as u32);
            let first = if segments == 0 { 0 } else { first };
            listed.push(OnDisk {
                name,
                handles,
                segments,
                bytes,
                first_lsn: first,
            });
        }
        Ok(listed)
    }

    /// How many handles `log` has (0: not open).
    pub fn handles(&self, log: LogId) -> usize {
        lock(&self.table)
            .by_id
            .get(&log)
            .map_or(0, |(_, handles)| *handles)
    }

    /// Deletes the log `name`, which no client may have open: its files, then (after a
    /// directory fsync) its directory. Returns the segments and bytes removed.
    pub fn delete(&self, name: &str) -> Result<(u32, u64)> {
        if !valid_name(name) {
            return Err(Error::BadLogName(name.to_owned()));
        }
        // Under the opening lock, so no open of the same log runs meanwhile.
        let _opening = lock(&self.opening);
        {
            let table = lock(&self.table);
            if let Some((_, handles)) = table.by_name.get(name).and_then(|id| table.by_id.get(id)) {
                return Err(Error::LogInUse {
                    log: name.to_owned(),
                    handles: *handles as u32,
                });
            }
        }
        let dir = self.dir.join(name);
        let files = self
            .storage
            .list(&dir)
            .map_err(|_| Error::NoSuchLog(name.to_owned()))?;
        let io = |what: String| move |source| Error::Io { what, source };
        let (mut segments, mut bytes) = (0, 0);
        for file in &files {
            let path = dir.join(file);
            if stela_format::segment_name::parse_segment_file_name(file).is_some() {
                segments += 1;
            }
            if let Ok(handle) = self.storage.open(&path, OpenMode::Read) {
                bytes += handle.len().unwrap_or(0);
            }
            self.storage
                .remove(&path)
                .map_err(io(format!("removing {}", path.display())))?;
        }
        self.storage
            .sync_dir(&dir)
            .map_err(io(format!("syncing {}", dir.display())))?;
        // The storage trait removes files only; the empty directory goes on a real disk.
        let _ = std::fs::remove_dir(&dir);
        self.storage
            .sync_dir(&self.dir)
            .map_err(io(format!("syncing {}", self.dir.display())))?;
        // Holds on the deleted copy (a standby's, followers') would keep a log created later
        // under the same name from being truncated.
        let holds = stela_wal::holds::release_all(self.storage.as_ref(), &dir)
            .map_err(io(format!("releasing the holds on {}", dir.display())))?;
        self.quotas.deleted(name);
        tracing::warn!(log = name, segments, bytes, holds, "log deleted");
        Ok((segments, bytes))
    }

    pub fn all(&self) -> Vec<Arc<LogEntry>> {
        let table = lock(&self.table);
        let mut all: Vec<_> = table.by_id.values().map(|(e, _)| Arc::clone(e)).collect();
        all.sort_by_key(|e| e.id);
        all
    }

    /// Empties the table (at shutdown), handing back every entry.
    pub fn take_all(&self) -> Vec<Arc<LogEntry>> {
        let mut table = lock(&self.table);
        table.by_name.clear();
        let mut all: Vec<_> = table.by_id.drain().map(|(_, (e, _))| e).collect();
        all.sort_by_key(|e| e.id);
        all
    }
}

/// A log directory as [`Logs::on_disk`] finds it.
pub struct OnDisk {
    pub name: String,
    /// Handles open on it now.
    pub handles: u32,
    pub segments: u32,
    pub bytes: u64,
    /// From the oldest segment's name; 0 without segments.
    pub first_lsn: u64,
}

/// The smallest segment a log gets when space is short.
pub const MIN_SEGMENT_BYTES: u64 = 64 << 10;

/// The segment size for a log opened with `free` bytes left: the configured size while the
/// volume has room for two such segments; else a quarter of the free space (at least
/// [`MIN_SEGMENT_BYTES`], in 4 KiB steps), so a log can still be created and grown on a small or
/// nearly full volume. Segments are preallocated, so a size the volume cannot hold would refuse
/// the open with a full disk.
pub fn fit_segment_bytes(configured: u64, free: Option<u64>) -> u64 {
    match free {
        Some(free) if free < configured.saturating_mul(2) => {
            (free / 4 / 4096 * 4096).clamp(MIN_SEGMENT_BYTES, configured.max(MIN_SEGMENT_BYTES))
        }
        _ => configured,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_shrink_to_fit_a_small_volume() {
        const MIB: u64 = 1 << 20;
        assert_eq!(fit_segment_bytes(64 * MIB, None), 64 * MIB);
        assert_eq!(fit_segment_bytes(64 * MIB, Some(500 * MIB)), 64 * MIB);
        assert_eq!(fit_segment_bytes(64 * MIB, Some(16 * MIB)), 4 * MIB);
        assert_eq!(
            fit_segment_bytes(64 * MIB, Some(100_000)),
            MIN_SEGMENT_BYTES
        );
        assert_eq!(fit_segment_bytes(MIB, Some(MIB)), 256 << 10);
    }
}
