//! The live dirty-byte cap: keeps the cap one the disk can flush in its share of the power
//! budget while the daemon runs, from the flushes it sees (observations in, cap out; no I/O,
//! no clock of its own).
//!
//! The start-up cap ([`crate::measure`]) is the most the cap may be. Each completed flush (its
//! bytes, and the time its write and fdatasync took) is judged against the *target*: the share
//! of the budget (half the power window) that a cap's worth may take, as at start
//! ([`crate::measure::RATE_SAFETY`]). The flush predicts how long a cap's worth would take now:
//! its own time, scaled to the cap when it wrote at least [`JUDGED_SHARE`] of it (a smaller
//! flush is mostly the sync's fixed cost, and scaling it up would overstate the cap's time), or
//! just its own time when it was smaller (if even that is over the target, so is the cap).
//!
//! Invariants (asserted): `floor <= cap <= max`; a prediction over the target shrinks the cap
//! at once, to what the observed rate flushes in the target; a cap grows only after a flush
//! within the target, by at most [`GROWTH_PER_S`] of itself per second since the last growth or
//! shrink, never above `max`.

use std::sync::Mutex;
use std::time::{Duration, Instant};
use stela_proto::LiveDirtyCap;

/// A flush of at least this share of the cap is scaled up to predict the cap's flush time.
pub const JUDGED_SHARE: f64 = 0.25;

/// How fast a shrunk cap grows back: this share of itself per second of good flushes.
pub const GROWTH_PER_S: f64 = 0.05;

/// The longest gap between good flushes that counts towards growth (an idle daemon does not
/// earn a large step from one flush after an hour).
const MAX_GROWTH_GAP: Duration = Duration::from_secs(1);

/// Why the cap is what it is now.
#[derive(Clone, Debug, PartialEq)]
pub enum Reason {
    /// The start-up cap, never lowered (or grown back all the way).
    StartUp,
    /// Lowered after a flush of `bytes` took `elapsed`, predicting `predicted` for the cap.
    Shrunk {
        bytes: u64,
        elapsed: Duration,
        predicted: Duration,
    },
    /// Growing back after a shrink, on flushes within the target.
    Growing,
}

/// What one observation did to the cap.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub from: u64,
    pub to: u64,
}

/// The state machine of the live cap.
#[derive(Clone, Debug)]
pub struct Governor {
    max: u64,
    floor: u64,
    target: Duration,
    cap: u64,
    reason: Reason,
    last_step: Option<Instant>,
}

