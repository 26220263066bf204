//! One client connection: its bytes in and out, its handshake, its log handles, and the
//! translation of each request into a call on the engine. It owns no daemon state and does no
//! I/O but its own socket's; anything that would block is handed to a worker, and a `disk` wait
//! to the pool, which answers through the inbox.
//!
//! Invariants:
//! - **Bounded memory.** Bytes are read only as they arrive (a frame header is never trusted to
//!   size a buffer); the loop caps the bytes all connections hold unhandled together. The
//!   answer buffer holds what is unsent and little more: the part already sent is dropped from
//!   its front once it is most of it ([`COMPACT_AFTER`]), so a client that reads slowly but
//!   never lets it empty does not make it grow with everything it was ever sent; once empty,
//!   a large buffer is freed. A connection whose unsent answers have not moved for the frame
//!   timeout (a client that does not read) is closed by the loop.
//! - **In order.** Requests are handled in the order received and answered in that order: a
//!   request that waits (for space, the disk or a worker) holds back the ones behind it on this
//!   connection only, and nothing more is read from the socket meanwhile.
//! - **Bad frames close.** A frame that is too large, fails its checksum or does not decode gets
//!   one `BadFrame` answer, then the connection closes (no trustworthy boundary is left). The
//!   first request must be a `Hello` of our version; anything else is answered, then closed.

use super::auth::{self, Identity};
use super::inbox::{Answer, ConnRef, Effect, Event, Inbox};
use super::ring::RingConn;
use super::stream::Stream;
use crate::engine::{Engine, NetStats, Waiter};
use crate::error::Error;
use crate::pool::{LogId, Record};
use crate::quota::Credential;
use crate::workers::Workers;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;
use stela_proto::frame::{self, FRAME_HEADER_BYTES};
use stela_proto::{
    Durability, ErrorCode, Payload, Request, RequestBody, Response, ResponseBody, Role,
    PROTOCOL_VERSION,
};

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Accepted; its Hello has not been handled.
    Handshake,
    Ready(Role),
    /// Answering what is left, then closing.
    Closing,
}

/// A request that holds back the connection.
pub(crate) enum Waiting {
    /// An append found no buffer space; retried when space is freed. `answered`: an `unsafe`
    /// append whose answer already went out.
    Space { request: Request, answered: bool },
    /// A `disk` wait or a worker job; its answer arrives through the inbox.
    Answer,
}

/// What handling the buffered requests led to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Nothing more to handle until more bytes arrive.
    Idle,
    /// A request waits (space, disk, worker).
    Waiting,
    /// The first request was a valid Hello asking for this role, with this token; the loop
    /// decides authentication and admission.
    Hello(u64, Role, Option<String>),
    /// Close once the answers are out.
    Close,
}

/// Everything the handling of a request may use besides the connection itself.
pub(crate) struct Ctx<'a> {
    pub engine: &'a Arc<Engine>,
    pub inbox: &'a Arc<Inbox>,
    pub workers: &'a Workers,
    pub me: ConnRef,
    pub max_frame: usize,
    /// The most bytes of records one `Read` answer may carry now (less when the answers all
    /// connections hold unsent are at their cap); at least one record is always sent.
    pub read_answer_bytes: usize,
    /// The unsent answers of all connections are at their cap: a connection holding more than
    /// a small reserve of its own handles nothing until they are out.
    pub output_at_cap: bool,
    pub ring_bytes: usize,
    pub net: &'a NetStats,
    pub boards: &'a super::ring_conn::Boards,
}

/// Most bytes of answers buffered for a connection before it stops handling requests (a client
/// that pipelines and does not read its answers). One answer may take it past this by at most
/// its own size, which `Read`'s clamp ([`Ctx::read_answer_bytes`]) bounds.
pub(crate) const MAX_PENDING_OUTPUT: usize = 2 << 20;
/// Unsent answer bytes a connection may hold and still be served while all connections' are at
/// their cap (`--output-bytes`).
pub(crate) const OUTPUT_RESERVE: usize = 64 << 10;
/// Sent bytes at the front of the answer buffer past which, when they are at least half of it,
/// they are dropped (the unsent rest moves to the front: a copy no larger than what was sent).
pub(crate) const COMPACT_AFTER: usize = 64 << 10;
/// An emptied answer buffer keeps at most this capacity (a larger one is freed).
const KEPT_OUTPUT_CAPACITY: usize = 64 << 10;

