//! The power-cut layer's file system as a pure state machine, without FUSE: two copies of one
//! tree of inodes, what the programs see (`live`: the page cache and the disk's write cache
//! together) and what a power cut leaves (`durable`: the platters). Every change goes to `live`
//! only; an fsync copies one file's data and attributes to `durable`; the namespace (names in
//! directories) reaches `durable` by the rule of the volume's [`Namespace`]. A cut replaces
//! `live` by `durable`, dropping what no durable name reaches.
//!
//! Invariants (asserted): the root (inode 1) is a directory in both copies; every name in a
//! live directory names a live inode; an inode leaves `live` only when no name and no open
//! handle holds it; a file's data never extends past its size (bytes past it read as zeros).

use fuser::Errno;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

pub const ROOT: u64 = 1;
/// File data is held in pieces of this size, shared between the two copies until written
/// (an fsync of a large file copies the piece table, not the bytes).
const CHUNK: u64 = 64 * 1024;

/// When a change of names (create, rename, unlink, mkdir, ...) survives a cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    /// POSIX's letter: only an fsync of the directory makes its names durable (as they are at
    /// that moment); an fsync of a file makes its data and attributes durable, not its name.
    Strict,
    /// A journaling file system's ordering (ext4, XFS): any fsync, of a file or a directory,
    /// also makes every change of names made before it durable, since they sit in the one
    /// journal transaction the fsync commits. File data still survives only its own fsync.
    Journaled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Socket,
    Fifo,
}

/// Inode attributes (the size lives with the data).
#[derive(Clone, Debug)]
pub struct Meta {
    pub kind: Kind,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

/// A file's bytes: pieces by index (a missing piece reads as zeros) and the size.
#[derive(Clone, Debug, Default)]
pub struct Data {
    chunks: BTreeMap<u64, Arc<Vec<u8>>>,
    size: u64,
}

impl Data {
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Up to `len` bytes at `offset`, stopping at the size.
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let end = (offset + len as u64).min(self.size);
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut at = offset;
        while at < end {
            let (index, within) = (at / CHUNK, (at % CHUNK) as usize);
            let n = ((CHUNK - within as u64).min(end - at)) as usize;
            match self.chunks.get(&index) {
                Some(chunk) => out.extend_from_slice(&chunk[within..within + n]),
                None => out.resize(out.len() + n, 0),
            }
            at += n as u64;
        }
        out
    }

    pub fn write(&mut self, offset: u64, bytes: &[u8]) {
        let mut done = 0usize;
        while done < bytes.len() {
            let at = offset + done as u64;
            let (index, within) = (at / CHUNK, (at % CHUNK) as usize);
            let n = (CHUNK as usize - within).min(bytes.len() - done);
            let chunk = self
                .chunks
                .entry(index)
                .or_insert_with(|| Arc::new(vec![0; CHUNK as usize]));
            Arc::make_mut(chunk)[within..within + n].copy_from_slice(&bytes[done..done + n]);
            done += n;
        }
        self.size = self.size.max(offset + bytes.len() as u64);
    }

    /// Sets the size; bytes cut off are forgotten, so a later extension reads zeros.
    pub fn set_size(&mut self, size: u64) {
        if size < self.size {
            let first_gone = size.div_ceil(CHUNK);
            self.chunks.retain(|&index, _| index < first_gone);
            if !size.is_multiple_of(CHUNK) {
                if let Some(chunk) = self.chunks.get_mut(&(size / CHUNK)) {
                    Arc::make_mut(chunk)[(size % CHUNK) as usize..].fill(0);
                }
            }
        }
        self.size = size;
    }
}

#[derive(Clone, Debug)]
pub enum Body {
    File(Data),
    Dir(BTreeMap<OsString, u64>),
    Symlink(PathBuf),
    Special,
}

#[derive(Clone, Debug)]
pub struct Node {
    pub meta: Meta,
    pub body: Body,
}

