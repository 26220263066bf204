//! The functions this library exports under libc's names. Each finds libc's own with
//! `dlsym(RTLD_NEXT)`, performs the call, and, for a durable file, logs what it changed
//! (after the change: see `conn`). A hook never unwinds into C: a panic becomes EIO.
//!
//! Covered: open/open64/openat/openat64/creat/creat64 and their fortified forms; write,
//! pwrite(64), writev, pwritev(64), pwritev2; fsync, fdatasync, sync_file_range; close, dup,
//! dup2, dup3, fcntl(F_DUPFD, F_DUPFD_CLOEXEC); ftruncate, truncate; rename, renameat,
//! renameat2, unlink, unlinkat, rmdir. Not covered (said in docs/POSTGRES.md): stdio streams
//! (fopen opens inside libc), memory-mapped writes, descriptors passed across exec, fallocate.

use crate::conn;
use crate::fds::{self, Tracked};
use crate::paths;
use libc::{c_char, c_int, c_long, c_uint, c_void, iovec, mode_t, off_t, size_t, ssize_t};
use serde_bytes::ByteBuf;
use std::ffi::CStr;
use std::sync::Arc;
use stela_run::RunRecord;

/// libc's definition of `$name` with type `$ty`, found once.
macro_rules! real {
    ($name:ident : $ty:ty) => {{
        static PTR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let mut ptr = PTR.load(std::sync::atomic::Ordering::Relaxed);
        if ptr == 0 {
            // SAFETY: the name is a NUL-terminated literal; RTLD_NEXT asks for the next
            // definition after this library's, i.e. libc's.
            ptr = unsafe {
                libc::dlsym(
                    libc::RTLD_NEXT,
                    concat!(stringify!($name), "\0").as_ptr().cast(),
                )
            } as usize;
            PTR.store(ptr, std::sync::atomic::Ordering::Relaxed);
        }
        if ptr == 0 {
            None
        } else {
            // SAFETY: `ptr` is libc's `$name`, whose C signature is `$ty`.
            Some(unsafe { std::mem::transmute::<usize, $ty>(ptr) })
        }
    }};
}

fn set_errno(code: c_int) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = code };
}

fn errno() -> c_int {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() }
}

/// -1 with errno `code`.
fn fail(code: c_int) -> c_int {
    set_errno(code);
    -1
}

/// Runs a hook's logging step; a panic or an error becomes EIO (-1).
fn guarded(step: impl FnOnce() -> std::io::Result<()>) -> Result<(), c_int> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(step)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
        Err(_) => Err(libc::EIO),
    }
}

/// The directory part of a canonical absolute path.
fn parent(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(0) | None => b"/",
        Some(cut) => &path[..cut],
    }
}

/// A real fsync (a directory, or `data_only`: fdatasync of a file) of `path`, through libc's
/// functions, not this library's (which would answer it from the daemon).
fn sync_path(path: &[u8], data_only: bool) -> std::io::Result<()> {
    let missing = || std::io::Error::from_raw_os_error(libc::ENOSYS);
    let open = real!(open: OpenFn).ok_or_else(missing)?;
    let close = real!(close: unsafe extern "C" fn(c_int) -> c_int).ok_or_else(missing)?;
    let sync = if data_only {
        real!(fdatasync: unsafe extern "C" fn(c_int) -> c_int)
    } else {
        real!(fsync: unsafe extern "C" fn(c_int) -> c_int)
    }
    .ok_or_else(missing)?;
    let name = std::ffi::CString::new(path).map_err(std::io::Error::other)?;
    // SAFETY: `name` is NUL-terminated; the descriptor is ours from open to close.
    unsafe {
        let fd = open(name.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let synced = sync(fd);
        let error = std::io::Error::last_os_error();
        close(fd);
        if synced != 0 {
            return Err(error);
        }
    }
    Ok(())
}

// ---- opening ----

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, mode_t) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, mode_t) -> c_int;
type Open2Fn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type Openat2Fn = unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int;

/// Whether `path` (under `dir`) names something now; asked before an O_CREAT open, to tell
/// whether the open made the file.
unsafe fn exists(dir: c_int, path: *const c_char, flags: c_int) -> bool {
    if flags & libc::O_CREAT == 0 || path.is_null() || conn::settings().is_none() {
        return true;
    }
    let saved = errno();
    // SAFETY: `path` is the program's NUL-terminated path; fstatat writes into our struct.
    let mut stat: libc::stat = std::mem::zeroed();
    let found = libc::fstatat(dir, path, &mut stat, 0) == 0;
    set_errno(saved);
    found
}