pub(crate) struct Conn {
    pub serial: u64,
    pub stream: Stream,
    pub peer: String,
    pub phase: Phase,
    /// The role it was admitted with (what it counts against), once admitted.
    pub admitted: Option<Role>,
    /// Who it proved to be (set by the loop at its Hello; Unix peers are `Local`).
    pub identity: Identity,
    /// What its creations and its logs' bytes are charged to; `None` for an administrator
    /// (set with `identity`).
    pub credential: Option<Credential>,
    /// Received bytes not yet handled, from `rpos` on.
    rbuf: Vec<u8>,
    rpos: usize,
    /// Answers not yet sent, from `wpos` on.
    wbuf: Vec<u8>,
    wpos: usize,
    /// Descriptors to send with the answer that starts at this offset of `wbuf`.
    fds: Option<(usize, Vec<OwnedFd>)>,
    /// Log handles: index = handle; `None` once closed (numbers are not reused).
    pub handles: Vec<Option<LogId>>,
    pub waiting: Option<Waiting>,
    /// The socket may hold bytes not read yet (reading stopped early).
    pub unread: bool,
    /// The peer closed its end: answer what it sent, then close.
    pub peer_closed: bool,
    /// Handling stopped at [`MAX_PENDING_OUTPUT`]: once the answers are out, the loop must
    /// hand the connection its turn again (no new bytes may arrive to trigger it).
    pub output_full: bool,
    /// Since when the bytes held are the beginning of a frame that has not arrived whole (the
    /// loop closes a connection that keeps one past the frame timeout).
    pub partial_since: Option<Instant>,
    /// Bytes arrived from the peer (a connection attempt that sent nothing is evicted first
    /// when handshake slots run out).
    heard: bool,
    /// When the unsent answers last moved: a byte went out, or an answer was added to none.
    output_moved_at: Instant,
    /// Bytes of records a `Read` handed to a worker may answer with: counted as this
    /// connection's output from the moment the read is handed out, so that reads queued behind
    /// the workers cannot promise more than the output cap between them.
    read_promised: usize,
    /// The peer's IP address (TCP), for the per-address limit on handshakes.
    pub peer_ip: Option<std::net::IpAddr>,
    pub accepted_at: Instant,
    pub last_request: Instant,
    pub ring: Option<RingConn>,
}

fn error_body(error: &Error) -> ResponseBody {
    ResponseBody::Error {
        code: error.code(),
        message: error.to_string(),
    }
}

/// About how many bytes `body` takes encoded, a little more rather than less, for the answers
/// that can be large (records); 0 for the others (small: the buffer grows as they need).
fn encoded_size_hint(body: &ResponseBody) -> usize {
    match body {
        // Each record: its bytes, their length's header, its LSN and the pair's header; then
        // the frame's header and the variant's name and fields.
        ResponseBody::Records { records, .. } => {
            records.iter().map(|(_, p)| p.0.len() + 16).sum::<usize>() + 64
        }
        _ => 0,
    }
}

impl Conn {
    pub fn new(serial: u64, stream: Stream) -> Conn {
        let now = Instant::now();
        // Until authenticated at its Hello, a TCP peer may do no more than a client; a Unix
        // peer is an administrator only if it runs as the daemon's user or root.
        let identity = match stream.peer_uid() {
            Some(uid) => Identity::of_local_user(uid),
            None => Identity::Client,
        };
        let credential = match (stream.peer_uid(), identity) {
            (Some(uid), Identity::Client) => Some(Credential::uid(uid)),
            // A TCP peer's is set at its Hello, once it proved who it is.
            _ => None,
        };
        let peer_ip = stream.peer_ip();
        Conn {
            serial,
            peer: stream.peer(),
            peer_ip,
            stream,
            identity,
            credential,
            phase: Phase::Handshake,
            admitted: None,
            rbuf: Vec::new(),
            rpos: 0,
            wbuf: Vec::new(),
            wpos: 0,
            fds: None,
            handles: Vec::new(),
            waiting: None,
            unread: false,
            peer_closed: false,
            output_full: false,
            partial_since: None,
            read_promised: 0,
            output_moved_at: now,
            heard: false,
            accepted_at: now,
            last_request: now,
            ring: None,
        }
    }

    /// A connection the TCP gate hands over: `first` is what it received (its Hello's bytes),
    /// and the stream may hold more (TLS plaintext already decrypted): read it once.
    pub fn arrived_with(&mut self, first: Vec<u8>, accepted_at: Instant) {
        debug_assert!(self.rbuf.is_empty());
        self.accepted_at = accepted_at;
        if !first.is_empty() {
            self.heard = true;
            self.unread = true;
            self.rbuf = first;
        }
    }

    /// Received bytes not yet handled (counted against the loop's cap).
    pub fn held_bytes(&self) -> usize {
        self.rbuf.len() - self.rpos
    }

    /// Answer bytes not yet sent.
    pub fn pending_output(&self) -> usize {
        self.wbuf.len() - self.wpos
    }

    /// How long answers have waited here without a byte of them going out; `None` while none
    /// waits. Answers wait here only once the socket's own buffer is full: the client has
    /// left that much unread too.
    pub fn output_stalled_for(&self, now: Instant) -> Option<std::time::Duration> {
        (self.pending_output() > 0).then(|| now.duration_since(self.output_moved_at))
    }

