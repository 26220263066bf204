//! `stela-bench wal`: the paper's Tables I and II (write, then read back, 2,000,000 records in
//! sets of 1, 2 or 4 per durable write) for each codec, plus the same runs against okaywal and
//! raft-engine and with many concurrent writers (group commit).
//!
//! Definitions used in every row, for stela and the peers alike:
//! - The records are generated once per [`run`] (seeded) and the same records are written by
//!   every system; each record is encoded with the run's codec by [`stela_format::Codec`].
//! - `write`: every set is one durable write (stela: `append_batch` + `commit`; see
//!   [`crate::peers`] for the peers). `seconds` runs from the release of the writer threads to
//!   the last set made durable; opening the log is not included. `p50_us`/`p99_us` are the
//!   latencies of single durable writes (encode + append + commit of one set).
//! - `read`: the log is closed, the file system's dirty pages are written back (untimed, so
//!   the kernel's writeback of the write phase does not compete with the read), then the log
//!   is reopened and every record is read back and decoded. `seconds`
//!   includes the reopen, because that is where each system scans (stela verifies its segments,
//!   okaywal and raft-engine replay their files) and the peers read everything only there.
//!   Every read is checked: the count of records and the sum of their ids must match. stela
//!   decodes on one thread per core (`Wal::par_iter_from`), raft-engine on its default four
//!   recovery threads, okaywal on one; the paper's reader used one.
//! - `mb_per_s` is bytes of encoded record payload (not counting any system's framing) / 10^6
//!   / seconds; `records_per_s` is records / seconds.

use crate::harness::{run_writers, ReadOutcome, RunDir, WriteOutcome};
use crate::peers;
use crate::record::{make_records, make_sized_records, payload_bytes, Record};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;
use stela::drive::settle_writeback;
use stela_format::Codec;
use stela_wal::{Lsn, SyncMode, Wal, WalOptions};

/// The paper's configurations: how many records go into each durable write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PaperConfig {
    /// 1 record per set (2,000,000 sets of 1).
    A,
    /// 2 records per set (1,000,000 sets of 2).
    B,
    /// 4 records per set (500,000 sets of 4).
    C,
}

impl PaperConfig {
    pub const ALL: [PaperConfig; 3] = [PaperConfig::A, PaperConfig::B, PaperConfig::C];

    pub fn records_per_set(self) -> usize {
        match self {
            PaperConfig::A => 1,
            PaperConfig::B => 2,
            PaperConfig::C => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PaperConfig::A => "A",
            PaperConfig::B => "B",
            PaperConfig::C => "C",
        }
    }
}

/// What each durable write waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncChoice {
    /// Each set is on stable storage (fdatasync) before the write returns.
    Fdatasync,
    /// Each set is handed to the OS, never synced.
    None,
}

impl SyncChoice {
    pub fn name(self) -> &'static str {
        match self {
            SyncChoice::Fdatasync => "fdatasync",
            SyncChoice::None => "none",
        }
    }

    pub fn stela_mode(self) -> SyncMode {
        match self {
            SyncChoice::Fdatasync => SyncMode::Data,
            SyncChoice::None => SyncMode::None,
        }
    }
}

