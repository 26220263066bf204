//! Commit latencies of a timed run, kept in an HDR histogram (the `hdrhistogram` crate).
//!
//! Why a histogram and not a `Vec` of every latency: a run of a few seconds at a million
//! commits/s would grow a vector by tens of megabytes while it is being timed, and each doubling
//! copies it inside the measured window. A histogram is allocated once per client thread before
//! the run, recording adds one to a slot, and merging threads adds their slots.
//!
//! Invariants:
//! - Every histogram has the same bounds (`LOWEST_NS..=HIGHEST_NS`, `SIGNIFICANT_DIGITS`
//!   digits), so recording never resizes (no allocation in the timed loop) and merging two of
//!   them cannot fail.
//! - Values are nanoseconds; a percentile is reported in microseconds as the middle of the
//!   bucket holding the nearest-rank value (relative error under 0.05 %: sub-microsecond
//!   resolution for the few-microsecond commits of the daemon's `buffered`).

/// The smallest distinguishable latency, in nanoseconds.
const LOWEST_NS: u64 = 1;
/// The largest latency tracked exactly: one hour, the longest run `stela-bench commit` allows.
/// A longer one (a commit stuck for longer than the whole run) is counted as one hour.
const HIGHEST_NS: u64 = 3_600 * 1_000_000_000;
/// Three significant decimal digits: buckets at most 1/2048 of their value wide.
const SIGNIFICANT_DIGITS: u8 = 3;

/// Latencies in nanoseconds.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: hdrhistogram::Histogram<u64>,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram::new()
    }
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: hdrhistogram::Histogram::new_with_bounds(
                LOWEST_NS,
                HIGHEST_NS,
                SIGNIFICANT_DIGITS,
            )
            .expect("constant bounds are valid"),
        }
    }

    /// Counts one latency of `nanos` nanoseconds (above one hour: counted as one hour).
    pub fn record(&mut self, nanos: u64) {
        self.counts.saturating_record(nanos);
    }

    /// Adds every latency counted in `other`.
    pub fn merge(&mut self, other: &Histogram) {
        self.counts
            .add(&other.counts)
            .expect("histograms of equal bounds always add");
    }

    /// Latencies counted.
    pub fn count(&self) -> u64 {
        self.counts.len()
    }

    /// The `p`-th percentile (0..=100) in microseconds, nearest rank; `None` when empty.
    pub fn percentile_us(&self, p: f64) -> Option<f64> {
        if self.counts.is_empty() {
            return None;
        }
        let at_rank = self.counts.value_at_quantile(p / 100.0);
        Some(self.counts.median_equivalent(at_rank) as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_in_microseconds() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        for i in 1..=50u64 {
            a.record(i * 1000);
            b.record((i + 50) * 1000);
        }
        a.merge(&b);
        assert_eq!(a.count(), 100);
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.001;
        for (p, want) in [(1.0, 1.0), (50.0, 50.0), (99.0, 99.0), (100.0, 100.0)] {
            let got = a.percentile_us(p).unwrap();
            assert!(close(got, want), "p{p}: {got} us, want {want}");
        }
        assert_eq!(Histogram::new().percentile_us(50.0), None);
    }

    #[test]
    fn sub_microsecond_resolution_and_saturation() {
        let mut h = Histogram::new();
        h.record(4_600);
        let p50 = h.percentile_us(50.0).unwrap();
        assert!((p50 - 4.6).abs() < 0.005, "{p50}");
        h.record(0);
        assert_eq!(h.percentile_us(1.0), Some(0.0));
        let mut long = Histogram::new();
        long.record(u64::MAX);
        let hour_us = HIGHEST_NS as f64 / 1000.0;
        assert!((long.percentile_us(50.0).unwrap() - hour_us).abs() <= hour_us * 0.001);
    }

    #[test]
    fn a_skewed_distribution_reports_its_tail() {
        // 990 fast commits and 10 slow ones: p50 is fast, p99 is the slowest of the fast, p99.9
        // is slow; a histogram that lost the tail or the rank would fail here.
        let mut h = Histogram::new();
        for _ in 0..990 {
            h.record(5_000);
        }
        for _ in 0..10 {
            h.record(2_000_000);
        }
        for p in [50.0, 99.0] {
            let fast = h.percentile_us(p).unwrap();
            assert!((fast - 5.0).abs() < 0.005, "p{p}: {fast}");
        }
        let slow = h.percentile_us(99.9).unwrap();
        assert!((slow - 2000.0).abs() <= 2.0, "{slow}");
    }
}
