//! What stela's three FUSE file systems share: `stela mount` (stela-mount), the power-cut
//! layer of stela-testkit and the passthrough floor of stela-bench. Each implements fuser's
//! `Filesystem` over its own inodes; the ways they answer the kernel are the same, and live
//! here: a reply from a `Result`, a directory listing from an iterator, statfs from the file
//! system that holds a directory, the time a `setattr` asks for.
//!
//! Owns no state. Invariant: every `answer_*` consumes its reply and answers it exactly once
//! (a FUSE request left unanswered hangs the process that made it), so a handler that ends in
//! one of them answers exactly once too.

use fuser::{
    Errno, FileAttr, FileType, Generation, INodeNo, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyStatfs, TimeOrNow,
};
use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// How long the kernel may keep a name or an inode's attributes without asking again. Each of
/// these file systems is the only writer of what it serves while it is mounted, so what the
/// kernel was told stays true until the kernel itself changes it through the mount.
pub const TTL: Duration = Duration::from_secs(1);

/// Answers a request that returns nothing but success or an errno.
pub fn answer_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// Answers a request that returns a new, found or linked entry (generation 0: inode numbers
/// are not reused while mounted).
pub fn answer_entry(reply: ReplyEntry, result: Result<FileAttr, Errno>) {
    match result {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

/// Answers `getattr` or `setattr`.
pub fn answer_attr(reply: ReplyAttr, result: Result<FileAttr, Errno>) {
    match result {
        Ok(attr) => reply.attr(&TTL, &attr),
        Err(e) => reply.error(e),
    }
}

/// Answers `read` or `readlink`.
pub fn answer_data(reply: ReplyData, result: Result<impl AsRef<[u8]>, Errno>) {
    match result {
        Ok(data) => reply.data(data.as_ref()),
        Err(e) => reply.error(e),
    }
}

/// Answers `readdir` of directory `dir` (whose parent is `parent`): `.` and `..`, then
/// `entries` as (inode, type, name), from the kernel's `offset` on, as many as the reply
/// holds. An entry's offset, the one the kernel passes back to go on after it, is its
/// position counted from 1, so the same listing read again resumes where the last one stopped.
pub fn answer_dir<N: AsRef<OsStr>>(
    mut reply: ReplyDirectory,
    offset: u64,
    dir: u64,
    parent: u64,
    entries: impl IntoIterator<Item = (u64, FileType, N)>,
) {
    let mut position = 0;
    // True once the reply is full: the kernel asks again from the last offset it got.
    let mut add = |ino: u64, kind: FileType, name: &OsStr| {
        position += 1;
        position > offset && reply.add(INodeNo(ino), position, kind, name)
    };
    let dots = [(dir, "."), (parent, "..")];
    let _full = dots
        .into_iter()
        .any(|(ino, name)| add(ino, FileType::Directory, OsStr::new(name)))
        || entries
            .into_iter()
            .any(|(ino, kind, name)| add(ino, kind, name.as_ref()));
    reply.ok();
}

/// Answers `statfs` with the figures of the file system that holds `dir`, names up to
/// `name_max` bytes; EIO when they cannot be read.
pub fn answer_statvfs(reply: ReplyStatfs, dir: &Path, name_max: u32) {
    match rustix::fs::statvfs(dir) {
        Ok(stat) => reply.statfs(
            stat.f_blocks,
            stat.f_bfree,
            stat.f_bavail,
            stat.f_files,
            stat.f_ffree,
            stat.f_bsize as u32,
            name_max,
            stat.f_frsize as u32,
        ),
        Err(_) => reply.error(Errno::EIO),
    }
}

/// The time a `setattr` sets: the one it names, or now.
pub fn time_or_now(time: TimeOrNow) -> SystemTime {
    match time {
        TimeOrNow::SpecificTime(time) => time,
        TimeOrNow::Now => SystemTime::now(),
    }
}
