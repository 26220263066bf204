//! `stela run`: starts a program with the preload library, so that its changes to files under
//! the durable directories are records in a log of the daemon and their fsyncs return at the
//! log's level (crates/stela-run).

use crate::mount_cmd::LevelArg;
use crate::service::TargetArgs;
use std::ffi::OsString;
use std::path::PathBuf;

/// `stela run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// A directory whose files are made durable through the daemon (repeat for more).
    #[arg(long = "durable", value_name = "DIR", required = true)]
    pub durable: Vec<PathBuf>,
    /// What an fsync of those files waits for: buffered (in the daemon's protected memory),
    /// disk (fdatasync'ed by the daemon), replicated (in the standby's memory too) or all.
    #[arg(long, value_enum, default_value_t = LevelArg::Disk)]
    pub level: LevelArg,
    /// The log in the daemon (default: `run-` and the first directory's path).
    #[arg(long, value_name = "NAME")]
    pub log: Option<String>,
    /// Milliseconds between background syncs of the files (after which the log is truncated
    /// behind them).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub sync_every_ms: u64,
    #[command(flatten)]
    pub target: TargetArgs,
    /// The program and its arguments (after `--`).
    #[arg(trailing_var_arg = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<OsString>,
}

/// The default log name of a directory: `run-` and its canonical path with every byte that a
/// log name may not hold made `_` (the end kept if it is long).
fn default_log(dir: &std::path::Path) -> String {
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    let name: String = canonical
        .to_string_lossy()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let keep = name.len().saturating_sub(90);
    format!("run-{}", &name[keep..])
}

pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    let socket = match args.target.address()? {
        stela_client::Address::Unix(path) => path,
        other => anyhow::bail!(
            "stela run needs the daemon on this machine (a Unix socket, for the shared-memory \
             ring); got {other}"
        ),
    };
    let log = args.log.unwrap_or_else(|| default_log(&args.durable[0]));
    let mut command = args.command.into_iter();
    let program = PathBuf::from(command.next().expect("clap requires the program"));
    let options = stela_run::RunOptions {
        socket,
        log,
        level: args.level.into(),
        dirs: args.durable,
        sync_every: std::time::Duration::from_millis(args.sync_every_ms.max(1)),
        library: None,
        program,
        args: command.collect(),
    };
    Ok(stela_run::run(options)?)
}
