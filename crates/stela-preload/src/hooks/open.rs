//! Opening: open, openat, creat and their 64-bit and fortified forms. An open of a durable
//! file makes its creation durable and logs it (and a truncation), strips O_DSYNC/O_SYNC (the
//! daemon acknowledges its writes instead) and enters the descriptor in the table.

use super::{errno, fail, guarded, parent, set_errno, sync_path, OpenFn};
use crate::conn;
use crate::fds::{self, Tracked};
use crate::paths;
use libc::{c_char, c_int, mode_t};
use serde_bytes::ByteBuf;
use std::sync::Arc;
use stela_run::RunRecord;

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
