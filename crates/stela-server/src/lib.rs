//! stela-server: the `stela serve` daemon, the log service after RapiLog.
//!
//! A database's log lives here, in a process that outlives the database. A commit is
//! acknowledged once its record is framed in this daemon's bounded buffers (`buffered`) or,
//! when asked, once it is fdatasync'ed (`disk`); the physical writes happen asynchronously, in
//! large sequential writes. The buffers are capped so that, told power is failing, the daemon can
//! write and sync all of them within half the power supply's hold-up window.
//!
//! A tour, from the bytes up:
//! - [`pool`]: the buffer pool: the one LSN authority; frames each record once, in the on-disk
//!   format, at the segment offset it will have; backpressure, eligibility, fail stop.
//! - [`flusher`]: the threads that write those bytes unchanged through stela-wal's segment
//!   writer and sync them.
//! - [`logs`]: the table of open logs, each an ordinary stela-wal directory.
//! - [`quota`]: per-credential limits on log creation and bytes, and who owns each log.
//! - [`engine`]: the daemon's state behind append / commit / read / status / power-fail.
//! - [`measure`]: the start-up disk measurement and the dirty-byte cap.
//! - [`cap`]: the live dirty-byte cap, lowered at once by a slow flush and grown back slowly.
//! - `net`: the event loop: connections without a thread each, the shared-memory rings,
//!   limits and timeouts. It calls the engine; nothing calls back into it but its inbox.
//! - [`metrics`]: the Prometheus metrics and the `/metrics` endpoint.
//! - `sched`: realtime scheduling for the threads every acknowledgement passes through.
//! - [`cluster`]: a node of a failover pair: role, epoch, renewals, promotion, stepping down.
//! - [`config`]: every setting and its default, in one place.
//! - [`error`]: the one error type, and its wire codes.
//! - [`server`]: start-up, signals, shutdown.
//!
//! The wire protocol is in `docs/PROTOCOL.md`, the guarantees in `docs/DURABILITY.md`.
//!
//! ```no_run
//! use stela_server::{DaemonConfig, Server};
//!
//! let server = Server::start(DaemonConfig::new("/var/lib/stela"))?;
//! println!("serving on {}", server.socket_path().display());
//! server.run_until_stopped()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod cap;
pub mod cluster;
pub mod config;
pub mod engine;
pub mod error;
pub mod flusher;
pub mod logs;
pub mod measure;
pub mod metrics;
mod process_metrics;
// The event loop and start-up are left out of the loom build: the shared-memory ring's cells
// are loom's there (modelled in stela-net's own loom test), which the loop cannot hand between
// threads, and the pool model needs neither.
#[cfg(not(stela_loom))]
mod net;
pub mod pool;
pub mod quota;
pub mod replication;
mod sched;
#[cfg(not(stela_loom))]
pub mod server;
mod sync;
#[cfg(not(stela_loom))]
mod workers;

pub use config::DaemonConfig;
pub use error::{Error, ShutdownError, StartError};
#[cfg(not(stela_loom))]
pub use net::limits;
pub use pool::{Pool, PoolConfig, PoolError};
#[cfg(not(stela_loom))]
pub use server::Server;
pub use stela_net::tls::{ClientTlsFiles, ServerTlsFiles};
