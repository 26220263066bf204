//! `stela-bench commit`: commits/s and commit latency of the embedded log against the log
//! daemon, by number of concurrent clients and record size. It owns the arguments, the order of
//! the runs, the result rows (table, JSON lines), and the ratios the daemon is judged by:
//! `service-buffered` should cost at most 10 % against `service-unsafe`, be at least 10x
//! `embedded-sync` at one client, and answer a one-client commit in under 30 us (p50).
//!
//! Every (mode, clients, record size) is one run on a fresh log: a temporary directory, or
//! `--dir DIR/<mode>-c<clients>-<bytes>B`. All clients of a run write to one log. How a run is
//! timed is in [`stela::drive`], the driver the product's demo runs on too.

use crate::commit_chart::save_commit_charts;
use crate::harness::RunDir;
use crate::record::{encoded_len, make_sized_records, Record};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;
use stela::drive::{self, DaemonEnv, Mode, RecordSource, Timing, WARMUP};
use stela_format::Codec;

/// Record sizes run when `--record-bytes` is not given.
pub const DEFAULT_RECORD_BYTES: [usize; 2] = [100, 4096];
/// Smallest and largest `--record-bytes`: a [`Record`] cannot encode smaller, and the daemon's
/// default buffers (512 KiB) must hold one.
const RECORD_BYTES_RANGE: std::ops::RangeInclusive<usize> = 32..=256 << 10;
/// Distinct records each run cycles through (generated once, untimed).
const RECORDS_PER_SIZE: usize = 256;

/// Arguments of `stela-bench commit`.
#[derive(clap::Args, Debug, Clone)]
pub struct CommitBenchArgs {
    /// Numbers of concurrent clients (threads; each has its own connection or Wal handle), comma
    /// list; one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub clients: Vec<usize>,
    /// Modes, comma list (default: all six).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Mode::ALL)]
    pub modes: Vec<Mode>,
    /// Size of each record as MessagePack, in bytes (default: both 100 and 4096).
    #[arg(long, value_name = "N")]
    pub record_bytes: Option<usize>,
    /// Measured seconds of each run (after a 0.3 s warm-up).
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0)]
    pub duration: f64,
    /// Print one JSON object per run instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Save an SVG chart of commits/s by clients to PATH (one per record size, suffixed -<N>B,
    /// when there are several).
    #[arg(long, value_name = "PATH")]
    pub chart: Option<PathBuf>,
    /// Keep each run's log in DIR/<mode>-c<clients>-<N>B-r<repeat> instead of a temporary
    /// directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Run every (mode, clients, size) this many times, the modes taking turns, and report
    /// the run with the median commits/s: run-to-run swings on a VM are larger than some of the
    /// differences between modes, and taking turns exposes every mode to the same drift.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// Do not show a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// What to run; [`CommitBenchArgs::to_config`] validates the arguments into one.
#[derive(Clone, Debug)]
pub struct CommitBenchConfig {
    pub modes: Vec<Mode>,
    pub clients: Vec<usize>,
    pub record_bytes: Vec<usize>,
    pub timing: Timing,
    pub dir: Option<PathBuf>,
    pub json: bool,
    pub progress: bool,
    pub repeats: usize,
}

impl CommitBenchArgs {
    pub fn to_config(&self) -> anyhow::Result<CommitBenchConfig> {
        anyhow::ensure!(
            self.duration.is_finite() && self.duration > 0.0 && self.duration <= 3600.0,
            "--duration must be a number of seconds above 0 (and at most 3600), not {}",
            self.duration
        );
        anyhow::ensure!(
            !self.clients.is_empty() && self.clients.iter().all(|&c| (1..=4096).contains(&c)),
            "--clients must be a list of numbers from 1 to 4096"
        );
        anyhow::ensure!(
            !self.modes.is_empty(),
            "--modes must name at least one mode"
        );
        let record_bytes = match self.record_bytes {
            Some(bytes) => {
                anyhow::ensure!(
                    RECORD_BYTES_RANGE.contains(&bytes),
                    "--record-bytes must be from {} to {}, not {bytes}",
                    RECORD_BYTES_RANGE.start(),
                    RECORD_BYTES_RANGE.end()
                );
                vec![bytes]
            }
            None => DEFAULT_RECORD_BYTES.to_vec(),
        };
        Ok(CommitBenchConfig {
            modes: dedup(&self.modes),
            clients: dedup(&self.clients),
            record_bytes,
            timing: Timing {
                warmup: WARMUP,
                window: Duration::from_secs_f64(self.duration),
            },
            dir: self.dir.clone(),
            json: self.json,
            repeats: self.repeats.max(1),
            progress: !self.no_progress,
        })
    }
}

