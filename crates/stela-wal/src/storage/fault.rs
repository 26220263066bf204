//! [`FaultStorage`]: an in-memory file system that can lose power.
//!
//! It keeps, for every file, the bytes a process sees now and the bytes that would survive a
//! power cut (those covered by a successful `sync_data`), and, for every directory entry, the
//! names made durable by `sync_dir`. [`FaultStorage::crash`] then drops everything volatile: every
//! name created, renamed or removed since its directory was last synced, and the unsynced writes
//! of each file, or some of them, as the [`CrashPlan`] says:
//! - all of them lost;
//! - a prefix of them kept, the last one torn inside a 512-byte sector (garbage to the sector's
//!   end), as a disk that persists writes in order does;
//! - any subset of their sectors kept, in any order (`ScrambleSectors`, seeded): a drive may
//!   persist the sectors of a multi-sector write, and separate writes, in any order, and a sector
//!   being written may hold garbage;
//! - exactly the given sectors of each file's last write kept, the earlier unsynced writes whole
//!   (`LastWriteSectors`), so that tests can try every subset.
//!
//! A sector that is only partly covered by a write keeps its other bytes in every plan: the model
//! (as `docs/FORMAT.md` states for the real media) is that a write never damages bytes it was not
//! asked to write.
//!
//! It also injects the failures a log must survive: an fsync that fails (`fail_sync_after`), a
//! device that fills up (`set_space_limit`), and writes that fail outright (`fail_writes`).

use super::{OpenMode, Storage, StorageFile};
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// The unit in which a crash keeps or loses the bytes of a write.
pub const SECTOR_BYTES: usize = 512;
const SECTOR: usize = SECTOR_BYTES;

/// What survives [`FaultStorage::crash`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPlan {
    /// Only synced data and names survive.
    LoseUnsynced,
    /// Synced data survives, plus a random prefix of each file's unsynced writes, the last of
    /// which is cut at a random byte with the rest of its sector filled with garbage. `seed`
    /// makes the choice repeatable.
    TearUnsynced { seed: u64 },
    /// Synced data survives, and each 512-byte sector that unsynced writes touched ends up, on
    /// its own, as it was after some prefix of the writes to it (none, some, or all of them, so
    /// later writes may persist where earlier ones did not), and sometimes with the next write
    /// to it torn: cut at a random byte, garbage to the end of the write's part of the sector.
    /// The file's length is as after a random prefix of its unsynced operations. `seed` makes
    /// the choices repeatable.
    ScrambleSectors { seed: u64 },
    /// Synced data and every unsynced operation but the last write of each file survive; of
    /// that last write, exactly the sectors in `kept` persist (bit `i`: the `i`-th 512-byte
    /// sector the write touches, counted from the one that holds its first byte; sectors past
    /// the 64th are never kept). Its sectors in `garbage` and not in `kept` hold garbage where
    /// the write's bytes would be; the others keep the bytes from before the write.
    LastWriteSectors { kept: u64, garbage: u64 },
}

/// An in-memory file system with power-loss and failure injection. Cloning shares the state.
#[derive(Clone, Default)]
pub struct FaultStorage {
    inner: Arc<Mutex<FsState>>,
}

#[derive(Default)]
struct FsState {
    names: BTreeMap<PathBuf, Arc<MemFile>>,
    durable_names: BTreeMap<PathBuf, Arc<MemFile>>,
    dirs: Vec<PathBuf>,
    locked: Vec<PathBuf>,
    faults: Faults,
}

#[derive(Default)]
struct Faults {
    /// The number of further `sync_data` calls that succeed before one fails.
    syncs_before_failure: Option<u64>,
    /// Total bytes all files may occupy.
    space_limit: Option<u64>,
    fail_writes: bool,
}

/// A file's contents. It does not point back to the file system: [`FsState`] owns its files, so
/// a reference from file to state would be a cycle and no `FaultStorage` would ever be freed
/// (found by LeakSanitizer in the `recovery_open` fuzz target). The open handle, [`FaultFile`],
/// holds the state instead.
struct MemFile {
    data: Mutex<FileData>,
}

