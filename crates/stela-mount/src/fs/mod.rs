//! The FUSE file system: answers the kernel from memory and logs every mutation, in order,
//! before it answers.
//!
//! Owns: the mount's [`Tree`] (names and attributes), the overlay of file data logged but not
//! yet in the backing files, open-file counts, and the mount's failure state. Invariants:
//! - A mutation is checked against the tree, appended to the log, and applied to the tree and
//!   overlay under one lock, so the tree's order of changes is the log's LSN order (the order
//!   the materialiser and a restart replay).
//! - A write logs only the bytes that change the file ([`changed_window`]): what it leaves
//!   equal is not logged, so a database rewriting a page for a few new bytes logs those.
//! - A mutation is answered only after the daemon acknowledged its record (`buffered`: in the
//!   daemon's protected memory). fsync and fsyncdir return only once every record that touched
//!   the file or directory is at the mount's level; neither ever answers ENOSYS (which would
//!   make the kernel skip later fsyncs silently).
//! - Fail-stop: once an append or a wait fails, the mount's memory may hold a change the log
//!   does not, so every later request gets EIO; remounting replays the log, which is the truth.
//! - A read is the backing file's bytes with the overlay's records (newer than the last
//!   checkpoint) applied on top, in LSN order. Re-applying records the backing file already
//!   holds changes nothing, since each record sets bytes (or a size) outright.

use crate::backing::Backing;
use crate::record::{falloc, FsRecord, Kind, Time};
use crate::tree::{Inconsistent, Node, Tree};
use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo, RenameFlags, Request, TimeOrNow};
use serde_bytes::ByteBuf;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use stela_client::{Durability, Lsn, Wal};

const NAME_MAX: usize = 255;

mod kernel;
mod overlay;

use overlay::{changed_window, Overlay, DIFF_LIMIT};
pub use overlay::{overlay_onto, Pending};

struct State {
    tree: Tree,
    /// Per inode, the last record that touched it (its data, attributes, names in it, or its
    /// own name): what its fsync waits for.
    last_lsn: HashMap<u64, u64>,
    overlay: Overlay,
    open_files: HashMap<u64, u32>,
    next_fh: u64,
    /// Why the mount stopped (every request then gets EIO).
    failed: Option<String>,
    /// Why the materialiser stopped, if it did.
    materialiser_failed: Option<String>,
}

/// Settings of a mount.
#[derive(Clone, Debug)]
pub struct MountSettings {
    /// The level fsync waits for.
    pub level: Durability,
    /// Above this many bytes of logged but unmaterialised data, writes wait for the
    /// materialiser.
    pub overlay_cap: u64,
    /// Let the kernel cache writes (FUSE_WRITEBACK_CACHE) and send them at fsync, on close or
    /// under memory pressure, in large pieces: fsync still reaches the mount after the data,
    /// so an answered fsync keeps its promise, but a write not yet fsync'ed is in the kernel's
    /// page cache, not the daemon, until then (a crash of the mount process loses it).
    pub writeback_cache: bool,
}

/// What the mount and its materialiser share: the mount's state, and the signal that the
/// overlay shrank.
struct Shared {
    state: Mutex<State>,
    /// Signalled when the overlay shrinks or the materialiser stops.
    overlay_shrunk: Condvar,
}

/// The materialiser's (and the command's) hold on a running mount.
#[derive(Clone)]
pub struct MountHandle(Arc<Shared>);

impl MountHandle {
    /// Frees overlay records the materialiser has made durable in the backing files.
    pub fn checkpointed(&self, applied: u64) {
        let mut state = self.0.state.lock().expect("state lock");
        state.overlay.prune(applied);
        self.0.overlay_shrunk.notify_all();
    }

    /// The materialiser stopped for good: writes fail once the overlay is full.
    pub fn materialiser_failed(&self, why: String) {
        let mut state = self.0.state.lock().expect("state lock");
        state.materialiser_failed = Some(why);
        self.0.overlay_shrunk.notify_all();
    }

    /// The reason the mount stopped, if it did.
    pub fn failure(&self) -> Option<String> {
        self.0.state.lock().expect("state lock").failed.clone()
    }
}

/// Why a mount could not start over its replayed log.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A record after the snapshot does not fit the tree.
    #[error("replaying log record {lsn}: {source}")]
    Record {
        lsn: u64,
        #[source]
        source: Inconsistent,
    },
    /// Logging the drop of an inode left open without a name failed: the mount stopped, for
    /// the reason it gives every request.
    #[error("{0}")]
    Stopped(String),
}

