//! The file system's names and attributes (everything but file contents), and the one function
//! that applies a logged record to them.
//!
//! Owns: the inode table, directory entries, attributes, and its snapshot encoding. Invariants:
//! - [`Tree::apply`] is deterministic: the same tree and record give the same tree. The mount,
//!   the materialiser and a restart each keep their own `Tree` and replay the same records, so
//!   they agree without sharing memory.
//! - `apply` refuses (with [`Inconsistent`]) a record that does not fit the tree rather than
//!   guessing, and never panics on one, whatever its fields: a log that does not replay is
//!   reported. The tree may then be partly changed, so every caller stops using it (the mount
//!   and the materialiser fail stop). The mount checks every request against its tree before
//!   logging, so its own records always fit.
//! - Inode 1 is the root and is never removed. Inode numbers are never reused (`next_ino`
//!   only grows), so a late record cannot land on a new file.

use crate::record::{falloc, FsRecord, Kind, Time};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::collections::BTreeMap;

pub const ROOT: u64 = 1;

/// One inode's attributes and, for a directory, its entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub kind: Kind,
    /// Permission bits (low 12 bits of st_mode).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    /// A directory's entries, by name.
    pub entries: BTreeMap<ByteBuf, u64>,
    /// A directory's parent (the root is its own).
    pub parent: u64,
    /// A symlink's target.
    pub target: ByteBuf,
}

/// A record that does not fit the tree it is applied to.
#[derive(Debug, thiserror::Error)]
#[error("record does not fit the file tree: {0}")]
pub struct Inconsistent(pub String);

/// A backing snapshot that cannot be read back (the mount refuses it rather than start empty).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a stela mount snapshot (bad magic)")]
    BadMagic,
    #[error("snapshot checksum mismatch")]
    Checksum,
    #[error("snapshot does not decode: {0}")]
    Body(#[source] rmp_serde::decode::Error),
}

/// The names and attributes of the whole file system, as of `applied`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tree {
    /// The LSN of the last record applied (0: none).
    pub applied: u64,
    pub next_ino: u64,
    pub nodes: BTreeMap<u64, Node>,
}

const SNAPSHOT_MAGIC: &[u8; 8] = b"STELAFS1";

impl Tree {
    /// An empty file system: a root directory owned by `uid`/`gid`, mode 0755.
    pub fn new(uid: u32, gid: u32) -> Tree {
        let now = Time::now();
        let root = Node {
            kind: Kind::Dir,
            mode: 0o755,
            uid,
            gid,
            rdev: 0,
            size: 0,
            nlink: 2,
            atime: now,
            mtime: now,
            ctime: now,
            entries: BTreeMap::new(),
            parent: ROOT,
            target: ByteBuf::new(),
        };
        Tree {
            applied: 0,
            next_ino: ROOT + 1,
            nodes: BTreeMap::from([(ROOT, root)]),
        }
    }

    pub fn get(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(&ino)
    }

