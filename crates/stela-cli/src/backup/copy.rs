//! Copying one file of a log, with its CRC32C: the only I/O on file contents in `backup`.
//!
//! Invariants:
//! - **The checksum covers exactly the bytes written.** Each chunk is hashed as it is read and
//!   the same bytes (or, for a chunk of zeros, a hole of its length) are written, so a backup's
//!   manifest describes its own copy, whatever the source did meanwhile.
//! - **A copy is durable before it is named.** Every file is fdatasync'ed; the caller syncs the
//!   directory before it writes the manifest that names the file.
//! - **A paced backup never runs ahead of its rate** ([`Pace`], `--max-rate`): after each chunk
//!   the bytes read since the backup began are at most the rate times the time it has run
//!   (plus that one chunk), and what it wrote is synced every [`PACED_SYNC`] bytes, so the
//!   daemon's disk meets the copy as a steady stream rather than a burst of a whole segment's
//!   writeback at each file's end.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// How much is read at a time: bounds memory whatever the segment size.
pub const CHUNK: usize = 1 << 20;
/// With a rate limit, written bytes are synced at least this often.
const PACED_SYNC: u64 = 8 << 20;

/// The pace of a backup's reads: unlimited, or at most `rate` bytes per second on average
/// since the backup began.
#[derive(Debug)]
pub struct Pace {
    rate: Option<u64>,
    started: Instant,
    read: u64,
}

impl Pace {
    /// A pace of at most `rate` bytes per second (`None` or 0: as fast as the disk goes).
    pub fn new(rate: Option<u64>) -> Pace {
        Pace {
            rate: rate.filter(|&r| r > 0),
            started: Instant::now(),
            read: 0,
        }
    }

    fn limited(&self) -> bool {
        self.rate.is_some()
    }

    /// Counts `bytes` just read, and sleeps until the backup is no longer ahead of its rate.
    fn took(&mut self, bytes: u64) {
        self.read += bytes;
        let Some(rate) = self.rate else {
            return;
        };
        let due = Duration::from_secs_f64(self.read as f64 / rate as f64);
        let ran = self.started.elapsed();
        if due > ran {
            std::thread::sleep(due - ran);
        }
        debug_assert!(
            self.started.elapsed().as_secs_f64() * rate as f64 >= self.read as f64 * 0.999
        );
    }
}

/// What [`copy_file`] copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copied {
    /// The file's length.
    pub bytes: u64,
    /// CRC32C of every byte.
    pub crc32c: u32,
    /// Bytes that were not zeros, so were written (the rest is a hole).
    pub written: u64,
}

/// Copies `source` (already open: a segment removed meanwhile is still read whole) to a new
/// file at `target` (mode 0600), sparse where the source reads as zeros, and syncs it. `bytes`
/// is the length to copy: the source's length when it was opened. Reads go at `pace`.
pub fn copy_file(
    source: &File,
    bytes: u64,
    target: &Path,
    pace: &mut Pace,
) -> std::io::Result<Copied> {
    copy_from(
        &mut |chunk, at| source.read_exact_at(chunk, at),
        bytes,
        target,
        pace,
    )
}

/// Copies `bytes` bytes that `read_exact_at` fills chunk by chunk (a local file, or a daemon
/// over the network) to a new file at `target`, as [`copy_file`] does.
pub fn copy_from(
    read_exact_at: &mut dyn FnMut(&mut [u8], u64) -> std::io::Result<()>,
    bytes: u64,
    target: &Path,
    pace: &mut Pace,
) -> std::io::Result<Copied> {
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(target)?;
    let mut buffer = vec![0u8; CHUNK];
    let (mut crc, mut at, mut written, mut unsynced) = (0u32, 0u64, 0u64, 0u64);
    while at < bytes {
        let want = CHUNK.min((bytes - at) as usize);
        let chunk = &mut buffer[..want];
        read_exact_at(chunk, at)?;
        crc = crc32c::crc32c_append(crc, chunk);
        if chunk.iter().any(|&b| b != 0) {
            out.write_all_at(chunk, at)?;
            written += want as u64;
            unsynced += want as u64;
        }
        if pace.limited() && unsynced >= PACED_SYNC {
            out.sync_data()?;
            unsynced = 0;
        }
        at += want as u64;
        pace.took(want as u64);
    }
    out.set_len(bytes)?;
    out.sync_all()?;
    Ok(Copied {
        bytes,
        crc32c: crc,
        written,
    })
}

/// The CRC32C and length of the file at `path`, read in chunks.
pub fn checksum(path: &Path) -> std::io::Result<(u64, u32)> {
    let mut file = File::open(path)?;
    let mut buffer = vec![0u8; CHUNK];
    let (mut crc, mut bytes) = (0u32, 0u64);
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buffer[..read]);
        bytes += read as u64;
    }
    Ok((bytes, crc))
}

/// Syncs the directory at `dir`, so the names created in it survive a crash.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` (and its parents) owner-only, as the daemon's own directories are.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_has_the_sources_bytes_and_checksum_and_holes_for_its_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("source");
        let mut bytes = vec![0u8; 3 * CHUNK + 17];
        bytes[5] = 1;
        bytes[3 * CHUNK + 3] = 9;
        std::fs::write(&source, &bytes).unwrap();
        let target = dir.path().join("target");
        let mut pace = Pace::new(None);
        let copied = copy_file(
            &File::open(&source).unwrap(),
            bytes.len() as u64,
            &target,
            &mut pace,
        )
        .unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), bytes);
        assert_eq!(copied.crc32c, crc32c::crc32c(&bytes));
        assert_eq!(
            copied.written,
            (CHUNK + 17) as u64,
            "two chunks of zeros left as holes"
        );
        assert_eq!(
            checksum(&target).unwrap(),
            (bytes.len() as u64, copied.crc32c)
        );
    }

    #[test]
    fn a_paced_copy_takes_at_least_its_bytes_over_the_rate() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("source");
        let bytes = vec![3u8; 4 * CHUNK];
        std::fs::write(&source, &bytes).unwrap();
        // 4 MiB at 16 MiB/s: at least 250 ms (a lower bound, which a slow machine cannot
        // break); unpaced it takes a few milliseconds.
        let mut pace = Pace::new(Some(16 << 20));
        let started = Instant::now();
        let copied = copy_file(
            &File::open(&source).unwrap(),
            bytes.len() as u64,
            &dir.path().join("target"),
            &mut pace,
        )
        .unwrap();
        assert_eq!(copied.crc32c, crc32c::crc32c(&bytes));
        assert!(
            started.elapsed() >= Duration::from_millis(249),
            "{:?}",
            started.elapsed()
        );
    }
}
