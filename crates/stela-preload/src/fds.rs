//! Which descriptors of this process name files under a durable directory, and what they are.
//!
//! Owns the table from descriptor number to [`Tracked`]. Invariants:
//! - A descriptor is in the table only from the moment an open/dup of a durable file returned
//!   it until its close (or a dup2/dup3 over it): the hooks keep the table in step with the
//!   kernel's descriptor table for every call that goes through them.
//! - The bitmap `MARKS` has a descriptor's bit set exactly while the table holds it, so a
//!   write to any other descriptor costs one atomic load and takes no lock.
//! - The lock is taken before fork and released in both processes after it (pthread_atfork),
//!   so a child never inherits it held by a thread that does not exist there. The child keeps
//!   the table: its inherited descriptors are the same files.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A descriptor of a durable file.
#[derive(Debug)]
pub struct Tracked {
    /// Canonical absolute path, as of the open (renames through this process update it).
    pub path: Vec<u8>,
    /// Opened with O_DSYNC or O_SYNC (stripped at open): each write is acknowledged at the
    /// level before it returns.
    pub sync: bool,
}

const MARKED_FDS: usize = 1 << 16;
static MARKS: [AtomicU64; MARKED_FDS / 64] = [const { AtomicU64::new(0) }; MARKED_FDS / 64];
/// A descriptor at or above `MARKED_FDS` is tracked (then the table is always asked).
static HIGH: AtomicBool = AtomicBool::new(false);
static TABLE: RwLock<Option<HashMap<i32, Arc<Tracked>>>> = RwLock::new(None);

fn marked(fd: i32) -> bool {
    if fd < 0 {
        return false;
    }
    let fd = fd as usize;
    if fd >= MARKED_FDS {
        return HIGH.load(Ordering::Acquire);
    }
    MARKS[fd / 64].load(Ordering::Acquire) & (1 << (fd % 64)) != 0
}

fn mark(fd: i32, on: bool) {
    let fd = fd as usize;
    if fd >= MARKED_FDS {
        if on {
            HIGH.store(true, Ordering::Release);
        }
        return;
    }
    let bit = 1u64 << (fd % 64);
    if on {
        MARKS[fd / 64].fetch_or(bit, Ordering::AcqRel);
    } else {
        MARKS[fd / 64].fetch_and(!bit, Ordering::AcqRel);
    }
}

pub fn lookup(fd: i32) -> Option<Arc<Tracked>> {
    if !marked(fd) {
        return None;
    }
    TABLE.read().as_ref()?.get(&fd).cloned()
}

pub fn insert(fd: i32, tracked: Arc<Tracked>) {
    let mut table = TABLE.write();
    table.get_or_insert_with(HashMap::new).insert(fd, tracked);
    mark(fd, true);
    debug_assert!(marked(fd));
}

pub fn remove(fd: i32) {
    if !marked(fd) {
        return;
    }
    let mut table = TABLE.write();
    if let Some(table) = table.as_mut() {
        table.remove(&fd);
    }
    mark(fd, false);
}

/// `from` was renamed to `to` by this process: descriptors of it (or of files below it, for a
/// directory) now name the file by its new path.
pub fn renamed(from: &[u8], to: &[u8]) {
    let mut table = TABLE.write();
    let Some(table) = table.as_mut() else { return };
    for tracked in table.values_mut() {
        let path = &tracked.path;
        let under = path.starts_with(from)
            && (path.len() == from.len() || path.get(from.len()) == Some(&b'/'));
        if under {
            let mut moved = to.to_vec();
            moved.extend_from_slice(&path[from.len()..]);
            *tracked = Arc::new(Tracked {
                path: moved,
                sync: tracked.sync,
            });
        }
    }
}

/// pthread_atfork's prepare: hold the table's lock across fork.
pub extern "C" fn before_fork() {
    std::mem::forget(TABLE.write());
}

/// pthread_atfork's parent and child handlers: release what [`before_fork`] took.
pub extern "C" fn after_fork() {
    // SAFETY: `before_fork` took the write lock on this thread and forgot its guard; in the
    // child the lock's memory is a copy of the parent's, held by this same thread.
    unsafe { TABLE.force_unlock_write() };
}
