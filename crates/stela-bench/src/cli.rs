//! Command line arguments of `stela wal bench`, and `stela demo`.

use crate::chart::save_chart;
use crate::wal_bench::{self, PaperConfig, ResultRow, SyncChoice, WalBenchConfig};
use clap::ValueEnum;
use std::io::Write;
use std::path::PathBuf;
use stela_format::Codec;

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

/// Arguments of `stela wal bench`.
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

/// `stela wal bench`: runs the benchmark, printing to stdout, and saves the chart if asked.
pub fn run_wal_bench(args: WalBenchArgs) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    run_wal_bench_to(&args, &mut stdout.lock()).map(|_| ())
}

/// [`run_wal_bench`] writing to `out`; returns the result rows.
pub fn run_wal_bench_to(
    args: &WalBenchArgs,
    out: &mut dyn Write,
) -> anyhow::Result<Vec<ResultRow>> {
    let rows = wal_bench::run(&args.to_config(), out)?;
    if let Some(path) = &args.chart {
        save_chart(&rows, path)?;
        if !args.json {
            writeln!(out, "chart saved to {}", path.display())?;
        }
    }
    Ok(rows)
}

/// The configuration of `stela demo` for one sync choice: a short version of the benchmark.
pub fn demo_config(sync: SyncChoice) -> WalBenchConfig {
    WalBenchConfig {
        records: DEMO_RECORDS,
        configs: vec![PaperConfig::A, PaperConfig::C],
        codecs: vec![Codec::MessagePack, Codec::Json],
        sync,
        writers: vec![1, 16],
        peers: true,
        ..WalBenchConfig::default()
    }
}

/// Records per run in `stela demo`.
pub const DEMO_RECORDS: usize = 20_000;

/// `stela demo`: a short benchmark (20,000 records, configurations A and C, MessagePack and
/// JSON, 1 and 16 writers, stela and its peers, fdatasync then none), printed as tables.
pub fn run_demo() -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    run_demo_to(&mut stdout.lock()).map(|_| ())
}

/// [`run_demo`] writing to `out`; returns the result rows.
pub fn run_demo_to(out: &mut dyn Write) -> anyhow::Result<Vec<ResultRow>> {
    let mut rows = Vec::new();
    for (i, sync) in [SyncChoice::Fdatasync, SyncChoice::None]
        .into_iter()
        .enumerate()
    {
        if i > 0 {
            writeln!(out)?;
        }
        rows.extend(wal_bench::run(&demo_config(sync), out)?);
    }
    Ok(rows)
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