/// The systems measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum System {
    Stela,
    Okaywal,
    RaftEngine,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Stela => "stela",
            System::Okaywal => "okaywal",
            System::RaftEngine => "raft-engine",
        }
    }

    /// Why this system cannot run with `sync`, if it cannot.
    pub fn not_applicable(self, sync: SyncChoice) -> Option<&'static str> {
        match (self, sync) {
            (System::Okaywal, SyncChoice::None) if !peers::okaywal::supports_sync_none() => Some(
                "okaywal 0.3 fdatasyncs on every commit and has no option to skip it; \
                 okaywal with --sync none is not applicable",
            ),
            _ => None,
        }
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What to run. [`Default`] is the paper's experiment: 2,000,000 records, configurations A, B
/// and C, every codec, fdatasync, one writer, stela only.
#[derive(Clone, Debug)]
pub struct WalBenchConfig {
    pub records: usize,
    pub configs: Vec<PaperConfig>,
    pub codecs: Vec<Codec>,
    pub sync: SyncChoice,
    /// Numbers of concurrent writer threads; each is a separate run.
    pub writers: Vec<usize>,
    /// Also run okaywal and raft-engine.
    pub peers: bool,
    /// Keep each run's log in `dir/<system>-<codec>-<config>-<sync>-w<writers>` (which must not
    /// exist or be empty); without it, logs go to temporary directories removed after each run.
    pub dir: Option<PathBuf>,
    /// Print one JSON object per result line instead of a table.
    pub json: bool,
    /// Show a progress bar on long runs (only when stderr is a terminal, never with `json`).
    pub progress: bool,
    /// Seed of the record generator.
    pub seed: u64,
    /// Use records whose MessagePack encoding is this many bytes instead of the paper's record.
    pub record_bytes: Option<usize>,
}

impl Default for WalBenchConfig {
    fn default() -> WalBenchConfig {
        WalBenchConfig {
            records: 2_000_000,
            configs: PaperConfig::ALL.to_vec(),
            codecs: Codec::ALL.to_vec(),
            sync: SyncChoice::Fdatasync,
            writers: vec![1],
            peers: false,
            dir: None,
            json: false,
            progress: true,
            seed: 42,
            record_bytes: None,
        }
    }
}

impl WalBenchConfig {
    pub fn systems(&self) -> Vec<System> {
        if self.peers {
            vec![System::Stela, System::Okaywal, System::RaftEngine]
        } else {
            vec![System::Stela]
        }
    }
}

/// One line of results. Serializes to JSON with exactly these keys.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ResultRow {
    pub system: String,
    pub codec: String,
    pub config: String,
    pub sync: String,
    pub writers: usize,
    /// "write" or "read".
    pub op: String,
    pub records: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub records_per_s: f64,
    /// Median latency of one durable write, in microseconds; `None` (null) for reads.
    pub p50_us: Option<f64>,
    /// 99th percentile latency of one durable write, in microseconds; `None` for reads.
    pub p99_us: Option<f64>,
}

/// Runs every (codec, configuration, writers, system) combination of `cfg`: a write run and a
/// read run each. Prints a table (or JSON lines) to `out` as results come in and returns them.
pub fn run(cfg: &WalBenchConfig, out: &mut dyn Write) -> anyhow::Result<Vec<ResultRow>> {
    anyhow::ensure!(cfg.records > 0, "--records must be at least 1");
    anyhow::ensure!(
        u32::try_from(cfg.records).is_ok(),
        "--records must fit a u32 record id"
    );
    anyhow::ensure!(!cfg.configs.is_empty(), "no configuration to run");
    anyhow::ensure!(!cfg.codecs.is_empty(), "no codec to run");
    anyhow::ensure!(
        !cfg.writers.is_empty() && cfg.writers.iter().all(|&w| w > 0),
        "--writers must be a list of numbers of at least 1"
    );
    let records = match cfg.record_bytes {
        Some(bytes) => make_sized_records(cfg.records, cfg.seed, bytes),
        None => make_records(cfg.records, cfg.seed),
    };
    let payloads: Vec<(Codec, u64)> = cfg
        .codecs
        .iter()
        .map(|&codec| (codec, payload_bytes(codec, &records)))
        .collect();
    if !cfg.json {
        print_preamble(cfg, &payloads, out)?;
    }
    for system in cfg.systems() {
        if let Some(why) = system.not_applicable(cfg.sync) {
            note(cfg, out, why)?;
        }
    }
    if !cfg.json {
        writeln!(out, "{}", table_header())?;
    }
    let show_progress = cfg.progress && !cfg.json && std::io::stderr().is_terminal();

    let mut rows = Vec::new();
    for &(codec, payload) in &payloads {
        for &config in &cfg.configs {
            let sets: Vec<&[Record]> = records.chunks(config.records_per_set()).collect();
            for &writers in &cfg.writers {
                for system in cfg.systems() {
                    if system.not_applicable(cfg.sync).is_some() {
                        continue;
                    }
                    let run = Run {
                        system,
                        codec,
                        config,
                        sync: cfg.sync,
                        writers,
                    };
                    let progress = if show_progress && sets.len() >= 10_000 {
                        let bar = ProgressBar::new(sets.len() as u64);
                        bar.set_style(
                            ProgressStyle::with_template(
                                "{msg:40} [{bar:30}] {pos}/{len} sets ({percent}%), eta {eta}",
                            )
                            .expect("valid template")
                            .progress_chars("=> "),
                        );
                        bar.set_message(run.name());
                        bar
                    } else {
                        ProgressBar::hidden()
                    };
                    let result = run.execute(cfg.dir.as_deref(), &sets, payload, &progress);
                    progress.finish_and_clear();
                    let (write, read) =
                        result.with_context(|| format!("{}: {}", run.name(), "run failed"))?;
                    for row in [write, read] {
                        emit(cfg, &row, out)?;
                        rows.push(row);
                    }
                }
            }
        }
    }
    Ok(rows)
}