#[derive(Default, Clone)]
struct FileData {
    current: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<Op>,
}

#[derive(Clone)]
enum Op {
    Write { offset: usize, bytes: Vec<u8> },
    Resize { len: usize },
}

impl Op {
    /// The length of a file after this operation, from `len` before it.
    fn len_after(&self, len: usize) -> usize {
        match self {
            Op::Write { offset, bytes } => len.max(offset + bytes.len()),
            Op::Resize { len: new } => *new,
        }
    }

    fn apply(&self, to: &mut Vec<u8>) {
        match self {
            Op::Write { offset, bytes } => {
                let end = offset + bytes.len();
                if to.len() < end {
                    to.resize(end, 0);
                }
                to[*offset..end].copy_from_slice(bytes);
            }
            Op::Resize { len } => to.resize(*len, 0),
        }
    }
}

impl fmt::Debug for FaultStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.inner);
        f.debug_struct("FaultStorage")
            .field("files", &state.names.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl fmt::Debug for MemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemFile")
            .field("len", &lock(&self.data).current.len())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test thread that panicked while holding the lock leaves consistent data behind: every
    // critical section here is a few plain assignments.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn out_of_space() -> io::Error {
    io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error())
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

impl FaultStorage {
    pub fn new() -> FaultStorage {
        FaultStorage::default()
    }

    /// Makes the `n`-th `sync_data` from now fail with EIO (`n` = 0: the very next one).
    ///
    /// Syncs of a log's synced-end mark (files named `SYNCED*`) are neither counted nor failed:
    /// a background thread writes the mark at its own pace, and a test that aims at the log's
    /// next sync would otherwise race it.
    pub fn fail_sync_after(&self, n: u64) {
        lock(&self.inner).faults.syncs_before_failure = Some(n);
    }

    /// Caps the total size of all files; writes and allocations past it fail with ENOSPC.
    pub fn set_space_limit(&self, bytes: Option<u64>) {
        lock(&self.inner).faults.space_limit = bytes;
    }

    /// Makes every write fail with EIO (or succeed again).
    pub fn fail_writes(&self, fail: bool) {
        lock(&self.inner).faults.fail_writes = fail;
    }

    /// The durable-or-not contents of a file as a process would read them now.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let state = lock(&self.inner);
        state.names.get(path).map(|f| lock(&f.data).current.clone())
    }

    /// Overwrites bytes of a file as if the medium had changed them, durably. For corruption
    /// tests.
    pub fn corrupt(&self, path: &Path, offset: usize, bytes: &[u8]) {
        let state = lock(&self.inner);
        let file = state.names.get(path).expect("corrupt: no such file");
        let mut data = lock(&file.data);
        let op = Op::Write {
            offset,
            bytes: bytes.to_vec(),
        };
        op.apply(&mut data.current);
        op.apply(&mut data.durable);
    }

    /// Names of files below `dir`, as a process would list them now.
    pub fn file_names(&self, dir: &Path) -> Vec<String> {
        self.list(dir).unwrap_or_default()
    }

    /// The byte ranges of a file's writes since its last successful `sync_data`, in the order
    /// they were issued.
    pub fn unsynced_writes(&self, path: &Path) -> Vec<std::ops::Range<u64>> {
        let state = lock(&self.inner);
        let Some(file) = state.names.get(path) else {
            return Vec::new();
        };
        let data = lock(&file.data);
        data.unsynced
            .iter()
            .filter_map(|op| match op {
                Op::Write { offset, bytes } => Some(*offset as u64..(offset + bytes.len()) as u64),
                Op::Resize { .. } => None,
            })
            .collect()
    }

    /// Cuts the power. Every handle opened before keeps working on the lost state, so callers
    /// should drop the old log first; a log opened afterwards sees what the disk kept.
    pub fn crash(&self, plan: CrashPlan) {
        let mut rng = SplitMix(match plan {
            CrashPlan::TearUnsynced { seed } | CrashPlan::ScrambleSectors { seed } => seed,
            CrashPlan::LoseUnsynced | CrashPlan::LastWriteSectors { .. } => 0,
        });
        let mut state = lock(&self.inner);
        let mut survivors = BTreeMap::new();
        for (path, file) in &state.durable_names {
            let data = lock(&file.data);
            let kept = match plan {
                CrashPlan::LoseUnsynced => data.durable.clone(),
                CrashPlan::TearUnsynced { .. } => keep_torn_prefix(&data, &mut rng),
                CrashPlan::ScrambleSectors { .. } => keep_scrambled_sectors(&data, &mut rng),
                CrashPlan::LastWriteSectors { kept, garbage } => {
                    keep_last_write_sectors(&data, kept, garbage)
                }
            };
            let survivor = Arc::new(MemFile {
                data: Mutex::new(FileData {
                    current: kept.clone(),
                    durable: kept,
                    unsynced: Vec::new(),
                }),
            });
            survivors.insert(path.clone(), survivor);
        }
        state.names = survivors.clone();
        state.durable_names = survivors;
        state.locked.clear();
        state.faults = Faults::default();
    }
}

