//! A run on an embedded log in the run's directory: every client appends to one `stela_wal::Wal`
//! (in `embedded-sync` one at a time, so each commit pays its own fdatasync).

use super::mode::Mode;
use super::records::LoggedSource;
use super::timed::{drive, Commit, Outcome, Timing};
use anyhow::Context;
use std::path::Path;
use std::sync::Mutex;
use stela_format::Codec;
use stela_wal::SyncMode;

pub(super) fn run_embedded<S: LoggedSource>(
    mode: Mode,
    dir: &Path,
    timing: Timing,
    sources: Vec<S>,
) -> anyhow::Result<Outcome> {
    let sync = if mode == Mode::EmbeddedUnsafe {
        SyncMode::None
    } else {
        SyncMode::Data
    };
    let options = stela_wal::WalOptions::default()
        .codec(Codec::MessagePack)
        .sync(sync);
    let wal: stela_wal::Wal<S::Record> =
        stela_wal::Wal::open(dir, options).with_context(|| format!("{mode}: open the log"))?;
    // Held across append + commit in embedded-sync: a commit cannot find its record already
    // synced by another client's fdatasync, so each pays one of its own.
    let one_at_a_time = Mutex::new(());
    let serialize = mode == Mode::EmbeddedSync;
    let commits: Vec<Commit<'_, S::Record>> = sources
        .iter()
        .map(|_| {
            let wal = wal.clone();
            let lock = &one_at_a_time;
            Box::new(move |record: &S::Record| {
                let _turn = serialize.then(|| lock.lock().unwrap_or_else(|e| e.into_inner()));
                wal.append_durable(record)?;
                Ok(())
            }) as Commit<'_, S::Record>
        })
        .collect();
    let outcome = drive(sources, commits, timing, None)?;
    wal.close()
        .with_context(|| format!("{mode}: close the log"))?;
    Ok(outcome)
}
