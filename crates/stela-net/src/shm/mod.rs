//! The shared-memory transport: a per-connection ring through which a client on the daemon's
//! machine commits without a socket round trip.
//!
//! The daemon creates the region (a sealed memfd) and a doorbell (an eventfd), maps the region,
//! and passes both descriptors to the client over the connection's Unix socket
//! ([`send_with_fds`] / [`recv_with_fds`]). The client writes framed entries (the codec is
//! `stela_proto::ring`) and publishes them; the daemon copies each published entry into its
//! own memory, checks the copy, places its records, and only then publishes the completion.
//! So a client's wild write can damage only its own unacknowledged entries, and everything
//! acknowledged is in memory the client cannot reach (RapiLog's isolation argument).
//! `docs/PROTOCOL.md` ("Shared-memory transport") has the byte layout and the protocol.
//!
//! - [`DaemonRing`] (`daemon.rs`): create, `next_entry` (copy + check), `consume`,
//!   `complete`, `fault`, the asleep flag and the doorbell.
//! - [`ClientRing`] (`client.rs`): `from_fds`, `write_entry` / `publish` / `submit`, `wait`
//!   (adaptive spin, then the futex), and the [`GoneHandle`] a watcher uses when the daemon dies.
//! - `os.rs`: memfd and seals, [`Mapping`], eventfd, futex, SCM_RIGHTS.
//! - `region.rs`: the region as both ends see it (header atomics, raw copies), swapped for an
//!   in-memory model under `--cfg stela_loom` together with `sync.rs`; `tests/loom_ring.rs` checks
//!   the two ends' real code against it.
//!
//! ```
//! use stela_net::shm::{ClientRing, DaemonRing, EntryKind};
//! use stela_proto::{ring::Completion, Durability};
//!
//! let (mut daemon, memfd, eventfd) = DaemonRing::create(64 << 10, 16).unwrap();
//! // (In real use the two descriptors travel over the connection's socket.)
//! let mut client = ClientRing::from_fds(memfd, eventfd).unwrap();
//!
//! let seq = client
//!     .submit(0, EntryKind::Append, Durability::Buffered, 0, &[b"hello"])
//!     .unwrap();
//! let mut scratch = Vec::new();
//! let entry = daemon.next_entry(&mut scratch).unwrap().expect("published");
//! assert_eq!(entry.records().next().unwrap().0, b"hello");
//! daemon.consume();
//! daemon.complete(seq, Completion::ok(1, 1));
//! assert_eq!(client.wait(seq).unwrap().last_lsn, 1);
//! ```

mod board;
mod client;
mod daemon;
mod error;
pub mod os;
mod region;
mod sync;

pub use board::{Board, WakeBatch};
pub use client::{ClientRing, GoneHandle, REPROBE_EVERY};
pub use daemon::{Completer, DaemonRing, RingFault};
pub use error::ShmError;
pub use os::{recv_with_fds, send_with_fds, Mapping, MAX_FDS};
pub use stela_proto::ring::{Completion, Entry, EntryKind, FaultCode, RingError, RingLayout};

/// The loom model's way in: a ring over an in-memory region, and the client crash switch.
#[cfg(stela_loom)]
pub mod model {
    pub use super::region::Doorbell;
    pub use super::sync::model_crash::{arm, Killed};
    use super::{ClientRing, DaemonRing, RingLayout};

    /// The two ends of a ring over a fresh in-memory region. `layout` needs only powers of two
    /// (a tiny area keeps the model small). The client never spins (loom has no clock).
    pub fn pair(layout: RingLayout) -> (DaemonRing, ClientRing) {
        let region = super::region::Region::new(layout);
        let doorbell = Doorbell::new();
        let daemon = DaemonRing::from_parts(region.clone(), doorbell.clone());
        let client = ClientRing::from_parts(region, doorbell, std::time::Duration::ZERO);
        (daemon, client)
    }

    /// As [`pair`], the ring seated on a fresh model wake board, so that the client sleeps for
    /// its answers on the board.
    pub fn seated_pair(layout: RingLayout) -> (DaemonRing, ClientRing) {
        let (mut daemon, mut client) = pair(layout);
        let board = super::Board::model();
        daemon.take_seat(&board, 0);
        assert!(client.attach_board(board));
        (daemon, client)
    }
}