fn dedup<T: PartialEq + Copy>(items: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for &item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// One run's result. Serializes to JSON with exactly these keys.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CommitRow {
    pub mode: String,
    pub clients: usize,
    pub record_bytes: usize,
    pub commits: u64,
    pub seconds: f64,
    pub commits_per_s: f64,
    /// Median latency of one commit in microseconds (null if nothing committed).
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

/// `stela-bench commit`: runs, prints to `out`, saves the chart(s) if asked.
pub fn run_commit_bench(args: &CommitBenchArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let cfg = args.to_config()?;
    let rows = run(&cfg, out)?;
    if let Some(path) = &args.chart {
        for saved in save_commit_charts(&rows, path)? {
            if !cfg.json {
                writeln!(out, "chart saved to {}", saved.display())?;
            }
        }
    }
    Ok(())
}

/// Every (record size, clients, mode) of `cfg`, in that order, so the rows of one client count
/// are measured next to each other. Prints rows as they come, then the ratios (not in JSON).
pub fn run(cfg: &CommitBenchConfig, out: &mut dyn Write) -> anyhow::Result<Vec<CommitRow>> {
    if let Some(dir) = &cfg.dir {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let daemon = if cfg.modes.iter().any(|m| m.durability().is_some()) {
        let base = cfg.dir.clone().unwrap_or_else(std::env::temp_dir);
        Some(DaemonEnv::measure(&base)?)
    } else {
        None
    };
    if !cfg.json {
        print_preamble(cfg, daemon.as_ref(), out)?;
        writeln!(out, "{}", table_header())?;
    }
    let runs = cfg.record_bytes.len() * cfg.clients.len() * cfg.modes.len() * cfg.repeats;
    let progress = if cfg.progress && !cfg.json && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(runs as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:32} [{bar:30}] {pos}/{len} runs, {elapsed} elapsed, eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(250));
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut rows = Vec::with_capacity(runs);
    for &bytes in &cfg.record_bytes {
        let records = make_sized_records(RECORDS_PER_SIZE, 42, bytes);
        for &clients in &cfg.clients {
            let mut outcomes: Vec<Vec<CommitRow>> = vec![Vec::new(); cfg.modes.len()];
            for repeat in 0..cfg.repeats {
                for (index, &mode) in cfg.modes.iter().enumerate() {
                    let name = format!("{mode}-c{clients}-{bytes}B");
                    progress.set_message(name.clone());
                    let dir = RunDir::new(cfg.dir.as_deref(), &format!("{name}-r{repeat}"))?;
                    let sources = (0..clients)
                        .map(|c| Cycle {
                            records: &records,
                            next: c * RECORDS_PER_SIZE / clients,
                        })
                        .collect();
                    let outcome =
                        drive::run_mode(mode, dir.path(), daemon.as_ref(), cfg.timing, sources)
                            .with_context(|| format!("{name}: run failed"))?;
                    drop(dir);
                    outcomes[index].push(CommitRow {
                        mode: mode.name().to_string(),
                        clients,
                        record_bytes: bytes,
                        commits: outcome.commits,
                        seconds: outcome.seconds,
                        commits_per_s: outcome.commits_per_s(),
                        p50_us: outcome.latency.percentile_us(50.0),
                        p99_us: outcome.latency.percentile_us(99.0),
                    });
                    progress.inc(1);
                }
            }
            for mut runs in outcomes {
                runs.sort_by(|a, b| a.commits_per_s.total_cmp(&b.commits_per_s));
                let row = runs.swap_remove(runs.len() / 2);
                let line = if cfg.json {
                    serde_json::to_string(&row)?
                } else {
                    table_row(&row)
                };
                progress.suspend(|| -> std::io::Result<()> {
                    writeln!(out, "{line}")?;
                    out.flush()
                })?;
                rows.push(row);
            }
        }
    }
    progress.finish_and_clear();
    if !cfg.json {
        for &bytes in &cfg.record_bytes {
            print_ratios(&rows, bytes, out)?;
        }
    }
    Ok(rows)
}

/// One client's records: the shared set, from its own starting point.
struct Cycle<'a> {
    records: &'a [Record],
    next: usize,
}

