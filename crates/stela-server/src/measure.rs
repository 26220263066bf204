//! The dirty-byte cap: how much acknowledged data the daemon may hold so that, told power is
//! failing, it can write and sync all of it within half the power supply's hold-up window.
//!
//! At start the daemon flushes as many bytes as its pool holds (4 to 64 MiB) through a scratch
//! log's segment writer in its directory, the way a flusher does, and takes bytes / elapsed as
//! the disk's rate. The elapsed time includes one sync, as the emergency flush does. Half the window, not all of it: the other half is margin
//! for the notice's own latency. And only half of that half is filled with data
//! ([`RATE_SAFETY`]): the flush takes two write + sync rounds (the run the flusher already holds,
//! then the rest), and on a shared or virtual disk the rate swings by a factor of two between
//! the measurement and the emergency.
//!
//! The cap that rate gives is then checked by flushing the cap itself ([`fit_cap`]): a flush
//! smaller than the measuring one pays the same sync and overhead for fewer bytes, so while a
//! cap's worth takes longer than its share of the budget, the cap is lowered and timed again.
//! `--assume-write-rate` skips all of this (an explicit override), and so does too little free
//! space to measure. While running, [`crate::cap`] keeps the cap honest from real flushes.
//!
//! A start must not need spare space (a daemon restarted after its disk filled up, or on a small
//! volume): the measuring flush takes at most a quarter of the free space, its scratch segment
//! is no larger than the flush, and each measured rate is recorded in the directory
//! ([`RATE_FILE`]). When there is too little room to measure, or the measurement runs out of
//! space, the recorded rate of an earlier start is used, else [`FALLBACK_WRITE_RATE`]; the cap's
//! derivation says which.

use crate::config::DaemonConfig;
use crate::error::StartError;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_format::frame;
use stela_proto::DirtyCap;
use stela_wal::files::LogFiles;
use stela_wal::storage::Storage;
use stela_wal::{Codec, Lsn, WalOptions};

/// Bytes each measuring flush writes unless the pool asks for another size: the largest dirty
/// set the default pool can hold is 3 MiB, and rates measured on much smaller writes than the
/// real flush overstate it (the disk here keeps ~1 GB/s for a few MiB, ~400 MB/s at 12 MiB).
pub const MEASURE_BYTES: usize = 16 << 20;

/// The measuring flush for a pool of `pool_bytes`: as large as the largest possible flush,
/// within 4..=64 MiB.
pub fn measure_bytes_for(pool_bytes: u64) -> usize {
    (pool_bytes as usize).clamp(4 << 20, 64 << 20)
}

/// Measures the rate at which the flush path writes and syncs in `dir`, in bytes per second:
/// a scratch log's files take `bytes` of framed 4 KiB records, handed to the segment writer in
/// buffer-sized runs and fdatasync'ed once, exactly as a flusher writes a full pool. Plain large
/// writes of one file measured 5-10x faster here than the flush path really flushes, which would
/// let the cap promise what the flush cannot keep.
///
/// The rate of one such flush swings several-fold from run to run on a shared or virtual disk,
/// so this takes [`MEASURE_ROUNDS`] of them and keeps the slowest: the cap must hold on a bad
/// moment, not an average one.
pub fn measure_write_rate(storage: &Arc<dyn Storage>, dir: &Path) -> std::io::Result<u64> {
    measure_write_rate_with(storage, dir, MEASURE_BYTES)
}

/// [`measure_write_rate`] with flushes of `bytes` each.
pub fn measure_write_rate_with(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    bytes: usize,
) -> std::io::Result<u64> {
    let mut slowest = u64::MAX;
    for _ in 0..MEASURE_ROUNDS {
        let (framed, elapsed) = measure_once(storage, dir, bytes)?;
        slowest = slowest.min((framed as f64 / elapsed.as_secs_f64().max(1e-9)) as u64);
    }
    Ok(slowest)
}

/// Flushes measured at start; the slowest sets the rate.
pub const MEASURE_ROUNDS: usize = 3;

/// Bytes per run handed to the writer: the default buffer size.
const RUN_BYTES: usize = crate::config::BUFFER_BYTES;

/// Where a measured rate is kept for the next start: one line, bytes per second.
pub const RATE_FILE: &str = "measured-write-rate";

/// The smallest measuring flush worth timing; with less free space than four times this, the
/// recorded rate is used instead.
pub const MIN_MEASURE_BYTES: usize = 256 << 10;

