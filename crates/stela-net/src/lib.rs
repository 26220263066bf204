//! stela-net: the transports between a stela client and the daemon.
//!
//! - this file: [`SpinStream`], a socket that spins briefly before it sleeps;
//! - [`shm`]: the shared-memory ring a client on the same machine commits through;
//! - [`tls`]: TLS for TCP (certificates, keys, tokens, rustls configurations), shared by the
//!   daemon, the client and replication.
//! - [`duplex`]: a TLS connection one thread reads while another writes (the replication
//!   stream).
//! - [`peer`]: the user owning a loopback TCP peer's socket (a plain replication stream).
//! - [`tcp`]: the replication stream's TCP settings, which shorten the stalls a lost segment
//!   causes.
//!
//! Why spin: on the machines we measure (virtual CPUs), waking a thread that sleeps in `read` costs
//! about 60 microseconds of a 62-microsecond Unix-socket round trip; a reader that polls the
//! socket for a few microseconds instead sees the same round trip in 3.5. A `buffered` commit is
//! meant to cost a memcpy and one local round trip, so both ends of a stela connection spin.
//!
//! The spin adapts, like an adaptive mutex: a spin that ends with data keeps the full budget; one
//! that runs out halves it, down to zero (plain blocking reads), and every
//! [`REPROBE_EVERY`] blocking reads the full budget is tried again. A busy daemon with many
//! clients thus stops spinning by itself (answers come later than any budget), while one fast
//! client keeps its microsecond round trips. The cost is at most `budget` of CPU per wait.
//!
//! Invariant: the wrapped socket is non-blocking; every read and write here completes or fails
//! as a blocking one would (writes wait for room with `poll`, reads with `poll` after the spin),
//! so callers can use `read_exact`/`write_all` unchanged.

pub mod duplex;
pub mod peer;
pub mod shm;
pub mod tcp;
pub mod tls;

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

/// After this many blocking reads at budget zero, try spinning again.
pub const REPROBE_EVERY: u32 = 64;

/// The default spin budget.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// A non-blocking stream that spins up to an adaptive budget before sleeping in `poll`.
#[derive(Debug)]
pub struct SpinStream<S> {
    inner: S,
    max: Duration,
    budget: Duration,
    blocking_reads: u32,
}

impl<S: Read + Write + AsFd> SpinStream<S> {
    /// Wraps `stream` (made non-blocking here) with a spin budget of `max` (zero: never spin).
    pub fn new(
        stream: S,
        max: Duration,
        set_nonblocking: impl FnOnce(&S) -> io::Result<()>,
    ) -> io::Result<Self> {
        set_nonblocking(&stream)?;
        Ok(SpinStream {
            inner: stream,
            max,
            budget: max,
            blocking_reads: 0,
        })
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The budget the next wait will spin for.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    fn wait(&self, events: libc::c_short) -> io::Result<()> {
        let mut fd = libc::pollfd {
            fd: self.inner.as_fd().as_raw_fd(),
            events,
            revents: 0,
        };
        loop {
            // SAFETY: `fd` is a valid, initialised pollfd for a descriptor `self.inner` keeps
            // open for the duration of the call; we pass exactly one entry.
            let ready = unsafe { libc::poll(&mut fd, 1, -1) };
            if ready >= 0 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
    }
}

impl<S: Read + Write + AsFd> Read for SpinStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inner.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            other => return other,
        }
        if !self.budget.is_zero() {
            let started = Instant::now();
            loop {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
                match self.inner.read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    other => return other, // data (or an error) while spinning: keep the budget
                }
                if started.elapsed() >= self.budget {
                    self.budget /= 2;
                    if self.budget < Duration::from_micros(2) {
                        self.budget = Duration::ZERO;
                    }
                    break;
                }
            }
        } else if !self.max.is_zero() {
            self.blocking_reads += 1;
            if self.blocking_reads >= REPROBE_EVERY {
                self.blocking_reads = 0;
                self.budget = self.max;
            }
        }
        loop {
            self.wait(libc::POLLIN)?;
            match self.inner.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

impl<S: Read + Write + AsFd> Write for SpinStream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match self.inner.write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait(libc::POLLOUT)?,
                other => return other,
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn pair(spin: Duration) -> (SpinStream<UnixStream>, SpinStream<UnixStream>) {
        let (a, b) = UnixStream::pair().unwrap();
        (
            SpinStream::new(a, spin, |s| s.set_nonblocking(true)).unwrap(),
            SpinStream::new(b, spin, |s| s.set_nonblocking(true)).unwrap(),
        )
    }

    #[test]
    fn reads_and_writes_complete_like_blocking_ones() {
        for spin in [Duration::ZERO, DEFAULT_SPIN] {
            let (mut a, mut b) = pair(spin);
            let big = vec![9u8; 4 << 20]; // larger than the socket buffer: writes must wait
            let writer = std::thread::spawn(move || {
                a.write_all(&big).unwrap();
                a
            });
            let mut got = vec![0u8; 4 << 20];
            b.read_exact(&mut got).unwrap();
            assert!(got.iter().all(|&x| x == 9));
            drop(writer.join().unwrap());
            assert_eq!(
                b.read(&mut [0u8; 8]).unwrap(),
                0,
                "end of stream after the peer closes"
            );
        }
    }

    #[test]
    fn an_idle_peer_drives_the_budget_to_zero_and_it_is_reprobed() {
        let (mut a, mut b) = pair(Duration::from_micros(20));
        let peer = std::thread::spawn(move || {
            for _ in 0..80 {
                std::thread::sleep(Duration::from_millis(1));
                a.write_all(&[1]).unwrap();
            }
        });
        let mut seen_zero = false;
        for _ in 0..80 {
            b.read_exact(&mut [0u8; 1]).unwrap();
            seen_zero |= b.budget().is_zero();
        }
        peer.join().unwrap();
        assert!(
            seen_zero,
            "a peer that answers after 1 ms must stop the spinning"
        );
    }
}
