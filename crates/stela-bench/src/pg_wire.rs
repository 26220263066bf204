//! The least of PostgreSQL's frontend/backend protocol (version 3.0) a benchmark client needs:
//! a trust-authenticated start-up over the server's Unix socket and simple queries, with each
//! answer's rows as text. Owns nothing beyond its socket; a query is acknowledged only by the
//! server's CommandComplete and ReadyForQuery (an ErrorResponse, or any I/O error, is an error:
//! the commit is in doubt, never counted).

use anyhow::{bail, Context};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// One session with a PostgreSQL server.
pub struct PgSession {
    stream: UnixStream,
}

/// A backend message: its type byte and body.
struct Message {
    kind: u8,
    body: Vec<u8>,
}

impl PgSession {
    /// Connects to the server listening on `socket_dir/.s.PGSQL.<port>` as `user`, database
    /// `database` (trust authentication); `timeout` bounds every read and write.
    pub fn connect(
        socket_dir: &Path,
        port: u16,
        user: &str,
        database: &str,
        timeout: Duration,
    ) -> anyhow::Result<PgSession> {
        let path = socket_dir.join(format!(".s.PGSQL.{port}"));
        let stream = UnixStream::connect(&path)
            .with_context(|| format!("connecting to {}", path.display()))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut session = PgSession { stream };
        let mut body = Vec::new();
        body.extend_from_slice(&196_608u32.to_be_bytes()); // protocol 3.0
        for (key, value) in [("user", user), ("database", database)] {
            body.extend_from_slice(key.as_bytes());
            body.push(0);
            body.extend_from_slice(value.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut startup = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        startup.extend_from_slice(&body);
        session.stream.write_all(&startup)?;
        loop {
            let message = session.read_message()?;
            match message.kind {
                b'R' => {
                    let code = message
                        .body
                        .get(..4)
                        .map(|b| u32::from_be_bytes(b.try_into().unwrap()));
                    if code != Some(0) {
                        bail!(
                            "the server asks for authentication {code:?}; only trust is supported"
                        );
                    }
                }
                b'E' => bail!("connecting: {}", error_text(&message.body)),
                b'Z' => return Ok(session),
                _ => {} // ParameterStatus, BackendKeyData, notices
            }
        }
    }

    fn read_message(&mut self) -> anyhow::Result<Message> {
        let mut head = [0u8; 5];
        self.stream.read_exact(&mut head)?;
        let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
        if !(4..=(64 << 20)).contains(&len) {
            bail!("a backend message of {len} bytes");
        }
        let mut body = vec![0u8; len - 4];
        self.stream.read_exact(&mut body)?;
        Ok(Message {
            kind: head[0],
            body,
        })
    }

    /// Runs `sql` (one statement, autocommit) and returns its rows, each column as text
    /// (`None` for NULL). Returns only once the server said the command completed and is ready
    /// for the next: for an INSERT, the commit is acknowledged.
    pub fn query(&mut self, sql: &str) -> anyhow::Result<Vec<Vec<Option<String>>>> {
        let mut message = vec![b'Q'];
        message.extend_from_slice(&((sql.len() + 5) as u32).to_be_bytes());
        message.extend_from_slice(sql.as_bytes());
        message.push(0);
        self.stream.write_all(&message)?;
        let mut rows = Vec::new();
        let mut error = None;
        let mut completed = false;
        loop {
            let message = self.read_message()?;
            match message.kind {
                b'D' => rows.push(data_row(&message.body)?),
                b'C' => completed = true,
                b'E' => error = Some(error_text(&message.body)),
                b'Z' => break,
                _ => {}
            }
        }
        match (error, completed) {
            (Some(error), _) => bail!("{error}"),
            (None, false) => bail!("the server never completed {sql:?}"),
            (None, true) => Ok(rows),
        }
    }
}

fn data_row(body: &[u8]) -> anyhow::Result<Vec<Option<String>>> {
    let short = || anyhow::anyhow!("a DataRow cut short");
    let columns = u16::from_be_bytes(body.get(..2).ok_or_else(short)?.try_into()?) as usize;
    let mut at = 2;
    let mut row = Vec::with_capacity(columns);
    for _ in 0..columns {
        let len = i32::from_be_bytes(body.get(at..at + 4).ok_or_else(short)?.try_into()?);
        at += 4;
        if len < 0 {
            row.push(None);
            continue;
        }
        let value = body.get(at..at + len as usize).ok_or_else(short)?;
        row.push(Some(String::from_utf8_lossy(value).into_owned()));
        at += len as usize;
    }
    Ok(row)
}

/// The message field of an ErrorResponse (its severity and text).
fn error_text(body: &[u8]) -> String {
    let mut severity = "";
    let mut text = "";
    for field in body.split(|b| *b == 0) {
        match field.split_first() {
            Some((b'S', rest)) => severity = std::str::from_utf8(rest).unwrap_or(""),
            Some((b'M', rest)) => text = std::str::from_utf8(rest).unwrap_or(""),
            _ => {}
        }
    }
    format!("{severity}: {text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_rows_and_errors_are_read() {
        let mut body = 2u16.to_be_bytes().to_vec();
        body.extend_from_slice(&2i32.to_be_bytes());
        body.extend_from_slice(b"42");
        body.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(data_row(&body).unwrap(), vec![Some("42".to_owned()), None]);
        assert!(data_row(&body[..5]).is_err());
        assert_eq!(
            error_text(b"SERROR\0C23505\0Mduplicate key\0\0"),
            "ERROR: duplicate key"
        );
    }
}
