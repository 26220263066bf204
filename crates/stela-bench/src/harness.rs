//! What every system's adapter shares: running N writer threads over the sets, timing them,
//! what a write or read run reports, and the folder a run's log lives in.

use crate::record::Record;
use anyhow::Context;
use indicatif::ProgressBar;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::Instant;

/// Outcome of writing every set once.
#[derive(Clone, Debug)]
pub struct WriteOutcome {
    /// Wall clock from the moment all writer threads are released to the moment the last one
    /// has its last set durable (opening the log is not included).
    pub seconds: f64,
    /// Latency of every durable write (encode + append + commit of one set), in nanoseconds,
    /// sorted ascending.
    pub latencies_ns: Vec<u64>,
}

impl WriteOutcome {
    /// The `p`-th percentile (0..=100) latency in microseconds, nearest rank.
    pub fn percentile_us(&self, p: f64) -> Option<f64> {
        let n = self.latencies_ns.len();
        if n == 0 {
            return None;
        }
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        let index = rank.clamp(1, n) - 1;
        Some(self.latencies_ns[index] as f64 / 1000.0)
    }
}

/// Outcome of reopening a log and reading every record back.
#[derive(Clone, Debug, Default)]
pub struct ReadOutcome {
    /// Open (recovery) plus reading and decoding every record.
    pub seconds: f64,
    pub records: u64,
    /// Sum of the ids of the records read: with the count, a cheap check that every record came
    /// back whole and exactly once.
    pub id_sum: u64,
}

impl ReadOutcome {
    pub fn add(&mut self, record: &Record) {
        self.records += 1;
        self.id_sum += u64::from(record.id);
    }
}

/// Runs `writers` threads; thread `t` writes a contiguous share of `sets` by calling
/// `write_set(t, set_index, set)` for each, which must return once the set is durable (or, with
/// sync none, handed to the OS). Set indexes are global, so adapters can derive unique keys.
pub fn run_writers<F>(
    sets: &[&[Record]],
    writers: usize,
    progress: &ProgressBar,
    write_set: F,
) -> anyhow::Result<WriteOutcome>
where
    F: Fn(usize, usize, &[Record]) -> anyhow::Result<()> + Sync,
{
    let writers = writers.max(1);
    let share = sets.len().div_ceil(writers).max(1);
    let barrier = Barrier::new(writers + 1);
    let write_set = &write_set;
    let barrier = &barrier;
    let (seconds, results) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..writers)
            .map(|t| {
                let range = (t * share).min(sets.len())..((t + 1) * share).min(sets.len());
                scope.spawn(move || -> anyhow::Result<Vec<u64>> {
                    let mut latencies = Vec::with_capacity(range.len());
                    barrier.wait();
                    let mut unreported = 0u64;
                    for i in range {
                        let started = Instant::now();
                        write_set(t, i, sets[i])?;
                        latencies.push(started.elapsed().as_nanos() as u64);
                        unreported += 1;
                        if unreported == 64 {
                            progress.inc(unreported);
                            unreported = 0;
                        }
                    }
                    progress.inc(unreported);
                    Ok(latencies)
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        (started.elapsed().as_secs_f64(), results)
    });
    let mut latencies_ns = Vec::with_capacity(sets.len());
    for result in results {
        match result {
            Ok(Ok(latencies)) => latencies_ns.extend(latencies),
            Ok(Err(error)) => return Err(error),
            Err(_) => anyhow::bail!("a writer thread panicked"),
        }
    }
    latencies_ns.sort_unstable();
    Ok(WriteOutcome {
        seconds,
        latencies_ns,
    })
}

/// A scratch folder removed when dropped: inside `dir` (created if need be), else in the
/// current directory, whose disk is the one measured (not a tmpfs `/tmp`).
pub fn scratch_dir(dir: Option<&Path>) -> anyhow::Result<tempfile::TempDir> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            Ok(tempfile::tempdir_in(dir)?)
        }
        None => {
            tempfile::tempdir_in(".").context("creating a scratch folder in the current directory")
        }
    }
}

/// Where one run's log lives: a kept folder under `--dir` (which must be new or empty), or a
/// temporary one removed when dropped. Shared by `stela-bench wal` and `stela-bench commit`.
pub enum RunDir {
    Kept(PathBuf),
    Temp(tempfile::TempDir),
}

impl RunDir {
    pub fn new(base: Option<&Path>, name: &str) -> anyhow::Result<RunDir> {
        let Some(base) = base else {
            return Ok(RunDir::Temp(
                tempfile::Builder::new()
                    .prefix(&format!("{name}-"))
                    .tempdir()
                    .context("create a temporary directory")?,
            ));
        };
        let path = base.join(name);
        // A run appends to the log it finds; measuring on top of an old log would not be a
        // fresh run, so refuse instead.
        if path.exists() {
            let empty = std::fs::read_dir(&path)
                .with_context(|| format!("{}", path.display()))?
                .next()
                .is_none();
            anyhow::ensure!(
                empty,
                "{} already holds a log; remove it or choose another --dir",
                path.display()
            );
        }
        std::fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        Ok(RunDir::Kept(path))
    }

    pub fn path(&self) -> &Path {
        match self {
            RunDir::Kept(path) => path,
            RunDir::Temp(dir) => dir.path(),
        }
    }
}

/// Writes a secret (a key, a token file) the daemon accepts: mode 0600, its owner's alone (the
/// daemon refuses a credential others may read).
pub fn write_secret(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let outcome = WriteOutcome {
            seconds: 1.0,
            latencies_ns: (1..=100).map(|i| i * 1000).collect(),
        };
        assert_eq!(outcome.percentile_us(50.0), Some(50.0));
        assert_eq!(outcome.percentile_us(99.0), Some(99.0));
        assert_eq!(outcome.percentile_us(100.0), Some(100.0));
        let empty = WriteOutcome {
            seconds: 0.0,
            latencies_ns: vec![],
        };
        assert_eq!(empty.percentile_us(50.0), None);
    }

    #[test]
    fn every_set_written_once_across_threads() {
        let records = crate::record::make_records(103, 1);
        let sets: Vec<&[Record]> = records.chunks(2).collect();
        let seen = std::sync::Mutex::new(vec![0u32; sets.len()]);
        let outcome = run_writers(&sets, 4, &ProgressBar::hidden(), |_, i, _| {
            seen.lock().unwrap()[i] += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(outcome.latencies_ns.len(), sets.len());
        assert!(seen.into_inner().unwrap().iter().all(|&n| n == 1));
    }
}
