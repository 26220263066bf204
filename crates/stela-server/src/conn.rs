//! One client connection: reads framed requests, answers each in order, and never lets a bad
//! frame reach anything but this connection.
//!
//! Invariants: the first request must be `Hello` with our protocol version; a frame that is too
//! large, fails its checksum or does not decode gets one `Error { BadFrame }` answer and the
//! connection is closed (after a bad frame the stream has no trustworthy boundary); a request
//! that is well formed but wrong (unknown handle, record too large, ...) gets an error answer and
//! the connection goes on. A first request that is not a Hello of our version is answered and
//! the connection closed. Answers to pipelined requests are written together once the socket
//! has no more requests waiting, so a client that pipelines gets batched replies.

use crate::pool::{LogId, PoolError, PoolRead};
use crate::server::Shared;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::Arc;
use stela_proto::frame::{self, FrameError, FRAME_HEADER_BYTES};
use stela_proto::{
    Durability, ErrorCode, Payload, Positions, Request, RequestBody, Response, ResponseBody,
    PROTOCOL_VERSION,
};
use stela_wal::Lsn;

/// Serves one connection until the client closes it, a bad frame arrives, or the daemon stops.
pub fn serve<R: Read, W: Write>(shared: &Arc<Shared>, read: R, mut write: W) {
    let mut reader = BufReader::with_capacity(64 << 10, read);
    let mut connection = Connection {
        shared: Arc::clone(shared),
        hello: false,
        handles: Vec::new(),
    };
    let mut body = Vec::new();
    let mut out = Vec::with_capacity(4096);
    let limit = shared.max_frame_bytes;
    loop {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        match read_frame_header(&mut reader, &mut header) {
            Ok(true) => {}
            Ok(false) | Err(_) => break,
        }
        let decoded = frame::parse_header(header, limit).and_then(|h| {
            body.resize(h.body_len, 0);
            reader.read_exact(&mut body).map_err(|e| {
                FrameError::BadMessage(format!("connection ended inside a frame: {e}"))
            })?;
            frame::decode_body::<Request>(h, &body)
        });
        let request = match decoded {
            Ok(request) => request,
            Err(error) => {
                tracing::debug!(%error, "bad frame; closing the connection");
                let answer = Response {
                    id: 0,
                    body: ResponseBody::Error {
                        code: ErrorCode::BadFrame,
                        message: format!("{error}; closing the connection"),
                    },
                };
                let _ = frame::encode(&answer, &mut out);
                let _ = write.write_all(&out);
                break;
            }
        };
        if body.capacity() > 4 << 20 {
            body = Vec::new(); // do not keep one huge batch's buffer for the connection's life
        }
        let id = request.id;
        let deferred = connection.handle(request, &mut out);
        if !connection.hello {
            // No valid Hello first (another request, or another protocol version): answer, then
            // close, since nothing else this peer sends can be understood.
            let _ = write.write_all(&out);
            break;
        }
        if let Some(append) = deferred {
            // `unsafe`: the answer leaves before the record is placed, as if acknowledged on
            // receipt; the record still goes through the pool like any other.
            if write.write_all(&out).is_err() {
                break;
            }
            out.clear();
            if let Err(error) = connection.place(append.0, &append.1) {
                tracing::debug!(id, %error, "unsafe append failed after its acknowledgement");
            }
            continue;
        }
        if reader.buffer().is_empty() {
            if write.write_all(&out).is_err() {
                break;
            }
            out.clear();
        }
    }
}

/// Reads the 8-byte header; `Ok(false)` on a clean end of stream before it.
fn read_frame_header(reader: &mut impl BufRead, header: &mut [u8]) -> io::Result<bool> {
    if reader.fill_buf()?.is_empty() {
        return Ok(false);
    }
    reader.read_exact(header)?;
    Ok(true)
}

struct Connection {
    shared: Arc<Shared>,
    hello: bool,
    handles: Vec<LogId>,
}

/// An `unsafe` append to run after its answer is sent.
type Deferred = (LogId, Vec<Payload>);

fn error(code: ErrorCode, message: impl Into<String>) -> ResponseBody {
    ResponseBody::Error {
        code,
        message: message.into(),
    }
}

fn pool_error(e: PoolError) -> ResponseBody {
    let code = match e {
        PoolError::RecordTooLarge { .. } | PoolError::BatchTooLarge { .. } => {
            ErrorCode::RecordTooLarge
        }
        PoolError::PowerFailing => ErrorCode::PowerFailing,
        PoolError::ShuttingDown => ErrorCode::ShuttingDown,
        PoolError::Failed(_) => ErrorCode::Io,
        PoolError::NotAppended { .. } => ErrorCode::NotAppended,
    };
    error(code, e.to_string())
}

