//! Timed commit loops, shared by `stela demo` and `stela-bench commit`: the six ways a client
//! can commit a record ([`Mode`]), opening what each needs (an embedded log, or a daemon plus
//! one connection per client), and N client threads committing for a fixed time. It lives with
//! the product because the demo is the product's main job; the benchmark crate drives its runs
//! through it (never the other way round).
//!
//! The daemon of a service run ([`ServiceRun`]) is either started in this process for the run
//! ([`Daemon::InProcess`], in the run's directory) or one already running
//! ([`Daemon::Running`], whose own settings then apply; the run writes a log of its own there,
//! which must be new). A service run can also hold idle connections ([`IdleConnections`]:
//! connected, through their Hello, then silent) for its whole length, and it samples the
//! daemon's memory, threads and connections in the middle of the measured window
//! ([`DaemonSample`]).
//!
//! What a measurement means, for every mode alike:
//! - Before anything is opened, the file system's dirty pages are written back (`syncfs`,
//!   untimed), so a run's fdatasyncs do not queue behind the writeback of an earlier run (a
//!   `--sync none` run leaves gigabytes dirty) or of anything else.
//! - Opening the log, starting the daemon, opening the idle connections, connecting the clients,
//!   and stopping it all afterwards are outside the timed window.
//! - The clients run for a warm-up (not counted), then for the measured window. A commit counts
//!   when it completes inside the window; its latency is from just before it was handed to the
//!   log (so encoding is included) to its return.
//! - `seconds` is the length of the window, so commits/s = commits / seconds.
//!
//! Records come from a [`RecordSource`] per client; [`SplitMix64`] is the seeded generator the
//! demo's and the benchmarks' sources draw from, fixed so a seed names the same records on every
//! machine and build.
//!
//! Files: this one (a run dispatched to the embedded log or the daemon), `mode` (the six
//! ways, and two more with a standby), `timed` (the client threads and what a run measured), `records` (where records come
//! from), `embedded` (a run on an embedded log), `service` (a run through a daemon: in this
//! process or one running, sampled), `idle` (connections held open and silent).

mod embedded;
mod idle;
mod mode;
mod records;
mod service;
mod timed;

pub use idle::IdleConnections;
pub use mode::Mode;
pub use records::{LoggedSource, RecordSource, SplitMix64};
pub use service::{check_descriptors, daemon_status, Daemon, DaemonEnv, ServiceRun};
pub use timed::{settle_writeback, DaemonSample, Outcome, Timing, WARMUP};

use anyhow::anyhow;
use std::path::Path;

/// One run: `sources.len()` clients commit records in `mode` to one log in `dir` (which must be
/// fresh) for `timing`; the service modes through a daemon started in this process in `dir`.
pub fn run_mode<S: LoggedSource>(
    mode: Mode,
    dir: &Path,
    daemon: Option<&DaemonEnv>,
    timing: Timing,
    sources: Vec<S>,
) -> anyhow::Result<Outcome> {
    let service = daemon.map(ServiceRun::in_process);
    run_mode_with(mode, dir, service.as_ref(), timing, sources)
}

/// One run, the service modes as `service` says. `dir` holds the log of an embedded run and the
/// daemon of an in-process one (fresh, in both cases); a run against a running daemon does not
/// use it.
pub fn run_mode_with<S: LoggedSource>(
    mode: Mode,
    dir: &Path,
    service: Option<&ServiceRun<'_>>,
    timing: Timing,
    sources: Vec<S>,
) -> anyhow::Result<Outcome> {
    anyhow::ensure!(!sources.is_empty(), "at least one client is needed");
    match mode.durability() {
        None => {
            settle_writeback(dir)?;
            embedded::run_embedded(mode, dir, timing, sources)
        }
        Some(durability) => {
            let service = service.ok_or_else(|| anyhow!("{mode} needs a daemon"))?;
            service::run_service(durability, dir, service, timing, sources)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::service::LOG_NAME;
    use crate::drive::timed::tests::{short, Same};
    use std::time::Duration;

    #[test]
    fn every_mode_commits_and_the_log_holds_the_records() {
        let daemon = DaemonEnv {
            write_bytes_per_s: 1 << 30,
        };
        for mode in Mode::ALL {
            // A short window first; a longer one only if nothing committed in it (right after
            // a build the machine may be flushing gigabytes, and one fdatasync, or the
            // daemon's start, can outlast 100 ms). What is checked is that commits happen, not
            // how fast.
            let (dir, outcome) = [100, 1_000, 10_000]
                .into_iter()
                .map(|window_ms| {
                    let dir = tempfile::tempdir().unwrap();
                    let sources = (0..3).map(|c| Same(c << 32)).collect();
                    let timing = Timing {
                        window: Duration::from_millis(window_ms),
                        ..short()
                    };
                    let outcome =
                        run_mode(mode, dir.path(), Some(&daemon), timing, sources).unwrap();
                    (dir, outcome)
                })
                .find(|(_, outcome)| outcome.commits > 0)
                .unwrap_or_else(|| panic!("{mode}: nothing committed even in a 10 s window"));
            assert!(outcome.latency.percentile_us(50.0).unwrap() > 0.0, "{mode}");
            // Whatever was committed is an ordinary log of the records, however it got there.
            let log = if mode.durability().is_some() {
                dir.path().join("logs").join(LOG_NAME)
            } else {
                dir.path().to_path_buf()
            };
            let wal: stela_wal::Wal<u64> =
                stela_wal::Wal::open(&log, stela_wal::WalOptions::default()).unwrap();
            assert!(wal.last_lsn().get() >= outcome.commits, "{mode}");
        }
    }
}
