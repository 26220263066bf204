//! The primary's side of one stream: connecting to the standby (plain TCP or TLS), opening a
//! log's stream and settling where the standby's copy stands (cutting what diverged, reseeding
//! a copy that ends before this one begins), then the shipping loop, its acknowledgement
//! reader and its deadline watch, and the retries when a session ends.
//!
//! Invariants:
//! - **Never overwrite what may be acknowledged.** A standby holding records this primary's
//!   history lacks is cut only when they are of an older epoch; otherwise shipping stops (the
//!   log is fenced) rather than overwrite them.
//! - **Connected means protected from here on.** `connected` is set only after the standby's
//!   copy agrees with this one, and before the reprotection registry hears of the standby, so
//!   no commit is acknowledged alone past the handshake.
//! - **A dead link ends the session within its deadline**, however its threads are blocked
//!   ([`watch_deadline`] cuts the socket), and the shipper opens a new one.

use super::acks::{fence, read_acks, read_acks_polled, release, AckInbox};
use super::hold::StandbyHold;
use super::ship::{header_for, ship_next, Live, Source, Step};
use super::wire::{receive, send, tune_stream, Reader, Writer};
use super::{
    Link, LogInfo, Replication, SessionEnd, HANDSHAKE, HEARTBEAT, LINK_DEADLINE, RETRY,
    WARNED_REASONS,
};
use crate::pool::Pool;
use crate::sync::lock;
use std::io::{BufReader, Read};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stela_format::term::Term;
use stela_format::{Codec, Lsn};
use stela_proto::repl::ReplMessage;
use stela_wal::mirror::Position;

/// A stream open to the standby, its handshake settled.
struct Stream {
    reader: BufReader<Reader>,
    writer: Writer,
    socket: TcpStream,
    theirs: TheirCopy,
    /// The standby's copy was begun again at this copy's oldest segment.
    reseeded: bool,
}

impl Replication {
    /// A connection to the standby: its reading and writing ends, and the socket (to cut it).
    fn connect(&self) -> Result<(Reader, Writer, TcpStream), SessionEnd> {
        let tcp = TcpStream::connect_timeout(&self.standby, LINK_DEADLINE)
            .map_err(|e| SessionEnd::Link(format!("connect {}: {e}", self.standby)))?;
        tune_stream(&tcp);
        let socket = tcp.try_clone()?;
        let Some(tls) = &self.tls else {
            let writer = tcp.try_clone()?;
            return Ok((Box::new(tcp), Box::new(writer), socket));
        };
        let connection = stela_net::tls::rustls::ClientConnection::new(
            Arc::clone(&tls.config),
            tls.name.clone(),
        )
        .map_err(|e| SessionEnd::Tls(e.to_string()))?;
        let (reader, writer) =
            stela_net::duplex::duplex(tcp, connection, Duration::from_secs(5))
                .map_err(|e| SessionEnd::Tls(format!("TLS to {}: {e}", self.standby)))?;
        Ok((Box::new(reader), Box::new(writer), socket))
    }

    /// The shipper thread of `log`: sessions one after another until the log is closed or
    /// fenced, 100 ms apart while the standby is unreachable.
    pub(super) fn ship_log<W>(
        &self,
        pool: &Pool<W>,
        link: &Arc<Link>,
        log: &LogInfo,
        term: u64,
        hold: &mut StandbyHold,
    ) {
        // The reasons logged since the stream was last up: each is logged once, so a retry
        // that fails the same way adds nothing and one that fails differently is seen (the
        // first reason can hide the one that persists, and two that alternate are not logged
        // every 100 ms). Forgotten once a session gets through its handshake.
        let mut warned: Vec<SessionEnd> = Vec::new();
        while !link.stop.load(Ordering::SeqCst) {
            let Err(why) = self.session(pool, link, log, term, hold) else {
                return;
            };
            self.ends.record(&log.name, &why);
            {
                let mut state = lock(&link.state);
                if std::mem::take(&mut state.connected) {
                    warned.clear();
                }
                state
                    .unreachable_since
                    .get_or_insert_with(std::time::Instant::now);
            }
            self.answer_unprotected(link);
            if !warned.contains(&why) && warned.len() < WARNED_REASONS {
                tracing::warn!(log = %log.name, standby = %self.standby, why = %why, kind = why.kind(), "standby unreachable; replicated commits wait; retrying");
                warned.push(why);
            }
            if link.protection.fenced().is_some() {
                return;
            }
            self.degrade_if_due(link);
            std::thread::sleep(RETRY);
        }
    }

