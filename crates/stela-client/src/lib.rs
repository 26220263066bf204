//! stela-client: the log daemon (`stela serve`) behind the same typed API as the embedded
//! `stela_wal::Wal<T>`, so moving a database's log out of its process is a change of `open`.
//!
//! This is the README's client example: it starts the daemon in this process so that it runs
//! anywhere; in production the address is the socket of `stela serve --dir /var/lib/stela`
//! (`"/var/lib/stela/stela.sock"`, `"unix:PATH"` or `"tcp://HOST:PORT"`).
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use stela_client::{Durability, Wal, WalOptions};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Order { id: u64, cents: i64 }
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let dir = tempfile::tempdir()?;
//!     let daemon = stela_server::Server::start(stela_server::DaemonConfig::new(dir.path()))?;
//!     let wal: Wal<Order> = Wal::open(daemon.socket_path(), "orders", WalOptions::default())?;
//!     let lsn = wal.append(&Order { id: 1, cents: 250 })?; // in the daemon's buffer: survives our crash
//!     wal.commit_at(lsn, Durability::Disk)?;               // or open with .durability(Durability::Disk)
//!     Ok(())
//! }
//! ```
//!
//! - [`Wal<T>`] ([`wal`]): the typed log, blocking: append, commit, iterate, truncate; on the
//!   daemon's machine appends and commits go through a shared-memory ring.
//! - [`AsyncWal<T>`] ([`async_wal`]): the same for tokio, many calls in flight per
//!   connection, its iterator a `futures_core::Stream`.
//! - [`Address`] and [`Connection`] ([`connection`]): where the daemon listens, and one framed
//!   connection to it for tools.
//! - [`TlsTarget`] ([`tls`]): a daemon over TCP under TLS.
//!
//! Both clients take an endpoint list (`"tcp://A,tcp://B"`): they open the log on whichever
//! node is the primary, follow a failover to the other, report a commit that was waiting
//! when its primary was lost as [`Error::InDoubt`] and settle it with `resolve(term, lsn)`.
//!
//! What an acknowledgement means depends on the [`Durability`] the log was opened with; see
//! `docs/DURABILITY.md`. In short: `buffered` survives the death of this process, `disk`
//! survives the daemon, the OS and a power cut; `replicated` survives the loss of one node.

pub mod async_wal;
pub mod connection;
mod deadline;
mod error;
mod failover;
pub mod tls;
pub mod wal;
mod watcher;

pub use async_wal::{AsyncIter, AsyncWal};
pub use connection::{Address, Connection};
pub use error::{Error, Result};
pub use stela_format::term::Resolution;
pub use stela_format::{Codec, Lsn};
pub use stela_proto::{Durability, ErrorCode, Positions, StatusReport};
pub use tls::TlsTarget;
pub use wal::{Iter, Transport, Wal, WalOptions};

/// The README's code blocks, compiled (and, unless marked `no_run`, run) as doctests, so the
/// snippets a newcomer copies are the code CI builds.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