/// The durable bytes plus a random prefix of the unsynced operations, the last write of which is
/// torn (see [`CrashPlan::TearUnsynced`]).
fn keep_torn_prefix(data: &FileData, rng: &mut SplitMix) -> Vec<u8> {
    let mut kept = data.durable.clone();
    let keep = rng.below(data.unsynced.len() as u64 + 1) as usize;
    for (i, op) in data.unsynced.iter().take(keep).enumerate() {
        match op {
            Op::Write { offset, bytes } if i + 1 == keep && !bytes.is_empty() => {
                tear(&mut kept, *offset, bytes, rng);
            }
            op => op.apply(&mut kept),
        }
    }
    kept
}

/// The sectors a write of `len` bytes at `offset` touches, each with the part of the write in it.
fn sectors_of(offset: usize, len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let end = offset + len;
    (offset / SECTOR..end.div_ceil(SECTOR))
        .map(move |sector| offset.max(sector * SECTOR)..end.min((sector + 1) * SECTOR))
}

/// Bytes a torn sector holds where a write's bytes should be: never all zeros, so a test sees
/// them as written.
fn garbage_at(position: usize) -> u8 {
    (position as u8).wrapping_mul(151) ^ 0x5A | 1
}

fn fill_garbage(bytes: &mut [u8], range: std::ops::Range<usize>) {
    let start = range.start;
    for (i, b) in bytes[range].iter_mut().enumerate() {
        *b = garbage_at(start + i);
    }
}

/// The durable bytes with each sector the unsynced writes touched as after some prefix of the
/// writes to it, the next one sometimes torn (see [`CrashPlan::ScrambleSectors`]).
fn keep_scrambled_sectors(data: &FileData, rng: &mut SplitMix) -> Vec<u8> {
    let prefix = rng.below(data.unsynced.len() as u64 + 1) as usize;
    let len = data.unsynced[..prefix]
        .iter()
        .fold(data.durable.len(), |len, op| op.len_after(len));
    let writes: Vec<(usize, &[u8])> = data
        .unsynced
        .iter()
        .filter_map(|op| match op {
            Op::Write { offset, bytes } => Some((*offset, bytes.as_slice())),
            Op::Resize { .. } => None,
        })
        .collect();
    let mut by_sector: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (index, (offset, bytes)) in writes.iter().enumerate() {
        for part in sectors_of(*offset, bytes.len()) {
            by_sector
                .entry(part.start / SECTOR)
                .or_default()
                .push(index);
        }
    }
    let mut kept = data.durable.clone();
    kept.resize(kept.len().max(data.current.len()), 0);
    for (sector, touching) in by_sector {
        let whole = sector * SECTOR..(sector + 1) * SECTOR;
        let part_of = |index: usize| {
            let (offset, bytes) = writes[index];
            let part = offset.max(whole.start)..(offset + bytes.len()).min(whole.end);
            (part.clone(), &bytes[part.start - offset..part.end - offset])
        };
        let applied = rng.below(touching.len() as u64 + 1) as usize;
        for &index in &touching[..applied] {
            let (part, bytes) = part_of(index);
            kept[part].copy_from_slice(bytes);
        }
        if applied < touching.len() && rng.below(3) == 0 {
            let (part, bytes) = part_of(touching[applied]);
            let cut = part.start + rng.below(part.len() as u64) as usize;
            kept[part.start..cut].copy_from_slice(&bytes[..cut - part.start]);
            fill_garbage(&mut kept, cut..part.end);
        }
    }
    kept.resize(len, 0);
    kept
}