    /// One connection to the standby: handshake, then ship until stopped or broken.
    fn session<W>(
        &self,
        pool: &Pool<W>,
        link: &Arc<Link>,
        log: &LogInfo,
        term: u64,
        hold: &mut StandbyHold,
    ) -> Result<(), SessionEnd> {
        let stream = self.handshake(pool, link, log, term)?;
        let Stream {
            reader,
            writer,
            socket,
            theirs,
            reseeded,
        } = stream;
        self.now_connected(link, log, term, &theirs, reseeded, hold);
        // Acknowledgements arrive on their own thread, so shipping never waits for them; on a
        // plain TCP stream the event loop may take them first (see `Replication::take_acks`).
        let acks = self.read_acks_aside(link, term, reader, &socket)?;
        let at = theirs.position;
        let header = header_for(&log.segments, at.segment_start, log, None)?;
        let plain = if self.tls.is_none() {
            socket.try_clone().ok()
        } else {
            None
        };
        *lock(&link.live) = Some(Live {
            writer,
            plain,
            term,
            at,
            header,
            unfinished: Vec::new(),
        });
        // The link's deadline is watched from a thread of its own as well: the shipper may be
        // blocked in a send that a black-holed link never completes (its socket buffer full),
        // and the acknowledgement reader in a read that never returns; cutting the socket ends
        // both at once, TLS or not.
        let watch = watch_deadline(Arc::clone(link), &socket)?;
        let result = ship_until_ended(pool, link, log, term, hold, &acks);
        // Cutting the socket ends the acknowledgement reader's wait, TLS or not.
        drop(lock(&link.live).take());
        let _ = socket.shutdown(std::net::Shutdown::Both);
        watch.finish();
        let _ = acks.join();
        drop(lock(&link.acks).take());
        result
    }

    /// Opens the stream and settles where the standby's copy stands: what diverged is cut, a
    /// copy that ends before this one's oldest segment begins again there.
    fn handshake<W>(
        &self,
        pool: &Pool<W>,
        link: &Link,
        log: &LogInfo,
        term: u64,
    ) -> Result<Stream, SessionEnd> {
        // Cloned first: the link's lock must not be held across the connection's handshake
        // (a stopped standby would hold it, and every commit and `stela status` with it).
        let history = lock(&link.state).history.clone();
        let opened = self.open_stream(&log.name, log.codec, &log.type_tag, term, &history);
        let (mut reader, mut writer, socket, theirs) = match opened {
            Ok(stream) => stream,
            Err(SessionEnd::Refused {
                term: theirs,
                message,
            }) => return Err(self.fence(link, theirs, term, message)),
            Err(why) => return Err(why),
        };
        if !theirs.node.is_empty() {
            *lock(&self.standby_name) = Some(theirs.node.clone());
        }
        let theirs =
            self.cut_divergence(pool, link, log, term, theirs, (&mut reader, &mut writer))?;
        let (theirs, reseeded) =
            self.reseed_if_behind(link, log, term, theirs, (&mut reader, &mut writer))?;
        Ok(Stream {
            reader,
            writer,
            socket,
            theirs,
            reseeded,
        })
    }

    /// A standby that holds records this primary's history does not carry: cut them (its own
    /// salvage keeps them) when they are of an older epoch (it was the primary before a
    /// failover); otherwise they may be acknowledged records this primary lost, and shipping
    /// stops rather than overwrite them.
    fn cut_divergence<W>(
        &self,
        pool: &Pool<W>,
        link: &Link,
        log: &LogInfo,
        term: u64,
        mut theirs: TheirCopy,
        (reader, writer): (&mut BufReader<Reader>, &mut Writer),
    ) -> Result<TheirCopy, SessionEnd> {
        loop {
            let (history, ours_end) = {
                let state = lock(&link.state);
                (state.history.clone(), pool.positions(log.id).0 - 1)
            };
            let their_end = theirs.end();
            let agreed =
                stela_format::term::divergence((&history, ours_end), (&theirs.history, their_end));
            if their_end <= agreed {
                return Ok(theirs);
            }
            let their_term = theirs.history.term_of(agreed + 1).map_or(0, |t| t.0);
            if their_term >> 32 >= term >> 32 {
                return Err(self.fence(
                    link,
                    u64::MAX,
                    term,
                    format!(
                        "the standby holds records up to LSN {their_end} (term {their_term}) that \
                         this primary's copy lacks after LSN {agreed}: they may be acknowledged \
                         records this primary lost; shipping stops rather than overwrite them"
                    ),
                ));
            }
            tracing::warn!(log = %log.name, standby = %self.standby, after = agreed, their_end, their_term,
                "the standby diverged (it was a primary in an older epoch): it cuts its copy after the common point and keeps the rest in salvage");
            let cut = ReplMessage::Cut {
                term,
                after_lsn: agreed,
            };
            send(writer, &cut)?;
            let before = their_end;
            theirs = self.position_after(link, term, reader)?;
            debug_assert!(theirs.end() < before, "a cut leaves the copy shorter");
        }
    }

