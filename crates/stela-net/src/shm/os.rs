//! The Linux primitives under the ring: a sealed memfd, a shared mapping of it, an eventfd
//! doorbell, futex wait and wake on a word of a shared mapping, and passing descriptors over a
//! Unix socket (SCM_RIGHTS).
//!
//! Invariants: a [`Mapping`] is valid, readable and writable for its whole length until it is
//! dropped, and nothing else unmaps it; a memfd made by [`create_sealed_memfd`] can never change
//! size (`F_SEAL_SHRINK | F_SEAL_GROW`, and `F_SEAL_SEAL` so no one can lift that), so a peer
//! that holds the descriptor cannot make our mapping fault (SIGBUS) by truncating the file.
//! Every descriptor is created close-on-exec.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

/// At most this many descriptors travel in one message.
pub const MAX_FDS: usize = 8;

/// The seals every ring memfd carries.
pub const RING_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// Creates an anonymous memory file of `len` bytes (zeroed) and seals its size.
///
/// # Errors
/// The failing call's error (`memfd_create`, `ftruncate`, `fcntl(F_ADD_SEALS)`).
pub fn create_sealed_memfd(name: &CStr, len: u64) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let fd = check(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    } as libc::c_int)?;
    // SAFETY: memfd_create just returned this descriptor and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd length"))?;
    // SAFETY: plain syscalls on a descriptor we own.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, RING_SEALS) })?;
    Ok(fd)
}

/// The size of the file behind `fd`.
pub fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `stat` points to writable memory of the right type; fstat fills it on success.
    check(unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so it initialised `stat`.
    let stat = unsafe { stat.assume_init() };
    Ok(stat.st_size as u64)
}

/// The seals of a memfd (`F_GET_SEALS`).
pub fn seals(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: a plain syscall on a descriptor the caller keeps open.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

/// A shared, read-write mapping of a file, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is a raw region of memory; it has no thread affinity. Which thread may touch
// which bytes, and how, is the ring protocol's business (atomics for shared words, raw copies
// for data), not the owner's.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out the pointer and the length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd` shared, readable and writable.
    ///
    /// # Errors
    /// `mmap`'s error, or `InvalidInput` for `len == 0`.
    pub fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: we ask for a fresh mapping (address hint null), so no existing memory is
        // affected; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).expect("mmap never returns null on success");
        Ok(Mapping { ptr, len })
    }

    /// The first byte (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned and no one else unmaps them; after
        // drop nothing can reach the pointer (every user holds the Mapping, often in an Arc).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A non-blocking, close-on-exec eventfd (counter starts at 0).
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: a plain syscall; the result is checked.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: eventfd just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to an eventfd, waking whoever polls it. A full counter (EAGAIN) already means
/// "signalled", so it counts as success.
pub fn eventfd_signal(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one = 1u64.to_ne_bytes();
    loop {
        // SAFETY: writes 8 bytes from a live local buffer to a descriptor the caller keeps open.
        let n = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if n >= 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(()),
            _ => return Err(error),
        }
    }
}

/// Reads and resets an eventfd's counter; 0 when it was not signalled.
pub fn eventfd_drain(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut count = [0u8; 8];
    loop {
        // SAFETY: reads at most 8 bytes into a live local buffer.
        let n = unsafe { libc::read(fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
        if n >= 0 {
            return Ok(u64::from_ne_bytes(count));
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(error),
        }
    }
}

/// Sleeps while `word` holds `expected` (FUTEX_WAIT, not private: the word may be in a mapping
/// shared with another process). Returns on a wake, a signal, a changed value or spuriously: the
/// caller re-checks its condition in every case.
pub fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: `word` is a live, 4-aligned u32 for the duration of the call; FUTEX_WAIT only
    // reads it; a null timeout means no timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

/// Wakes every thread (in any process) sleeping in [`futex_wait`] on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, 4-aligned u32; FUTEX_WAKE does not access it.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// As [`futex_wait`], woken only by a [`futex_wake_bitset`] whose mask shares a bit with `mask`
/// (the wake board: many clients sleep on one word, each on its own bit).
pub fn futex_wait_bitset(word: &AtomicU32, expected: u32, mask: u32) {
    // SAFETY: as in `futex_wait`; FUTEX_WAIT_BITSET takes no timeout (null), an unused address
    // and the mask as its last argument.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT_BITSET,
            expected,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            mask,
        )
    };
}

