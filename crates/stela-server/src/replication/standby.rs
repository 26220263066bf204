//! The standby's side of log shipping: a listener that takes one stream per log from its
//! primary and mirrors it byte for byte into `DIR/logs/NAME` (`stela_wal::mirror`), so that the
//! standby's segment files are the primary's and a promoted standby opens them as ordinary logs.
//!
//! Invariants:
//! - **Terms fence.** Each log keeps its term state (`stela_wal::TermStore`). A stream from a
//!   term below the log's current term is refused before a byte of it is written; a higher one is
//!   adopted durably before its first chunk is written, and its first LSN enters the history.
//! - **Acknowledged means held.** `received_lsn` is sent only after the chunk's bytes were
//!   written to the OS (in the standby's memory: they survive a standby daemon crash, not an OS
//!   crash); `durable_lsn` only after an fdatasync covered them. The standby syncs whenever its
//!   socket has nothing more to read, so syncs batch under load, like a group commit.
//! - **One primary per log at a time**: a second stream for a log already being mirrored is
//!   refused.
//! - **Bad input stops the stream, not the daemon**: a malformed frame, a chunk that does not
//!   continue the mirror, a stale term: the primary is told why (`Refuse`) and the connection
//!   closes; what was mirrored stays.

use super::{receive, send};
use crate::sync::lock;
use std::collections::HashSet;
use std::io::BufReader;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use stela_format::term::Term;
use stela_format::Codec;
use stela_proto::repl::{chunk_bytes, ReplMessage};
use stela_wal::mirror::{Chunk, Mirror, MirrorError};
use stela_wal::storage::Storage;
use stela_wal::{TermStore, WalOptions};

/// The standby's replication listener.
pub struct Standby {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    segment_bytes: u64,
    /// Logs being mirrored now.
    busy: Mutex<HashSet<String>>,
    stop: Arc<AtomicBool>,
}