    /// The inode `name` names in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Option<u64> {
        self.nodes
            .get(&parent)?
            .entries
            .get(serde_bytes::Bytes::new(name))
            .copied()
    }

    /// Whether `ino` is `ancestor` or lies below it (a directory may not move into itself).
    pub fn is_within(&self, mut ino: u64, ancestor: u64) -> bool {
        loop {
            if ino == ancestor {
                return true;
            }
            match self.nodes.get(&ino) {
                Some(node) if node.kind == Kind::Dir && node.parent != ino => ino = node.parent,
                _ => return false,
            }
        }
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Inconsistent> {
        self.nodes
            .get_mut(&ino)
            .ok_or_else(|| Inconsistent(format!("no inode {ino}")))
    }

    fn dir_mut(&mut self, ino: u64) -> Result<&mut Node, Inconsistent> {
        let node = self.node_mut(ino)?;
        if node.kind != Kind::Dir {
            return Err(Inconsistent(format!("inode {ino} is not a directory")));
        }
        Ok(node)
    }

    /// Takes one name away from `ino` (unlink, rmdir, or replaced by a rename).
    fn unname(&mut self, ino: u64, parent: u64, time: Time) -> Result<(), Inconsistent> {
        let node = self.node_mut(ino)?;
        node.ctime = time;
        if node.kind == Kind::Dir {
            if !node.entries.is_empty() {
                return Err(Inconsistent(format!("directory {ino} is not empty")));
            }
            node.nlink = 0;
            let dir = self.dir_mut(parent)?;
            dir.nlink = dir.nlink.saturating_sub(1);
        } else {
            node.nlink = node.nlink.saturating_sub(1);
        }
        Ok(())
    }

    /// Applies the record logged at `lsn`. Records at or below `applied` were applied already
    /// and are skipped, so a replay may start anywhere before the tree's own point.
    pub fn apply(&mut self, lsn: u64, record: &FsRecord) -> Result<(), Inconsistent> {
        if lsn <= self.applied {
            return Ok(());
        }
        self.apply_unchecked(record)?;
        self.applied = lsn;
        Ok(())
    }

    fn apply_unchecked(&mut self, record: &FsRecord) -> Result<(), Inconsistent> {
        match record {
            FsRecord::Make {
                parent,
                name,
                ino,
                kind,
                mode,
                uid,
                gid,
                rdev,
                target,
                time,
            } => {
                if self.nodes.contains_key(ino) || *ino < self.next_ino {
                    return Err(Inconsistent(format!("inode {ino} made twice")));
                }
                let dir = self.dir_mut(*parent)?;
                if dir.entries.contains_key(name) {
                    return Err(Inconsistent(format!(
                        "{:?} exists in {parent}",
                        String::from_utf8_lossy(name)
                    )));
                }
                dir.entries.insert(name.clone(), *ino);
                dir.mtime = *time;
                dir.ctime = *time;
                if *kind == Kind::Dir {
                    dir.nlink = dir.nlink.saturating_add(1);
                }
                self.nodes.insert(
                    *ino,
                    Node {
                        kind: *kind,
                        mode: *mode & 0o7777,
                        uid: *uid,
                        gid: *gid,
                        rdev: *rdev,
                        size: if *kind == Kind::Symlink {
                            target.len() as u64
                        } else {
                            0
                        },
                        nlink: if *kind == Kind::Dir { 2 } else { 1 },
                        atime: *time,
                        mtime: *time,
                        ctime: *time,
                        entries: BTreeMap::new(),
                        parent: *parent,
                        target: target.clone(),
                    },
                );
                self.next_ino = ino.saturating_add(1);
            }
            FsRecord::Write {
                ino,
                offset,
                data,
                time,
            } => {
                let node = self.node_mut(*ino)?;
                if !data.is_empty() {
                    let end = offset.checked_add(data.len() as u64).ok_or_else(|| {
                        Inconsistent(format!("a write past the largest offset on inode {ino}"))
                    })?;
                    node.size = node.size.max(end);
                }
                node.mtime = *time;
                node.ctime = *time;
            }
            FsRecord::SetAttr {
                ino,
                mode,
                uid,
                gid,
                size,
                atime,
                mtime,
                time,
            } => {
                let node = self.node_mut(*ino)?;
                if let Some(mode) = mode {
                    node.mode = mode & 0o7777;
                }
                if let Some(uid) = uid {
                    node.uid = *uid;
                }
                if let Some(gid) = gid {
                    node.gid = *gid;
                }
                if let Some(size) = size {
                    node.size = *size;
                    node.mtime = *time;
                }
                if let Some(atime) = atime {
                    node.atime = *atime;
                }
                if let Some(mtime) = mtime {
                    node.mtime = *mtime;
                }
                node.ctime = *time;
            }
            FsRecord::Fallocate {
                ino,
                offset,
                length,
                mode,
                time,
            } => {
                let node = self.node_mut(*ino)?;
                if mode & falloc::KEEP_SIZE == 0 {
                    let end = offset.checked_add(*length).ok_or_else(|| {
                        Inconsistent(format!(
                            "an allocation past the largest offset on inode {ino}"
                        ))
                    })?;
                    node.size = node.size.max(end);
                }
                node.mtime = *time;
                node.ctime = *time;
            }
            FsRecord::Link {
                ino,
                parent,
                name,
                time,
            } => {
                let dir = self.dir_mut(*parent)?;
                if dir.entries.insert(name.clone(), *ino).is_some() {
                    return Err(Inconsistent(format!(
                        "link over an existing name in {parent}"
                    )));
                }
                dir.mtime = *time;
                dir.ctime = *time;
                let node = self.node_mut(*ino)?;
                node.nlink = node.nlink.saturating_add(1);
                node.ctime = *time;
            }
            FsRecord::Remove { parent, name, time } => {
                let dir = self.dir_mut(*parent)?;
                let Some(ino) = dir.entries.remove(name) else {
                    return Err(Inconsistent(format!("no {name:?} in {parent}")));
                };
                dir.mtime = *time;
                dir.ctime = *time;
                self.unname(ino, *parent, *time)?;
            }
            FsRecord::Rename {
                parent,
                name,
                new_parent,
                new_name,
                exchange,
                time,
            } => self.rename(*parent, name, *new_parent, new_name, *exchange, *time)?,
            FsRecord::Drop { ino } => {
                if *ino == ROOT {
                    return Err(Inconsistent("the root dropped".to_owned()));
                }
                self.nodes.remove(ino);
            }
            FsRecord::Checkpoint { .. } => {}
        }
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &ByteBuf,
        new_parent: u64,
        new_name: &ByteBuf,
        exchange: bool,
        time: Time,
    ) -> Result<(), Inconsistent> {
        let moved = self
            .lookup(parent, name)
            .ok_or_else(|| Inconsistent(format!("rename of a missing name in {parent}")))?;
        let replaced = self.lookup(new_parent, new_name);
        if replaced == Some(moved) {
            return Ok(());
        }
        if exchange {
            let other =
                replaced.ok_or_else(|| Inconsistent("exchange with a missing name".to_owned()))?;
            self.dir_mut(parent)?.entries.insert(name.clone(), other);
            self.dir_mut(new_parent)?
                .entries
                .insert(new_name.clone(), moved);
            self.reparent(moved, parent, new_parent)?;
            self.reparent(other, new_parent, parent)?;
        } else {
            if let Some(replaced) = replaced {
                self.dir_mut(new_parent)?.entries.remove(new_name);
                self.unname(replaced, new_parent, time)?;
            }
            self.dir_mut(parent)?.entries.remove(name);
            self.dir_mut(new_parent)?
                .entries
                .insert(new_name.clone(), moved);
            self.reparent(moved, parent, new_parent)?;
        }
        for dir in [parent, new_parent] {
            let dir = self.dir_mut(dir)?;
            dir.mtime = time;
            dir.ctime = time;
        }
        self.node_mut(moved)?.ctime = time;
        Ok(())
    }

    /// A directory moved from `from` to `to` changes its `..` and both parents' link counts.
    fn reparent(&mut self, ino: u64, from: u64, to: u64) -> Result<(), Inconsistent> {
        if from == to || self.node_mut(ino)?.kind != Kind::Dir {
            return Ok(());
        }
        self.node_mut(ino)?.parent = to;
        let from = self.dir_mut(from)?;
        from.nlink = from.nlink.saturating_sub(1);
        let to = self.dir_mut(to)?;
        to.nlink = to.nlink.saturating_add(1);
        Ok(())
    }

    /// The snapshot's bytes: magic, CRC32C of the body, body (MessagePack).
    pub fn encode(&self) -> Vec<u8> {
        let body = rmp_serde::to_vec(self).expect("a tree always encodes");
        let mut out = Vec::with_capacity(body.len() + 12);
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Reads a snapshot written by [`Tree::encode`]; a wrong magic, a CRC mismatch or a body
    /// that does not decode is an error naming which.
    pub fn decode(bytes: &[u8]) -> Result<Tree, SnapshotError> {
        if bytes.len() < 12 || &bytes[..8] != SNAPSHOT_MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let crc = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        let body = &bytes[12..];
        if crc32c::crc32c(body) != crc {
            return Err(SnapshotError::Checksum);
        }
        rmp_serde::from_slice(body).map_err(SnapshotError::Body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name(text: &str) -> ByteBuf {
        ByteBuf::from(text.as_bytes().to_vec())
    }

    fn make(parent: u64, text: &str, ino: u64, kind: Kind) -> FsRecord {
        FsRecord::Make {
            parent,
            name: name(text),
            ino,
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            target: ByteBuf::new(),
            time: Time::default(),
        }
    }

    #[test]
    fn link_counts_follow_directories_and_hard_links() {
        let mut tree = Tree::new(0, 0);
        tree.apply(1, &make(ROOT, "d", 2, Kind::Dir)).unwrap();
        tree.apply(2, &make(2, "f", 3, Kind::File)).unwrap();
        tree.apply(
            3,
            &FsRecord::Link {
                ino: 3,
                parent: ROOT,
                name: name("g"),
                time: Time::default(),
            },
        )
        .unwrap();
        assert_eq!(tree.get(ROOT).unwrap().nlink, 3);
        assert_eq!(tree.get(3).unwrap().nlink, 2);
        // A directory is moved under another: link counts follow.
        tree.apply(4, &make(ROOT, "e", 4, Kind::Dir)).unwrap();
        let rename = FsRecord::Rename {
            parent: ROOT,
            name: name("d"),
            new_parent: 4,
            new_name: name("d2"),
            exchange: false,
            time: Time::default(),
        };
        tree.apply(5, &rename).unwrap();
        assert_eq!(tree.get(ROOT).unwrap().nlink, 3);
        assert_eq!(tree.get(4).unwrap().nlink, 3);
        assert_eq!(tree.get(2).unwrap().parent, 4);
        assert!(tree.is_within(3, ROOT) || tree.get(3).unwrap().kind == Kind::File);
        assert!(tree.is_within(2, 4));
        // A non-empty directory cannot be removed: the record is refused.
        let remove = FsRecord::Remove {
            parent: 4,
            name: name("d2"),
            time: Time::default(),
        };
        assert!(tree.apply(6, &remove).is_err());
    }

    #[test]
    fn a_record_already_applied_is_skipped() {
        let mut tree = Tree::new(0, 0);
        let record = make(ROOT, "f", 2, Kind::File);
        tree.apply(7, &record).unwrap();
        let before = tree.clone();
        tree.apply(7, &record).unwrap();
        tree.apply(3, &record).unwrap();
        assert_eq!(tree, before);
    }

    #[test]
    fn a_damaged_snapshot_is_refused_with_the_reason() {
        let mut bytes = Tree::new(0, 0).encode();
        assert_eq!(Tree::decode(&bytes).unwrap().next_ino, 2);
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let damaged = Tree::decode(&bytes).unwrap_err();
        assert!(matches!(damaged, SnapshotError::Checksum), "{damaged}");
        assert!(damaged.to_string().contains("checksum"));
        let foreign = Tree::decode(b"nonsense").unwrap_err();
        assert!(matches!(foreign, SnapshotError::BadMagic), "{foreign}");
        assert!(foreign.to_string().contains("magic"));
    }

    proptest! {
        /// Any sequence of creates, renames and removes that the mount would log (each checked
        /// against the tree first, as the mount does) replays to the same tree from the
        /// snapshot taken at any point.
        #[test]
        fn replay_from_any_snapshot_gives_the_same_tree(
            ops in proptest::collection::vec((0u8..5, 0u8..6, 0u8..6, 0u8..3), 1..60),
            cut in 0usize..60,
        ) {
            let mut tree = Tree::new(0, 0);
            let mut log = Vec::new();
            let mut snapshot = tree.encode();
            for (i, (op, a, b, dir)) in ops.into_iter().enumerate() {
                let dirs: Vec<u64> = tree
                    .nodes
                    .iter()
                    .filter(|(_, n)| n.kind == Kind::Dir && n.nlink > 0)
                    .map(|(i, _)| *i)
                    .collect();
                let parent = dirs[dir as usize % dirs.len()];
                let (na, nb) = (name(&format!("n{a}")), name(&format!("n{b}")));
                let record = match op {
                    0 | 1 => {
                        if tree.lookup(parent, &na).is_some() { continue; }
                        let kind = if op == 0 { Kind::File } else { Kind::Dir };
                        let mut record = make(parent, "", tree.next_ino, kind);
                        if let FsRecord::Make { name, .. } = &mut record { *name = na; }
                        record
                    }
                    2 => {
                        let Some(ino) = tree.lookup(parent, &na) else { continue };
                        let node = tree.get(ino).unwrap();
                        if node.kind == Kind::Dir && !node.entries.is_empty() { continue; }
                        FsRecord::Remove { parent, name: na, time: Time::default() }
                    }
                    3 => {
                        let Some(moved) = tree.lookup(parent, &na) else { continue };
                        let to = dirs[b as usize % dirs.len()];
                        if tree.is_within(to, moved) { continue; }
                        if let Some(target) = tree.lookup(to, &nb) {
                            let (m, t) = (tree.get(moved).unwrap(), tree.get(target).unwrap());
                            if (m.kind == Kind::Dir) != (t.kind == Kind::Dir) { continue; }
                            if t.kind == Kind::Dir && !t.entries.is_empty() && target != moved { continue; }
                        }
                        FsRecord::Rename { parent, name: na, new_parent: to, new_name: nb, exchange: false, time: Time::default() }
                    }
                    _ => {
                        // An inode left without a name (unlinked while open) is dropped.
                        let Some(ino) = tree
                            .nodes
                            .iter()
                            .find(|(_, n)| n.nlink == 0)
                            .map(|(i, _)| *i) else { continue };
                        FsRecord::Drop { ino }
                    }
                };
                let lsn = log.len() as u64 + 1;
                tree.apply(lsn, &record).unwrap();
                log.push(record);
                if i == cut { snapshot = tree.encode(); }
            }
            let mut replayed = Tree::decode(&snapshot).unwrap();
            for (i, record) in log.iter().enumerate() {
                replayed.apply(i as u64 + 1, record).unwrap();
            }
            prop_assert_eq!(replayed, tree);
        }
    }
}
