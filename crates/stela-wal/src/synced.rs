//! [`SyncedMark`]: the log's `SYNCED` file, a durable record of how far the newest segment was
//! synced (the encoding is `stela_format::synced`; the rule it feeds is in [`crate::scan`]).
//!
//! Why it exists: a frame's sync base says which syncs had returned when the frame was framed,
//! so it proves every sync but the last. Without this file, bit rot inside the last synced write
//! of a log looks exactly like a torn write and recovery would cut acknowledged records.
//!
//! How it is kept without slowing commits: the segment writer *publishes* the synced end after
//! every fdatasync that returns (a store under a small lock, no I/O). Writing it down is done
//! off the commit path, by one keeper thread per process ([`SyncedMark::request`]), once the
//! log has been idle for [`QUIET`]; while commits keep coming, the next frames' sync bases carry the same fact
//! for free. `close` and every open write it synchronously. Each write goes to the slot the
//! previous one did not use, then the file is fdatasync'ed.
//!
//! Invariants:
//! - **Never ahead of the data.** A mark is written only for an offset that a *returned*
//!   fdatasync of that segment covered (published by [`crate::writer::SegmentWriter::sync`]
//!   after the call returned), so a power cut can never leave a mark above a torn write.
//! - At open the mark is rewritten to exactly the end of the data recovery kept (after it
//!   synced it), so a repair that cut the log, or an older build that wrote it, leaves no stale
//!   mark behind.
//! - **Fail stop, no retry.** A failed write or fdatasync of the file stops this log's marks
//!   for good (it is never retried on the same file); the log's records are unaffected, and
//!   recovery falls back to the sync bases.
//! - After the writer is dropped nothing more is written ([`SyncedMark::close`] waits for a
//!   write in progress), so a log reopened at once never sees a stale mark land.

use crate::error::{Error, Result};
use crate::storage::{OpenMode, Storage, StorageFile};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};
use stela_format::synced::{self, SyncedEnd, FILE_BYTES, FILE_NAME};
use stela_format::Lsn;

/// How long a log must have published no new sync before the keeper writes its mark. A
/// client that commits again at once would otherwise find its fdatasync queued behind the
/// mark's on the device (measured: +90 us median on a one-client daemon log); while syncs keep
/// coming, the next frames' sync bases carry the fact anyway.
pub const QUIET: Duration = Duration::from_millis(10);

/// The temporary name a new `SYNCED` file is prepared under.
const TEMP_NAME: &str = "SYNCED.tmp";

/// Reads the mark of the log in `dir`: `None` when there is no `SYNCED` file (a log written
/// before the mark existed) or no valid slot in it.
///
/// # Errors
/// I/O errors other than a missing file, naming it.
pub fn read(storage: &dyn Storage, dir: &Path) -> Result<Option<SyncedEnd>> {
    let path = dir.join(FILE_NAME);
    let file = match storage.open(&path, OpenMode::Read) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("open", &path, e)),
    };
    let bytes = file
        .read_to_vec()
        .map_err(|e| Error::io("read", &path, e))?;
    Ok(synced::newest(&bytes))
}

/// Makes the mark of the log in `dir` claim nothing (both slots zeroed, synced), before a tool
/// removes or shortens segments under it; the next open writes the true mark again.
///
/// # Errors
/// I/O errors naming the file.
pub(crate) fn forget(storage: &dyn Storage, dir: &Path) -> Result<()> {
    let path = dir.join(FILE_NAME);
    let file = match storage.open(&path, OpenMode::ReadWrite) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("open", &path, e)),
    };
    file.write_all_at(&[0u8; FILE_BYTES as usize], 0)
        .and_then(|()| file.sync_data())
        .map_err(|e| Error::io("clear", &path, e))
}

