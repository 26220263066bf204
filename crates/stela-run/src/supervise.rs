//! Starting the program and staying with it: `stela run`'s process.
//!
//! Owns the program's start (environment with the preload library and its settings), the
//! wait for every process of it (this process is their subreaper: a program that daemonises,
//! such as `pg_ctl start`, leaves its server to us rather than to init), the forwarding of
//! SIGTERM/SIGINT/SIGHUP/SIGQUIT to the program, and the background sync. Invariants:
//! - The log is replayed onto the files and synced before the program starts.
//! - The log is truncated only below an LSN read *before* the files were synced (every change
//!   up to it was performed on the files before it was logged, so the sync covers it).
//! - A failed sync is never retried on the same files: the syncer stops truncating for good
//!   and says so (the log keeps every record; replay at the next start covers them).

use crate::elf::{find_program, linkage, Linkage};
use crate::error::RunError;
use crate::log::{open_log, recover};
use crate::record::RunRecord;
use crate::settings::Settings;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::time::Duration;
use stela_client::{Durability, Lsn, Wal};

/// How `stela run` runs a program.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The daemon's Unix socket.
    pub socket: PathBuf,
    /// The log's name in the daemon.
    pub log: String,
    pub level: Durability,
    /// The durable directories as given (made canonical here; they must exist).
    pub dirs: Vec<PathBuf>,
    /// How often the files are synced and the log truncated behind them.
    pub sync_every: Duration,
    /// The preload library (found next to this executable when `None`).
    pub library: Option<PathBuf>,
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

fn canonical_dirs(dirs: &[PathBuf]) -> Result<Vec<PathBuf>, RunError> {
    dirs.iter()
        .map(|dir| {
            let canonical = std::fs::canonicalize(dir).map_err(|source| RunError::Dir {
                dir: dir.clone(),
                source,
            })?;
            if !canonical.is_dir() {
                return Err(RunError::Dir {
                    dir: dir.clone(),
                    source: std::io::Error::other("not a directory"),
                });
            }
            if canonical.as_os_str().as_encoded_bytes().contains(&b'\n') {
                return Err(RunError::DirName(canonical));
            }
            Ok(canonical)
        })
        .collect()
}

/// The preload library: `STELA_PRELOAD`, else beside this executable, else in
/// `../lib/stela/` from it.
fn find_library(given: Option<&Path>) -> Result<PathBuf, RunError> {
    let mut looked = Vec::new();
    let mut candidates: Vec<PathBuf> = given.map(Path::to_owned).into_iter().collect();
    if let Some(path) = std::env::var_os("STELA_PRELOAD") {
        candidates.push(path.into());
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_owned))
    {
        candidates.push(dir.join("libstela_preload.so"));
        candidates.push(dir.join("../lib/stela/libstela_preload.so"));
    }
    for candidate in candidates {
        if candidate.is_file() {
            return std::fs::canonicalize(&candidate).map_err(|source| RunError::Program {
                program: candidate,
                source,
            });
        }
        looked.push(candidate.display().to_string());
    }
    Err(RunError::NoLibrary {
        looked: looked.join(", "),
    })
}

fn check_program(program: &Path) -> Result<PathBuf, RunError> {
    let path = find_program(program).ok_or_else(|| RunError::NoProgram(program.to_owned()))?;
    match linkage(&path) {
        Ok(Linkage::Static) => Err(RunError::Static { program: path }),
        Ok(_) => Ok(path),
        Err(source) => Err(RunError::Program {
            program: path,
            source,
        }),
    }
}

