//! The ring region as the two ends see it: the header words as atomics, raw copies in and out
//! of the data area and the result slots, the futex on `wake`, and the doorbell.
//!
//! Normally the region is a [`Mapping`] of the ring's memfd. Under `--cfg stela_loom` it is an
//! in-memory stand-in with the same surface: loom atomics for the header words, one
//! `loom::cell::UnsafeCell` per 8-byte word of the data area and per result slot (so loom
//! reports any read of bytes the other side may be writing), and the futex and the eventfd
//! modelled with a loom mutex and condition variable.
//!
//! Invariants (both flavours): the header words are only ever accessed as atomics, by both
//! processes; the data area and the slots only through [`Region::read_data`],
//! [`Region::write_data`], [`Region::read_result`] and [`Region::write_result`], which copy
//! through raw pointers and never hand out a reference into memory the peer may write. Every
//! offset they take is checked against the layout (an out-of-range offset is a bug on our
//! side: it panics rather than touch memory outside the region).

#[cfg(not(stela_loom))]
pub(crate) use real::{Doorbell, Region};

#[cfg(stela_loom)]
pub use model::Doorbell;
#[cfg(stela_loom)]
pub(crate) use model::Region;

#[cfg(not(stela_loom))]
mod real {
    use super::super::os::{self, Mapping};
    use super::super::sync::{AtomicU32, AtomicU64};
    use std::io;
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
    use std::sync::Arc;
    use stela_proto::ring::*;

    /// A mapped ring region. Cloning shares the mapping.
    #[derive(Clone, Debug)]
    pub(crate) struct Region {
        map: Arc<Mapping>,
        layout: RingLayout,
    }

    impl Region {
        /// Wraps a mapping of at least `layout.region_bytes()` bytes.
        pub(crate) fn new(map: Mapping, layout: RingLayout) -> Region {
            assert!(map.len() as u64 >= layout.region_bytes());
            Region {
                map: Arc::new(map),
                layout,
            }
        }

        pub(crate) fn layout(&self) -> RingLayout {
            self.layout
        }

        fn word64(&self, offset: usize) -> &AtomicU64 {
            debug_assert!(offset.is_multiple_of(8) && offset + 8 <= HEADER_BYTES);
            // SAFETY: the mapping is page-aligned and `offset` is a multiple of 8 inside the
            // header page, so the pointer is valid and aligned for an AtomicU64 for as long as
            // `self` (which keeps the mapping) lives. Both processes access this word only
            // with atomic instructions (the ring protocol), which is what from_ptr requires; a
            // misbehaving peer can at worst store garbage values, which the readers check.
            unsafe { AtomicU64::from_ptr(self.map.as_ptr().add(offset).cast()) }
        }

        fn word32(&self, offset: usize) -> &AtomicU32 {
            debug_assert!(offset.is_multiple_of(4) && offset + 4 <= HEADER_BYTES);
            // SAFETY: as in `word64`, for a 4-aligned u32 inside the header page.
            unsafe { AtomicU32::from_ptr(self.map.as_ptr().add(offset).cast()) }
        }

        pub(crate) fn tail(&self) -> &AtomicU64 {
            self.word64(TAIL_OFFSET)
        }
        pub(crate) fn client_waiting(&self) -> &AtomicU32 {
            self.word32(CLIENT_WAITING_OFFSET)
        }
        /// Line 0's board seat (written once, by the daemon, before the client maps the ring).
        pub(crate) fn board_seat(&self) -> &AtomicU32 {
            self.word32(BOARD_SEAT_OFFSET)
        }
        pub(crate) fn head(&self) -> &AtomicU64 {
            self.word64(HEAD_OFFSET)
        }
        pub(crate) fn daemon_asleep(&self) -> &AtomicU32 {
            self.word32(DAEMON_ASLEEP_OFFSET)
        }
        pub(crate) fn done_seq(&self) -> &AtomicU64 {
            self.word64(DONE_SEQ_OFFSET)
        }
        pub(crate) fn wake(&self) -> &AtomicU32 {
            self.word32(WAKE_OFFSET)
        }
        pub(crate) fn fault(&self) -> &AtomicU32 {
            self.word32(FAULT_OFFSET)
        }
        pub(crate) fn fault_seq(&self) -> &AtomicU64 {
            self.word64(FAULT_SEQ_OFFSET)
        }

