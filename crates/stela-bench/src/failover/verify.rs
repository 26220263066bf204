//! After the run, with every process stopped: the final logs of both nodes read from their
//! directories with the embedded reader (`stela_wal::Wal`), and checked against what the client
//! was told. An acknowledged record is **lost** unless the final primary's log holds it at the
//! LSN it was acknowledged at (missing, or present at another LSN, are both lost).

use super::events::{genuine, Outcome, Rec, TYPE_TAG};
use anyhow::Context;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// One node's copy of the log: LSN to sequence number.
#[derive(Debug, Default, Clone)]
pub struct LogCopy {
    pub records: BTreeMap<u64, u64>,
    /// LSNs holding a record nobody sent (a filler that does not match its sequence number).
    pub garbage: Vec<u64>,
    /// LSN to the bytes of the log's frames up to and including it (docs/FORMAT.md: a 20-byte
    /// frame header and the MessagePack record; segment headers and preallocated space are not
    /// counted, so this is the log's size as data, whatever the files' lengths).
    pub bytes_through: BTreeMap<u64, u64>,
}

/// A frame's header (docs/FORMAT.md, "Record frame").
const FRAME_HEADER_BYTES: u64 = 20;

impl LogCopy {
    /// Bytes of the frames up to `lsn` (those of the last LSN below it if it is absent).
    pub fn bytes_through(&self, lsn: u64) -> u64 {
        self.bytes_through
            .range(..=lsn)
            .next_back()
            .map_or(0, |(_, &bytes)| bytes)
    }
}

/// Reads `dir/logs/<log>` of a stopped daemon.
///
/// # Errors
/// The log cannot be opened or read (a damaged record is an error, not a loss to count).
pub fn read_log(dir: &Path, log: &str) -> anyhow::Result<LogCopy> {
    let path = dir.join("logs").join(log);
    let wal: stela_wal::Wal<Rec> = stela_wal::Wal::open(
        &path,
        stela_wal::WalOptions::default()
            .codec(stela_wal::Codec::MessagePack)
            .type_tag(TYPE_TAG)
            .create_if_missing(false),
    )
    .with_context(|| format!("open {} with the embedded reader", path.display()))?;
    let mut copy = LogCopy::default();
    let mut total = 0u64;
    for item in wal.iter()? {
        let (lsn, rec) = item.with_context(|| format!("read {}", path.display()))?;
        if !genuine(&rec) {
            copy.garbage.push(lsn.get());
        }
        // Encoding is deterministic: the record's bytes in the frame, re-made.
        total += FRAME_HEADER_BYTES + stela_format::Codec::MessagePack.encode(&rec)?.len() as u64;
        copy.records.insert(lsn.get(), rec.0);
        copy.bytes_through.insert(lsn.get(), total);
    }
    Ok(copy)
}

/// One record of a log as [`peek_log`] sees it: its LSN, a CRC32C of its payload (to compare
/// copies by) and the bytes of its frame.
pub type Peeked = (u64, u32, u64);

/// A read-only look at `dir/logs/<log>` while its daemon runs, or after it died and before it
/// restarts: no lock is taken and nothing is repaired (the embedded `Wal::open` of
/// [`read_log`] would cut a torn tail, changing what the restarted node recovers). Records up
/// to `through` (all if `None`); a node that never had the log has none.
///
/// # Errors
/// The log cannot be read, or is damaged before its newest segment.
pub fn peek_log(dir: &Path, log: &str, through: Option<u64>) -> anyhow::Result<Vec<Peeked>> {
    let path = dir.join("logs").join(log);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let storage: std::sync::Arc<dyn stela_wal::storage::Storage> =
        std::sync::Arc::new(stela_wal::storage::StdStorage);
    let (mut records, mut from, mut at) = (Vec::new(), stela_wal::Lsn::FIRST, None);
    loop {
        let read = stela_wal::tools::read_available(&path, storage.clone(), from, 65_536, at)
            .with_context(|| format!("read {} without opening it", path.display()))?;
        let Some(&(last, _)) = read.records.last() else {
            return Ok(records);
        };
        for (lsn, payload) in &read.records {
            if through.is_some_and(|end| lsn.get() > end) {
                return Ok(records);
            }
            let frame = stela_format::frame::frame_len(payload.len()) as u64;
            records.push((lsn.get(), crc32c::crc32c(payload), frame));
        }
        from = stela_wal::Lsn::new(last.get() + 1);
        at = read.next;
    }
}

/// What reprotecting `standby` from `primary` had to move, in frame bytes: the standby's
/// records past their common prefix (diverged, to be cut) and the primary's (missing, to be
/// shipped). Both logs start at LSN 1 here (the benchmark never truncates).
pub fn reprotect_need(standby: &[Peeked], primary: &[Peeked]) -> (u64, u64) {
    let common = standby
        .iter()
        .zip(primary)
        .take_while(|(s, p)| s.0 == p.0 && s.1 == p.1)
        .count();
    let bytes = |records: &[Peeked]| records.iter().map(|r| r.2).sum::<u64>();
    (bytes(&standby[common..]), bytes(&primary[common..]))
}

/// What the final logs say of the client's acknowledgements and resolutions.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Verdict {
    /// Acknowledged sequence numbers not at their LSN in the final primary's log, each with
    /// what that LSN holds instead (None: past the end).
    pub lost: BTreeMap<u64, Option<u64>>,
    /// Commits in doubt whose resolution the final log contradicts (both kinds below).
    pub resolution_wrong: Vec<u64>,
    /// Resolved `Kept`, absent from their LSN in the final log.
    pub kept_absent: Vec<u64>,
    /// Resolved `Lost`, present at their LSN in the final log.
    pub lost_present: Vec<u64>,
    /// LSNs both copies hold with different records (the standby must be a prefix).
    pub standby_mismatch: Vec<u64>,
}

