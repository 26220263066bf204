//! Terms and a log's term history: which primary wrote which stretch of a replicated log, and
//! where two copies of a log stop agreeing.
//!
//! A term is a primary's tenure: a standby that takes over opens a higher term, and every node
//! refuses records from a lower one. A log's [`TermHistory`] lists `(term, first LSN)`: from
//! that LSN on (up to the next entry's) the records were written by that term's primary.
//!
//! Invariants kept by every constructor and by [`TermHistory::decode`]:
//! - terms strictly increase and are never 0 (0 means "no term yet");
//! - first LSNs never decrease and are at least 1; two entries may share a first LSN (a term
//!   whose primary wrote nothing before the next took over): the later one owns those LSNs.
//!
//! The rule [`divergence`] rests on (the log-matching property of Raft and of Neon's
//! safekeepers): one term has one primary, which gives each LSN once, so two copies holding
//! the same LSN from the same term hold the same record there, and, since each copy received
//! that primary's records in order, the same records before it. Two copies therefore agree up
//! to the highest LSN both hold from the same term, and no further. On histories that label every
//! LSN with the term that wrote it, that is the end of their common prefix: the highest `L` such
//! that [`TermHistory::term_of`] agrees on every LSN up to `L` (the tests check both against each
//! other). It asks less of the labels, though: a standby enters a term in its history when the
//! first chunk of that term reaches it, so records it then receives that an earlier term wrote
//! are labelled with the new one; the rule above still finds where the copies part, where a
//! per-LSN comparison of labels would stop at the first mislabelled record.
//!
//! The encoding (`docs/FORMAT.md`, "Term history"), all little-endian:
//!
//! ```text
//! offset  size  field
//!      0     8  magic "STELATRM"
//!      8     2  version (1)
//!     10     2  reserved (0)
//!     12     4  entry count n
//!     16  16*n  entries: term u64, first LSN u64
//!  16+16n    4  CRC32C of every byte before it
//! ```

use std::fmt;

/// A primary's tenure. `Term(0)` is "no term yet".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Term(pub u64);

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "term {}", self.0)
    }
}

/// Which term wrote which LSNs of a log. See the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TermHistory {
    entries: Vec<(Term, u64)>,
}

/// Why a history or its encoding was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TermError {
    #[error("{term} after {last}: terms must increase")]
    TermNotIncreasing { term: Term, last: Term },
    #[error("{term} starting at LSN {first} after one starting at LSN {last_first}: first LSNs must not decrease")]
    LsnDecreasing {
        term: Term,
        first: u64,
        last_first: u64,
    },
    #[error("{term} starting at LSN 0: LSNs start at 1")]
    ZeroLsn { term: Term },
    #[error("term 0 is not a term")]
    ZeroTerm,
    #[error("not a term history: {0}")]
    Encoding(&'static str),
    #[error("term history checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
}

const MAGIC: &[u8; 8] = b"STELATRM";
const VERSION: u16 = 1;
const FIXED_BYTES: usize = 16;
const ENTRY_BYTES: usize = 16;

impl TermHistory {
    /// The history of a log no primary has written yet.
    pub fn new() -> TermHistory {
        TermHistory::default()
    }

    /// A history from its entries, checked.
    ///
    /// # Errors
    /// The first entry that breaks an invariant.
    pub fn from_entries(
        entries: impl IntoIterator<Item = (Term, u64)>,
    ) -> Result<TermHistory, TermError> {
        let mut history = TermHistory::new();
        for (term, first) in entries {
            history.push(term, first)?;
        }
        Ok(history)
    }

