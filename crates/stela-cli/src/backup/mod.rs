//! `stela backup` and `stela restore`: a consistent, verified copy of a running daemon's logs
//! (what `pg_basebackup` is to PostgreSQL), and laying such a copy out as a daemon's directory.
//!
//! How a backup is taken, while the daemon keeps serving (nothing here stops or pauses it):
//! 1. The daemon is asked for its logs (`ListLogs`). For each log it says how far it has synced
//!    (`durable_lsn`): every record acknowledged at `disk` before this moment is at or below
//!    it. A closed log's files are whole, so their last record is the bound. That bound is the
//!    log's `required_lsn`: the copy must hold every record up to it.
//! 2. A hold is recorded on each log (`DIR/holds/NAME/`, holder: the backup's directory), from
//!    the log's first LSN, so neither a client's truncation nor `--retain-bytes` removes a
//!    segment while it is copied; the holds are released when the backup ends, whatever the
//!    outcome. Each segment is opened before any is copied, so one removed by a truncation that
//!    had begun before the hold is still read whole or, if it was already gone, was gone before
//!    the backup began.
//! 3. Each log's files are copied in an order that keeps the copy consistent: the `SYNCED` mark
//!    first (it only claims bytes a returned fdatasync covered, so every later read of the
//!    segment holds them: the copy's mark never claims more than its segment has), then the
//!    segments (the newest may end in a write in progress: a torn tail, which opening the log
//!    removes, after `required_lsn`), then the rest, and `TERMS` last (a term begun during the
//!    copy then covers every copied record of it).
//! 4. Each copy is verified as `stela wal verify` would (no damage, and it holds `required_lsn`),
//!    and only then is the `MANIFEST` written ([`manifest`]): every file with its length and
//!    CRC32C, every log with its LSNs, the manifest's own checksum last. A directory without a
//!    manifest is not a backup.
//!
//! Restoring checks the manifest's checksum, every file's length and checksum, and verifies
//! every log before anything is written; then it copies each log under a temporary name in
//! `DATADIR/logs/`, checks the checksums of what it copied, syncs, and renames it into place.
//! It never overwrites a log. `stela serve --dir DATADIR` then opens the logs as its own.
//!
//! Invariant: a backup that `backup` returned `Ok` for, or that `restore` accepted, holds every
//! record its manifest says it must, with the bytes the daemon had synced (checked by
//! `debug_assert!` on the copy's verification, and by the tests in `tests/backup.rs`).

mod copy;
pub mod manifest;
mod remote;

pub use remote::backup_remote;

use manifest::{FileCopy, LogCopy, Manifest, ManifestError};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};
use stela_client::{Address, Connection};
use stela_proto::{LogListing, RequestBody, ResponseBody};
use stela_wal::storage::StdStorage;
use stela_wal::Lsn;

/// What went wrong in a backup or a restore, naming the path, log or daemon it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: not empty; a backup is written into a new or empty directory")]
    NotEmpty(PathBuf),
    #[error("asking the daemon at {address} for its logs")]
    Daemon {
        address: String,
        #[source]
        source: stela_client::Error,
    },
    #[error("the daemon answered {0}")]
    Unexpected(String),
    /// `what`: the daemon's address and what was asked of it.
    #[error("{what}")]
    Remote {
        what: String,
        #[source]
        source: stela_client::Error,
    },
    #[error("log {log}: {source}")]
    Wal {
        log: String,
        #[source]
        source: stela_wal::Error,
    },
    #[error("log {log}: the copy is damaged: {problem}")]
    CopyDamaged { log: String, problem: String },
    #[error("log {log}: the copy ends at LSN {copied}, but LSN {required} was durable when the backup began")]
    Short {
        log: String,
        copied: u64,
        required: u64,
    },
    #[error("{0}: not a stela backup (no MANIFEST: a backup that did not finish has none)")]
    NoManifest(PathBuf),
    #[error("{path}: the manifest is refused: {source}")]
    BadManifest {
        path: PathBuf,
        #[source]
        source: ManifestError,
    },
    #[error("{path}: damaged backup: {why}")]
    Damaged { path: PathBuf, why: String },
    #[error("{0}: a log of that name is already there; restore never overwrites a log")]
    Exists(PathBuf),
}

