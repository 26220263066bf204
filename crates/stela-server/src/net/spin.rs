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
//! Neither kind of spinning happens while the machine is crowded ([`Crowding`]: more runnable
//! threads than CPUs): then the CPU a spin holds is one a runnable thread waits for. The one
//! exception is a standby's acknowledgement owed ([`spins_for_standby`]): a `replicated`
//! committer waits for exactly that answer, and sleeping through it costs the acknowledgement
//! thread's wake-up and the loop's on top of the round trip. Measured with three nodes on this
//! project's 2-vCPU machine, one committer (`stela-bench replicated --nodes 3 --clients 1`, two
//! rounds taking turns, this rule behind a switch in one build): p50 169.3 / 128.1 us sleeping
//! when crowded, 98.6 / 67.0 us polling (bench/results/replicated.txt). The poll is bounded by
//! `--spin-us` per wait, as before; `stela run` and the mount (no standby) are not affected.
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

/// How often [`Crowding`] reads the number of runnable threads.
const CROWDING_EVERY: Duration = Duration::from_millis(10);

/// Whether the machine has more runnable threads than CPUs, read from `/proc/loadavg` at most
/// every [`CROWDING_EVERY`]. While it has, the loop does not spin at all (nor while answers are
/// owed): a spinning loop, realtime at that, holds a CPU that a runnable thread, often the very
/// client whose next request the loop waits for, would use. Measured on this project's 2-vCPU
/// machine under PostgreSQL with 8 clients on `stela run` at `buffered` (load about 12): the
/// spinning loop took about 0.8 of a CPU and PostgreSQL's commits waited behind it (see
/// bench/results/pgbench.txt). Where `/proc/loadavg` cannot be read, the machine counts as
/// uncrowded (the policy alone decides, as before).
#[derive(Debug)]
pub(crate) struct Crowding {
    file: Option<std::fs::File>,
    cpus: u32,
    checked: Option<std::time::Instant>,
    crowded: bool,
}

impl Crowding {
    pub(crate) fn new() -> Crowding {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        Crowding {
            file: std::fs::File::open("/proc/loadavg").ok(),
            cpus,
            checked: None,
            crowded: false,
        }
    }

    /// Whether more threads are runnable than there are CPUs, as of the last reading (taken
    /// now if the last is [`CROWDING_EVERY`] old).
    pub(crate) fn crowded(&mut self, now: std::time::Instant) -> bool {
        if self
            .checked
            .is_some_and(|at| now.duration_since(at) < CROWDING_EVERY)
        {
            return self.crowded;
        }
        self.checked = Some(now);
        let Some(file) = &self.file else {
            return false;
        };
        let mut text = [0u8; 128];
        let read = std::os::unix::fs::FileExt::read_at(file, &mut text, 0);
        self.crowded = read
            .ok()
            .and_then(|n| runnable_in_loadavg(&text[..n]))
            .is_some_and(|runnable| crowded(runnable, self.cpus));
        self.crowded
    }
}

/// The number of runnable threads in `/proc/loadavg`'s text (its fourth field, `running/total`;
/// the reader counts itself).
fn runnable_in_loadavg(text: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(text).ok()?;
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// More runnable threads than CPUs: spinning would take a CPU some thread is waiting for.
fn crowded(runnable: u32, cpus: u32) -> bool {
    runnable > cpus
}

/// Whether the loop polls for a standby's acknowledgement, crowded or not: one is owed (a
/// `replicated` commit waits for it) and the loop has been quiet for less than the spin limit
/// `spin` (zero: never).
pub(crate) fn spins_for_standby(standby_owed: bool, quiet: Duration, spin: Duration) -> bool {
    standby_owed && quiet < spin
}

fn duration_ns(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_micros(50);

    #[test]
    fn a_standby_acknowledgement_owed_is_polled_for_up_to_the_limit_only() {
        assert!(spins_for_standby(true, Duration::from_micros(10), MAX));
        assert!(!spins_for_standby(true, MAX, MAX), "past the limit: sleep");
        assert!(
            !spins_for_standby(false, Duration::ZERO, MAX),
            "nothing owed"
        );
        assert!(
            !spins_for_standby(true, Duration::ZERO, Duration::ZERO),
            "--spin-us 0"
        );
    }

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
    fn the_machine_is_crowded_when_more_threads_run_than_cpus() {
        assert_eq!(
            runnable_in_loadavg(b"11.03 12.41 11.62 13/1042 27311\n"),
            Some(13)
        );
        assert_eq!(runnable_in_loadavg(b"0.00 0.01 0.05 1/120 4000"), Some(1));
        assert_eq!(runnable_in_loadavg(b"garbage"), None);
        assert!(crowded(3, 2), "the loop and two other threads on 2 CPUs");
        assert!(!crowded(2, 2));
        assert!(!crowded(1, 4));
        let mut crowding = Crowding::new();
        let now = std::time::Instant::now();
        let first = crowding.crowded(now);
        assert_eq!(
            crowding.crowded(now),
            first,
            "read again within the interval"
        );
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
