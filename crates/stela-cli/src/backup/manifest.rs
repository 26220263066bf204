//! The backup's `MANIFEST`: what `stela backup` copied, file by file, and what the copy must
//! hold. Pure: text in, [`Manifest`] out, no I/O.
//!
//! The file is the manifest as JSON followed by one line `crc32c XXXXXXXX`, the CRC32C of every
//! byte before that line, as PostgreSQL's `backup_manifest` ends in its own checksum. So a
//! manifest cut short, edited or bit-flipped is refused as a whole before any of its numbers is
//! believed.
//!
//! Invariants (checked by [`Manifest::decode`]):
//! - every log has a plain name and lists each file once, by a plain name;
//! - a log's copy ends at or after the LSN it must hold (`last_lsn >= required_lsn`).

use serde::{Deserialize, Serialize};

/// What the first line of every backup manifest says it is.
pub const FORMAT: &str = "stela-backup";
/// The manifest layout this build writes and reads.
pub const VERSION: u32 = 1;
/// The manifest's file name in a backup directory.
pub const FILE_NAME: &str = "MANIFEST";

/// A whole backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u32,
    /// When the backup began (RFC 3339, UTC).
    pub began: String,
    /// When the copy was complete and verified (RFC 3339, UTC).
    pub finished: String,
    /// The daemon's directory it was taken from.
    pub source: String,
    pub logs: Vec<LogCopy>,
}

/// One log's copy: `logs/NAME/` in the backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogCopy {
    pub name: String,
    /// The LSN every record at or below which was durable (acknowledged at `disk` or synced)
    /// when the backup began: the copy holds all of them. 0: the log had no records.
    pub required_lsn: u64,
    /// The first and last LSN of the copy's valid records (0 and 0: none).
    pub first_lsn: u64,
    pub last_lsn: u64,
    pub files: Vec<FileCopy>,
}

/// One file of a log's copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCopy {
    pub name: String,
    /// Its length (a segment's preallocated capacity: the copy is sparse where it is zeros).
    pub bytes: u64,
    /// CRC32C of its every byte.
    pub crc32c: u32,
}

/// Why a manifest's text is not a manifest this build can trust.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    #[error("it does not end in its checksum line (cut short?)")]
    NoChecksum,
    #[error("its checksum is {found:08x}, its bytes give {computed:08x} (damaged or edited)")]
    ChecksumMismatch { found: u32, computed: u32 },
    #[error("not a manifest: {0}")]
    Malformed(String),
    #[error("format {format:?} version {version}: this build reads {FORMAT:?} version {VERSION}")]
    Unsupported { format: String, version: u32 },
    #[error("log {log:?}: {why}")]
    BadLog { log: String, why: String },
}

impl Manifest {
    /// The manifest's file contents: JSON, then the checksum line.
    pub fn encode(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a manifest is plain data");
        text.push('\n');
        let crc = crc32c::crc32c(text.as_bytes());
        text.push_str(&format!("crc32c {crc:08x}\n"));
        text
    }

    /// Reads a manifest's file contents, refusing any that fails its checksum or its invariants.
    ///
    /// # Errors
    /// [`ManifestError`] naming what is wrong.
    pub fn decode(text: &str) -> Result<Manifest, ManifestError> {
        let lines = text.strip_suffix('\n').ok_or(ManifestError::NoChecksum)?;
        let body_end = lines
            .rfind('\n')
            .map(|at| at + 1)
            .ok_or(ManifestError::NoChecksum)?;
        let (body, last) = text.split_at(body_end);
        let found = last
            .strip_suffix('\n')
            .and_then(|line| line.strip_prefix("crc32c "))
            .filter(|hex| {
                hex.len() == 8 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            })
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .ok_or(ManifestError::NoChecksum)?;
        let computed = crc32c::crc32c(body.as_bytes());
        if found != computed {
            return Err(ManifestError::ChecksumMismatch { found, computed });
        }
        let manifest: Manifest =
            serde_json::from_str(body).map_err(|e| ManifestError::Malformed(e.to_string()))?;
        manifest.check()?;
        Ok(manifest)
    }

    fn check(&self) -> Result<(), ManifestError> {
        if self.format != FORMAT || self.version != VERSION {
            return Err(ManifestError::Unsupported {
                format: self.format.clone(),
                version: self.version,
            });
        }
        let mut names = std::collections::BTreeSet::new();
        for log in &self.logs {
            let bad = |why: &str| ManifestError::BadLog {
                log: log.name.clone(),
                why: why.to_owned(),
            };
            if !plain_name(&log.name) || !names.insert(log.name.as_str()) {
                return Err(bad("not a plain name, or listed twice"));
            }
            let mut files = std::collections::BTreeSet::new();
            if !log
                .files
                .iter()
                .all(|f| plain_name(&f.name) && files.insert(&f.name))
            {
                return Err(bad("a file name that is not plain, or listed twice"));
            }
            if log.last_lsn < log.required_lsn {
                return Err(bad("its copy ends before the LSN it must hold"));
            }
        }
        Ok(())
    }
}

/// A name that stays inside its directory: no separator, not `.` or `..`, not empty.
pub fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format: FORMAT.to_owned(),
            version: VERSION,
            began: "2026-12-07T16:00:00Z".to_owned(),
            finished: "2026-12-07T16:00:02Z".to_owned(),
            source: "/var/lib/stela".to_owned(),
            logs: vec![LogCopy {
                name: "orders".to_owned(),
                required_lsn: 40,
                first_lsn: 1,
                last_lsn: 42,
                files: vec![FileCopy {
                    name: "00000000000000000001.wal".to_owned(),
                    bytes: 4096,
                    crc32c: 0xdead_beef,
                }],
            }],
        }
    }

    #[test]
    fn a_manifest_reads_back_as_written() {
        let manifest = sample();
        assert_eq!(Manifest::decode(&manifest.encode()), Ok(manifest));
    }

    #[test]
    fn every_changed_byte_of_a_manifest_is_refused() {
        let text = sample().encode();
        for at in 0..text.len() {
            let mut bytes = text.clone().into_bytes();
            bytes[at] ^= 0x01;
            let Ok(damaged) = String::from_utf8(bytes) else {
                continue;
            };
            assert!(
                Manifest::decode(&damaged).is_err(),
                "byte {at} flipped was accepted"
            );
        }
    }

    #[test]
    fn a_manifest_cut_short_is_refused() {
        let text = sample().encode();
        for end in 0..text.len() - 1 {
            assert!(
                Manifest::decode(&text[..end]).is_err(),
                "cut at {end} was accepted"
            );
        }
    }

    #[test]
    fn a_name_leaving_the_directory_or_a_copy_short_of_its_lsn_is_refused() {
        let mut escaping = sample();
        escaping.logs[0].name = "../etc".to_owned();
        assert!(matches!(
            Manifest::decode(&escaping.encode()),
            Err(ManifestError::BadLog { .. })
        ));
        let mut file = sample();
        file.logs[0].files[0].name = "a/b".to_owned();
        assert!(matches!(
            Manifest::decode(&file.encode()),
            Err(ManifestError::BadLog { .. })
        ));
        let mut short = sample();
        short.logs[0].last_lsn = 39;
        assert!(matches!(
            Manifest::decode(&short.encode()),
            Err(ManifestError::BadLog { .. })
        ));
    }
}