pub struct StelaFs {
    shared: Arc<Shared>,
    /// The connection appends go through (under the state lock, so LSN order is tree order).
    log: Wal<FsRecord>,
    /// Connections fsync waits go through, one per concurrent wait.
    waiters: Mutex<Vec<Wal<FsRecord>>>,
    open_waiter: Box<dyn Fn() -> stela_client::Result<Wal<FsRecord>> + Send + Sync>,
    backing: Arc<Backing>,
    settings: MountSettings,
    /// The most file data one record carries (the daemon's record limit, less the record's
    /// other fields).
    write_piece: usize,
}

/// Room left in a record for a write's fields other than its data.
const WRITE_RECORD_OVERHEAD: usize = 128;

fn kind_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
    }
}

fn attr_of(ino: u64, node: &Node) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: node.size,
        blocks: node.size.div_ceil(512),
        atime: node.atime.to_system(),
        mtime: node.mtime.to_system(),
        ctime: node.ctime.to_system(),
        crtime: node.ctime.to_system(),
        kind: kind_type(node.kind),
        perm: node.mode as u16,
        nlink: node.nlink,
        uid: node.uid,
        gid: node.gid,
        rdev: node.rdev,
        blksize: 4096,
        flags: 0,
    }
}

/// How often an fsync whose commit came back unprotected asks again.
const UNPROTECTED_RETRY: Duration = Duration::from_millis(20);

/// Commits `lsn` at `level`; at `replicated` or `all`, a commit the primary answers without a
/// standby (`Error::Unprotected`: it was promoted and its old primary is not back yet) is asked
/// again until a standby holds the record. The file system never tells PostgreSQL an fsync
/// succeeded at `replicated` while one node alone holds the bytes; with two nodes that means
/// fsyncs wait, after a failover, until the other node rejoins (docs/POSTGRES.md). Any other
/// error ends the wait.
fn commit_protected(
    log: &Wal<FsRecord>,
    lsn: u64,
    level: Durability,
) -> Result<(), stela_client::Error> {
    let mut warned = false;
    loop {
        match log.commit_at(Lsn::new(lsn), level) {
            Err(stela_client::Error::Unprotected { cause, .. }) => {
                if !warned {
                    tracing::warn!(
                        lsn,
                        cause,
                        "stela mount: fsync waits until a standby holds the record (the primary has none now)"
                    );
                    warned = true;
                }
                std::thread::sleep(UNPROTECTED_RETRY);
            }
            other => return other,
        }
    }
}

fn name_of(name: &OsStr) -> Result<ByteBuf, Errno> {
    let bytes = name.as_bytes();
    if bytes.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(ByteBuf::from(bytes.to_vec()))
}

fn time_of(time: TimeOrNow) -> Time {
    Time::from(stela_fuse::time_or_now(time))
}