    /// Records that `term` writes from LSN `first` on.
    ///
    /// # Errors
    /// A term not above the last, term 0, LSN 0, or a first LSN below the last entry's.
    pub fn push(&mut self, term: Term, first: u64) -> Result<(), TermError> {
        if term == Term(0) {
            return Err(TermError::ZeroTerm);
        }
        if first == 0 {
            return Err(TermError::ZeroLsn { term });
        }
        if let Some(&(last, last_first)) = self.entries.last() {
            if term <= last {
                return Err(TermError::TermNotIncreasing { term, last });
            }
            if first < last_first {
                return Err(TermError::LsnDecreasing {
                    term,
                    first,
                    last_first,
                });
            }
        }
        self.entries.push((term, first));
        Ok(())
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> &[(Term, u64)] {
        &self.entries
    }

    /// The newest term in the history (`Term(0)` if none).
    pub fn last_term(&self) -> Term {
        self.entries.last().map_or(Term(0), |&(term, _)| term)
    }

    /// The term that wrote `lsn` (given the log holds it); `None` before the first entry.
    pub fn term_of(&self, lsn: u64) -> Option<Term> {
        // The last entry starting at or before `lsn`: of entries sharing a first LSN, the later
        // one owns it.
        let at = self.entries.partition_point(|&(_, first)| first <= lsn);
        at.checked_sub(1).map(|i| self.entries[i].0)
    }

    /// Forgets what the history says about LSNs after `lsn` (a node cutting its log after the
    /// divergence point): entries that start after it go.
    pub fn truncate_after(&mut self, lsn: u64) {
        let keep = self.entries.partition_point(|&(_, first)| first <= lsn);
        self.entries.truncate(keep);
    }

    /// The stretches of LSNs up to `end` that each term wrote: `(term, first, last)`, with empty
    /// terms left out.
    fn spans(&self, end: u64) -> impl Iterator<Item = (Term, u64, u64)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter_map(move |(i, &(term, first))| {
                let next = self.entries.get(i + 1).map_or(u64::MAX, |&(_, f)| f);
                let last = next.saturating_sub(1).min(end);
                (first <= last).then_some((term, first, last))
            })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FIXED_BYTES + ENTRY_BYTES * self.entries.len() + 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for &(term, first) in &self.entries {
            out.extend_from_slice(&term.0.to_le_bytes());
            out.extend_from_slice(&first.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes exactly one encoded history (no trailing bytes), checking its invariants.
    ///
    /// # Errors
    /// Bad magic, version, length or checksum, or a history that breaks an invariant.
    pub fn decode(bytes: &[u8]) -> Result<TermHistory, TermError> {
        if bytes.len() < FIXED_BYTES + 4 {
            return Err(TermError::Encoding("too short"));
        }
        if &bytes[..8] != MAGIC {
            return Err(TermError::Encoding("bad magic"));
        }
        if u16::from_le_bytes([bytes[8], bytes[9]]) != VERSION {
            return Err(TermError::Encoding("unknown version"));
        }
        let count = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
        let expected = count
            .checked_mul(ENTRY_BYTES)
            .and_then(|n| n.checked_add(FIXED_BYTES + 4));
        if expected != Some(bytes.len()) {
            return Err(TermError::Encoding("length does not match the entry count"));
        }
        let body = &bytes[..bytes.len() - 4];
        let stored = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().expect("4 bytes"));
        let computed = crc32c::crc32c(body);
        if stored != computed {
            return Err(TermError::Checksum { stored, computed });
        }
        if bytes[10..12] != [0, 0] {
            return Err(TermError::Encoding("reserved bytes are not zero"));
        }
        TermHistory::from_entries(body[FIXED_BYTES..].chunks_exact(ENTRY_BYTES).map(|e| {
            (
                Term(u64::from_le_bytes(e[..8].try_into().expect("8 bytes"))),
                u64::from_le_bytes(e[8..].try_into().expect("8 bytes")),
            )
        }))
    }
}

/// The last LSN up to which two copies of a log agree (0: not even their first record), given
/// each copy's history and last LSN. Everything after it on either side must be cut or fetched.
pub fn divergence(ours: (&TermHistory, u64), theirs: (&TermHistory, u64)) -> u64 {
    let (a, a_end) = ours;
    let (b, b_end) = theirs;
    let mut agreed = 0;
    // Both lists of spans are in LSN order and in term order: walk them together.
    let mut b_spans = b.spans(b_end).peekable();
    for (term, first, last) in a.spans(a_end) {
        while b_spans.peek().is_some_and(|&(t, _, _)| t < term) {
            b_spans.next();
        }
        if let Some(&(t, b_first, b_last)) = b_spans.peek() {
            if t == term {
                let (from, to) = (first.max(b_first), last.min(b_last));
                if from <= to {
                    agreed = agreed.max(to);
                }
            }
        }
    }
    agreed
}

/// What became of a record a client had acknowledged, or left in doubt, as (term, LSN), judged
/// by a log's history and last LSN (the new primary's, after a failover).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The log holds it: `lsn` is in the log and was written in `term`.
    Kept,
    /// It is gone: a later term's records (or none) took its place, so it can never appear.
    Lost,
    /// The log has not reached `lsn` in `term`'s run yet: it may still appear (for a record a
    /// client saw acknowledged, this means records were lost in a crash; ask again later).
    NotYet,
}

/// Resolves the record (`term`, `lsn`) against `history` and `last_lsn`:
/// - **Kept** iff `lsn <= last_lsn` and the history says `lsn` was written in `term`;
/// - **Lost** iff some other term covers `lsn` (a term that began at or before it and is not
///   `term`, while the log holds `lsn` or has moved on to a later term than `term`), since a
///   position is written in exactly one term and never again;
/// - **NotYet** otherwise: the log ends before `lsn` and its last term is still `term` (or
///   earlier), so `lsn` may yet be written in `term`.
pub fn resolve(history: &TermHistory, last_lsn: u64, term: Term, lsn: u64) -> Resolution {
    let covering = history.term_of(lsn);
    if lsn <= last_lsn {
        return if covering == Some(term) {
            Resolution::Kept
        } else {
            Resolution::Lost
        };
    }
    // Beyond the log's end: lost once a later term than `term` has begun (only that term's
    // primary writes from now on, and it never writes in `term`).
    if history.last_term() > term {
        Resolution::Lost
    } else {
        Resolution::NotYet
    }
}

/// [`resolve`] on a log that holds records up to `log_end` of which those up to `protected`
/// are held by a second node: a record present but not yet protected is `NotYet` (it becomes
/// `Kept` once protected, or is decided by a newer primary's history if this one is lost),
/// never `Lost` because it lies past the protected end while a newer term has begun.
pub fn resolve_protected(
    history: &TermHistory,
    log_end: u64,
    protected: u64,
    term: Term,
    lsn: u64,
) -> Resolution {
    match resolve(history, log_end.max(protected), term, lsn) {
        Resolution::Kept if lsn > protected => Resolution::NotYet,
        decided => decided,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The wrong `Lost` of issue 52's kill-then-kill-new runs: a record of term 1.1 at LSN 6481,
    /// in the log, past the protected end (4535), after a newer term began (the restarted
    /// primary's 1.2), was resolved `Lost` against the protected end alone; it is `NotYet`.
    #[test]
    fn a_present_record_past_the_protected_end_is_not_yet() {
        let h = history(&[((1 << 32) | 1, 1), ((1 << 32) | 2, 6482)]);
        let term = Term((1 << 32) | 1);
        assert_eq!(resolve(&h, 4535, term, 6481), Resolution::Lost);
        assert_eq!(
            resolve_protected(&h, 6500, 4535, term, 6481),
            Resolution::NotYet
        );
        assert_eq!(
            resolve_protected(&h, 6500, 6490, term, 6481),
            Resolution::Kept
        );
        // Written in another term: lost whether protected or not.
        assert_eq!(
            resolve_protected(&h, 6500, 4535, Term((1 << 32) | 2), 6481),
            Resolution::Lost
        );
        // Past the log's end with a newer term begun: lost.
        assert_eq!(
            resolve_protected(&h, 6500, 4535, term, 6600),
            Resolution::Lost
        );
    }

    fn history(entries: &[(u64, u64)]) -> TermHistory {
        TermHistory::from_entries(entries.iter().map(|&(t, f)| (Term(t), f))).unwrap()
    }

    #[test]
    fn invariants_are_checked() {
        let mut h = history(&[(1, 1), (3, 10)]);
        assert!(matches!(
            h.push(Term(3), 20),
            Err(TermError::TermNotIncreasing { .. })
        ));
        assert!(matches!(
            h.push(Term(4), 9),
            Err(TermError::LsnDecreasing { .. })
        ));
        assert!(matches!(h.push(Term(0), 20), Err(TermError::ZeroTerm)));
        assert!(matches!(
            TermHistory::new().push(Term(1), 0),
            Err(TermError::ZeroLsn { .. })
        ));
        h.push(Term(4), 10).unwrap(); // term 3 wrote nothing
        assert_eq!(h.term_of(9), Some(Term(1)));
        assert_eq!(h.term_of(10), Some(Term(4)));
        assert_eq!(h.term_of(0), None);
        assert_eq!(h.last_term(), Term(4));
        h.truncate_after(9);
        assert_eq!(h, history(&[(1, 1)]));
    }

    #[test]
    fn an_old_primary_that_kept_writing_diverges_where_the_standby_stopped() {
        // The old primary wrote term 1 up to 100; the standby had 90 of them when it took over
        // as term 2 at 91 and wrote on to 120.
        let old = history(&[(1, 1)]);
        let new = history(&[(1, 1), (2, 91)]);
        assert_eq!(divergence((&old, 100), (&new, 120)), 90);
        assert_eq!(divergence((&new, 120), (&old, 100)), 90);
        // A standby that is simply behind agrees up to its end.
        assert_eq!(divergence((&new, 120), (&new, 95)), 95);
        // Logs of unrelated terms agree on nothing.
        assert_eq!(
            divergence((&history(&[(1, 1)]), 5), (&history(&[(2, 1)]), 5)),
            0
        );
        assert_eq!(divergence((&TermHistory::new(), 0), (&old, 100)), 0);
    }

    #[test]
    fn a_standby_that_labels_records_by_the_term_that_shipped_them_still_agrees() {
        // The primary wrote 1..=95 in term 1 and began term 2 at 96. Its standby, at 80 when
        // term 2's first chunk came, entered term 2 at 81 and then received 81..=120.
        let primary = history(&[(1, 1), (2, 96)]);
        let standby = history(&[(1, 1), (2, 81)]);
        assert_eq!(divergence((&primary, 120), (&standby, 120)), 120);
        assert_eq!(divergence((&primary, 130), (&standby, 110)), 110);
        // Had the standby taken over as term 3 at 111, the copies part at 110.
        let promoted = history(&[(1, 1), (2, 81), (3, 111)]);
        assert_eq!(divergence((&primary, 130), (&promoted, 140)), 110);
    }

    /// The highest `L` up to which both histories give every LSN the same term (the common
    /// prefix, LSN by LSN).
    fn common_prefix(a: &TermHistory, a_end: u64, b: &TermHistory, b_end: u64) -> u64 {
        (1..=a_end.min(b_end))
            .take_while(|&lsn| a.term_of(lsn).is_some() && a.term_of(lsn) == b.term_of(lsn))
            .last()
            .unwrap_or(0)
    }

    /// Two copies that share a history up to a fork: the common part, then the fork's term
    /// continued by one side (`extra` records), then each side's own later terms (disjoint, as
    /// each term has one primary), some of them empty.
    fn forked() -> impl Strategy<Value = (TermHistory, u64, TermHistory, u64, u64)> {
        (
            prop::collection::vec((1u64..4, 0u64..20), 1..6),
            0u64..30,
            prop::collection::vec((0u64..20, any::<bool>()), 0..4),
            prop::collection::vec((0u64..20, any::<bool>()), 0..4),
            any::<bool>(),
        )
            .prop_map(|(common, extra, mine, yours, swap)| {
                let mut h = TermHistory::new();
                let (mut term, mut lsn) = (0u64, 1u64);
                for (step, records) in common {
                    term += step;
                    h.push(Term(term), lsn).unwrap();
                    lsn += records;
                }
                let fork = lsn - 1; // both hold 1..=fork
                let (mut a, mut b) = (h.clone(), h);
                let (mut a_end, mut b_end) = (fork + extra, fork);
                // Later terms: A's are odd offsets, B's even, so they never meet.
                for (i, (records, _)) in (0u64..).zip(mine) {
                    a.push(Term(6 * term + 3 + 2 * i), a_end + 1).unwrap();
                    a_end += records;
                }
                for (i, (records, _)) in (0u64..).zip(yours) {
                    // B's own terms start right after the fork, where B stopped.
                    b.push(Term(6 * term + 2 + 2 * i), b_end + 1).unwrap();
                    b_end += records;
                }
                if swap {
                    (b, b_end, a, a_end, fork)
                } else {
                    (a, a_end, b, b_end, fork)
                }
            })
    }

    proptest! {
        #[test]
        fn divergence_is_exactly_the_fork((a, a_end, b, b_end, fork) in forked()) {
            let expected = fork.min(a_end).min(b_end);
            prop_assert_eq!(divergence((&a, a_end), (&b, b_end)), expected);
            prop_assert_eq!(divergence((&b, b_end), (&a, a_end)), expected);
            prop_assert_eq!(divergence((&a, a_end), (&a, a_end)), a_end);
            prop_assert_eq!(common_prefix(&a, a_end, &b, b_end), expected);
        }

        #[test]
        fn divergence_is_the_common_prefix_of_two_copies(
            (a, a_end, b, b_end, _) in forked(),
            cut_a in any::<prop::sample::Index>(),
            cut_b in any::<prop::sample::Index>(),
        ) {
            // Either copy cut back anywhere (a lagging or truncated copy), in either order.
            let (mut a, mut b) = (a, b);
            let a_end = cut_a.index(a_end as usize + 1) as u64;
            let b_end = cut_b.index(b_end as usize + 1) as u64;
            a.truncate_after(a_end);
            b.truncate_after(b_end);
            let expected = common_prefix(&a, a_end, &b, b_end);
            prop_assert_eq!(divergence((&a, a_end), (&b, b_end)), expected);
            prop_assert_eq!(divergence((&b, b_end), (&a, a_end)), expected);
        }

        #[test]
        fn a_copy_that_lags_agrees_up_to_its_end((a, a_end, _, _, _) in forked(), behind in any::<prop::sample::Index>()) {
            let lagging = behind.index(a_end as usize + 1) as u64;
            let mut short = a.clone();
            short.truncate_after(lagging);
            prop_assert_eq!(divergence((&a, a_end), (&short, lagging)), lagging);
            prop_assert_eq!(divergence((&short, lagging), (&a, a_end)), lagging);
        }

        #[test]
        fn encoding_round_trips((a, _, _, _, _) in forked()) {
            prop_assert_eq!(TermHistory::decode(&a.encode()).unwrap(), a);
        }

        #[test]
        fn damaged_encodings_are_refused((a, _, _, _, _) in forked(), at in any::<prop::sample::Index>(), bit in 0u8..8, cut in any::<prop::sample::Index>()) {
            let bytes = a.encode();
            let mut flipped = bytes.clone();
            flipped[at.index(bytes.len())] ^= 1 << bit;
            prop_assert!(TermHistory::decode(&flipped).is_err());
            let cut = cut.index(bytes.len());
            prop_assert!(TermHistory::decode(&bytes[..cut]).is_err());
        }

        #[test]
        fn mutated_encodings_are_refused_or_unchanged(
            (a, _, _, _, _) in forked(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
            cut in any::<prop::sample::Index>(),
            grow in prop::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut bytes = a.encode();
            for (at, value) in edits {
                let at = at.index(bytes.len());
                bytes[at] = value;
            }
            let keep = cut.index(bytes.len() + 1);
            bytes.truncate(keep);
            bytes.extend_from_slice(&grow);
            // A different valid history would need a CRC32C collision on top of a mutation.
            if let Ok(decoded) = TermHistory::decode(&bytes) {
                prop_assert_eq!(decoded, a);
            }
        }

        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = TermHistory::decode(&bytes);
        }
    }

    #[test]
    fn resolution_of_each_case() {
        let history =
            TermHistory::from_entries([(Term(1), 1), (Term(3), 11), (Term(7), 21)]).unwrap();
        // Kept: in the log, in its term.
        assert_eq!(resolve(&history, 25, Term(1), 10), Resolution::Kept);
        assert_eq!(resolve(&history, 25, Term(3), 11), Resolution::Kept);
        assert_eq!(resolve(&history, 25, Term(7), 25), Resolution::Kept);
        // Lost: another term wrote that position.
        assert_eq!(resolve(&history, 25, Term(1), 11), Resolution::Lost);
        assert_eq!(resolve(&history, 25, Term(2), 5), Resolution::Lost);
        assert_eq!(resolve(&history, 25, Term(3), 22), Resolution::Lost);
        // Beyond the end: lost once a later term has begun; not yet while the term goes on.
        assert_eq!(resolve(&history, 25, Term(3), 30), Resolution::Lost);
        assert_eq!(resolve(&history, 25, Term(7), 26), Resolution::NotYet);
        assert_eq!(resolve(&history, 25, Term(9), 26), Resolution::NotYet);
        assert_eq!(
            resolve(&TermHistory::new(), 0, Term(1), 1),
            Resolution::NotYet
        );
    }

    proptest! {
        /// Against the per-LSN definition: a record (t, l) is kept exactly when the log holds
        /// l and wrote it in t; once decided (kept or lost) the answer never changes as the log
        /// grows in its last term or a later one begins.
        #[test]
        fn resolution_is_final_and_matches_term_of(
            starts in proptest::collection::vec(1u64..40, 1..6),
            last in 0u64..60,
            term in 1u64..12,
            lsn in 1u64..60,
            more in 0u64..20,
        ) {
            let mut firsts: Vec<u64> = starts;
            firsts.sort_unstable();
            // A real history: every term began at or before the log's next LSN.
            let last = last.max(firsts.last().copied().unwrap_or(1) - 1);
            let history = TermHistory::from_entries(
                firsts.iter().enumerate().map(|(i, &f)| (Term(i as u64 * 2 + 1), f)),
            ).unwrap();
            let answer = resolve(&history, last, Term(term), lsn);
            let kept = lsn <= last && history.term_of(lsn) == Some(Term(term));
            prop_assert_eq!(answer == Resolution::Kept, kept);
            // The log grows in its last term: a decided answer stays.
            let grown = resolve(&history, last + more, Term(term), lsn);
            if answer != Resolution::NotYet {
                prop_assert_eq!(grown, answer);
            }
            // A later term begins after the end: a decided answer stays, and NotYet becomes
            // Lost unless the record made it in before.
            let mut later = history.clone();
            let start = (last + more + 1).max(history.entries().last().map_or(1, |e| e.1));
            later.push(Term(100), start).unwrap();
            let after = resolve(&later, last + more, Term(term), lsn);
            if answer != Resolution::NotYet {
                prop_assert_eq!(after, answer);
            } else {
                prop_assert!(after != Resolution::NotYet);
            }
        }
    }
}