impl RecordSource for Cycle<'_> {
    type Record = Record;

    fn next_record(&mut self) -> &Record {
        let record = &self.records[self.next % self.records.len()];
        self.next = self.next.wrapping_add(1);
        record
    }
}

fn print_preamble(
    cfg: &CommitBenchConfig,
    daemon: Option<&DaemonEnv>,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let sizes: Vec<String> = cfg
        .record_bytes
        .iter()
        .map(|&bytes| {
            let records = make_sized_records(RECORDS_PER_SIZE, 42, bytes);
            let mean = records
                .iter()
                .map(|r| encoded_len(Codec::MessagePack, r))
                .sum::<usize>() as f64
                / records.len() as f64;
            format!("{bytes} B (mean encoded {mean:.1} B)")
        })
        .collect();
    writeln!(
        out,
        "commit = one record appended and committed; records as msgpack: {}",
        sizes.join(", ")
    )?;
    writeln!(
        out,
        "each run: fresh log shared by all clients, {:.1} s warm-up excluded, {:.1} s measured; \
         latency = one commit (encode included)",
        cfg.timing.warmup.as_secs_f64(),
        cfg.timing.window.as_secs_f64()
    )?;
    if let Some(daemon) = daemon {
        writeln!(
            out,
            "daemon: in this process, default config, one per run; disk rate measured once: {}",
            daemon.describe()
        )?;
    }
    Ok(())
}

/// The header line of the table.
pub fn table_header() -> String {
    format!(
        "{:<17} {:>7} {:>8} {:>10} {:>7} {:>12} {:>9} {:>9}",
        "mode", "clients", "record B", "commits", "seconds", "commits/s", "p50 us", "p99 us"
    )
}

/// One row of the table, aligned with [`table_header`].
pub fn table_row(row: &CommitRow) -> String {
    let latency = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
    format!(
        "{:<17} {:>7} {:>8} {:>10} {:>7.2} {:>12.0} {:>9} {:>9}",
        row.mode,
        row.clients,
        row.record_bytes,
        row.commits,
        row.seconds,
        row.commits_per_s,
        latency(row.p50_us),
        latency(row.p99_us)
    )
}

fn find(rows: &[CommitRow], mode: Mode, clients: usize, bytes: usize) -> Option<&CommitRow> {
    rows.iter()
        .find(|r| r.mode == mode.name() && r.clients == clients && r.record_bytes == bytes)
}

