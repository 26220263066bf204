//! This process's connection to the daemon: opened on first use, one per process.
//!
//! Owns the connection and the settings read from the environment. Invariants:
//! - A process uses only a connection it opened itself. A child of fork inherits its
//!   parent's, whose shared-memory ring is the parent's memory too: at fork the child forgets
//!   it (never closes or drops it: that would speak on the parent's socket) and opens its own
//!   at its first durable change.
//! - A change is logged only after it was performed on the file; the caller returns the
//!   program an error (EIO) when the daemon did not take its record, so the program never
//!   counts on a change the log may lack.
//! - Fail stop: once a record was not taken or a commit failed, every later change and sync of
//!   a durable file in this process (and its children) fails with EIO. The file holds a change
//!   the log may lack; a later sync that succeeded would vouch for it. PostgreSQL PANICs on the
//!   first EIO and restarts from its postmaster, whose fresh children open new connections.

use parking_lot::Mutex;
use serde_bytes::ByteBuf;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::OnceLock;
use stela_client::{Durability, Wal};
use stela_run::{RunRecord, Settings};

pub struct Conn {
    wal: Wal<RunRecord>,
    /// Bytes of file data per record (the daemon's limit less room for the path).
    chunk: usize,
}

static SETTINGS: OnceLock<Option<Settings>> = OnceLock::new();
static CONN: AtomicPtr<Conn> = AtomicPtr::new(std::ptr::null_mut());
/// Held while a connection is being opened, so two threads do not open two.
static OPENING: Mutex<()> = Mutex::new(());
static REPORTED: AtomicBool = AtomicBool::new(false);
/// A record was not taken or a commit failed in this process (see the module's fail stop).
static FAILED: AtomicBool = AtomicBool::new(false);

/// The settings `stela run` gave this process; `None` outside `stela run` (then every hook
/// only passes its call on).
pub fn settings() -> Option<&'static Settings> {
    SETTINGS
        .get_or_init(|| Settings::from_env(|name| std::env::var_os(name)))
        .as_ref()
}

fn open() -> io::Result<&'static Conn> {
    let _opening = OPENING.lock();
    let current = CONN.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: a non-null CONN points to a leaked Box<Conn>, never freed.
        return Ok(unsafe { &*current });
    }
    let settings = settings().ok_or_else(|| io::Error::other("not under stela run"))?;
    let wal = stela_run::open_log(settings).map_err(io::Error::other)?;
    let chunk = wal
        .max_record_bytes()
        .saturating_sub(4096)
        .clamp(4096, APPEND_BYTES - 4096);
    let conn = Box::into_raw(Box::new(Conn { wal, chunk }));
    CONN.store(conn, Ordering::Release);
    // SAFETY: just leaked; lives for the rest of the process.
    Ok(unsafe { &*conn })
}

fn conn() -> io::Result<&'static Conn> {
    if FAILED.load(Ordering::Acquire) {
        return Err(io::Error::other(
            "an earlier change or sync of a durable file failed in this process",
        ));
    }
    let current = CONN.load(Ordering::Acquire);
    if current.is_null() {
        return open();
    }
    // SAFETY: a non-null CONN points to a leaked Box<Conn>, never freed.
    Ok(unsafe { &*current })
}

/// Says once on standard error why durable changes fail, then returns EIO for the caller.
fn failed(what: &str, error: impl std::fmt::Display) -> io::Error {
    FAILED.store(true, Ordering::Release);
    if !REPORTED.swap(true, Ordering::AcqRel) {
        eprintln!("stela run (pid {}): {what}: {error}", std::process::id());
    }
    io::Error::from_raw_os_error(libc::EIO)
}

/// Bytes of records sent in one append: a large write (PostgreSQL writes megabytes of WAL at
/// once under COPY) goes as several appends, each of which fits the ring and a request frame.
const APPEND_BYTES: usize = 256 << 10;

fn record_bytes(record: &RunRecord) -> usize {
    match record {
        RunRecord::Write { path, data, .. } => path.len() + data.len(),
        RunRecord::Rename { from, to } => from.len() + to.len(),
        RunRecord::Zeros { path, .. }
        | RunRecord::SetLen { path, .. }
        | RunRecord::Create { path, .. }
        | RunRecord::Remove { path } => path.len(),
    }
}

