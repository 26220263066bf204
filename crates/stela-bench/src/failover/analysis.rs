//! From the client's events, what happened around each fault: the downtime of a failover, the
//! longest `replicated` commit during a fault that should not fail over, the acknowledgements
//! given after one in a newer term had been seen (two primaries), and the summary over the
//! run. Pure: events and fault times in, rows out.
//!
//! Definitions (the module's callers print them in the results):
//! - a fault's **period** runs from the start of its injection to the start of the next one's
//!   (the last one's to the end of the run), so every event after the first injection belongs
//!   to exactly one fault;
//! - the **injection** time is when the fault is in force: the signal sent, or the `ip`/`tc`
//!   command that makes it returned (the few milliseconds it runs, a commit can still complete
//!   the old way);
//! - **downtime** (faults that fail over): injection to the first acknowledgement of a commit
//!   that *began* after the injection, given by a primary of a newer epoch than the one before
//!   the fault; a commit in flight at the injection does not count, as its answer may have left
//!   the old primary before the fault, nor does one the old primary answered after the
//!   injection began (a signal takes effect a little after it is sent);
//! - **blocked** (faults that should not fail over): the longest wait of a commit that was
//!   waiting at some moment between injection and restoration;
//! - **unavailable** (every fault): the longest time without any acknowledgement from the
//!   injection to the end of the period (commits answered `Unprotected` and asked again are
//!   not acknowledgements: they count as unavailable, as a user of `replicated` sees them);
//! - **double primary**: an acknowledgement in term t seen after one in a term above t, or in
//!   the same term at an LSN not above the last one acknowledged in it (the client commits one
//!   record at a time, so one primary's LSNs in a term only grow: a second node answering in
//!   the same term is seen this way).

use super::events::{Event, Outcome};
use serde::Serialize;
use std::collections::HashMap;

/// When one fault was injected and undone, as the run recorded it.
#[derive(Debug, Clone)]
pub struct FaultWindow {
    /// When the injection began (the period starts here).
    pub start_ms: f64,
    /// When the fault was in force.
    pub inject_ms: f64,
    /// When the fault's condition ended (link up, process continued or restarted, ...).
    pub restore_ms: f64,
    pub expects_failover: bool,
    /// The pair's epoch before the fault: a failover's downtime ends at the first
    /// acknowledgement in a later one.
    pub epoch_before: u64,
}

/// What the events say about one fault's period.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FaultFacts {
    /// Null when no commit that began after the injection was acknowledged in the period.
    pub downtime_ms: Option<f64>,
    pub blocked_ms: f64,
    /// The longest time without an acknowledgement, from the injection to the period's end.
    pub unavailable_ms: f64,
    pub acked: u64,
    /// Commits answered `Unprotected` (first such answer in the period).
    pub unprotected: u64,
    pub in_doubt: u64,
    pub double_primary: u64,
}

/// The period of fault `i` of `faults` (sorted by injection), up to `end_ms`.
fn period(faults: &[FaultWindow], i: usize, end_ms: f64) -> (f64, f64) {
    let from = faults[i].start_ms;
    let to = faults.get(i + 1).map_or(end_ms, |f| f.start_ms);
    (from, to)
}