impl BackupError {
    /// Whether the error says a backup or its copy is damaged (the command exits 1).
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            BackupError::CopyDamaged { .. }
                | BackupError::Short { .. }
                | BackupError::BadManifest { .. }
                | BackupError::Damaged { .. }
        )
    }
}

type Result<T> = std::result::Result<T, BackupError>;

fn io<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> BackupError + 'a {
    move |source| BackupError::Io {
        path: path.to_owned(),
        what,
        source,
    }
}

/// `stela backup`'s arguments.
#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    /// The backup's directory: created, or an empty one.
    #[arg(long, value_name = "DIR")]
    pub to: PathBuf,
    /// The daemon's directory: the backup reads its logs' files there, so it runs on the
    /// daemon's machine, as a user who may read them and write DIR/holds.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/stela")]
    pub dir: PathBuf,
    /// The daemon's Unix socket [default: DIR/stela.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Take the backup over the network from the daemon at ADDRESS (tls://HOST:PORT with
    /// --tls-ca and an admin --token-file or --tls-cert/--tls-key; tcp://HOST:PORT; a socket
    /// or a daemon's directory): the daemon sends its files' bytes, so this runs anywhere.
    #[arg(long, value_name = "ADDRESS", conflicts_with_all = ["dir", "socket"])]
    pub from: Option<String>,
    #[command(flatten)]
    pub tls: crate::node_address::NodeTls,
    /// Read the daemon's files at most this fast (e.g. 50MiB, 50MiB/s), so the copy leaves its
    /// disk to the commits [default: no limit].
    #[arg(long, value_name = "SIZE/s", value_parser = crate::units::parse_rate)]
    pub max_rate: Option<crate::units::Size>,
    /// Print the manifest and the totals as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `stela restore`'s arguments.
#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// The backup's directory (written by `stela backup`).
    #[arg(long, value_name = "DIR")]
    pub from: PathBuf,
    /// The daemon directory to lay the logs out in (DATADIR/logs/NAME); created if missing.
    /// `stela serve --dir DATADIR` then serves them.
    #[arg(long, value_name = "DATADIR", required_unless_present = "check")]
    pub to: Option<PathBuf>,
    /// Only check the backup (manifest, every file's checksum, every log verified); write
    /// nothing.
    #[arg(long)]
    pub check: bool,
}

/// What a backup did.
#[derive(Debug)]
pub struct BackupReport {
    pub manifest: Manifest,
    /// Bytes read from the daemon's files (holes included).
    pub read: u64,
    /// Bytes written into the backup (its holes excluded).
    pub written: u64,
    pub elapsed: Duration,
}

/// Backs up every log of the daemon serving `dir` (reached at `address`) into `to`, reading its
/// files at most `max_rate` bytes per second on average (`None`: as fast as they read).
///
/// # Errors
/// [`BackupError`]: the destination is not empty, the daemon does not answer, a file cannot be
/// read or written, or a copy does not verify or does not hold what was durable at the start.
pub fn backup(
    dir: &Path,
    address: &Address,
    to: &Path,
    max_rate: Option<u64>,
) -> Result<BackupReport> {
    let (began, clock) = (SystemTime::now(), Instant::now());
    prepare_destination(to)?;
    let listing = list_logs(address)?;
    let required = listing
        .iter()
        .map(|log| Ok((log, required_lsn(dir, log)?)))
        .collect::<Result<Vec<_>>>()?;
    let holder = std::fs::canonicalize(to).map_err(io(to, "resolving"))?;
    let _holds = Holds::take(dir, &holder, &listing)?;
    let source = (dir.display().to_string(), max_rate);
    copy_and_record(
        to,
        (began, clock),
        source,
        required,
        |(log, required), pace| copy_log(dir, to, &log.name, required, pace),
    )
}

