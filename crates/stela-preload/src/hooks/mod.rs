//! The functions this library exports under libc's names. Each finds libc's own with
//! `dlsym(RTLD_NEXT)`, performs the call, and, for a durable file, logs what it changed
//! (after the change: see `conn`). A hook never unwinds into C: a panic becomes EIO.
//!
//! Covered: open/open64/openat/openat64/creat/creat64 and their fortified forms; write,
//! pwrite(64), writev, pwritev(64), pwritev2; fsync, fdatasync, sync_file_range; close, dup,
//! dup2, dup3, fcntl(F_DUPFD, F_DUPFD_CLOEXEC); ftruncate, truncate; rename, renameat,
//! renameat2, unlink, unlinkat, rmdir. Not covered (said in docs/POSTGRES.md): stdio streams
//! (fopen opens inside libc), memory-mapped writes, descriptors passed across exec, fallocate.
//!
//! Files by what they own: [`open`] (opening and creating: which descriptors become tracked
//! durable files), [`write`] (writes of every shape, logged after the kernel took them),
//! [`sync`] (fsync, fdatasync, sync_file_range answered from the daemon), [`descriptors`]
//! (close, dup, fcntl: the descriptor table kept in step), [`names`] (truncations, renames and
//! removals, each made durable before it is logged). This file keeps what they share: finding
//! libc's definitions, errno, the guard that turns a panic into EIO, and a real fsync by name.

use libc::{c_char, c_int, mode_t};

/// The C signature of `open` (its variadic mode declared: see `open::open`).
type OpenFn = unsafe extern "C" fn(*const c_char, c_int, mode_t) -> c_int;

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

pub mod descriptors;
pub mod names;
pub mod open;
pub mod sync;
pub mod write;

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