    /// Capacity of the connection's buffers (what closing it, or emptying them, gives back).
    pub fn buffer_capacity(&self) -> usize {
        self.rbuf.capacity() + self.wbuf.capacity()
    }

    /// What this connection counts against the loop's output cap: its unsent answers and what
    /// a read out at a worker may still add.
    pub fn output_charge(&self) -> usize {
        self.pending_output() + self.read_promised
    }

    /// Whether the peer has sent anything at all (TLS handshake bytes included), read yet or
    /// still waiting in the socket (peeked at: a connection accepted in the same turn as the
    /// ones it is weighed against has not been read yet).
    pub fn has_spoken(&mut self) -> bool {
        if self.heard || matches!(&self.stream, Stream::Tls(s) if s.heard()) {
            return true;
        }
        let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
        let mut byte = [0u8; 1];
        self.heard =
            matches!(rustix::net::recv(self.stream.fd(), &mut byte, flags), Ok((n, _)) if n > 0);
        self.heard
    }

    /// Reads what the socket has, up to `budget` bytes, through `scratch`. Returns the bytes
    /// read, or `Err` when the peer closed or the socket failed.
    pub fn read_some(&mut self, scratch: &mut [u8], budget: usize) -> io::Result<usize> {
        let mut total = 0;
        self.unread = false;
        while total < budget {
            let want = scratch.len().min(budget - total);
            match self.stream.read(&mut scratch[..want]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    if self.rpos > 0 && self.rpos == self.rbuf.len() {
                        self.rbuf.clear();
                        self.rpos = 0;
                    }
                    self.rbuf.extend_from_slice(&scratch[..n]);
                    self.heard = true;
                    total += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(total),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.unread = true;
        Ok(total)
    }

    /// Sends what it can of the pending answers. `Ok(true)`: all sent (TLS records included).
    pub fn flush(&mut self) -> io::Result<bool> {
        if !self.stream.flush_pending()? {
            return Ok(false);
        }
        while self.wpos < self.wbuf.len() {
            let written = match &mut self.fds {
                Some((at, fds)) if *at == self.wpos => {
                    let sent =
                        super::send_with_fds(self.stream.fd(), &self.wbuf[self.wpos..], fds)?;
                    if sent.is_some() {
                        self.fds = None;
                    }
                    sent
                }
                Some((at, _)) => self.stream.write_some(&self.wbuf[self.wpos..*at])?,
                None => self.stream.write_some(&self.wbuf[self.wpos..])?,
            };
            match written {
                Some(n) => {
                    self.wpos += n;
                    self.output_moved_at = Instant::now();
                }
                None => {
                    self.compact_output();
                    return Ok(false);
                }
            }
        }
        self.wbuf.clear();
        self.wpos = 0;
        if self.wbuf.capacity() > KEPT_OUTPUT_CAPACITY {
            self.wbuf = Vec::new();
        }
        self.stream.flush_pending()
    }

    /// Drops the sent bytes from the front of the answer buffer once they are most of it.
    fn compact_output(&mut self) {
        if self.wpos < COMPACT_AFTER || self.wpos < self.wbuf.len() / 2 {
            return;
        }
        self.wbuf.drain(..self.wpos);
        if let Some((at, _)) = &mut self.fds {
            debug_assert!(*at >= self.wpos, "descriptors go with an unsent answer");
            *at -= self.wpos;
        }
        self.wpos = 0;
        // The capacity follows what is held (with room to grow by half), not what once was.
        let keep = (self.wbuf.len() + self.wbuf.len() / 2).max(KEPT_OUTPUT_CAPACITY);
        self.wbuf.shrink_to(keep);
    }

    fn answer(&mut self, id: u64, body: ResponseBody) {
        // A commit in doubt: this node is no longer the primary it was. The connection closes
        // after the answer, so that the client's next call (its `resolve`) finds the current
        // primary instead of asking this node's history again.
        if matches!(
            body,
            ResponseBody::Error {
                code: ErrorCode::InDoubt,
                ..
            }
        ) {
            self.phase = Phase::Closing;
        }
        if self.pending_output() == 0 {
            // Nothing was waiting to go out: the clock of this answer starts now.
            self.output_moved_at = Instant::now();
        }
        // Room for a large answer is made once, at its size: grown while encoding, the buffer
        // doubled up to twice the answer and left each smaller copy to the allocator.
        self.wbuf.reserve_exact(encoded_size_hint(&body));
        let response = Response { id, body };
        if let Err(e) = frame::encode(&response, &mut self.wbuf) {
            let fallback = Response {
                id,
                body: ResponseBody::Error {
                    code: ErrorCode::BadRequest,
                    message: format!("the answer could not be encoded: {e}"),
                },
            };
            frame::encode(&fallback, &mut self.wbuf).expect("a short error always encodes");
        }
    }

    /// Answers a request whose answer arrived through the inbox, and lets the connection go on.
    pub fn finish(&mut self, id: u64, result: Result<ResponseBody, Error>) {
        self.waiting = None;
        self.read_promised = 0;
        match result {
            Ok(body) => self.answer(id, body),
            Err(error) => self.answer(id, error_body(&error)),
        }
    }

    /// Answers with an error and closes (after the answer is sent).
    pub fn refuse(&mut self, code: ErrorCode, message: String) {
        self.answer(0, ResponseBody::Error { code, message });
        self.phase = Phase::Closing;
    }

    /// The loop admitted the Hello of request `id`.
    pub fn admit(&mut self, id: u64, role: Role) {
        self.phase = Phase::Ready(role);
        self.admitted = Some(role);
        self.answer(
            id,
            ResponseBody::Welcome {
                version: PROTOCOL_VERSION,
                server: format!("stela {}", env!("CARGO_PKG_VERSION")),
            },
        );
    }

    /// Handles buffered requests until one waits, none is complete, or the connection must
    /// close.
    pub fn process(&mut self, ctx: &Ctx<'_>) -> Progress {
        if let Some(Waiting::Space { .. }) = &self.waiting {
            let Some(Waiting::Space { request, answered }) = self.waiting.take() else {
                unreachable!()
            };
            match self.handle(ctx, request, answered) {
                Progress::Idle => {}
                other => return other,
            }
        }
        loop {
            if self.waiting.is_some() {
                return Progress::Waiting;
            }
            if self.phase == Phase::Closing {
                return Progress::Close;
            }
            let pending = self.pending_output();
            if pending > MAX_PENDING_OUTPUT || (ctx.output_at_cap && pending > OUTPUT_RESERVE) {
                self.output_full = true;
                return Progress::Idle;
            }
            // Before its Hello a peer has proved nothing: it may not announce more than a Hello.
            let limit = match self.phase {
                Phase::Handshake => stela_proto::MAX_HELLO_FRAME_BYTES,
                _ => ctx.max_frame,
            };
            let request = match self.next_frame(limit) {
                None if self.peer_closed => {
                    if self.held_bytes() > 0 {
                        self.refuse(
                            ErrorCode::BadFrame,
                            "the connection ended inside a frame".into(),
                        );
                    }
                    self.phase = Phase::Closing;
                    return Progress::Close;
                }
                None => {
                    self.compact();
                    if self.held_bytes() == 0 {
                        self.partial_since = None;
                    } else if self.partial_since.is_none() {
                        self.partial_since = Some(Instant::now());
                    }
                    return Progress::Idle;
                }
                Some(Ok(request)) => {
                    self.partial_since = None;
                    request
                }
                Some(Err(error)) => {
                    tracing::debug!(peer = %self.peer, %error, "bad frame; closing the connection");
                    self.refuse(
                        ErrorCode::BadFrame,
                        format!("{error}; closing the connection"),
                    );
                    return Progress::Close;
                }
            };
            self.last_request = Instant::now();
            if self.phase == Phase::Handshake {
                return match request.body {
                    RequestBody::Hello {
                        version,
                        role,
                        token,
                        ..
                    } if version == PROTOCOL_VERSION => Progress::Hello(request.id, role, token),
                    RequestBody::Hello { version, .. } => {
                        self.refuse(
                            ErrorCode::UnsupportedVersion,
                            format!(
                                "this daemon speaks protocol {PROTOCOL_VERSION}, not {version}"
                            ),
                        );
                        Progress::Close
                    }
                    _ => {
                        self.refuse(
                            ErrorCode::BadRequest,
                            "the first request must be Hello".into(),
                        );
                        Progress::Close
                    }
                };
            }
            match self.handle(ctx, request, false) {
                Progress::Idle => {}
                other => return other,
            }
        }
    }

    /// The next complete request in the buffer, if there is one.
    fn next_frame(&mut self, limit: usize) -> Option<Result<Request, frame::FrameError>> {
        let available = &self.rbuf[self.rpos..];
        let header: [u8; FRAME_HEADER_BYTES] =
            available.get(..FRAME_HEADER_BYTES)?.try_into().ok()?;
        let header = match frame::parse_header(header, limit) {
            Ok(header) => header,
            Err(error) => return Some(Err(error)),
        };
        let end = FRAME_HEADER_BYTES + header.body_len;
        let body = available.get(FRAME_HEADER_BYTES..end)?;
        let decoded = frame::decode_body::<Request>(header, body);
        self.rpos += end;
        Some(decoded)
    }

    /// Gives back the memory of handled bytes.
    fn compact(&mut self) {
        if self.rpos == self.rbuf.len() {
            self.rbuf.clear();
            self.rpos = 0;
            if self.rbuf.capacity() > 64 << 10 {
                self.rbuf = Vec::new();
            }
        } else if self.rpos > self.rbuf.len() / 2 {
            self.rbuf.drain(..self.rpos);
            self.rpos = 0;
        }
    }

    fn log(&self, handle: u32) -> Result<LogId, Error> {
        self.handles
            .get(handle as usize)
            .copied()
            .flatten()
            .ok_or(Error::UnknownHandle(handle))
    }

    /// A `disk` waiter that answers request `id` through the inbox.
    fn waiter(
        ctx: &Ctx<'_>,
        id: u64,
        body: ResponseBody,
        log_name: String,
        level: Durability,
    ) -> Waiter {
        let (inbox, me, engine) = (Arc::clone(ctx.inbox), ctx.me, Arc::clone(ctx.engine));
        Box::new(move |outcome| {
            if outcome.is_ok() {
                engine.metrics.acked(level);
            }
            let result = outcome
                .map(|()| body)
                .map_err(|e| Error::from_pool(&log_name, e));
            let answer = Event::Answer(Box::new(Answer {
                conn: me,
                id,
                result,
                effect: Effect::None,
            }));
            inbox.push_quiet(answer);
        })
    }

    /// Runs `job` on a worker; its result answers request `id`.
    fn hand_to_worker(
        &mut self,
        ctx: &Ctx<'_>,
        id: u64,
        job: impl FnOnce(&Engine) -> (Result<ResponseBody, Error>, Effect) + Send + 'static,
    ) -> Progress {
        self.hand_to_lane(ctx, id, false, job)
    }

    /// Runs `job` on a worker, in the bulk lane (a read of records: behind every other job)
    /// or not; its result answers request `id`.
    fn hand_to_lane(
        &mut self,
        ctx: &Ctx<'_>,
        id: u64,
        bulk: bool,
        job: impl FnOnce(&Engine) -> (Result<ResponseBody, Error>, Effect) + Send + 'static,
    ) -> Progress {
        let (engine, inbox, me) = (Arc::clone(ctx.engine), Arc::clone(ctx.inbox), ctx.me);
        self.waiting = Some(Waiting::Answer);
        let submit = if bulk {
            Workers::submit_bulk
        } else {
            Workers::submit
        };
        submit(
            ctx.workers,
            Box::new(move || {
                let (result, effect) = job(&engine);
                inbox.post(Event::Answer(Box::new(Answer {
                    conn: me,
                    id,
                    result,
                    effect,
                })));
            }),
        );
        Progress::Waiting
    }

    /// Waits until `lsn` of `log` is acknowledged at `level` (`disk`, `replicated`, `all`),
    /// then answers `id` with `body`.
    fn after_durable(
        &mut self,
        ctx: &Ctx<'_>,
        id: u64,
        (log, lsn, level): (LogId, u64, Durability),
        body: ResponseBody,
    ) -> Progress {
        let name = ctx.engine.log_name(log);
        let waiter = Self::waiter(ctx, id, body.clone(), name, level);
        match ctx.engine.when_acked(log, lsn, level, waiter) {
            Ok(true) => {
                ctx.engine.metrics.acked(level);
                self.answer(id, body);
                Progress::Idle
            }
            Ok(false) => {
                self.waiting = Some(Waiting::Answer);
                Progress::Waiting
            }
            Err(error) => {
                self.answer(id, error_body(&error));
                Progress::Idle
            }
        }
    }

    /// Handles one request of a handshaken connection.
    fn handle(&mut self, ctx: &Ctx<'_>, request: Request, answered: bool) -> Progress {
        let Request { id, body } = request;
        if let Some(refusal) = self.refusal(&body) {
            return self.reply(id, Err(refusal));
        }
        if let RequestBody::Append { durability, .. } | RequestBody::Commit { durability, .. } =
            &body
        {
            ctx.engine.metrics.requested(*durability);
        }
        match body {
            RequestBody::Hello { .. } => {
                self.reply(id, Err(Error::BadRequest("Hello was already sent".into())))
            }
            open @ RequestBody::Open { .. } => self.open(ctx, id, open),
            append @ RequestBody::Append { .. } => {
                self.append(ctx, Request { id, body: append }, answered)
            }
            RequestBody::Commit {
                handle,
                lsn,
                durability,
            } => self.commit(ctx, id, (handle, lsn, durability)),
            read @ RequestBody::Read { .. } => self.read(ctx, id, read),
            RequestBody::Truncate { handle, before } => match self.log(handle) {
                Ok(log) => self.hand_to_worker(ctx, id, move |engine| {
                    let result = engine
                        .truncate(log, before)
                        .map(|segments| ResponseBody::Truncated { segments });
                    (result, Effect::None)
                }),
                Err(error) => self.reply(id, Err(error)),
            },
            RequestBody::Positions { handle } => {
                let result = self
                    .log(handle)
                    .map(|log| ResponseBody::Positions(ctx.engine.positions(log)));
                self.reply(id, result)
            }
            RequestBody::History { handle } => {
                let result = self.log(handle).and_then(|log| {
                    let history = ctx.engine.history(log)?;
                    Ok(ResponseBody::History {
                        entries: history.entries,
                        last_lsn: history.protected,
                        log_end: Some(history.end),
                    })
                });
                self.reply(id, result)
            }
            RequestBody::Close { handle } => match self.log(handle) {
                Ok(log) => {
                    self.handles[handle as usize] = None;
                    self.hand_to_worker(ctx, id, move |engine| {
                        engine.release(log);
                        (Ok(ResponseBody::Closed), Effect::None)
                    })
                }
                Err(error) => self.reply(id, Err(error)),
            },
            RequestBody::MapRing { data_bytes } => {
                let result = self.map_ring(ctx, data_bytes);
                self.reply(id, result)
            }
            RequestBody::Status => {
                let status = ctx.engine.status(ctx.net);
                self.reply(id, Ok(ResponseBody::Status(Box::new(status))))
            }
            RequestBody::PowerFail => self.hand_to_worker(ctx, id, |engine| {
                (
                    Ok(ResponseBody::PowerFailed(engine.power_fail())),
                    Effect::None,
                )
            }),
            RequestBody::Switchover { to, within_ms } => {
                self.hand_to_worker(ctx, id, move |engine| {
                    let within = std::time::Duration::from_millis(within_ms);
                    let answer = engine.switchover(&to, within);
                    (
                        answer.map(|epoch| ResponseBody::SwitchedOver { epoch, to }),
                        Effect::None,
                    )
                })
            }
            RequestBody::PowerRestore => {
                ctx.engine.power_restore();
                self.reply(id, Ok(ResponseBody::PowerRestored))
            }
            directory @ (RequestBody::ListLogs
            | RequestBody::DeleteLog { .. }
            | RequestBody::ReleaseHold { .. }) => self.change_directory(ctx, id, directory),
            backup @ (RequestBody::BackupLog { .. } | RequestBody::ReadLogFile { .. }) => {
                self.backup(ctx, id, backup)
            }
        }
    }

    /// Answers a request handled here and now (on the loop): the connection stays idle.
    fn reply(&mut self, id: u64, result: Result<ResponseBody, Error>) -> Progress {
        match result {
            Ok(body) => self.answer(id, body),
            Err(error) => self.answer(id, error_body(&error)),
        }
        Progress::Idle
    }

    /// Why this connection may not send `body`, if it may not: an administrative request needs
    /// an administrator's identity. Both the refusal and the admission are logged (at warn, so
    /// the default filter keeps them: such a request halts or changes what others rely on).
    fn refusal(&self, body: &RequestBody) -> Option<Error> {
        let what = auth::administrative(body)?;
        if !self.identity.may_administer() {
            tracing::warn!(peer = %self.peer, identity = self.identity.name(), request = what,
                "administrative request refused: not authenticated as an administrator");
            return Some(Error::Forbidden {
                request: what,
                peer: self.peer.clone(),
            });
        }
        if what == auth::BACKUP_READ {
            // One per MiB of a backup over the network: its `backup` request was logged.
            tracing::debug!(peer = %self.peer, identity = self.identity.name(), request = what,
                "administrative request");
            return None;
        }
        tracing::warn!(peer = %self.peer, identity = self.identity.name(), request = what,
            "administrative request");
        None
    }

    /// An open: a default level this daemon cannot serve is refused now, not at the first
    /// commit; the open itself (it may create files) goes to a worker.
    fn open(&mut self, ctx: &Ctx<'_>, id: u64, open: RequestBody) -> Progress {
        let RequestBody::Open {
            log,
            codec,
            type_tag,
            create,
            durability,
            schema,
        } = open
        else {
            unreachable!("open() is given opens")
        };
        if let Some(Err(error)) = durability.map(|d| ctx.engine.check_level(d)) {
            return self.reply(id, Err(error));
        }
        let owner = self.credential.clone();
        self.hand_to_worker(ctx, id, move |engine| {
            match engine.open(&log, &codec, &type_tag, create, owner.as_ref()) {
                Ok(opened) => {
                    if let Some(schema) = &schema {
                        engine.keep_schema(&opened, schema);
                    }
                    (
                        Ok(ResponseBody::Opened {
                            handle: 0, // set by the loop when it adds the handle
                            positions: opened.positions,
                            max_record_bytes: opened.max_record_bytes as u32,
                            term: opened.term,
                        }),
                        Effect::Opened(opened),
                    )
                }
                Err(error) => (Err(error), Effect::None),
            }
        })
    }

    /// A commit: answered now when its level asks no wait (or nothing was appended), else once
    /// the records up to `lsn` reach that level.
    fn commit(
        &mut self,
        ctx: &Ctx<'_>,
        id: u64,
        (handle, lsn, durability): (u32, u64, Durability),
    ) -> Progress {
        let checked = self
            .log(handle)
            .and_then(|log| ctx.engine.check_level(durability).map(|()| log))
            .and_then(|log| ctx.engine.check_appended(log, lsn).map(|()| log));
        match checked {
            Ok(log) if Engine::waits(durability) && lsn > 0 => self.after_durable(
                ctx,
                id,
                (log, lsn, durability),
                ResponseBody::Committed { lsn },
            ),
            Ok(_) => {
                ctx.engine.metrics.acked(durability);
                self.reply(id, Ok(ResponseBody::Committed { lsn }))
            }
            Err(error) => self.reply(id, Err(error)),
        }
    }

    /// A read: answered from memory when it can be, else handed to a worker that waits for the
    /// records (the bytes it may answer with are promised to it meanwhile).
    fn read(&mut self, ctx: &Ctx<'_>, id: u64, read: RequestBody) -> Progress {
        let RequestBody::Read {
            handle,
            from,
            max_records,
            max_bytes,
        } = read
        else {
            unreachable!("read() is given reads")
        };
        let max_records = max_records.clamp(1, 1 << 20) as usize;
        let max_bytes = (max_bytes as usize).clamp(1, ctx.read_answer_bytes.max(1));
        let log = match self.log(handle) {
            Ok(log) => log,
            Err(error) => return self.reply(id, Err(error)),
        };
        match ctx.engine.read(log, from, max_records, max_bytes, false) {
            Ok(Some(body)) => self.reply(id, Ok(body)),
            Ok(None) => {
                self.read_promised = max_bytes;
                self.hand_to_lane(ctx, id, true, move |engine| {
                    let result = engine
                        .read(log, from, max_records, max_bytes, true)
                        .map(|body| body.expect("a blocking read always answers"));
                    (result, Effect::None)
                })
            }
            Err(error) => self.reply(id, Err(error)),
        }
    }

    /// Listing the logs, deleting one, releasing a hold: each reads or changes the directory,
    /// so each runs off the event loop.
    fn change_directory(&mut self, ctx: &Ctx<'_>, id: u64, request: RequestBody) -> Progress {
        match request {
            RequestBody::ListLogs => self.hand_to_worker(ctx, id, move |engine| {
                (engine.list_logs().map(ResponseBody::Logs), Effect::None)
            }),
            RequestBody::DeleteLog { log } => self.hand_to_worker(ctx, id, move |engine| {
                let result =
                    engine
                        .delete_log(&log)
                        .map(|(segments, bytes)| ResponseBody::Deleted {
                            log,
                            segments,
                            bytes,
                        });
                (result, Effect::None)
            }),
            RequestBody::ReleaseHold { log, holder } => {
                self.hand_to_worker(ctx, id, move |engine| {
                    let result = engine
                        .release_hold(&log, &holder)
                        .map(|lsn| ResponseBody::HoldReleased { log, holder, lsn });
                    (result, Effect::None)
                })
            }
            _ => unreachable!("change_directory() is given directory requests"),
        }
    }

    /// A backup over the network (`engine::backup`): the hold and listing on a worker; a
    /// file's chunk in the bulk lane, like a read of records, its bytes promised meanwhile and
    /// clamped as a `Read` answer is.
    fn backup(&mut self, ctx: &Ctx<'_>, id: u64, request: RequestBody) -> Progress {
        match request {
            RequestBody::BackupLog {
                log,
                holder,
                last_in_files,
            } => self.hand_to_worker(ctx, id, move |engine| {
                (
                    engine.backup_log(&log, &holder, last_in_files),
                    Effect::None,
                )
            }),
            RequestBody::ReadLogFile {
                log,
                file,
                offset,
                max_bytes,
            } => {
                let max_bytes = (max_bytes as usize).clamp(1, ctx.read_answer_bytes.max(1));
                self.read_promised = max_bytes;
                self.hand_to_lane(ctx, id, true, move |engine| {
                    let result = engine.read_log_file(&log, &file, offset, max_bytes);
                    (result, Effect::None)
                })
            }
            _ => unreachable!("backup() is given backup requests"),
        }
    }

    /// An append: placed now, parked for space, or placed and then waited on for `disk`.
    fn append(&mut self, ctx: &Ctx<'_>, request: Request, answered: bool) -> Progress {
        let RequestBody::Append {
            handle,
            durability,
            records,
        } = &request.body
        else {
            unreachable!("append() is given appends")
        };
        let id = request.id;
        let log = match self
            .log(*handle)
            .and_then(|log| ctx.engine.check_level(*durability).map(|()| log))
        {
            Ok(log) => log,
            Err(error) => {
                self.answer(id, error_body(&error));
                return Progress::Idle;
            }
        };
        let durability = *durability;
        if durability == Durability::Unsafe && !answered {
            // Acknowledged on receipt, before the records are placed: the answer goes out even
            // if they then have to wait for space (or are refused).
            ctx.engine.metrics.acked(Durability::Unsafe);
            self.answer(
                id,
                ResponseBody::Appended {
                    first_lsn: 0,
                    last_lsn: 0,
                },
            );
        }
        let placed = {
            let records: Vec<Record<'_>> = records
                .iter()
                .map(|p: &Payload| Record::new(&p.0))
                .collect();
            ctx.engine.append(log, &records)
        };
        match placed {
            Err(Error::NoSpace) => {
                self.waiting = Some(Waiting::Space {
                    request,
                    answered: answered || durability == Durability::Unsafe,
                });
                Progress::Waiting
            }
            Err(error) if durability == Durability::Unsafe => {
                tracing::debug!(peer = %self.peer, %error, "unsafe append refused after its acknowledgement");
                Progress::Idle
            }
            Err(error) => {
                self.answer(id, error_body(&error));
                Progress::Idle
            }
            Ok(_) if durability == Durability::Unsafe => Progress::Idle,
            Ok((first, last)) => {
                let body = ResponseBody::Appended {
                    first_lsn: first,
                    last_lsn: last,
                };
                if Engine::waits(durability) && last >= first {
                    self.after_durable(ctx, id, (log, last, durability), body)
                } else {
                    ctx.engine.metrics.acked(durability);
                    self.answer(id, body);
                    Progress::Idle
                }
            }
        }
    }

    /// Gives the connection a shared-memory ring; the answer carries its descriptors.
    fn map_ring(&mut self, ctx: &Ctx<'_>, data_bytes: u32) -> Result<ResponseBody, Error> {
        if !self.stream.is_unix() {
            return Err(Error::BadRequest(
                "a shared-memory ring needs a Unix socket (the client is on another machine)"
                    .into(),
            ));
        }
        if self.ring.is_some() {
            return Err(Error::BadRequest(
                "this connection already has a ring".into(),
            ));
        }
        let data_bytes = if data_bytes == 0 {
            ctx.ring_bytes
        } else {
            data_bytes as usize
        };
        let uid = self.stream.peer_uid();
        let seat = ctx.me.slot as u32;
        let created = RingConn::create(data_bytes, ctx.boards, uid, seat);
        let (ring, fds, answer) = created.map_err(|source| Error::Io {
            what: "creating a shared-memory ring".into(),
            source,
        })?;
        self.ring = Some(ring);
        // The descriptors go with the first byte of this answer.
        self.fds = Some((self.wbuf.len(), fds));
        Ok(answer)
    }

    /// The log handle the loop adds once a worker opened the log.
    pub fn add_handle(&mut self, log: LogId) -> u32 {
        self.handles.push(Some(log));
        (self.handles.len() - 1) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A large answer takes its own size in the buffer, not the power of two above it.
    #[test]
    fn a_large_answer_is_buffered_at_its_size() {
        let (daemon_end, _client_end) = std::os::unix::net::UnixStream::pair().unwrap();
        daemon_end.set_nonblocking(true).unwrap();
        let mut conn = Conn::new(1, Stream::Unix(mio::net::UnixStream::from_std(daemon_end)));
        let records: Vec<(u64, Payload)> = (1..=15)
            .map(|lsn| (lsn, Payload(vec![7u8; 66_000])))
            .collect();
        conn.answer(
            9,
            ResponseBody::Records {
                records,
                next: 16,
                at_end: false,
            },
        );
        let (len, capacity) = (conn.wbuf.len(), conn.wbuf.capacity());
        assert!(len > 15 * 66_000, "{len}");
        assert!(
            capacity <= len + (4 << 10),
            "{capacity} B of buffer for a {len}-B answer"
        );
    }

    /// A peer that takes its answers about as fast as they are added: the buffer never
    /// empties, and must still hold only what is unsent (not all that was ever sent).
    #[test]
    fn an_answer_buffer_that_never_empties_holds_only_its_unsent_bytes() {
        let (daemon_end, client_end) = std::os::unix::net::UnixStream::pair().unwrap();
        daemon_end.set_nonblocking(true).unwrap();
        let mut client_end = client_end;
        client_end.set_nonblocking(true).unwrap();
        let stream = Stream::Unix(mio::net::UnixStream::from_std(daemon_end));
        let mut conn = Conn::new(1, stream);
        let answer = ResponseBody::Error {
            code: ErrorCode::BadRequest,
            message: "x".repeat(256 << 10),
        };
        let mut scratch = vec![0u8; 256 << 10];
        let mut largest = 0;
        conn.answer(0, answer.clone()); // the lead that keeps it from emptying
        for id in 1..200 {
            conn.answer(id, answer.clone());
            // Takes as many bytes as one answer adds, as the socket lets them through.
            let mut taken = 0;
            while taken < (256 << 10) {
                conn.flush().unwrap();
                match client_end.read(&mut scratch[..(256 << 10) - taken]) {
                    Ok(n) => taken += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            largest = largest.max(conn.wbuf.len()).max(conn.wbuf.capacity());
        }
        assert!(
            conn.pending_output() > 0,
            "the buffer was meant never to empty"
        );
        assert!(
            largest <= 4 << 20,
            "the answer buffer grew to {largest} B for answers of 256 KiB ({} B unsent)",
            conn.pending_output()
        );
    }
}
