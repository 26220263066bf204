//! okaywal 0.3 as a peer.
//!
//! - A set is one entry: `begin_entry`, one `write_chunk` per record, `commit`. Records are
//!   encoded before `begin_entry`, because `begin_entry` takes the log's only active file
//!   exclusively until the entry is queued for sync.
//! - okaywal fdatasyncs on every `commit` (`EntryWriter::commit` -> `LogFile::synchronize`,
//!   shared between concurrent committers) and has no option to skip it, so `--sync none` is
//!   not applicable: [`supports_sync_none`] is false and the bench prints a note instead.
//! - okaywal checkpoints a segment once it holds `checkpoint_after_bytes` (768 KiB by default):
//!   the `LogManager` gets the entries and the file is recycled, so they are no longer in the
//!   log. To read every record back on reopen, as the benchmark does, checkpointing is disabled
//!   (`checkpoint_after_bytes = u64::MAX`) and the single segment is preallocated large enough
//!   for the whole run (okaywal preallocates by writing zeros). Its zeros are synced before the
//!   timed run, as they would be in a recycled segment, okaywal's steady state.
//! - Reads: reopen ([`WriteAheadLog::recover`]) with a [`LogManager`] whose `recover` reads,
//!   checks (CRC) and decodes every chunk; entries cut short (aborted) are dropped.

use crate::harness::{run_writers, ReadOutcome, WriteOutcome};
use crate::record::Record;
use anyhow::Context;
use indicatif::ProgressBar;
use okaywal::{
    Configuration, Entry, EntryId, LogManager, ReadChunkResult, SegmentReader, WriteAheadLog,
};
use std::io::{self, Read};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use stela_format::Codec;

/// okaywal always syncs on commit.
pub fn supports_sync_none() -> bool {
    false
}

/// Bytes okaywal writes for `sets` sets holding `records` records of `payload` bytes in total.
fn log_bytes(sets: u64, records: u64, payload: u64) -> u64 {
    // Header "okw\0" + version length; per entry: NEW_ENTRY + id (9) and END_OF_ENTRY (1);
    // per chunk: CHUNK + length (5) and CRC (4).
    5 + sets * 10 + records * 9 + payload
}

fn configuration(dir: &Path, expected_bytes: u64) -> Configuration {
    let slack = 1 << 20;
    let preallocate = (expected_bytes + slack).div_ceil(4096) * 4096;
    Configuration::default_for(dir)
        .preallocate_bytes(u32::try_from(preallocate).unwrap_or(!4095))
        .checkpoint_after_bytes(u64::MAX)
}

/// Writes every set as one durable entry from `writers` threads sharing one log in `dir`.
pub fn write(
    dir: &Path,
    codec: Codec,
    sets: &[&[Record]],
    payload_bytes: u64,
    writers: usize,
    progress: &ProgressBar,
) -> anyhow::Result<WriteOutcome> {
    let records: usize = sets.iter().map(|s| s.len()).sum();
    let expected = log_bytes(sets.len() as u64, records as u64, payload_bytes);
    let wal = configuration(dir, expected)
        .open(Collector::new(codec))
        .context("okaywal: open")?;
    // Sync the preallocated zeros now (an empty entry's commit fdatasyncs the file).
    wal.begin_entry()?.commit()?;

    let outcome = run_writers(sets, writers, progress, |_, _, set| {
        let mut encoded = Vec::with_capacity(set.len() * 160);
        let mut ends = Vec::with_capacity(set.len());
        for record in set {
            codec.encode_into(record, &mut encoded)?;
            ends.push(encoded.len());
        }
        let mut entry = wal.begin_entry()?;
        let mut start = 0;
        for end in ends {
            entry.write_chunk(&encoded[start..end])?;
            start = end;
        }
        entry.commit()?;
        Ok(())
    })?;
    wal.shutdown().context("okaywal: shutdown")?;
    Ok(outcome)
}

/// Reopens the log in `dir` and reads every record back; the time includes the reopen, which is
/// where okaywal reads its entries.
pub fn read(dir: &Path, codec: Codec) -> anyhow::Result<ReadOutcome> {
    let collector = Collector::new(codec);
    let totals = collector.totals.clone();
    let started = Instant::now();
    // The segment is already longer than this configuration's preallocation, so reopening
    // fills nothing; checkpointing stays disabled.
    let wal = configuration(dir, 0)
        .open(collector)
        .context("okaywal: recover")?;
    let seconds = started.elapsed().as_secs_f64();
    wal.shutdown().context("okaywal: shutdown")?;
    let mut outcome = totals.lock().expect("not poisoned").clone();
    outcome.seconds = seconds;
    Ok(outcome)
}

/// The `LogManager`: decodes every recovered chunk into a [`Record`] and counts it.
#[derive(Debug)]
struct Collector {
    codec: Codec,
    totals: Arc<Mutex<ReadOutcome>>,
    chunk: Vec<u8>,
    entry: Vec<Record>,
}

impl Collector {
    fn new(codec: Codec) -> Collector {
        Collector {
            codec,
            totals: Arc::default(),
            chunk: Vec::with_capacity(4096),
            entry: Vec::new(),
        }
    }
}

impl LogManager for Collector {
    fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()> {
        self.entry.clear();
        loop {
            match entry.read_chunk()? {
                ReadChunkResult::Chunk(mut chunk) => {
                    self.chunk.clear();
                    chunk.read_to_end(&mut self.chunk)?;
                    if !chunk.check_crc()? {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "okaywal: chunk CRC mismatch",
                        ));
                    }
                    let record = self
                        .codec
                        .decode(&self.chunk)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    self.entry.push(record);
                }
                ReadChunkResult::EndOfEntry => break,
                // Not committed: the whole entry is ignored, as okaywal prescribes.
                ReadChunkResult::AbortedEntry => return Ok(()),
            }
        }
        let mut totals = self.totals.lock().expect("not poisoned");
        for record in &self.entry {
            totals.add(record);
        }
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _last_checkpointed_id: EntryId,
        _checkpointed_entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> io::Result<()> {
        // Checkpointing is disabled during the benchmark (see the module docs); nothing to apply.
        Ok(())
    }
}
