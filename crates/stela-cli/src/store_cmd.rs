//! `stela store-follow`: a standby node's warm copy of a stela-store, kept current from the
//! standby daemon's copy of the store's log until SIGTERM/SIGINT (`stela_store::Follower`).
//! After a promotion, the store opened on the same directory and the promoted daemon
//! (`Store::open_on_daemon`) has its pages current and little to redo.

use crate::service::TargetArgs;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// `stela store-follow`.
#[derive(clap::Args, Debug)]
pub struct StoreFollowArgs {
    /// The follower's directory: the one the store opens after a promotion (empty, or one
    /// this command made).
    #[arg(value_name = "DIR")]
    pub store_dir: PathBuf,
    /// The standby daemon's copy of the store's log: its `--dir`, then `logs/NAME`.
    #[arg(long, value_name = "DIR")]
    pub log_dir: PathBuf,
    /// The standby daemon (asked how far its copy agrees with the primary's: records a
    /// returning old primary holds beyond that may be cut by reprotection).
    #[command(flatten)]
    pub target: TargetArgs,
}

pub fn follow(args: StoreFollowArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    let agreement = stela_store::Agreement::StandbyDaemon(args.target.address()?);
    let mut follower = stela_store::Follower::open(&args.store_dir, &args.log_dir, agreement)?;
    writeln!(
        out,
        "stela store-follow: {} follows {} from {}",
        args.store_dir.display(),
        args.log_dir.display(),
        follower.applied()
    )?;
    out.flush()?;
    follower.run(&stop, Duration::from_millis(50), &mut |report| {
        if report.replayed > 0 {
            tracing::debug!(
                applied = report.applied.get(),
                replayed = report.replayed,
                written = report.written,
                "stela store-follow: round"
            );
        }
    })?;
    writeln!(
        out,
        "stela store-follow: stopped; every change up to {} is in {}",
        follower.applied(),
        args.store_dir.display()
    )?;
    Ok(())
}
