//! One authenticated stream on the standby, from the door to its end: the transport (plain TCP
//! or TLS through `stela_net::duplex`), the checks of what the `Open` asks (a log name, a codec,
//! the log free, the epoch), the copy opened and its position sent, the cuts and reseeds the
//! primary asks before shipping, then the receiving thread and the writer behind it.
//!
//! Invariants:
//! - **Checked before touched.** A log's directory, terms and files are touched only once the
//!   `Open` named a valid log and codec, no other stream mirrors the log, and the epoch allows
//!   the stream; a refusal tells the primary why (`Refuse`) and touches nothing.
//! - **Busy before the epoch.** The log is marked busy before the epoch is checked (see
//!   [`serve`]), and the mark is released however the stream ends ([`super::Busy`]).
//! - **A term never goes back**: a stream of a term below the copy's is refused before a byte is
//!   written; a higher one is observed durably before the copy is opened for it.

use super::door::Opened;
use super::fencing::{adopt_terms, check_epoch};
use super::receive::{position_message, receive_chunks, watch_primary};
use super::writer::{write_behind, Pipe, PipeState};
use super::{Busy, Shared};
use crate::replication::{receive, send, Reader, SessionEnd, Writer};
use crate::sync::lock;
use std::io::{BufReader, Read};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};
use stela_format::term::Term;
use stela_format::Codec;
use stela_proto::repl::ReplMessage;
use stela_wal::mirror::Mirror;
use stela_wal::{TermStore, WalOptions};

/// What the primary's `Open` asked for, checked.
struct Asked {
    term: u64,
    /// The primary's node name.
    node: String,
    log: String,
    codec: Codec,
    type_tag: String,
    /// The primary's term history (term, first LSN).
    history: Vec<(u64, u64)>,
}

/// The log's copy on this node, opened for a stream.
struct Copy {
    dir: PathBuf,
    options: WalOptions,
    terms: TermStore,
    mirror: Mirror,
}

/// Serves a stream whose primary proved itself at the door, until it ends.
pub(super) fn serve(opened: Opened, shared: &Shared) -> Result<(), SessionEnd> {
    let (reader, mut writer, socket, open) = transport(opened, shared)?;
    // Authenticated: the stream gets its buffer; only now may its term change this standby's
    // (a higher one is adopted below).
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let asked = match asked(open) {
        Ok(asked) => asked,
        Err(why) => return refuse(&mut writer, 0, why),
    };
    // Marked busy before the epoch is checked: a promise ends the streams and then waits until
    // no log is busy, so a stream is either waited for (and ends itself at its next
    // acknowledgement, `Pipe::ack`) or checked against the promised epoch and refused. Marked
    // after the check, a stream could pass it just before a promise, begin after the promise
    // read this node's position, and acknowledge records the promise did not report.
    if !lock(&shared.busy).insert(asked.log.clone()) {
        let why = format!("log {} is already being mirrored", asked.log);
        return refuse(&mut writer, 0, SessionEnd::Rejected(why));
    }
    let _busy = Busy(shared, asked.log.clone());
    lock(&shared.ends).remove(&asked.log);
    if let Err(why) = check_epoch(&shared.node, asked.term, &asked.node) {
        return refuse(&mut writer, shared.node.epoch() << 32, why);
    }
    // From here until the copy's position is sent, the primary waits for this node.
    let step = shared.node.handshake_step();
    let watched = socket.try_clone()?;
    lock(&shared.sockets).insert(asked.log.clone(), socket);
    let copy = open_copy(shared, &asked, &mut writer)?;
    // The suspicion clock stands still while this node works on a step (opening its copy,
    // cutting it: the primary waits), never while it waits for the primary. Counted as the
    // primary's silence, opening a large copy made a restarted old primary ask to be promoted
    // in the middle of its own handshake.
    drop(step);
    let (copy, first) = settle(shared, &asked, copy, &mut reader, &mut writer)?;
    mirror_stream(shared, &asked, copy, (reader, first), writer, watched)
}

