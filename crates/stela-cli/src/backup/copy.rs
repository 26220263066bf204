//! Copying one file of a log, with its CRC32C: the only I/O on file contents in `backup`.
//!
//! Invariants:
//! - **The checksum covers exactly the bytes written.** Each chunk is hashed as it is read and
//!   the same bytes (or, for a chunk of zeros, a hole of its length) are written, so a backup's
//!   manifest describes its own copy, whatever the source did meanwhile.
//! - **A copy is durable before it is named.** Every file is fdatasync'ed; the caller syncs the
//!   directory before it writes the manifest that names the file.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// How much is read at a time: bounds memory whatever the segment size.
const CHUNK: usize = 1 << 20;

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
/// is the length to copy: the source's length when it was opened.
pub fn copy_file(source: &File, bytes: u64, target: &Path) -> std::io::Result<Copied> {
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(target)?;
    let mut buffer = vec![0u8; CHUNK];
    let (mut crc, mut at, mut written) = (0u32, 0u64, 0u64);
    while at < bytes {
        let want = CHUNK.min((bytes - at) as usize);
        let chunk = &mut buffer[..want];
        source.read_exact_at(chunk, at)?;
        crc = crc32c::crc32c_append(crc, chunk);
        if chunk.iter().any(|&b| b != 0) {
            out.write_all_at(chunk, at)?;
            written += want as u64;
        }
        at += want as u64;
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
        let copied = copy_file(&File::open(&source).unwrap(), bytes.len() as u64, &target).unwrap();
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
}
