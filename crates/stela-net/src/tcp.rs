//! TCP settings for the replication stream, the one connection whose stalls a committer feels:
//! a `replicated` commit waits for the standby's acknowledgement, so a lost segment on it costs
//! a commit whatever TCP takes to resend it.
//!
//! Linux's defaults suit a wide-area connection: the retransmission timer never fires sooner
//! than 200 ms above the smoothed round trip, and it doubles at each further loss. A replication
//! stream is thin (often one commit's bytes in flight, so too few segments for duplicate
//! acknowledgements to trigger a fast retransmit) and runs between two machines of one site, so
//! under loss its commits waited up to 0.9 s at 20 % loss and 40 ms round trips
//! (bench/results/failover.txt). Here, on both ends:
//! - the timer's floor is lowered to [`RTO_MIN`] (`TCP_RTO_MIN_US`, Linux 6.15 and later);
//! - a thin stream's timer does not double for its first retransmissions
//!   (`TCP_THIN_LINEAR_TIMEOUTS`);
//! - an acknowledgement is delayed at most [`DELACK_MAX`] (`TCP_DELACK_MAX_US`, Linux 6.15 and
//!   later), so that the lower floor does not fire on a peer that merely delays its
//!   acknowledgement (the stack's default delay reaches 40 ms and more).
//!
//! Each setting is best effort: an older kernel refuses the ones it lacks, and the stream
//! keeps the defaults for those, which [`TunedForLoss`] reports.

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// The retransmission timer's floor on the replication stream. Above the longest delay of an
/// acknowledgement by a peer ([`DELACK_MAX`]), with room for the kernel's timer ticks (4 ms at
/// 250 Hz), so that a timer never fires on a segment whose acknowledgement is merely late.
pub const RTO_MIN: Duration = Duration::from_millis(20);

/// The longest an acknowledgement is delayed on the replication stream: the kernel's least
/// (two timer ticks at 250 Hz).
pub const DELACK_MAX: Duration = Duration::from_millis(8);

// From linux/tcp.h; the libc crate does not name the two added in Linux 6.15.
const TCP_THIN_LINEAR_TIMEOUTS: libc::c_int = 16;
const TCP_RTO_MIN_US: libc::c_int = 45;
const TCP_DELACK_MAX_US: libc::c_int = 46;

/// Which of the settings the kernel took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunedForLoss {
    pub nodelay: bool,
    pub thin_linear_timeouts: bool,
    pub rto_min: bool,
    pub delack_max: bool,
}

impl TunedForLoss {
    /// Every setting took.
    pub fn all(&self) -> bool {
        self.nodelay && self.thin_linear_timeouts && self.rto_min && self.delack_max
    }
}

/// Sets the replication stream's options on `stream` (see the module's comment).
pub fn tune_for_loss(stream: &TcpStream) -> TunedForLoss {
    TunedForLoss {
        nodelay: stream.set_nodelay(true).is_ok(),
        thin_linear_timeouts: set_tcp_option(stream, TCP_THIN_LINEAR_TIMEOUTS, 1),
        rto_min: set_tcp_option(stream, TCP_RTO_MIN_US, micros(RTO_MIN)),
        delack_max: set_tcp_option(stream, TCP_DELACK_MAX_US, micros(DELACK_MAX)),
    }
}

fn micros(duration: Duration) -> libc::c_int {
    libc::c_int::try_from(duration.as_micros()).unwrap_or(libc::c_int::MAX)
}

fn set_tcp_option(stream: &TcpStream, option: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: the descriptor is the open socket `stream` owns for the whole call; the option's
    // value is a c_int read by the kernel from a pointer to a live local of exactly the length
    // passed.
    let done = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    done == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// What the kernel holds on `stream`: the retransmission floor and the acknowledgement
    /// delay, each `None` where the kernel does not have the option.
    fn loss_settings(stream: &TcpStream) -> (Option<Duration>, Option<Duration>) {
        let as_micros = |value: libc::c_int| Duration::from_micros(value.max(0) as u64);
        (
            get_tcp_option(stream, TCP_RTO_MIN_US).map(as_micros),
            get_tcp_option(stream, TCP_DELACK_MAX_US).map(as_micros),
        )
    }

    fn get_tcp_option(stream: &TcpStream, option: libc::c_int) -> Option<libc::c_int> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: as in `set_tcp_option`; the kernel writes at most `len` bytes into `value`, a
        // live local of that size, and updates `len`, another live local.
        let done = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::IPPROTO_TCP,
                option,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (done == 0).then_some(value)
    }

    /// On this project's kernels (6.15 and later) every setting takes, and reads back as set
    /// (the kernel keeps the floor and the delay in jiffies, so they read back rounded up to
    /// its tick, never below what was asked).
    #[test]
    fn both_ends_of_a_stream_take_every_setting() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        for end in [&client, &server] {
            let tuned = tune_for_loss(end);
            assert!(tuned.all(), "{tuned:?} (the kernel lacks an option)");
            let (rto_min, delack_max) = loss_settings(end);
            let (rto_min, delack_max) = (rto_min.unwrap(), delack_max.unwrap());
            assert!(
                (RTO_MIN..RTO_MIN + Duration::from_millis(10)).contains(&rto_min),
                "{rto_min:?}"
            );
            assert!(
                (DELACK_MAX..DELACK_MAX + Duration::from_millis(10)).contains(&delack_max),
                "{delack_max:?}"
            );
        }
        let untouched = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert_eq!(
            loss_settings(&untouched).0,
            Some(Duration::from_millis(200)),
            "the default floor, for contrast"
        );
    }
}