/// Logs `records` in order; with `durable`, returns once they are at the level (an O_DSYNC
/// write: the last append waits for the level, which covers the ones before it).
pub fn log(records: &[RunRecord], durable: bool) -> io::Result<()> {
    let conn = conn().map_err(|e| failed("opening the log", e))?;
    let mut start = 0;
    while start < records.len() {
        let mut end = start + 1;
        let mut bytes = record_bytes(&records[start]);
        while end < records.len() && bytes + record_bytes(&records[end]) <= APPEND_BYTES {
            bytes += record_bytes(&records[end]);
            end += 1;
        }
        let group = &records[start..end];
        let appended = if durable && end == records.len() {
            conn.wal.append_batch_durable(group)
        } else {
            conn.wal.append_batch(group)
        };
        appended.map_err(|e| failed("logging a change", e))?;
        start = end;
    }
    Ok(())
}

/// The records of `data` written at `offset` of `path`: pieces the daemon takes, a piece of
/// zeros as its length alone.
pub fn write_records(path: &[u8], offset: u64, data: &[u8]) -> io::Result<Vec<RunRecord>> {
    let chunk = conn().map_err(|e| failed("opening the log", e))?.chunk;
    let mut records = Vec::with_capacity(data.len() / chunk + 1);
    for (i, piece) in data.chunks(chunk).enumerate() {
        let at = offset + (i * chunk) as u64;
        let path = ByteBuf::from(path.to_vec());
        if piece.len() >= 512 && piece.iter().all(|&b| b == 0) {
            records.push(RunRecord::Zeros {
                path,
                offset: at,
                len: piece.len() as u64,
            });
        } else {
            records.push(RunRecord::Write {
                path,
                offset: at,
                data: ByteBuf::from(piece.to_vec()),
            });
        }
    }
    Ok(records)
}

/// An fsync of a durable file: returns once every change any process of the program logged
/// before this call is at the level. At `buffered` that is already so (each append returned
/// only once the daemon held its record); otherwise the log's last LSN is committed.
pub fn sync() -> io::Result<()> {
    let level = settings().map_or(Durability::Buffered, |s| s.level);
    if matches!(level, Durability::Buffered | Durability::Unsafe) {
        if FAILED.load(Ordering::Acquire) {
            return Err(failed("syncing", "an earlier change failed to be logged"));
        }
        return Ok(());
    }
    // The log's end, committed in one ring entry (no socket round trip): the daemon reads it
    // after every append of any process that returned before this call.
    let conn = conn().map_err(|e| failed("opening the log", e))?;
    conn.wal
        .commit_end(level)
        .map(|_| ())
        .map_err(|e| failed("committing", e))
}

/// Before the program's own fsync of a file outside the durable directories, at `buffered`:
/// every change logged so far, by any process, is made durable first (the log's end committed
/// at `disk`). What the program makes durable by itself then never depends on records that a
/// power cut without notice could still take: PostgreSQL fsyncs `pg_control`, naming its
/// checkpoint record, and the data files holding changes from the WAL before it; without this a
/// cut after the checkpoint left a `pg_control` naming WAL the daemon never wrote, and a cluster
/// that did not start (`crates/stela-cli/tests/run.rs`). At `disk` and above every fsync of a
/// durable file already waited for the same; `unsafe` promises nothing.
pub fn barrier() -> io::Result<()> {
    let Some(settings) = settings() else {
        return Ok(());
    };
    if !matches!(settings.level, Durability::Buffered) {
        return Ok(());
    }
    if FAILED.load(Ordering::Acquire) {
        return Err(failed("syncing", "an earlier change failed to be logged"));
    }
    let conn = conn().map_err(|e| failed("opening the log", e))?;
    conn.wal
        .commit_end(Durability::Disk)
        .map(|_| ())
        .map_err(|e| failed("committing before a native fsync", e))
}

pub extern "C" fn before_fork() {
    std::mem::forget(OPENING.lock());
}

pub extern "C" fn after_fork_in_parent() {
    // SAFETY: `before_fork` locked OPENING on this thread and forgot its guard.
    unsafe { OPENING.force_unlock() };
}

pub extern "C" fn after_fork_in_child() {
    // The parent's connection is forgotten, never dropped (see the module's invariants).
    CONN.store(std::ptr::null_mut(), Ordering::Release);
    REPORTED.store(false, Ordering::Release);
    // SAFETY: as in the parent: the copy of the lock is held by this thread.
    unsafe { OPENING.force_unlock() };
}
