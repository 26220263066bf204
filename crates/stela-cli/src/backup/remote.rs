//! `stela backup --from ADDRESS`: the same backup taken over the daemon's socket, from another
//! machine (tcp:// or tls://, authenticated as an administrator like any admin tool), as
//! `pg_basebackup` does.
//!
//! The daemon sends its files' bytes unchanged (`ReadLogFile`, 1 MiB at a time, zeros as a
//! length), so the copy is byte for byte what a local backup reads, and it is checked,
//! verified and described by the same manifest: `stela restore` cannot tell the two apart.
//! A logical re-write of the records (read them, append them to a new log) was not chosen:
//! the copy's bytes would be new bytes, so restore would verify the writer, not what the
//! daemon holds, and the log's `SYNCED` mark and `TERMS` would have to be rebuilt.
//!
//! The steps are the local backup's (see the parent module), each a request:
//! 1. `ListLogs`: the logs and how far each is synced (`required_lsn`).
//! 2. `BackupLog` per log: the daemon records a hold (`backup: HOST:DIR`) that keeps every
//!    segment, then lists the log's files (a closed log's last record with them).
//! 3. The files in the local order (`SYNCED`, segments by LSN, others, `TERMS`), chunk by
//!    chunk, paced by `--max-rate`. A segment that is `gone` when read was removed by a
//!    truncation that had read the holds before this backup's was recorded: it and the
//!    segments before it (which that truncation removed first) are dropped from the copy,
//!    which then begins at the next segment, as if the truncation had finished before the
//!    backup began (the records it removed had been released by a client).
//! 4. The copies are verified and the manifest written, as locally; then the holds are
//!    released (`ReleaseHold`), also when the backup fails. A backup killed meanwhile leaves
//!    its holds, shown by `stela logs list` and released with `stela logs release-hold`.
//!
//! Memory is bounded on both sides: one chunk in flight, one buffer of [`copy::CHUNK`] here,
//! at most that much in the daemon's answer.

use super::manifest::{FileCopy, LogCopy};
use super::{copy, io, BackupError, BackupReport, Result};
use std::path::Path;
use std::time::{Instant, SystemTime};
use stela_client::{Address, Connection};
use stela_proto::{LogFile, LogListing, RequestBody, ResponseBody};

/// Backs up every log of the daemon at `address` into `to` over its socket, reading at most
/// `max_rate` bytes per second on average.
///
/// # Errors
/// As [`super::backup`]; and [`BackupError::Remote`] when the daemon refuses a request (not an
/// administrator) or the connection fails.
pub fn backup_remote(address: &Address, to: &Path, max_rate: Option<u64>) -> Result<BackupReport> {
    let (began, clock) = (SystemTime::now(), Instant::now());
    super::prepare_destination(to)?;
    let mut daemon = Daemon::connect(address)?;
    let listing = match daemon.ask("listing its logs", RequestBody::ListLogs)? {
        ResponseBody::Logs(logs) => logs,
        other => return Err(BackupError::Unexpected(format!("{other:?}"))),
    };
    let label = holder_label(to)?;
    let mut planned = Vec::new();
    for log in &listing {
        planned.push(daemon.hold(log, &label)?);
    }
    let source = (address.to_string(), max_rate);
    let report = super::copy_and_record(to, (began, clock), source, planned, |planned, pace| {
        let (name, required, files) = planned;
        daemon.copy_log(to, &name, required, files, pace)
    })?;
    // The backup's holds are released only now, its manifest written.
    drop(daemon);
    Ok(report)
}

/// Who the backup's holds name: this machine and the backup's directory.
fn holder_label(to: &Path) -> Result<String> {
    let canonical = std::fs::canonicalize(to).map_err(io(to, "resolving"))?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "this host".to_owned());
    Ok(format!("{host}:{}", canonical.display()))
}

/// The connection to the daemon and the holds it recorded for this backup, released when
/// dropped.
struct Daemon {
    address: Address,
    conn: Connection,
    /// (log, holder) of every hold recorded.
    holds: Vec<(String, String)>,
}

impl Daemon {
    fn connect(address: &Address) -> Result<Daemon> {
        let conn = Connection::connect_admin(address).map_err(|source| BackupError::Remote {
            what: format!("the daemon at {address}: connecting as an administrator"),
            source,
        })?;
        Ok(Daemon {
            address: address.clone(),
            conn,
            holds: Vec::new(),
        })
    }

    fn ask(&mut self, what: &str, body: RequestBody) -> Result<ResponseBody> {
        self.conn
            .request(body)
            .map_err(|source| BackupError::Remote {
                what: format!("the daemon at {}: {what}", self.address),
                source,
            })
    }