/// A descriptor was opened with `flags` (`made`: the open created the file): if it is a
/// durable file, make its creation durable and log it, log a truncation, strip
/// O_DSYNC/O_SYNC (its writes are acknowledged by the daemon instead) and track it. On a
/// failure to log, the descriptor is closed and -1/EIO returned.
fn opened(fd: c_int, flags: c_int, existed: bool) -> c_int {
    if fd < 0 {
        return fd;
    }
    let Some(settings) = conn::settings() else {
        return fd;
    };
    let saved = errno();
    let Some(path) = paths::of_fd(fd) else {
        return fd;
    };
    if !settings.covers(&path) {
        set_errno(saved);
        return fd;
    }
    let sync = flags & (libc::O_DSYNC | libc::O_SYNC) != 0;
    let logged = guarded(|| {
        if sync {
            reopen_without_sync(fd, flags)?;
        }
        let mut records = Vec::new();
        if !existed {
            sync_path(parent(&path), false)?;
            // SAFETY: fstat writes a stat into the zeroed struct we own.
            let mut stat: libc::stat = unsafe { std::mem::zeroed() };
            let mode = if unsafe { libc::fstat(fd, &mut stat) } == 0 {
                stat.st_mode & 0o7777
            } else {
                0o600
            };
            records.push(RunRecord::Create {
                path: ByteBuf::from(path.clone()),
                mode,
            });
        }
        if flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY {
            records.push(RunRecord::SetLen {
                path: ByteBuf::from(path.clone()),
                size: 0,
            });
        }
        if !records.is_empty() {
            conn::log(&records, records.iter().any(RunRecord::waits_for_level))?;
        }
        Ok(())
    });
    if let Err(code) = logged {
        if let Some(close) = real!(close: unsafe extern "C" fn(c_int) -> c_int) {
            // SAFETY: `fd` is the descriptor this open just returned, not yet handed out.
            unsafe { close(fd) };
        }
        return fail(code);
    }
    fds::insert(fd, Arc::new(Tracked { path, sync }));
    set_errno(saved);
    fd
}

/// Replaces `fd` by a descriptor of the same file without O_DSYNC/O_SYNC (Linux cannot clear
/// them with F_SETFL).
fn reopen_without_sync(fd: c_int, flags: c_int) -> std::io::Result<()> {
    let open = real!(open: OpenFn).ok_or_else(std::io::Error::last_os_error)?;
    let dup3 = real!(dup3: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int)
        .ok_or_else(std::io::Error::last_os_error)?;
    let close = real!(close: unsafe extern "C" fn(c_int) -> c_int)
        .ok_or_else(std::io::Error::last_os_error)?;
    let link = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
    let plain =
        flags & !(libc::O_SYNC | libc::O_DSYNC | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
    // SAFETY: `link` is NUL-terminated; the descriptors are ours (just opened).
    unsafe {
        let again = open(link.as_ptr(), plain, 0);
        if again < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let moved = dup3(again, fd, flags & libc::O_CLOEXEC);
        close(again);
        if moved < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

// The third argument of open is variadic in C; on the x86-64 and AArch64 Linux ABIs a
// variadic integer travels where a declared one would, so declaring it is the usual way
// (Rust has no stable variadic definitions). It is read only when the flags say a mode was
// passed (O_CREAT/O_TMPFILE), and otherwise passed on unread by the kernel.

/// # Safety
/// libc's `open`.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    let Some(real) = real!(open: OpenFn) else {
        return fail(libc::ENOSYS);
    };
    let existed = exists(libc::AT_FDCWD, path, flags);
    opened(real(path, flags, mode), flags, existed)
}

/// # Safety
/// libc's `open64`.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    let Some(real) = real!(open64: OpenFn) else {
        return fail(libc::ENOSYS);
    };
    let existed = exists(libc::AT_FDCWD, path, flags);
    opened(real(path, flags, mode), flags, existed)
}

/// # Safety
/// libc's `openat`.
#[no_mangle]
pub unsafe extern "C" fn openat(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    let Some(real) = real!(openat: OpenatFn) else {
        return fail(libc::ENOSYS);
    };
    let existed = exists(dir, path, flags);
    opened(real(dir, path, flags, mode), flags, existed)
}