        /// Copies header line 0 out of a mapping not yet checked (the client's first look).
        pub(crate) fn line0_of(map: &Mapping) -> [u8; LINE_BYTES] {
            assert!(map.len() >= LINE_BYTES);
            let mut line = [0u8; LINE_BYTES];
            // SAFETY: the mapping holds at least LINE_BYTES bytes; `line` is private memory.
            unsafe { std::ptr::copy_nonoverlapping(map.as_ptr(), line.as_mut_ptr(), LINE_BYTES) };
            line
        }

        /// Writes header line 0 (only the daemon, before anyone else has the memfd).
        pub(crate) fn write_line0(&self, line: &[u8; LINE_BYTES]) {
            // SAFETY: the region is at least a page long; nobody else can see it yet.
            unsafe { std::ptr::copy_nonoverlapping(line.as_ptr(), self.map.as_ptr(), LINE_BYTES) };
        }

        fn data_ptr(&self, position: usize, len: usize) -> *mut u8 {
            assert!(
                position as u64 + len as u64 <= self.layout.data_bytes,
                "data access {position}+{len} outside the area"
            );
            // SAFETY: DATA_OFFSET + position + len <= region_bytes <= the mapping's length.
            unsafe { self.map.as_ptr().add(DATA_OFFSET + position) }
        }

        /// Copies `out.len()` bytes of the data area at `position` into private memory.
        ///
        /// The client may be writing these bytes at this moment (it should not: they are
        /// published, but a wild write is what we guard against). The copy is a plain
        /// `memcpy` out of memory the compiler knows nothing about; whatever mix of old and new
        /// bytes it yields lands in `out`, and only `out` is ever interpreted, after every
        /// check. No reference into the shared bytes is formed.
        pub(crate) fn read_data(&self, position: usize, out: &mut [u8]) {
            let src = self.data_ptr(position, out.len());
            // SAFETY: `src` is valid for `out.len()` bytes (data_ptr); `out` is private memory,
            // so the ranges do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        }

        /// Lets `write` fill `len` bytes of the data area at `position`: only the client, and
        /// only in free space (between its `tail` and the daemon's `head` + area), which the
        /// daemon never reads until it is published.
        pub(crate) fn write_data<R>(
            &self,
            position: usize,
            len: usize,
            write: impl FnOnce(&mut [u8]) -> R,
        ) -> R {
            let dst = self.data_ptr(position, len);
            // SAFETY: `dst` is valid for `len` bytes (data_ptr). The range is free space that
            // only this client writes and that the daemon does not read until the client
            // publishes it (after `write` returns), so the exclusive slice aliases nothing for
            // its lifetime. The client is single-threaded per ring (`&mut ClientRing`).
            let bytes = unsafe { std::slice::from_raw_parts_mut(dst, len) };
            write(bytes)
        }

        pub(crate) fn read_result(&self, seq: u64) -> [u8; RESULT_BYTES] {
            let mut slot = [0u8; RESULT_BYTES];
            let offset = self.layout.result_offset(seq);
            // SAFETY: result_offset stays inside the header page (layout invariant, checked
            // by RingLayout's bounds); `slot` is private.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.map.as_ptr().add(offset),
                    slot.as_mut_ptr(),
                    RESULT_BYTES,
                )
            };
            slot
        }

        pub(crate) fn write_result(&self, seq: u64, slot: &[u8; RESULT_BYTES]) {
            let offset = self.layout.result_offset(seq);
            // SAFETY: as in `read_result`. The client reads this slot only after `done_seq`
            // covers `seq`, which is published after this write.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    slot.as_ptr(),
                    self.map.as_ptr().add(offset),
                    RESULT_BYTES,
                )
            };
        }

        pub(crate) fn read_message(&self) -> [u8; MESSAGE_BYTES] {
            let mut area = [0u8; MESSAGE_BYTES];
            // SAFETY: the message area lies inside the header page; `area` is private.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.map.as_ptr().add(MESSAGE_OFFSET),
                    area.as_mut_ptr(),
                    MESSAGE_BYTES,
                )
            };
            area
        }

        pub(crate) fn write_message(&self, area: &[u8; MESSAGE_BYTES]) {
            // SAFETY: as in `read_message`. The client reads it only after `done_seq` covers
            // the refused entry, which is published after this write.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    area.as_ptr(),
                    self.map.as_ptr().add(MESSAGE_OFFSET),
                    MESSAGE_BYTES,
                )
            };
        }

        pub(crate) fn futex_wait(&self, expected: u32) {
            os::futex_wait(self.wake(), expected);
        }

        pub(crate) fn futex_wake(&self) {
            os::futex_wake(self.wake());
        }
    }

    /// The eventfd a client rings when the daemon sleeps.
    #[derive(Debug)]
    pub(crate) struct Doorbell {
        fd: OwnedFd,
    }

    impl Doorbell {
        pub(crate) fn new(fd: OwnedFd) -> Doorbell {
            Doorbell { fd }
        }

        pub(crate) fn ring(&self) -> io::Result<()> {
            os::eventfd_signal(self.fd.as_fd())
        }

        pub(crate) fn drain(&self) -> io::Result<u64> {
            os::eventfd_drain(self.fd.as_fd())
        }

        pub(crate) fn fd(&self) -> BorrowedFd<'_> {
            self.fd.as_fd()
        }
    }
}

