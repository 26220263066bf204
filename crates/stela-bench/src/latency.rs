//! A fixed-size log-linear latency histogram (HDR-like, < 0.8 % relative error).
//!
//! Why not a `Vec` of every latency: a run of a few seconds at a million commits/s would grow a
//! vector by tens of megabytes while it is being timed, and each doubling copies it inside the
//! measured window. A histogram is allocated once per thread before the run and recording is an
//! add to an array slot; merging threads is adding arrays.

/// Values below this are counted exactly; above, each power of two is split into this many
/// buckets (so a bucket is at most 1/128 of its value wide).
const SUB_BUCKETS: u64 = 128;
const SUB_BITS: u32 = 7;
/// 128 exact buckets plus 128 per power of two from 2^7 to 2^63.
const BUCKETS: usize = (SUB_BUCKETS + (64 - SUB_BITS as u64) * SUB_BUCKETS) as usize;

/// Latencies in nanoseconds.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    total: u64,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("total", &self.total)
            .finish_non_exhaustive()
    }
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram::new()
    }
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            total: 0,
        }
    }

    fn index(value: u64) -> usize {
        if value < SUB_BUCKETS {
            return value as usize;
        }
        let shift = (63 - value.leading_zeros()) - SUB_BITS;
        let mantissa = value >> shift; // in SUB_BUCKETS..2 * SUB_BUCKETS
        (SUB_BUCKETS + u64::from(shift) * SUB_BUCKETS + (mantissa - SUB_BUCKETS)) as usize
    }

    /// The middle of the bucket at `index`: what a value counted there is reported as.
    fn value_at(index: usize) -> u64 {
        let index = index as u64;
        if index < SUB_BUCKETS {
            return index;
        }
        let shift = (index - SUB_BUCKETS) / SUB_BUCKETS;
        let mantissa = SUB_BUCKETS + (index - SUB_BUCKETS) % SUB_BUCKETS;
        (mantissa << shift) + ((1u64 << shift) >> 1)
    }

    pub fn record(&mut self, nanos: u64) {
        self.counts[Self::index(nanos)] += 1;
        self.total += 1;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += theirs;
        }
        self.total += other.total;
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `p`-th percentile (0..=100) in microseconds, nearest rank (as
    /// [`crate::harness::WriteOutcome::percentile_us`]); `None` when empty.
    pub fn percentile_us(&self, p: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((p / 100.0) * self.total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(Self::value_at(index) as f64 / 1000.0);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_trip_within_one_percent() {
        for value in (0..2000).chain([10_000, 123_456, 9_876_543, 1 << 40, u64::MAX]) {
            let index = Histogram::index(value);
            assert!(index < BUCKETS, "{value}");
            let back = Histogram::value_at(index);
            let error = back.abs_diff(value) as f64 / value.max(1) as f64;
            assert!(error < 0.008, "{value} -> {back}");
        }
    }

    #[test]
    fn percentiles_and_merge() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        for i in 1..=50u64 {
            a.record(i * 1000);
            b.record((i + 50) * 1000);
        }
        a.merge(&b);
        assert_eq!(a.count(), 100);
        let p50 = a.percentile_us(50.0).unwrap();
        let p99 = a.percentile_us(99.0).unwrap();
        assert!((p50 - 50.0).abs() < 0.5, "{p50}");
        assert!((p99 - 99.0).abs() < 1.0, "{p99}");
        assert_eq!(Histogram::new().percentile_us(50.0), None);
    }
}