/// The facts of every fault, in order. Events must be in the order the client wrote them.
pub fn facts(events: &[Event], faults: &[FaultWindow]) -> Vec<FaultFacts> {
    let end_ms = events
        .last()
        .map_or(0.0, Event::t_ms)
        .max(faults.last().map_or(0.0, |f| f.restore_ms.max(f.inject_ms)))
        + 1.0;
    let doubles = double_primary_times(events);
    (0..faults.len())
        .map(|i| {
            let fault = &faults[i];
            let (from, to) = period(faults, i, end_ms);
            let inside = |t: f64| t >= from && t < to;
            let mut facts = FaultFacts::default();
            let mut last_ack = fault.inject_ms;
            for event in events {
                if let Event::Ack { t_ms, .. } = event {
                    if *t_ms >= fault.inject_ms && *t_ms < to {
                        facts.unavailable_ms = facts.unavailable_ms.max(t_ms - last_ack);
                        last_ack = *t_ms;
                    }
                }
                match event {
                    Event::Unprotected { t_ms, .. } if inside(*t_ms) => facts.unprotected += 1,
                    Event::Ack {
                        t_ms,
                        wait_ms,
                        term,
                        ..
                    } => {
                        if inside(*t_ms) {
                            facts.acked += 1;
                            let began = t_ms - wait_ms;
                            if fault.expects_failover
                                && term >> 32 > fault.epoch_before
                                && began >= fault.inject_ms
                                && facts.downtime_ms.is_none()
                            {
                                facts.downtime_ms = Some(t_ms - fault.inject_ms);
                            }
                        }
                        if waited_through(*t_ms, *wait_ms, fault) {
                            facts.blocked_ms = facts.blocked_ms.max(*wait_ms);
                        }
                    }
                    Event::InDoubt { t_ms, wait_ms, .. } => {
                        if inside(*t_ms) {
                            facts.in_doubt += 1;
                        }
                        if waited_through(*t_ms, *wait_ms, fault) {
                            facts.blocked_ms = facts.blocked_ms.max(*wait_ms);
                        }
                    }
                    _ => {}
                }
            }
            facts.unavailable_ms = facts.unavailable_ms.max(to.min(end_ms) - last_ack);
            if !fault.expects_failover {
                facts.downtime_ms = Some(0.0);
            }
            facts.double_primary = doubles.iter().filter(|&&t| inside(t)).count() as u64;
            facts
        })
        .collect()
}

/// Whether a commit that ended at `t_ms` after `wait_ms` was waiting at some moment while
/// `fault` was in force.
fn waited_through(t_ms: f64, wait_ms: f64, fault: &FaultWindow) -> bool {
    t_ms >= fault.inject_ms && t_ms - wait_ms <= fault.restore_ms
}

/// The times of the acknowledgements given in a term below one already acknowledged, or in
/// the highest term at an LSN not above the last acknowledged in it.
pub fn double_primary_times(events: &[Event]) -> Vec<f64> {
    let (mut highest, mut highest_lsn) = (0u64, 0u64);
    let mut out = Vec::new();
    for event in events {
        if let Event::Ack {
            term, lsn, t_ms, ..
        } = event
        {
            if *term < highest || (*term == highest && *lsn <= highest_lsn) {
                out.push(*t_ms);
            }
            if *term > highest || (*term == highest && *lsn > highest_lsn) {
                (highest, highest_lsn) = (*term, *lsn);
            }
        }
    }
    out
}

/// How many commits that began at or after `from_ms` were acknowledged by `until_ms` (a
/// commit is one at a time, so one begun after a primary died cannot be its answer).
pub fn begun_and_acked_within(events: &[Event], from_ms: f64, until_ms: f64) -> u64 {
    events
        .iter()
        .filter(|e| {
            matches!(e, Event::Ack { t_ms, wait_ms, .. }
                if t_ms - wait_ms >= from_ms && *t_ms <= until_ms)
        })
        .count() as u64
}

/// The acknowledged records: sequence number to (term, LSN, time).
pub fn acknowledged(events: &[Event]) -> HashMap<u64, (u64, u64, f64)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Ack {
                seq,
                term,
                lsn,
                t_ms,
                ..
            } => Some((*seq, (*term, *lsn, *t_ms))),
            _ => None,
        })
        .collect()
}

/// The commits in doubt that were settled: sequence number to (LSN, outcome).
pub fn resolutions(events: &[Event]) -> HashMap<u64, (u64, Outcome)> {
    let lsns: HashMap<u64, u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::InDoubt { seq, lsn, .. } => Some((*seq, *lsn)),
            _ => None,
        })
        .collect();
    events
        .iter()
        .filter_map(|e| match e {
            Event::Resolved { seq, outcome, .. } => {
                lsns.get(seq).map(|&lsn| (*seq, (lsn, *outcome)))
            }
            _ => None,
        })
        .collect()
}

/// Index of the fault whose period holds `t_ms` (none before the first injection).
pub fn fault_at(faults: &[FaultWindow], t_ms: f64) -> Option<usize> {
    faults.iter().rposition(|f| f.start_ms <= t_ms)
}