impl Node {
    pub fn size(&self) -> u64 {
        match &self.body {
            Body::File(data) => data.size(),
            Body::Dir(entries) => entries.len() as u64,
            Body::Symlink(target) => target.as_os_str().len() as u64,
            Body::Special => 0,
        }
    }

    /// The same inode as a durable name first finds it: its attributes, no data yet.
    fn as_created(&self) -> Node {
        let body = match &self.body {
            Body::File(_) => Body::File(Data::default()),
            Body::Dir(_) => Body::Dir(BTreeMap::new()),
            other => other.clone(),
        };
        Node {
            meta: self.meta.clone(),
            body,
        }
    }
}

/// Attributes a caller asks to change (`setattr`).
#[derive(Clone, Debug, Default)]
pub struct Change {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SystemTime>,
    pub mtime: Option<SystemTime>,
}

/// What a cut threw away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Bytes written to files since their last fsync (counted per write; a byte written twice
    /// counts twice).
    pub unsynced_bytes: u64,
    /// Files written since their last fsync.
    pub unsynced_files: u64,
}

/// The two copies and the open handles.
pub struct Volume {
    namespace: Namespace,
    live: HashMap<u64, Node>,
    durable: HashMap<u64, Node>,
    /// Open handles per inode: an unlinked file stays readable and writable until closed.
    open: HashMap<u64, u32>,
    /// Bytes written per file since its last fsync (for the cut's report).
    unsynced: HashMap<u64, u64>,
    /// How many live names each inode has (the root's is not counted).
    names: HashMap<u64, u32>,
    next_ino: u64,
}

fn now() -> SystemTime {
    SystemTime::now()
}

impl Volume {
    /// An empty volume whose root directory belongs to `uid:gid` with `perm` (as mkfs leaves
    /// it: durable).
    pub fn new(namespace: Namespace, uid: u32, gid: u32, perm: u16) -> Volume {
        let root = Node {
            meta: Meta {
                kind: Kind::Dir,
                perm,
                uid,
                gid,
                rdev: 0,
                atime: now(),
                mtime: now(),
                ctime: now(),
            },
            body: Body::Dir(BTreeMap::new()),
        };
        Volume {
            namespace,
            live: HashMap::from([(ROOT, root.clone())]),
            durable: HashMap::from([(ROOT, root)]),
            open: HashMap::new(),
            unsynced: HashMap::new(),
            names: HashMap::new(),
            next_ino: ROOT + 1,
        }
    }