/// The durable bytes and every unsynced operation, except that only the chosen sectors of the
/// last write persist (see [`CrashPlan::LastWriteSectors`]).
fn keep_last_write_sectors(data: &FileData, kept: u64, garbage: u64) -> Vec<u8> {
    let last = data
        .unsynced
        .iter()
        .rposition(|op| matches!(op, Op::Write { .. }));
    let mut out = data.durable.clone();
    for (i, op) in data.unsynced.iter().enumerate() {
        let Op::Write { offset, bytes } = op else {
            op.apply(&mut out);
            continue;
        };
        if Some(i) != last {
            op.apply(&mut out);
            continue;
        }
        let end = offset + bytes.len();
        if out.len() < end {
            out.resize(end, 0);
        }
        for (k, part) in sectors_of(*offset, bytes.len()).enumerate() {
            let bit = if k < 64 { 1u64 << k } else { 0 };
            if kept & bit != 0 {
                out[part.clone()].copy_from_slice(&bytes[part.start - offset..part.end - offset]);
            } else if garbage & bit != 0 {
                fill_garbage(&mut out, part);
            }
        }
    }
    out
}

/// Applies a write cut short: a random prefix lands, and the sector the cut falls in gets
/// garbage after the cut (a torn sector).
fn tear(to: &mut Vec<u8>, offset: usize, bytes: &[u8], rng: &mut SplitMix) {
    let cut = rng.below(bytes.len() as u64) as usize;
    Op::Write {
        offset,
        bytes: bytes[..cut].to_vec(),
    }
    .apply(to);
    let torn_from = offset + cut;
    let sector_end = (torn_from / SECTOR + 1) * SECTOR;
    let garbage_end = sector_end.min(offset + bytes.len());
    let garbage: Vec<u8> = (torn_from..garbage_end)
        .map(|_| rng.next() as u8 | 1)
        .collect();
    Op::Write {
        offset: torn_from,
        bytes: garbage,
    }
    .apply(to);
}

/// A tiny deterministic generator, so crash plans replay from a seed without a dependency.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next() % bound
        }
    }
}

impl FsState {
    fn used_bytes(&self) -> u64 {
        self.names
            .values()
            .map(|f| lock(&f.data).current.len() as u64)
            .sum()
    }
}