/// Sets the stream's socket up and wraps it in its transport: what the primary sent after its
/// `Open` is read first. Returns the two ends, the socket (to cut it) and the `Open`.
fn transport(
    opened: Opened,
    shared: &Shared,
) -> Result<(Reader, Writer, TcpStream, ReplMessage), SessionEnd> {
    let Opened {
        stream,
        tls,
        open,
        after_open,
        ..
    } = opened;
    if shared.node.realtime_threads() {
        crate::sched::become_realtime("standby receiver");
    }
    crate::replication::tune_stream(&stream);
    // A primary heard from not even by a heartbeat for the link's deadline is behind a
    // black-holed or one-way link, or stopped: the stream ends (every read fails after the
    // deadline), and the primary opens a new one when it can.
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(crate::replication::LINK_DEADLINE))?;
    let socket = stream.try_clone()?;
    let after_open = std::io::Cursor::new(after_open);
    let (reader, writer): (Reader, Writer) = match tls {
        None => {
            let writer = stream.try_clone()?;
            (Box::new(after_open.chain(stream)), Box::new(writer))
        }
        Some(tls) => {
            let (reader, writer) =
                stela_net::duplex::duplex(stream, *tls, std::time::Duration::from_secs(10))
                    .map_err(|e| SessionEnd::Tls(format!("TLS: {e}")))?;
            (Box::new(after_open.chain(reader)), Box::new(writer))
        }
    };
    Ok((reader, writer, socket, open))
}

/// The `Open`'s fields, once its log name and codec are known good.
fn asked(open: ReplMessage) -> Result<Asked, SessionEnd> {
    let ReplMessage::Open {
        term,
        node,
        log,
        codec,
        type_tag,
        history,
        ..
    } = open
    else {
        unreachable!("the door hands on only an Open");
    };
    if !crate::logs::valid_name(&log) {
        return Err(SessionEnd::Rejected(format!("{log:?} is not a log name")));
    }
    let Some(codec) = Codec::from_name(&codec) else {
        return Err(SessionEnd::Rejected(format!("unknown codec {codec:?}")));
    };
    Ok(Asked {
        term,
        node,
        log,
        codec,
        type_tag,
        history,
    })
}

/// Tells the primary why the stream ends (at this node's term `ours`), and ends it.
fn refuse(writer: &mut Writer, ours: u64, why: SessionEnd) -> Result<(), SessionEnd> {
    let _ = send(
        writer,
        &ReplMessage::Refuse {
            term: ours,
            message: why.to_string(),
        },
    );
    Err(why)
}

/// Tells the primary where `mirror`'s copy stands in `term` (after `Open`, a cut or a reseed).
fn tell_position(
    writer: &mut Writer,
    term: u64,
    mirror: &Mirror,
    terms: &TermStore,
    node: &str,
) -> Result<(), SessionEnd> {
    let position = position_message(term, mirror.position(), mirror.durable_lsn(), terms, node);
    send(writer, &position)
}

/// Opens the log's copy for a stream of `asked.term` (refused if the copy's term is newer) and
/// tells the primary where it stands.
fn open_copy(shared: &Shared, asked: &Asked, writer: &mut Writer) -> Result<Copy, SessionEnd> {
    let (log, term) = (&asked.log, asked.term);
    debug_assert!(
        crate::logs::valid_name(log),
        "a log is touched only by a valid name"
    );
    debug_assert!(
        lock(&shared.busy).contains(log),
        "a copy is opened only while busy"
    );
    let dir = shared.dir.join(log);
    // As for the daemon's own opens: no log directory is followed through a link.
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(SessionEnd::Storage(format!(
            "{} is a symbolic link, which the standby does not follow",
            dir.display()
        )));
    }
    // Durably: a copy whose directory entry a power cut took would be lost whole.
    stela_wal::storage::create_dir_durably(shared.storage.as_ref(), &dir)
        .map_err(|e| SessionEnd::Storage(format!("{}: {e}", dir.display())))?;
    let mut terms = TermStore::open(Arc::clone(&shared.storage), &dir)?;
    if Term(term) < terms.current() {
        let ours = terms.current().0;
        let why = format!("stale term {term}: this standby's log {log} is at term {ours}");
        refuse(writer, ours, SessionEnd::Fenced(why))?;
    }
    terms.observe(Term(term))?;
    debug_assert!(
        terms.current() >= Term(term),
        "the stream's term is observed before use"
    );
    release_own_holds(shared, &dir, log);
    let options = WalOptions::default()
        .codec(asked.codec)
        .segment_bytes(shared.segment_bytes)
        .storage(Arc::clone(&shared.storage));
    let mirror = Mirror::open(&dir, options.clone(), &asked.type_tag)?;
    // A term that begins beyond what this copy holds (a primary that began a term and crashed
    // before its first record, a cut a crash interrupted) says nothing about any record; it
    // would only stand in the way of the next term's entry.
    let end = mirror.received_lsn();
    if terms
        .history()
        .entries()
        .iter()
        .any(|&(_, first)| first > end + 1)
    {
        terms.truncate_after(end)?;
    }
    tell_position(writer, term, &mirror, &terms, &shared.node.name)?;
    Ok(Copy {
        dir,
        options,
        terms,
        mirror,
    })
}

