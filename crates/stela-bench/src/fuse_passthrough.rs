//! `stela-bench fuse-passthrough`: the plainest FUSE file system fuser allows, serving a
//! directory through the kernel's FUSE driver and nothing else, tuned for speed (writeback
//! cache, 1 MiB writes, several threads each reading its own cloned `/dev/fuse`). It is the
//! floor of `stela-bench pgbench`: PostgreSQL's pg_wal through it, over tmpfs (where fdatasync
//! costs nothing), is the best any FUSE front that answers fdatasync from memory can do here,
//! whatever it does with the bytes. It logs nothing and promises nothing: a benchmark tool only.
//!
//! Owns: a table of inode numbers to paths under the source directory (names are looked up
//! in the source on each `lookup`), and open files as raw descriptors (the file handle is the
//! descriptor). Invariants: inode 1 is the source directory; a rename moves the table's paths
//! under the old name; a descriptor is closed exactly once, at `release`.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use stela_fuse::{
    answer_attr, answer_data, answer_dir, answer_empty, answer_entry, answer_statvfs, TTL,
};

#[derive(clap::Args, Debug)]
pub struct FusePassthroughArgs {
    /// The directory served.
    #[arg(long, value_name = "DIR")]
    pub source: PathBuf,
    /// Where to mount it.
    #[arg(long, value_name = "DIR")]
    pub mountpoint: PathBuf,
    /// Threads reading requests, each from its own clone of the FUSE device.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Leave the kernel's writeback cache off (every write a request).
    #[arg(long)]
    pub no_writeback_cache: bool,
}

struct Passthrough {
    /// inode -> path (inode 1: the source directory).
    paths: Mutex<HashMap<u64, PathBuf>>,
    writeback: bool,
}

fn errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("a path has no NUL")
}

fn time_of(secs: i64, nanos: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nanos as u32)
    } else {
        UNIX_EPOCH
    }
}

fn attr_of(meta: &std::fs::Metadata) -> FileAttr {
    use std::os::unix::fs::FileTypeExt;
    let ft = meta.file_type();
    let kind = if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_fifo() {
        FileType::NamedPipe
    } else if ft.is_socket() {
        FileType::Socket
    } else {
        FileType::RegularFile
    };
    FileAttr {
        ino: INodeNo(meta.ino()),
        size: meta.size(),
        blocks: meta.blocks(),
        atime: time_of(meta.atime(), meta.atime_nsec()),
        mtime: time_of(meta.mtime(), meta.mtime_nsec()),
        ctime: time_of(meta.ctime(), meta.ctime_nsec()),
        crtime: time_of(meta.ctime(), meta.ctime_nsec()),
        kind,
        perm: (meta.mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: meta.rdev() as u32,
        blksize: meta.blksize() as u32,
        flags: 0,
    }
}

impl Passthrough {
    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths
            .lock()
            .expect("paths lock")
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(parent)?.join(name))
    }

    /// The attributes of `path`, its inode (the source's, but 1 for the root) remembered.
    fn remember(&self, path: PathBuf) -> Result<FileAttr, Errno> {
        let meta = std::fs::symlink_metadata(&path).map_err(errno)?;
        let mut attr = attr_of(&meta);
        let mut paths = self.paths.lock().expect("paths lock");
        if paths.get(&1) == Some(&path) {
            attr.ino = INodeNo(1);
        } else {
            paths.insert(attr.ino.0, path);
        }
        Ok(attr)
    }

    fn getattr_of(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let path = self.path(ino)?;
        let meta = std::fs::symlink_metadata(&path).map_err(errno)?;
        let mut attr = attr_of(&meta);
        attr.ino = ino;
        Ok(attr)
    }

    /// open(2) of `path`; with the writeback cache the kernel reads pages of files opened
    /// write-only and appends itself, so those become read-write and O_APPEND is dropped.
    fn open_fd(&self, path: &Path, flags: i32, mode: u32) -> Result<i32, Errno> {
        let mut flags = flags & !libc::O_NOFOLLOW;
        if self.writeback {
            if flags & libc::O_ACCMODE == libc::O_WRONLY {
                flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            flags &= !libc::O_APPEND;
        }
        let path = c_path(path);
        // SAFETY: a NUL-terminated path that outlives the call.
        let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode) };
        if fd < 0 {
            return Err(errno(std::io::Error::last_os_error()));
        }
        Ok(fd)
    }

    /// A borrowed `File` over the descriptor a file handle is (never closes it).
    fn with_fd<T>(fh: FileHandle, f: impl FnOnce(&std::fs::File) -> T) -> T {
        use std::os::fd::FromRawFd;
        // SAFETY: the descriptor is open from `open`/`create` until `release`; ManuallyDrop
        // keeps this borrow from closing it.
        let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fh.0 as i32) });
        f(&file)
    }
}

/// What this process (root) creates belongs to the caller, as on a local file system.
fn owned_by_caller(path: &Path, req: &Request) -> Result<(), Errno> {
    std::os::unix::fs::lchown(path, Some(req.uid()), Some(req.gid())).map_err(errno)
}

