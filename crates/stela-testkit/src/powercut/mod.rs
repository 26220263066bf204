//! A power cut without notice, for tests of real processes: a FUSE file system (after LazyFS)
//! that holds everything written to it in memory and keeps, as its "disk", only what was
//! fsynced (a file's data and attributes by an fsync of the file; names by an fsync of their
//! directory, or by any fsync with [`Namespace::Journaled`]). [`PowerCutLayer::cut`] is the
//! cut: every request still in flight is failed, the volume falls back to its durable copy
//! ([`volume::Volume::cut`]), and the file system is unmounted and mounted again, so that the
//! kernel's caches of the old mount die with it, as the page cache does at a power cut. The
//! processes using it must be SIGKILLed first: a cut is the moment they all stop.
//!
//! Owns: the mount (one background session thread serving requests one at a time) and the
//! table of open handles. Invariants: no request changes the volume between a cut and the
//! next mount (the volume is fenced); a handle opened with O_DSYNC or O_SYNC has each write
//! synced before it is answered.
//!
//! The layer needs `/dev/fuse` and root (or `user_allow_other`): [`PowerCutLayer::mount`]
//! panics with the reason when it cannot mount, so a test that needs it fails rather than
//! passes silently.

pub mod volume;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use stela_fuse::{
    answer_attr, answer_data, answer_dir, answer_empty, answer_entry, time_or_now, TTL,
};
use volume::{Body, Change, Kind, Meta, Node, Volume};
pub use volume::{CutReport, Namespace};

/// The volume, whether it is fenced (between a cut and the next mount), and the open handles.
struct Shared {
    volume: Volume,
    fenced: bool,
    /// handle -> (inode, each write synced: opened O_DSYNC/O_SYNC)
    handles: HashMap<u64, (u64, bool)>,
    next_handle: u64,
}

/// The file system the session serves: the shared state behind one lock.
struct Layer(Arc<Mutex<Shared>>);

/// A mounted power-cut layer; unmounted when dropped.
pub struct PowerCutLayer {
    shared: Arc<Mutex<Shared>>,
    mountpoint: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl PowerCutLayer {
    /// Mounts an empty layer on `mountpoint` (an existing directory), its root owned by root
    /// with mode 755, open to every user (`allow_other`; the kernel checks permissions).
    ///
    /// # Panics
    /// When it cannot mount (no `/dev/fuse`, no fusermount3, no permission), saying so.
    pub fn mount(mountpoint: &Path, namespace: Namespace) -> PowerCutLayer {
        let shared = Arc::new(Mutex::new(Shared {
            volume: Volume::new(namespace, 0, 0, 0o755),
            fenced: false,
            handles: HashMap::new(),
            next_handle: 1,
        }));
        let mut layer = PowerCutLayer {
            shared,
            mountpoint: mountpoint.to_owned(),
            session: None,
        };
        layer.session = Some(layer.start_session());
        layer
    }

    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    fn start_session(&self) -> fuser::BackgroundSession {
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("stela-powercut".to_owned()),
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::RW,
        ];
        config.acl = fuser::SessionACL::All;
        let fs = Layer(Arc::clone(&self.shared));
        let session = fuser::Session::new(fs, &self.mountpoint, &config).unwrap_or_else(|e| {
            panic!(
                "cannot mount the power-cut layer on {} ({e}): this test needs /dev/fuse, \
                 fusermount3 (Debian's fuse3) and root",
                self.mountpoint.display()
            )
        });
        session
            .spawn()
            .expect("the power-cut layer's session thread")
    }

    /// The power cut. Call it once every process using the layer is SIGKILLed (and reaped):
    /// fences the volume (any request still arriving fails with EIO), drops everything not
    /// durable, unmounts (retrying while the kernel still holds the dead processes' files)
    /// and mounts again. Returns what was thrown away.
    ///
    /// # Panics
    /// When the old mount does not go away within 30 s, or the new one cannot be made.
    pub fn cut(&mut self) -> CutReport {
        let report = {
            let mut shared = lock(&self.shared);
            shared.fenced = true;
            shared.handles.clear();
            shared.volume.cut()
        };
        self.unmount();
        lock(&self.shared).fenced = false;
        self.session = Some(self.start_session());
        report
    }

