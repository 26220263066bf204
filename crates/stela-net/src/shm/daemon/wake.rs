//! How a ring is made, and how the daemon's end sleeps and is woken: the doorbell and the
//! `daemon_asleep` handshake. Liveness, not the hand-off of records ([`super`]).

use super::super::region::Doorbell;
use super::super::sync::fence;
use super::super::ShmError;
use super::DaemonRing;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

impl DaemonRing {
    /// Creates a ring of `data_bytes` (a power of two, 4 KiB..64 MiB) with `slots` result slots
    /// (a power of two, at most 64): a sealed memfd, mapped here, and an eventfd doorbell.
    /// Returns the ring, the memfd and a second descriptor of the eventfd: send both to the
    /// client (`os::send_with_fds`), which opens its end with `ClientRing::from_fds`, then drop
    /// them (the daemon keeps its own mapping and doorbell descriptor).
    ///
    /// # Errors
    /// [`ShmError::Layout`] for sizes out of bounds; [`ShmError::Io`] naming the failed call.
    #[cfg(not(stela_loom))]
    pub fn create(
        data_bytes: u64,
        slots: u32,
    ) -> Result<(DaemonRing, std::os::fd::OwnedFd, std::os::fd::OwnedFd), ShmError> {
        use super::super::os;
        use super::super::region::Region;
        use std::os::fd::AsFd;
        use stela_proto::ring::RingLayout;
        let layout = RingLayout::new(data_bytes, slots).map_err(ShmError::Layout)?;
        let memfd = os::create_sealed_memfd(c"stela-ring", layout.region_bytes())
            .map_err(ShmError::io("memfd_create"))?;
        let map = os::Mapping::map(memfd.as_fd(), layout.region_bytes() as usize)
            .map_err(ShmError::io("mmap"))?;
        let region = Region::new(map, layout);
        region.write_line0(&layout.encode_line0());
        let eventfd = os::eventfd().map_err(ShmError::io("eventfd"))?;
        let client_eventfd = eventfd.try_clone().map_err(ShmError::io("dup eventfd"))?;
        let ring = DaemonRing::from_parts(region, Doorbell::new(eventfd));
        Ok((ring, memfd, client_eventfd))
    }

    /// The doorbell's descriptor, to register for reading in the event loop (epoll/mio). It
    /// becomes readable when the client published while [`DaemonRing::set_asleep`] was set.
    #[cfg(not(stela_loom))]
    pub fn doorbell_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.doorbell.fd()
    }

    /// The model's doorbell, for the loom harness to wait on.
    #[cfg(stela_loom)]
    pub fn model_doorbell(&self) -> Doorbell {
        self.doorbell.clone()
    }

    /// Resets the doorbell after a wake-up (level-triggered epoll would otherwise report it
    /// again).
    ///
    /// # Errors
    /// [`ShmError::Io`] from `read`, which only fails if the descriptor is broken.
    pub fn drain_doorbell(&self) -> Result<(), ShmError> {
        self.doorbell
            .drain()
            .map_err(ShmError::io("read eventfd"))?;
        Ok(())
    }

    /// Announces that the daemon is about to sleep until the doorbell rings. Returns true if
    /// that is safe: nothing is published that it has not consumed (checked after a SeqCst
    /// fence, so a client publishing concurrently either is seen here or sees the flag and
    /// rings). On false, call [`DaemonRing::clear_asleep`] and keep reading.
    pub fn set_asleep(&self) -> bool {
        self.region.daemon_asleep().store(1, Relaxed);
        fence(SeqCst);
        self.stopped.load(Relaxed) != 0 || self.region.tail().load(Relaxed) == self.head
    }

    /// Clears the flag of [`DaemonRing::set_asleep`] after waking (clients stop ringing).
    pub fn clear_asleep(&self) {
        self.region.daemon_asleep().store(0, Relaxed);
    }
}
