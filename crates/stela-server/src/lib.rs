//! stela-server: the `stela serve` daemon, the log service after RapiLog.
//!
//! A database's log lives here, in a process that outlives the database. A commit is
//! acknowledged once its record is in this daemon's bounded buffers (`buffered`) or, when asked,
//! once it is fdatasync'ed (`disk`); the physical writes happen asynchronously, in large
//! sequential writes. The buffers are capped so that, told power is failing, the daemon can write
//! and sync all of them within half the power supply's hold-up window.
//!
//! - [`pool`]: the buffer manager (sequential runs, backpressure, eligibility, fail stop).
//! - [`flusher`]: the thread that writes and syncs runs through stela-wal.
//! - [`logs`]: the table of named logs, each an ordinary stela-wal directory.
//! - [`measure`]: the start-up disk measurement and the dirty-byte cap.
//! - [`conn`]: one client connection (framing, pipelining, errors).
//! - [`server`]: start-up, sockets, signals, power failure, shutdown.
//!
//! The wire protocol is in `docs/PROTOCOL.md`, the guarantees in `docs/DURABILITY.md`.

pub mod conn;
pub mod flusher;
pub mod logs;
pub mod measure;
pub mod pool;
pub mod server;
mod sync;

pub use pool::{Pool, PoolConfig, PoolError};
pub use server::{Server, ServerConfig, StartError};