impl Connection {
    fn handle(&mut self, request: Request, out: &mut Vec<u8>) -> Option<Deferred> {
        let Request { id, body } = request;
        let mut deferred = None;
        let answer = if !self.hello {
            match body {
                RequestBody::Hello { version, .. } if version == PROTOCOL_VERSION => {
                    self.hello = true;
                    ResponseBody::Welcome {
                        version: PROTOCOL_VERSION,
                        server: format!("stela {}", env!("CARGO_PKG_VERSION")),
                    }
                }
                RequestBody::Hello { version, .. } => error(
                    ErrorCode::UnsupportedVersion,
                    format!("this daemon speaks protocol {PROTOCOL_VERSION}, not {version}"),
                ),
                _ => error(ErrorCode::BadRequest, "the first request must be Hello"),
            }
        } else {
            self.dispatch(body, &mut deferred)
        };
        let response = Response { id, body: answer };
        if let Err(e) = frame::encode(&response, out) {
            let fallback = Response {
                id,
                body: error(
                    ErrorCode::BadRequest,
                    format!("answer could not be encoded: {e}"),
                ),
            };
            frame::encode(&fallback, out).expect("a short error always encodes");
        }
        deferred
    }

    fn log(&self, handle: u32) -> Result<LogId, ResponseBody> {
        self.handles.get(handle as usize).copied().ok_or_else(|| {
            error(
                ErrorCode::UnknownHandle,
                format!("no log is open as handle {handle} on this connection"),
            )
        })
    }

    fn dispatch(&mut self, body: RequestBody, deferred: &mut Option<Deferred>) -> ResponseBody {
        let shared = Arc::clone(&self.shared);
        let result = (|| -> Result<ResponseBody, ResponseBody> {
            Ok(match body {
                RequestBody::Hello { .. } => {
                    return Err(error(ErrorCode::BadRequest, "Hello was already sent"))
                }
                RequestBody::Open {
                    log,
                    codec,
                    type_tag,
                    create,
                } => {
                    let (id, _) = shared
                        .logs
                        .open(&shared.pool, &log, &codec, &type_tag, create)
                        .map_err(|e| {
                            let code = match e {
                                crate::logs::OpenError::BadName(_)
                                | crate::logs::OpenError::Missing { .. } => ErrorCode::BadLogName,
                                _ => ErrorCode::OpenFailed,
                            };
                            error(code, e.to_string())
                        })?;
                    self.handles.push(id);
                    ResponseBody::Opened {
                        handle: (self.handles.len() - 1) as u32,
                        positions: shared.positions(id),
                        max_record_bytes: shared.max_record_bytes(id) as u32,
                    }
                }
                RequestBody::Append {
                    handle,
                    durability,
                    records,
                } => {
                    let log = self.log(handle)?;
                    check_level(durability)?;
                    if durability == Durability::Unsafe {
                        *deferred = Some((log, records));
                        return Ok(ResponseBody::Appended {
                            first_lsn: 0,
                            last_lsn: 0,
                        });
                    }
                    let (first, last) = self.place(log, &records).map_err(pool_error)?;
                    if durability == Durability::Disk && last >= first {
                        shared
                            .pool
                            .wait_durable_leading(log, last, |work| {
                                crate::flusher::write(&shared.logs, work)
                            })
                            .map_err(pool_error)?;
                    }
                    ResponseBody::Appended {
                        first_lsn: first,
                        last_lsn: last,
                    }
                }
                RequestBody::Commit {
                    handle,
                    lsn,
                    durability,
                } => {
                    let log = self.log(handle)?;
                    check_level(durability)?;
                    let (next, _) = shared.pool.positions(log);
                    if lsn >= next {
                        return Err(pool_error(PoolError::NotAppended { lsn, next }));
                    }
                    if durability == Durability::Disk && lsn > 0 {
                        shared
                            .pool
                            .wait_durable_leading(log, lsn, |work| {
                                crate::flusher::write(&shared.logs, work)
                            })
                            .map_err(pool_error)?;
                    }
                    ResponseBody::Committed { lsn }
                }
                RequestBody::Read {
                    handle,
                    from,
                    max_records,
                    max_bytes,
                } => {
                    let log = self.log(handle)?;
                    shared.read(
                        log,
                        from,
                        max_records.clamp(1, 1 << 20) as usize,
                        (max_bytes as usize).clamp(1, 16 << 20),
                    )?
                }
                RequestBody::Truncate { handle, before } => {
                    let log = self.log(handle)?;
                    let entry = shared.entry(log)?;
                    let segments = entry
                        .log
                        .truncate_before(Lsn::new(before))
                        .map_err(|e| error(ErrorCode::Io, e.to_string()))?;
                    ResponseBody::Truncated {
                        segments: segments as u64,
                    }
                }
                RequestBody::Positions { handle } => {
                    ResponseBody::Positions(shared.positions(self.log(handle)?))
                }
                RequestBody::Close { handle } => {
                    self.log(handle)?;
                    // Handles are indices; a closed one stays reserved so later numbers keep meaning.
                    ResponseBody::Closed
                }
                RequestBody::Status => ResponseBody::Status(Box::new(shared.status())),
                RequestBody::PowerFail => ResponseBody::PowerFailed(shared.power_fail()),
                RequestBody::PowerRestore => {
                    shared.power_restore();
                    ResponseBody::PowerRestored
                }
            })
        })();
        result.unwrap_or_else(|e| e)
    }