    pub fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.live.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.live.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn entries(&self, dir: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
        match &self.node(dir)?.body {
            Body::Dir(entries) => Ok(entries),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match &mut self.node_mut(dir)?.body {
            Body::Dir(entries) => Ok(entries),
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// How many names hold `ino` (a directory: 2 and one per subdirectory, as ext4 counts).
    pub fn nlink(&self, ino: u64) -> u32 {
        match self.live.get(&ino).map(|n| &n.body) {
            Some(Body::Dir(entries)) => {
                let subdirs = entries
                    .values()
                    .filter(|i| self.live.get(i).is_some_and(|n| n.meta.kind == Kind::Dir))
                    .count();
                2 + subdirs as u32
            }
            Some(_) => self.names.get(&ino).copied().unwrap_or(0),
            None => 0,
        }
    }

    fn add_name(&mut self, ino: u64) {
        *self.names.entry(ino).or_default() += 1;
    }

    fn drop_name(&mut self, ino: u64) {
        let count = self.names.get_mut(&ino).expect("a named inode has a count");
        *count -= 1;
        if *count == 0 {
            self.names.remove(&ino);
        }
        self.forget_if_unreachable(ino);
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.entries(parent)?
            .get(name)
            .copied()
            .ok_or(Errno::ENOENT)
    }

    /// Makes a new inode named `name` in `parent` (a file, directory, symlink, socket or fifo).
    pub fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        meta: Meta,
        body: Body,
    ) -> Result<u64, Errno> {
        if self.entries(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.live.insert(ino, Node { meta, body });
        self.entries_mut(parent)?.insert(name.to_owned(), ino);
        self.add_name(ino);
        self.touch(parent);
        Ok(ino)
    }

    /// Another name for the file `ino`.
    pub fn link(&mut self, ino: u64, parent: u64, name: &OsStr) -> Result<(), Errno> {
        if self.node(ino)?.meta.kind == Kind::Dir {
            return Err(Errno::EPERM);
        }
        if self.entries(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        self.entries_mut(parent)?.insert(name.to_owned(), ino);
        self.add_name(ino);
        self.touch(parent);
        Ok(())
    }

    /// Removes a name (`rmdir`: only of an empty directory; `unlink`: only of a non-directory).
    pub fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        let node = self.node(ino)?;
        match (&node.body, dir) {
            (Body::Dir(entries), true) if !entries.is_empty() => return Err(Errno::ENOTEMPTY),
            (Body::Dir(_), false) => return Err(Errno::EISDIR),
            (body, true) if !matches!(body, Body::Dir(_)) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        self.entries_mut(parent)?.remove(name);
        self.touch(parent);
        self.drop_name(ino);
        Ok(())
    }

    /// rename(2), with RENAME_NOREPLACE and RENAME_EXCHANGE.
    pub fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        noreplace: bool,
        exchange: bool,
    ) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        self.entries(new_parent)?;
        let replaced = self.entries(new_parent)?.get(new_name).copied();
        if exchange {
            let other = replaced.ok_or(Errno::ENOENT)?;
            self.entries_mut(parent)?.insert(name.to_owned(), other);
            self.entries_mut(new_parent)?
                .insert(new_name.to_owned(), ino);
        } else {
            if let Some(old) = replaced {
                if old == ino {
                    return Ok(());
                }
                if noreplace {
                    return Err(Errno::EEXIST);
                }
                let (moving, target) = (self.node(ino)?, self.node(old)?);
                match (&moving.body, &target.body) {
                    (Body::Dir(_), Body::Dir(entries)) if !entries.is_empty() => {
                        return Err(Errno::ENOTEMPTY)
                    }
                    (Body::Dir(_), Body::Dir(_)) => {}
                    (Body::Dir(_), _) => return Err(Errno::ENOTDIR),
                    (_, Body::Dir(_)) => return Err(Errno::EISDIR),
                    _ => {}
                }
            }
            self.entries_mut(parent)?.remove(name);
            self.entries_mut(new_parent)?
                .insert(new_name.to_owned(), ino);
            if let Some(old) = replaced {
                self.drop_name(old);
            }
        }
        self.touch(parent);
        self.touch(new_parent);
        Ok(())
    }

    pub fn open(&mut self, ino: u64) -> Result<(), Errno> {
        self.node(ino)?;
        *self.open.entry(ino).or_default() += 1;
        Ok(())
    }

    pub fn release(&mut self, ino: u64) {
        if let Some(count) = self.open.get_mut(&ino) {
            *count -= 1;
            if *count == 0 {
                self.open.remove(&ino);
            }
        }
        self.forget_if_unreachable(ino);
    }

    /// Drops a live inode that no name and no handle holds any more.
    fn forget_if_unreachable(&mut self, ino: u64) {
        if ino == ROOT || self.open.contains_key(&ino) || self.names.contains_key(&ino) {
            return;
        }
        self.live.remove(&ino);
        self.unsynced.remove(&ino);
    }

    fn touch(&mut self, ino: u64) {
        if let Some(node) = self.live.get_mut(&ino) {
            node.meta.mtime = now();
            node.meta.ctime = node.meta.mtime;
        }
    }

    pub fn read(&self, ino: u64, offset: u64, len: usize) -> Result<Vec<u8>, Errno> {
        match &self.node(ino)?.body {
            Body::File(data) => Ok(data.read(offset, len)),
            Body::Dir(_) => Err(Errno::EISDIR),
            _ => Err(Errno::EINVAL),
        }
    }

    pub fn write(&mut self, ino: u64, offset: u64, bytes: &[u8]) -> Result<(), Errno> {
        let node = self.node_mut(ino)?;
        let Body::File(data) = &mut node.body else {
            return Err(Errno::EINVAL);
        };
        data.write(offset, bytes);
        node.meta.mtime = now();
        *self.unsynced.entry(ino).or_default() += bytes.len() as u64;
        Ok(())
    }

    /// fallocate(2) mode 0 (extend the size; the space is "reserved", reading as zeros) or
    /// FALLOC_FL_KEEP_SIZE (nothing to do here); other modes are refused.
    pub fn allocate(&mut self, ino: u64, offset: u64, len: u64, mode: i32) -> Result<(), Errno> {
        let Body::File(data) = &mut self.node_mut(ino)?.body else {
            return Err(Errno::EINVAL);
        };
        match mode {
            0 => {
                if offset + len > data.size() {
                    data.set_size(offset + len);
                }
                Ok(())
            }
            libc::FALLOC_FL_KEEP_SIZE => Ok(()),
            _ => Err(Errno::EOPNOTSUPP),
        }
    }

    pub fn set_attr(&mut self, ino: u64, change: &Change) -> Result<(), Errno> {
        let node = self.node_mut(ino)?;
        if let Some(size) = change.size {
            let Body::File(data) = &mut node.body else {
                return Err(Errno::EISDIR);
            };
            data.set_size(size);
            node.meta.mtime = now();
        }
        let meta = &mut node.meta;
        meta.perm = change.perm.unwrap_or(meta.perm);
        meta.uid = change.uid.unwrap_or(meta.uid);
        meta.gid = change.gid.unwrap_or(meta.gid);
        meta.atime = change.atime.unwrap_or(meta.atime);
        meta.mtime = change.mtime.unwrap_or(meta.mtime);
        meta.ctime = now();
        if change.size.is_some() {
            self.unsynced.entry(ino).or_default();
        }
        Ok(())
    }

    /// fsync/fdatasync of a file (or a symlink, socket...): its data and attributes become
    /// durable; with a journaled namespace, every change of names so far too.
    pub fn sync_file(&mut self, ino: u64) -> Result<(), Errno> {
        let node = self.node(ino)?.clone();
        if let Body::Dir(_) = node.body {
            return self.sync_dir(ino);
        }
        self.durable.insert(ino, node);
        self.unsynced.remove(&ino);
        if self.namespace == Namespace::Journaled {
            self.commit_namespace();
        }
        Ok(())
    }

    /// fsync of a directory: its names (and attributes) become durable; an inode a durable
    /// name reaches for the first time exists after a cut with its attributes and no data.
    pub fn sync_dir(&mut self, ino: u64) -> Result<(), Errno> {
        self.entries(ino)?;
        match self.namespace {
            Namespace::Strict => self.commit_dir(ino),
            Namespace::Journaled => self.commit_namespace(),
        }
        Ok(())
    }

    fn commit_dir(&mut self, dir: u64) {
        let live = self.live[&dir].clone();
        let Body::Dir(entries) = &live.body else {
            unreachable!("commit_dir of a directory");
        };
        for child in entries.values() {
            if !self.durable.contains_key(child) {
                let created = self.live[child].as_created();
                self.durable.insert(*child, created);
            }
        }
        self.durable.insert(dir, live);
    }

    fn commit_namespace(&mut self) {
        let dirs: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, n)| n.meta.kind == Kind::Dir)
            .map(|(&i, _)| i)
            .collect();
        for dir in dirs {
            self.commit_dir(dir);
        }
    }