impl StelaFs {
    /// A file system over `tree` (as replayed from the backing snapshot and the log), logging
    /// through `log`.
    pub fn new(
        tree: Tree,
        replayed: Vec<(u64, FsRecord)>,
        log: Wal<FsRecord>,
        open_waiter: Box<dyn Fn() -> stela_client::Result<Wal<FsRecord>> + Send + Sync>,
        backing: Arc<Backing>,
        settings: MountSettings,
    ) -> Result<StelaFs, ReplayError> {
        let mut state = State {
            tree,
            last_lsn: HashMap::new(),
            overlay: Overlay::default(),
            open_files: HashMap::new(),
            next_fh: 1,
            failed: None,
            materialiser_failed: None,
        };
        for (lsn, record) in replayed {
            if lsn <= state.tree.applied {
                continue;
            }
            apply_logged(&mut state, lsn, record)
                .map_err(|source| ReplayError::Record { lsn, source })?;
        }
        let write_piece = log
            .max_record_bytes()
            .saturating_sub(WRITE_RECORD_OVERHEAD)
            .max(4096);
        let fs = StelaFs {
            write_piece,
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                overlay_shrunk: Condvar::new(),
            }),
            log,
            waiters: Mutex::new(Vec::new()),
            open_waiter,
            backing,
            settings,
        };
        // Inodes that lost their last name while open when the mount stopped have no
        // descriptor now: their data can go.
        let mut state = fs.shared.state.lock().expect("state lock");
        let orphans: Vec<u64> = state
            .tree
            .nodes
            .iter()
            .filter(|(_, node)| node.nlink == 0)
            .map(|(ino, _)| *ino)
            .collect();
        for ino in orphans {
            fs.log_record(&mut state, FsRecord::Drop { ino })
                .map_err(|_| ReplayError::Stopped(state.failed.clone().unwrap_or_default()))?;
        }
        drop(state);
        Ok(fs)
    }

    pub fn handle(&self) -> MountHandle {
        MountHandle(Arc::clone(&self.shared))
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>, Errno> {
        let state = self.shared.state.lock().map_err(|_| Errno::EIO)?;
        if state.failed.is_some() {
            return Err(Errno::EIO);
        }
        Ok(state)
    }

    fn fail(&self, state: &mut State, why: String) -> Errno {
        if state.failed.is_none() {
            tracing::error!(
                "stela mount: {why}; every request now fails with EIO (remount to replay the log)"
            );
            state.failed = Some(why);
        }
        Errno::EIO
    }

    /// Appends `record`, then applies it to the tree and overlay; returns its LSN.
    fn log_record(&self, state: &mut State, record: FsRecord) -> Result<u64, Errno> {
        let lsn = match self.log.append(&record) {
            Ok(lsn) => lsn.get(),
            Err(e) => return Err(self.fail(state, format!("appending to the log: {e}"))),
        };
        if let Err(e) = apply_logged(state, lsn, record) {
            return Err(self.fail(state, format!("log record {lsn}: {e}")));
        }
        Ok(lsn)
    }

    /// Waits until `lsn` is at the mount's level. At `replicated` or `all` that means a
    /// standby holds it: a commit the primary answers without one ([`commit_protected`]) is not
    /// a success, and the fsync waits on.
    fn wait_for(&self, lsn: u64) -> Result<(), Errno> {
        if lsn == 0 {
            return Ok(());
        }
        // An acknowledged append is already `buffered`.
        if self.settings.level == Durability::Buffered {
            return Ok(());
        }
        let waiter = self.waiters.lock().expect("waiters lock").pop();
        let waiter = match waiter {
            Some(waiter) => waiter,
            None => match (self.open_waiter)() {
                Ok(waiter) => waiter,
                Err(e) => {
                    let mut state = self.shared.state.lock().expect("state lock");
                    return Err(self.fail(&mut state, format!("connecting for fsync: {e}")));
                }
            },
        };
        match commit_protected(&waiter, lsn, self.settings.level) {
            Ok(()) => {
                self.waiters.lock().expect("waiters lock").push(waiter);
                Ok(())
            }
            Err(e) => {
                let mut state = self.shared.state.lock().expect("state lock");
                Err(self.fail(
                    &mut state,
                    format!(
                        "fsync: LSN {lsn} did not reach {:?}: {e}",
                        self.settings.level
                    ),
                ))
            }
        }
    }

    /// Checks that `name` may be made in `parent`.
    fn check_new_name(state: &State, parent: u64, name: &ByteBuf) -> Result<(), Errno> {
        let dir = state.tree.get(parent).ok_or(Errno::ENOENT)?;
        if dir.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if dir.nlink == 0 {
            return Err(Errno::ENOENT);
        }
        if dir.entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        kind: Kind,
        mode: u32,
        rdev: u32,
        target: &[u8],
    ) -> Result<(u64, FileAttr), Errno> {
        let name = name_of(name)?;
        let mut state = self.lock()?;
        Self::check_new_name(&state, parent, &name)?;
        let ino = state.tree.next_ino;
        // A directory with the set-group-ID bit passes its group (and the bit, to directories).
        let dir = state.tree.get(parent).expect("checked");
        let (gid, mode) = if dir.mode & 0o2000 != 0 {
            let mode = if kind == Kind::Dir {
                mode | 0o2000
            } else {
                mode
            };
            (dir.gid, mode)
        } else {
            (req.gid(), mode)
        };
        let record = FsRecord::Make {
            parent,
            name,
            ino,
            kind,
            mode: mode & 0o7777,
            uid: req.uid(),
            gid,
            rdev,
            target: ByteBuf::from(target.to_vec()),
            time: Time::now(),
        };
        self.log_record(&mut state, record)?;
        let node = state.tree.get(ino).expect("just made");
        Ok((ino, attr_of(ino, node)))
    }

    fn open_file(&self, ino: u64) -> Result<FileHandle, Errno> {
        let mut state = self.lock()?;
        if state.tree.get(ino).is_none() {
            return Err(Errno::ENOENT);
        }
        *state.open_files.entry(ino).or_default() += 1;
        let fh = state.next_fh;
        state.next_fh += 1;
        Ok(FileHandle(fh))
    }

    /// Logs the drop of `ino` if it has no name and no open descriptor left.
    fn drop_if_gone(&self, state: &mut State, ino: u64) -> Result<(), Errno> {
        let gone = state.tree.get(ino).is_some_and(|node| node.nlink == 0)
            && state.open_files.get(&ino).copied().unwrap_or(0) == 0;
        if gone {
            self.log_record(state, FsRecord::Drop { ino })?;
        }
        Ok(())
    }

    fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let name = name_of(name)?;
        let mut state = self.lock()?;
        let ino = state.tree.lookup(parent, &name).ok_or(Errno::ENOENT)?;
        may_lose_its_name(dir, state.tree.get(ino).ok_or(Errno::ENOENT)?)?;
        let record = FsRecord::Remove {
            parent,
            name,
            time: Time::now(),
        };
        self.log_record(&mut state, record)?;
        self.drop_if_gone(&mut state, ino)
    }

    fn do_rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let (name, new_name) = (name_of(name)?, name_of(new_name)?);
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return Err(Errno::EINVAL);
        }
        let mut state = self.lock()?;
        let tree = &state.tree;
        let moved = tree.lookup(parent, &name).ok_or(Errno::ENOENT)?;
        let to_dir = tree.get(new_parent).ok_or(Errno::ENOENT)?;
        if to_dir.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let replaced = tree.lookup(new_parent, &new_name);
        if replaced == Some(moved) {
            return Ok(());
        }
        let moved_is_dir = tree.get(moved).ok_or(Errno::ENOENT)?.kind == Kind::Dir;
        if moved_is_dir && tree.is_within(new_parent, moved) {
            return Err(Errno::EINVAL);
        }
        if exchange {
            let other = replaced.ok_or(Errno::ENOENT)?;
            if tree.get(other).ok_or(Errno::ENOENT)?.kind == Kind::Dir
                && tree.is_within(parent, other)
            {
                return Err(Errno::EINVAL);
            }
        } else if let Some(replaced) = replaced {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            may_lose_its_name(moved_is_dir, tree.get(replaced).ok_or(Errno::ENOENT)?)?;
        }
        let record = FsRecord::Rename {
            parent,
            name,
            new_parent,
            new_name,
            exchange,
            time: Time::now(),
        };
        self.log_record(&mut state, record)?;
        if let (Some(replaced), false) = (replaced, exchange) {
            self.drop_if_gone(&mut state, replaced)?;
        }
        Ok(())
    }

    fn read_file(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let (file_size, records) = {
            let state = self.lock()?;
            let node = state.tree.get(ino).ok_or(Errno::ENOENT)?;
            if node.kind == Kind::Dir {
                return Err(Errno::EISDIR);
            }
            let end = offset.saturating_add(u64::from(size));
            (node.size, state.overlay.touching(ino, offset, end))
        };
        if offset >= file_size {
            return Ok(Vec::new());
        }
        let length = (file_size - offset).min(u64::from(size)) as usize;
        let mut buf = vec![0u8; length];
        if let Err(e) = self.backing.read_at(ino, offset, &mut buf) {
            tracing::error!("stela mount: reading backing file of inode {ino}: {e}");
            return Err(Errno::EIO);
        }
        overlay_onto(&mut buf, offset, &records);
        Ok(buf)
    }

    fn write_file(&self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let mut state = self.lock()?;
        while state.overlay.bytes > self.settings.overlay_cap {
            if let Some(why) = &state.materialiser_failed {
                tracing::error!("stela mount: write refused, the materialiser stopped: {why}");
                return Err(Errno::EIO);
            }
            state = self
                .shared
                .overlay_shrunk
                .wait(state)
                .map_err(|_| Errno::EIO)?;
            if state.failed.is_some() {
                return Err(Errno::EIO);
            }
        }
        let node = state.tree.get(ino).ok_or(Errno::ENOENT)?;
        if node.kind != Kind::File {
            return Err(Errno::EINVAL);
        }
        let time = Time::now();
        let (from, to) = self.window_to_log(&state, ino, node.size, offset, data)?;
        if from == to {
            // Nothing changes but the modification time: one empty write says so.
            let record = FsRecord::Write {
                ino,
                offset,
                data: ByteBuf::new(),
                time,
            };
            self.log_record(&mut state, record)?;
            return Ok(data.len() as u32);
        }
        // A write larger than the daemon's record limit becomes several records, logged
        // back to back under the lock (a crash may keep a prefix of them, as a crash may
        // keep part of a large write on a disk).
        let changed = &data[from..to];
        let at = offset + from as u64;
        for (i, piece) in changed.chunks(self.write_piece).enumerate() {
            let record = FsRecord::Write {
                ino,
                offset: at + (i * self.write_piece) as u64,
                data: ByteBuf::from(piece.to_vec()),
                time,
            };
            self.log_record(&mut state, record)?;
        }
        Ok(data.len() as u32)
    }

    /// The part of a write of `data` at `offset` that changes the file (`size` bytes long now):
    /// the bytes up to the first one that differs from the file's, and those after the last
    /// that does, change nothing and are not logged. A database rewrites the page its log ends
    /// in at every commit (PostgreSQL writes the whole 8 KiB WAL page again for a few hundred
    /// new bytes); logging only the new bytes keeps the log, its flushes and the materialiser's
    /// copies to what changed. Bytes beyond the end of the file are always logged (they
    /// extend it), and writes over more than [`DIFF_LIMIT`] existing bytes are logged whole
    /// rather than read back under the lock.
    fn window_to_log(
        &self,
        state: &State,
        ino: u64,
        size: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<(usize, usize), Errno> {
        let existing = size.saturating_sub(offset).min(data.len() as u64) as usize;
        if existing == 0 || existing > DIFF_LIMIT {
            return Ok((0, data.len()));
        }
        let mut current = vec![0u8; existing];
        if let Err(e) = self.backing.read_at(ino, offset, &mut current) {
            tracing::error!("stela mount: reading backing file of inode {ino}: {e}");
            return Err(Errno::EIO);
        }
        let end = offset + existing as u64;
        overlay_onto(
            &mut current,
            offset,
            &state.overlay.touching(ino, offset, end),
        );
        Ok(changed_window(data, &current))
    }

    fn sync(&self, ino: u64) -> Result<(), Errno> {
        let lsn = {
            let state = self.lock()?;
            if state.tree.get(ino).is_none() {
                return Err(Errno::ENOENT);
            }
            state.last_lsn.get(&ino).copied().unwrap_or(0)
        };
        self.wait_for(lsn)
    }
}