impl Filesystem for Passthrough {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        if self.writeback {
            let _ = config.add_capabilities(fuser::InitFlags::FUSE_WRITEBACK_CACHE);
        }
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_PARALLEL_DIROPS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        answer_entry(
            reply,
            self.child(parent, name).and_then(|p| self.remember(p)),
        );
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        answer_attr(reply, self.getattr_of(ino));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = (|| {
            let path = self.path(ino)?;
            if let Some(mode) = mode {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(errno)?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::lchown(&path, uid, gid).map_err(errno)?;
            }
            if let Some(size) = size {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_len(size))
                    .map_err(errno)?;
            }
            self.getattr_of(ino)
        })();
        answer_attr(reply, result);
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
        let result = self.child(parent, name).and_then(|path| {
            std::fs::DirBuilder::new()
                .mode(mode)
                .create(&path)
                .map_err(errno)?;
            owned_by_caller(&path, req)?;
            self.remember(path)
        });
        answer_entry(reply, result);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self
            .child(parent, name)
            .and_then(|path| std::fs::remove_file(path).map_err(errno));
        answer_empty(reply, result);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self
            .child(parent, name)
            .and_then(|path| std::fs::remove_dir(path).map_err(errno));
        answer_empty(reply, result);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            let from = self.child(parent, name)?;
            let to = self.child(newparent, newname)?;
            std::fs::rename(&from, &to).map_err(errno)?;
            let mut paths = self.paths.lock().expect("paths lock");
            for path in paths.values_mut() {
                if let Ok(rest) = path.strip_prefix(&from) {
                    // (Joining an empty rest would add a trailing slash: ENOTDIR on a file.)
                    *path = match rest.as_os_str().is_empty() {
                        true => to.clone(),
                        false => to.join(rest),
                    };
                }
            }
            Ok(())
        })();
        answer_empty(reply, result);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self
            .path(ino)
            .and_then(|path| self.open_fd(&path, flags.0, 0))
        {
            Ok(fd) => reply.opened(FileHandle(fd as u64), FopenFlags::FOPEN_KEEP_CACHE),
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
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = (|| {
            let path = self.child(parent, name)?;
            let fd = self.open_fd(&path, flags | libc::O_CREAT, mode)?;
            owned_by_caller(&path, req)?;
            Ok((fd, self.remember(path)?))
        })();
        match result {
            Ok((fd, attr)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fd as u64),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut buf = vec![0u8; size as usize];
        let read = Self::with_fd(fh, |file| {
            let mut done = 0;
            while done < buf.len() {
                match file.read_at(&mut buf[done..], offset + done as u64) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(done)
        });
        answer_data(reply, read.map(|n| &buf[..n]).map_err(errno));
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match Self::with_fd(fh, |file| file.write_all_at(data, offset)) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
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
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // SAFETY: the descriptor `open`/`create` made for this handle; the kernel releases a
        // handle once.
        unsafe { libc::close(fh.0 as i32) };
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let synced = Self::with_fd(fh, |file| {
            if datasync {
                file.sync_data()
            } else {
                file.sync_all()
            }
        });
        answer_empty(reply, synced.map_err(errno));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let path = match self.path(ino) {
            Ok(path) => path,
            Err(e) => return reply.error(e),
        };
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) => return reply.error(errno(e)),
        };
        let listed = entries.filter_map(|entry| {
            let entry = entry.ok()?;
            let meta = entry.metadata().ok()?;
            let kind = if meta.is_dir() {
                FileType::Directory
            } else if meta.file_type().is_symlink() {
                FileType::Symlink
            } else {
                FileType::RegularFile
            };
            Some((meta.ino(), kind, entry.file_name()))
        });
        answer_dir(reply, offset, ino.0, 1, listed);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let result = self.path(ino).and_then(|path| {
            std::fs::File::open(path)
                .and_then(|dir| dir.sync_all())
                .map_err(errno)
        });
        answer_empty(reply, result);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.path(INodeNo(1)) {
            Ok(root) => answer_statvfs(reply, &root, 255),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    // No extended attributes: ENOSYS makes the kernel stop asking (before every write).
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

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // SAFETY: plain system call on an open descriptor.
        let rc = unsafe {
            libc::fallocate(
                fh.0 as i32,
                mode,
                offset as libc::off_t,
                length as libc::off_t,
            )
        };
        let result = if rc == 0 {
            Ok(())
        } else {
            Err(errno(std::io::Error::last_os_error()))
        };
        answer_empty(reply, result);
    }
}

/// Serves `args.source` on `args.mountpoint` until unmounted (`fusermount3 -u`) or SIGTERM.
pub fn run(args: &FusePassthroughArgs) -> anyhow::Result<()> {
    let source = args.source.canonicalize()?;
    let fs = Passthrough {
        paths: Mutex::new(HashMap::from([(1, source)])),
        writeback: !args.no_writeback_cache,
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("stela-bench-passthrough".to_owned()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::RW,
    ];
    config.acl = fuser::SessionACL::All;
    config.n_threads = Some(args.threads.max(1));
    config.clone_fd = args.threads > 1;
    let mut session = fuser::Session::new(fs, &args.mountpoint, &config)?;
    let mut unmounter = session.unmount_callable();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    let point = args.mountpoint.clone();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() && unmounter.unmount().is_err() {
            let _ = std::process::Command::new("fusermount3")
                .arg("-uz")
                .arg(&point)
                .status();
            std::process::exit(0);
        }
    });
    session.run()?;
    Ok(())
}