    /// The power cut: what the programs saw becomes what the durable copy holds, restricted
    /// to what a durable name reaches from the root. Open handles die with their processes.
    pub fn cut(&mut self) -> CutReport {
        let report = CutReport {
            unsynced_bytes: self.unsynced.values().sum(),
            unsynced_files: self.unsynced.len() as u64,
        };
        let mut reached = HashMap::new();
        let mut todo = vec![ROOT];
        while let Some(ino) = todo.pop() {
            if reached.contains_key(&ino) {
                continue;
            }
            let node = self.durable[&ino].clone();
            if let Body::Dir(entries) = &node.body {
                todo.extend(entries.values().copied());
            }
            reached.insert(ino, node);
        }
        self.durable.retain(|ino, _| reached.contains_key(ino));
        self.live = reached;
        self.names.clear();
        let named: Vec<u64> = self
            .live
            .values()
            .filter_map(|n| match &n.body {
                Body::Dir(entries) => Some(entries.values().copied()),
                _ => None,
            })
            .flatten()
            .collect();
        for ino in named {
            *self.names.entry(ino).or_default() += 1;
        }
        self.open.clear();
        self.unsynced.clear();
        debug_assert!(matches!(self.live[&ROOT].body, Body::Dir(_)));
        report
    }

    /// Every live directory's names name live inodes (checked by the tests after each step).
    pub fn check(&self) {
        for node in self.live.values() {
            if let Body::Dir(entries) = &node.body {
                for (name, ino) in entries {
                    assert!(
                        self.live.contains_key(ino),
                        "{name:?} names a gone inode {ino}"
                    );
                }
            }
        }
        for (ino, node) in &self.durable {
            if let Body::Dir(entries) = &node.body {
                for (name, child) in entries {
                    assert!(
                        self.durable.contains_key(child),
                        "durable {ino}: {name:?} names {child}, not durable"
                    );
                }
            }
        }
    }

