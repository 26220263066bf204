//! The primary's hold on its own copy of a log for its standby (`stela_wal::holds`,
//! [`stela_wal::holds::record_standby`]): from the first LSN the standby has not stored yet, so
//! that a client's truncation or `--retain-bytes` (which respect every hold, see the engine's
//! `held_back`) never removes records a lagging, restarting or absent standby still has to
//! fetch. PostgreSQL's replication slots keep WAL for the same reason.
//!
//! Invariants:
//! - **Never above what the standby stored.** The hold moves to the standby's durable LSN + 1
//!   as it acknowledges it, and to where the standby's copy stands at each handshake (down too,
//!   for a standby that lost unsynced records in a crash). Moving it lags the acknowledgements
//!   by at most [`MOVE_EVERY`]; an older hold only keeps more.
//! - **A new primary holds from its first LSN.** A log opened by a primary with no hold for its
//!   standby is held from the LSN its new term begins at: after a failover the returning old
//!   primary needs nothing older than that (what it holds beyond it, it cuts).
//! - **Failures are loud, never fatal.** A hold that cannot be written is reported; shipping
//!   and commits go on (without a hold, truncation behaves as it did before holds existed).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_format::Lsn;
use stela_wal::storage::Storage;

/// Most often the hold's file is rewritten while the standby acknowledges.
pub(super) const MOVE_EVERY: Duration = Duration::from_secs(1);

/// One log's hold for the standby, kept by its shipper thread.
pub(super) struct StandbyHold {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    standby: String,
    /// What the hold's file says, as far as this node wrote or read it.
    from: Option<u64>,
    /// When the acknowledgements were last looked at.
    looked_at: Option<Instant>,
}

impl StandbyHold {
    /// The hold on the copy in `dir` for `standby`; recorded at `first` (where this primary's
    /// term begins) if there is none yet.
    pub(super) fn open(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        standby: String,
        first: u64,
    ) -> StandbyHold {
        let holder = stela_wal::holds::standby_holder(&standby);
        let from = match stela_wal::holds::list(storage.as_ref(), &dir) {
            Ok(holds) => holds
                .iter()
                .find(|hold| hold.holder.as_deref() == Some(holder.as_str()))
                .map(|hold| hold.lsn.get()),
            Err(why) => {
                tracing::warn!(dir = %dir.display(), why = %why, "the log's holds cannot be listed");
                None
            }
        };
        let mut hold = StandbyHold {
            storage,
            dir,
            standby,
            from,
            looked_at: None,
        };
        if hold.from.is_none() {
            hold.record(first);
        }
        hold
    }

    /// The standby's copy stands at `first_needed` (its durable LSN + 1), as its handshake
    /// says: recorded now, up or down.
    pub(super) fn standby_at(&mut self, first_needed: u64) {
        if self.from != Some(first_needed) {
            self.record(first_needed);
        }
    }

    /// The standby acknowledged storing everything below `first_needed()`: the hold moves up,
    /// at most once every [`MOVE_EVERY`] (the acknowledgements are looked at only then).
    pub(super) fn acknowledged(&mut self, first_needed: impl FnOnce() -> u64) {
        if self.looked_at.is_some_and(|at| at.elapsed() < MOVE_EVERY) {
            return;
        }
        self.looked_at = Some(Instant::now());
        let first_needed = first_needed();
        if self.from.is_none_or(|from| first_needed > from) {
            self.record(first_needed);
        }
    }

    fn record(&mut self, first_needed: u64) {
        let recorded = stela_wal::holds::record_standby(
            self.storage.as_ref(),
            &self.dir,
            &self.standby,
            Lsn::new(first_needed.max(1)),
        );
        match recorded {
            Ok(_) => self.from = Some(first_needed),
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), standby = %self.standby, %error,
                    "the standby's hold on this copy cannot be recorded: truncation may remove records the standby lacks")
            }
        }
    }
}