impl Storage for FaultStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = lock(&self.inner);
        // Every ancestor too, as a real create_dir_all makes them.
        for dir in dir.ancestors().filter(|d| !d.as_os_str().is_empty()) {
            if !state.dirs.iter().any(|d| d == dir) {
                state.dirs.push(dir.to_path_buf());
            }
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = lock(&self.inner);
        if !state.dirs.iter().any(|d| d == dir) {
            return Err(not_found(dir));
        }
        // Files, and the directories made in it, as a real directory lists both.
        Ok(state
            .names
            .keys()
            .chain(state.dirs.iter())
            .filter(|path| path.parent() == Some(dir))
            .filter_map(|path| path.file_name()?.to_str().map(str::to_string))
            .collect())
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut state = lock(&self.inner);
        let existing = state.names.get(path).cloned();
        let file = match (mode, existing) {
            (OpenMode::CreateNew, Some(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}: exists", path.display()),
                ))
            }
            (OpenMode::CreateNew, None) => {
                let parent = path.parent().unwrap_or(Path::new(""));
                if !state.dirs.iter().any(|d| d == parent) {
                    return Err(not_found(parent));
                }
                let file = Arc::new(MemFile {
                    data: Mutex::new(FileData::default()),
                });
                state.names.insert(path.to_path_buf(), Arc::clone(&file));
                file
            }
            (_, Some(file)) => file,
            (_, None) => return Err(not_found(path)),
        };
        let is_mark = path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("SYNCED"));
        Ok(Box::new(FaultFile {
            storage: Arc::clone(&self.inner),
            file,
            writable: mode != OpenMode::Read,
            sync_faults: !is_mark,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = lock(&self.inner);
        let file = state.names.remove(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_path_buf(), file);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = lock(&self.inner);
        state.names.remove(path).ok_or_else(|| not_found(path))?;
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = lock(&self.inner);
        let in_dir = |path: &PathBuf| path.parent() == Some(dir);
        state.durable_names.retain(|path, _| !in_dir(path));
        let current: Vec<_> = state
            .names
            .iter()
            .filter(|(path, _)| in_dir(path))
            .map(|(path, file)| (path.clone(), Arc::clone(file)))
            .collect();
        state.durable_names.extend(current);
        Ok(())
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<Box<dyn Send + Sync>> {
        let mut state = lock(&self.inner);
        if state.locked.iter().any(|d| d == dir) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        state.locked.push(dir.to_path_buf());
        Ok(Box::new(DirLock {
            storage: Arc::clone(&self.inner),
            dir: dir.to_path_buf(),
        }))
    }
}

struct DirLock {
    storage: Arc<Mutex<FsState>>,
    dir: PathBuf,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        lock(&self.storage).locked.retain(|d| d != &self.dir);
    }
}

struct FaultFile {
    /// The file system the file belongs to, for its faults and space limit.
    storage: Arc<Mutex<FsState>>,
    file: Arc<MemFile>,
    writable: bool,
    /// Whether `fail_sync_after` counts and fails this file's syncs (not the `SYNCED` mark's).
    sync_faults: bool,
}

impl fmt::Debug for FaultFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultFile")
            .field("file", &self.file)
            .field("writable", &self.writable)
            .finish()
    }
}

impl FaultFile {
    fn check_writable(&self) -> io::Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "file opened read-only",
            ))
        }
    }

    /// Applies a size-changing or data-changing operation if the faults allow it.
    fn mutate(&self, op: Op, new_len: usize) -> io::Result<()> {
        self.check_writable()?;
        let storage = lock(&self.storage);
        if storage.faults.fail_writes {
            return Err(io::Error::other("injected write failure"));
        }
        let mut data = lock(&self.file.data);
        let growth = new_len.saturating_sub(data.current.len()) as u64;
        if let Some(limit) = storage.faults.space_limit {
            drop(data);
            let used = storage.used_bytes();
            data = lock(&self.file.data);
            if growth > 0 && used + growth > limit {
                return Err(out_of_space());
            }
        }
        op.apply(&mut data.current);
        data.unsynced.push(op);
        Ok(())
    }
}