/// Checks `acked` (seq -> (term, LSN, time)) and `resolved` (seq -> (LSN, outcome)) against
/// the final primary's copy, and the standby's copy against it.
pub fn check(
    acked: &HashMap<u64, (u64, u64, f64)>,
    resolved: &HashMap<u64, (u64, Outcome)>,
    primary: &LogCopy,
    standby: Option<&LogCopy>,
) -> Verdict {
    let mut verdict = Verdict::default();
    for (&seq, &(_, lsn, _)) in acked {
        let there = primary.records.get(&lsn).copied();
        if there != Some(seq) {
            verdict.lost.insert(seq, there);
        }
    }
    for (&seq, &(lsn, outcome)) in resolved {
        let kept = primary.records.get(&lsn) == Some(&seq);
        match (outcome, kept) {
            (Outcome::Kept, false) => verdict.kept_absent.push(seq),
            (Outcome::Lost, true) => verdict.lost_present.push(seq),
            _ => continue,
        }
        verdict.resolution_wrong.push(seq);
    }
    verdict.resolution_wrong.sort_unstable();
    verdict.kept_absent.sort_unstable();
    verdict.lost_present.sort_unstable();
    if let Some(standby) = standby {
        verdict.standby_mismatch = standby
            .records
            .iter()
            .filter(|(lsn, seq)| primary.records.get(lsn).is_some_and(|p| p != *seq))
            .map(|(lsn, _)| *lsn)
            .collect();
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failover::events::record;

    #[test]
    fn acknowledged_records_must_be_at_their_lsn() {
        let primary = LogCopy {
            records: BTreeMap::from([(1, 10), (2, 11), (3, 13)]),
            ..LogCopy::default()
        };
        let standby = LogCopy {
            records: BTreeMap::from([(1, 10), (2, 12)]),
            ..LogCopy::default()
        };
        let acked = HashMap::from([
            (10, (1, 1, 0.0)),
            (11, (1, 2, 0.0)),
            (12, (1, 3, 0.0)), // LSN 3 holds 13: lost
            (14, (1, 4, 0.0)), // past the end: lost
        ]);
        let resolved = HashMap::from([
            (13, (3, Outcome::Kept)),
            (15, (4, Outcome::Kept)), // past the end: wrong
            (11, (2, Outcome::Lost)), // there: wrong
            (16, (1, Outcome::Lost)),
        ]);
        let verdict = check(&acked, &resolved, &primary, Some(&standby));
        assert_eq!(verdict.lost, BTreeMap::from([(12, Some(13)), (14, None)]));
        assert_eq!(verdict.resolution_wrong, vec![11, 15]);
        assert_eq!(
            (verdict.kept_absent, verdict.lost_present),
            (vec![15], vec![11])
        );
        assert_eq!(verdict.standby_mismatch, vec![2]);
    }

    #[test]
    fn reads_a_log_written_embedded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs").join("failover");
        std::fs::create_dir_all(&path).unwrap();
        {
            let wal: stela_wal::Wal<Rec> = stela_wal::Wal::open(
                &path,
                stela_wal::WalOptions::default()
                    .codec(stela_wal::Codec::MessagePack)
                    .type_tag(TYPE_TAG),
            )
            .unwrap();
            for seq in [5, 7, 9] {
                wal.append(&record(seq, 30)).unwrap();
            }
            wal.append(&(11, "not the filler of 11".to_owned()))
                .unwrap();
            let last = wal.append(&record(12, 0)).unwrap();
            wal.commit(last).unwrap();
        }
        let copy = read_log(dir.path(), "failover").unwrap();
        assert_eq!(
            copy.records,
            BTreeMap::from([(1, 5), (2, 7), (3, 9), (4, 11), (5, 12)])
        );
        assert_eq!(copy.garbage, vec![4]);
        // (u64 below 128, 30-byte str): array header 1 + seq 1 + str header 1 + 30 = 33 bytes.
        assert_eq!(copy.bytes_through(1), 20 + 33);
        assert_eq!(copy.bytes_through(3), 3 * (20 + 33));
        assert_eq!(copy.bytes_through(99), copy.bytes_through(5));
        assert_eq!(copy.bytes_through(0), 0);
        assert!(read_log(dir.path(), "nope").is_err());
        // The read-only look agrees, frame for frame, and stops where asked.
        let peeked = peek_log(dir.path(), "failover", None).unwrap();
        assert_eq!(
            peeked.iter().map(|r| r.0).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        for &(lsn, _, frame) in &peeked {
            assert_eq!(copy.bytes_through(lsn) - copy.bytes_through(lsn - 1), frame);
        }
        assert_eq!(
            peek_log(dir.path(), "failover", Some(3)).unwrap(),
            peeked[..3]
        );
        assert!(peek_log(dir.path(), "nope", None).unwrap().is_empty());
    }

    #[test]
    fn reprotect_need_counts_both_sides_past_the_common_prefix() {
        let at = |lsn, crc| (lsn, crc, 120u64);
        let primary = [at(1, 7), at(2, 8), at(3, 1), at(4, 2), at(5, 3)];
        // LSNs 3 and 4 diverged: cut on the standby, shipped with 5 from the primary.
        let standby = [at(1, 7), at(2, 8), at(3, 9), at(4, 10)];
        assert_eq!(reprotect_need(&standby, &primary), (240, 360));
        assert_eq!(reprotect_need(&primary[..2], &primary), (0, 360));
        assert_eq!(reprotect_need(&primary, &primary), (0, 0));
        assert_eq!(reprotect_need(&[], &primary), (0, 600));
    }
}
