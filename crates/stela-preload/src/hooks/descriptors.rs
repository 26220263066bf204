//! Descriptors: close, dup, dup2, dup3 and fcntl's F_DUPFD forms keep the table of durable
//! descriptors in step with the process's own.

use super::fail;
use crate::fds;
use libc::{c_int, c_long};

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