impl StorageFile for FaultFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let data = lock(&self.file.data);
        let offset = offset as usize;
        if offset >= data.current.len() {
            return Ok(0);
        }
        let n = buf.len().min(data.current.len() - offset);
        buf[..n].copy_from_slice(&data.current[offset..offset + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let offset = offset as usize;
        let new_len = {
            let data = lock(&self.file.data);
            data.current.len().max(offset + buf.len())
        };
        self.mutate(
            Op::Write {
                offset,
                bytes: buf.to_vec(),
            },
            new_len,
        )
    }

    /// One write, whatever the number of buffers: a crash tears it as one.
    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        self.write_all_at(&bufs.concat(), offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut storage = lock(&self.storage);
        let mut data = lock(&self.file.data);
        if let Some(n) = storage
            .faults
            .syncs_before_failure
            .filter(|_| self.sync_faults)
        {
            if n == 0 {
                storage.faults.syncs_before_failure = None;
                // Like Linux after a writeback error: the dirty data is gone from the durable
                // view (it will not be retried), but the process still reads it from the cache.
                data.unsynced.clear();
                return Err(io::Error::other("injected fsync failure (EIO)"));
            }
            storage.faults.syncs_before_failure = Some(n - 1);
        }
        let ops = std::mem::take(&mut data.unsynced);
        for op in &ops {
            op.apply(&mut data.durable);
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(lock(&self.file.data).current.len() as u64)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        let current = self.len()?;
        if current >= len {
            return Ok(());
        }
        self.mutate(Op::Resize { len: len as usize }, len as usize)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.mutate(Op::Resize { len: len as usize }, len as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (FaultStorage, PathBuf) {
        let fs = FaultStorage::new();
        let dir = PathBuf::from("/log");
        fs.create_dir_all(&dir).unwrap();
        (fs, dir)
    }

    #[test]
    fn unsynced_writes_and_names_are_lost() {
        let (fs, dir) = setup();
        let synced = fs.open(&dir.join("a"), OpenMode::CreateNew).unwrap();
        fs.sync_dir(&dir).unwrap();
        synced.write_all_at(b"kept", 0).unwrap();
        synced.sync_data().unwrap();
        synced.write_all_at(b"lost", 4).unwrap();
        let unnamed = fs.open(&dir.join("b"), OpenMode::CreateNew).unwrap();
        unnamed.write_all_at(b"x", 0).unwrap();
        unnamed.sync_data().unwrap();
        fs.crash(CrashPlan::LoseUnsynced);
        assert_eq!(fs.read_file(&dir.join("a")).unwrap(), b"kept");
        assert!(fs.read_file(&dir.join("b")).is_none());
    }

    #[test]
    fn a_failed_sync_loses_the_dirty_data_for_good() {
        let (fs, dir) = setup();
        let file = fs.open(&dir.join("a"), OpenMode::CreateNew).unwrap();
        fs.sync_dir(&dir).unwrap();
        file.write_all_at(b"data", 0).unwrap();
        fs.fail_sync_after(0);
        assert!(file.sync_data().is_err());
        assert!(
            file.sync_data().is_ok(),
            "a retry succeeds and proves nothing"
        );
        fs.crash(CrashPlan::LoseUnsynced);
        assert_eq!(fs.read_file(&dir.join("a")).unwrap(), b"");
    }

    #[test]
    fn a_dropped_storage_frees_its_files() {
        let (fs, dir) = setup();
        let file = fs.open(&dir.join("a"), OpenMode::CreateNew).unwrap();
        file.write_all_at(b"data", 0).unwrap();
        fs.sync_dir(&dir).unwrap();
        fs.crash(CrashPlan::LoseUnsynced);
        let state = Arc::downgrade(&fs.inner);
        drop(fs);
        assert!(state.upgrade().is_some(), "an open handle keeps it alive");
        drop(file);
        assert!(state.upgrade().is_none(), "files and state form a cycle");
    }

    #[test]
    fn space_limit_fails_growth_with_enospc() {
        let (fs, dir) = setup();
        let file = fs.open(&dir.join("a"), OpenMode::CreateNew).unwrap();
        fs.set_space_limit(Some(10));
        file.write_all_at(&[1; 10], 0).unwrap();
        let err = file.write_all_at(&[1], 10).unwrap_err();
        assert!(super::super::is_out_of_space(&err));
        file.write_all_at(&[2; 4], 0).unwrap();
    }

    /// Exactly the chosen sectors of the last write persist; earlier unsynced writes persist
    /// whole; bytes of a partly covered sector outside the write are never touched.
    #[test]
    fn last_write_sectors_keep_exactly_the_chosen_sectors() {
        let (fs, dir) = setup();
        let path = dir.join("a");
        let file = fs.open(&path, OpenMode::CreateNew).unwrap();
        fs.sync_dir(&dir).unwrap();
        file.write_all_at(&[1u8; 2048], 0).unwrap();
        file.sync_data().unwrap();
        file.write_all_at(&[2u8; 100], 200).unwrap(); // an earlier unsynced write
        file.write_all_at(&[3u8; 1200], 700).unwrap(); // sectors 1, 2, 3 (700..1900)
        assert_eq!(fs.unsynced_writes(&path), vec![200..300, 700..1900]);
        fs.crash(CrashPlan::LastWriteSectors {
            kept: 0b101,
            garbage: 0b010,
        });
        let kept = fs.read_file(&path).unwrap();
        assert_eq!(kept.len(), 2048);
        assert!(kept[200..300].iter().all(|&b| b == 2), "earlier write lost");
        assert!(kept[..200].iter().chain(&kept[300..700]).all(|&b| b == 1));
        assert!(
            kept[700..1024].iter().all(|&b| b == 3),
            "sector 0 of the write"
        );
        assert!(
            (1024..1536).all(|at| kept[at] == garbage_at(at)),
            "sector 1: garbage"
        );
        assert!(
            kept[1536..1900].iter().all(|&b| b == 3),
            "sector 2 of the write"
        );
        assert!(
            kept[1900..].iter().all(|&b| b == 1),
            "bytes after the write"
        );

        // Neither kept nor garbage: the bytes from before the write.
        let (fs, dir) = setup();
        let path = dir.join("b");
        let file = fs.open(&path, OpenMode::CreateNew).unwrap();
        fs.sync_dir(&dir).unwrap();
        file.write_all_at(&[1u8; 2048], 0).unwrap();
        file.sync_data().unwrap();
        file.write_all_at(&[3u8; 1200], 700).unwrap();
        fs.crash(CrashPlan::LastWriteSectors {
            kept: 0b100,
            garbage: 0,
        });
        let kept = fs.read_file(&path).unwrap();
        assert!(kept[..1536].iter().all(|&b| b == 1));
        assert!(kept[1536..1900].iter().all(|&b| b == 3));
    }

    /// Scrambled sectors: every sector is one of its versions (or torn between two), later
    /// writes persist without earlier ones in some runs, and synced bytes are never touched.
    #[test]
    fn scrambled_sectors_persist_in_any_order() {
        let mut later_without_earlier = false;
        for seed in 0..200 {
            let (fs, dir) = setup();
            let path = dir.join("a");
            let file = fs.open(&path, OpenMode::CreateNew).unwrap();
            fs.sync_dir(&dir).unwrap();
            file.write_all_at(&[1u8; 4096], 0).unwrap();
            file.sync_data().unwrap();
            file.write_all_at(&[2u8; 1024], 512).unwrap(); // sectors 1 and 2
            file.write_all_at(&[3u8; 1024], 2048).unwrap(); // sectors 4 and 5
            fs.crash(CrashPlan::ScrambleSectors { seed });
            let kept = fs.read_file(&path).unwrap();
            assert_eq!(kept.len(), 4096);
            for (i, sector) in kept.chunks(SECTOR).enumerate() {
                let new = match i {
                    1 | 2 => 2,
                    4 | 5 => 3,
                    _ => 1,
                };
                // One version throughout, or one version up to a cut and garbage after it.
                let version_ok = |b: u8| b == 1 || b == new;
                let is_garbage =
                    |from: usize| (from..SECTOR).all(|j| sector[j] == garbage_at(i * SECTOR + j));
                let whole = sector.iter().all(|&b| b == sector[0]) && version_ok(sector[0]);
                let torn = (0..SECTOR).any(|cut| {
                    sector[..cut]
                        .iter()
                        .all(|&b| b == sector[0] && version_ok(b))
                        && is_garbage(cut)
                });
                assert!(whole || torn, "seed {seed}: sector {i} is no version");
                if new == 1 {
                    assert!(
                        sector.iter().all(|&b| b == 1),
                        "seed {seed}: synced sector {i}"
                    );
                }
            }
            let first_write = kept[512] == 2 && kept[1024] == 2;
            let second_write = kept[2048] == 3 && kept[2560] == 3;
            later_without_earlier |= second_write && !first_write;
        }
        assert!(
            later_without_earlier,
            "the later write never persisted alone"
        );
    }

    #[test]
    fn torn_writes_keep_a_prefix_and_garbage_to_the_sector_end() {
        for seed in 0..50 {
            let (fs, dir) = setup();
            let file = fs.open(&dir.join("a"), OpenMode::CreateNew).unwrap();
            fs.sync_dir(&dir).unwrap();
            file.write_all_at(&[7u8; 2000], 0).unwrap();
            fs.crash(CrashPlan::TearUnsynced { seed });
            let kept = fs.read_file(&dir.join("a")).unwrap();
            assert!(kept.len() <= 2000);
            let good = kept.iter().take_while(|&&b| b == 7).count();
            assert!(kept.len() - good <= SECTOR, "garbage beyond one sector");
        }
    }
}