/// Applies a record the log assigned `lsn` to the mount's memory: the tree, the overlay and
/// the inodes' last LSNs.
fn apply_logged(state: &mut State, lsn: u64, record: FsRecord) -> Result<(), Inconsistent> {
    let tree = &state.tree;
    let mut touched: Vec<u64> = Vec::with_capacity(4);
    match &record {
        FsRecord::Make { parent, ino, .. } => touched.extend([*parent, *ino]),
        FsRecord::Write { ino, .. }
        | FsRecord::SetAttr { ino, .. }
        | FsRecord::Fallocate { ino, .. } => touched.push(*ino),
        FsRecord::Link { ino, parent, .. } => touched.extend([*ino, *parent]),
        FsRecord::Remove { parent, name, .. } => {
            touched.push(*parent);
            touched.extend(tree.lookup(*parent, name));
        }
        FsRecord::Rename {
            parent,
            name,
            new_parent,
            new_name,
            ..
        } => {
            touched.extend([*parent, *new_parent]);
            touched.extend(tree.lookup(*parent, name));
            touched.extend(tree.lookup(*new_parent, new_name));
        }
        FsRecord::Drop { .. } | FsRecord::Checkpoint { .. } => {}
    }
    state.tree.apply(lsn, &record)?;
    for ino in touched {
        state.last_lsn.insert(ino, lsn);
    }
    match record {
        FsRecord::Write {
            ino, offset, data, ..
        } => state.overlay.push(
            ino,
            lsn,
            Pending::Write {
                offset,
                data: Arc::new(data.into_vec()),
            },
        ),
        FsRecord::SetAttr {
            ino,
            size: Some(size),
            ..
        } => state.overlay.push(ino, lsn, Pending::Truncate { size }),
        FsRecord::Fallocate {
            ino,
            offset,
            length,
            mode,
            ..
        } if falloc::zeroes(mode) => state
            .overlay
            .push(ino, lsn, Pending::Zero { offset, length }),
        FsRecord::Drop { ino } => {
            state.overlay.drop_inode(ino);
            state.last_lsn.remove(&ino);
            state.open_files.remove(&ino);
        }
        _ => {}
    }
    Ok(())
}

/// Whether `node` may lose a name to an operation that expects a directory (`want_dir`: rmdir,
/// or a rename of a directory over it) or a non-directory (unlink, a rename of a file over it).
fn may_lose_its_name(want_dir: bool, node: &Node) -> Result<(), Errno> {
    match (want_dir, node.kind == Kind::Dir) {
        (true, false) => Err(Errno::ENOTDIR),
        (false, true) => Err(Errno::EISDIR),
        (true, true) if !node.entries.is_empty() => Err(Errno::ENOTEMPTY),
        _ => Ok(()),
    }
}