/// # Safety
/// libc's `openat64`.
#[no_mangle]
pub unsafe extern "C" fn openat64(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    let Some(real) = real!(openat64: OpenatFn) else {
        return fail(libc::ENOSYS);
    };
    let existed = exists(dir, path, flags);
    opened(real(dir, path, flags, mode), flags, existed)
}

/// # Safety
/// libc's `creat`.
#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    let Some(real) = real!(open: OpenFn) else {
        return fail(libc::ENOSYS);
    };
    let existed = exists(libc::AT_FDCWD, path, flags);
    opened(real(path, flags, mode), flags, existed)
}

/// # Safety
/// libc's `creat64`.
#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    creat(path, mode)
}

/// # Safety
/// glibc's fortified `open` (`_FORTIFY_SOURCE`).
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    let Some(real) = real!(__open_2: Open2Fn) else {
        return fail(libc::ENOSYS);
    };
    let existed = exists(libc::AT_FDCWD, path, flags);
    opened(real(path, flags), flags, existed)
}

/// # Safety
/// glibc's fortified `open64`.
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    let Some(real) = real!(__open64_2: Open2Fn) else {
        return fail(libc::ENOSYS);
    };
    let existed = exists(libc::AT_FDCWD, path, flags);
    opened(real(path, flags), flags, existed)
}

/// # Safety
/// glibc's fortified `openat`.
#[no_mangle]
pub unsafe extern "C" fn __openat_2(dir: c_int, path: *const c_char, flags: c_int) -> c_int {
    let Some(real) = real!(__openat_2: Openat2Fn) else {
        return fail(libc::ENOSYS);
    };
    let existed = exists(dir, path, flags);
    opened(real(dir, path, flags), flags, existed)
}

/// # Safety
/// glibc's fortified `openat64`.
#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dir: c_int, path: *const c_char, flags: c_int) -> c_int {
    let Some(real) = real!(__openat64_2: Openat2Fn) else {
        return fail(libc::ENOSYS);
    };
    let existed = exists(dir, path, flags);
    opened(real(dir, path, flags), flags, existed)
}

// ---- writing ----

/// `written` bytes of a durable file were written at `offset`: log them (and, for an
/// O_DSYNC descriptor, wait for the level). Returns `written`, or -1/EIO.
fn wrote(tracked: &Tracked, offset: u64, data: &[u8], written: ssize_t, sync: bool) -> ssize_t {
    let logged = guarded(|| {
        let records = conn::write_records(&tracked.path, offset, data)?;
        conn::log(&records, sync)
    });
    match logged {
        Ok(()) => written,
        Err(code) => fail(code) as ssize_t,
    }
}

/// The descriptor's offset after a write of `written` bytes, less them: where they went.
fn offset_before(fd: c_int, written: ssize_t) -> Option<u64> {
    // SAFETY: lseek reads no memory; a failure is reported as -1.
    let end = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
    (end >= written as off_t).then(|| (end - written as off_t) as u64)
}

/// The first `len` bytes of an iovec array, gathered.
///
/// # Safety
/// `iov` points to `count` iovecs whose buffers hold at least `len` bytes in all (the kernel
/// just wrote that many from them).
unsafe fn gather(iov: *const iovec, count: c_int, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    for i in 0..count.max(0) as usize {
        if out.len() >= len {
            break;
        }
        let v = &*iov.add(i);
        let take = v.iov_len.min(len - out.len());
        out.extend_from_slice(std::slice::from_raw_parts(v.iov_base.cast::<u8>(), take));
    }
    out
}

/// # Safety
/// libc's `write`.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    let Some(real) = real!(write: unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t)
    else {
        return fail(libc::ENOSYS) as ssize_t;
    };
    let Some(tracked) = fds::lookup(fd) else {
        return real(fd, buf, count);
    };
    let n = real(fd, buf, count);
    if n <= 0 {
        return n;
    }
    let Some(offset) = offset_before(fd, n) else {
        return fail(libc::EIO) as ssize_t;
    };
    // SAFETY: the kernel read `n` bytes from `buf`.
    let data = std::slice::from_raw_parts(buf.cast::<u8>(), n as usize);
    wrote(&tracked, offset, data, n, tracked.sync)
}

type PwriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t, off_t) -> ssize_t;

