//! The kernel's side: the FUSE handlers, each a thin shell that takes the kernel's request,
//! calls the file system's own operation ([`super::StelaFs`]) and answers with its result.
//!
//! Invariants: every handler answers exactly once (`reply` is consumed on every path), and
//! none answers ENOSYS for fsync or fsyncdir (the kernel would skip later fsyncs silently).

use super::{attr_of, kind_type, name_of, time_of, StelaFs, NAME_MAX};
use crate::record::{falloc, FsRecord, Kind, Time};
use fuser::{
    AccessFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::SystemTime;
use stela_fuse::{
    answer_attr, answer_data, answer_dir, answer_empty, answer_entry, answer_statvfs, TTL,
};

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
        let found = self.lock().and_then(|state| {
            let ino = (state.tree.lookup(parent.0, name.as_bytes())).ok_or(Errno::ENOENT)?;
            Ok(attr_of(ino, state.tree.get(ino).ok_or(Errno::ENOENT)?))
        });
        answer_entry(reply, found);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let attr = self.lock().and_then(|state| {
            let node = state.tree.get(ino.0).ok_or(Errno::ENOENT)?;
            Ok(attr_of(ino.0, node))
        });
        answer_attr(reply, attr);
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
        answer_attr(reply, result);
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
        answer_empty(reply, self.remove(parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer_empty(reply, self.remove(parent.0, name, true));
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
        answer_empty(
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
        answer_data(reply, self.read_file(ino.0, offset, size));
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
        answer_empty(reply, result);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        answer_empty(reply, self.sync(ino.0));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
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
        let entries = dir.entries.iter().map(|(name, child)| {
            let kind = state
                .tree
                .get(*child)
                .map_or(FileType::RegularFile, |n| kind_type(n.kind));
            (*child, kind, OsStr::from_bytes(name))
        });
        answer_dir(reply, offset, ino.0, dir.parent, entries);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        answer_empty(reply, self.sync(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        answer_statvfs(reply, self.backing.dir(), NAME_MAX as u32);
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
        answer_empty(reply, result);
    }
}