#[cfg(stela_loom)]
mod model {
    use super::super::sync::{Arc, AtomicU32, AtomicU64};
    use loom::cell::UnsafeCell;
    use loom::sync::{Condvar, Mutex};
    use std::io;
    use stela_proto::ring::*;

    struct Shared {
        tail: AtomicU64,
        client_waiting: AtomicU32,
        board_seat: AtomicU32,
        head: AtomicU64,
        daemon_asleep: AtomicU32,
        done_seq: AtomicU64,
        wake: AtomicU32,
        fault: AtomicU32,
        fault_seq: AtomicU64,
        results: Box<[UnsafeCell<[u8; RESULT_BYTES]>]>,
        message: UnsafeCell<[u8; MESSAGE_BYTES]>,
        /// One cell per 8 bytes: entries and pads are 8-aligned and 8-granular.
        data: Box<[UnsafeCell<u64>]>,
        /// The kernel's futex hash bucket: check-and-sleep is atomic against wake.
        futex: Mutex<()>,
        futex_sleepers: Condvar,
    }

    /// The in-memory ring region of the loom model.
    #[derive(Clone)]
    pub(crate) struct Region {
        shared: Arc<Shared>,
        layout: RingLayout,
    }

    impl Region {
        /// A zeroed region; `layout` needs only powers of two (the model uses a tiny area).
        pub(crate) fn new(layout: RingLayout) -> Region {
            assert!(layout.data_bytes.is_power_of_two() && layout.slots.is_power_of_two());
            Region {
                shared: Arc::new(Shared {
                    tail: AtomicU64::new(0),
                    client_waiting: AtomicU32::new(0),
                    board_seat: AtomicU32::new(0),
                    head: AtomicU64::new(0),
                    daemon_asleep: AtomicU32::new(0),
                    done_seq: AtomicU64::new(0),
                    wake: AtomicU32::new(0),
                    fault: AtomicU32::new(0),
                    fault_seq: AtomicU64::new(0),
                    results: (0..layout.slots)
                        .map(|_| UnsafeCell::new([0; RESULT_BYTES]))
                        .collect(),
                    message: UnsafeCell::new([0; MESSAGE_BYTES]),
                    data: (0..layout.data_bytes / 8)
                        .map(|_| UnsafeCell::new(0))
                        .collect(),
                    futex: Mutex::new(()),
                    futex_sleepers: Condvar::new(),
                }),
                layout,
            }
        }

        pub(crate) fn layout(&self) -> RingLayout {
            self.layout
        }
        pub(crate) fn tail(&self) -> &AtomicU64 {
            &self.shared.tail
        }
        pub(crate) fn client_waiting(&self) -> &AtomicU32 {
            &self.shared.client_waiting
        }
        pub(crate) fn board_seat(&self) -> &AtomicU32 {
            &self.shared.board_seat
        }
        pub(crate) fn head(&self) -> &AtomicU64 {
            &self.shared.head
        }
        pub(crate) fn daemon_asleep(&self) -> &AtomicU32 {
            &self.shared.daemon_asleep
        }
        pub(crate) fn done_seq(&self) -> &AtomicU64 {
            &self.shared.done_seq
        }
        pub(crate) fn wake(&self) -> &AtomicU32 {
            &self.shared.wake
        }
        pub(crate) fn fault(&self) -> &AtomicU32 {
            &self.shared.fault
        }
        pub(crate) fn fault_seq(&self) -> &AtomicU64 {
            &self.shared.fault_seq
        }

