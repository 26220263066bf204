//! What passes between the failover client (`stela-bench failover-client`, in the client's
//! namespace) and the run that reads it: the records it commits, one JSON line per event on its
//! standard output, and the clock both sides stamp events with.
//!
//! The clock is `CLOCK_MONOTONIC`, which every process of the machine shares (the run creates no
//! time namespace), so a fault injected by the run and an acknowledgement seen by the client are
//! on one time line, and a wall-clock step (NTP) cannot bend a downtime.

use serde::{Deserialize, Serialize};

/// The log the client writes to.
pub const LOG: &str = "failover";
/// The record type tag of that log (checked by the daemon at open and by the reader after).
pub const TYPE_TAG: &str = "stela_bench::failover::Rec";

/// A record: its unique sequence number (never reused, also not after a failed append) and
/// filler bytes derived from it, so a reader can tell a record from garbage or a misplaced one.
pub type Rec = (u64, String);

/// The record with sequence number `seq` and `bytes` filler bytes.
pub fn record(seq: u64, bytes: usize) -> Rec {
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let filler = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    (seq, filler)
}

/// Whether `rec` is the record its sequence number says (at whatever length it was sent).
pub fn genuine(rec: &Rec) -> bool {
    *rec == record(rec.0, rec.1.len())
}

/// Milliseconds on `CLOCK_MONOTONIC` (see the module documentation).
pub fn mono_ms() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

/// One line of the client's output.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The client opened the log on a node, which serves it in `term`.
    Opened { t_ms: f64, term: u64 },
    /// A `replicated` commit was acknowledged: `seq` is at `lsn`, appended in `term`; the
    /// commit waited `wait_ms` (its append excluded).
    Ack {
        seq: u64,
        term: u64,
        lsn: u64,
        t_ms: f64,
        wait_ms: f64,
    },
    /// The commit of `seq` (appended at `lsn` in `term`) lost its primary: its outcome is
    /// unknown until resolved.
    InDoubt {
        seq: u64,
        term: u64,
        lsn: u64,
        t_ms: f64,
        wait_ms: f64,
        cause: String,
    },
    /// A `replicated` commit of `seq` (at `lsn` in `term`) was answered `Unprotected`: the
    /// primary held it without a standby. Written once per commit, at the first such answer;
    /// the client asks again until the commit is acknowledged or in doubt.
    Unprotected {
        seq: u64,
        term: u64,
        lsn: u64,
        t_ms: f64,
    },
    /// A commit in doubt, settled against the (new) primary's history.
    Resolved {
        seq: u64,
        outcome: Outcome,
        t_ms: f64,
    },
    /// A call failed before anything was in doubt (an open or an append); the client reopens.
    Failed {
        t_ms: f64,
        during: String,
        error: String,
    },
}

impl Event {
    pub fn t_ms(&self) -> f64 {
        match self {
            Event::Opened { t_ms, .. }
            | Event::Ack { t_ms, .. }
            | Event::InDoubt { t_ms, .. }
            | Event::Unprotected { t_ms, .. }
            | Event::Resolved { t_ms, .. }
            | Event::Failed { t_ms, .. } => *t_ms,
        }
    }
}

/// How a commit in doubt ended.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The record is in the new primary's log at its LSN.
    Kept,
    /// It is not, and never will be.
    Lost,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_recognised_and_events_round_trip() {
        let rec = record(42, 100);
        assert_eq!(rec.1.len(), 100);
        assert!(genuine(&rec));
        assert!(!genuine(&(43, rec.1.clone())));
        let event = Event::Ack {
            seq: 1,
            term: 1 << 32 | 1,
            lsn: 7,
            t_ms: 12.5,
            wait_ms: 0.25,
        };
        let line = serde_json::to_string(&event).unwrap();
        assert!(line.starts_with(r#"{"event":"ack","seq":1,"#), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), event);
        let resolved = r#"{"event":"resolved","seq":3,"outcome":"kept","t_ms":1.0}"#;
        assert!(matches!(
            serde_json::from_str::<Event>(resolved).unwrap(),
            Event::Resolved {
                outcome: Outcome::Kept,
                ..
            }
        ));
        let (a, b) = (mono_ms(), mono_ms());
        assert!(b >= a && a > 0.0);
    }
}