/// `numerator / denominator` commits/s at every client count both were run at.
fn ratios(
    rows: &[CommitRow],
    bytes: usize,
    numerator: Mode,
    denominator: Mode,
) -> Vec<(usize, f64)> {
    let mut clients: Vec<usize> = rows
        .iter()
        .filter(|r| r.record_bytes == bytes)
        .map(|r| r.clients)
        .collect();
    clients.sort_unstable();
    clients.dedup();
    clients
        .into_iter()
        .filter_map(|c| {
            let n = find(rows, numerator, c, bytes)?;
            let d = find(rows, denominator, c, bytes)?;
            (d.commits_per_s > 0.0).then(|| (c, n.commits_per_s / d.commits_per_s))
        })
        .collect()
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// The targets for `service-buffered`, at one record size, where the rows allow: one
/// column per client count.
fn print_ratios(rows: &[CommitRow], bytes: usize, out: &mut dyn Write) -> std::io::Result<()> {
    let buffered = Mode::ServiceBuffered;
    let mut clients: Vec<usize> = rows
        .iter()
        .filter(|r| r.record_bytes == bytes && r.mode == buffered.name())
        .map(|r| r.clients)
        .collect();
    clients.sort_unstable();
    clients.dedup();
    if clients.is_empty() {
        return Ok(());
    }
    let columns: String = clients.iter().map(|c| format!("{c:>8}")).collect();
    writeln!(out)?;
    writeln!(
        out,
        "{:<38}{columns}",
        format!("{bytes} B records, clients:")
    )?;
    let lines = [
        (Mode::ServiceUnsafe, "target >= 0.90 at every client count"),
        (Mode::EmbeddedSync, "target >= 10 at 1 client"),
        (Mode::EmbeddedUnsafe, "no target"),
    ];
    for (other, target) in lines {
        let found = ratios(rows, bytes, buffered, other);
        if found.is_empty() {
            continue;
        }
        let values: String = clients
            .iter()
            .map(|c| match found.iter().find(|(fc, _)| fc == c) {
                Some((_, r)) => format!("{r:>8.2}"),
                None => format!("{:>8}", "-"),
            })
            .collect();
        let met = match other {
            Mode::ServiceUnsafe => Some(found.iter().all(|&(_, r)| r >= 0.90)),
            Mode::EmbeddedSync => found
                .iter()
                .find(|&&(c, _)| c == 1)
                .map(|&(_, r)| r >= 10.0),
            _ => None,
        };
        let judged = met.map_or_else(String::new, |m| format!(": {}", verdict(m)));
        writeln!(
            out,
            "{:<38}{values}   ({target}{judged})",
            format!("  {buffered} / {other}")
        )?;
    }
    if let Some(p50) = find(rows, buffered, 1, bytes).and_then(|r| r.p50_us) {
        writeln!(
            out,
            "  {buffered} p50 at 1 client: {p50:.1} us (target < 30 us: {})",
            verdict(p50 < 30.0)
        )?;
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
        args: CommitBenchArgs,
    }

    #[test]
    fn defaults_and_lists() {
        let cfg = Cli::try_parse_from(["x"])
            .unwrap()
            .args
            .to_config()
            .unwrap();
        assert_eq!(cfg.modes, Mode::ALL.to_vec());
        assert_eq!(cfg.clients, vec![1, 4, 16, 64]);
        assert_eq!(cfg.record_bytes, vec![100, 4096]);
        assert_eq!(cfg.timing.window, Duration::from_secs(3));
        let cli = Cli::try_parse_from([
            "x",
            "--clients",
            "1,16",
            "--modes",
            "embedded-unsafe,service-buffered",
            "--record-bytes",
            "100",
            "--duration",
            "0.3",
        ])
        .unwrap();
        let cfg = cli.args.to_config().unwrap();
        assert_eq!(cfg.modes, vec![Mode::EmbeddedUnsafe, Mode::ServiceBuffered]);
        assert_eq!(cfg.clients, vec![1, 16]);
        assert_eq!(cfg.record_bytes, vec![100]);
        assert!(Cli::try_parse_from(["x", "--modes", "fast"]).is_err());
        for bad in [
            &["x", "--duration", "0"][..],
            &["x", "--duration", "NaN"],
            &["x", "--clients", "0"],
            &["x", "--record-bytes", "4"],
        ] {
            let args = Cli::try_parse_from(bad).unwrap().args;
            assert!(args.to_config().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn runs_table_ratios_and_dir() {
        let base = tempfile::tempdir().unwrap();
        let cfg = CommitBenchConfig {
            modes: vec![
                Mode::EmbeddedSync,
                Mode::ServiceBuffered,
                Mode::ServiceUnsafe,
            ],
            clients: vec![1, 2],
            record_bytes: vec![100],
            timing: Timing {
                warmup: Duration::from_millis(10),
                window: Duration::from_millis(100),
            },
            dir: Some(base.path().to_path_buf()),
            json: false,
            progress: false,
            repeats: 2,
        };
        let mut out = Vec::new();
        let rows = run(&cfg, &mut out).unwrap();
        assert_eq!(rows.len(), 6);
        assert!(rows.iter().all(|r| r.commits > 0 && r.p99_us >= r.p50_us));
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("service-buffered / service-unsafe"), "{text}");
        assert!(text.contains("p50 at 1 client"), "{text}");
        assert!(base
            .path()
            .join("service-buffered-c2-100B-r1/logs/bench")
            .is_dir());
        assert!(base.path().join("embedded-sync-c1-100B-r0").is_dir());
        // A second run into the same folders refuses rather than appending to old logs.
        assert!(run(&cfg, &mut Vec::new()).is_err());
    }
}