/// Wakes every thread sleeping in [`futex_wait_bitset`] on `word` with a bit of `mask`, in one
/// system call.
pub fn futex_wake_bitset(word: &AtomicU32, mask: u32) {
    // SAFETY: `word` is a live, 4-aligned u32; FUTEX_WAKE_BITSET does not access it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE_BITSET,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            mask,
        )
    };
}

/// A cmsg buffer, aligned for `cmsghdr`, large enough for [`MAX_FDS`] descriptors.
#[repr(C, align(8))]
struct CmsgBuffer([u8; 64]);

fn cmsg_space(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE is pure arithmetic.
    unsafe { libc::CMSG_SPACE((fds * size_of::<RawFd>()) as u32) as usize }
}

/// Sends `bytes` with `fds` attached (SCM_RIGHTS) on a Unix stream socket; returns the bytes
/// sent. The descriptors go with the first byte: on `Ok(n)` with `n < bytes.len()` send the
/// rest without them. On a non-blocking socket that is full this returns `WouldBlock` and
/// nothing was sent; the caller still owns `fds` (they are only borrowed) and sends again later.
///
/// # Errors
/// `InvalidInput` for an empty `bytes` (a descriptor needs a byte to travel with) or more than
/// [`MAX_FDS`] descriptors; otherwise `sendmsg`'s error.
pub fn send_with_fds(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    if bytes.is_empty() || fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "send_with_fds needs at least one byte and at most MAX_FDS descriptors",
        ));
    }
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = CmsgBuffer([0; 64]);
    // SAFETY: msghdr is plain data; all-zero is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let space = cmsg_space(fds.len());
        debug_assert!(space <= control.0.len());
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `space` writable, aligned bytes, enough for one cmsghdr
        // with `fds.len()` descriptors (CMSG_SPACE); CMSG_FIRSTHDR returns a pointer inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN((fds.len() * size_of::<RawFd>()) as u32) as usize;
            let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                data.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: `msg` points at the live iovec and control buffer above; sendmsg only reads
        // them. MSG_NOSIGNAL: a closed peer is an EPIPE error, not a SIGPIPE.
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Receives into `buf` from a Unix stream socket, appending any descriptors that came with the
/// bytes to `fds` (close-on-exec). Returns the bytes received (0: end of stream). On a stream
/// socket a read that returns descriptors ends with the last byte of the message they were sent
/// with (the kernel stops there), though bytes sent before that message may come in the same
/// read: so a reader that parses frames should queue the descriptors it receives and hand them
/// to the next frame that expects some.
///
/// # Errors
/// `recvmsg`'s error (`WouldBlock` on an empty non-blocking socket); `InvalidData` if the
/// kernel had to drop descriptors (more than [`MAX_FDS`]); the ones that did arrive are closed.
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = CmsgBuffer([0; 64]);
    // SAFETY: msghdr is plain data; all-zero is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = cmsg_space(MAX_FDS);
    let n = loop {
        // SAFETY: `msg` points at the live `buf` (through iov) and control buffer, both
        // writable for the lengths given.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    let mut received = Vec::new();
    // SAFETY: the kernel filled msg_control with msg_controllen bytes of well-formed cmsghdrs;
    // CMSG_FIRSTHDR/NXTHDR walk them within that length; each SCM_RIGHTS payload holds
    // (cmsg_len - CMSG_LEN(0)) / 4 descriptors that are now ours (read unaligned).
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..payload / size_of::<RawFd>() {
                    received.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        drop(received);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "descriptors were dropped: more than MAX_FDS in one message",
        ));
    }
    fds.extend(received);
    Ok(n)
}