/// fdatasync of every regular file under `dir`, then fsync of every directory (depth first).
fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            sync_tree(&entry.path())?;
        } else if kind.is_file() {
            match std::fs::File::open(entry.path()) {
                Ok(file) => file.sync_data()?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Why a round of the background sync failed.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    /// The log could not be asked (the connection is opened again next round).
    #[error("asking the log's positions: {0}")]
    Positions(#[source] stela_client::Error),
    /// The files could not be synced: the syncer stops for good (never retried on the same
    /// files).
    #[error("syncing {}: {source}", dir.display())]
    Files {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The log could not be truncated (the connection is opened again next round).
    #[error("truncating the log: {0}")]
    Truncate(#[source] stela_client::Error),
}

/// One round of the background sync: the files hold every change up to the log's last LSN
/// read first; sync them, then drop the log below it. Returns the LSN synced.
fn sync_round(log: &Wal<RunRecord>, dirs: &[PathBuf], synced: u64) -> Result<u64, SyncError> {
    let last = log.positions().map_err(SyncError::Positions)?.last_lsn;
    if last <= synced {
        return Ok(synced);
    }
    for dir in dirs {
        sync_tree(dir).map_err(|source| SyncError::Files {
            dir: dir.clone(),
            source,
        })?;
    }
    log.truncate_before(Lsn::new(last + 1))
        .map_err(SyncError::Truncate)?;
    Ok(last)
}

/// The background sync, every `every` until `stop` is dropped (or sent to).
fn start_syncer(
    settings: Settings,
    every: Duration,
    stop: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("stela-run-sync".into())
        .spawn(move || {
            let mut synced = 0;
            let mut log = None;
            while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
                if log.is_none() {
                    log = open_log(&settings).ok();
                }
                let Some(open) = &log else { continue };
                match sync_round(open, &settings.dirs, synced) {
                    Ok(lsn) => synced = lsn,
                    Err(why @ SyncError::Files { .. }) => {
                        tracing::error!(
                            "stela run: {why}; the files are no longer synced in the \
                             background (the log keeps every record; restart to replay)"
                        );
                        return;
                    }
                    Err(why) => {
                        tracing::warn!("stela run: background sync: {why}");
                        log = None;
                    }
                }
            }
        })
        .expect("spawning the sync thread")
}

/// The direct child's pid, for the signal forwarder (0 until it runs).
static CHILD: AtomicI32 = AtomicI32::new(0);

fn forward_signals() {
    let signals = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];
    let Ok(mut iterator) = signal_hook::iterator::Signals::new(signals) else {
        tracing::warn!("stela run: signals are not forwarded to the program");
        return;
    };
    std::thread::spawn(move || {
        for signal in iterator.forever() {
            let child = CHILD.load(Ordering::Acquire);
            if child > 0 {
                // SAFETY: kill has no memory preconditions; a pid that exited is an error we
                // ignore.
                unsafe { libc::kill(child, signal) };
            }
        }
    });
}

/// Waits for every process of the program (we are their subreaper); returns the direct
/// child's exit code (128 + signal if a signal ended it).
fn wait_all(child: i32) -> i32 {
    let mut code = 0;
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid place for waitpid to write.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return code; // ECHILD: nothing left
        }
        if pid == child {
            code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
        }
    }
}

/// Replays, starts the program, syncs in the background, waits for every process of the
/// program, syncs a last time; returns the program's exit code.
pub fn run(options: RunOptions) -> Result<i32, RunError> {
    let dirs = canonical_dirs(&options.dirs)?;
    let program = check_program(&options.program)?;
    let library = find_library(options.library.as_deref())?;
    let settings = Settings {
        socket: options.socket.clone(),
        log: options.log.clone(),
        level: options.level,
        dirs,
    };
    let log = open_log(&settings)?;
    let replayed = recover(&log, &settings.log)?;
    tracing::info!(
        "stela run: replayed {} records ({} bytes) onto {:?}",
        replayed.records,
        replayed.bytes,
        settings.dirs
    );
    drop(log);
    // SAFETY: prctl with these arguments reads no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    forward_signals();
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(existing) if !existing.is_empty() => {
            let mut both = library.clone().into_os_string();
            both.push(":");
            both.push(existing);
            both
        }
        _ => library.clone().into_os_string(),
    };
    let mut command = std::process::Command::new(&program);
    command.args(&options.args).env("LD_PRELOAD", preload);
    for (name, value) in settings.to_env() {
        command.env(name, value);
    }
    // argv[0] as the user gave it (pg_ctl finds postgres beside itself through it).
    command.arg0(&options.program);
    let child = command.spawn().map_err(|source| RunError::Spawn {
        program: program.clone(),
        source,
    })?;
    CHILD.store(child.id() as i32, Ordering::Release);
    let (stop, stopped) = mpsc::channel();
    let syncer = start_syncer(settings.clone(), options.sync_every, stopped);
    let code = wait_all(child.id() as i32);
    drop(stop);
    let _ = syncer.join();
    if let Ok(log) = open_log(&settings) {
        if let Err(why) = sync_round(&log, &settings.dirs, 0) {
            tracing::warn!("stela run: the last sync: {why}");
        }
    }
    Ok(code)
}