/// Holds this node recorded for its own standby while it was the primary stand for no one now:
/// whoever ships to it decides what its copy keeps.
fn release_own_holds(shared: &Shared, dir: &Path, log: &str) {
    match stela_wal::holds::release_standby_holds(shared.storage.as_ref(), dir) {
        Ok(0) => {}
        Ok(released) => {
            tracing::info!(
                log,
                released,
                "standby: released the holds this node kept for its own standby as a primary"
            )
        }
        Err(error) => {
            tracing::warn!(log, %error, "standby: could not release the holds this node kept as a primary")
        }
    }
}

/// Before anything is shipped the primary may ask this copy to cut what diverged (this node
/// was the primary of an older epoch: the suffix goes to salvage), or, when the copy ends
/// before the primary's oldest segment, to begin it again there; after each, where the copy
/// stands now is sent again. Returns the copy and the first message of the shipping itself.
fn settle(
    shared: &Shared,
    asked: &Asked,
    mut copy: Copy,
    reader: &mut BufReader<Reader>,
    writer: &mut Writer,
) -> Result<(Copy, ReplMessage), SessionEnd> {
    let term = asked.term;
    let mut first = receive(reader)?;
    loop {
        let (asked_term, what) = match &first {
            ReplMessage::Cut { term, .. } => (*term, "a cut"),
            ReplMessage::Reseed { term, .. } => (*term, "a reseed"),
            _ => return Ok((copy, first)),
        };
        if asked_term != term {
            let why = format!("{what} in term {asked_term} on a stream of term {term}");
            refuse(writer, copy.terms.current().0, SessionEnd::Protocol(why))?;
        }
        let step = shared.node.handshake_step();
        let Copy {
            dir,
            options,
            terms,
            mirror,
        } = copy;
        drop(mirror);
        match first {
            ReplMessage::Cut { after_lsn, .. } => {
                let reason = format!("diverged from the primary {} of term {term}", asked.node);
                let salvaged =
                    cut_after(&dir, &options, asked, after_lsn, &shared.salvage, &reason)?;
                tracing::warn!(log = asked.log, after_lsn, salvaged, "standby: cut the copy after the point it shares with the new primary; the rest is kept in salvage");
            }
            ReplMessage::Reseed { header, .. } => {
                if let Err(why) = reseed(shared, &dir, options.clone(), &asked.type_tag, &header) {
                    refuse(writer, terms.current().0, why)?;
                }
            }
            _ => unreachable!("only a cut or a reseed comes here"),
        }
        drop(terms);
        let mut terms = TermStore::open(Arc::clone(&shared.storage), &dir)?;
        terms.observe(Term(term))?;
        let mirror = Mirror::open(&dir, options.clone(), &asked.type_tag)?;
        tell_position(writer, term, &mirror, &terms, &shared.node.name)?;
        copy = Copy {
            dir,
            options,
            terms,
            mirror,
        };
        drop(step);
        first = receive(reader)?;
    }
}

/// Cuts the copy in `dir` after `after_lsn`, keeping the rest in `salvage`; how many records
/// were cut.
fn cut_after(
    dir: &Path,
    options: &WalOptions,
    asked: &Asked,
    after_lsn: u64,
    salvage: &Path,
    reason: &str,
) -> Result<u64, SessionEnd> {
    let options = options.clone();
    stela_wal::salvage::cut_after(dir, options, &asked.type_tag, after_lsn, salvage, reason)
        .map(|kept| kept.map_or(0, |kept| kept.records))
        .map_err(|e| {
            SessionEnd::Storage(format!(
                "cutting {} after LSN {after_lsn}: {e}",
                dir.display()
            ))
        })
}