/// The rate assumed when there is neither room to measure nor a recorded rate: a slow disk's,
/// so that the cap errs small (10 MB/s fills half of a 50 ms window x 0.5 with 125 kB).
pub const FALLBACK_WRITE_RATE: u64 = 10_000_000;

/// Where the start-up rate came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateSource {
    Measured,
    Assumed,
    Recorded,
    Fallback,
}

impl RateSource {
    pub fn describe(self) -> &'static str {
        match self {
            RateSource::Measured => "measured now",
            RateSource::Assumed => "assumed (--assume-write-rate)",
            RateSource::Recorded => {
                "recorded by an earlier start (too little free space to measure)"
            }
            RateSource::Fallback => {
                "a slow disk's, assumed (too little free space to measure and no recorded rate)"
            }
        }
    }
}

/// Bytes free for this process on the file system of `dir`, if the OS says.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(dir).ok()?;
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// The start-up rate for a pool of `pool_bytes` in `dir`: measured with what space there is,
/// else recorded, else the fallback. A measured rate is recorded for the next start (best
/// effort: a full disk keeps the old record).
pub fn start_up_rate(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    pool_bytes: u64,
) -> std::io::Result<(u64, RateSource)> {
    let wanted = measure_bytes_for(pool_bytes);
    let room = free_bytes(dir).map_or(wanted, |free| (free / 4) as usize);
    let bytes = wanted.min(room);
    if bytes >= MIN_MEASURE_BYTES {
        match measure_write_rate_with(storage, dir, bytes) {
            Ok(rate) => {
                if let Err(error) = record_rate(dir, rate) {
                    tracing::warn!(%error, "could not record the measured write rate");
                }
                return Ok((rate, RateSource::Measured));
            }
            Err(error)
                if stela_wal::storage::is_out_of_space(&error) || is_wrapped_full(&error) =>
            {
                tracing::warn!(%error, "no room to measure the disk's write rate");
            }
            Err(error) => return Err(error),
        }
    }
    Ok(match recorded_rate(dir) {
        Some(rate) => (rate, RateSource::Recorded),
        None => (FALLBACK_WRITE_RATE, RateSource::Fallback),
    })
}

/// The measuring path turns the log's errors into `io::Error::other(text)`: a full disk is
/// then only recognisable by its text.
fn is_wrapped_full(error: &std::io::Error) -> bool {
    let text = error.to_string();
    text.contains("no space left") || text.contains("No space left")
}

/// The rate an earlier start measured in `dir`, if one was recorded and reads back.
pub fn recorded_rate(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(RATE_FILE)).ok()?;
    text.split_whitespace()
        .next()?
        .parse()
        .ok()
        .filter(|&r| r > 0)
}

