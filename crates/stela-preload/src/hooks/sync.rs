//! Syncing: fsync, fdatasync and sync_file_range of a durable file are answered with the
//! daemon's acknowledgement at the level instead of the disk's. Any other file's sync is the
//! disk's own, after a barrier ([`conn::barrier`]): at `buffered` the log is made durable
//! first, so nothing the program makes durable by itself runs ahead of the log.

use super::{fail, guarded};
use crate::conn;
use crate::fds;
use libc::{c_int, c_uint, off_t};

fn synced() -> c_int {
    match guarded(conn::sync) {
        Ok(()) => 0,
        Err(code) => fail(code),
    }
}

/// The barrier before a native sync; `Err` holds what the sync must return instead.
fn barrier() -> Result<(), c_int> {
    guarded(conn::barrier).map_err(fail)
}

/// # Safety
/// libc's `fsync`.
#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if fds::lookup(fd).is_some() {
        return synced();
    }
    if let Err(failed) = barrier() {
        return failed;
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
    if let Err(failed) = barrier() {
        return failed;
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
    if flags & libc::SYNC_FILE_RANGE_WAIT_AFTER != 0 {
        if let Err(failed) = barrier() {
            return failed;
        }
    }
    let Some(real) =
        real!(sync_file_range: unsafe extern "C" fn(c_int, off_t, off_t, c_uint) -> c_int)
    else {
        return fail(libc::ENOSYS);
    };
    real(fd, offset, len, flags)
}