impl Governor {
    /// Starts at `max` (the start-up cap). The cap never falls below `floor` (capped at `max`),
    /// and a cap's worth should flush within `target`.
    pub fn new(max: u64, floor: u64, target: Duration) -> Governor {
        assert!(max > 0 && !target.is_zero());
        Governor {
            max,
            floor: floor.clamp(1, max),
            target,
            cap: max,
            reason: Reason::StartUp,
            last_step: None,
        }
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    pub fn reason(&self) -> &Reason {
        &self.reason
    }

    /// One sentence on the cap now, for `stela status` and the log.
    pub fn describe(&self) -> String {
        let target_ms = self.target.as_secs_f64() * 1e3;
        match &self.reason {
            Reason::StartUp => format!("{} B: the start-up cap, flushes within {target_ms:.1} ms", self.cap),
            Reason::Shrunk { bytes, elapsed, predicted } => format!(
                "{} B of at most {} B: shrunk after a flush of {bytes} B took {:.1} ms (a cap's worth {:.1} ms, over the {target_ms:.1} ms target)",
                self.cap,
                self.max,
                elapsed.as_secs_f64() * 1e3,
                predicted.as_secs_f64() * 1e3,
            ),
            Reason::Growing => format!(
                "{} B of at most {} B: growing back {:.0} % a second on flushes within {target_ms:.1} ms",
                self.cap,
                self.max,
                GROWTH_PER_S * 100.0
            ),
        }
    }

    /// How long a cap's worth would take to flush, judged from a flush of `bytes` in `elapsed`.
    fn predict(&self, bytes: u64, elapsed: Duration) -> Duration {
        if bytes as f64 >= self.cap as f64 * JUDGED_SHARE {
            // Linear in the bytes, also down: a flush larger than a just-shrunk cap must not
            // shrink it again by its whole time.
            elapsed.mul_f64(self.cap as f64 / bytes as f64)
        } else {
            elapsed
        }
    }

    /// Takes a completed flush of `bytes` whose write and fdatasync took `elapsed`, seen at
    /// `now`. Returns the change it made, if any.
    pub fn observe(&mut self, bytes: u64, elapsed: Duration, now: Instant) -> Option<Change> {
        let from = self.cap;
        let predicted = self.predict(bytes, elapsed);
        if predicted > self.target {
            // What the observed rate flushes in the target, at once.
            let fits = self.cap as f64 * self.target.as_secs_f64() / predicted.as_secs_f64();
            self.cap = (fits as u64).clamp(self.floor, self.max);
            self.reason = Reason::Shrunk {
                bytes,
                elapsed,
                predicted,
            };
            self.last_step = Some(now);
        } else if self.cap < self.max {
            let gap = self
                .last_step
                .map_or(MAX_GROWTH_GAP, |at| now.saturating_duration_since(at))
                .min(MAX_GROWTH_GAP);
            let step = (self.cap as f64 * GROWTH_PER_S * gap.as_secs_f64()) as u64;
            self.cap = (self.cap + step).min(self.max);
            self.reason = if self.cap == self.max {
                Reason::StartUp
            } else {
                Reason::Growing
            };
            self.last_step = Some(now);
        }
        debug_assert!(self.floor <= self.cap && self.cap <= self.max);
        (self.cap != from).then_some(Change { from, to: self.cap })
    }
}

/// The smallest live cap: below it the sync's fixed cost dominates anyway.
pub const FLOOR_BYTES: u64 = 64 << 10;

/// At most one line per this interval about the cap's changes.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// The shell around [`Governor`]: the clock, the lock the flushers share, and the log.
pub struct Keeper {
    state: Mutex<KeeperState>,
}

struct KeeperState {
    governor: Governor,
    changes: u64,
    logged_at: Option<Instant>,
    unlogged: u64,
}

impl Keeper {
    pub fn new(governor: Governor) -> Keeper {
        Keeper {
            state: Mutex::new(KeeperState {
                governor,
                changes: 0,
                logged_at: None,
                unlogged: 0,
            }),
        }
    }

    /// Takes a completed flush; returns the new cap when it changed.
    pub fn observe(&self, bytes: u64, elapsed: Duration) -> Option<u64> {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let change = state.governor.observe(bytes, elapsed, now)?;
        state.changes += 1;
        state.unlogged += 1;
        if state.logged_at.is_none_or(|at| now - at >= LOG_EVERY) {
            let (cap, unlogged) = (state.governor.describe(), state.unlogged);
            if change.to < change.from {
                tracing::warn!(
                    from = change.from,
                    to = change.to,
                    changes = unlogged,
                    "dirty-byte cap: {cap}"
                );
            } else {
                tracing::info!(
                    from = change.from,
                    to = change.to,
                    changes = unlogged,
                    "dirty-byte cap: {cap}"
                );
            }
            state.logged_at = Some(now);
            state.unlogged = 0;
        }
        Some(change.to)
    }