unsafe fn pwrite_with(
    real: Option<PwriteFn>,
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
) -> ssize_t {
    let Some(real) = real else {
        return fail(libc::ENOSYS) as ssize_t;
    };
    let Some(tracked) = fds::lookup(fd) else {
        return real(fd, buf, count, offset);
    };
    let n = real(fd, buf, count, offset);
    if n <= 0 {
        return n;
    }
    // SAFETY: the kernel read `n` bytes from `buf`.
    let data = std::slice::from_raw_parts(buf.cast::<u8>(), n as usize);
    wrote(&tracked, offset as u64, data, n, tracked.sync)
}

/// # Safety
/// libc's `pwrite`.
#[no_mangle]
pub unsafe extern "C" fn pwrite(
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
) -> ssize_t {
    pwrite_with(real!(pwrite: PwriteFn), fd, buf, count, offset)
}

/// # Safety
/// libc's `pwrite64`.
#[no_mangle]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
) -> ssize_t {
    pwrite_with(real!(pwrite64: PwriteFn), fd, buf, count, offset)
}

/// # Safety
/// libc's `writev`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t {
    let Some(real) = real!(writev: unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t)
    else {
        return fail(libc::ENOSYS) as ssize_t;
    };
    let Some(tracked) = fds::lookup(fd) else {
        return real(fd, iov, count);
    };
    let n = real(fd, iov, count);
    if n <= 0 {
        return n;
    }
    let Some(offset) = offset_before(fd, n) else {
        return fail(libc::EIO) as ssize_t;
    };
    let data = gather(iov, count, n as usize);
    wrote(&tracked, offset, &data, n, tracked.sync)
}

type PwritevFn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t) -> ssize_t;
type Pwritev2Fn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t, c_int) -> ssize_t;

unsafe fn pwritev_with(
    real: Option<PwritevFn>,
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
) -> ssize_t {
    let Some(real) = real else {
        return fail(libc::ENOSYS) as ssize_t;
    };
    let Some(tracked) = fds::lookup(fd) else {
        return real(fd, iov, count, offset);
    };
    let n = real(fd, iov, count, offset);
    if n <= 0 {
        return n;
    }
    let data = gather(iov, count, n as usize);
    wrote(&tracked, offset as u64, &data, n, tracked.sync)
}

/// # Safety
/// libc's `pwritev`.
#[no_mangle]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
) -> ssize_t {
    pwritev_with(real!(pwritev: PwritevFn), fd, iov, count, offset)
}

/// # Safety
/// libc's `pwritev64`.
#[no_mangle]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
) -> ssize_t {
    pwritev_with(real!(pwritev64: PwritevFn), fd, iov, count, offset)
}

unsafe fn pwritev2_with(
    real: Option<Pwritev2Fn>,
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
    flags: c_int,
) -> ssize_t {
    let Some(real) = real else {
        return fail(libc::ENOSYS) as ssize_t;
    };
    let Some(tracked) = fds::lookup(fd) else {
        return real(fd, iov, count, offset, flags);
    };
    // RWF_DSYNC/RWF_SYNC: acknowledged by the daemon instead of the disk.
    let sync_flags = libc::RWF_DSYNC | libc::RWF_SYNC;
    let n = real(fd, iov, count, offset, flags & !sync_flags);
    if n <= 0 {
        return n;
    }
    let at = if offset == -1 {
        match offset_before(fd, n) {
            Some(at) => at,
            None => return fail(libc::EIO) as ssize_t,
        }
    } else {
        offset as u64
    };
    let data = gather(iov, count, n as usize);
    wrote(
        &tracked,
        at,
        &data,
        n,
        tracked.sync || flags & sync_flags != 0,
    )
}

/// # Safety
/// libc's `pwritev2`.
#[no_mangle]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
    flags: c_int,
) -> ssize_t {
    pwritev2_with(real!(pwritev2: Pwritev2Fn), fd, iov, count, offset, flags)
}

/// # Safety
/// libc's `pwritev64v2`.
#[no_mangle]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
    flags: c_int,
) -> ssize_t {
    pwritev2_with(
        real!(pwritev64v2: Pwritev2Fn),
        fd,
        iov,
        count,
        offset,
        flags,
    )
}

// ---- syncing ----

fn synced() -> c_int {
    match guarded(conn::sync) {
        Ok(()) => 0,
        Err(code) => fail(code),
    }
}

/// # Safety
/// libc's `fsync`.
#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if fds::lookup(fd).is_some() {
        return synced();
    }
    let Some(real) = real!(fsync: unsafe extern "C" fn(c_int) -> c_int) else {
        return fail(libc::ENOSYS);
    };
    real(fd)
}