    /// A copy that ends in a segment older than this copy's oldest cannot be continued: this
    /// node truncated the records between (a new standby, or one away while a hold for it was
    /// released). Every record it holds is one this node truncated (the copy agrees with this
    /// history, as settled before), so it begins again at the oldest segment here. Returns
    /// where the copy stands and whether it began again.
    fn reseed_if_behind(
        &self,
        link: &Link,
        log: &LogInfo,
        term: u64,
        theirs: TheirCopy,
        (reader, writer): (&mut BufReader<Reader>, &mut Writer),
    ) -> Result<(TheirCopy, bool), SessionEnd> {
        let oldest = link.segments.list().first().cloned();
        let Some(oldest) = oldest.filter(|o| theirs.position.segment_start < o.start) else {
            return Ok((theirs, false));
        };
        let header = link.segments.read_header(&oldest.path)?;
        tracing::warn!(log = %log.name, standby = %self.standby, their_end = theirs.end(), oldest = oldest.start.get(),
            "the standby's copy ends before this copy's oldest segment: it begins again there");
        let reseed = ReplMessage::Reseed {
            term,
            header: header.encode().to_vec(),
        };
        send(writer, &reseed)?;
        Ok((self.position_after(link, term, reader)?, true))
    }

    /// The handshake is settled: what the standby holds of this term counts, the hold follows
    /// it, the link reads as connected and the reprotection registry hears of the standby.
    fn now_connected(
        &self,
        link: &Link,
        log: &LogInfo,
        term: u64,
        theirs: &TheirCopy,
        reseeded: bool,
        hold: &mut StandbyHold,
    ) {
        // Records the standby holds in this primary's own term came from it: they count (not
        // after a reseed: it holds none below where it began again).
        if !reseeded
            && theirs.history.last_term() == Term(term)
            && release(link, theirs.end(), theirs.durable_lsn)
        {
            (self.released)();
        }
        hold.standby_at(theirs.durable_lsn + 1);
        let at = theirs.position;
        {
            let mut state = lock(&link.state);
            state.sent.clear();
            state.acked_at = Some((at.segment_start.get(), at.offset));
            state.connected = true;
            state.unreachable_since = None;
            // The link's deadline runs from the handshake.
            state.last_ack = Some(std::time::Instant::now());
            if std::mem::take(&mut state.degraded) {
                tracing::warn!(log = %log.name, standby = %self.standby, degraded_acks = state.degraded_acks, "standby back: replicated commits wait for it again");
            }
        }
        // After `connected` is set, so that no commit of this log is acknowledged alone past
        // the handshake (until the session ends): a log whose standby already holds what it
        // owes is confirmed here, another once the standby acknowledges it. What the standby
        // holds agrees with this copy (what diverged was cut); after a reseed it holds nothing
        // yet.
        let standby_holds = if reseeded { 0 } else { theirs.end() };
        self.reprotection
            .standby_connected(&log.name, standby_holds);
        tracing::info!(log = %log.name, standby = %self.standby, from = at.next_lsn.get(), "shipping to the standby");
    }