        fn words(&self, position: usize, len: usize) -> std::ops::Range<usize> {
            assert!(
                position.is_multiple_of(8) && len.is_multiple_of(8),
                "model data access off the grid"
            );
            assert!(position as u64 + len as u64 <= self.layout.data_bytes);
            position / 8..(position + len) / 8
        }

        pub(crate) fn read_data(&self, position: usize, out: &mut [u8]) {
            let words = self.words(position, out.len());
            for (i, word) in words.enumerate() {
                // SAFETY: loom checks that this read does not race a write of the same word.
                let value = self.shared.data[word].with(|p| unsafe { *p });
                out[i * 8..i * 8 + 8].copy_from_slice(&value.to_ne_bytes());
            }
        }

        /// Encodes into private memory, then stores word by word, with a crash point halfway,
        /// so the model can kill the client with an entry half written.
        pub(crate) fn write_data<R>(
            &self,
            position: usize,
            len: usize,
            write: impl FnOnce(&mut [u8]) -> R,
        ) -> R {
            let words = self.words(position, len);
            let mut staged = vec![0u8; len];
            let result = write(&mut staged);
            let half = words.len() / 2;
            for (i, word) in words.enumerate() {
                if i == half && i > 0 {
                    super::super::sync::crash_point();
                }
                let value = u64::from_ne_bytes(staged[i * 8..i * 8 + 8].try_into().unwrap());
                // SAFETY: loom checks that this write races no access to the same word.
                self.shared.data[word].with_mut(|p| unsafe { *p = value });
            }
            result
        }

        pub(crate) fn read_result(&self, seq: u64) -> [u8; RESULT_BYTES] {
            let index = (seq & u64::from(self.layout.slots - 1)) as usize;
            // SAFETY: loom checks that this read races no write of the slot.
            self.shared.results[index].with(|p| unsafe { *p })
        }

        pub(crate) fn write_result(&self, seq: u64, slot: &[u8; RESULT_BYTES]) {
            let index = (seq & u64::from(self.layout.slots - 1)) as usize;
            // SAFETY: loom checks that this write races no access to the slot.
            self.shared.results[index].with_mut(|p| unsafe { *p = *slot });
        }

        pub(crate) fn read_message(&self) -> [u8; MESSAGE_BYTES] {
            // SAFETY: loom checks that this read races no write of the area.
            self.shared.message.with(|p| unsafe { *p })
        }

        pub(crate) fn write_message(&self, area: &[u8; MESSAGE_BYTES]) {
            // SAFETY: loom checks that this write races no access to the area.
            self.shared.message.with_mut(|p| unsafe { *p = *area });
        }

        /// Test-only corruption of a data word (a wild write by the client).
        pub(crate) fn scribble(&self, position: usize, value: u64) {
            let word = self.words(position, 8).start;
            // SAFETY: loom checks the access like any other.
            self.shared.data[word].with_mut(|p| unsafe { *p = value });
        }

        pub(crate) fn futex_wait(&self, expected: u32) {
            let bucket = self.shared.futex.lock().unwrap();
            if self.shared.wake.load(std::sync::atomic::Ordering::Relaxed) != expected {
                return;
            }
            drop(self.shared.futex_sleepers.wait(bucket).unwrap());
        }

        pub(crate) fn futex_wake(&self) {
            let _bucket = self.shared.futex.lock().unwrap();
            self.shared.futex_sleepers.notify_all();
        }
    }

    /// The eventfd of the model: a counter under a mutex; [`Doorbell::wait`] stands for the
    /// daemon's epoll (which a socket hang-up wakes too: the model rings the doorbell then).
    #[derive(Clone)]
    pub struct Doorbell {
        shared: Arc<(Mutex<u64>, Condvar)>,
    }

    impl Doorbell {
        pub(crate) fn new() -> Doorbell {
            Doorbell {
                shared: Arc::new((Mutex::new(0), Condvar::new())),
            }
        }

        pub fn ring(&self) -> io::Result<()> {
            *self.shared.0.lock().unwrap() += 1;
            self.shared.1.notify_all();
            Ok(())
        }

        pub fn drain(&self) -> io::Result<u64> {
            Ok(std::mem::take(&mut *self.shared.0.lock().unwrap()))
        }

        /// Blocks until the counter is non-zero (does not reset it).
        pub fn wait(&self) {
            let mut count = self.shared.0.lock().unwrap();
            while *count == 0 {
                count = self.shared.1.wait(count).unwrap();
            }
        }
    }
}