/// The size of a memfd a peer sent, once it is known to be sealed against resizing (a peer
/// holding a descriptor it could shrink could make our mapping of it fault): the check every
/// shared region (ring, wake board) passes before it is mapped.
#[cfg(not(stela_loom))]
pub(crate) fn sealed_size(memfd: BorrowedFd<'_>) -> Result<u64, super::error::ShmError> {
    use super::error::ShmError;
    let found = seals(memfd).map_err(ShmError::io("fcntl(F_GET_SEALS)"))?;
    if found & RING_SEALS != RING_SEALS {
        return Err(ShmError::Unsealed {
            seals: found as u32,
        });
    }
    file_size(memfd).map_err(ShmError::io("fstat"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_sealed_memfd_cannot_change_size_and_its_mapping_is_shared() {
        let fd = create_sealed_memfd(c"test", 8192).unwrap();
        assert_eq!(file_size(fd.as_fd()).unwrap(), 8192);
        assert_eq!(seals(fd.as_fd()).unwrap() & RING_SEALS, RING_SEALS);
        // SAFETY: ftruncate on our own descriptor.
        let shrink = unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) };
        assert_eq!(shrink, -1, "a sealed memfd must refuse to shrink");
        // SAFETY: fcntl on our own descriptor.
        let unseal = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, 0) };
        assert_eq!(unseal, -1, "F_SEAL_SEAL must refuse further seal changes");
        let a = Mapping::map(fd.as_fd(), 8192).unwrap();
        let b = Mapping::map(fd.as_fd(), 8192).unwrap();
        // SAFETY: both mappings are 8192 bytes long and alive; this thread is the only user.
        unsafe {
            a.as_ptr().add(5000).write(42);
            assert_eq!(b.as_ptr().add(5000).read(), 42);
        }
    }

    #[test]
    fn eventfd_counts_and_drains() {
        let fd = eventfd().unwrap();
        assert_eq!(eventfd_drain(fd.as_fd()).unwrap(), 0);
        eventfd_signal(fd.as_fd()).unwrap();
        eventfd_signal(fd.as_fd()).unwrap();
        assert_eq!(eventfd_drain(fd.as_fd()).unwrap(), 2);
        assert_eq!(eventfd_drain(fd.as_fd()).unwrap(), 0);
    }

    #[test]
    fn descriptors_travel_with_their_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let memfd = create_sealed_memfd(c"passed", 4096).unwrap();
        let efd = eventfd().unwrap();
        // Bytes sent before the message may share its read; the read stops after it, so the
        // descriptors arrive no later than the message's last byte.
        assert_eq!(send_with_fds(a.as_fd(), b"x", &[]).unwrap(), 1);
        assert_eq!(
            send_with_fds(a.as_fd(), b"hello", &[memfd.as_fd(), efd.as_fd()]).unwrap(),
            5
        );
        assert_eq!(send_with_fds(a.as_fd(), b"after", &[]).unwrap(), 5);
        let mut fds = Vec::new();
        let mut buf = [0u8; 16];
        let n = recv_with_fds(b.as_fd(), &mut buf, &mut fds).unwrap();
        assert!(buf[..n].ends_with(b"hello"), "{:?}", &buf[..n]);
        assert_eq!(fds.len(), 2);
        assert_eq!(recv_with_fds(b.as_fd(), &mut buf, &mut fds).unwrap(), 5);
        assert_eq!(&buf[..5], b"after");
        assert_eq!(fds.len(), 2, "no descriptors with the later bytes");
        // The received memfd is the same file: its size and seals came along.
        assert_eq!(file_size(fds[0].as_fd()).unwrap(), 4096);
        assert_eq!(seals(fds[0].as_fd()).unwrap() & RING_SEALS, RING_SEALS);
        eventfd_signal(fds[1].as_fd()).unwrap();
        assert_eq!(eventfd_drain(efd.as_fd()).unwrap(), 1);
    }

    #[test]
    fn a_full_non_blocking_socket_reports_would_block_and_keeps_the_descriptors() {
        let (a, _b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let memfd = create_sealed_memfd(c"kept", 4096).unwrap();
        let chunk = vec![0u8; 64 << 10];
        loop {
            match send_with_fds(a.as_fd(), &chunk, &[]) {
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        let error = send_with_fds(a.as_fd(), b"ring", &[memfd.as_fd()]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
        // Still ours and still open.
        assert_eq!(file_size(memfd.as_fd()).unwrap(), 4096);
    }
}
