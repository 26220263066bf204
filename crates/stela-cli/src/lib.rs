//! The `stela` command line (the product): argument parsing and the commands behind it.
//!
//! - `stela demo` ([`demo`]): the main job; starts the log daemon in this process and compares
//!   commits/s and latency of fdatasync per commit, the daemon's `buffered`, and no fsync (~8 s).
//! - `stela wal dump|verify|repair DIR`: offline tools for a log directory.
//! - `stela serve --dir DIR` ([`service`]): the log daemon; `stela status`, `stela power-fail`,
//!   `stela power-restore` talk to a running one.
//!
//! Under the demo: [`drive`], the timed commit loops of N clients in each [`drive::Mode`]
//! (embedded, or through a daemon in this process), and [`latency`], their latency histogram.
//! The benchmarks (`stela-bench`, a binary of its own) measure through the same [`drive`];
//! nothing here depends on them or on their peers.
//!
//! Exit codes ([`exit`]): 0 success (`verify`: clean; `status`: healthy), 1 the log is
//! damaged, 2 bad arguments or another failure, 3 the daemon is unhealthy, 4 not a log,
//! 5 the log is locked by another process, 6 no daemon answers, 7 `verify`: not damaged, but
//! opening the log would cut records whose checksums are good.

pub mod alloc;
pub mod backup;
pub mod cluster_cmd;
pub mod demo;
pub mod drive;
pub mod exit;
pub mod latency;
pub mod logs_cmd;
pub mod mount_cmd;
pub mod node_address;
pub mod run_cmd;
pub mod service;
pub mod store_cmd;
pub mod tail_cmd;
pub mod units;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use stela_wal::storage::StdStorage;
use stela_wal::tools::{self, VerifyReport};
use stela_wal::Lsn;

#[derive(Parser, Debug)]
#[command(
    name = "stela",
    version,
    about = "Durability and availability as a service, outside the database",
    after_help = exit::HELP,
    args_override_self = true
)]
pub struct Cli {
    /// How log lines are written to stderr: `text`, or `json` (one object per line).
    ///
    /// `json` is for log collectors. The level comes from RUST_LOG (default: `info` for
    /// `serve`, `witness` and `mount`, `warn` else).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Compare commits: fdatasync per commit, the daemon's `buffered`, no fsync (~8 s).
    ///
    /// Throughput and latency side by side, with what each survives; the daemon runs in this
    /// process on a temporary directory.
    Demo(demo::DemoArgs),
    /// Tools for a write-ahead log directory.
    #[command(subcommand)]
    Wal(WalCommand),
    /// Run the log daemon on a directory.
    ///
    /// The RapiLog log service: clients commit on DIR/stela.sock (and TCP with --tcp) at
    /// `buffered` or `disk`, and, with a standby, `replicated` and `all`. Settings and their
    /// defaults: docs/DAEMON.md; `--print-config` shows the effective ones.
    Serve(Box<service::ServeArgs>),
    /// Show a running daemon's state; exit 3 when unhealthy (a health check).
    ///
    /// Buffers, dirty-byte cap, logs, replication and what each acknowledgement survives.
    /// Unhealthy: a power-fail notice in force, a log stopped or waiting for disk space, a
    /// standby not connected. No daemon at the address: exit 6.
    Status {
        #[command(flatten)]
        target: service::TargetArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Tell a running daemon power is failing: write and sync everything now.
    ///
    /// It stops admitting writes, writes and syncs every buffer, and refuses writes until
    /// power-restore.
    PowerFail(service::TargetArgs),
    /// Tell a running daemon power is back: writes are admitted again.
    PowerRestore(service::TargetArgs),
    /// Copy a running daemon's logs into a new directory, verified (pg_basebackup).
    ///
    /// Every record acknowledged at `disk` before it began is in the copy; the daemon keeps
    /// serving. With --dir it runs on the daemon's machine and reads DIR/logs; with --from
    /// ADDRESS it runs anywhere and the daemon sends its files to an authenticated
    /// administrator. See docs/BACKUP.md.
    Backup(backup::BackupArgs),
    /// Check a backup and lay its logs out as a daemon's directory
    ///
    /// `stela serve --dir` that directory then serves them.
    ///
    /// Refuses a damaged backup (exit 1) and never overwrites a log. `--check` writes nothing.
    Restore(backup::RestoreArgs),
    /// The logs a running daemon holds: list, tail, delete.
    #[command(subcommand)]
    Logs(logs_cmd::LogsCommand),
    /// A failover pair at a glance, and a planned switchover.
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCommand),
    /// Run the witness of a failover pair (the arbiter on a third machine).
    ///
    /// It grants the next epoch to a standby only once its primary has stopped renewing for a
    /// lease.
    Witness(WitnessArgs),
    /// Mount a file system whose every change is a log record of the daemon.
    ///
    /// fsync returns at the log's level; files are materialised from the log in the
    /// background. Serves until unmounted (fusermount3 -u, SIGTERM or SIGINT).
    Mount(Box<mount_cmd::MountArgs>),
    /// On a standby node: keep a mount's backing directory current from the standby's log.
    ///
    /// After a promotion `stela mount` on it starts at once. Runs until SIGTERM or SIGINT
    /// (then applies what is readable, writes its snapshot and exits).
    MountFollow(mount_cmd::FollowArgs),
    /// Run a program with its --durable directories made durable by the daemon, no FUSE
    ///
    /// A preload library logs every write and answers their fsyncs at the level. Replays the
    /// log onto the files first; stays until every process of the program has exited, syncing
    /// the files and truncating the log behind them.
    Run(run_cmd::RunArgs),
    /// On a standby node: keep a stela-store directory current from the standby's log
    ///
    /// The standby daemon's copy of the store's log is applied as it arrives, so that after a
    /// promotion the store opened on it has little to redo. Runs until SIGTERM or SIGINT (then
    /// applies what is readable and exits).
    StoreFollow(store_cmd::StoreFollowArgs),
}

