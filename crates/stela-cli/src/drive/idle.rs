//! Connections that said Hello, were welcomed, and then say nothing ([`IdleConnections`]): what
//! a daemon holds for applications connected but quiet, opened in batches below the daemon's
//! table of connections not yet through their Hello.

use anyhow::{anyhow, Context};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;
use stela_proto::frame;
use stela_proto::{Request, RequestBody, Response, ResponseBody, Role, PROTOCOL_VERSION};

/// Batches in which idle connections are opened: every connection of a batch says Hello
/// before any answer is read, and a batch stays below the daemon's slots for connections not
/// yet through their Hello (64), so none is closed as a laggard.
const IDLE_BATCH: usize = 32;
/// How long an idle connection waits for its Welcome.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest Welcome accepted.
const MAX_WELCOME_BYTES: usize = 64 << 10;

/// Connections that said Hello (role Client), were welcomed, and then say nothing: what a
/// daemon holds for applications connected but quiet. Spoken in the raw protocol, so each costs
/// this process one socket and no buffers. Closed when dropped.
#[derive(Debug)]
pub struct IdleConnections {
    streams: Vec<UnixStream>,
}

impl IdleConnections {
    /// Opens `count` connections to the daemon at `socket`, each through its Hello.
    ///
    /// # Errors
    /// A connection cannot be made (the file limit, most likely) or the daemon refuses one (its
    /// connection limit); the message names which connection of how many.
    pub fn open(socket: &Path, count: usize) -> anyhow::Result<IdleConnections> {
        let mut hello = Vec::new();
        frame::encode(
            &Request {
                id: 1,
                body: RequestBody::Hello {
                    version: PROTOCOL_VERSION,
                    client: format!("stela idle connection {}", env!("CARGO_PKG_VERSION")),
                    role: Role::Client,
                    token: None,
                },
            },
            &mut hello,
        )?;
        let mut streams: Vec<UnixStream> = Vec::with_capacity(count);
        while streams.len() < count {
            let first = streams.len();
            for number in first + 1..=(first + IDLE_BATCH).min(count) {
                let which = || {
                    format!(
                        "idle connection {number} of {count} to {}",
                        socket.display()
                    )
                };
                let mut stream = UnixStream::connect(socket).map_err(|error| {
                    let hint = if error.raw_os_error() == Some(libc_emfile()) {
                        " (this process is out of file descriptors: raise its hard limit)"
                    } else {
                        ""
                    };
                    anyhow!("{}: {error}{hint}", which())
                })?;
                stream.set_read_timeout(Some(HELLO_TIMEOUT))?;
                stream.write_all(&hello).with_context(which)?;
                streams.push(stream);
            }
            for (offset, stream) in streams[first..].iter_mut().enumerate() {
                read_welcome(stream).with_context(|| {
                    format!(
                        "idle connection {} of {count} to {}",
                        first + offset + 1,
                        socket.display()
                    )
                })?;
            }
        }
        Ok(IdleConnections { streams })
    }

    pub fn len(&self) -> usize {
        self.streams.len()
    }

    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }
}

/// EMFILE, without a libc dependency for one number (the same on every Linux architecture).
fn libc_emfile() -> i32 {
    rustix::io::Errno::MFILE.raw_os_error()
}

/// Reads the answer to an idle connection's Hello: a Welcome, or the daemon's refusal.
fn read_welcome(stream: &mut UnixStream) -> anyhow::Result<()> {
    let response: Response = match frame::read_blocking(stream, MAX_WELCOME_BYTES) {
        Ok(response) => response,
        Err(frame::ReadError::Header(e)) => Err(e)
            .context("no answer to Hello (the daemon closed the connection or did not answer)")?,
        Err(frame::ReadError::Body(e)) => Err(e).context("the answer to Hello was cut short")?,
        Err(frame::ReadError::Cut) => anyhow::bail!("the answer to Hello was cut short"),
        Err(frame::ReadError::Frame(e)) => Err(e)?,
    };
    match response.body {
        ResponseBody::Welcome { .. } => Ok(()),
        ResponseBody::Error { code, message } => {
            anyhow::bail!("the daemon refused it ({code:?}): {message}")
        }
        other => anyhow::bail!("the daemon answered Hello with {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::timed::tests::daemon_in;

    #[test]
    fn idle_connections_past_the_daemons_limit_fail_naming_which_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let server = daemon_in(dir.path(), 3);
        let held = IdleConnections::open(server.socket_path(), 3).unwrap();
        assert_eq!(held.len(), 3);
        assert_eq!(server.status().connections, 3);
        let error = IdleConnections::open(server.socket_path(), 2).unwrap_err();
        let message = format!("{error:#}");
        assert!(message.contains("idle connection 1 of 2"), "{message}");
        assert!(message.contains("TooManyConnections"), "{message}");
        drop(held);
        server.shutdown().unwrap();
    }
}