/// Records `rate` durably: a temporary file written and synced, renamed over the record, the
/// directory synced.
fn record_rate(dir: &Path, rate: u64) -> std::io::Result<()> {
    use std::io::Write;
    let temp = dir.join(format!("{RATE_FILE}.tmp"));
    let mut file = private_file(&temp)?;
    writeln!(file, "{rate} bytes/s, measured by stela serve at start")?;
    file.sync_all()?;
    std::fs::rename(&temp, dir.join(RATE_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

/// A new file (truncated if it exists) only its owner may read, like the logs' files.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(stela_wal::storage::FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// One measuring flush of `bytes`: the bytes framed and the time their write and fdatasync took.
fn measure_once(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    bytes: usize,
) -> std::io::Result<(usize, Duration)> {
    let scratch = dir.join(format!(".stela-measure-{}", std::process::id()));
    remove_scratch(storage, &scratch);
    // The scratch segment holds the flush and no more: a start must not need spare space.
    let options = WalOptions::default()
        .codec(Codec::MessagePack)
        .storage(Arc::clone(storage))
        .segment_bytes(bytes as u64 + (64 << 10));
    let to_io = |e: stela_wal::Error| std::io::Error::other(e.to_string());
    let result = (|| {
        // The segment exists before the clock starts, as it does for a running log: creating
        // and preallocating it is not part of an emergency flush.
        let files = LogFiles::open(&scratch, options, "stela-measure").map_err(to_io)?;
        let mut writer = files.writer;
        let payload = vec![0x5au8; 4096];
        let crc = crc32c::crc32c(&payload);
        let mut runs: Vec<Vec<u8>> = Vec::new();
        let mut lsn = files.next_lsn.get();
        let mut framed = 0;
        while framed < bytes {
            let mut run = Vec::with_capacity(RUN_BYTES);
            while run.len() + frame::HEADER_BYTES + payload.len() <= RUN_BYTES && framed < bytes {
                let before = run.len();
                frame::encode_with_crc(
                    &mut run,
                    Lsn::new(lsn),
                    &payload,
                    crc,
                    files.durable_offset as u32,
                );
                framed += run.len() - before;
                lsn += 1;
            }
            runs.push(run);
        }
        let started = Instant::now();
        let mut offset = files.write_offset;
        for run in &runs {
            writer.write_at(offset, &[run.as_slice()]).map_err(to_io)?;
            offset += run.len() as u64;
        }
        writer.sync().map_err(to_io)?;
        let elapsed = started.elapsed();
        drop(writer);
        drop(files.segments);
        Ok((framed, elapsed))
    })();
    remove_scratch(storage, &scratch);
    result
}

fn remove_scratch(storage: &Arc<dyn Storage>, scratch: &Path) {
    if let Ok(names) = storage.list(scratch) {
        for name in names {
            let _ = storage.remove(&scratch.join(name));
        }
    }
    // The storage trait has no directory removal; on a real disk the empty folder goes too.
    let _ = std::fs::remove_dir(scratch);
}

/// The share of the budget the cap fills with data, at the measured rate.
pub const RATE_SAFETY: f64 = 0.5;

/// The daemon's dirty-byte cap (see [`dirty_cap`]): the disk's write rate (measured at start,
/// or assumed when the configuration says so) and the pool's size under the power window.
pub fn cap_for(config: &DaemonConfig) -> Result<DirtyCap, StartError> {
    let pool_bytes = (config.buffers * config.buffer_bytes) as u64;
    let (rate, source) = match config.assume_write_rate {
        Some(rate) => (rate, RateSource::Assumed),
        None => start_up_rate(&config.storage, &config.dir, pool_bytes).map_err(|source| {
            StartError::Measure {
                path: config.dir.clone(),
                source,
            }
        })?,
    };
    let mut cap = dirty_cap(pool_bytes, rate, config.power_window);
    cap.derivation = format!("{}; disk rate {}", cap.derivation, source.describe());
    // The cap is timed at its own size where there is room for such a flush (as for the rate:
    // a quarter of the free space); a start never fails for want of it, the live cap
    // (`crate::cap`) corrects the cap from the first real flushes anyway.
    let room = free_bytes(&config.dir).is_none_or(|free| free / 4 >= cap.bytes);
    if source == RateSource::Measured && room {
        let target = (config.power_window / 2).mul_f64(RATE_SAFETY);
        match fit_cap(cap.bytes, target, |bytes| {
            slowest_flush(&config.storage, &config.dir, bytes)
        }) {
            Ok(fitted) => {
                cap.derivation =
                    format!("{}; {}", cap.derivation, fitted.describe(cap.bytes, target));
                cap.bytes = fitted.bytes;
            }
            Err(error) => {
                tracing::warn!(%error, "the dirty-byte cap could not be timed at its own size; kept as the rate gives it");
                cap.derivation = format!("{}; not timed at its own size ({error})", cap.derivation);
            }
        }
    } else if source == RateSource::Measured {
        cap.derivation = format!(
            "{}; not timed at its own size (too little free space)",
            cap.derivation
        );
    }
    tracing::info!(derivation = %cap.derivation, "dirty-byte cap");
    Ok(cap)
}

/// The slowest of [`MEASURE_ROUNDS`] flushes of `bytes` (write and fdatasync).
fn slowest_flush(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    bytes: usize,
) -> std::io::Result<Duration> {
    let mut slowest = Duration::ZERO;
    for _ in 0..MEASURE_ROUNDS {
        slowest = slowest.max(measure_once(storage, dir, bytes)?.1);
    }
    Ok(slowest)
}

/// The smallest cap [`fit_cap`] tries: below it the sync's fixed cost dominates.
pub const MIN_FITTED_BYTES: u64 = 64 << 10;

/// Tries of [`fit_cap`] before it settles.
pub const FIT_TRIES: usize = 4;

/// A cap whose own flush was timed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fitted {
    pub bytes: u64,
    /// The slowest flush of `bytes` (write and fdatasync).
    pub took: Duration,
    pub tries: usize,
}

impl Fitted {
    fn describe(&self, rated: u64, target: Duration) -> String {
        format!(
            "a flush of the cap's {} B (write + fdatasync, slowest of {MEASURE_ROUNDS}) took {:.1} ms against a target of {:.1} ms{}",
            self.bytes,
            self.took.as_secs_f64() * 1e3,
            target.as_secs_f64() * 1e3,
            if self.bytes < rated {
                format!(", so the cap was lowered from {rated} B in {} tries", self.tries)
            } else {
                String::new()
            }
        )
    }
}

/// Sizes the cap by timing flushes of the cap's own size (`flush(bytes)` writes and syncs that
/// many bytes and says how long it took): starting at `start`, while a flush of the cap takes
/// longer than `target`, the cap becomes what that flush's rate writes in `target` (less a tenth
/// for the swing between runs), at most [`FIT_TRIES`] times and never below
/// [`MIN_FITTED_BYTES`]. A rate measured on a large flush overstates a smaller one, whose sync
/// costs as much; only the cap's own flush says whether it fits.
pub fn fit_cap(
    start: u64,
    target: Duration,
    mut flush: impl FnMut(usize) -> std::io::Result<Duration>,
) -> std::io::Result<Fitted> {
    let mut bytes = start;
    let mut tries = 0;
    loop {
        let took = flush(bytes as usize)?;
        tries += 1;
        if took <= target || tries == FIT_TRIES || bytes <= MIN_FITTED_BYTES {
            return Ok(Fitted { bytes, took, tries });
        }
        let fits = bytes as f64 * target.as_secs_f64() / took.as_secs_f64() * 0.9;
        bytes = (fits as u64).max(MIN_FITTED_BYTES).min(bytes - 1);
    }
}

/// The cap: min(pool size, rate x window / 2 x [`RATE_SAFETY`]).
pub fn dirty_cap(pool_bytes: u64, write_bytes_per_s: u64, power_window: Duration) -> DirtyCap {
    let budget = power_window / 2;
    let window_bytes = (write_bytes_per_s as f64 * budget.as_secs_f64() * RATE_SAFETY) as u64;
    let bytes = pool_bytes.min(window_bytes);
    let limited_by = if bytes == pool_bytes {
        "the buffers"
    } else {
        "the power window"
    };
    DirtyCap {
        bytes,
        power_window_ms: power_window.as_millis() as u64,
        measured_write_bytes_per_s: write_bytes_per_s,
        window_bytes,
        pool_bytes,
        derivation: format!(
            "cap = min(buffers {pool_bytes} B, disk {:.1} MB/s x half of the {} ms window x safety {RATE_SAFETY} = {window_bytes} B) \
             = {bytes} B, limited by {limited_by}",
            write_bytes_per_s as f64 / 1e6,
            power_window.as_millis()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A disk whose flush costs a fixed 4 ms sync plus 1 ms per MB.
    fn disk(bytes: usize) -> std::io::Result<Duration> {
        Ok(4 * MS + Duration::from_secs_f64(bytes as f64 / 1e9))
    }

    #[test]
    fn a_cap_that_flushes_in_its_target_is_kept() {
        let fitted = fit_cap(2_000_000, 12 * MS, disk).unwrap();
        assert_eq!((fitted.bytes, fitted.tries), (2_000_000, 1));
    }

    #[test]
    fn a_cap_whose_own_flush_overruns_is_lowered_until_it_fits() {
        // The rate of a large flush (~1 GB/s) promised 12 MB in 12 ms; with the sync's fixed
        // cost the cap's own flush takes 16 ms.
        let fitted = fit_cap(12_000_000, 12 * MS, disk).unwrap();
        assert!(
            fitted.bytes < 12_000_000 && fitted.took <= 12 * MS,
            "{fitted:?}"
        );
        assert_eq!(disk(fitted.bytes as usize).unwrap(), fitted.took);
    }

    #[test]
    fn the_fit_stops_at_the_floor_and_after_its_tries() {
        let stalled = |_| Ok(Duration::from_secs(1));
        let fitted = fit_cap(12_000_000, 12 * MS, stalled).unwrap();
        assert!(fitted.tries <= FIT_TRIES);
        assert!(fit_cap(MIN_FITTED_BYTES, 12 * MS, stalled).unwrap().tries == 1);
    }
}