    fn unmount(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        // `umount_and_join` consumes the session; a busy mount point is retried with the
        // plain unmount below until the kernel lets go.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut session = Some(session);
        while let Some(s) = session.take() {
            if is_busy_unmount(&self.mountpoint) {
                assert!(
                    Instant::now() < deadline,
                    "the power-cut layer on {} stayed busy for 30 s",
                    self.mountpoint.display()
                );
                session = Some(s);
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            let _ = s.join();
        }
    }
}

/// Tries `umount` of `mountpoint` (this process is root); true while it is busy.
fn is_busy_unmount(mountpoint: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()).expect("no NUL");
    // SAFETY: umount2 with a NUL-terminated path that outlives the call.
    let rc = unsafe { libc::umount2(path.as_ptr(), 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBUSY)
}

impl Drop for PowerCutLayer {
    /// Unmounts; if a process still holds a file on it (a failing test's leftovers), detaches
    /// it lazily so that no dead mount outlives the test.
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            if session.umount_and_join().is_err() {
                use std::os::unix::ffi::OsStrExt;
                let path =
                    std::ffi::CString::new(self.mountpoint.as_os_str().as_bytes()).expect("no NUL");
                // SAFETY: umount2 with a NUL-terminated path that outlives the call.
                unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic in a request handler must not hide every later request's answer.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Socket => FileType::Socket,
        Kind::Fifo => FileType::NamedPipe,
    }
}

fn attr_of(volume: &Volume, ino: u64, node: &Node) -> FileAttr {
    let size = node.size();
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: node.meta.atime,
        mtime: node.meta.mtime,
        ctime: node.meta.ctime,
        crtime: node.meta.ctime,
        kind: file_type(node.meta.kind),
        perm: node.meta.perm,
        nlink: volume.nlink(ino),
        uid: node.meta.uid,
        gid: node.meta.gid,
        rdev: node.meta.rdev,
        blksize: 4096,
        flags: 0,
    }
}

fn meta_for(req: &Request, kind: Kind, mode: u32, rdev: u32) -> Meta {
    let now = SystemTime::now();
    Meta {
        kind,
        perm: (mode & 0o7777) as u16,
        uid: req.uid(),
        gid: req.gid(),
        rdev,
        atime: now,
        mtime: now,
        ctime: now,
    }
}

impl Layer {
    /// Runs `f` on the volume unless it is fenced (a cut happened: EIO).
    fn with<T>(&self, f: impl FnOnce(&mut Shared) -> Result<T, Errno>) -> Result<T, Errno> {
        let mut shared = lock(&self.0);
        if shared.fenced {
            return Err(Errno::EIO);
        }
        f(&mut shared)
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        self.with(|s| Ok(attr_of(&s.volume, ino, s.volume.node(ino)?)))
    }

    /// Makes an inode and answers with its attributes.
    fn make(
        &self,
        parent: INodeNo,
        name: &OsStr,
        meta: Meta,
        body: Body,
    ) -> Result<FileAttr, Errno> {
        self.with(|s| {
            let ino = s.volume.create(parent.0, name, meta, body)?;
            Ok(attr_of(&s.volume, ino, s.volume.node(ino)?))
        })
    }

    fn open_handle(&self, ino: u64, flags: i32) -> Result<u64, Errno> {
        self.with(|s| {
            s.volume.open(ino)?;
            let handle = s.next_handle;
            s.next_handle += 1;
            let synced = flags & (libc::O_DSYNC | libc::O_SYNC) != 0;
            s.handles.insert(handle, (ino, synced));
            Ok(handle)
        })
    }
}

