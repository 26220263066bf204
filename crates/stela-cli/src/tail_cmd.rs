//! `stela logs tail [-f] NAME`: a log's newest records as JSON lines, and with `-f` every record
//! after them as the daemon writes it (Kafka's console consumer, `tail -f`).
//!
//! It reads the log's segment files in the daemon's directory (DIR/logs/NAME) the way a warm
//! follower reads a standby's copy ([`stela_wal::tools::read_available`]): read only, no lock,
//! stopping quietly at a frame still being written. So it shows a record once the daemon has
//! written it: at once for a `disk` commit, within the flush interval for `buffered`. Nothing
//! here changes the log or talks to the daemon.

use anyhow::Context;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stela_wal::storage::StdStorage;
use stela_wal::tools::read_available;
use stela_wal::Lsn;

/// `stela logs tail`'s arguments.
#[derive(clap::Args, Debug)]
pub struct TailArgs {
    /// The log's name.
    pub name: String,
    /// The daemon's directory (the log is DIR/logs/NAME).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/stela")]
    pub dir: PathBuf,
    /// Keep following: print each record as the daemon writes it, until interrupted.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Start with the last N records written.
    #[arg(short = 'n', long, value_name = "N", default_value_t = 10)]
    pub lines: u64,
    /// How often to look for new records with -f.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = crate::units::parse_ms)]
    pub poll: crate::units::Dur,
}

/// Records read per call: bounds the memory a long catch-up takes.
const BATCH: usize = 4096;

pub fn run(args: &TailArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let log = args.dir.join("logs").join(&args.name);
    let storage = Arc::new(StdStorage);
    let (mut next, mut at) = (start_of_tail(&log, args.lines)?, None);
    loop {
        let available = read_available(&log, storage.clone(), next, BATCH, at)
            .with_context(|| format!("reading {}", log.display()))?;
        for (lsn, payload) in &available.records {
            let record = available
                .codec
                .to_json_value(payload)
                .with_context(|| format!("decoding LSN {lsn} of {}", log.display()))?;
            writeln!(
                out,
                "{}",
                serde_json::json!({ "lsn": lsn.get(), "record": record })
            )?;
            next = lsn.next();
        }
        at = available.next;
        out.flush()?;
        if available.records.len() == BATCH {
            continue;
        }
        if !args.follow {
            return Ok(());
        }
        std::thread::sleep(args.poll.get());
    }
}

/// The LSN `lines` records before the log's written end. Segments are named by their first
/// LSN; the newest ones are read, newest first, until they hold `lines` records.
fn start_of_tail(log: &Path, lines: u64) -> anyhow::Result<Lsn> {
    let mut starts: Vec<u64> = std::fs::read_dir(log)
        .with_context(|| format!("{}: no such log", log.display()))?
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".wal")?.parse().ok()
        })
        .collect();
    starts.sort_unstable();
    let Some(&first) = starts.first() else {
        anyhow::bail!("{}: not a log (no segment files)", log.display());
    };
    let storage = Arc::new(StdStorage);
    let end = {
        // The written end: read the newest segment to its last complete record.
        let newest = *starts.last().expect("not empty");
        let (mut from, mut at, mut end) = (Lsn::new(newest.max(1)), None, Lsn::new(newest.max(1)));
        loop {
            let available = read_available(log, storage.clone(), from, BATCH, at)?;
            if let Some((lsn, _)) = available.records.last() {
                end = lsn.next();
                from = end;
            }
            at = available.next;
            if available.records.len() < BATCH {
                break end;
            }
        }
    };
    // LSNs are dense from the first segment on, so the tail starts `lines` before the end.
    Ok(Lsn::new(end.get().saturating_sub(lines).max(first).max(1)))
}
