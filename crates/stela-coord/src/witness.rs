//! The built-in witness: a tiny arbiter for a pair of nodes, run on a third machine
//! (`stela witness`), and the client a node talks to it with.
//!
//! Invariants:
//! - **Recorded before answered.** A grant or an adopted epoch is written to `DIR/WITNESS`
//!   (`WITNESS.tmp`, fdatasync, rename, fsync of the directory) before the answer leaves; a
//!   witness that cannot write answers `Error` and grants nothing. A failed sync is not retried:
//!   the witness refuses every later change until restarted.
//! - **Never forgotten.** A damaged `WITNESS` stops the witness at start, naming the file; it is
//!   never read as "nothing held", which could grant an epoch twice.
//! - **Liveness on its own clock.** The holder's silence is measured on this process's monotonic
//!   clock from the last renewal it received (from its own start if none), so no clocks need
//!   agree, and a restarted witness waits a whole lease before it grants.
//! - **Bad input closes one connection**, never the witness; frames are bounded before their body
//!   is read.
//! - **Nothing is served before a Hello** ([`crate::gate`]): a new connection waits in a bounded
//!   table, read without blocking by the accept thread, until its Hello (at most 512 bytes,
//!   within the handshake deadline) proves it (a token, or a trusted local user); only then does
//!   it get a thread, and sessions are bounded too.
//!
//! File layout: `epoch` (u64 LE), holder length (u32 LE), holder (UTF-8), CRC32C of the above
//! (u32 LE).

use crate::coordinator::{
    CoordError, Coordinator, Election, Grant, Holder, LogPosition, Renewal, Report,
};
use crate::gate::{self, Limits, Refusal, Token, Waiting};
use crate::rules::{self, Ballot, Claim};
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
pub use stela_net::tls::Tokens;
use stela_proto::frame;
use stela_proto::witness::{
    WitnessRequest, WitnessResponse, MAX_WITNESS_FRAME_BYTES, MAX_WITNESS_HELLO_BYTES,
    WITNESS_VERSION,
};

const FILE: &str = "WITNESS";
const TEMP: &str = "WITNESS.tmp";

/// How the witness tells its nodes from anyone else who reaches its port.
#[derive(Clone, Debug)]
pub struct WitnessAuth {
    /// Tokens a node may present in its Hello (`stela witness --token-file`).
    pub tokens: Option<Tokens>,
    /// Serve a Hello without a token from a loopback peer whose socket the witness's own user
    /// (or root) owns, as the kernel's socket table says (a pair and its witness on one machine).
    pub trust_local_user: bool,
    /// Time a new connection has to send its whole Hello.
    pub handshake_timeout: Duration,
    pub limits: Limits,
}

impl Default for WitnessAuth {
    /// No tokens; local peers of the witness's user trusted; 2 s for the Hello.
    fn default() -> WitnessAuth {
        WitnessAuth {
            tokens: None,
            trust_local_user: true,
            handshake_timeout: Duration::from_secs(2),
            limits: Limits::default(),
        }
    }
}

/// A running witness. Dropping it stops it.
pub struct Witness {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    state: Arc<State>,
}

struct State {
    dir: PathBuf,
    lease: Duration,
    started: Instant,
    claim: Mutex<Held>,
    /// The connections open now, cut when the witness stops (as a dead process's would be).
    connections: Mutex<Vec<TcpStream>>,
    auth: WitnessAuth,
    /// Authenticated sessions running now (a thread each).
    sessions: std::sync::atomic::AtomicUsize,
}

struct Held {
    claim: Claim,
    /// The election by promises open now (in memory: after a restart nodes promise again).
    ballot: Ballot,
    /// When the holder last renewed (none since this witness started).
    renewed: Option<Instant>,
    /// The first failed write: every later change is refused.
    failed: Option<String>,
}

impl Witness {
    /// Reads `dir/WITNESS` (nothing held if absent) and listens on `listen`.
    ///
    /// # Errors
    /// The directory or the state file cannot be read, the file is damaged, or the address
    /// cannot be bound.
    pub fn start(listen: SocketAddr, dir: &Path, lease: Duration) -> std::io::Result<Witness> {
        Witness::start_with(listen, dir, lease, WitnessAuth::default())
    }