/// The `p`-th percentile (0..=100) of `values`, nearest rank; None when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: u64 = 1 << 32 | 1;
    const T2: u64 = 2 << 32 | 1;

    fn ack(seq: u64, term: u64, t_ms: f64, wait_ms: f64) -> Event {
        Event::Ack {
            seq,
            term,
            lsn: seq,
            t_ms,
            wait_ms,
        }
    }

    #[test]
    fn downtime_counts_only_commits_begun_after_the_injection_and_answered_by_a_new_primary() {
        let events = vec![
            ack(1, T1, 100.0, 1.0),
            // In flight at the injection (1000): acknowledged after it, but begun before.
            ack(2, T1, 1000.5, 1.0),
            // Begun after it, but answered by the old primary before the signal took effect.
            ack(21, T1, 1000.8, 0.2),
            Event::InDoubt {
                seq: 3,
                term: T1,
                lsn: 3,
                t_ms: 1200.0,
                wait_ms: 199.0,
                cause: "lost".into(),
            },
            ack(4, T2, 1450.0, 2.0),
            ack(5, T2, 1460.0, 2.0),
        ];
        let faults = [FaultWindow {
            start_ms: 1000.0,
            inject_ms: 1000.0,
            restore_ms: 1400.0,
            expects_failover: true,
            epoch_before: 1,
        }];
        let facts = facts(&events, &faults);
        assert_eq!(facts[0].downtime_ms, Some(450.0));
        assert_eq!((facts[0].acked, facts[0].in_doubt), (4, 1));
        assert_eq!(facts[0].double_primary, 0);
    }

    #[test]
    fn blocked_is_the_longest_wait_overlapping_the_fault_and_no_failover_has_no_downtime() {
        let events = vec![
            ack(1, T1, 900.0, 500.0), // ended before the fault: not counted
            ack(2, T1, 3010.0, 2005.0),
            ack(3, T1, 3020.0, 5.0), // began after the restoration
            ack(4, T1, 5000.0, 1.0),
        ];
        let faults = [
            FaultWindow {
                start_ms: 1000.0,
                inject_ms: 1000.0,
                restore_ms: 3000.0,
                expects_failover: false,
                epoch_before: 1,
            },
            FaultWindow {
                start_ms: 4000.0,
                inject_ms: 4000.0,
                restore_ms: 4100.0,
                expects_failover: false,
                epoch_before: 1,
            },
        ];
        let facts = facts(&events, &faults);
        assert_eq!(facts[0].blocked_ms, 2005.0);
        assert_eq!(facts[0].downtime_ms, Some(0.0));
        assert_eq!((facts[0].acked, facts[1].acked), (2, 1));
        assert_eq!(facts[1].blocked_ms, 0.0);
        // From the injection (1000) to the first acknowledgement (3010); then 4000 - 3020.
        assert_eq!(facts[0].unavailable_ms, 2010.0);
        assert_eq!(facts[1].unavailable_ms, 1000.0);
    }

    #[test]
    fn an_acknowledgement_in_an_older_term_after_a_newer_one_is_a_double_primary() {
        let events = vec![
            ack(1, T1, 10.0, 1.0),
            ack(2, T2, 20.0, 1.0),
            ack(3, T1, 30.0, 1.0),
            ack(4, T2, 40.0, 1.0),
            ack(5, T1, 50.0, 1.0),
        ];
        assert_eq!(double_primary_times(&events), vec![30.0, 50.0]);
        // Begun at 19 (20 - 1) or later and answered by 40: seqs 2, 3 and 4.
        assert_eq!(begun_and_acked_within(&events, 19.0, 40.0), 3);
        assert_eq!(begun_and_acked_within(&events, 19.5, 39.0), 1);
        // Two nodes answering in one term: the LSN goes back.
        let mut same_term = vec![ack(1, T2, 10.0, 1.0), ack(2, T2, 20.0, 1.0)];
        same_term.push(Event::Ack {
            seq: 3,
            term: T2,
            lsn: 2,
            t_ms: 30.0,
            wait_ms: 1.0,
        });
        assert_eq!(double_primary_times(&same_term), vec![30.0]);
        let faults = [
            FaultWindow {
                start_ms: 0.0,
                inject_ms: 0.0,
                restore_ms: 1.0,
                expects_failover: true,
                epoch_before: 1,
            },
            FaultWindow {
                start_ms: 45.0,
                inject_ms: 45.0,
                restore_ms: 46.0,
                expects_failover: true,
                epoch_before: 1,
            },
        ];
        let facts = facts(&events, &faults);
        assert_eq!((facts[0].double_primary, facts[1].double_primary), (1, 1));
        assert_eq!(fault_at(&faults, 44.0), Some(0));
        assert_eq!(fault_at(&faults, -1.0), None);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[3.0, 1.0], 50.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