/// What a local and a network backup share once the logs are held: copies each of `logs`
/// with `copy_one` (one pace for all, at most `max_rate` bytes per second), then writes the
/// manifest naming `source` and the time the backup `began`. Returns the report.
fn copy_and_record<L>(
    to: &Path,
    (began, clock): (SystemTime, Instant),
    (source, max_rate): (String, Option<u64>),
    logs: impl IntoIterator<Item = L>,
    mut copy_one: impl FnMut(L, &mut copy::Pace) -> Result<(LogCopy, (u64, u64))>,
) -> Result<BackupReport> {
    let (mut copies, mut read, mut written) = (Vec::new(), 0, 0);
    let mut pace = copy::Pace::new(max_rate);
    for log in logs {
        let (copy, totals) = copy_one(log, &mut pace)?;
        copies.push(copy);
        read += totals.0;
        written += totals.1;
    }
    let manifest = Manifest {
        format: manifest::FORMAT.to_owned(),
        version: manifest::VERSION,
        began: humantime::format_rfc3339_seconds(began).to_string(),
        finished: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        source,
        logs: copies,
    };
    write_manifest(to, &manifest)?;
    Ok(BackupReport {
        manifest,
        read,
        written,
        elapsed: clock.elapsed(),
    })
}

/// Creates `to` owner-only, or accepts it empty.
fn prepare_destination(to: &Path) -> Result<()> {
    copy::create_private_dir(to).map_err(io(to, "creating"))?;
    let mut entries = std::fs::read_dir(to).map_err(io(to, "listing"))?;
    if entries.next().is_some() {
        return Err(BackupError::NotEmpty(to.to_owned()));
    }
    Ok(())
}

fn list_logs(address: &Address) -> Result<Vec<LogListing>> {
    let daemon = |source| BackupError::Daemon {
        address: address.to_string(),
        source,
    };
    let answer = Connection::connect_admin(address)
        .map_err(daemon)?
        .request(RequestBody::ListLogs)
        .map_err(daemon)?;
    match answer {
        ResponseBody::Logs(logs) => Ok(logs),
        other => Err(BackupError::Unexpected(format!("{other:?}"))),
    }
}

/// The LSN the copy of `log` must reach: how far the daemon had synced it, or for a closed log
/// (whose files the daemon synced whole when it closed it) the last record in its files.
fn required_lsn(dir: &Path, log: &LogListing) -> Result<u64> {
    if let Some(durable) = log.durable_lsn {
        return Ok(durable);
    }
    let log_dir = dir.join("logs").join(&log.name);
    match stela_wal::tools::tail_last_lsn(&log_dir, &StdStorage) {
        Ok(last) => Ok(last.get()),
        Err(stela_wal::Error::NotALog { .. }) => Ok(0),
        Err(source) => Err(BackupError::Wal {
            log: log.name.clone(),
            source,
        }),
    }
}

/// The backup's holds on the daemon's logs, released when dropped.
struct Holds {
    logs: Vec<PathBuf>,
    holder: String,
}

impl Holds {
    fn take(dir: &Path, holder: &Path, listing: &[LogListing]) -> Result<Holds> {
        let mut holds = Holds {
            logs: Vec::new(),
            holder: holder.display().to_string(),
        };
        for log in listing {
            let log_dir = dir.join("logs").join(&log.name);
            let from = Lsn::new(log.first_lsn.max(1));
            stela_wal::holds::record(&StdStorage, &log_dir, holder, from)
                .map_err(io(&log_dir, "recording the backup's hold on"))?;
            holds.logs.push(log_dir);
        }
        Ok(holds)
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        for log_dir in &self.logs {
            if let Err(error) = stela_wal::holds::release(&StdStorage, log_dir, &self.holder) {
                tracing::warn!(log = %log_dir.display(), %error,
                    "the backup's hold could not be released: `stela logs release-hold` it");
            }
        }
    }
}