/// # Safety
/// libc's `fdatasync`.
#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if fds::lookup(fd).is_some() {
        return synced();
    }
    let Some(real) = real!(fdatasync: unsafe extern "C" fn(c_int) -> c_int) else {
        return fail(libc::ENOSYS);
    };
    real(fd)
}

/// A range sync of a durable file: with SYNC_FILE_RANGE_WAIT_AFTER (a wait for the data) it
/// is answered as fdatasync is; without it, it only asks for writeback to start, which the
/// daemon's copy makes moot, and returns at once.
///
/// # Safety
/// libc's `sync_file_range`.
#[no_mangle]
pub unsafe extern "C" fn sync_file_range(
    fd: c_int,
    offset: off_t,
    len: off_t,
    flags: c_uint,
) -> c_int {
    if fds::lookup(fd).is_some() {
        if flags & libc::SYNC_FILE_RANGE_WAIT_AFTER != 0 {
            return synced();
        }
        return 0;
    }
    let Some(real) =
        real!(sync_file_range: unsafe extern "C" fn(c_int, off_t, off_t, c_uint) -> c_int)
    else {
        return fail(libc::ENOSYS);
    };
    real(fd, offset, len, flags)
}

// ---- descriptors ----

/// # Safety
/// libc's `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    fds::remove(fd);
    let Some(real) = real!(close: unsafe extern "C" fn(c_int) -> c_int) else {
        return fail(libc::ENOSYS);
    };
    real(fd)
}

/// `to` now refers to what `from` does (a dup of any kind succeeded).
fn duplicated(from: c_int, to: c_int) {
    if from == to {
        return;
    }
    fds::remove(to);
    if let Some(tracked) = fds::lookup(from) {
        fds::insert(to, tracked);
    }
}

/// # Safety
/// libc's `dup`.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let Some(real) = real!(dup: unsafe extern "C" fn(c_int) -> c_int) else {
        return fail(libc::ENOSYS);
    };
    let new = real(fd);
    if new >= 0 {
        duplicated(fd, new);
    }
    new
}

/// # Safety
/// libc's `dup2`.
#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    let Some(real) = real!(dup2: unsafe extern "C" fn(c_int, c_int) -> c_int) else {
        return fail(libc::ENOSYS);
    };
    let new = real(fd, to);
    if new >= 0 {
        duplicated(fd, new);
    }
    new
}

/// # Safety
/// libc's `dup3`.
#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    let Some(real) = real!(dup3: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int) else {
        return fail(libc::ENOSYS);
    };
    let new = real(fd, to, flags);
    if new >= 0 {
        duplicated(fd, new);
    }
    new
}

type FcntlFn = unsafe extern "C" fn(c_int, c_int, c_long) -> c_int;

unsafe fn fcntl_with(real: Option<FcntlFn>, fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    let Some(real) = real else {
        return fail(libc::ENOSYS);
    };
    let result = real(fd, cmd, arg);
    if result >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
        duplicated(fd, result);
    }
    result
}

// fcntl's third argument is variadic (an int or a pointer); passed on as a register-wide
// integer, as the ABI carries either (see `open`).

/// # Safety
/// libc's `fcntl`.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    fcntl_with(real!(fcntl: FcntlFn), fd, cmd, arg)
}

/// # Safety
/// libc's `fcntl64`.
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    fcntl_with(real!(fcntl64: FcntlFn), fd, cmd, arg)
}

// ---- lengths and names ----

/// Logs `records` (after their change was made) and returns `result`, or -1/EIO. A change of
/// names returns only once its record is at the level ([`RunRecord::waits_for_level`]).
fn logged(records: Vec<RunRecord>, result: c_int) -> c_int {
    if records.is_empty() {
        return result;
    }
    let wait = records.iter().any(RunRecord::waits_for_level);
    match guarded(|| conn::log(&records, wait)) {
        Ok(()) => result,
        Err(code) => fail(code),
    }
}

unsafe fn ftruncate_with(
    real: Option<unsafe extern "C" fn(c_int, off_t) -> c_int>,
    fd: c_int,
    len: off_t,
) -> c_int {
    let Some(real) = real else {
        return fail(libc::ENOSYS);
    };
    let result = real(fd, len);
    match fds::lookup(fd) {
        Some(tracked) if result == 0 => logged(
            vec![RunRecord::SetLen {
                path: ByteBuf::from(tracked.path.clone()),
                size: len as u64,
            }],
            0,
        ),
        _ => result,
    }
}