    /// The cap now, for `stela status`.
    pub fn status(&self) -> LiveDirtyCap {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        LiveDirtyCap {
            bytes: state.governor.cap(),
            reason: state.governor.describe(),
            changes: state.changes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_slow_large_flush_shrinks_the_cap_at_once_to_what_fits() {
        let mut g = Governor::new(10_000_000, 100_000, 12 * MS);
        let now = Instant::now();
        // Half the cap in 12 ms: the cap would take 24 ms, twice the target.
        let change = g.observe(5_000_000, 12 * MS, now).unwrap();
        assert_eq!(change.to, 5_000_000);
        assert!(matches!(g.reason(), Reason::Shrunk { .. }));
    }

    #[test]
    fn a_small_flush_is_not_scaled_up_but_counts_when_itself_too_slow() {
        let mut g = Governor::new(10_000_000, 100_000, 12 * MS);
        let now = Instant::now();
        // 4 KiB in 5 ms (sync cost): no change.
        assert_eq!(g.observe(4096, 5 * MS, now), None);
        // A 4 KiB flush that takes 24 ms: the device stalls, the cap halves.
        assert_eq!(g.observe(4096, 24 * MS, now).unwrap().to, 5_000_000);
    }

    #[test]
    fn the_cap_grows_back_slowly_and_never_above_the_maximum() {
        let mut g = Governor::new(10_000_000, 100_000, 12 * MS);
        let start = Instant::now();
        g.observe(10_000_000, 24 * MS, start);
        assert_eq!(g.cap(), 5_000_000);
        // One good flush a second later: 5 % more.
        g.observe(4096, MS, start + Duration::from_secs(1));
        assert_eq!(g.cap(), 5_250_000);
        assert_eq!(g.reason(), &Reason::Growing);
        // Many good flushes a millisecond apart grow it by 5 % a second (compounded), not per flush.
        for i in 1..=1000u64 {
            g.observe(4096, MS, start + Duration::from_secs(1) + MS * i as u32);
        }
        assert!(g.cap() <= 5_250_000 * 1052 / 1000, "{}", g.cap());
        for s in 2..200u64 {
            g.observe(4096, MS, start + Duration::from_secs(s));
        }
        assert_eq!(g.cap(), 10_000_000);
        assert_eq!(g.reason(), &Reason::StartUp);
    }

    #[test]
    fn a_flush_larger_than_a_shrunk_cap_is_judged_at_its_rate() {
        let mut g = Governor::new(10_000_000, 100_000, 12 * MS);
        let now = Instant::now();
        g.observe(10_000_000, 120 * MS, now);
        assert_eq!(g.cap(), 1_000_000);
        // The buffers still held 4 MB: written at 200 MB/s, the cap's 1 MB takes 5 ms.
        assert_eq!(g.observe(4_000_000, 20 * MS, now), None);
        assert_eq!(g.cap(), 1_000_000);
    }

    #[test]
    fn the_floor_holds_under_a_stalled_disk() {
        let mut g = Governor::new(10_000_000, 100_000, 12 * MS);
        g.observe(4096, Duration::from_secs(5), Instant::now());
        assert_eq!(g.cap(), 100_000);
    }

    proptest! {
        #[test]
        fn the_cap_stays_in_bounds_shrinks_on_every_slow_flush_and_grows_slowly(
            flushes in proptest::collection::vec((1u64..20_000_000, 1u64..100_000, 0u64..2_000), 1..200),
        ) {
            let mut g = Governor::new(10_000_000, 100_000, 12 * MS);
            let mut now = Instant::now();
            for (bytes, micros, gap_ms) in flushes {
                now += MS * gap_ms as u32;
                let before = g.cap();
                let elapsed = Duration::from_micros(micros);
                let predicted = g.predict(bytes, elapsed);
                g.observe(bytes, elapsed, now);
                prop_assert!(g.cap() >= 100_000 && g.cap() <= 10_000_000);
                if predicted > 12 * MS {
                    prop_assert!(g.cap() <= before);
                    // What the cap now holds flushes within the target at the observed rate.
                    let at_rate = predicted.as_secs_f64() * g.cap() as f64 / before as f64;
                    prop_assert!(g.cap() == 100_000 || at_rate <= 0.012 + 1e-9);
                } else {
                    let most = before as f64 * (1.0 + GROWTH_PER_S * gap_ms.min(1000) as f64 / 1e3);
                    prop_assert!(g.cap() >= before && g.cap() as f64 <= most + 1.0);
                }
            }
        }
    }
}