/// One (system, codec, configuration, sync, writers) combination.
struct Run {
    system: System,
    codec: Codec,
    config: PaperConfig,
    sync: SyncChoice,
    writers: usize,
}

impl Run {
    /// Also the name of its folder under `--dir`, e.g. `stela-msgpack-C-fdatasync-w64`.
    fn name(&self) -> String {
        format!(
            "{}-{}-{}-{}-w{}",
            self.system.name(),
            self.codec.name(),
            self.config.name(),
            self.sync.name(),
            self.writers
        )
    }

    fn execute(
        &self,
        base: Option<&Path>,
        sets: &[&[Record]],
        payload: u64,
        progress: &ProgressBar,
    ) -> anyhow::Result<(ResultRow, ResultRow)> {
        let dir = RunDir::new(base, &self.name())?;
        let path = dir.path();
        let (codec, sync, writers) = (self.codec, self.sync, self.writers);
        let write = match self.system {
            System::Stela => stela_write(path, codec, sync, sets, writers, progress)?,
            System::Okaywal => {
                peers::okaywal::write(path, codec, sets, payload, writers, progress)?
            }
            System::RaftEngine => peers::raft_engine::write(
                path,
                codec,
                sync == SyncChoice::Fdatasync,
                sets,
                writers,
                progress,
            )?,
        };
        // Between the write and the read phase of every system: write back what the write phase
        // left dirty (`syncfs`, untimed), so the read phase measures reading from the page
        // cache, as the paper's Table II did, and not the kernel's writeback of the previous
        // phase competing for the same two cores. Nothing is evicted: the data stays cached.
        settle_writeback(path)?;
        let read = match self.system {
            System::Stela => stela_read(path, codec)?,
            System::Okaywal => peers::okaywal::read(path, codec)?,
            System::RaftEngine => peers::raft_engine::read(path, codec)?,
        };
        let records: u64 = sets.iter().map(|s| s.len() as u64).sum();
        let id_sum: u64 = sets
            .iter()
            .flat_map(|s| s.iter())
            .map(|r| u64::from(r.id))
            .sum();
        anyhow::ensure!(
            read.records == records && read.id_sum == id_sum,
            "{} read back {} records (id sum {}), expected {} (id sum {})",
            self.system,
            read.records,
            read.id_sum,
            records,
            id_sum
        );
        Ok((
            self.row("write", records, payload, write.seconds, Some(&write)),
            self.row("read", records, payload, read.seconds, None),
        ))
    }

