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
use crate::tree::{Node, Tree};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use serde_bytes::ByteBuf;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use stela_client::{Durability, Lsn, Wal};

/// How long the kernel may cache names and attributes: the mount is the only writer, and the
/// kernel updates its own copy on the writes it forwards.
const TTL: Duration = Duration::from_secs(1);
const NAME_MAX: usize = 255;

/// Data logged but not yet (known to be) in the backing file.
#[derive(Clone, Debug)]
pub enum Pending {
    Write { offset: u64, data: Arc<Vec<u8>> },
    Truncate { size: u64 },
    Zero { offset: u64, length: u64 },
}

#[derive(Default)]
struct Overlay {
    /// Per inode, in LSN order.
    records: HashMap<u64, Vec<(u64, Pending)>>,
    bytes: u64,
}

impl Overlay {
    fn push(&mut self, ino: u64, lsn: u64, pending: Pending) {
        if let Pending::Write { data, .. } = &pending {
            self.bytes += data.len() as u64;
        }
        self.records.entry(ino).or_default().push((lsn, pending));
    }

    fn drop_inode(&mut self, ino: u64) {
        if let Some(list) = self.records.remove(&ino) {
            self.bytes -= weight(&list);
        }
    }

    /// The inode's records that may change bytes in `offset..end`, in LSN order (truncations
    /// and zeroed ranges always, since they may cut below `offset`).
    fn touching(&self, ino: u64, offset: u64, end: u64) -> Vec<Pending> {
        self.records
            .get(&ino)
            .map(|list| {
                list.iter()
                    .filter(|(_, p)| match p {
                        Pending::Write { offset: at, data } => {
                            *at < end && at + data.len() as u64 > offset
                        }
                        _ => true,
                    })
                    .map(|(_, p)| p.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn prune(&mut self, applied: u64) {
        let mut freed = 0;
        self.records.retain(|_, list| {
            let before = weight(list);
            list.retain(|(lsn, _)| *lsn > applied);
            freed += before - weight(list);
            !list.is_empty()
        });
        self.bytes -= freed;
    }
}

fn weight(list: &[(u64, Pending)]) -> u64 {
    list.iter()
        .map(|(_, p)| match p {
            Pending::Write { data, .. } => data.len() as u64,
            _ => 0,
        })
        .sum()
}

/// The most existing bytes a write is compared with before it is logged.
const DIFF_LIMIT: usize = 64 << 10;

/// `from..to`: the part of `data` to log, given `current`, the file's bytes under the first
/// `current.len()` bytes of `data` (the rest of `data` extends the file). Everything before
/// `from` and from `to` on equals `current`; `from == to` when nothing differs.
fn changed_window(data: &[u8], current: &[u8]) -> (usize, usize) {
    let existing = current.len().min(data.len());
    let from = data[..existing]
        .iter()
        .zip(current)
        .position(|(new, old)| new != old)
        .unwrap_or(existing);
    if existing < data.len() {
        return (from, data.len());
    }
    if from == existing {
        return (existing, existing);
    }
    let to = data[..existing]
        .iter()
        .zip(current)
        .rposition(|(new, old)| new != old)
        .map_or(from, |last| last + 1);
    (from, to)
}

/// Applies overlay records to `buf`, which holds the file's bytes from `offset`.
pub fn overlay_onto(buf: &mut [u8], offset: u64, records: &[Pending]) {
    let end = offset + buf.len() as u64;
    let zero = |buf: &mut [u8], from: u64, to: u64| {
        let (from, to) = (from.max(offset), to.min(end));
        if from < to {
            buf[(from - offset) as usize..(to - offset) as usize].fill(0);
        }
    };
    for record in records {
        match record {
            Pending::Write { offset: at, data } => {
                let (from, to) = ((*at).max(offset), (at + data.len() as u64).min(end));
                if from < to {
                    buf[(from - offset) as usize..(to - offset) as usize]
                        .copy_from_slice(&data[(from - at) as usize..(to - at) as usize]);
                }
            }
            Pending::Truncate { size } => zero(buf, *size, u64::MAX),
            Pending::Zero { offset: at, length } => zero(buf, *at, at + length),
        }
    }
}

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
    match time {
        TimeOrNow::Now => Time::now(),
        TimeOrNow::SpecificTime(time) => Time::from(time),
    }
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
    ) -> Result<StelaFs, String> {
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
                .map_err(|e| format!("replaying log record {lsn}: {e}"))?;
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
                .map_err(|_| state.failed.clone().unwrap_or_default())?;
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

    fn entry(&self, state: &State, ino: u64, reply: ReplyEntry) {
        match state.tree.get(ino) {
            Some(node) => reply.entry(&TTL, &attr_of(ino, node), Generation(0)),
            None => reply.error(Errno::ENOENT),
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
fn apply_logged(state: &mut State, lsn: u64, record: FsRecord) -> Result<(), String> {
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
    state.tree.apply(lsn, &record).map_err(|e| e.to_string())?;
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

/// Answers a request that returns nothing but success or an errno.
fn answer(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// Answers a request that returns a new or linked entry.
fn answer_entry(reply: ReplyEntry, result: Result<FileAttr, Errno>) {
    match result {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for StelaFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        // Bigger writes mean fewer records; the daemon's record limit is far above this.
        let _ = config.set_max_write(1 << 20);
        if self.settings.writeback_cache {
            if let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_WRITEBACK_CACHE) {
                tracing::warn!("stela mount: the kernel offers no writeback cache ({missing:?})");
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let state = match self.lock() {
            Ok(state) => state,
            Err(e) => return reply.error(e),
        };
        match state.tree.lookup(parent.0, name.as_bytes()) {
            Some(ino) => self.entry(&state, ino, reply),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lock() {
            Ok(state) => match state.tree.get(ino.0) {
                Some(node) => reply.attr(&TTL, &attr_of(ino.0, node)),
                None => reply.error(Errno::ENOENT),
            },
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = (|| {
            let mut state = self.lock()?;
            let node = state.tree.get(ino.0).ok_or(Errno::ENOENT)?;
            if size.is_some() && node.kind != Kind::File {
                return Err(if node.kind == Kind::Dir {
                    Errno::EISDIR
                } else {
                    Errno::EINVAL
                });
            }
            let changes = mode.is_some()
                || uid.is_some()
                || gid.is_some()
                || size.is_some()
                || atime.is_some()
                || mtime.is_some();
            if changes {
                let record = FsRecord::SetAttr {
                    ino: ino.0,
                    mode: mode.map(|m| m & 0o7777),
                    uid,
                    gid,
                    size,
                    atime: atime.map(time_of),
                    mtime: mtime.map(time_of),
                    time: Time::now(),
                };
                self.log_record(&mut state, record)?;
            }
            let node = state.tree.get(ino.0).ok_or(Errno::ENOENT)?;
            Ok(attr_of(ino.0, node))
        })();
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.lock() {
            Ok(state) => match state.tree.get(ino.0) {
                Some(node) if node.kind == Kind::Symlink => reply.data(&node.target),
                Some(_) => reply.error(Errno::EINVAL),
                None => reply.error(Errno::ENOENT),
            },
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => Kind::File,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDevice,
            libc::S_IFBLK => Kind::BlockDevice,
            _ => return reply.error(Errno::EINVAL),
        };
        answer_entry(
            reply,
            self.make(req, parent.0, name, kind, mode, rdev, &[])
                .map(|(_, attr)| attr),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        answer_entry(
            reply,
            self.make(req, parent.0, name, Kind::Dir, mode, 0, &[])
                .map(|(_, attr)| attr),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer(reply, self.remove(parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer(reply, self.remove(parent.0, name, true));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let target = target.as_os_str().as_bytes();
        answer_entry(
            reply,
            self.make(req, parent.0, link_name, Kind::Symlink, 0o777, 0, target)
                .map(|(_, attr)| attr),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        answer(
            reply,
            self.do_rename(parent.0, name, newparent.0, newname, flags),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let result = (|| {
            let name = name_of(newname)?;
            let mut state = self.lock()?;
            let node = state.tree.get(ino.0).ok_or(Errno::ENOENT)?;
            if node.kind == Kind::Dir {
                return Err(Errno::EPERM);
            }
            Self::check_new_name(&state, newparent.0, &name)?;
            let record = FsRecord::Link {
                ino: ino.0,
                parent: newparent.0,
                name,
                time: Time::now(),
            };
            self.log_record(&mut state, record)?;
            Ok(attr_of(ino.0, state.tree.get(ino.0).expect("linked")))
        })();
        answer_entry(reply, result);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(ino.0) {
            // The kernel's cached pages stay valid across opens: every change to a file goes
            // through this mount, and the kernel updates its cache on the writes it forwards.
            Ok(fh) => reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.read_file(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.write_file(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is buffered here: every write was logged before it was answered.
        match self.lock() {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            let mut state = self.lock()?;
            if let Some(count) = state.open_files.get_mut(&ino.0) {
                *count -= 1;
                if *count == 0 {
                    state.open_files.remove(&ino.0);
                }
            }
            self.drop_if_gone(&mut state, ino.0)
        })();
        answer(reply, result);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        answer(reply, self.sync(ino.0));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let state = match self.lock() {
            Ok(state) => state,
            Err(e) => return reply.error(e),
        };
        let Some(dir) = state.tree.get(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if dir.kind != Kind::Dir {
            return reply.error(Errno::ENOTDIR);
        }
        let dots = [
            (ino.0, FileType::Directory, OsStr::new(".")),
            (dir.parent, FileType::Directory, OsStr::new("..")),
        ];
        let entries = dots
            .into_iter()
            .chain(dir.entries.iter().map(|(name, child)| {
                let kind = state
                    .tree
                    .get(*child)
                    .map_or(FileType::RegularFile, |n| kind_type(n.kind));
                (*child, kind, OsStr::from_bytes(name))
            }));
        for (i, (child, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        answer(reply, self.sync(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let dir = std::ffi::CString::new(self.backing.dir().as_os_str().as_bytes())
            .expect("a path has no NUL");
        // SAFETY: statvfs writes only into the zeroed struct we pass; the path is NUL-terminated.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::statvfs(dir.as_ptr(), &mut stat) };
        if rc != 0 {
            return reply.error(Errno::EIO);
        }
        reply.statfs(
            stat.f_blocks,
            stat.f_bfree,
            stat.f_bavail,
            stat.f_files,
            stat.f_ffree,
            stat.f_bsize as u32,
            NAME_MAX as u32,
            stat.f_frsize as u32,
        );
    }

    // Extended attributes are not kept. getxattr answers ENOSYS on purpose (unlike fsync):
    // the kernel then stops asking, where an ENODATA would cost a round trip to this process
    // before every write (the kernel checks "security.capability" to clear it on write).
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permission bits are checked by the kernel (default_permissions); this only says
        // whether the inode exists.
        match self.lock() {
            Ok(state) if state.tree.get(ino.0).is_some() => reply.ok(),
            Ok(_) => reply.error(Errno::ENOENT),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let result = self
            .make(req, parent.0, name, Kind::File, mode, 0, &[])
            .and_then(|(ino, attr)| Ok((self.open_file(ino)?, attr)));
        match result {
            Ok((fh, attr)) => {
                reply.created(&TTL, &attr, Generation(0), fh, FopenFlags::FOPEN_KEEP_CACHE)
            }
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            if !falloc::supported(mode) {
                return Err(Errno::EOPNOTSUPP);
            }
            let mut state = self.lock()?;
            let node = state.tree.get(ino.0).ok_or(Errno::ENOENT)?;
            if node.kind != Kind::File {
                return Err(Errno::ENODEV);
            }
            let record = FsRecord::Fallocate {
                ino: ino.0,
                offset,
                length,
                mode,
                time: Time::now(),
            };
            self.log_record(&mut state, record).map(|_| ())
        })();
        answer(reply, result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overlay_applies_writes_truncates_and_holes_in_order() {
        // The backing file holds "abcdefgh"; then: write "XY" at 2, truncate to 3, write "Z"
        // at 6, punch 0..1.
        let records = [
            Pending::Write {
                offset: 2,
                data: Arc::new(b"XY".to_vec()),
            },
            Pending::Truncate { size: 3 },
            Pending::Write {
                offset: 6,
                data: Arc::new(b"Z".to_vec()),
            },
            Pending::Zero {
                offset: 0,
                length: 1,
            },
        ];
        let mut buf = b"abcdefg".to_vec();
        overlay_onto(&mut buf, 0, &records);
        assert_eq!(&buf, b"\0bX\0\0\0Z");
        // The same from offset 2, and again on bytes that already hold the result.
        let mut window = b"cdefg".to_vec();
        overlay_onto(&mut window, 2, &records);
        assert_eq!(&window, b"X\0\0\0Z");
        let mut again = buf.clone();
        overlay_onto(&mut again, 0, &records);
        assert_eq!(again, buf);
    }
}

#[cfg(test)]
mod changed_window_tests {
    use super::changed_window;
    use proptest::prelude::*;

    #[test]
    fn only_the_bytes_that_differ_are_kept() {
        // A page rewritten with two new bytes in the middle.
        assert_eq!(changed_window(b"abXYef", b"abcdef"), (2, 4));
        // Nothing new: an empty window.
        assert_eq!(changed_window(b"abcdef", b"abcdef"), (6, 6));
        // A write that extends the file keeps everything from its first change to its end.
        assert_eq!(changed_window(b"abcdXY", b"abcd"), (4, 6));
        assert_eq!(changed_window(b"aXcdef", b"abcd"), (1, 6));
        // Nothing of the file under it: all of it.
        assert_eq!(changed_window(b"abc", b""), (0, 3));
    }

    fn apply(file: &[u8], offset: usize, data: &[u8]) -> Vec<u8> {
        let mut out = file.to_vec();
        if out.len() < offset + data.len() {
            out.resize(offset + data.len(), 0);
        }
        out[offset..offset + data.len()].copy_from_slice(data);
        out
    }

    proptest! {
        /// Logging only the window leaves the file exactly as the whole write would, size
        /// included: the property the mount relies on when it trims a write.
        #[test]
        fn the_window_writes_what_the_whole_write_would(
            file in proptest::collection::vec(0u8..3, 0..64),
            offset in 0usize..80,
            data in proptest::collection::vec(0u8..3, 1..48),
        ) {
            let existing = file.len().saturating_sub(offset).min(data.len());
            let current = if existing > 0 { &file[offset..offset + existing] } else { &[][..] };
            let (from, to) = changed_window(&data, current);
            prop_assert!(from <= to && to <= data.len());
            let whole = apply(&file, offset, &data);
            // A write past the end leaves a hole of zeros, as the tree and the files do.
            let trimmed = if from == to {
                let mut out = file.clone();
                if out.len() < offset { out.resize(offset, 0); }
                out
            } else {
                let mut out = file.clone();
                if out.len() < offset { out.resize(offset, 0); }
                apply(&out, offset + from, &data[from..to])
            };
            prop_assert_eq!(trimmed, whole);
        }
    }
}
