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
pub mod record;
pub mod replay;
pub mod settings;
pub mod supervise;

use std::path::PathBuf;
use stela_client::{Durability, Wal, WalOptions};

pub use record::RunRecord;
pub use settings::Settings;
pub use supervise::{run, RunOptions};

/// Everything `stela run` can fail with before or around the program.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("durable directory {dir}: {source}")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("durable directory {0} contains a newline, which the preload library's settings cannot carry")]
    DirName(PathBuf),
    #[error("{0}: no such program (not a path, and not found in PATH)")]
    NoProgram(PathBuf),
    #[error("{program} is statically linked: a preload library cannot reach its writes, so its files would not be durable through stela; run a dynamically linked build")]
    Static { program: PathBuf },
    #[error("reading {program}: {source}")]
    Program {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("the preload library was not found (looked at {looked}); set STELA_PRELOAD to its path (libstela_preload.so)")]
    NoLibrary { looked: String },
    #[error("the log {log:?} in the daemon: {source}")]
    Log {
        log: String,
        source: Box<stela_client::Error>,
    },
    #[error("replaying the log onto the files: {0}")]
    Replay(std::io::Error),
    #[error("starting {program}: {source}")]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
}

/// Opens `stela run`'s log (created if missing) with the record type's tag.
pub fn open_log(settings: &Settings) -> Result<Wal<RunRecord>, RunError> {
    let options = WalOptions::default()
        .durability(settings.level)
        .type_tag(record::TYPE_TAG)
        .create_if_missing(true);
    Wal::open(settings.socket.clone(), &settings.log, options).map_err(|source| RunError::Log {
        log: settings.log.clone(),
        source: Box::new(source),
    })
}

/// Replays the log's tail onto the files, syncs them, and truncates the log behind it.
/// Returns what was replayed.
pub fn recover(log: &Wal<RunRecord>, name: &str) -> Result<replay::Replayed, RunError> {
    let log_error = |source| RunError::Log {
        log: name.to_owned(),
        source: Box::new(source),
    };
    let positions = log.positions().map_err(log_error)?;
    if positions.last_lsn < positions.first_lsn || positions.last_lsn == 0 {
        return Ok(replay::Replayed::default());
    }
    let mut tail = Vec::new();
    for item in log
        .iter_from(stela_client::Lsn::new(positions.first_lsn.max(1)))
        .map_err(log_error)?
    {
        let (lsn, record) = item.map_err(log_error)?;
        if lsn.get() > positions.last_lsn {
            break;
        }
        tail.push(record);
    }
    let mut disk = replay::Disk::default();
    let done = replay::replay(&tail, &mut disk).map_err(RunError::Replay)?;
    disk.sync().map_err(RunError::Replay)?;
    log.truncate_before(stela_client::Lsn::new(positions.last_lsn + 1))
        .map_err(log_error)?;
    Ok(done)
}

/// The default level of `stela run` (as of `stela mount`): fdatasync'ed by the daemon.
pub const DEFAULT_LEVEL: Durability = Durability::Disk;
