//! raft-engine 0.4 (default features off) as a peer.
//!
//! - A set is one `LogBatch` holding one `put(region, key, value)` per record, written with
//!   `Engine::write(&mut batch, sync)`: `sync = true` for `--sync fdatasync` (raft-engine then
//!   fdatasyncs, sharing one sync among the writers of a write group), `false` for
//!   `--sync none` (written to the OS, never synced), the same two meanings as stela's.
//! - Writer thread `t` puts into region `t + 1`; keys are the record's index, big-endian, so a
//!   region scans back in write order. raft-engine needs owned `Vec<u8>` keys and values, so each
//!   record costs two allocations more than in stela or okaywal.
//! - Reads: reopen the `Engine` (which replays every log file into its in-memory tables, with
//!   `recovery_threads` = 4 by default) and scan every region's raw values, decoding each. The
//!   values are in memory after the reopen, so the scan itself does no I/O.
//! - Everything else is raft-engine's defaults (128 MiB files, LZ4 only for batches over 8 KiB,
//!   which a set of at most four ~100-byte records never is).

use crate::harness::{run_writers, ReadOutcome, WriteOutcome};
use crate::record::Record;
use anyhow::Context;
use indicatif::ProgressBar;
use raft_engine::{Config, Engine, LogBatch};
use std::path::Path;
use std::time::Instant;
use stela_format::Codec;

fn config(dir: &Path) -> Config {
    Config {
        dir: dir.to_string_lossy().into_owned(),
        ..Config::default()
    }
}

/// Writes every set as one `LogBatch` from `writers` threads sharing one engine in `dir`.
pub fn write(
    dir: &Path,
    codec: Codec,
    sync: bool,
    sets: &[&[Record]],
    writers: usize,
    progress: &ProgressBar,
) -> anyhow::Result<WriteOutcome> {
    let engine = Engine::open(config(dir)).context("raft-engine: open")?;
    let per_set = sets.first().map_or(1, |s| s.len());
    let outcome = run_writers(sets, writers, progress, |t, i, set| {
        let region = t as u64 + 1;
        let mut batch = LogBatch::with_capacity(set.len());
        for (j, record) in set.iter().enumerate() {
            let key = ((i * per_set + j) as u64).to_be_bytes().to_vec();
            batch.put(region, key, codec.encode(record)?)?;
        }
        engine.write(&mut batch, sync)?;
        Ok(())
    })?;
    drop(engine);
    Ok(outcome)
}

/// Reopens the engine in `dir` and reads every record of every region; the time includes the
/// reopen, which is where raft-engine reads its log files.
pub fn read(dir: &Path, codec: Codec) -> anyhow::Result<ReadOutcome> {
    let started = Instant::now();
    let engine = Engine::open(config(dir)).context("raft-engine: reopen")?;
    let mut outcome = ReadOutcome::default();
    let mut regions = engine.raft_groups();
    regions.sort_unstable();
    let mut failure = None;
    for region in regions {
        engine.scan_raw_messages(region, None, None, false, |_key, value| {
            match codec.decode::<Record>(value) {
                Ok(record) => {
                    outcome.add(&record);
                    true
                }
                Err(error) => {
                    failure = Some(error);
                    false
                }
            }
        })?;
        if let Some(error) = failure.take() {
            return Err(error).context("raft-engine: decode");
        }
    }
    outcome.seconds = started.elapsed().as_secs_f64();
    drop(engine);
    Ok(outcome)
}