/// # Safety
/// libc's `ftruncate`.
#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    ftruncate_with(
        real!(ftruncate: unsafe extern "C" fn(c_int, off_t) -> c_int),
        fd,
        len,
    )
}

/// # Safety
/// libc's `ftruncate64`.
#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    ftruncate_with(
        real!(ftruncate64: unsafe extern "C" fn(c_int, off_t) -> c_int),
        fd,
        len,
    )
}

/// The canonical name of `path` under `dir`, durable or not.
unsafe fn durable_name_any(dir: c_int, path: *const c_char) -> Option<Vec<u8>> {
    if path.is_null() {
        return None;
    }
    let saved = errno();
    // SAFETY: the program passed a NUL-terminated path (libc requires it).
    let name = paths::of_name(dir, CStr::from_ptr(path), false);
    set_errno(saved);
    name
}

/// The durable canonical name of `path` under `dir`, if it is one.
unsafe fn durable_name(dir: c_int, path: *const c_char, follow: bool) -> Option<Vec<u8>> {
    let settings = conn::settings()?;
    if path.is_null() {
        return None;
    }
    let saved = errno();
    // SAFETY: the program passed a NUL-terminated path (libc requires it).
    let name = paths::of_name(dir, CStr::from_ptr(path), follow);
    set_errno(saved);
    name.filter(|name| settings.covers(name))
}

unsafe fn truncate_with(
    real: Option<unsafe extern "C" fn(*const c_char, off_t) -> c_int>,
    path: *const c_char,
    len: off_t,
) -> c_int {
    let Some(real) = real else {
        return fail(libc::ENOSYS);
    };
    let result = real(path, len);
    if result != 0 {
        return result;
    }
    match durable_name(libc::AT_FDCWD, path, true) {
        Some(name) => logged(
            vec![RunRecord::SetLen {
                path: ByteBuf::from(name),
                size: len as u64,
            }],
            0,
        ),
        None => result,
    }
}

/// # Safety
/// libc's `truncate`.
#[no_mangle]
pub unsafe extern "C" fn truncate(path: *const c_char, len: off_t) -> c_int {
    truncate_with(
        real!(truncate: unsafe extern "C" fn(*const c_char, off_t) -> c_int),
        path,
        len,
    )
}

/// # Safety
/// libc's `truncate64`.
#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: off_t) -> c_int {
    truncate_with(
        real!(truncate64: unsafe extern "C" fn(*const c_char, off_t) -> c_int),
        path,
        len,
    )
}

/// Whether `path` is a regular file (not following a symlink).
fn is_file(path: &[u8]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    std::fs::symlink_metadata(std::ffi::OsStr::from_bytes(path)).is_ok_and(|m| m.is_file())
}

/// Makes a rename durable before it is logged: the directories of both names.
fn rename_durable(from: &[u8], to: &[u8]) -> std::io::Result<()> {
    sync_path(parent(to), false)?;
    if parent(from) != parent(to) {
        sync_path(parent(from), false)?;
    }
    Ok(())
}

unsafe fn renamed(
    old_dir: c_int,
    old: *const c_char,
    new_dir: c_int,
    new: *const c_char,
    flags: c_uint,
    call: impl FnOnce() -> c_int,
) -> c_int {
    let from = durable_name(old_dir, old, false);
    let to = durable_name(new_dir, new, false);
    if (from.is_some() || to.is_some()) && flags & libc::RENAME_EXCHANGE != 0 {
        return fail(libc::EINVAL); // not logged; programs fall back to a plain rename
    }
    // The file's data reaches the disk under its old name before the name changes (the log
    // then never needs to follow a name that the disk has and its data lacks).
    let source = match (&from, &to) {
        (Some(from), _) => Some(from.clone()),
        (None, Some(_)) => durable_name_any(old_dir, old),
        (None, None) => None,
    };
    if let Some(source) = source.filter(|s| is_file(s)) {
        if let Err(e) = sync_path(&source, true) {
            return fail(e.raw_os_error().unwrap_or(libc::EIO));
        }
    }
    if let Err(code) = guarded(|| end_replaced(from.as_deref(), to.as_deref())) {
        return fail(code);
    }
    let result = call();
    if result != 0 {
        return result;
    }
    let (synced, records) = match (from, to) {
        (Some(from), Some(to)) => {
            fds::renamed(&from, &to);
            (
                rename_durable(&from, &to),
                vec![RunRecord::Rename {
                    from: ByteBuf::from(from),
                    to: ByteBuf::from(to),
                }],
            )
        }
        (Some(from), None) => (
            sync_path(parent(&from), false),
            vec![RunRecord::Remove {
                path: ByteBuf::from(from),
            }],
        ),
        (None, Some(to)) => (
            sync_path(parent(&to), false),
            vec![RunRecord::Create {
                path: ByteBuf::from(to),
                mode: 0o600,
            }],
        ),
        (None, None) => (Ok(()), Vec::new()),
    };
    if let Err(e) = synced {
        return fail(e.raw_os_error().unwrap_or(libc::EIO));
    }
    logged(records, 0)
}