    /// Starts the thread that reads the standby's acknowledgements (on a plain TCP stream, from
    /// the inbox the event loop may read first).
    fn read_acks_aside(
        &self,
        link: &Arc<Link>,
        term: u64,
        reader: BufReader<Reader>,
        socket: &TcpStream,
    ) -> Result<std::thread::JoinHandle<()>, SessionEnd> {
        let polled = self.tls.is_none();
        if polled {
            *lock(&link.acks) = Some(AckInbox {
                socket: socket.try_clone()?,
                pending: reader.buffer().to_vec(),
                term,
                ended: false,
            });
        }
        let (link, released, node) = (
            Arc::clone(link),
            Arc::clone(&self.released),
            Arc::clone(&self.node),
        );
        let thread = std::thread::Builder::new()
            .name("stela-ship-acks".into())
            .spawn(move || {
                if polled {
                    read_acks_polled(&link, &node, &*released);
                } else {
                    read_acks(reader, &link, &node, term, &*released);
                }
            })?;
        Ok(thread)
    }

    /// Connects to the standby and opens `log`'s stream in `term`: where the standby's copy
    /// stands, or its refusal ([`SessionEnd::Refused`]).
    pub(super) fn open_stream(
        &self,
        log: &str,
        codec: Codec,
        type_tag: &str,
        term: u64,
        history: &stela_format::term::TermHistory,
    ) -> Result<(BufReader<Reader>, Writer, TcpStream, TheirCopy), SessionEnd> {
        let (reader, mut writer, socket) = self.connect()?;
        let mut reader = BufReader::new(reader);
        send(
            &mut writer,
            &ReplMessage::Open {
                term,
                node: self.node.name.clone(),
                log: log.to_owned(),
                codec: codec.name().to_owned(),
                type_tag: type_tag.to_owned(),
                token: self.token(),
                history: history.entries().iter().map(|&(t, f)| (t.0, f)).collect(),
            },
        )?;
        // A standby that is stopped (SIGSTOP, a hung machine) still has its connections accepted
        // by the kernel but never answers: the socket is cut after `HANDSHAKE`, so the shipper
        // retries, and `--degrade-after` can take effect, rather than wait for it for ever.
        let theirs = std::thread::scope(|scope| {
            let (answered, answer) = std::sync::mpsc::channel::<()>();
            let cutter = &socket;
            scope.spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    answer.recv_timeout(HANDSHAKE)
                {
                    let _ = cutter.shutdown(std::net::Shutdown::Both);
                }
            });
            let theirs = read_position(&mut reader);
            drop(answered);
            theirs
        })?;
        Ok((reader, writer, socket, theirs))
    }

    /// The standby's `Position` after a `Cut` or a `Reseed`; a refusal fences as at the
    /// handshake.
    fn position_after(
        &self,
        link: &Link,
        term: u64,
        reader: &mut impl Read,
    ) -> Result<TheirCopy, SessionEnd> {
        match read_position(reader) {
            Ok(position) => Ok(position),
            Err(SessionEnd::Refused {
                term: theirs,
                message,
            }) => Err(self.fence(link, theirs, term, message)),
            Err(why) => Err(why),
        }
    }

    /// The standby refused `ours` at its term `theirs`: fences the log if `theirs` is newer
    /// ([`super::acks::fence`]); the end, either way.
    fn fence(&self, link: &Link, theirs: u64, ours: u64, message: String) -> SessionEnd {
        let why = fence(link, &self.node, &*self.released, theirs, ours, message);
        if theirs > ours {
            SessionEnd::Fenced(why)
        } else {
            SessionEnd::Refused {
                term: theirs,
                message: why,
            }
        }
    }
}

/// The shipping loop of a session: ships what the pool holds, tells the standby where this copy
/// begins when truncation moves it, heartbeats an idle stream; until the link is stopped or the
/// stream breaks.
fn ship_until_ended<W>(
    pool: &Pool<W>,
    link: &Link,
    log: &LogInfo,
    term: u64,
    hold: &mut StandbyHold,
    acks: &std::thread::JoinHandle<()>,
) -> Result<(), SessionEnd> {
    // Where the standby last heard this copy begins: told once the stream starts, and again
    // whenever truncation moves it, so the standby's copy does not keep what this one no
    // longer has (`ReplMessage::Truncated`).
    let mut told_first = 0;
    loop {
        if link.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        if acks.is_finished() {
            return Err(SessionEnd::Link("the standby closed the stream".to_owned()));
        }
        let step = with_live(link, |live| {
            ship_next(pool, log.id, link, live, Source::MemoryOrFiles(log))
        })?;
        if let Step::Shipped = step {
            continue;
        }
        hold.acknowledged(|| link.protection.acknowledged_lsns().1 + 1);
        let first_lsn = link.segments.first_lsn().get();
        if first_lsn > told_first {
            with_live(link, |live| {
                live.send(&ReplMessage::Truncated { term, first_lsn })
            })?;
            told_first = first_lsn;
        }
        let mut state = lock(&link.state);
        if !state.dirty {
            let (next, timeout) = link
                .appended
                .wait_timeout(state, HEARTBEAT)
                .unwrap_or_else(|e| e.into_inner());
            state = next;
            if timeout.timed_out() && !state.dirty {
                drop(state);
                with_live(link, |live| live.send(&ReplMessage::Heartbeat { term }))?;
                continue;
            }
        }
        state.dirty = false;
    }
}

