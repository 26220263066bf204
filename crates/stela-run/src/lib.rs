//! `stela run`: durability for an unmodified program's named files, without FUSE.
//!
//! The program runs with a preload library (crates/stela-preload) that sends every change it
//! makes to a file under a durable directory to the daemon as a record ([`record`]) after
//! performing it on the file, and answers the fsyncs of those files with the daemon's
//! acknowledgement at the chosen level instead of the disk's. This crate is the other half:
//! - [`settings`]: what the library is told, through the environment;
//! - [`replay`]: before the program starts, the log's tail is applied to the files (so after
//!   any crash they hold every acknowledged change), synced, and the log truncated;
//! - [`elf`]: a statically linked program is refused (it would ignore the library);
//! - [`supervise`]: starts the program, stays its subreaper until every process of it has
//!   exited (so a daemonising program such as `pg_ctl start` is followed), and in the
//!   background syncs the files and truncates the log behind the synced point.
//!
//! The invariant joining the halves: a change is performed on the file before its record is
//! appended. So once the log holds LSN `n`, the files' page cache holds every change up to
//! `n`; syncing the files then makes `n` durable in them, and the log may drop it.

pub mod elf;
mod error;
mod log;
pub mod record;
pub mod replay;
pub mod settings;
pub mod supervise;

use stela_client::Durability;

pub use error::RunError;
pub use log::{open_log, recover};
pub use record::RunRecord;
pub use settings::Settings;
pub use supervise::{run, RunOptions};

/// The default level of `stela run` (as of `stela mount`): fdatasync'ed by the daemon.
pub const DEFAULT_LEVEL: Durability = Durability::Disk;