impl Standby {
    /// Listens on `addr` and mirrors every stream into `dir/logs/NAME`.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub fn start(
        addr: SocketAddr,
        dir: &Path,
        storage: Arc<dyn Storage>,
        segment_bytes: u64,
    ) -> std::io::Result<Standby> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            dir: dir.join("logs"),
            storage,
            segment_bytes,
            busy: Mutex::new(HashSet::new()),
            stop: Arc::clone(&stop),
        });
        let thread = std::thread::Builder::new()
            .name("stela-standby".into())
            .spawn(move || accept_loop(&listener, &shared))?;
        tracing::info!(%addr, "standby: waiting for the primary's streams");
        Ok(Standby {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let shared = Arc::clone(shared);
                let spawned = std::thread::Builder::new()
                    .name("stela-mirror".into())
                    .spawn(move || {
                        if let Err(why) = serve(stream, &shared) {
                            tracing::warn!(%peer, why, "standby: stream ended");
                        }
                    });
                if let Err(error) = spawned {
                    tracing::error!(%peer, %error, "standby: cannot start a mirror thread; stream refused");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(error) => {
                tracing::warn!(%error, "standby: accept failed");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

/// Releases a log's "being mirrored" mark when its stream ends, however it ends.
struct Busy<'a>(&'a Shared, String);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        lock(&self.0.busy).remove(&self.1);
    }
}

fn serve(stream: TcpStream, shared: &Shared) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let probe = stream.try_clone().map_err(|e| e.to_string())?;
    let mut reader = BufReader::with_capacity(1 << 20, stream);
    let ReplMessage::Open {
        term,
        node,
        log,
        codec,
        type_tag,
        ..
    } = receive(&mut reader)?
    else {
        return Err("the stream did not start with Open".into());
    };
    let refuse = |writer: &mut TcpStream, ours: u64, why: String| {
        let _ = send(
            writer,
            &ReplMessage::Refuse {
                term: ours,
                message: why.clone(),
            },
        );
        Err(why)
    };
    if !crate::logs::valid_name(&log) {
        return refuse(&mut writer, 0, format!("{log:?} is not a log name"));
    }
    let Some(codec) = Codec::from_name(&codec) else {
        return refuse(&mut writer, 0, format!("unknown codec {codec:?}"));
    };
    if !lock(&shared.busy).insert(log.clone()) {
        return refuse(
            &mut writer,
            0,
            format!("log {log} is already being mirrored"),
        );
    }
    let _busy = Busy(shared, log.clone());
    let dir = shared.dir.join(&log);
    shared
        .storage
        .create_dir_all(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut terms =
        TermStore::open(Arc::clone(&shared.storage), &dir).map_err(|e| e.to_string())?;
    if Term(term) < terms.current() {
        let ours = terms.current().0;
        return refuse(
            &mut writer,
            ours,
            format!("stale term {term}: this standby's log {log} is at term {ours}"),
        );
    }
    terms.observe(Term(term)).map_err(|e| e.to_string())?;
    let options = WalOptions::default()
        .codec(codec)
        .segment_bytes(shared.segment_bytes)
        .storage(Arc::clone(&shared.storage));
    let mut mirror = Mirror::open(&dir, options, &type_tag).map_err(|e| e.to_string())?;
    let position = mirror.position();
    send(
        &mut writer,
        &ReplMessage::Position {
            term,
            segment_start: position.segment_start.get(),
            offset: position.offset,
            next_lsn: position.next_lsn.get(),
            durable_lsn: mirror.durable_lsn(),
            history: terms
                .history()
                .entries()
                .iter()
                .map(|&(t, f)| (t.0, f))
                .collect(),
        },
    )?;
    tracing::info!(
        log,
        primary = node,
        term,
        from = position.next_lsn.get(),
        "standby: mirroring"
    );
    loop {
        let message = match receive(&mut reader) {
            Ok(message) => message,
            Err(why) => {
                // The primary went away: what was written is synced before the stream ends.
                let _ = mirror.sync();
                return Err(why);
            }
        };
        if message.term() < terms.current().0 {
            let ours = terms.current().0;
            return refuse(&mut writer, ours, format!("stale term {}", message.term()));
        }
        let ReplMessage::Chunk {
            term: chunk_term,
            segment_start,
            offset,
            raw_len,
            compressed,
            bytes,
        } = message
        else {
            if matches!(message, ReplMessage::Heartbeat { .. }) {
                continue;
            }
            return refuse(&mut writer, term, format!("unexpected {message:?}"));
        };
        let bytes = match chunk_bytes(raw_len, compressed, bytes) {
            Ok(bytes) => bytes,
            Err(error) => return refuse(&mut writer, term, error.to_string()),
        };
        // The first record of a new term enters the history before it is written.
        if terms.history().last_term() < Term(chunk_term) {
            terms
                .observe(Term(chunk_term))
                .and_then(|()| terms.begin(Term(chunk_term), mirror.position().next_lsn.get()))
                .map_err(|e| e.to_string())?;
        }
        match mirror.apply(Chunk {
            segment_start: stela_format::Lsn::new(segment_start),
            offset,
            bytes: &bytes,
        }) {
            Ok(_) => {}
            Err(MirrorError::Refused(why)) => return refuse(&mut writer, term, why),
            Err(MirrorError::Wal(error)) => {
                tracing::error!(log, %error, "standby: writing the mirror failed; it is stopped");
                return refuse(&mut writer, term, error.to_string());
            }
        }
        // In the standby's memory now: say so before syncing, since `replicated` waits for
        // exactly this. Then, if nothing more is waiting on the socket, sync (so syncs batch
        // under load) and say that too.
        let ack = |writer: &mut TcpStream, mirror: &Mirror| {
            send(
                writer,
                &ReplMessage::Ack {
                    term: chunk_term,
                    received_lsn: mirror.received_lsn(),
                    durable_lsn: mirror.durable_lsn(),
                },
            )
        };
        ack(&mut writer, &mirror)?;
        if reader.buffer().is_empty() && !readable(&probe) {
            mirror.sync().map_err(|e| e.to_string())?;
            ack(&mut writer, &mirror)?;
        }
    }
}

/// Whether the socket has bytes waiting (without reading them).
fn readable(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut byte = [0u8; 1];
    let waiting = matches!(stream.peek(&mut byte), Ok(n) if n > 0);
    let _ = stream.set_nonblocking(false);
    waiting
}