/// Begins the copy in `dir` again with the primary's oldest segment, `header` (a
/// `ReplMessage::Reseed`): the copy ends before it, and the primary truncated every record this
/// copy holds. A follower reading the copy from below it loses what it has not read: it is
/// named in the log.
fn reseed(
    shared: &Shared,
    dir: &Path,
    options: WalOptions,
    type_tag: &str,
    header: &[u8],
) -> Result<(), SessionEnd> {
    let header = stela_format::SegmentHeader::decode(header).map_err(|why| {
        SessionEnd::Protocol(format!("a reseed with a bad segment header: {why}"))
    })?;
    let start = header.start_lsn.get();
    if let Ok(holds) = stela_wal::holds::list(shared.storage.as_ref(), dir) {
        for hold in holds
            .iter()
            .filter(|h| !h.is_standby() && h.lsn.get() < start)
        {
            tracing::warn!(dir = %dir.display(), holder = ?hold.holder, held = hold.lsn.get(), start,
                "standby: the copy begins again at the primary's oldest segment, above a follower's hold: the follower cannot read the records between");
        }
    }
    let removed = stela_wal::mirror::restart_at(dir, options, type_tag, &header).map_err(|e| {
        SessionEnd::Storage(format!(
            "beginning {} again at LSN {start}: {e}",
            dir.display()
        ))
    })?;
    tracing::warn!(dir = %dir.display(), removed, start,
        "standby: this copy ended before the primary's oldest segment (the primary truncated the records between); it begins again there");
    Ok(())
}

/// Mirrors the stream from its first shipping message on: chunks are checked and taken into
/// memory by this thread, acknowledged as received at once, and written and synced by the
/// writer thread behind (RapiLog's buffers, on the standby: a sync never holds up the next
/// chunk). A stream that ends in error tells the primary why.
fn mirror_stream(
    shared: &Shared,
    asked: &Asked,
    copy: Copy,
    (mut reader, first): (BufReader<Reader>, ReplMessage),
    writer: Writer,
    watched: TcpStream,
) -> Result<(), SessionEnd> {
    let Copy {
        mut terms, mirror, ..
    } = copy;
    // Terms the primary began at or before the next record this copy takes are this copy's
    // too, at the LSNs the primary gives them.
    adopt_terms(&mut terms, &asked.history, mirror.received_lsn() + 1)?;
    tracing::info!(
        log = asked.log,
        primary = asked.node,
        term = asked.term,
        from = mirror.position().next_lsn.get(),
        "standby: mirroring"
    );
    let mut checker = mirror.checker();
    let segments = Arc::clone(mirror.segments());
    let pipe = Arc::new(Pipe {
        state: Mutex::new(PipeState {
            received: mirror.received_lsn(),
            durable: mirror.durable_lsn(),
            ..PipeState::default()
        }),
        changed: Condvar::new(),
        socket: Mutex::new(writer),
        term: asked.term,
        node: Arc::clone(&shared.node),
        started: std::time::Instant::now(),
        heard_ms: AtomicU64::new(0),
    });
    let view = (asked.node.clone(), asked.term, Arc::downgrade(&pipe));
    lock(&shared.views).insert(asked.log.clone(), view);
    let written = {
        let (pipe, log) = (Arc::clone(&pipe), asked.log.clone());
        std::thread::Builder::new()
            .name("stela-mirror-writer".into())
            .spawn(move || write_behind(mirror, &pipe, &log))?
    };
    let watch = watch_primary(Arc::clone(&pipe), watched, &asked.log)?;
    let result = receive_chunks(
        &mut reader,
        Some(first),
        &mut checker,
        (&mut terms, &asked.history),
        &pipe,
        (shared.storage.as_ref(), &segments),
        &shared.node,
    );
    if let Err(why) = &result {
        let refusal = ReplMessage::Refuse {
            term: terms.current().0,
            message: why.to_string(),
        };
        let _ = send(&mut *lock(&pipe.socket), &refusal);
    }
    pipe.close();
    watch.thread().unpark();
    let _ = watch.join();
    // Only a writer that wrote everything it took says where the copy ends (before the log is
    // marked free, so a promise that waited for it reads this).
    if let Ok(Some(end)) = written.join() {
        lock(&shared.ends).insert(asked.log.clone(), end);
    }
    result
}
