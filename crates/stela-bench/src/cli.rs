//! The `stela-bench` command line: its subcommands, the arguments of `stela-bench wal`, and the
//! entry point [`run`] the binary calls (so tests can reach the same code).
//!
//! - `stela-bench wal`: the write-ahead log benchmark ([`crate::wal_bench`]: the paper's Tables
//!   I and II, group commit against okaywal and raft-engine).
//! - `stela-bench commit`: commit throughput and latency, embedded against the daemon
//!   ([`crate::commit_bench`]).
//! - `stela-bench power-fail`: the emergency flush of a full dirty set against its budget
//!   ([`crate::power_bench`]).
//! - `stela-bench replicated`: `buffered` against `replicated` across a veth link
//!   ([`crate::repl_bench`]).
//! - `stela-bench pgbench`: PostgreSQL's pgbench on `stela mount` against the local disk
//!   ([`crate::pg_bench`]); `stela-bench pg-failover`: PostgreSQL failing over between two
//!   nodes on a `replicated` mount ([`crate::pg_failover`]); `stela-bench pg-standby`: native
//!   PostgreSQL with a synchronous streaming standby beside PostgreSQL under `stela run` at
//!   `replicated` ([`crate::pg_standby`]).
//! - `stela-bench tpcb`: TPC-B on stela-store by checkpoint kind, cleaner and service interval
//!   ([`crate::tpcb`]); `stela-bench tpcb-crash`: the same transactions in a child SIGKILLed
//!   round after round, the store checked after each kill ([`crate::tpcb_crash`]).
//! - `stela-bench restart`: time to a first transaction after a crash, instant restart
//!   against classical ([`crate::restart_bench`]); `restart-child` (hidden) is the process it
//!   kills.
//! - `stela-bench warm-standby`: promotion to a first transaction of stela-store on a warm
//!   follower's directory against a cold one ([`crate::warm_standby`]).
//! - `stela-bench failover`: faults injected into a failover pair under a committing client
//!   ([`crate::failover`]); `failover-client` (hidden) is that client.
//!
//! Exit codes: 0 success, 2 the command failed (bad arguments, a run that failed, ...).

use crate::chart::save_chart;
use crate::commit_bench::CommitBenchArgs;
use crate::power_bench::PowerBenchArgs;
use crate::wal_bench::{self, PaperConfig, ResultRow, SyncChoice, WalBenchConfig};
use clap::{Parser, Subcommand, ValueEnum};
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use stela_format::Codec;

#[derive(Parser, Debug)]
#[command(
    name = "stela-bench",
    version,
    about = "Benchmarks of stela: the WAL against its peers, commits embedded against the daemon, \
             the emergency flush"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Benchmark the WAL (the paper's Tables I and II, group commit vs peers).
    Wal(WalBenchArgs),
    /// Commits/s and commit latency by clients and record size: embedded stela-wal (fdatasync
    /// per commit, group commit, no sync) against the daemon (disk, buffered, unsafe).
    Commit(CommitBenchArgs),
    /// Time of the emergency flush of a full dirty set on this disk, against half the power
    /// window (stalls the disk to fill the buffers, then announces the power failure).
    PowerFail(PowerBenchArgs),
    /// `buffered` against `replicated` commits, the standby across a veth link in a network
    /// namespace this command creates (root), with the link's round trip.
    Replicated(crate::repl_bench::ReplBenchArgs),
    /// Echo server the `replicated` benchmark runs in the standby's namespace.
    #[command(hide = true)]
    Netecho(crate::repl_bench::NetEchoArgs),
    /// Availability under faults: a witness and a failover pair in network namespaces this
    /// command creates (root), a client committing at `replicated` throughout, faults injected
    /// in turn; downtime, losses, double primaries, reprotection per fault.
    Failover(crate::failover::FailoverArgs),
    /// The client the `failover` benchmark runs in the client's namespace.
    #[command(hide = true)]
    FailoverClient(crate::failover::client::ClientArgs),
    /// An unmodified PostgreSQL on `stela mount` (pg_wal only, or the whole data directory)
    /// against the same PostgreSQL on the local disk with synchronous_commit on and off
    /// (root; Debian's postgresql and fuse3).
    Pgbench(crate::pg_bench::PgBenchArgs),
    /// The anchor for `replicated`: native PostgreSQL with a synchronous streaming standby
    /// (remote_write, on) beside PostgreSQL under `stela run --level replicated`, both standbys
    /// across one veth link in a namespace this command creates (root).
    PgStandby(crate::pg_standby::PgStandbyArgs),
    /// The plain FUSE passthrough `pgbench`'s `fuse-floor` mode mounts (writeback cache, 1 MiB
    /// writes, several threads); serves until unmounted or SIGTERM.
    #[command(hide = true)]
    FusePassthrough(crate::fuse_passthrough::FusePassthroughArgs),
    /// PostgreSQL failover: the whole data directory on a `replicated` mount, SIGKILL of the
    /// primary node (daemon, mount, PostgreSQL), downtime to the first commit on the new
    /// primary and acknowledged rows lost.
    PgFailover(crate::pg_failover::PgFailoverArgs),
    /// TPC-B on stela-store: classical against decoupled checkpoints and page cleaning, by
    /// service interval (tps, latency, CPU).
    Tpcb(crate::tpcb::TpcbArgs),
    /// TPC-B on stela-store in a child SIGKILLed at random moments, round after round; after
    /// each kill: nothing acknowledged lost, nothing uncommitted visible, the sums agree.
    TpcbCrash(crate::tpcb_crash::TpcbCrashArgs),
    /// The child `tpcb-crash` kills.
    #[command(hide = true)]
    TpcbCrashChild(crate::tpcb_crash::TpcbCrashChildArgs),
    /// Time to a first new transaction after a SIGKILL of stela-store with N MiB of dirty
    /// pages, instant restart against classical ARIES.
    Restart(crate::restart_bench::RestartArgs),
    /// The process the `restart` benchmark kills.
    #[command(hide = true)]
    RestartChild(crate::restart_bench::ChildArgs),
    /// Promotion to a first new transaction of stela-store on a standby: a warm follower's
    /// directory against a cold one, after N MiB of TPC-B-ish log.
    WarmStandby(crate::warm_standby::WarmStandbyArgs),
    /// Issue 54's attacks on a real daemon beside honest `disk` committers, each beside the
    /// same run without it: commits/s, status p99, RSS, threads, acknowledged records lost.
    Hostile(crate::hostile::HostileArgs),
    /// Time and bytes of `stela backup` of a daemon under `disk` load, and the clients'
    /// commits/s and p99 latency during a backup against a window without one.
    Backup(crate::backup_bench::BackupBenchArgs),
}