/// Runs `f` on the link's stream, if it is still the session's.
fn with_live<T>(
    link: &Link,
    f: impl FnOnce(&mut Live) -> Result<T, SessionEnd>,
) -> Result<T, SessionEnd> {
    match lock(&link.live).as_mut() {
        Some(live) => f(live),
        None => Err(SessionEnd::Stopped("the stream was taken".to_owned())),
    }
}

/// A session's deadline watch ([`watch_deadline`]); finished when the session ends.
struct DeadlineWatch {
    over: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl DeadlineWatch {
    fn finish(self) {
        self.over.store(true, Ordering::SeqCst);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

/// Watches a session's link: once the standby has sent nothing for [`LINK_DEADLINE`] (no
/// acknowledgement, not even of a heartbeat), cuts `socket`, which ends the session however
/// its threads are blocked; the shipper then opens a new stream.
fn watch_deadline(link: Arc<Link>, socket: &TcpStream) -> Result<DeadlineWatch, SessionEnd> {
    let socket = socket.try_clone()?;
    let over = Arc::new(AtomicBool::new(false));
    let thread = {
        let over = Arc::clone(&over);
        std::thread::Builder::new()
            .name("stela-ship-watch".into())
            .spawn(move || {
                while !over.load(Ordering::SeqCst) {
                    std::thread::park_timeout(LINK_DEADLINE / 4);
                    let silent = lock(&link.state).last_ack.map(|at| at.elapsed());
                    if let Some(silent) = silent.filter(|&s| s > LINK_DEADLINE) {
                        if !over.load(Ordering::SeqCst) {
                            tracing::warn!(log = %link.name, silent_ms = silent.as_millis() as u64,
                                "nothing from the standby within the link's deadline: the stream is torn down and opened again");
                            let _ = socket.shutdown(std::net::Shutdown::Both);
                        }
                        return;
                    }
                }
            })?
    };
    Ok(DeadlineWatch { over, thread })
}

/// Where the standby's copy of a log stands, as its `Position` says.
pub(super) struct TheirCopy {
    pub(super) position: Position,
    pub(super) durable_lsn: u64,
    pub(super) history: stela_format::term::TermHistory,
    /// The standby's `--node` name (empty if it does not say).
    pub(super) node: String,
}

impl TheirCopy {
    /// The last LSN the copy holds.
    pub(super) fn end(&self) -> u64 {
        self.position.next_lsn.get() - 1
    }
}

/// Reads the standby's `Position` (after `Open` or `Cut`), or its refusal
/// ([`SessionEnd::Refused`]).
fn read_position(reader: &mut impl Read) -> Result<TheirCopy, SessionEnd> {
    match receive(reader)? {
        ReplMessage::Position {
            segment_start,
            offset,
            next_lsn,
            durable_lsn,
            history,
            node,
            ..
        } => {
            let history = stela_format::term::TermHistory::from_entries(
                history.into_iter().map(|(t, f)| (Term(t), f)),
            )
            .map_err(|e| SessionEnd::Protocol(format!("the standby's term history: {e}")))?;
            Ok(TheirCopy {
                position: Position {
                    segment_start: Lsn::new(segment_start),
                    offset,
                    next_lsn: Lsn::new(next_lsn.max(1)),
                },
                durable_lsn,
                history,
                node,
            })
        }
        ReplMessage::Refuse { term, message } => Err(SessionEnd::Refused { term, message }),
        other => Err(SessionEnd::Protocol(format!(
            "expected the standby's position, got {other:?}"
        ))),
    }
}
