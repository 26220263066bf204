//! Writing: write, pwrite(64), writev, pwritev(64), pwritev2. The kernel takes the write
//! first; then the bytes it reports written to a durable file are logged at the offset they
//! went to (and, for an O_DSYNC descriptor, waited for at the level).

use super::{fail, guarded};
use crate::conn;
use crate::fds::{self, Tracked};
use libc::{c_int, c_void, iovec, off_t, size_t, ssize_t};

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

/// Where a write's bytes went: at the offset the call gave, or at the descriptor's own
/// offset (which the write advanced past them).
#[derive(Clone, Copy)]
enum At {
    Given(off_t),
    Current,
}

/// The memory a write took its bytes from: one buffer, or an iovec array of `count`.
#[derive(Clone, Copy)]
enum Bytes {
    Buf(*const c_void),
    Iov(*const iovec, c_int),
}

/// Every write hook's one path: `call` the real function (`real`, which the hook looked up:
/// ENOSYS without it); when `fd` is a tracked durable file and the call wrote, log the bytes
/// it reports written (taken from `bytes`, at `at`) and, for an O_DSYNC descriptor or a
/// `sync` call, wait for them at the level.
///
/// # Safety
/// `call` calls `real` with the hook's own arguments, and `bytes` names the memory those
/// arguments hand it.
unsafe fn write_through<F>(
    real: Option<F>,
    fd: c_int,
    call: impl FnOnce(F) -> ssize_t,
    at: At,
    bytes: Bytes,
    sync: bool,
) -> ssize_t {
    let Some(real) = real else {
        return fail(libc::ENOSYS) as ssize_t;
    };
    let Some(tracked) = fds::lookup(fd) else {
        return call(real);
    };
    let n = call(real);
    if n <= 0 {
        return n;
    }
    let offset = match at {
        At::Given(offset) => offset as u64,
        At::Current => match offset_before(fd, n) {
            Some(offset) => offset,
            None => return fail(libc::EIO) as ssize_t,
        },
    };
    let gathered;
    let data = match bytes {
        // SAFETY: the kernel read `n` bytes from `buf`.
        Bytes::Buf(buf) => std::slice::from_raw_parts(buf.cast::<u8>(), n as usize),
        Bytes::Iov(iov, count) => {
            gathered = gather(iov, count, n as usize);
            &gathered[..]
        }
    };
    wrote(&tracked, offset, data, n, tracked.sync || sync)
}

type WriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;

/// # Safety
/// libc's `write`.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    let call = |real: WriteFn| real(fd, buf, count);
    let bytes = Bytes::Buf(buf);
    write_through(real!(write: WriteFn), fd, call, At::Current, bytes, false)
}

type PwriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t, off_t) -> ssize_t;

unsafe fn pwrite_with(
    real: Option<PwriteFn>,
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
) -> ssize_t {
    let call = |real: PwriteFn| real(fd, buf, count, offset);
    write_through(real, fd, call, At::Given(offset), Bytes::Buf(buf), false)
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

type WritevFn = unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t;

/// # Safety
/// libc's `writev`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t {
    let call = |real: WritevFn| real(fd, iov, count);
    let bytes = Bytes::Iov(iov, count);
    write_through(real!(writev: WritevFn), fd, call, At::Current, bytes, false)
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
    let call = |real: PwritevFn| real(fd, iov, count, offset);
    let bytes = Bytes::Iov(iov, count);
    write_through(real, fd, call, At::Given(offset), bytes, false)
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
    // RWF_DSYNC/RWF_SYNC: acknowledged by the daemon instead of the disk.
    let sync_flags = libc::RWF_DSYNC | libc::RWF_SYNC;
    let call = |real: Pwritev2Fn| real(fd, iov, count, offset, flags & !sync_flags);
    // An offset of -1 writes at the descriptor's offset, as writev does.
    let at = if offset == -1 {
        At::Current
    } else {
        At::Given(offset)
    };
    let bytes = Bytes::Iov(iov, count);
    write_through(real, fd, call, at, bytes, flags & sync_flags != 0)
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
