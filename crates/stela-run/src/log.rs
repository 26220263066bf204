//! The run's log in the daemon: opening it with the record type's tag, and recovery before the
//! program starts (the log's tail replayed onto the files by [`crate::replay`], the files
//! synced, then the log truncated behind them).

use crate::error::RunError;
use crate::record::{self, RunRecord};
use crate::replay;
use crate::settings::Settings;
use stela_client::{Wal, WalOptions};

/// Opens `stela run`'s log (created if missing) with the record type's tag.
pub fn open_log(settings: &Settings) -> Result<Wal<RunRecord>, RunError> {
    let options = WalOptions::default()
        .durability(settings.level)
        .type_tag(record::TYPE_TAG)
        .create_if_missing(true);
    Wal::open(settings.socket.clone(), &settings.log, options).map_err(|source| RunError::Log {
        log: settings.log.clone(),
        source: Box::new(source),
    })
}

/// Replays the log's tail onto the files, syncs them, and truncates the log behind it.
/// Returns what was replayed.
pub fn recover(log: &Wal<RunRecord>, name: &str) -> Result<replay::Replayed, RunError> {
    let log_error = |source| RunError::Log {
        log: name.to_owned(),
        source: Box::new(source),
    };
    let positions = log.positions().map_err(log_error)?;
    if positions.last_lsn < positions.first_lsn || positions.last_lsn == 0 {
        return Ok(replay::Replayed::default());
    }
    let mut tail = Vec::new();
    for item in log
        .iter_from(stela_client::Lsn::new(positions.first_lsn.max(1)))
        .map_err(log_error)?
    {
        let (lsn, record) = item.map_err(log_error)?;
        if lsn.get() > positions.last_lsn {
            break;
        }
        tail.push(record);
    }
    let mut disk = replay::Disk::default();
    let done = replay::replay(&tail, &mut disk).map_err(RunError::Replay)?;
    disk.sync().map_err(RunError::Replay)?;
    log.truncate_before(stela_client::Lsn::new(positions.last_lsn + 1))
        .map_err(log_error)?;
    Ok(done)
}
