//! Log retention: the oldest LSN the store may still have to read from its log, below which
//! the log is truncated. Pure: the store gathers what each reader needs, this module takes the
//! minimum.
//!
//! Who reads the log, and from where:
//! - restart's analysis, from the begin record of the checkpoint the master record names (which
//!   must therefore be synced before the log is cut: a master record lost to a crash would send
//!   restart to an older checkpoint, or to LSN 1), or, for a checkpoint logged as a delta, from
//!   the full checkpoint its chain starts from (the store passes that one's begin record and
//!   table: no page in a later table of the chain is dirty from before both);
//! - restart's redo, from the oldest `rec_lsn` of that checkpoint's dirty-page table (a page
//!   dirtied later has its first change after the begin record);
//! - restart's undo, from the first record of any transaction running now (one that starts
//!   later writes after now);
//! - the decoupled checkpoint's analysis and the decoupled cleaner, from the record after the
//!   last one they consumed;
//! - the archiver and single-page recovery, from the record after the archive's end: below it,
//!   the archive holds every page change the log held (down to its page backup, which holds
//!   every page as of the point the log was once truncated before: the store prunes the archive
//!   only up to that point, `Shared::prune_archive`).
//!
//! Invariant: [`LogNeeds::keep_from`] is at or below each of these, so truncating the log
//! before it drops nothing anyone will read; without a checkpoint it is LSN 1.

use stela_format::Lsn;

/// Where each reader of the log starts. See the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogNeeds {
    /// The last LSN the archive holds.
    pub archived: Lsn,
    /// The synced master record's checkpoint (for a delta, its chain's full checkpoint): its
    /// begin record and the oldest `rec_lsn` of its dirty-page table (`None` if it has no
    /// dirty page). `None`: no checkpoint.
    pub checkpoint: Option<(Lsn, Option<Lsn>)>,
    /// The first record of the oldest running transaction that has written.
    pub oldest_running: Option<Lsn>,
    /// The next record the decoupled checkpoint's analysis reads (`None` with classical
    /// checkpoints).
    pub analysis_next: Option<Lsn>,
    /// The next record the decoupled cleaner reads (`None` with the classical one).
    pub cleaner_next: Option<Lsn>,
}

impl LogNeeds {
    /// The oldest LSN the log must keep.
    pub fn keep_from(&self) -> Lsn {
        let Some((begin, oldest_dirty)) = self.checkpoint else {
            return Lsn::FIRST;
        };
        [
            Some(self.archived.next()),
            Some(begin),
            oldest_dirty,
            self.oldest_running,
            self.analysis_next,
            self.cleaner_next,
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("the archive's end is always there")
        .max(Lsn::FIRST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_kept_from_the_oldest_need() {
        let l = Lsn::new;
        let needs = LogNeeds {
            archived: l(500),
            checkpoint: Some((l(400), Some(l(350)))),
            oldest_running: Some(l(420)),
            analysis_next: Some(l(480)),
            cleaner_next: Some(l(450)),
        };
        assert_eq!(needs.keep_from(), l(350));
        assert_eq!(
            LogNeeds {
                archived: l(300),
                ..needs
            }
            .keep_from(),
            l(301),
            "nothing unarchived goes"
        );
        assert_eq!(
            LogNeeds {
                oldest_running: Some(l(7)),
                ..needs
            }
            .keep_from(),
            l(7)
        );
        assert_eq!(
            LogNeeds {
                checkpoint: None,
                ..needs
            }
            .keep_from(),
            Lsn::FIRST,
            "without a checkpoint restart reads everything"
        );
    }
}