/// Copies the log `name` of the daemon's `dir` into `to/logs/name` and verifies the copy.
/// Returns it as the manifest lists it, with the bytes read and written.
fn copy_log(
    dir: &Path,
    to: &Path,
    name: &str,
    required: u64,
    pace: &mut copy::Pace,
) -> Result<(LogCopy, (u64, u64))> {
    let (source, target) = (dir.join("logs").join(name), to.join("logs").join(name));
    copy::create_private_dir(&target).map_err(io(&target, "creating"))?;
    let opened = open_in_order(&source)?;
    let (mut files, mut read, mut written) = (Vec::new(), 0, 0);
    for (file_name, file, bytes) in opened {
        let path = target.join(&file_name);
        let copied =
            copy::copy_file(&file, bytes, &path, pace).map_err(io(&path, "copying into"))?;
        read += copied.bytes;
        written += copied.written;
        files.push(FileCopy {
            name: file_name,
            bytes: copied.bytes,
            crc32c: copied.crc32c,
        });
    }
    copy::sync_dir(&target).map_err(io(&target, "syncing"))?;
    let (first_lsn, last_lsn) = verify_copy(&target, name, required)?;
    let copy = LogCopy {
        name: name.to_owned(),
        required_lsn: required,
        first_lsn,
        last_lsn,
        files,
    };
    Ok((copy, (read, written)))
}

/// Which files of a log directory a backup copies, in copy order (see the module's comment):
/// `SYNCED` first, segments in LSN order, other files, `TERMS` last. The lock, temporary files
/// and salvage directories are not part of the log.
fn copy_rank(name: &str) -> Option<(u8, String)> {
    if name == "LOCK" || name.ends_with(".tmp") || name.ends_with(".new") {
        return None;
    }
    let rank = match name {
        "SYNCED" => 0,
        _ if stela_format::segment_name::parse_segment_file_name(name).is_some() => 1,
        "TERMS" => 3,
        _ => 2,
    };
    Some((rank, name.to_owned()))
}

/// Opens every file the backup copies from `source`, in copy order, before any is read: a
/// segment removed afterwards is still read whole through its descriptor. A segment missing
/// before any was opened was truncated before the hold took effect (its records were released
/// by a client before the backup began) and is skipped; a file missing after that is an error.
/// `TERMS` is opened last, when its turn comes, so it is read after every segment.
fn open_in_order(source: &Path) -> Result<Vec<(String, File, u64)>> {
    let mut names: Vec<(u8, String)> = std::fs::read_dir(source)
        .map_err(io(source, "listing"))?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            entry.file_type().ok()?.is_file().then_some(())?;
            copy_rank(entry.file_name().to_str()?)
        })
        .collect();
    names.sort();
    let (mut opened, mut segments) = (Vec::new(), 0);
    for (rank, name) in names {
        let path = source.join(&name);
        match File::open(&path) {
            Ok(file) => {
                let bytes = file.metadata().map_err(io(&path, "reading the size of"))?;
                segments += usize::from(rank == 1);
                opened.push((name, file, bytes.len()));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && rank == 1 && segments == 0 => {
                tracing::info!(file = %path.display(), "truncated before the backup's hold: not copied");
            }
            Err(e) => return Err(io(&path, "opening")(e)),
        }
    }
    Ok(opened)
}