/// `stela witness`.
#[derive(clap::Args, Debug)]
pub struct WitnessArgs {
    /// Where the nodes reach it (their --coordinator tcp://ADDR).
    #[arg(long, value_name = "ADDR")]
    pub listen: std::net::SocketAddr,
    /// Where it keeps the epoch and its holder (DIR/WITNESS).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// How long the primary may go without renewing before a standby may be promoted.
    ///
    /// The nodes' --suspect-after should match. A bare number is milliseconds (`--lease-ms`,
    /// the old name, still works).
    #[arg(long = "lease", alias = "lease-ms", value_name = "DURATION",
          default_value_t = units::Dur(std::time::Duration::from_millis(300)),
          value_parser = units::parse_ms)]
    pub lease_ms: units::Dur,
    /// Tokens that prove a node (one a line; each node sends one with --coordinator-token-file).
    ///
    /// Needed unless --listen is a loopback address: without it only loopback peers running as
    /// the witness's own user (or root) are served.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum WalCommand {
    /// Print every record as a JSON line: {"lsn": N, "record": ...}.
    ///
    /// On damage: the valid prefix, then the damage on stderr and exit 1.
    Dump {
        /// The log's directory (a daemon's log is DIR/logs/NAME).
        dir: PathBuf,
        /// Start at this LSN.
        #[arg(long, value_name = "LSN", default_value_t = 1)]
        from: u64,
        /// Stop after this LSN (inclusive).
        #[arg(long, value_name = "LSN")]
        to: Option<u64>,
        /// Print at most this many records.
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
        /// One readable line per record: `lsn N  len B  {record}`.
        #[arg(long, conflicts_with = "stats")]
        text: bool,
        /// Print only counts: records, LSN range, payload bytes (total, min, mean, max).
        #[arg(long)]
        stats: bool,
    },
    /// Check every segment: exit 0 clean, 1 damaged, 4 not a log, 7 would cut records.
    ///
    /// A torn tail is reported but is not damage: opening the log removes it. Exit 7: not
    /// damaged, but opening the log would cut records whose checksums are good (it says how
    /// many).
    Verify {
        /// The log's directory (a daemon's log is DIR/logs/NAME).
        dir: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a torn tail (with --corrupt-suffix, a corrupt suffix), keeping a copy.
    ///
    /// Every removed byte is kept in a salvage folder under DIR.
    Repair {
        /// The log's directory (a daemon's log is DIR/logs/NAME; the daemon must be stopped).
        dir: PathBuf,
        /// Also cut a corrupt suffix: keep only the records before the first damage.
        #[arg(long)]
        corrupt_suffix: bool,
        /// Say what would be cut, and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// List what reprotection cut from a node's logs after a failover.
    ///
    /// Each copy's log, LSN range, records, bytes, reason, and whether it is complete. A copy
    /// is a log directory `stela wal dump` reads.
    Salvage {
        /// The daemon's directory, or its `salvage` folder.
        dir: PathBuf,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
}

/// Parses `args` and runs the command; returns the process exit code.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let args = match expand_config_file(args) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("stela: {}", exit::render(&error));
            return ExitCode::from(exit::USAGE_OR_FAILURE);
        }
    };
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // The daemon logs its connections, log opens and administrative requests at info; the
    // tools only their warnings.
    let default_level = if matches!(
        cli.command,
        Command::Serve(_)
            | Command::Witness(_)
            | Command::Mount(_)
            | Command::MountFollow(_)
            | Command::StoreFollow(_)
            | Command::Run(_)
    ) {
        "info"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_level.into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match cli.log_format {
        LogFormat::Json => logs.json().try_init(),
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match execute(cli.command, &mut out) {
        Ok(code) => code,
        Err(error) => {
            let _ = out.flush();
            eprintln!("stela: {}", exit::render(&error));
            exit::code_of(&error)
        }
    }
}

/// `stela serve --config FILE`: the file's settings go in as flags right after `serve`, so
/// the command line's own flags (later) override them. Other commands pass unchanged.
///
/// # Errors
/// The file cannot be read or is not a table of settings.
pub fn expand_config_file(mut args: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let Some(serve) = args.iter().position(|a| a == "serve") else {
        return Ok(args);
    };
    let file = args[serve..].iter().enumerate().find_map(|(i, a)| {
        let a = a.to_str()?;
        match a.strip_prefix("--config") {
            Some("") => args.get(serve + i + 1).cloned(),
            Some(rest) => rest.strip_prefix('=').map(OsString::from),
            None => None,
        }
    });
    if let Some(file) = file {
        let flags = service::config_file_flags(Path::new(&file), &serve_command())?;
        args.splice(serve + 1..serve + 1, flags);
    }
    Ok(args)
}

/// `stela serve` as clap sees it: the flags a config file may set, and their parsers.
fn serve_command() -> clap::Command {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    cli.build();
    cli.find_subcommand("serve")
        .cloned()
        .expect("`stela serve` is a subcommand")
}

/// What SIGHUP re-reads for a daemon started with `--config`: this process's command line with
/// the file read again.
fn reload_from_command_line(
) -> Result<stela_server::DaemonConfig, Box<dyn std::error::Error + Send + Sync>> {
    let args = expand_config_file(std::env::args_os().collect())
        .map_err(|e| ReloadError::ConfigFile(exit::render(&e)))?;
    let cli = Cli::try_parse_from(args).map_err(ReloadError::Flags)?;
    match cli.command {
        Command::Serve(serve) => Ok(serve.config()),
        _ => Err(ReloadError::NotServe.into()),
    }
}

/// Why SIGHUP found no configuration to apply.
#[derive(Debug, thiserror::Error)]
enum ReloadError {
    /// The `--config` file could not be read as flags (its causes, rendered).
    #[error("{0}")]
    ConfigFile(String),
    #[error("{0}")]
    Flags(clap::Error),
    #[error("not a `stela serve` command line")]
    NotServe,
}

/// Runs one command, writing its output to `out`.
pub fn execute(command: Command, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    match command {
        Command::Demo(args) => {
            demo::run_demo(&args, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Wal(WalCommand::Dump {
            dir,
            from,
            to,
            limit,
            text,
            stats,
        }) => {
            let options = tools::DumpOptions {
                from: Lsn::new(from.max(1)),
                to: to.map(Lsn::new),
                limit,
                format: if stats {
                    tools::DumpFormat::Stats
                } else if text {
                    tools::DumpFormat::Text
                } else {
                    tools::DumpFormat::JsonLines
                },
            };
            let dumped = tools::dump_with(&dir, Arc::new(StdStorage), options, out)?;
            if stats {
                print_dump_stats(&dumped, out)?;
            }
            if dumped.problems.is_empty() {
                return Ok(ExitCode::SUCCESS);
            }
            // The valid prefix is printed; the damage after it is said, and the exit is
            // verify's, so a script never takes a damaged log's dump for the whole log.
            out.flush()?;
            eprintln!(
                "stela: {}: damaged after the {} record(s) above:",
                dir.display(),
                dumped.records
            );
            for problem in &dumped.problems {
                eprintln!("  CORRUPT: {problem}");
            }
            Ok(ExitCode::from(exit::DAMAGED))
        }
        Command::Wal(WalCommand::Verify { dir, json }) => {
            let report = tools::verify(&dir, &StdStorage)?;
            if json {
                writeln!(out, "{}", verify_json(&report))?;
            } else {
                print_verify(&dir, &report, out)?;
            }
            Ok(if report.is_damaged() {
                ExitCode::from(exit::DAMAGED)
            } else if report.would_cut_records() > 0 {
                ExitCode::from(exit::WOULD_CUT_RECORDS)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Wal(WalCommand::Salvage { dir, json }) => {
            // A daemon's directory (it has `logs`) or its salvage folder.
            let root = if dir.join("logs").is_dir() || dir.join("salvage").is_dir() {
                dir.join("salvage")
            } else {
                dir
            };
            let entries = stela_wal::salvage::list(&StdStorage, &root)?;
            if entries.is_empty() && !json {
                writeln!(out, "nothing salvaged under {}", root.display())?;
            }
            for entry in &entries {
                match (&entry.manifest, json) {
                    (Some(m), true) => writeln!(
                        out,
                        "{}",
                        serde_json::json!({
                            "dir": entry.dir, "complete": true, "log": m.log,
                            "cut_from_lsn": m.cut_from_lsn, "last_lsn": m.last_lsn,
                            "records": m.records, "bytes": m.bytes, "reason": m.reason,
                            "at_unix_ms": m.at_unix_ms, "terms": m.terms,
                        })
                    )?,
                    (Some(m), false) => writeln!(
                        out,
                        "{}: log {}, LSNs {}..={} ({} records, {} bytes) cut at {} (unix ms): {}",
                        entry.dir.display(),
                        m.log,
                        m.cut_from_lsn,
                        m.last_lsn,
                        m.records,
                        m.bytes,
                        m.at_unix_ms,
                        m.reason
                    )?,
                    (None, true) => writeln!(
                        out,
                        "{}",
                        serde_json::json!({"dir": entry.dir, "complete": false})
                    )?,
                    (None, false) => writeln!(
                        out,
                        "{}: INCOMPLETE (a crash interrupted the copy; the log was not cut for it)",
                        entry.dir.display()
                    )?,
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Wal(WalCommand::Repair {
            dir,
            corrupt_suffix,
            dry_run,
        }) => {
            let plan = tools::verify(&dir, &StdStorage)?;
            print_repair_plan(&plan, corrupt_suffix, dry_run, out)?;
            if dry_run {
                return Ok(ExitCode::SUCCESS);
            }
            let report = tools::repair(&dir, Arc::new(StdStorage), corrupt_suffix)
                .map_err(anyhow::Error::from)
                .map_err(|error| {
                    if !corrupt_suffix && plan.is_damaged() {
                        error.context(format!(
                            "{}: damaged, not torn: nothing was changed; `stela wal repair \
                             --corrupt-suffix` cuts the log at the damage, keeping a copy \
                             (add --dry-run to see what it would cut)",
                            dir.display()
                        ))
                    } else {
                        error
                    }
                })?;
            match &report.torn_tail {
                Some((path, torn)) => writeln!(
                    out,
                    "removed a torn write of {} bytes at offset {} of {} ({})",
                    torn.bytes,
                    torn.offset,
                    path.display(),
                    torn.reason
                )?,
                None => writeln!(out, "no torn tail")?,
            }
            let kept: u64 = report
                .salvaged_records
                .iter()
                .map(|(first, last, _)| last.get() - first.get() + 1)
                .sum();
            if let Some((_, torn)) = &report.torn_tail {
                writeln!(
                    out,
                    "records cut with the torn write that had good checksums: {} (never synced, \
                     so never acknowledged at disk); kept: {kept}",
                    torn.unsynced_records
                )?;
            }
            // Between the cut point and the records kept, and between kept runs: LSNs whose
            // frames did not survive. Every record removed is either kept or counted here.
            let mut expected = report.last_lsn.next();
            for (first, last, dir) in &report.salvaged_records {
                if *first > expected {
                    writeln!(
                        out,
                        "dropped, unreadable: {} record(s), LSNs {expected}..={}",
                        first.get() - expected.get(),
                        Lsn::new(first.get() - 1)
                    )?;
                }
                writeln!(
                    out,
                    "kept records {first}..={last} as a log in {} (stela wal dump reads it)",
                    dir.display()
                )?;
                expected = last.next();
            }
            for (path, damage) in &report.damage {
                writeln!(
                    out,
                    "cut the log at offset {} of {}: {}",
                    damage.offset,
                    path.display(),
                    damage.reason
                )?;
            }
            if let Some(salvage) = &report.salvage_dir {
                writeln!(
                    out,
                    "removed bytes and segments are kept in {}",
                    salvage.display()
                )?;
            }
            if report.last_lsn < report.first_lsn || report.last_lsn == Lsn::ZERO {
                writeln!(
                    out,
                    "log now holds no records in {} segment(s)",
                    report.segments
                )?;
            } else {
                writeln!(
                    out,
                    "log now holds LSNs {}..={} in {} segment(s)",
                    report.first_lsn, report.last_lsn, report.segments
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(args) => {
            let reload: Option<stela_server::server::ReloadHook> = args
                .config
                .is_some()
                .then(|| Box::new(reload_from_command_line) as stela_server::server::ReloadHook);
            service::serve(*args, reload, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Witness(args) => {
            if args.token_file.is_none() && !args.listen.ip().is_loopback() {
                anyhow::bail!(
                    "the witness on {} needs --token-file: without tokens it serves only loopback \
                     peers running as its own user",
                    args.listen
                );
            }
            let tokens = args
                .token_file
                .as_deref()
                .map(stela_coord::witness::Tokens::load)
                .transpose()
                .context("--token-file")?;
            let auth = stela_coord::witness::WitnessAuth {
                tokens,
                ..Default::default()
            };
            let witness = stela_coord::witness::Witness::start_with(
                args.listen,
                &args.dir,
                args.lease_ms.get().max(std::time::Duration::from_millis(1)),
                auth,
            )
            .with_context(|| {
                format!(
                    "starting the witness on {} in {}",
                    args.listen,
                    args.dir.display()
                )
            })?;
            writeln!(
                out,
                "stela witness: listening on {}; state in {}",
                witness.addr(),
                args.dir.display()
            )?;
            out.flush()?;
            // Runs until SIGTERM or SIGINT; every change is on disk before it is answered, so
            // stopping needs nothing written.
            let mut signals = signal_hook::iterator::Signals::new([
                signal_hook::consts::SIGTERM,
                signal_hook::consts::SIGINT,
            ])?;
            let _ = signals.forever().next();
            drop(witness);
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { target, json } => {
            let problems = match service::status(target, json, out) {
                Ok(problems) => problems,
                // A monitor parsing the output gets JSON whatever happened; stderr says why.
                Err(error) if json => {
                    writeln!(
                        out,
                        "{}",
                        serde_json::to_string_pretty(&service::status_failure_json(&error))?
                    )?;
                    return Err(error);
                }
                Err(error) => return Err(error),
            };
            Ok(if problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(service::EXIT_UNHEALTHY)
            })
        }
        Command::PowerFail(target) => {
            service::power_fail(target, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::PowerRestore(target) => {
            service::power_restore(target, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Cluster(command) => {
            cluster_cmd::run(command, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Backup(args) => {
            backup::run_backup(&args, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Restore(args) => {
            backup::run_restore(&args, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Logs(command) => {
            logs_cmd::run(command, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Mount(args) => {
            mount_cmd::run(*args, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::MountFollow(args) => {
            mount_cmd::follow(args, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::StoreFollow(args) => {
            store_cmd::follow(args, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => Ok(ExitCode::from(run_cmd::run(args)?.clamp(0, 255) as u8)),
    }
}

/// What `wal repair` is about to cut (or, with `--dry-run`, would), from `verify`'s reading of
/// the log, said before anything changes.
fn print_repair_plan(
    plan: &VerifyReport,
    corrupt_suffix: bool,
    dry_run: bool,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let verb = if dry_run { "would" } else { "will" };
    if let Some((path, torn)) = &plan.torn_tail {
        writeln!(
            out,
            "{verb} remove a torn write of {} bytes at offset {} of {} ({} record(s) in it with \
             good checksums, never synced, kept in salvage)",
            torn.bytes,
            torn.offset,
            path.display(),
            torn.unsynced_records
        )?;
    }
    match (plan.is_damaged(), plan.valid_prefix_end) {
        (true, Some(end)) if corrupt_suffix => writeln!(
            out,
            "{verb} cut the log at LSN {end}, keeping LSNs {}..={} ({}); from LSN {end} on, \
             records with good checksums are kept in salvage and the rest counted as dropped",
            plan.first_lsn.map_or(0, Lsn::get),
            end.get().saturating_sub(1),
            plan.problems.first().map_or("damaged", String::as_str)
        )?,
        (true, _) if corrupt_suffix => writeln!(out, "{verb} set the damaged segments aside")?,
        (true, _) => writeln!(
            out,
            "damaged, not torn ({}): without --corrupt-suffix nothing is cut",
            plan.problems.first().map_or("damaged", String::as_str)
        )?,
        (false, _) if plan.torn_tail.is_none() => writeln!(out, "nothing to cut")?,
        _ => {}
    }
    Ok(())
}

/// `wal dump --stats`: what the records read add up to.
fn print_dump_stats(dumped: &tools::DumpReport, out: &mut dyn Write) -> std::io::Result<()> {
    match (dumped.first, dumped.last) {
        (Some(first), Some(last)) => writeln!(
            out,
            "records: {}, LSNs {first}..={last}, codec {}",
            dumped.records,
            dumped.codec.map_or("-", |c| c.name())
        )?,
        _ => writeln!(out, "records: 0")?,
    }
    if dumped.records > 0 {
        writeln!(
            out,
            "payload bytes: {} in all; per record min {}, mean {:.1}, max {}",
            dumped.payload_bytes,
            dumped.min_payload,
            dumped.payload_bytes as f64 / dumped.records as f64,
            dumped.max_payload
        )?;
    }
    Ok(())
}

fn print_verify(dir: &Path, report: &VerifyReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{}: {} segment(s), {} record(s), LSNs {}..={}, codec {}",
        dir.display(),
        report.segments.len(),
        report.records,
        report.first_lsn.map_or(0, Lsn::get),
        report.last_lsn.map_or(0, Lsn::get),
        report.codec.map_or("-", |c| c.name())
    )?;
    if let Some(mark) = &report.synced_mark {
        writeln!(
            out,
            "synced end: offset {} of segment {} (nothing below it is a torn write)",
            mark.synced_offset, mark.segment_start
        )?;
    }
    if let Some((path, torn)) = &report.torn_tail {
        writeln!(
            out,
            "torn tail (not corruption; removed when the log is opened or repaired): {} bytes at offset {} of {}: {}",
            torn.bytes,
            torn.offset,
            path.display(),
            torn.reason
        )?;
    }
    for problem in &report.problems {
        writeln!(out, "CORRUPT: {problem}")?;
    }
    let cut = report.would_cut_records();
    if report.is_damaged() {
        writeln!(out, "damaged")
    } else if cut > 0 {
        writeln!(
            out,
            "not clean: opening or repairing the log would cut {cut} record(s) whose checksums are \
             good (never synced; `stela wal repair` keeps a copy)"
        )
    } else {
        writeln!(out, "clean")
    }
}

fn verify_json(report: &VerifyReport) -> serde_json::Value {
    serde_json::json!({
        "clean": report.is_clean(),
        "damaged": report.is_damaged(),
        "would_cut_records": report.would_cut_records(),
        "synced_mark": report.synced_mark.map(|m| serde_json::json!({
            "segment_start": m.segment_start.get(), "offset": m.synced_offset,
        })),
        "segments": report.segments.len(),
        "records": report.records,
        "first_lsn": report.first_lsn.map(Lsn::get),
        "last_lsn": report.last_lsn.map(Lsn::get),
        "codec": report.codec.map(|c| c.name()),
        "torn_tail": report.torn_tail.as_ref().map(|(path, torn)| serde_json::json!({
            "segment": path, "offset": torn.offset, "bytes": torn.bytes, "reason": torn.reason,
        })),
        "problems": report.problems,
    })
}