impl Filesystem for Layer {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = self.with(|s| {
            let ino = s.volume.lookup(parent.0, name)?;
            Ok(attr_of(&s.volume, ino, s.volume.node(ino)?))
        });
        answer_entry(reply, result);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        answer_attr(reply, self.attr(ino.0));
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
        let change = Change {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
        };
        let result = self.with(|s| {
            s.volume.set_attr(ino.0, &change)?;
            Ok(attr_of(&s.volume, ino.0, s.volume.node(ino.0)?))
        });
        answer_attr(reply, result);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        use std::os::unix::ffi::OsStrExt;
        let result = self.with(|s| match &s.volume.node(ino.0)?.body {
            Body::Symlink(target) => Ok(target.as_os_str().as_bytes().to_vec()),
            _ => Err(Errno::EINVAL),
        });
        answer_data(reply, result);
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
        let (kind, body) = match mode & libc::S_IFMT {
            libc::S_IFREG => (Kind::File, Body::File(Default::default())),
            libc::S_IFSOCK => (Kind::Socket, Body::Special),
            libc::S_IFIFO => (Kind::Fifo, Body::Special),
            _ => return reply.error(Errno::EPERM),
        };
        let meta = meta_for(req, kind, mode, rdev);
        answer_entry(reply, self.make(parent, name, meta, body));
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
        let meta = meta_for(req, Kind::Dir, mode, 0);
        answer_entry(
            reply,
            self.make(parent, name, meta, Body::Dir(Default::default())),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer_empty(reply, self.with(|s| s.volume.remove(parent.0, name, false)));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer_empty(reply, self.with(|s| s.volume.remove(parent.0, name, true)));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let meta = meta_for(req, Kind::Symlink, 0o777, 0);
        let body = Body::Symlink(target.to_owned());
        answer_entry(reply, self.make(parent, link_name, meta, body));
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
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        let result = self.with(|s| {
            s.volume
                .rename(parent.0, name, newparent.0, newname, noreplace, exchange)
        });
        answer_empty(reply, result);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let result = self.with(|s| {
            s.volume.link(ino.0, newparent.0, newname)?;
            Ok(attr_of(&s.volume, ino.0, s.volume.node(ino.0)?))
        });
        answer_entry(reply, result);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_handle(ino.0, flags.0) {
            Ok(handle) => reply.opened(FileHandle(handle), FopenFlags::empty()),
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
        let meta = meta_for(req, Kind::File, mode, 0);
        let made = self
            .make(parent, name, meta, Body::File(Default::default()))
            .and_then(|attr| Ok((attr, self.open_handle(attr.ino.0, flags)?)));
        match made {
            Ok((attr, handle)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(handle),
                FopenFlags::empty(),
            ),
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
        answer_data(
            reply,
            self.with(|s| s.volume.read(ino.0, offset, size as usize)),
        );
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let result = self.with(|s| {
            s.volume.write(ino.0, offset, data)?;
            let synced_handle = s.handles.get(&fh.0).is_some_and(|&(_, synced)| synced);
            if synced_handle || flags.0 & (libc::O_DSYNC | libc::O_SYNC) != 0 {
                s.volume.sync_file(ino.0)?;
            }
            Ok(())
        });
        match result {
            Ok(()) => reply.written(data.len() as u32),
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
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Also while fenced: the handle is gone either way (the cut cleared the table).
        let mut shared = lock(&self.0);
        if shared.handles.remove(&fh.0).is_some() {
            shared.volume.release(ino.0);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        answer_empty(reply, self.with(|s| s.volume.sync_file(ino.0)));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let listed = match self.with(|s| s.volume.list(ino.0)) {
            Ok(listed) => listed,
            Err(e) => return reply.error(e),
        };
        let entries = listed
            .into_iter()
            .map(|(name, child, kind)| (child, file_type(kind), name));
        answer_dir(reply, offset, ino.0, volume::ROOT, entries);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        answer_empty(reply, self.with(|s| s.volume.sync_dir(ino.0)));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Plenty of room: the volume lives in memory.
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096);
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

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
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
        answer_empty(
            reply,
            self.with(|s| s.volume.allocate(ino.0, offset, length, mode)),
        );
    }
}
