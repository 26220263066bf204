//! Whether the event loop spins, when nothing is owed, before it sleeps.
//!
//! After a turn with work the loop may keep polling for up to `--spin-us` instead of sleeping,
//! so that a client's next request is taken without the client ringing the doorbell and the
//! loop being woken. That pays when requests follow each other closely (a committer that spins
//! for its answer and commits again within a microsecond), and wastes a CPU when they do not: a
//! database on `stela mount` sends a request every hundred microseconds or so, and the realtime
//! loop then spun for 50 us after each one, on a machine where that CPU was the database's.
//!
//! [`SpinPolicy`] decides from the gaps the loop has seen between the end of one busy turn and
//! the next work, which it measures whether it spun through the gap or slept through it (a
//! slept gap less the wake-up, which spinning would not have had). A gap within the spin limit
//! is one spinning catches: it saves a sleep, its wake-up and the client's doorbell
//! ([`WAKE_COST`]). One more than twice the limit spinning missed: it wasted the whole limit of
//! CPU and the sleep followed anyway. A running average of what spinning saved over the recent
//! gaps decides: spin while it is positive, that is while fewer than about a quarter of the
//! counted gaps (15 / (15 + 50) at the defaults) were missed. Like the kernel's halt polling,
//! which grows and shrinks its poll by whether the wake-up came within it.
//!
//! Measured (every gap counted by a debugging build, on this project's 2-vCPU machine): under
//! PostgreSQL on `stela mount` (pgbench, 8 clients) 11 % of the daemon's gaps were under 50 us
//! and 68 % over 100 us; under 64 `buffered` committers 95 % were under 50 us and 1 % over
//! 100 us (bench/results/pgbench-mount-path.txt).
//!
//! Only speculative spinning adapts: while answers are owed (commits waiting for a standby's
//! acknowledgement or for the disk) the loop keeps polling as before, since the answer will
//! come and must be published at once.
//!
//! Invariant: the budget is either zero or the configured limit, and a zero limit (`--spin-us
//! 0`) is never raised.

use std::time::Duration;

/// What a sleep costs the loop and its client, as measured on this project's 2-vCPU machine:
/// the client's doorbell write (~10 us) and the loop's wake-up from its poll (~5 us).
pub(crate) const WAKE_COST: Duration = Duration::from_micros(15);

/// A gap longer than the limit this many times over is one spinning missed.
const MISSED_BY: u32 = 2;

/// Weight of the newest gap in the running average, as a shift: 1/8.
const AVERAGE_SHIFT: u32 = 3;

/// The event loop's choice between spinning and sleeping once a turn found no work.
#[derive(Debug)]
pub(crate) struct SpinPolicy {
    max: Duration,
    /// Running average, in nanoseconds, of what spinning saved (positive) or wasted (negative)
    /// over the recent gaps.
    saving_ns: i64,
}

impl SpinPolicy {
    /// A policy that spins at most `max`; it starts by spinning, the daemon's behaviour before
    /// it has seen a gap.
    pub(crate) fn new(max: Duration) -> SpinPolicy {
        SpinPolicy {
            max,
            saving_ns: duration_ns(WAKE_COST),
        }
    }

    /// How long to spin after the last work, nothing being owed.
    pub(crate) fn budget(&self) -> Duration {
        if self.saving_ns > 0 {
            self.max
        } else {
            Duration::ZERO
        }
    }

    /// Records a gap: the time from the end of the last turn with work to the next work.
    /// `slept`: the loop slept through it, so the gap includes the loop's wake-up, which
    /// spinning would not have had; [`WAKE_COST`] of it is not counted.
    pub(crate) fn gap(&mut self, gap: Duration, slept: bool) {
        if self.max.is_zero() {
            return;
        }
        let gap = if slept {
            gap.saturating_sub(WAKE_COST)
        } else {
            gap
        };
        let saved = if gap <= self.max {
            duration_ns(WAKE_COST)
        } else if gap > self.max * MISSED_BY {
            -duration_ns(self.max)
        } else {
            // Just past the limit: a client descheduled for a moment, most often. Counting it
            // as a miss stopped the spin under 64 busy clients (2 % of their gaps), whose next
            // gap was short again; it counts neither way.
            return;
        };
        self.saving_ns += (saved - self.saving_ns) >> AVERAGE_SHIFT;
    }
}

fn duration_ns(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_micros(50);

    #[test]
    fn requests_that_follow_closely_keep_the_loop_spinning() {
        let mut policy = SpinPolicy::new(MAX);
        assert_eq!(policy.budget(), MAX, "spins before it has seen a gap");
        for _ in 0..1000 {
            policy.gap(Duration::from_micros(1), false);
        }
        assert_eq!(policy.budget(), MAX);
    }

    #[test]
    fn gaps_longer_than_the_spin_stop_it_and_short_ones_bring_it_back() {
        let mut policy = SpinPolicy::new(MAX);
        let mut gaps = 0;
        while policy.budget() == MAX {
            policy.gap(Duration::from_micros(150), false);
            gaps += 1;
            assert!(gaps < 10, "still spinning after {gaps} gaps of 150 us");
        }
        // One short gap among long ones changes nothing.
        policy.gap(Duration::from_micros(1), false);
        policy.gap(Duration::from_micros(150), false);
        assert_eq!(policy.budget(), Duration::ZERO);
        let mut gaps = 0;
        while policy.budget() == Duration::ZERO {
            policy.gap(Duration::from_micros(1), false);
            gaps += 1;
            assert!(gaps < 40, "still sleeping after {gaps} gaps of 1 us");
        }
    }

    #[test]
    fn it_spins_while_fewer_than_a_quarter_of_the_gaps_outlast_the_limit() {
        let run = |long_every: usize| {
            let mut policy = SpinPolicy::new(MAX);
            for i in 0..400 {
                let gap = if i % long_every == 0 { 150 } else { 40 };
                policy.gap(Duration::from_micros(gap), false);
            }
            policy.budget()
        };
        assert_eq!(run(8), MAX, "one gap in 8 too long: spinning still pays");
        assert_eq!(run(2), Duration::ZERO, "one gap in 2 too long: it does not");
    }

    #[test]
    fn a_slept_gap_is_counted_without_the_wake_up() {
        let mut policy = SpinPolicy::new(MAX);
        for _ in 0..100 {
            policy.gap(MAX + WAKE_COST, true);
        }
        assert_eq!(policy.budget(), MAX);
    }

    #[test]
    fn gaps_just_past_the_limit_count_neither_way() {
        let mut policy = SpinPolicy::new(MAX);
        for _ in 0..100 {
            policy.gap(MAX + Duration::from_micros(10), false);
        }
        assert_eq!(policy.budget(), MAX, "near misses stopped the spin");
        for _ in 0..100 {
            policy.gap(MAX * 3, false);
        }
        for _ in 0..100 {
            policy.gap(MAX + Duration::from_micros(10), false);
        }
        assert_eq!(policy.budget(), Duration::ZERO, "near misses restarted it");
    }

    #[test]
    fn a_zero_limit_never_spins() {
        let mut policy = SpinPolicy::new(Duration::ZERO);
        for _ in 0..100 {
            policy.gap(Duration::from_nanos(100), false);
        }
        assert_eq!(policy.budget(), Duration::ZERO);
    }
}