    fn row(
        &self,
        op: &str,
        records: u64,
        payload: u64,
        seconds: f64,
        write: Option<&WriteOutcome>,
    ) -> ResultRow {
        let seconds = seconds.max(1e-9);
        ResultRow {
            system: self.system.name().to_string(),
            codec: self.codec.name().to_string(),
            config: self.config.name().to_string(),
            sync: self.sync.name().to_string(),
            writers: self.writers,
            op: op.to_string(),
            records,
            seconds,
            mb_per_s: payload as f64 / 1e6 / seconds,
            records_per_s: records as f64 / seconds,
            p50_us: write.and_then(|w| w.percentile_us(50.0)),
            p99_us: write.and_then(|w| w.percentile_us(99.0)),
        }
    }
}

/// stela: a set is `append_batch` then `commit` of its last LSN, from threads sharing one `Wal`.
fn stela_write(
    dir: &Path,
    codec: Codec,
    sync: SyncChoice,
    sets: &[&[Record]],
    writers: usize,
    progress: &ProgressBar,
) -> anyhow::Result<WriteOutcome> {
    let options = WalOptions::default().codec(codec).sync(sync.stela_mode());
    let wal: Wal<Record> = Wal::open(dir, options).context("stela: open")?;
    let outcome = run_writers(sets, writers, progress, |_, _, set| {
        let last = wal.append_batch(set)?;
        wal.commit(last)?;
        Ok(())
    })?;
    wal.close().context("stela: close")?;
    Ok(outcome)
}

/// stela: reopen (with its default verification of every segment) and iterate everything,
/// decoding on one worker thread per core ([`Wal::par_iter_from`]; raft-engine likewise replays
/// on its default four recovery threads).
fn stela_read(dir: &Path, codec: Codec) -> anyhow::Result<ReadOutcome> {
    let started = Instant::now();
    let wal: Wal<Record> =
        Wal::open(dir, WalOptions::default().codec(codec)).context("stela: reopen")?;
    let mut outcome = ReadOutcome::default();
    for item in wal.par_iter_from(Lsn::FIRST, read_threads())? {
        let (_lsn, record) = item?;
        outcome.add(&record);
    }
    outcome.seconds = started.elapsed().as_secs_f64();
    drop(wal);
    Ok(outcome)
}

/// Decode threads for stela's reads: one per core.
pub fn read_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn note(cfg: &WalBenchConfig, out: &mut dyn Write, text: &str) -> std::io::Result<()> {
    if cfg.json {
        eprintln!("note: {text}");
        Ok(())
    } else {
        writeln!(out, "note: {text}")
    }
}

fn emit(cfg: &WalBenchConfig, row: &ResultRow, out: &mut dyn Write) -> anyhow::Result<()> {
    if cfg.json {
        writeln!(out, "{}", serde_json::to_string(row)?)?;
    } else {
        writeln!(out, "{}", table_row(row))?;
    }
    out.flush()?;
    Ok(())
}

fn print_preamble(
    cfg: &WalBenchConfig,
    payloads: &[(Codec, u64)],
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let kind = match cfg.record_bytes {
        Some(bytes) => format!("records sized to {bytes} B as msgpack"),
        None => "paper records (id, comment, objects)".to_string(),
    };
    let sizes: Vec<String> = payloads
        .iter()
        .map(|(codec, bytes)| {
            format!(
                "{} {:.1} B",
                codec.name(),
                *bytes as f64 / cfg.records as f64
            )
        })
        .collect();
    writeln!(
        out,
        "{} {kind}, seed {}; mean encoded size: {}",
        cfg.records,
        cfg.seed,
        sizes.join(", ")
    )?;
    writeln!(
        out,
        "write = one durable write per set (sync {}); read = reopen + read back all; \
         MB/s = encoded payload bytes / 10^6 / s",
        cfg.sync.name()
    )
}