/// Verifies the log copied into `target` as `stela wal verify` does; it must be undamaged and
/// reach `required`. Returns its first and last LSN (0, 0 without records).
fn verify_copy(target: &Path, log: &str, required: u64) -> Result<(u64, u64)> {
    let report = match stela_wal::tools::verify(target, &StdStorage) {
        Ok(report) => report,
        Err(stela_wal::Error::NotALog { .. }) if required == 0 => return Ok((0, 0)),
        Err(source) => {
            return Err(BackupError::Wal {
                log: log.to_owned(),
                source,
            })
        }
    };
    if let Some(problem) = report.problems.first() {
        return Err(BackupError::CopyDamaged {
            log: log.to_owned(),
            problem: problem.clone(),
        });
    }
    let last = report.last_lsn.map_or(0, Lsn::get);
    if last < required {
        return Err(BackupError::Short {
            log: log.to_owned(),
            copied: last,
            required,
        });
    }
    debug_assert!(!report.is_damaged() && last >= required);
    Ok((report.first_lsn.map_or(0, Lsn::get), last))
}

/// Writes the manifest durably: a temporary file, synced, renamed, the directory synced.
fn write_manifest(to: &Path, manifest: &Manifest) -> Result<()> {
    for dir in [to.join("logs"), to.to_owned()] {
        if dir.exists() {
            copy::sync_dir(&dir).map_err(io(&dir, "syncing"))?;
        }
    }
    let temporary = to.join(format!("{}.tmp", manifest::FILE_NAME));
    let path = to.join(manifest::FILE_NAME);
    let mut file = File::create(&temporary).map_err(io(&temporary, "creating"))?;
    file.write_all(manifest.encode().as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io(&temporary, "writing"))?;
    std::fs::rename(&temporary, &path).map_err(io(&path, "renaming into"))?;
    copy::sync_dir(to).map_err(io(to, "syncing"))
}

/// Reads and checks the manifest of the backup in `from`.
///
/// # Errors
/// [`BackupError::NoManifest`], [`BackupError::BadManifest`], or the I/O error reading it.
pub fn read_manifest(from: &Path) -> Result<Manifest> {
    let path = from.join(manifest::FILE_NAME);
    let text = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(BackupError::NoManifest(from.to_owned()))
        }
        Err(e) => return Err(io(&path, "reading")(e)),
    };
    let text = String::from_utf8_lossy(&text);
    Manifest::decode(&text).map_err(|source| BackupError::BadManifest { path, source })
}

/// Checks the backup in `from` whole: its manifest, every file's length and checksum, and every
/// log verified (no damage, holding its `required_lsn`). Writes nothing.
///
/// # Errors
/// [`BackupError`] naming the first damaged file or log.
pub fn check(from: &Path) -> Result<Manifest> {
    let manifest = read_manifest(from)?;
    for log in &manifest.logs {
        let dir = from.join("logs").join(&log.name);
        for file in &log.files {
            let path = dir.join(&file.name);
            let (bytes, crc) = copy::checksum(&path).map_err(|e| BackupError::Damaged {
                path: path.clone(),
                why: format!("cannot be read: {e}"),
            })?;
            if (bytes, crc) != (file.bytes, file.crc32c) {
                return Err(BackupError::Damaged {
                    path,
                    why: format!(
                        "{bytes} bytes with CRC32C {crc:08x}; the manifest says {} bytes with {:08x}",
                        file.bytes, file.crc32c
                    ),
                });
            }
        }
        verify_copy(&dir, &log.name, log.required_lsn).map_err(|error| BackupError::Damaged {
            path: dir.clone(),
            why: error.to_string(),
        })?;
    }
    Ok(manifest)
}

/// Checks the backup in `from` ([`check`]), then lays its logs out in `to/logs/NAME`, each
/// under a temporary name until it is copied, checked and synced. Refuses a log that is
/// already in `to` before writing anything.
///
/// # Errors
/// [`BackupError`]: the backup is damaged, a log exists in `to`, or an I/O error.
pub fn restore(from: &Path, to: &Path) -> Result<Manifest> {
    let manifest = check(from)?;
    let logs = to.join("logs");
    for log in &manifest.logs {
        let target = logs.join(&log.name);
        if target.exists() {
            return Err(BackupError::Exists(target));
        }
    }
    copy::create_private_dir(&logs).map_err(io(&logs, "creating"))?;
    for log in &manifest.logs {
        restore_log(&from.join("logs").join(&log.name), &logs, log)?;
    }
    copy::sync_dir(&logs).map_err(io(&logs, "syncing"))?;
    copy::sync_dir(to).map_err(io(to, "syncing"))?;
    Ok(manifest)
}

