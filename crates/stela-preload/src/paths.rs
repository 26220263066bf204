//! Canonical absolute names of the files the program names, as the log records them.
//!
//! Owns the resolution of a descriptor or a (directory descriptor, path) pair to the path the
//! settings' durable directories are compared with: directories' symlinks resolved, the last
//! component kept as named (a rename or unlink acts on the name, not on what a symlink there
//! points to).

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;

/// The path the kernel has for descriptor `fd` (`/proc/self/fd/N`); `None` for anything that
/// is not a file of a directory tree (a socket, a pipe, an unlinked file).
pub fn of_fd(fd: i32) -> Option<Vec<u8>> {
    let link = format!("/proc/self/fd/{fd}");
    let target = std::fs::read_link(link).ok()?;
    let bytes = target.as_os_str().as_bytes();
    if !bytes.starts_with(b"/") || bytes.ends_with(b" (deleted)") {
        return None;
    }
    Some(bytes.to_vec())
}

fn realpath(path: &[u8]) -> Option<Vec<u8>> {
    let path = CString::new(path).ok()?;
    // SAFETY: `path` is NUL-terminated; with a null buffer realpath returns memory it
    // allocated with malloc (or null), which we copy and free.
    unsafe {
        let resolved = libc::realpath(path.as_ptr(), std::ptr::null_mut());
        if resolved.is_null() {
            return None;
        }
        let bytes = CStr::from_ptr(resolved).to_bytes().to_vec();
        libc::free(resolved.cast());
        Some(bytes)
    }
}

/// The canonical name of `path` relative to `dirfd` (`AT_FDCWD`: the working directory),
/// with the directories resolved and the last component kept; `follow`: resolve the last
/// component too (truncate follows a symlink). `None` if the directory cannot be resolved.
pub fn of_name(dirfd: i32, path: &CStr, follow: bool) -> Option<Vec<u8>> {
    let path = path.to_bytes();
    let mut absolute = if path.starts_with(b"/") {
        Vec::new()
    } else if dirfd == libc::AT_FDCWD {
        let mut cwd = std::env::current_dir()
            .ok()?
            .as_os_str()
            .as_bytes()
            .to_vec();
        cwd.push(b'/');
        cwd
    } else {
        let mut dir = of_fd(dirfd)?;
        dir.push(b'/');
        dir
    };
    absolute.extend_from_slice(path);
    while absolute.len() > 1 && absolute.ends_with(b"/") {
        absolute.pop();
    }
    if follow {
        return realpath(&absolute);
    }
    let cut = absolute.iter().rposition(|&b| b == b'/')?;
    let (dir, name) = (&absolute[..cut.max(1)], &absolute[cut + 1..]);
    if name.is_empty() || name == b"." || name == b".." {
        return realpath(&absolute);
    }
    let mut canonical = realpath(dir)?;
    if canonical != b"/" {
        canonical.push(b'/');
    }
    canonical.extend_from_slice(name);
    Some(canonical)
}