    /// The live names in `dir`, sorted, with their inodes and kinds.
    pub fn list(&self, dir: u64) -> Result<Vec<(OsString, u64, Kind)>, Errno> {
        Ok(self
            .entries(dir)?
            .iter()
            .map(|(name, &ino)| (name.clone(), ino, self.live[&ino].meta.kind))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(kind: Kind) -> Meta {
        Meta {
            kind,
            perm: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            atime: now(),
            mtime: now(),
            ctime: now(),
        }
    }

    fn file(volume: &mut Volume, parent: u64, name: &str) -> u64 {
        let body = Body::File(Data::default());
        volume
            .create(parent, OsStr::new(name), meta(Kind::File), body)
            .unwrap()
    }

    #[test]
    fn data_across_pieces_reads_back_and_a_cut_off_tail_reads_as_zeros() {
        let mut data = Data::default();
        let bytes: Vec<u8> = (0..3 * CHUNK + 7).map(|i| (i % 251) as u8).collect();
        data.write(CHUNK - 3, &bytes);
        assert_eq!(data.read(CHUNK - 3, bytes.len()), bytes);
        assert_eq!(data.read(0, 4), vec![0; 4], "a hole reads as zeros");
        data.set_size(CHUNK + 1);
        data.set_size(4 * CHUNK);
        assert_eq!(data.read(CHUNK + 1, 10), vec![0; 10]);
        assert_eq!(data.read(CHUNK, 1), vec![bytes[3]]);
        assert!(data.read(4 * CHUNK, 10).is_empty(), "nothing past the size");
    }

    #[test]
    fn only_synced_data_and_names_of_synced_directories_outlive_a_cut() {
        let mut volume = Volume::new(Namespace::Strict, 0, 0, 0o755);
        let kept = file(&mut volume, ROOT, "kept");
        volume.write(kept, 0, b"synced").unwrap();
        volume.sync_file(kept).unwrap();
        volume.sync_dir(ROOT).unwrap();
        volume.write(kept, 0, b"SYNCED and more").unwrap();
        let unnamed = file(&mut volume, ROOT, "unnamed");
        volume.write(unnamed, 0, b"x").unwrap();
        volume.sync_file(unnamed).unwrap();
        volume.check();
        let report = volume.cut();
        volume.check();
        assert_eq!(report.unsynced_bytes, 15);
        assert_eq!(volume.read(kept, 0, 100).unwrap(), b"synced");
        assert_eq!(
            volume.lookup(ROOT, OsStr::new("unnamed")),
            Err(Errno::ENOENT)
        );
        assert!(
            volume.node(unnamed).is_err(),
            "an inode no durable name reaches is gone"
        );
    }

    #[test]
    fn a_journaled_namespace_keeps_every_change_of_names_before_any_fsync() {
        let mut volume = Volume::new(Namespace::Journaled, 0, 0, 0o755);
        let dir = volume
            .create(
                ROOT,
                OsStr::new("d"),
                meta(Kind::Dir),
                Body::Dir(BTreeMap::new()),
            )
            .unwrap();
        let a = file(&mut volume, dir, "a");
        volume.write(a, 0, b"data").unwrap();
        volume
            .rename(dir, OsStr::new("a"), ROOT, OsStr::new("b"), false, false)
            .unwrap();
        let other = file(&mut volume, ROOT, "other");
        volume.sync_file(other).unwrap();
        let late = file(&mut volume, ROOT, "late");
        volume.cut();
        volume.check();
        assert_eq!(volume.lookup(ROOT, OsStr::new("b")), Ok(a));
        assert_eq!(
            volume.read(a, 0, 10).unwrap(),
            b"",
            "its data was never synced"
        );
        assert_eq!(volume.lookup(ROOT, OsStr::new("late")), Err(Errno::ENOENT));
        assert!(volume.node(late).is_err());
    }

    #[test]
    fn attribute_changes_need_an_fsync_and_a_journal_commit_carries_a_directorys() {
        let chown = Change {
            uid: Some(70),
            ..Change::default()
        };
        let mut strict = Volume::new(Namespace::Strict, 0, 0, 0o755);
        let f = file(&mut strict, ROOT, "f");
        strict.sync_file(f).unwrap();
        strict.sync_dir(ROOT).unwrap();
        strict.set_attr(f, &chown).unwrap();
        strict.cut();
        assert_eq!(strict.node(f).unwrap().meta.uid, 0, "not synced");
        strict.set_attr(f, &chown).unwrap();
        strict.sync_file(f).unwrap();
        strict.cut();
        assert_eq!(strict.node(f).unwrap().meta.uid, 70);

        let mut journaled = Volume::new(Namespace::Journaled, 0, 0, 0o755);
        let dir = journaled
            .create(
                ROOT,
                OsStr::new("d"),
                meta(Kind::Dir),
                Body::Dir(BTreeMap::new()),
            )
            .unwrap();
        let f = file(&mut journaled, ROOT, "f");
        journaled.sync_file(f).unwrap();
        journaled.set_attr(dir, &chown).unwrap();
        journaled.sync_file(f).unwrap();
        journaled.cut();
        assert_eq!(journaled.node(dir).unwrap().meta.uid, 70);
    }

    #[test]
    fn an_unlinked_open_file_lives_until_released_and_a_replaced_name_drops_its_inode() {
        let mut volume = Volume::new(Namespace::Strict, 0, 0, 0o755);
        let a = file(&mut volume, ROOT, "a");
        volume.open(a).unwrap();
        volume.remove(ROOT, OsStr::new("a"), false).unwrap();
        volume.write(a, 0, b"still open").unwrap();
        assert_eq!(volume.nlink(a), 0);
        volume.release(a);
        assert!(volume.node(a).is_err());
        let b = file(&mut volume, ROOT, "b");
        let c = file(&mut volume, ROOT, "c");
        volume
            .rename(ROOT, OsStr::new("b"), ROOT, OsStr::new("c"), false, false)
            .unwrap();
        assert!(volume.node(c).is_err());
        assert_eq!(volume.lookup(ROOT, OsStr::new("c")), Ok(b));
        volume.check();
    }
}
