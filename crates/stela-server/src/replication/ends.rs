//! Why replication sessions ended, kept for `stela status` and the metrics: each log's last
//! end (its kind, its message, when) and a count of ends by kind since start
//! ([`SessionEnd::kind`]). A primary keeps one per standby, a standby one for its listener.
//!
//! Invariants:
//! - **Bounded.** At most [`MAX_LOGS`] logs' last ends are kept (the oldest end is forgotten
//!   first), and only for streams whose peer proved itself: a refusal at a standby's door, where
//!   the log's name is the unauthenticated peer's word, is counted and nothing more.
//! - **Counts only grow** while the daemon runs (they are the metric's counter).
//! - **A leaf lock**: nothing else is locked under it (`stela status` takes it under a link's
//!   state; the shipper records an end holding no lock).

use super::SessionEnd;
use crate::sync::lock;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

/// Most logs whose last end is kept.
const MAX_LOGS: usize = 4096;

/// Every kind [`SessionEnd::kind`] names, so that each is shown (at zero) from the start.
const KINDS: [&str; 8] = [
    "link", "tls", "protocol", "refused", "rejected", "fenced", "storage", "stopped",
];

/// The ends of one side's sessions (see the module's top).
#[derive(Default)]
pub(crate) struct SessionEnds {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Each log's last end, when it came and its place in the order of ends.
    last: HashMap<String, (SessionEnd, Instant, u64)>,
    counts: BTreeMap<&'static str, u64>,
    ended: u64,
}

impl SessionEnds {
    /// A session of `log` ended with `end`.
    pub(crate) fn record(&self, log: &str, end: &SessionEnd) {
        let mut state = lock(&self.state);
        *state.counts.entry(end.kind()).or_default() += 1;
        if state.last.len() >= MAX_LOGS && !state.last.contains_key(log) {
            let oldest = state
                .last
                .iter()
                .min_by_key(|(_, (_, _, order))| *order)
                .map(|(log, _)| log.clone());
            if let Some(oldest) = oldest {
                state.last.remove(&oldest);
            }
        }
        state.ended += 1;
        let order = state.ended;
        let last = (end.clone(), Instant::now(), order);
        state.last.insert(log.to_owned(), last);
        debug_assert!(state.last.len() <= MAX_LOGS);
    }

    /// A session ended before its peer proved itself: counted, its log not kept.
    pub(crate) fn count(&self, end: &SessionEnd) {
        *lock(&self.state).counts.entry(end.kind()).or_default() += 1;
    }

    /// How `log`'s last session ended, if one did.
    pub(crate) fn last(&self, log: &str) -> Option<stela_proto::SessionEndReport> {
        let state = lock(&self.state);
        state.last.get(log).map(|(end, at, _)| report(end, *at))
    }

    /// Every log with a last end, and how it ended.
    pub(crate) fn all_last(&self) -> Vec<(String, stela_proto::SessionEndReport)> {
        let state = lock(&self.state);
        let reports = state.last.iter();
        reports
            .map(|(log, (end, at, _))| (log.clone(), report(end, *at)))
            .collect()
    }

    /// Ends by kind since start, every kind listed.
    pub(crate) fn counts(&self) -> BTreeMap<String, u64> {
        let state = lock(&self.state);
        let kinds = KINDS.iter().map(|kind| {
            let count = state.counts.get(kind).copied().unwrap_or(0);
            ((*kind).to_owned(), count)
        });
        kinds.collect()
    }
}

fn report(end: &SessionEnd, at: Instant) -> stela_proto::SessionEndReport {
    stela_proto::SessionEndReport {
        kind: end.kind().to_owned(),
        message: end.to_string(),
        ago_ms: at.elapsed().as_millis() as u64,
    }
}

/// Adds `more` counts by kind to `total` (a primary's standbys, summed).
pub(crate) fn add_counts(total: &mut BTreeMap<String, u64>, more: &BTreeMap<String, u64>) {
    for (kind, count) in more {
        *total.entry(kind.clone()).or_default() += count;
    }
}

#[cfg(test)]
mod tests {
    use super::{SessionEnds, KINDS, MAX_LOGS};
    use crate::replication::SessionEnd;

    #[test]
    fn every_kind_is_listed_and_each_end_counted_once() {
        let ends = SessionEnds::default();
        ends.record("a", &SessionEnd::Link("reset".into()));
        ends.record("a", &SessionEnd::Fenced("stale term 2".into()));
        ends.count(&SessionEnd::Rejected("not an administrator".into()));
        let counts = ends.counts();
        assert_eq!(counts.len(), KINDS.len());
        assert_eq!((counts["link"], counts["fenced"]), (1, 1));
        assert_eq!((counts["rejected"], counts["tls"]), (1, 0));
        let last = ends.last("a").expect("a's last end");
        assert_eq!(
            (last.kind.as_str(), last.message.as_str()),
            ("fenced", "stale term 2")
        );
        assert_eq!(ends.all_last().len(), 1, "a counted refusal keeps no log");
    }

    #[test]
    fn the_logs_kept_are_bounded_and_the_oldest_goes_first() {
        let ends = SessionEnds::default();
        for i in 0..MAX_LOGS + 10 {
            ends.record(&format!("log{i}"), &SessionEnd::Link("reset".into()));
        }
        assert_eq!(ends.all_last().len(), MAX_LOGS);
        assert!(ends.last("log0").is_none());
        assert!(ends.last(&format!("log{}", MAX_LOGS + 9)).is_some());
        assert_eq!(ends.counts()["link"], (MAX_LOGS + 10) as u64);
    }
}