/// The header line of the human table.
pub fn table_header() -> String {
    format!(
        "{:<12} {:<8} {:<3} {:<9} {:>7} {:<5} {:>9} {:>9} {:>9} {:>12} {:>9} {:>9}",
        "system",
        "codec",
        "cfg",
        "sync",
        "writers",
        "op",
        "records",
        "seconds",
        "MB/s",
        "records/s",
        "p50 us",
        "p99 us"
    )
}

/// One row of the human table, aligned with [`table_header`].
pub fn table_row(row: &ResultRow) -> String {
    let latency = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
    format!(
        "{:<12} {:<8} {:<3} {:<9} {:>7} {:<5} {:>9} {:>9.3} {:>9.2} {:>12.0} {:>9} {:>9}",
        row.system,
        row.codec,
        row.config,
        row.sync,
        row.writers,
        row.op,
        row.records,
        row.seconds,
        row.mb_per_s,
        row.records_per_s,
        latency(row.p50_us),
        latency(row.p99_us)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(sync: SyncChoice, writers: Vec<usize>) -> WalBenchConfig {
        WalBenchConfig {
            records: 200,
            configs: vec![PaperConfig::A, PaperConfig::C],
            codecs: vec![Codec::MessagePack],
            sync,
            writers,
            peers: true,
            progress: false,
            ..WalBenchConfig::default()
        }
    }

    #[test]
    fn every_system_writes_and_reads_everything_durably() {
        let mut cfg = tiny(SyncChoice::Fdatasync, vec![1, 3]);
        cfg.configs = vec![PaperConfig::C];
        cfg.codecs = Codec::ALL.to_vec();
        let mut out = Vec::new();
        let rows = run(&cfg, &mut out).unwrap();
        // 3 codecs x 1 config x 2 writer counts x 3 systems x (write + read).
        assert_eq!(rows.len(), 3 * 2 * 3 * 2);
        for row in &rows {
            assert_eq!(row.records, 200);
            assert!(row.seconds > 0.0 && row.records_per_s > 0.0 && row.mb_per_s > 0.0);
            assert_eq!(row.p50_us.is_some(), row.op == "write", "{row:?}");
        }
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("raft-engine") && text.contains("okaywal"),
            "{text}"
        );
    }

    #[test]
    fn sync_none_skips_okaywal_with_a_note_and_json_has_exact_keys() {
        let mut cfg = tiny(SyncChoice::None, vec![2]);
        cfg.json = true;
        let mut out = Vec::new();
        let rows = run(&cfg, &mut out).unwrap();
        assert!(rows
            .iter()
            .all(|r| r.system != "okaywal" && r.sync == "none"));
        assert_eq!(rows.len(), 2 * 2 * 2);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), rows.len());
        let value: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        let mut keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort_unstable();
        let mut want = vec![
            "system",
            "codec",
            "config",
            "sync",
            "writers",
            "op",
            "records",
            "seconds",
            "mb_per_s",
            "records_per_s",
            "p50_us",
            "p99_us",
        ];
        want.sort_unstable();
        assert_eq!(keys, want);
        let read: ResultRow = serde_json::from_str(lines[1]).unwrap();
        assert_eq!((read.op.as_str(), read.p50_us), ("read", None));
    }

    #[test]
    fn dir_keeps_each_run_in_its_folder() {
        let base = tempfile::tempdir().unwrap();
        let cfg = WalBenchConfig {
            records: 50,
            configs: vec![PaperConfig::B],
            codecs: vec![Codec::Postcard],
            writers: vec![4],
            dir: Some(base.path().to_path_buf()),
            progress: false,
            peers: true,
            ..WalBenchConfig::default()
        };
        run(&cfg, &mut Vec::new()).unwrap();
        for system in ["stela", "okaywal", "raft-engine"] {
            let path = base
                .path()
                .join(format!("{system}-postcard-B-fdatasync-w4"));
            assert!(
                path.read_dir().unwrap().next().is_some(),
                "{}",
                path.display()
            );
        }
        // A second run into the same folders refuses rather than appending to old logs.
        assert!(run(&cfg, &mut Vec::new()).is_err());
    }
}
