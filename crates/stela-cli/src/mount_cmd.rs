//! `stela mount`: serves a stela-backed file system on a mount point until it is unmounted
//! (`fusermount3 -u`, SIGTERM or SIGINT). `stela mount-follow`: a standby node's copy of the
//! files, kept current from the standby daemon's copy of the mount's log until SIGTERM/SIGINT.

use crate::service::TargetArgs;
use std::io::Write;
use std::path::PathBuf;

/// `stela mount`.
#[derive(clap::Args, Debug)]
pub struct MountArgs {
    /// An empty directory to mount on.
    pub mountpoint: PathBuf,
    /// The log in the daemon that records every change (created if missing).
    #[arg(long, value_name = "NAME")]
    pub log: String,
    /// Where the files are materialised from the log, with the snapshot of their names.
    #[arg(long, value_name = "DIR")]
    pub backing: PathBuf,
    /// What fsync and fsyncdir wait for: buffered (in the daemon's protected memory), disk
    /// (fdatasync'ed by the daemon), replicated (in the standby's memory too) or all.
    #[arg(long, value_enum, default_value_t = LevelArg::Disk)]
    pub level: LevelArg,
    /// Threads answering the kernel.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Let every user reach the mount (PostgreSQL runs as its own user): root, or
    /// user_allow_other in /etc/fuse.conf.
    #[arg(long)]
    pub allow_other: bool,
    /// MiB of logged file data not yet materialised above which writes wait.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub overlay_cap_mib: u64,
    /// Let the kernel cache writes and send them in large pieces at fsync (FUSE's writeback
    /// cache). fsync still returns at --level; a write not yet fsync'ed is then lost if the
    /// mount process crashes (without it, every answered write is already in the daemon).
    #[arg(long)]
    pub writeback_cache: bool,
    #[command(flatten)]
    pub target: TargetArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum LevelArg {
    Buffered,
    Disk,
    Replicated,
    All,
}

impl From<LevelArg> for stela_client::Durability {
    fn from(level: LevelArg) -> Self {
        match level {
            LevelArg::Buffered => stela_client::Durability::Buffered,
            LevelArg::Disk => stela_client::Durability::Disk,
            LevelArg::Replicated => stela_client::Durability::Replicated,
            LevelArg::All => stela_client::Durability::All,
        }
    }
}

pub fn run(args: MountArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut options =
        stela_mount::MountOptions::new(args.target.address()?, &args.log, &args.backing);
    options.level = args.level.into();
    options.threads = args.threads;
    options.allow_other = args.allow_other;
    options.overlay_cap = args.overlay_cap_mib << 20;
    options.writeback_cache = args.writeback_cache;
    // Signals are caught from here on, so that one arriving while the log is analysed or the
    // file system mounted is not fatal: it stops the mount as soon as it serves.
    let signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ]);
    let prepared = stela_mount::prepare(&options)?;
    let mountpoint = args.mountpoint.clone();
    prepared.run(&args.mountpoint, |stopper| {
        let _ = writeln!(
            out,
            "stela mount: {} is log {:?} at {:?}; files materialised in {}",
            mountpoint.display(),
            options.log,
            args.level,
            options.backing.display()
        );
        let _ = out.flush();
        // SIGTERM and SIGINT stop the mount: it unmounts (retrying while busy, then detaching
        // lazily), the materialiser makes its last checkpoint, and the process exits, all
        // within a bound (stela_mount::Prepared::run).
        match signals {
            Ok(mut signals) => {
                std::thread::spawn(move || {
                    if signals.forever().next().is_some() {
                        tracing::info!("stela mount: stopping on a signal");
                        stopper.stop();
                    }
                });
            }
            Err(e) => {
                tracing::warn!("stela mount: no signal handler ({e}); unmount with fusermount3 -u")
            }
        }
    })?;
    Ok(())
}

/// `stela mount-follow`.
#[derive(clap::Args, Debug)]
pub struct FollowArgs {
    /// The standby daemon's copy of the mount's log: its `--dir`, then `logs/NAME`.
    #[arg(long, value_name = "DIR")]
    pub log_dir: PathBuf,
    /// This node's backing directory (the one `stela mount --backing` uses after a promotion).
    #[arg(long, value_name = "DIR")]
    pub backing: PathBuf,
    /// The standby daemon (asked how far its copy agrees with the primary's: records a
    /// returning old primary holds beyond that may be cut by reprotection).
    #[command(flatten)]
    pub target: TargetArgs,
}

pub fn follow(args: FollowArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, std::sync::Arc::clone(&stop))?;
    }
    writeln!(
        out,
        "stela mount-follow: {} follows {}",
        args.backing.display(),
        args.log_dir.display()
    )?;
    out.flush()?;
    stela_mount::run_follower(
        &args.log_dir,
        args.target.address()?,
        &args.backing,
        &stop,
        &|applied| {
            tracing::debug!(applied, "stela mount-follow: checkpoint");
        },
    )?;
    Ok(())
}
