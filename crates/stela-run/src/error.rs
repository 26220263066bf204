//! [`RunError`]: everything `stela run` can fail with before or around the program (the
//! background sync's failures are its own, in [`crate::supervise`]).

use std::path::PathBuf;

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
