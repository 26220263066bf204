//! Lengths and names: ftruncate, truncate, rename(at/at2), unlink(at), rmdir. Each change is
//! made first, made durable where a crash could lose it (the directories of a rename, the end of
//! a replaced file), then logged; a change of names returns once its record is at the level.

use super::{errno, fail, guarded, parent, set_errno, sync_path};
use crate::conn;
use crate::fds;
use crate::paths;
use libc::{c_char, c_int, c_uint, off_t};
use serde_bytes::ByteBuf;
use std::ffi::CStr;
use stela_run::RunRecord;

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