/// Copies one checked log of the backup (`source`) to `logs/NAME` through a temporary name.
fn restore_log(source: &Path, logs: &Path, log: &LogCopy) -> Result<()> {
    let staging = logs.join(format!(".{}.restoring", log.name));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io(&staging, "removing a leftover"))?;
    }
    copy::create_private_dir(&staging).map_err(io(&staging, "creating"))?;
    for file in &log.files {
        let from = source.join(&file.name);
        let opened = File::open(&from).map_err(io(&from, "opening"))?;
        let path = staging.join(&file.name);
        let unpaced = &mut copy::Pace::new(None);
        let copied = copy::copy_file(&opened, file.bytes, &path, unpaced)
            .map_err(io(&path, "copying into"))?;
        if copied.crc32c != file.crc32c {
            return Err(BackupError::Damaged {
                path: from,
                why: "it changed while it was restored".to_owned(),
            });
        }
    }
    copy::sync_dir(&staging).map_err(io(&staging, "syncing"))?;
    let target = logs.join(&log.name);
    std::fs::rename(&staging, &target).map_err(io(&target, "renaming into"))
}

/// `stela backup`: runs it and prints what it copied.
pub fn run_backup(args: &BackupArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let max_rate = args.max_rate.map(crate::units::Size::get);
    let (report, source) = match &args.from {
        Some(from) => {
            let address = crate::node_address::address_of(from, &args.tls)?;
            (backup_remote(&address, &args.to, max_rate)?, from.clone())
        }
        None => {
            let socket = args.socket.clone();
            let address = Address::Unix(socket.unwrap_or_else(|| args.dir.join("stela.sock")));
            let report = backup(&args.dir, &address, &args.to, max_rate)?;
            (report, args.dir.display().to_string())
        }
    };
    if args.json {
        let totals = serde_json::json!({
            "manifest": report.manifest,
            "read_bytes": report.read,
            "written_bytes": report.written,
            "seconds": report.elapsed.as_secs_f64(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&totals)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "backup of {} into {}: {} log(s), every copy verified",
        source,
        args.to.display(),
        report.manifest.logs.len()
    )?;
    print_logs(&report.manifest, out)?;
    writeln!(
        out,
        "read {} bytes, wrote {} bytes (the rest are holes) in {:.2} s",
        report.read,
        report.written,
        report.elapsed.as_secs_f64()
    )?;
    Ok(())
}

/// `stela restore`: checks the backup, and unless `--check`, lays it out.
pub fn run_restore(args: &RestoreArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let manifest = match (&args.to, args.check) {
        (Some(to), false) => restore(&args.from, to)?,
        _ => check(&args.from)?,
    };
    let verb = match (&args.to, args.check) {
        (Some(to), false) => format!("restored into {}", to.display()),
        _ => "checked".to_owned(),
    };
    writeln!(
        out,
        "backup {} (taken {} from {}): {verb}, every file's checksum and every log verified",
        args.from.display(),
        manifest.began,
        manifest.source
    )?;
    print_logs(&manifest, out)?;
    Ok(())
}

fn print_logs(manifest: &Manifest, out: &mut dyn Write) -> std::io::Result<()> {
    for log in &manifest.logs {
        writeln!(
            out,
            "  {}: LSNs {}..={} (durable when the backup began: {}), {} file(s)",
            log.name,
            log.first_lsn,
            log.last_lsn,
            log.required_lsn,
            log.files.len()
        )?;
    }
    Ok(())
}