    /// Holds `log` and lists its files. Returns its name, the LSN its copy must reach and its
    /// files.
    fn hold(&mut self, log: &LogListing, label: &str) -> Result<(String, u64, Vec<LogFile>)> {
        let request = RequestBody::BackupLog {
            log: log.name.clone(),
            holder: label.to_owned(),
            last_in_files: log.durable_lsn.is_none(),
        };
        let what = format!("holding log {}", log.name);
        match self.ask(&what, request)? {
            ResponseBody::BackupFiles {
                holder,
                files,
                last_in_files,
                ..
            } => {
                self.holds.push((log.name.clone(), holder));
                let required = log.durable_lsn.or(last_in_files).unwrap_or(0);
                Ok((log.name.clone(), required, files))
            }
            other => Err(BackupError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Copies the files of `name` into `to/logs/name` in copy order and verifies the copy.
    fn copy_log(
        &mut self,
        to: &Path,
        name: &str,
        required: u64,
        files: Vec<LogFile>,
        pace: &mut copy::Pace,
    ) -> Result<(LogCopy, (u64, u64))> {
        let target = to.join("logs").join(name);
        copy::create_private_dir(&target).map_err(io(&target, "creating"))?;
        let mut ordered: Vec<(u8, String, u64)> = files
            .into_iter()
            .filter_map(|file| {
                let (rank, file_name) = super::copy_rank(&file.name)?;
                Some((rank, file_name, file.bytes))
            })
            .collect();
        ordered.sort();
        let (mut copies, mut read, mut written) = (Vec::<(u8, FileCopy)>::new(), 0, 0);
        for (rank, file_name, bytes) in ordered {
            let path = target.join(&file_name);
            match self.copy_file(name, &file_name, bytes, &path, pace) {
                Ok(copied) => {
                    read += copied.bytes;
                    written += copied.written;
                    let (bytes, crc32c) = (copied.bytes, copied.crc32c);
                    copies.push((
                        rank,
                        FileCopy {
                            name: file_name,
                            bytes,
                            crc32c,
                        },
                    ));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && rank == 1 => {
                    tracing::info!(log = name, segment = file_name,
                        "truncated on the daemon while the backup began: it and the segments before it are left out");
                    drop_segments(&target, &path, &mut copies)?;
                }
                Err(e) => return Err(io(&path, "copying into")(e)),
            }
        }
        copy::sync_dir(&target).map_err(io(&target, "syncing"))?;
        let (first_lsn, last_lsn) = super::verify_copy(&target, name, required)?;
        let copy = LogCopy {
            name: name.to_owned(),
            required_lsn: required,
            first_lsn,
            last_lsn,
            files: copies.into_iter().map(|(_, file)| file).collect(),
        };
        Ok((copy, (read, written)))
    }

    /// Copies `bytes` bytes of the daemon's file `file` of `log` to `path`. A file the daemon
    /// no longer has is `NotFound`.
    fn copy_file(
        &mut self,
        log: &str,
        file: &str,
        bytes: u64,
        path: &Path,
        pace: &mut copy::Pace,
    ) -> std::io::Result<copy::Copied> {
        let conn = &mut self.conn;
        let mut read_exact_at = |chunk: &mut [u8], at: u64| -> std::io::Result<()> {
            let mut filled = 0;
            while filled < chunk.len() {
                let offset = at + filled as u64;
                let request = RequestBody::ReadLogFile {
                    log: log.to_owned(),
                    file: file.to_owned(),
                    offset,
                    max_bytes: u32::try_from(chunk.len() - filled).unwrap_or(u32::MAX),
                };
                let answer = conn.request(request).map_err(std::io::Error::other)?;
                filled += take_chunk(answer, offset, &mut chunk[filled..])?;
            }
            Ok(())
        };
        copy::copy_from(&mut read_exact_at, bytes, path, pace)
    }
}

/// Puts the bytes of a `FileChunk` answer for `offset` at the start of `into`; returns how many.
fn take_chunk(answer: ResponseBody, offset: u64, into: &mut [u8]) -> std::io::Result<usize> {
    use std::io::{Error, ErrorKind};
    let ResponseBody::FileChunk {
        offset: answered,
        data,
        zeros,
        gone,
    } = answer
    else {
        return Err(Error::other(format!("unexpected answer: {answer:?}")));
    };
    if gone {
        return Err(Error::new(
            ErrorKind::NotFound,
            "the daemon no longer has the file",
        ));
    }
    let zeros = zeros as usize;
    if answered != offset || data.0.len() > into.len() || zeros > into.len() {
        return Err(Error::other(format!(
            "the daemon answered {} bytes (or {zeros} zeros) at {answered} for at most {} at {offset}",
            data.0.len(),
            into.len()
        )));
    }
    if !data.0.is_empty() {
        into[..data.0.len()].copy_from_slice(&data.0);
        return Ok(data.0.len());
    }
    if zeros > 0 {
        into[..zeros].fill(0);
        return Ok(zeros);
    }
    Err(Error::new(
        ErrorKind::UnexpectedEof,
        format!("the file ends at {offset}, before the length it was listed with"),
    ))
}

/// A segment was gone: removes its partial copy and every segment copied before it.
fn drop_segments(target: &Path, partial: &Path, copies: &mut Vec<(u8, FileCopy)>) -> Result<()> {
    match std::fs::remove_file(partial) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io(partial, "removing")(e))
        }
        _ => {}
    }
    for (_, file) in copies.iter().filter(|(rank, _)| *rank == 1) {
        let path = target.join(&file.name);
        std::fs::remove_file(&path).map_err(io(&path, "removing"))?;
    }
    copies.retain(|(rank, _)| *rank != 1);
    Ok(())
}

impl Drop for Daemon {
    fn drop(&mut self) {
        for (log, holder) in std::mem::take(&mut self.holds) {
            let release = RequestBody::ReleaseHold {
                log: log.clone(),
                holder: holder.clone(),
            };
            let released = self.conn.request(release.clone()).or_else(|_| {
                // The connection may be what failed the backup: one fresh try.
                Connection::connect_admin(&self.address)?.request(release)
            });
            if let Err(error) = released {
                tracing::warn!(log, holder, %error,
                    "the backup's hold could not be released: `stela logs release-hold` it");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use stela_proto::Payload;

    fn chunk(offset: u64, data: &[u8], zeros: u32, gone: bool) -> ResponseBody {
        ResponseBody::FileChunk {
            offset,
            data: Payload(data.to_vec()),
            zeros,
            gone,
        }
    }

    #[test]
    fn a_chunk_fills_its_bytes_or_zeros_and_nothing_else_is_taken() {
        let mut into = [9u8; 8];
        assert_eq!(
            take_chunk(chunk(4, b"abc", 0, false), 4, &mut into).unwrap(),
            3
        );
        assert_eq!(&into[..4], b"abc\x09");
        assert_eq!(
            take_chunk(chunk(4, b"", 5, false), 4, &mut into).unwrap(),
            5
        );
        assert_eq!(&into[..6], &[0, 0, 0, 0, 0, 9]);
    }

    #[test]
    fn a_gone_segment_drops_itself_and_every_segment_before_it_but_not_the_mark() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str| {
            std::fs::write(dir.path().join(name), name).unwrap();
            FileCopy {
                name: name.to_owned(),
                bytes: name.len() as u64,
                crc32c: 0,
            }
        };
        let mut copies = vec![
            (0, file("SYNCED")),
            (1, file("00000000000000000001.wal")),
            (1, file("00000000000000001001.wal")),
        ];
        let partial = dir.path().join("00000000000000002001.wal");
        std::fs::write(&partial, b"half").unwrap();
        drop_segments(dir.path(), &partial, &mut copies).unwrap();
        let names: Vec<&str> = copies.iter().map(|(_, f)| f.name.as_str()).collect();
        assert_eq!(names, ["SYNCED"]);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["SYNCED"]);
        // A segment gone before any of its bytes were copied: nothing partial to remove.
        drop_segments(dir.path(), &partial, &mut copies).unwrap();
    }

    #[test]
    fn a_chunk_that_is_not_what_was_asked_is_refused() {
        let mut into = [0u8; 4];
        let kind = |answer, into: &mut [u8]| take_chunk(answer, 8, into).unwrap_err().kind();
        assert_eq!(kind(chunk(8, b"", 0, true), &mut into), ErrorKind::NotFound);
        assert_eq!(
            kind(chunk(8, b"", 0, false), &mut into),
            ErrorKind::UnexpectedEof
        );
        // Another offset, more bytes or zeros than asked, another answer.
        assert_eq!(kind(chunk(0, b"ab", 0, false), &mut into), ErrorKind::Other);
        assert_eq!(
            kind(chunk(8, b"abcde", 0, false), &mut into),
            ErrorKind::Other
        );
        assert_eq!(kind(chunk(8, b"", 5, false), &mut into), ErrorKind::Other);
        assert_eq!(kind(ResponseBody::Closed, &mut into), ErrorKind::Other);
    }
}