    /// As [`Witness::start`], authenticating nodes as `auth` says.
    ///
    /// # Errors
    /// As [`Witness::start`].
    pub fn start_with(
        listen: SocketAddr,
        dir: &Path,
        lease: Duration,
        auth: WitnessAuth,
    ) -> std::io::Result<Witness> {
        // The witness's state is its owner's alone, as the logs' files are.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)?;
        let claim = load(dir)?;
        tracing::info!(epoch = claim.epoch, holder = ?claim.holder, dir = %dir.display(), "witness: state read");
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let state = Arc::new(State {
            dir: dir.to_owned(),
            lease,
            started: Instant::now(),
            claim: Mutex::new(Held {
                claim,
                ballot: Ballot::default(),
                renewed: None,
                failed: None,
            }),
            connections: Mutex::new(Vec::new()),
            auth,
            sessions: std::sync::atomic::AtomicUsize::new(0),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, state) = (Arc::clone(&stop), Arc::clone(&state));
            std::thread::Builder::new()
                .name("stela-witness".into())
                .spawn(move || accept_loop(&listener, &state, &stop))?
        };
        tracing::info!(%addr, lease_ms = lease.as_millis() as u64, "witness: listening");
        Ok(Witness {
            addr,
            stop,
            thread: Some(thread),
            state,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for connection in self
            .state
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = connection.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A connection that has not said Hello yet: read without blocking by the accept thread.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    since: Instant,
    /// The Hello's bytes so far (at most [`gate::MAX_HELLO_FRAME_BYTES`]).
    bytes: Vec<u8>,
}

impl Pending {
    fn waiting(&self) -> Waiting {
        Waiting {
            ip: self.peer.ip(),
            since: self.since,
            heard: !self.bytes.is_empty(),
        }
    }
}

/// What reading a pending connection found.
enum Heard {
    Nothing,
    More,
    Hello(Box<WitnessRequest>),
    /// Closed, or bad bytes: drop it (with the reason to tell, if any).
    Gone(Option<Refusal>),
}

fn accept_loop(listener: &TcpListener, state: &Arc<State>, stop: &AtomicBool) {
    let mut pending: Vec<Pending> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let mut busy = false;
        let mut index = 0;
        while index < pending.len() {
            match read_hello(&mut pending[index]) {
                Heard::Nothing if pending[index].since.elapsed() > state.auth.handshake_timeout => {
                    let gone = pending.swap_remove(index);
                    tracing::debug!(peer = %gone.peer, "witness: no Hello within the handshake timeout");
                }
                Heard::Nothing => index += 1,
                Heard::More => {
                    busy = true;
                    index += 1;
                }
                Heard::Hello(hello) => {
                    busy = true;
                    greet(state, pending.swap_remove(index), &hello);
                }
                Heard::Gone(why) => {
                    let gone = pending.swap_remove(index);
                    if let Some(why) = why {
                        refuse(&gone.stream, gone.peer, &why);
                    }
                }
            }
        }
        // A few at a time: each connection accepted is read at the next pass, before later
        // newcomers could make room by evicting it.
        for _ in 0..(state.auth.limits.per_address / 2).max(1) {
            match listener.accept() {
                Ok((stream, peer)) => {
                    busy = true;
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let newcomer = Pending {
                        stream,
                        peer,
                        since: Instant::now(),
                        bytes: Vec::new(),
                    };
                    admit_or_queue(state, &mut pending, newcomer);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(error) => {
                    tracing::warn!(%error, "witness: accept failed");
                    std::thread::sleep(Duration::from_millis(20));
                    break;
                }
            }
        }
        if !busy {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A connection just accepted: served at once if its whole Hello is here already (a real node
/// sends it with its connect, so it needs no room in the table and a flood of silent
/// connections from its own address cannot evict it before it is read); otherwise it waits in
/// `pending`, making room by evicting another ([`gate::make_room`]).
fn admit_or_queue(state: &Arc<State>, pending: &mut Vec<Pending>, mut newcomer: Pending) {
    match read_hello(&mut newcomer) {
        Heard::Hello(hello) => return greet(state, newcomer, &hello),
        Heard::Gone(why) => {
            if let Some(why) = why {
                refuse(&newcomer.stream, newcomer.peer, &why);
            }
            return;
        }
        Heard::Nothing | Heard::More => {}
    }
    let waiting: Vec<Waiting> = pending.iter().map(Pending::waiting).collect();
    if let Some(victim) = gate::make_room(&waiting, newcomer.peer.ip(), &state.auth.limits) {
        let evicted = pending.swap_remove(victim);
        tracing::debug!(peer = %evicted.peer, "witness: handshake evicted to make room");
    }
    pending.push(newcomer);
    debug_assert!(pending.len() <= state.auth.limits.pending.max(1));
}

/// Reads what has arrived of `pending`'s Hello, never more than a Hello may take.
fn read_hello(pending: &mut Pending) -> Heard {
    let header_bytes = stela_proto::FRAME_HEADER_BYTES;
    let mut heard = Heard::Nothing;
    loop {
        let mut want = header_bytes;
        if pending.bytes.len() >= header_bytes {
            let header: [u8; stela_proto::FRAME_HEADER_BYTES] =
                pending.bytes[..header_bytes].try_into().expect("a header");
            let parsed = match frame::parse_header(header, MAX_WITNESS_HELLO_BYTES) {
                Ok(parsed) => parsed,
                Err(error) => return Heard::Gone(Some(Refusal::Oversized(error))),
            };
            want = header_bytes + parsed.body_len;
            if pending.bytes.len() == want {
                return match frame::decode_body(parsed, &pending.bytes[header_bytes..]) {
                    Ok(hello) => Heard::Hello(Box::new(hello)),
                    Err(error) => Heard::Gone(Some(Refusal::Unreadable(error))),
                };
            }
        }
        debug_assert!(want <= gate::MAX_HELLO_FRAME_BYTES);
        let mut chunk = [0u8; gate::MAX_HELLO_FRAME_BYTES];
        let room = want - pending.bytes.len();
        match pending.stream.read(&mut chunk[..room]) {
            Ok(0) => return Heard::Gone(None),
            Ok(n) => {
                pending.bytes.extend_from_slice(&chunk[..n]);
                heard = Heard::More;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return heard,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Heard::Gone(None),
        }
    }
}

/// Serves `pending`, whose first frame is `hello`, if it proves itself; refuses it otherwise.
fn greet(state: &Arc<State>, pending: Pending, hello: &WitnessRequest) {
    let Pending { stream, peer, .. } = pending;
    let token = match hello {
        WitnessRequest::Hello {
            token: Some(token), ..
        } => match &state.auth.tokens {
            Some(tokens) if tokens.matches(token.as_bytes()) => Token::Valid,
            _ => Token::Wrong,
        },
        _ => Token::None,
    };
    let local_user = state.auth.trust_local_user
        && token == Token::None
        && stela_net::peer::loopback_peer_uid(&stream)
            .ok()
            .flatten()
            .is_some_and(|uid| uid == 0 || uid == rustix_euid());
    let mut verdict = gate::admit(hello, token, local_user);
    let sessions = state.sessions.load(Ordering::SeqCst);
    if verdict.is_ok() && sessions >= state.auth.limits.sessions {
        verdict = Err(Refusal::Sessions { open: sessions });
    }
    if let Err(why) = verdict {
        refuse(&stream, peer, &why);
        return;
    }
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let mut writer = &stream;
    let welcome = WitnessResponse::Welcome {
        version: WITNESS_VERSION,
    };
    if frame::write_blocking(&mut writer, &welcome).is_err() {
        return;
    }
    if let Ok(copy) = stream.try_clone() {
        let mut connections = state.connections.lock().unwrap_or_else(|e| e.into_inner());
        // Forget the ones that ended (their peers closed them).
        connections.retain(|c| c.peer_addr().is_ok());
        connections.push(copy);
    }
    state.sessions.fetch_add(1, Ordering::SeqCst);
    let session_state = Arc::clone(state);
    let spawned = std::thread::Builder::new()
        .name("stela-witness-conn".into())
        .spawn(move || {
            if let Err(why) = serve(stream, &session_state) {
                tracing::debug!(%peer, %why, "witness: connection ended");
            }
            session_state.sessions.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(error) = spawned {
        state.sessions.fetch_sub(1, Ordering::SeqCst);
        tracing::error!(%peer, %error, "witness: cannot start a connection thread");
    }
}

/// Tells `peer` why it is refused (best effort, without blocking) and logs it.
fn refuse(stream: &TcpStream, peer: SocketAddr, why: &Refusal) {
    tracing::warn!(%peer, %why, "witness: connection refused");
    let mut writer = stream;
    let _ = frame::write_blocking(
        &mut writer,
        &WitnessResponse::Error {
            message: format!("refused: {why}"),
        },
    );
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn rustix_euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Why a witness connection ended or could not begin, on either side.
#[derive(Debug, thiserror::Error)]
enum WireError {
    #[error(transparent)]
    Read(#[from] frame::ReadError),
    #[error(transparent)]
    Write(#[from] frame::WriteError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The witness refused this node's Hello, saying why.
    #[error("the witness {0}")]
    Refused(String),
    #[error("unexpected answer to the Hello: {0:?}")]
    Unexpected(Box<WitnessResponse>),
    #[error(
        "no answer to the Hello ({0}): a witness older than protocol {WITNESS_VERSION} closes \
         the connection"
    )]
    NoWelcome(frame::ReadError),
}

fn serve(stream: TcpStream, state: &State) -> Result<(), WireError> {
    let _ = stream.set_nodelay(true);
    // A peer that sends nothing for a minute is gone; its thread ends.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let request: WitnessRequest = frame::read_blocking(&mut reader, MAX_WITNESS_FRAME_BYTES)?;
        frame::write_blocking(&mut writer, &answer(state, request))?;
    }
}

/// The witness's answer to one request; a change is recorded before it is answered.
fn answer(state: &State, request: WitnessRequest) -> WitnessResponse {
    let mut held = state.claim.lock().unwrap_or_else(|e| e.into_inner());
    let silent = held
        .renewed
        .map_or_else(|| state.started.elapsed(), |at| at.elapsed());
    let (response, new) = decide(&mut held, request, silent, state.lease);
    match new {
        Some(new) => record(state, &mut held, new).map_or_else(|refusal| refusal, |()| response),
        None => response,
    }
}

/// The rules' answer to `request` and the claim to record before it is sent, if any.
/// `silent`: how long the holder has not renewed.
fn decide(
    held: &mut Held,
    request: WitnessRequest,
    silent: Duration,
    lease: Duration,
) -> (WitnessResponse, Option<Claim>) {
    match request {
        WitnessRequest::Renew { node, epoch, .. } => {
            match rules::renew(&held.claim, &node, epoch) {
                Err(refused) => {
                    let message = refused.to_string();
                    (WitnessResponse::Error { message }, None)
                }
                Ok((Renewal::Renewed { epoch }, new)) => {
                    held.renewed = Some(Instant::now());
                    (WitnessResponse::Renewed { epoch }, new)
                }
                Ok((Renewal::Superseded { epoch, holder }, new)) => {
                    (WitnessResponse::Superseded { epoch, holder }, new)
                }
            }
        }
        WitnessRequest::Promote {
            node, seen_epoch, ..
        } => {
            let (grant, new) = rules::promote(&held.claim, &node, seen_epoch, silent, lease);
            if let (Grant::Granted { epoch }, Some(_)) = (&grant, &new) {
                tracing::warn!(
                    node,
                    epoch,
                    silent_ms = silent.as_millis() as u64,
                    "witness: granting a new epoch (failover)"
                );
            }
            (grant_response(grant), new)
        }
        WitnessRequest::Hello { .. } => {
            let message = "Hello was already sent".into();
            (WitnessResponse::Error { message }, None)
        }
        WitnessRequest::HandOver {
            node, epoch, to, ..
        } => {
            let (grant, new) = rules::hand_over(&held.claim, &node, epoch, &to);
            if let (Grant::Granted { epoch }, Some(_)) = (&grant, &new) {
                tracing::warn!(
                    from = node,
                    to,
                    epoch,
                    "witness: the primary hands the next epoch over (switchover)"
                );
            }
            (grant_response(grant), new)
        }
        WitnessRequest::Current { .. } => (
            WitnessResponse::Current {
                epoch: held.claim.epoch,
                holder: held.claim.holder.clone(),
            },
            None,
        ),
        WitnessRequest::Ask {
            node, seen_epoch, ..
        } => {
            let (answer, new) = rules::ask(&held.claim, &node, seen_epoch, silent, lease);
            if let Some(new) = &new {
                tracing::warn!(
                    node,
                    epoch = new.epoch,
                    silent_ms = silent.as_millis() as u64,
                    "witness: the primary is silent; an election by promises is open"
                );
            }
            (election_response(answer), new)
        }
        WitnessRequest::Promise {
            node,
            epoch,
            needed,
            prefers_primary,
            positions,
            ..
        } => {
            let report = Report {
                positions: positions
                    .into_iter()
                    .map(|(log, term, lsn)| LogPosition { log, term, lsn })
                    .collect(),
                prefers_primary,
            };
            promised(held, &node, epoch, needed, &report)
        }
    }
}

/// A node's promise for `epoch` with its `report`, counted in the open election; the answer,
/// and the claim to record if this promise decides it.
fn promised(
    held: &mut Held,
    node: &str,
    epoch: u64,
    needed: u32,
    report: &Report,
) -> (WitnessResponse, Option<Claim>) {
    let claim = held.claim.clone();
    let (answer, new) = rules::promise(&claim, &mut held.ballot, node, epoch, needed, report);
    if let Some(new) = &new {
        tracing::warn!(epoch, holder = ?new.holder, promises = held.ballot.promises.len(),
            "witness: granting the epoch to the most up-to-date node that promised it (failover)");
    }
    (election_response(answer), new)
}

/// Records `new` in the state file, then in memory; `Err` is the answer instead (this write
/// failed, or an earlier one did: then every change is refused until a restart).
fn record(state: &State, held: &mut Held, new: Claim) -> Result<(), WitnessResponse> {
    if let Some(first) = &held.failed {
        return Err(WitnessResponse::Error {
            message: format!("the witness cannot record changes since a failed write: {first}"),
        });
    }
    if let Err(error) = store(&state.dir, &new) {
        let message = format!(
            "recording epoch {} for {:?}: {error}",
            new.epoch, new.holder
        );
        tracing::error!(
            message,
            "witness: write failed; refusing every change until restarted"
        );
        held.failed = Some(message.clone());
        return Err(WitnessResponse::Error { message });
    }
    if new.holder != held.claim.holder {
        // A new holder starts its lease now.
        held.renewed = Some(Instant::now());
    }
    held.claim = new;
    Ok(())
}

fn grant_response(grant: Grant) -> WitnessResponse {
    match grant {
        Grant::Granted { epoch } => WitnessResponse::Granted { epoch },
        Grant::Refused {
            epoch,
            holder,
            reason,
        } => WitnessResponse::Refused {
            epoch,
            holder,
            reason,
        },
    }
}

fn election_response(answer: Election) -> WitnessResponse {
    match answer {
        Election::Prepare { epoch } => WitnessResponse::Prepare { epoch },
        Election::Granted { epoch } => WitnessResponse::Granted { epoch },
        Election::Waiting {
            epoch,
            heard,
            needed,
            reason,
        } => WitnessResponse::Waiting {
            epoch,
            heard,
            needed,
            reason,
        },
        Election::Refused {
            epoch,
            holder,
            reason,
        } => WitnessResponse::Refused {
            epoch,
            holder,
            reason,
        },
    }
}

/// The witness's answer to a promotion or a handover, as the client's [`Grant`] (the inverse
/// of [`grant_response`]).
fn response_grant(response: WitnessResponse) -> Result<Grant, CoordError> {
    match response {
        WitnessResponse::Granted { epoch } => Ok(Grant::Granted { epoch }),
        WitnessResponse::Refused {
            epoch,
            holder,
            reason,
        } => Ok(Grant::Refused {
            epoch,
            holder,
            reason,
        }),
        other => Err(CoordError::Other(format!("unexpected answer {other:?}"))),
    }
}

fn response_election(response: WitnessResponse) -> Result<Election, CoordError> {
    match response {
        WitnessResponse::Prepare { epoch } => Ok(Election::Prepare { epoch }),
        WitnessResponse::Granted { epoch } => Ok(Election::Granted { epoch }),
        WitnessResponse::Waiting {
            epoch,
            heard,
            needed,
            reason,
        } => Ok(Election::Waiting {
            epoch,
            heard,
            needed,
            reason,
        }),
        WitnessResponse::Refused {
            epoch,
            holder,
            reason,
        } => Ok(Election::Refused {
            epoch,
            holder,
            reason,
        }),
        other => Err(CoordError::Other(format!("unexpected answer {other:?}"))),
    }
}

fn encode_claim(claim: &Claim) -> Vec<u8> {
    let holder = claim.holder.as_deref().unwrap_or("");
    let mut out = claim.epoch.to_le_bytes().to_vec();
    out.extend_from_slice(&(holder.len() as u32).to_le_bytes());
    out.extend_from_slice(holder.as_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Why the state file does not hold a claim.
#[derive(Debug, thiserror::Error)]
enum DamagedClaim {
    #[error("{0} bytes, too short")]
    Short(usize),
    #[error("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("the holder's length does not match the file")]
    HolderLength,
    #[error("holder: {0}")]
    Holder(#[from] std::str::Utf8Error),
}

fn decode_claim(bytes: &[u8]) -> Result<Claim, DamagedClaim> {
    let short = || DamagedClaim::Short(bytes.len());
    let (body, crc) = bytes.split_last_chunk::<4>().ok_or_else(short)?;
    let (stored, computed) = (u32::from_le_bytes(*crc), crc32c::crc32c(body));
    if stored != computed {
        return Err(DamagedClaim::Checksum { stored, computed });
    }
    let (epoch, rest) = body.split_first_chunk::<8>().ok_or_else(short)?;
    let (len, holder) = rest.split_first_chunk::<4>().ok_or_else(short)?;
    if u32::from_le_bytes(*len) as usize != holder.len() {
        return Err(DamagedClaim::HolderLength);
    }
    let holder = std::str::from_utf8(holder)?;
    Ok(Claim {
        epoch: u64::from_le_bytes(*epoch),
        holder: (!holder.is_empty()).then(|| holder.to_owned()),
    })
}

fn load(dir: &Path) -> std::io::Result<Claim> {
    let path = dir.join(FILE);
    match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Claim::default()),
        Err(e) => Err(e),
        Ok(bytes) => decode_claim(&bytes).map_err(|why| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} is damaged ({why}); refusing to start rather than grant an epoch twice",
                    path.display()
                ),
            )
        }),
    }
}

fn store(dir: &Path, claim: &Claim) -> std::io::Result<()> {
    let (temp, path) = (dir.join(TEMP), dir.join(FILE));
    let mut file = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true),
        0o600,
    )
    .open(&temp)?;
    file.write_all(&encode_claim(claim))?;
    file.sync_data()?;
    drop(file);
    std::fs::rename(&temp, &path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// A node's connection to a witness. Every call is bounded by the timeout, so a dead or stopped
/// witness never holds its caller longer; a failed call drops the connection and the next one
/// connects again.
pub struct WitnessClient {
    addr: SocketAddr,
    cluster: String,
    timeout: Duration,
    /// Sent in the Hello of each connection.
    token: Option<String>,
    connection: Mutex<Option<(BufReader<TcpStream>, TcpStream)>>,
}

impl WitnessClient {
    pub fn new(addr: SocketAddr, cluster: &str, timeout: Duration) -> WitnessClient {
        WitnessClient {
            addr,
            cluster: cluster.to_owned(),
            timeout,
            token: None,
            connection: Mutex::new(None),
        }
    }

    /// Proves this node with `token` (one of the witness's `--token-file`) in each Hello.
    #[must_use]
    pub fn with_token(mut self, token: Option<String>) -> WitnessClient {
        self.token = token;
        self
    }

    /// Connects and says Hello; the witness's refusal is this node's to report.
    fn connect(&self) -> Result<(BufReader<TcpStream>, TcpStream), WireError> {
        let stream = TcpStream::connect_timeout(&self.addr, self.timeout)?;
        let _ = stream.set_nodelay(true);
        stream.set_read_timeout(Some(self.timeout))?;
        stream.set_write_timeout(Some(self.timeout))?;
        let mut writer = stream.try_clone()?;
        let mut reader = BufReader::new(stream);
        let hello = WitnessRequest::Hello {
            version: WITNESS_VERSION,
            token: self.token.clone(),
        };
        frame::write_blocking(&mut writer, &hello)?;
        match frame::read_blocking(&mut reader, MAX_WITNESS_FRAME_BYTES) {
            Ok(WitnessResponse::Welcome { .. }) => Ok((reader, writer)),
            Ok(WitnessResponse::Error { message }) => Err(WireError::Refused(message)),
            Ok(other) => Err(WireError::Unexpected(Box::new(other))),
            Err(why) => Err(WireError::NoWelcome(why)),
        }
    }

    fn call(&self, request: &WitnessRequest) -> Result<WitnessResponse, CoordError> {
        let mut connection = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        let unreachable =
            |why: WireError| CoordError::Unreachable(format!("witness {}: {why}", self.addr));
        let open = match connection.take() {
            Some(open) => open,
            None => self.connect().map_err(unreachable)?,
        };
        let (reader, writer) = connection.insert(open);
        let result = frame::write_blocking(writer, request)
            .map_err(WireError::from)
            .and_then(|()| Ok(frame::read_blocking(reader, MAX_WITNESS_FRAME_BYTES)?));
        match result {
            Ok(WitnessResponse::Error { message }) => Err(CoordError::Other(message)),
            Ok(response) => Ok(response),
            Err(why) => {
                *connection = None;
                Err(unreachable(why))
            }
        }
    }
}

impl Coordinator for WitnessClient {
    fn renew(&self, node: &str, epoch: u64) -> Result<Renewal, CoordError> {
        match self.call(&WitnessRequest::Renew {
            cluster: self.cluster.clone(),
            node: node.to_owned(),
            epoch,
        })? {
            WitnessResponse::Renewed { epoch } => Ok(Renewal::Renewed { epoch }),
            WitnessResponse::Superseded { epoch, holder } => {
                Ok(Renewal::Superseded { epoch, holder })
            }
            other => Err(CoordError::Other(format!("unexpected answer {other:?}"))),
        }
    }

    fn promote(&self, node: &str, seen_epoch: u64) -> Result<Grant, CoordError> {
        response_grant(self.call(&WitnessRequest::Promote {
            cluster: self.cluster.clone(),
            node: node.to_owned(),
            seen_epoch,
        })?)
    }

    fn hand_over(&self, node: &str, epoch: u64, to: &str) -> Result<Grant, CoordError> {
        response_grant(self.call(&WitnessRequest::HandOver {
            cluster: self.cluster.clone(),
            node: node.to_owned(),
            epoch,
            to: to.to_owned(),
        })?)
    }

    fn current(&self) -> Result<Holder, CoordError> {
        match self.call(&WitnessRequest::Current {
            cluster: self.cluster.clone(),
        })? {
            WitnessResponse::Current { epoch, holder } => Ok(Holder { epoch, holder }),
            other => Err(CoordError::Other(format!("unexpected answer {other:?}"))),
        }
    }

    fn describe(&self) -> String {
        format!("witness tcp://{}", self.addr)
    }

    fn ask(&self, node: &str, seen_epoch: u64, needed: u32) -> Result<Election, CoordError> {
        response_election(self.call(&WitnessRequest::Ask {
            cluster: self.cluster.clone(),
            node: node.to_owned(),
            seen_epoch,
            needed,
        })?)
    }

    fn promise(
        &self,
        node: &str,
        epoch: u64,
        needed: u32,
        report: &Report,
    ) -> Result<Election, CoordError> {
        response_election(
            self.call(&WitnessRequest::Promise {
                cluster: self.cluster.clone(),
                node: node.to_owned(),
                epoch,
                needed,
                prefers_primary: report.prefers_primary,
                positions: report
                    .positions
                    .iter()
                    .map(|p| (p.log.clone(), p.term, p.lsn))
                    .collect(),
            })?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_file_round_trips_and_damage_is_refused() {
        for claim in [
            Claim::default(),
            Claim {
                epoch: 7,
                holder: Some("node-a".into()),
            },
        ] {
            assert_eq!(decode_claim(&encode_claim(&claim)).unwrap(), claim);
        }
        let mut bytes = encode_claim(&Claim {
            epoch: 3,
            holder: Some("b".into()),
        });
        bytes[0] ^= 1;
        assert!(matches!(
            decode_claim(&bytes),
            Err(DamagedClaim::Checksum { .. })
        ));
        assert!(decode_claim(&[1, 2]).is_err());
    }
}