/// Parses `args` and runs the command; returns the process exit code.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
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
    // The daemon of the service runs logs its warnings through tracing, as under `stela`.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    if let Command::TpcbCrashChild(args) = &cli.command {
        // Its client threads print to stdout themselves: the lock below must not be held.
        return match crate::tpcb_crash::child(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("stela-bench: {error:#}");
                ExitCode::from(2)
            }
        };
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = match cli.command {
        Command::Wal(args) => run_wal_bench(&args, &mut out).map(drop),
        Command::Commit(args) => run_commit_bench(&args, &mut out),
        Command::PowerFail(args) => crate::power_bench::run(args).map(drop),
        Command::Replicated(args) => crate::repl_bench::run(&args, &mut out).map(drop),
        Command::Netecho(args) => crate::repl_bench::net_echo(&args),
        Command::Failover(args) => crate::failover::run(&args, &mut out).map(drop),
        Command::FailoverClient(args) => crate::failover::client::run(&args),
        Command::Pgbench(args) => crate::pg_bench::run(&args, &mut out).map(drop),
        Command::PgStandby(args) => crate::pg_standby::run(&args, &mut out).map(drop),
        Command::FusePassthrough(args) => crate::fuse_passthrough::run(&args),
        Command::PgFailover(args) => crate::pg_failover::run(&args, &mut out).map(drop),
        Command::Tpcb(args) => crate::tpcb::run(&args, &mut out).map(drop),
        Command::TpcbCrash(args) => crate::tpcb_crash::run(&args, &mut out),
        Command::TpcbCrashChild(_) => unreachable!("run above, without the stdout lock"),
        Command::Restart(args) => crate::restart_bench::run(&args, &mut out).map(drop),
        Command::RestartChild(args) => crate::restart_bench::child(&args),
        Command::WarmStandby(args) => crate::warm_standby::run(&args, &mut out).map(drop),
        Command::Hostile(args) => crate::hostile::run(&args, &mut out),
        Command::Backup(args) => crate::backup_bench::run(&args, &mut out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let _ = out.flush();
            eprintln!("stela-bench: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// A paper configuration on the command line (`A`, `B`, `C`, any case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ConfigArg {
    /// 1 record per durable write.
    #[value(name = "A")]
    A,
    /// 2 records per durable write.
    #[value(name = "B")]
    B,
    /// 4 records per durable write.
    #[value(name = "C")]
    C,
}

impl From<ConfigArg> for PaperConfig {
    fn from(arg: ConfigArg) -> PaperConfig {
        match arg {
            ConfigArg::A => PaperConfig::A,
            ConfigArg::B => PaperConfig::B,
            ConfigArg::C => PaperConfig::C,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CodecArg {
    Json,
    #[value(alias = "messagepack")]
    Msgpack,
    Postcard,
}

impl From<CodecArg> for Codec {
    fn from(arg: CodecArg) -> Codec {
        match arg {
            CodecArg::Json => Codec::Json,
            CodecArg::Msgpack => Codec::MessagePack,
            CodecArg::Postcard => Codec::Postcard,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SyncArg {
    /// Every durable write waits for fdatasync.
    Fdatasync,
    /// Never sync: a write returns once handed to the OS.
    None,
}

impl From<SyncArg> for SyncChoice {
    fn from(arg: SyncArg) -> SyncChoice {
        match arg {
            SyncArg::Fdatasync => SyncChoice::Fdatasync,
            SyncArg::None => SyncChoice::None,
        }
    }
}

/// Arguments of `stela-bench wal`.
#[derive(clap::Args, Debug, Clone)]
pub struct WalBenchArgs {
    /// Records written (and read back) by each run.
    #[arg(long, default_value_t = 2_000_000)]
    pub records: usize,
    /// Paper configurations (records per durable write: A = 1, B = 2, C = 4); repeat the flag
    /// or give a comma list.
    #[arg(long = "config", value_enum, ignore_case = true, value_delimiter = ',',
          default_values_t = [ConfigArg::A, ConfigArg::B, ConfigArg::C])]
    pub configs: Vec<ConfigArg>,
    /// Codecs; repeat the flag or give a comma list.
    #[arg(long = "codec", value_enum, value_delimiter = ',',
          default_values_t = [CodecArg::Json, CodecArg::Msgpack, CodecArg::Postcard])]
    pub codecs: Vec<CodecArg>,
    /// What a durable write waits for.
    #[arg(long, value_enum, default_value_t = SyncArg::Fdatasync)]
    pub sync: SyncArg,
    /// Numbers of concurrent writers sharing one log (comma list); one run each.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub writers: Vec<usize>,
    /// Also run the peers: okaywal and raft-engine.
    #[arg(long)]
    pub peers: bool,
    /// Keep each run's log in DIR/<system>-<codec>-<config>-<sync>-w<writers> instead of a
    /// temporary directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Print one JSON object per result instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Save an SVG chart of durable write records/s by writers to PATH.
    #[arg(long, value_name = "PATH")]
    pub chart: Option<PathBuf>,
    /// Use records of about N bytes (as MessagePack) instead of the paper's record.
    #[arg(long, value_name = "N")]
    pub record_bytes: Option<usize>,
    /// Seed of the record generator.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Do not show a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

impl WalBenchArgs {
    pub fn to_config(&self) -> WalBenchConfig {
        let mut configs: Vec<PaperConfig> = Vec::new();
        for c in &self.configs {
            let c = PaperConfig::from(*c);
            if !configs.contains(&c) {
                configs.push(c);
            }
        }
        let mut codecs: Vec<Codec> = Vec::new();
        for c in &self.codecs {
            let c = Codec::from(*c);
            if !codecs.contains(&c) {
                codecs.push(c);
            }
        }
        WalBenchConfig {
            records: self.records,
            configs,
            codecs,
            sync: self.sync.into(),
            writers: self.writers.clone(),
            peers: self.peers,
            dir: self.dir.clone(),
            json: self.json,
            progress: !self.no_progress,
            seed: self.seed,
            record_bytes: self.record_bytes,
        }
    }
}

/// `stela-bench wal`: runs the benchmark, printing to `out`, and saves the chart if asked;
/// returns the result rows.
pub fn run_wal_bench(args: &WalBenchArgs, out: &mut dyn Write) -> anyhow::Result<Vec<ResultRow>> {
    let rows = wal_bench::run(&args.to_config(), out)?;
    if let Some(path) = &args.chart {
        save_chart(&rows, path)?;
        if !args.json {
            writeln!(out, "chart saved to {}", path.display())?;
        }
    }
    Ok(rows)
}

/// `stela-bench commit`: runs, prints to `out`, saves the chart(s) if asked. Here rather than
/// in `commit_bench`, so that the bench and its chart (which draws the bench's rows) do not
/// import each other.
fn run_commit_bench(args: &CommitBenchArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let cfg = args.to_config()?;
    let rows = crate::commit_bench::run(&cfg, out)?;
    if let Some(path) = &args.chart {
        for saved in crate::commit_chart::save_commit_charts(&rows, path)? {
            if !cfg.json {
                writeln!(out, "chart saved to {}", saved.display())?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: WalBenchArgs,
    }

    #[test]
    fn defaults_and_lists() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        let cfg = cli.args.to_config();
        assert_eq!(cfg.records, 2_000_000);
        assert_eq!(cfg.configs, PaperConfig::ALL.to_vec());
        assert_eq!(cfg.codecs, Codec::ALL.to_vec());
        assert_eq!(cfg.sync, SyncChoice::Fdatasync);
        assert_eq!(cfg.writers, vec![1]);
        assert!(!cfg.peers && !cfg.json);

        let cli = Cli::try_parse_from([
            "x",
            "--config",
            "a,C",
            "--config",
            "B",
            "--codec",
            "msgpack",
            "--writers",
            "1,4,16,64",
            "--sync",
            "none",
            "--peers",
            "--json",
            "--record-bytes",
            "100",
        ])
        .unwrap();
        let cfg = cli.args.to_config();
        assert_eq!(
            cfg.configs,
            vec![PaperConfig::A, PaperConfig::C, PaperConfig::B]
        );
        assert_eq!(cfg.codecs, vec![Codec::MessagePack]);
        assert_eq!(cfg.writers, vec![1, 4, 16, 64]);
        assert_eq!(cfg.sync, SyncChoice::None);
        assert_eq!(cfg.record_bytes, Some(100));
        assert!(cfg.peers && cfg.json);
        assert!(Cli::try_parse_from(["x", "--config", "D"]).is_err());
    }
}
