//! The daemon's side of a backup over the network (`stela backup --from`): a hold on a log and
//! the list of its files (`BackupLog`), then the files' bytes in bounded chunks
//! (`ReadLogFile`). The client decides the order, checks and writes the copy; the daemon only
//! keeps the segments and serves their bytes as they are on its disk, so the copy verified and
//! restored is the same bytes a local backup would have read.
//!
//! Both requests are administrative (`net::auth::administrative`): they read every log and
//! change what a truncation may remove. Both run on a worker, off the event loop.
//!
//! Invariants:
//! - **Only plain files inside the log's directory are read.** The log's name is checked as
//!   every log name is, the file's name is one path component (no separator, not `.` or `..`,
//!   no NUL), and the file must be a regular file, not a directory or a link.
//! - **Bounded answers.** A chunk is at most what the connection may be answered at once (the
//!   caller's clamp, at most 1 MiB); its buffer lives only while the answer is built.
//! - **The hold comes before the listing**, so every segment listed is kept from then on
//!   (except one a truncation that had read the holds before this one was recorded removes:
//!   the client finds it `gone` and treats it as truncated before the backup).
//! - **A hold's name cannot pass for a standby's**: the daemon prefixes it with `backup: `,
//!   and refuses control characters (the hold file is line-based).

use super::Engine;
use crate::error::{Error, Result};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use stela_proto::{LogFile, Payload, ResponseBody};
use stela_wal::storage::StdStorage;
use stela_wal::Lsn;

/// Longest holder name a client may give (the hold's file holds it as its second line).
const MAX_HOLDER_BYTES: usize = 512;

impl Engine {
    /// `BackupLog`: records the hold `backup: HOLDER` on `log` from LSN 1 (every segment it
    /// has), then lists its directory's regular files; with `last_in_files`, also reads the
    /// last record its files hold.
    pub fn backup_log(&self, log: &str, holder: &str, last_in_files: bool) -> Result<ResponseBody> {
        let log_dir = self.existing_log_dir(log)?;
        if holder.is_empty()
            || holder.len() > MAX_HOLDER_BYTES
            || holder.chars().any(char::is_control)
        {
            return Err(Error::BadRequest(format!(
                "a backup's holder name must be 1-{MAX_HOLDER_BYTES} bytes without control characters, not {holder:?}"
            )));
        }
        let holder = format!("backup: {holder}");
        let storage = self.config.storage.as_ref();
        let held_from = Lsn::new(1);
        stela_wal::holds::record(storage, &log_dir, Path::new(&holder), held_from).map_err(
            |source| Error::Io {
                what: format!("recording the hold of {holder} on log {log}"),
                source,
            },
        )?;
        tracing::info!(log, holder, "a backup holds the log");
        let files = regular_files(&log_dir)?;
        let last_in_files = if last_in_files {
            stela_wal::tools::tail_last_lsn(&log_dir, &StdStorage)
                .ok()
                .map(Lsn::get)
        } else {
            None
        };
        Ok(ResponseBody::BackupFiles {
            log: log.to_owned(),
            holder,
            held_from: held_from.get(),
            files,
            last_in_files,
        })
    }

    /// `ReadLogFile`: up to `max_bytes` of `log`'s file `file` from `offset` (fewer at its
    /// end; none past it), as data or, when all zeros, as a length of zeros.
    pub fn read_log_file(
        &self,
        log: &str,
        file: &str,
        offset: u64,
        max_bytes: usize,
    ) -> Result<ResponseBody> {
        let path = self.existing_log_dir(log)?.join(plain_file_name(file)?);
        let chunk = |data: Vec<u8>, zeros: u32, gone: bool| ResponseBody::FileChunk {
            offset,
            data: Payload(data),
            zeros,
            gone,
        };
        let opened = match open_regular(&path) {
            Ok(opened) => opened,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(chunk(Vec::new(), 0, true))
            }
            Err(source) => return Err(io_error(&path, source)),
        };
        let mut data = vec![0u8; max_bytes.max(1)];
        let mut filled = 0;
        while filled < data.len() {
            match opened.read_at(&mut data[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(read) => filled += read,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => return Err(io_error(&path, source)),
            }
        }
        data.truncate(filled);
        debug_assert!(data.len() <= max_bytes.max(1));
        if !data.is_empty() && data.iter().all(|&b| b == 0) {
            return Ok(chunk(Vec::new(), filled as u32, false));
        }
        Ok(chunk(data, 0, false))
    }

    /// The directory of the existing log `log`.
    fn existing_log_dir(&self, log: &str) -> Result<PathBuf> {
        if !crate::logs::valid_name(log) {
            return Err(Error::BadLogName(log.to_owned()));
        }
        let dir = self.logs.dir().join(log);
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => Ok(dir),
            _ => Err(Error::NoSuchLog(log.to_owned())),
        }
    }
}

/// `name` if it is one plain path component.
fn plain_file_name(name: &str) -> Result<&str> {
    let plain = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0']);
    if plain {
        Ok(name)
    } else {
        Err(Error::BadRequest(format!(
            "{name:?} is not a file name inside a log's directory"
        )))
    }
}

/// Opens `path` for reading if it is a regular file, never following a link.
fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// The regular files of `log_dir` with their lengths, by name.
fn regular_files(log_dir: &Path) -> Result<Vec<LogFile>> {
    let entries = std::fs::read_dir(log_dir).map_err(|e| io_error(log_dir, e))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error(log_dir, e))?;
        let Ok(meta) = entry.metadata() else {
            continue; // removed since it was listed (a truncated segment)
        };
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if meta.is_file() {
            files.push(LogFile {
                name,
                bytes: meta.len(),
            });
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        what: format!("reading {} for a backup", path.display()),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_plain_path_component_names_a_file_to_read() {
        for good in ["SYNCED", "TERMS", "00000000000000000001.wal", ".hidden"] {
            assert_eq!(plain_file_name(good).unwrap(), good);
        }
        let long = "x".repeat(256);
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/etc/passwd",
            "a\0b",
            long.as_str(),
        ] {
            assert!(plain_file_name(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_link_or_a_directory_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"secret").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("link")).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        assert!(open_regular(&target).is_ok());
        assert!(open_regular(&dir.path().join("link")).is_err());
        assert!(open_regular(&dir.path().join("sub")).is_err());
        let listed = regular_files(dir.path()).unwrap();
        let names: Vec<&str> = listed.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["target"]);
        assert_eq!(listed[0].bytes, 6);
    }
}