/// Before a rename from `from` (`None`: from outside the durable directories) onto `to` that
/// replaces a durable file: that file synced, then its end logged at the level
/// ([`RunRecord::replaced_end`]), so a crash that lands the rename and loses its record never
/// lets replay write the old file's records into the new one.
fn end_replaced(from: Option<&[u8]>, to: Option<&[u8]>) -> std::io::Result<()> {
    let Some(to) = to else { return Ok(()) };
    let change = match from {
        Some(from) => RunRecord::Rename {
            from: ByteBuf::from(from.to_vec()),
            to: ByteBuf::from(to.to_vec()),
        },
        None => RunRecord::Create {
            path: ByteBuf::from(to.to_vec()),
            mode: 0o600,
        },
    };
    let Some(end) = change.replaced_end(is_file) else {
        return Ok(());
    };
    sync_path(to, true)?;
    conn::log(&[end], true)
}

/// # Safety
/// libc's `rename`.
#[no_mangle]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    let Some(real) = real!(rename: unsafe extern "C" fn(*const c_char, *const c_char) -> c_int)
    else {
        return fail(libc::ENOSYS);
    };
    renamed(libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0, || {
        real(old, new)
    })
}

/// # Safety
/// libc's `renameat`.
#[no_mangle]
pub unsafe extern "C" fn renameat(
    od: c_int,
    old: *const c_char,
    nd: c_int,
    new: *const c_char,
) -> c_int {
    let Some(real) =
        real!(renameat: unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char) -> c_int)
    else {
        return fail(libc::ENOSYS);
    };
    renamed(od, old, nd, new, 0, || real(od, old, nd, new))
}

/// # Safety
/// libc's `renameat2`.
#[no_mangle]
pub unsafe extern "C" fn renameat2(
    od: c_int,
    old: *const c_char,
    nd: c_int,
    new: *const c_char,
    flags: c_uint,
) -> c_int {
    let Some(real) = real!(renameat2: unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int)
    else {
        return fail(libc::ENOSYS);
    };
    renamed(od, old, nd, new, flags, || real(od, old, nd, new, flags))
}

unsafe fn removed(dir: c_int, path: *const c_char, call: impl FnOnce() -> c_int) -> c_int {
    let name = durable_name(dir, path, false);
    let result = call();
    match name {
        Some(name) if result == 0 => match sync_path(parent(&name), false) {
            Ok(()) => logged(
                vec![RunRecord::Remove {
                    path: ByteBuf::from(name),
                }],
                0,
            ),
            Err(e) => fail(e.raw_os_error().unwrap_or(libc::EIO)),
        },
        _ => result,
    }
}

/// # Safety
/// libc's `unlink`.
#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    let Some(real) = real!(unlink: unsafe extern "C" fn(*const c_char) -> c_int) else {
        return fail(libc::ENOSYS);
    };
    removed(libc::AT_FDCWD, path, || real(path))
}

/// # Safety
/// libc's `unlinkat`.
#[no_mangle]
pub unsafe extern "C" fn unlinkat(dir: c_int, path: *const c_char, flags: c_int) -> c_int {
    let Some(real) = real!(unlinkat: unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int)
    else {
        return fail(libc::ENOSYS);
    };
    removed(dir, path, || real(dir, path, flags))
}

/// # Safety
/// libc's `rmdir`.
#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    let Some(real) = real!(rmdir: unsafe extern "C" fn(*const c_char) -> c_int) else {
        return fail(libc::ENOSYS);
    };
    removed(libc::AT_FDCWD, path, || real(path))
}