    fn place(&self, log: LogId, records: &[Payload]) -> Result<(u64, u64), PoolError> {
        let slices: Vec<&[u8]> = records.iter().map(|p| p.0.as_slice()).collect();
        self.shared.pool.append(log, &slices)
    }
}

fn check_level(durability: Durability) -> Result<(), ResponseBody> {
    match durability {
        Durability::Unsafe | Durability::Buffered | Durability::Disk => Ok(()),
        Durability::Replicated | Durability::All => Err(error(
            ErrorCode::Unsupported,
            format!("durability {durability} needs a standby, which this daemon does not have yet"),
        )),
    }
}

impl Shared {
    fn entry(&self, log: LogId) -> Result<Arc<crate::logs::LogEntry>, ResponseBody> {
        self.logs
            .get(log)
            .ok_or_else(|| error(ErrorCode::ShuttingDown, "the daemon is shutting down"))
    }

    pub(crate) fn positions(&self, log: LogId) -> Positions {
        let (next, durable) = self.pool.positions(log);
        let first = self
            .logs
            .get(log)
            .map_or(1, |entry| entry.log.first_lsn().get());
        Positions {
            first_lsn: first,
            last_lsn: next - 1,
            written_lsn: durable,
            durable_lsn: durable,
        }
    }

    pub(crate) fn max_record_bytes(&self, log: LogId) -> usize {
        let log_limit = self
            .logs
            .get(log)
            .map_or(0, |entry| entry.log.max_record_bytes());
        self.pool.config().max_record_bytes().min(log_limit)
    }

    fn read(
        &self,
        log: LogId,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<ResponseBody, ResponseBody> {
        let from = from.max(1);
        let (next, _) = self.pool.positions(log);
        let records: Vec<(u64, Payload)> = match self.pool.read(log, from, max_records, max_bytes) {
            PoolRead::Buffered(records) => {
                records.into_iter().map(|(l, p)| (l, Payload(p))).collect()
            }
            PoolRead::OnDisk => {
                let entry = self.entry(log)?;
                let reader = entry
                    .log
                    .read_from(Lsn::new(from))
                    .map_err(|e| error(ErrorCode::Io, e.to_string()))?;
                let mut out = Vec::new();
                let mut bytes = 0;
                for item in reader {
                    let (lsn, payload) = item.map_err(|e| error(ErrorCode::Io, e.to_string()))?;
                    if out.len() >= max_records
                        || (!out.is_empty() && bytes + payload.len() > max_bytes)
                    {
                        break;
                    }
                    bytes += payload.len();
                    out.push((lsn.get(), Payload(payload)));
                }
                // Go on into the buffers, so one read is not cut short at the durable LSN.
                if let Some(&(last, _)) = out.last() {
                    if out.len() < max_records && bytes < max_bytes {
                        if let PoolRead::Buffered(more) = self.pool.read(
                            log,
                            last + 1,
                            max_records - out.len(),
                            max_bytes - bytes,
                        ) {
                            out.extend(more.into_iter().map(|(l, p)| (l, Payload(p))));
                        }
                    }
                }
                if out.is_empty() {
                    // Nothing on disk at `from` (a gap below the first segment): go on from
                    // what the buffers hold.
                    let (_, durable) = self.pool.positions(log);
                    if let PoolRead::Buffered(records) =
                        self.pool.read(log, durable + 1, max_records, max_bytes)
                    {
                        out = records.into_iter().map(|(l, p)| (l, Payload(p))).collect();
                    }
                }
                out
            }
        };
        let next_lsn = records.last().map_or(from, |(lsn, _)| lsn + 1);
        Ok(ResponseBody::Records {
            at_end: next_lsn >= next,
            next: next_lsn,
            records,
        })
    }
}