/// A log's `SYNCED` file, open for writing. See the module documentation.
pub struct SyncedMark {
    path: PathBuf,
    /// The newest segment's first LSN and the end of its data that a returned fdatasync
    /// covered. Only ever grows within a segment. Never held during I/O.
    published: Mutex<(Lsn, u64)>,
    /// When a sync was last published: the keeper waits for [`QUIET`] after it.
    last_publish: Mutex<Instant>,
    file: Mutex<MarkFile>,
    /// Whether a request is waiting in the keeper's queue (so requests coalesce).
    queued: AtomicBool,
    /// Marks written since open.
    written: AtomicU64,
}

struct MarkFile {
    handle: Box<dyn StorageFile>,
    /// The mark on disk (`None`: the file claims nothing).
    on_disk: Option<SyncedEnd>,
    closed: bool,
    failure: Option<Arc<Error>>,
}

impl std::fmt::Debug for SyncedMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncedMark")
            .field("path", &self.path)
            .field("published", &*lock(&self.published))
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code that can panic runs under these locks; a poisoned one still guards good data.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SyncedMark {
    /// Opens (creating it durably if missing) the `SYNCED` file of the log in `dir`, whose mark
    /// on disk is `on_disk`, and writes the mark `(segment_start, data_end)` if it differs: the
    /// caller (recovery) has just synced the newest segment up to `data_end`.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub(crate) fn open(
        storage: &dyn Storage,
        dir: &Path,
        on_disk: Option<SyncedEnd>,
        segment_start: Lsn,
        data_end: u64,
    ) -> Result<Arc<SyncedMark>> {
        let path = dir.join(FILE_NAME);
        let handle = match storage.open(&path, OpenMode::ReadWrite) {
            Ok(handle) => handle,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(storage, dir)?,
            Err(e) => return Err(Error::io("open", &path, e)),
        };
        let mark = Arc::new(SyncedMark {
            path,
            published: Mutex::new((segment_start, data_end)),
            last_publish: Mutex::new(Instant::now()),
            file: Mutex::new(MarkFile {
                handle,
                on_disk,
                closed: false,
                failure: None,
            }),
            queued: AtomicBool::new(false),
            written: AtomicU64::new(0),
        });
        mark.persist()?;
        Ok(mark)
    }

    /// Records that a returned fdatasync made segment `segment_start` durable below `offset`.
    /// No I/O: [`SyncedMark::persist`] or the keeper writes it down.
    pub(crate) fn publish(&self, segment_start: Lsn, offset: u64) {
        let mut published = lock(&self.published);
        if published.0 != segment_start || published.1 < offset {
            debug_assert!(segment_start >= published.0, "segments only move forward");
            *published = (segment_start, offset);
            *lock(&self.last_publish) = Instant::now();
        }
    }

    /// The mark published last (what the next write would record).
    pub fn published(&self) -> (Lsn, u64) {
        *lock(&self.published)
    }

    /// The mark on disk, if any.
    pub fn on_disk(&self) -> Option<SyncedEnd> {
        lock(&self.file).on_disk
    }

    /// Marks written since the log was opened (the one open writes included).
    pub fn writes(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Writes the published mark down and syncs it, unless the file already says exactly that.
    /// Returns whether it wrote.
    ///
    /// # Errors
    /// The failed write or fdatasync (then every later call returns [`Error::Poisoned`]).
    pub fn persist(&self) -> Result<bool> {
        let mut file = lock(&self.file);
        if let Some(cause) = &file.failure {
            return Err(Error::Poisoned {
                cause: Arc::clone(cause),
            });
        }
        let (segment_start, synced_offset) = self.published();
        let same = file
            .on_disk
            .is_some_and(|m| m.segment_start == segment_start && m.synced_offset == synced_offset);
        if file.closed || same {
            return Ok(false);
        }
        let mark = SyncedEnd {
            seq: file.on_disk.map_or(1, |m| m.seq.wrapping_add(1)),
            segment_start,
            synced_offset,
        };
        let result = file
            .handle
            .write_all_at(&mark.encode(), mark.slot_offset())
            .map_err(|e| Error::io("write", &self.path, e))
            .and_then(|()| {
                file.handle
                    .sync_data()
                    .map_err(|e| Error::io("fdatasync", &self.path, e))
            });
        match result {
            Ok(()) => {
                file.on_disk = Some(mark);
                self.written.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(error) => {
                tracing::error!(%error, "synced-end mark stopped; recovery falls back to sync bases");
                let copy = error.duplicate_io();
                let error = Arc::new(error);
                file.failure = Some(Arc::clone(&error));
                Err(copy.unwrap_or(Error::Poisoned { cause: error }))
            }
        }
    }

    /// Asks the process's keeper thread to [`persist`](SyncedMark::persist) the mark once the
    /// log has published no sync for [`QUIET`], off the caller's path. Requests made while one
    /// is queued coalesce.
    pub fn request(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let keeper = keeper();
        lock(&keeper.queue).push_back(Arc::downgrade(self));
        keeper.wake.notify_one();
    }

    /// Stops writing marks: waits for a write in progress, and refuses later ones.
    pub(crate) fn close(&self) {
        lock(&self.file).closed = true;
    }
}

/// Creates the `SYNCED` file (two empty slots) durably: temporary name, sync, rename,
/// directory sync, so the name never holds a partial file.
fn create(storage: &dyn Storage, dir: &Path) -> Result<Box<dyn StorageFile>> {
    let temp = dir.join(TEMP_NAME);
    let path = dir.join(FILE_NAME);
    let _ = storage.remove(&temp);
    let file = storage
        .open(&temp, OpenMode::CreateNew)
        .map_err(|e| Error::io("create", &temp, e))?;
    file.write_all_at(&[0u8; FILE_BYTES as usize], 0)
        .and_then(|()| file.sync_data())
        .map_err(|e| Error::io("write", &temp, e))?;
    storage
        .rename(&temp, &path)
        .map_err(|e| Error::io("rename", &temp, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| Error::io("fsync directory", dir, e))?;
    Ok(file)
}

/// The thread that writes marks for every log of the process, one at a time.
struct Keeper {
    queue: Mutex<VecDeque<Weak<SyncedMark>>>,
    wake: Condvar,
}

fn keeper() -> &'static Keeper {
    static KEEPER: OnceLock<&'static Keeper> = OnceLock::new();
    KEEPER.get_or_init(|| {
        let keeper: &'static Keeper = Box::leak(Box::new(Keeper {
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("stela-wal-synced-mark".into())
            .spawn(move || keeper.run())
            .expect("spawn the synced-mark thread");
        keeper
    })
}

impl Keeper {
    fn run(&self) {
        let mut queue = lock(&self.queue);
        loop {
            // Marks whose log has been quiet long enough are written; the others wait.
            let now = Instant::now();
            let mut next_due: Option<Instant> = None;
            let mut due = None;
            queue.retain(|weak| {
                let Some(mark) = weak.upgrade() else {
                    return false;
                };
                let at = *lock(&mark.last_publish) + QUIET;
                if at <= now && due.is_none() {
                    due = Some(mark);
                    return false;
                }
                next_due = Some(next_due.map_or(at, |n: Instant| n.min(at)));
                true
            });
            if let Some(mark) = due {
                drop(queue);
                // Cleared before the write, so a sync that returns meanwhile queues another.
                mark.queued.store(false, Ordering::Release);
                // A failure is logged and kept by `persist`; nothing else to do here.
                let _ = mark.persist();
                queue = lock(&self.queue);
                continue;
            }
            queue = match next_due {
                Some(at) => {
                    let wait = at.saturating_duration_since(Instant::now());
                    self.wake
                        .wait_timeout(queue, wait)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0
                }
                None => self
                    .wake
                    .wait(queue)
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            };
        }
    }
}
