//! Requests, responses and the values inside them.
//!
//! Every request carries an `id` chosen by the client; the response to it carries the same id.
//! A connection may have many requests in flight (pipelining); the daemon answers them in the
//! order it received them. Record payloads are opaque bytes: the client encodes them with the
//! log's codec, the daemon frames and checksums them on the way to disk exactly as the embedded
//! log does, so a log written through the daemon is an ordinary stela-wal directory.

use serde::{Deserialize, Serialize};

/// What an acknowledgement promises. See `docs/DURABILITY.md` for each level against each
/// failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Durability {
    /// Acknowledged as soon as the daemon has read the request, before the record is in its
    /// protected buffer. No promise at all; exists to measure what the protection costs.
    Unsafe,
    /// In the daemon's bounded buffer: survives a crash of the client, and a power cut while the
    /// daemon gets to run its emergency flush. Lost if the daemon itself is killed before the
    /// buffer reaches the OS.
    Buffered,
    /// fdatasync'ed through group commit: survives the daemon, the OS and a power cut.
    Disk,
    /// In memory on this daemon and its standby (a daemon without a standby refuses it).
    Replicated,
    /// On disk here and in the standby's memory (a daemon without a standby refuses it).
    All,
}

impl Durability {
    pub fn name(self) -> &'static str {
        match self {
            Durability::Unsafe => "unsafe",
            Durability::Buffered => "buffered",
            Durability::Disk => "disk",
            Durability::Replicated => "replicated",
            Durability::All => "all",
        }
    }

    pub fn from_name(name: &str) -> Option<Durability> {
        Some(match name {
            "unsafe" => Durability::Unsafe,
            "buffered" => Durability::Buffered,
            "disk" => Durability::Disk,
            "replicated" => Durability::Replicated,
            "all" => Durability::All,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A record payload on the wire (serialized as MessagePack binary, not as an array of ints).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Payload(#[serde(with = "serde_bytes")] pub Vec<u8>);

/// A client's request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub body: RequestBody,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestBody {
    /// Must be the first request on a connection.
    Hello {
        version: u32,
        client: String,
        /// Who is asking: administrators (`stela status`, power hooks) are served even when the
        /// daemon is at its connection limit, from a small reserve.
        #[serde(default)]
        role: Role,
        /// A shared token proving who the client is (`--token-file`), for a TCP daemon that
        /// asks for one. Sent over TLS only; ignored on the Unix socket.
        #[serde(default)]
        token: Option<String>,
    },
    /// Opens (or with `create`, creates) the named log. `codec` and `type_tag` must match the
    /// log's header, exactly as for an embedded open. The answer names a handle for later
    /// requests on this connection.
    Open {
        log: String,
        codec: String,
        type_tag: String,
        create: bool,
        /// The level the client will commit at by default: a daemon that cannot serve it
        /// refuses the open (`Unsupported`) rather than the first commit. Absent from older
        /// clients.
        #[serde(default)]
        durability: Option<Durability>,
        /// The record type's schema (`stela_format::schema`, JSON), which the daemon keeps with
        /// the log so that dumps show compact MessagePack records with their field names.
        #[serde(default)]
        schema: Option<String>,
    },
    /// Appends records as one contiguous run of LSNs and acknowledges at `durability`.
    Append {
        handle: u32,
        durability: Durability,
        records: Vec<Payload>,
    },
    /// Waits until every record up to `lsn` is at `durability`.
    Commit {
        handle: u32,
        lsn: u64,
        durability: Durability,
    },
    /// Reads records from `from` on, at most `max_records` and about `max_bytes` (at least one
    /// record is returned if any exists). Records still in the daemon's buffers are included.
    Read {
        handle: u32,
        from: u64,
        max_records: u32,
        max_bytes: u32,
    },
    /// Releases whole segments below `before` (a checkpoint).
    Truncate {
        handle: u32,
        before: u64,
    },
    /// The log's current positions.
    Positions {
        handle: u32,
    },
    /// Releases the handle (later requests naming it get `UnknownHandle`; its number is not
    /// reused on this connection). When no connection holds the log any more, the daemon writes
    /// and syncs what it buffers of it and closes its files, so another process may open them.
    Close {
        handle: u32,
    },
    /// Asks for a shared-memory ring of `data_bytes` for this connection's appends and commits
    /// (Unix socket only). The answer carries two file descriptors (SCM_RIGHTS): the ring's
    /// memory and its doorbell. See "Shared-memory transport" in docs/PROTOCOL.md.
    MapRing {
        data_bytes: u32,
    },
    Status,
    /// Power is failing: stop admitting writes, flush everything, sync, refuse writes.
    PowerFail,
    /// Power is back: admit writes again.
    PowerRestore,
    /// Every log in the daemon's directory, open or not.
    ListLogs,
    /// Removes a log that no client has open: its files, then its directory and the holds on
    /// it (administrative).
    DeleteLog {
        log: String,
    },
    /// The log's term history and last LSN, to resolve a commit left in doubt by a failover
    /// (`stela_format::term::resolve`).
    History {
        handle: u32,
    },
    /// Releases the hold a warm follower keeps on this node's copy of `log` (`stela_wal::holds`),
    /// named by the holder's directory as `ListLogs` shows it, or by its file's name
    /// (administrative): for a follower retired for good.
    ReleaseHold {
        log: String,
        holder: String,
    },
    /// A planned switchover (administrative, on the primary): refuse appends, wait up to
    /// `within_ms` until the standbys acknowledge receiving every record, hand the next epoch to the node named
    /// `to` through the coordinator, and step down (docs/DAEMON.md, "Switchover").
    Switchover {
        to: String,
        within_ms: u64,
    },
    /// The first step of a backup over the network (`stela backup --from`, administrative):
    /// records a hold named `holder` on `log` that keeps every segment from the log's first on
    /// (released with `ReleaseHold`), then lists the log directory's files with their lengths.
    /// With `last_in_files`, also the last record in the log's files (the bound a closed log's
    /// copy must reach). Answered with [`ResponseBody::BackupFiles`].
    BackupLog {
        log: String,
        holder: String,
        #[serde(default)]
        last_in_files: bool,
    },
    /// Up to `max_bytes` of the file `file` of `log` from `offset` on (administrative): the
    /// bytes a backup over the network copies, byte for byte. The daemon answers at most its
    /// read answer size (1 MiB) at a time. Answered with [`ResponseBody::FileChunk`].
    ReadLogFile {
        log: String,
        file: String,
        offset: u64,
        max_bytes: u32,
    },
}

/// One file of [`ResponseBody::BackupFiles`]: a plain file of the log's directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogFile {
    pub name: String,
    /// Its length when it was listed.
    pub bytes: u64,
}

/// One log of [`ResponseBody::Logs`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogListing {
    pub name: String,
    /// Handles open on it now (0: closed).
    pub handles: u32,
    pub segments: u32,
    pub bytes_on_disk: u64,
    /// The first LSN the log holds (from its oldest segment's name; 0 if it has none).
    pub first_lsn: u64,
    /// The last LSN appended, known while the log is open.
    pub last_lsn: Option<u64>,
    /// `open`, `closed`, `stopped: ...` or `waiting for space: ...`.
    pub state: String,
    /// Warm followers' holds on this copy (a standby's): it is never cut below the lowest.
    #[serde(default)]
    pub holds: Vec<HoldListing>,
    /// The last LSN fdatasync'ed (every record acknowledged at `disk` is at or below it), known
    /// while the log is open; a closed log's files are whole and synced. `stela backup` reads
    /// it as the least its copy must hold.
    #[serde(default)]
    pub durable_lsn: Option<u64>,
}

/// One hold of [`LogListing::holds`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldListing {
    /// The first LSN it keeps (1 for a hold whose file cannot be read: it keeps everything).
    pub lsn: u64,
    /// The follower's directory as it wrote it, else the hold file's name.
    pub holder: String,
    /// Why the hold's file could not be read, if it could not.
    pub unreadable: Option<String>,
}

/// The daemon's answer to the request with the same id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub id: u64,
    pub body: ResponseBody,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ResponseBody {
    Welcome {
        version: u32,
        server: String,
    },
    Opened {
        handle: u32,
        positions: Positions,
        /// The largest payload the daemon accepts for this log (bounded by its buffer size).
        max_record_bytes: u32,
        /// The term every record appended through this handle gets (0: a daemon without
        /// replication). With an LSN it names a record across a failover.
        #[serde(default)]
        term: u64,
    },
    Appended {
        first_lsn: u64,
        last_lsn: u64,
    },
    Committed {
        lsn: u64,
    },
    Records {
        records: Vec<(u64, Payload)>,
        /// The LSN to ask for next.
        next: u64,
        /// True when `next` is past the last record appended so far.
        at_end: bool,
    },
    Truncated {
        segments: u64,
    },
    Positions(Positions),
    Closed,
    /// The ring is mapped; its memory and doorbell descriptors arrive with this answer.
    RingMapped {
        data_bytes: u32,
        slots: u32,
    },
    Status(Box<StatusReport>),
    PowerFailed(EmergencyFlush),
    PowerRestored,
    Logs(Vec<LogListing>),
    Deleted {
        log: String,
        segments: u32,
        bytes: u64,
    },
    /// The log's term history, (term, first LSN) pairs oldest first, and its last LSN that a
    /// second node holds (`last_lsn`: what `Kept` may be said of), and the last LSN the log
    /// holds at all (`log_end`; absent from daemons before it: a record between the two is
    /// present but not protected yet, so neither `Kept` nor `Lost`).
    History {
        entries: Vec<(u64, u64)>,
        last_lsn: u64,
        #[serde(default)]
        log_end: Option<u64>,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
    /// The hold `ReleaseHold` named is gone; it kept the copy from `lsn` on.
    HoldReleased {
        log: String,
        holder: String,
        lsn: u64,
    },
    /// `Switchover` is done: `epoch` is `to`'s, and this node steps down (it exits 75 and,
    /// restarted, rejoins as `to`'s standby).
    SwitchedOver {
        epoch: u64,
        to: String,
    },
    /// `BackupLog` is done: the hold `holder` keeps `log` from LSN `held_from` on, and these
    /// are the log directory's plain files as they were listed after the hold was recorded.
    /// `last_in_files`: the last record in the files, if it was asked for and there is one.
    BackupFiles {
        log: String,
        holder: String,
        held_from: u64,
        files: Vec<LogFile>,
        #[serde(default)]
        last_in_files: Option<u64>,
    },
    /// A chunk of a log's file from `offset`: `data`, or, when every byte read was zero,
    /// `zeros` bytes of zeros (a hole: nothing is sent). Both empty: the file ends at
    /// `offset`. `gone`: the file no longer exists (a truncation removed the segment).
    FileChunk {
        offset: u64,
        data: Payload,
        #[serde(default)]
        zeros: u32,
        #[serde(default)]
        gone: bool,
    },
}

/// Where a log stands. LSNs as in stela-wal: dense record numbers, 0 meaning "none".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Positions {
    pub first_lsn: u64,
    /// The last record appended (acknowledged at `buffered` or better).
    pub last_lsn: u64,
    /// The last record handed to the OS (survives a crash of the daemon).
    pub written_lsn: u64,
    /// The last record fdatasync'ed (survives a crash of the OS and a power cut).
    pub durable_lsn: u64,
}

/// What went wrong, for a client to act on without parsing the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The frame or message was malformed; the daemon closes the connection after this.
    BadFrame,
    /// A well-formed request that makes no sense here (no Hello first, a second Hello, ...).
    BadRequest,
    UnsupportedVersion,
    /// A durability level this daemon cannot give (replicated, all: no standby yet).
    Unsupported,
    UnknownHandle,
    /// The log name is not a plain file name, or the log does not exist and `create` was false.
    BadLogName,
    /// The log's header names another codec or record type, or it cannot be opened.
    OpenFailed,
    RecordTooLarge,
    NotAppended,
    /// A power failure was announced: writes are refused until power-restore or a restart.
    PowerFailing,
    /// The daemon is shutting down (SIGTERM): it flushes and exits.
    ShuttingDown,
    /// Reading the log's files failed (the message names the file).
    Io,
    /// A write or sync of the log failed: the log is stopped and every later write fails until
    /// the daemon is restarted (the message names the cause).
    LogStopped,
    /// The disk is full: the log takes no appends until a new segment can be created. Nothing
    /// acknowledged is lost. An append answered this placed nothing (no LSN; safe to send
    /// again); a `disk` append already placed waits for space rather than getting it.
    DiskFull,
    /// The daemon is at its connection limit; the connection is closed.
    TooManyConnections,
    /// No Hello within the handshake timeout, or no request within the idle timeout; the
    /// connection is closed.
    Timeout,
    /// The log has used every LSN.
    LsnExhausted,
    /// The client did not prove who it is (no token, a wrong one, no client certificate); the
    /// connection is closed.
    Unauthenticated,
    /// An administrative request (power-fail, power-restore, truncate, delete) from a TCP
    /// client not authenticated as an administrator; the connection stays open.
    Forbidden,
    /// The log is open by a client: it cannot be deleted now.
    LogInUse,
    /// This node is not the primary (a standby, or a primary that saw a newer term and stepped
    /// down): open the log on the primary. The message names the epoch and, if known, the
    /// primary.
    NotPrimary,
    /// The primary stepped down while this commit waited: whether the record survives depends
    /// on the new primary's history. Resolve it by its (term, LSN) there (`History`).
    InDoubt,
    /// A `replicated` or `all` commit that no standby holds: the record is appended, on this
    /// primary alone (in its memory; for `all`, on its disk too), and the commit is NOT at
    /// the level asked. Answered instead of waiting while a policy lets the primary run
    /// without a standby (a promoted primary whose old primary has not rejoined, the default
    /// `--after-failover unprotected`; a standby unreachable past `--degrade-after`). The
    /// record survives this primary's crash only as `buffered` (`disk` for `all`) does; the
    /// message says which policy answered. Commit again later to learn when it is protected.
    Unprotected,
    /// The client's credential is at its quota (`--quota-logs`: logs it created;
    /// `--quota-bytes`: bytes its logs hold): the log was not created, or the append placed
    /// nothing (no LSN; it can be sent again once space under the quota is freed). The message
    /// names the credential, what it holds and the limit. Added in protocol version 1 after
    /// the other codes: older clients cannot decode it.
    QuotaExceeded,
}

/// Who a connection is, for the connection limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// A database or an application: counted against the connection limit.
    #[default]
    Client,
    /// An operator's tool: served from a small reserve beyond the limit.
    Admin,
}

/// `stela status`: what the daemon holds and what its acknowledgements mean.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub server: String,
    pub pid: u32,
    pub dir: String,
    pub uptime_ms: u64,
    pub buffers: u32,
    pub buffer_bytes: u64,
    pub flush_interval_ms: u64,
    /// The cap on dirty (acknowledged, not yet written) bytes and how it was derived.
    pub dirty_cap: DirtyCap,
    pub dirty_bytes: u64,
    pub free_buffers: u32,
    /// "normal", or "failed" between a power-fail notice and power-restore.
    pub power: String,
    pub last_emergency_flush: Option<EmergencyFlush>,
    pub logs: Vec<LogStatus>,
    pub connections: u32,
    /// The connection limit in force (the configured one, lowered to what the file limit
    /// allows), and the file limit.
    pub max_connections: u32,
    pub file_limit: u64,
    /// Connections with a shared-memory ring.
    pub rings: u32,
    /// Connections refused at the limit since start.
    pub refused_connections: u64,
    /// Bytes of partly received frames held now, and their cap.
    pub partial_frame_bytes: u64,
    pub partial_frame_cap: u64,
    /// Threads of the daemon process.
    pub threads: u32,
    /// Whether the event loop runs with realtime scheduling (`docs/DAEMON.md`).
    pub realtime_loop: bool,
    /// Appends that had to wait for buffer space since start (backpressure).
    pub appends_waited: u64,
    pub bytes_written: u64,
    /// One line per failure: what an acknowledgement at each level survives.
    pub crash_semantics: Vec<String>,
    /// The hot standby, if this daemon ships to one or is one.
    #[serde(default)]
    pub replication: Option<ReplicationStatus>,
    /// Whether the event loop spins after a turn with work, nothing being owed (`--spin-us`;
    /// it stops while spinning has not paid lately, `docs/DAEMON.md`). False from a daemon that
    /// does not say.
    #[serde(default)]
    pub loop_spins: bool,
    /// Bytes of answers not yet sent held now, and their cap (0 from a daemon that does not say).
    #[serde(default)]
    pub output_bytes: u64,
    #[serde(default)]
    pub output_cap: u64,
    /// The dirty-byte cap in force now (at most `dirty_cap.bytes`), kept by the flushes the
    /// daemon sees; zero from a daemon that does not say.
    #[serde(default)]
    pub live_dirty_cap: LiveDirtyCap,
    /// This node's name in its failover pair (`--node`); `None` without one.
    #[serde(default)]
    pub node: Option<String>,
}

/// The live dirty-byte cap: shrunk at once when a flush shows the disk slower than the start-up
/// cap assumed, grown back slowly.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveDirtyCap {
    pub bytes: u64,
    /// One sentence: why the cap is what it is.
    pub reason: String,
    /// Changes since start.
    pub changes: u64,
}

/// A daemon's part in log shipping.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ReplicationStatus {
    /// "primary" (ships to `peer`) or "standby" (takes streams on `peer`).
    pub role: String,
    pub peer: String,
    pub logs: Vec<ReplicaStatus>,
    /// The cluster's epoch as this node knows it (0: no failover coordinator).
    #[serde(default)]
    pub epoch: u64,
    /// The failover coordinator (witness or etcd), if configured.
    #[serde(default)]
    pub coordinator: Option<CoordinatorStatus>,
    /// This node's last promotion, if it was promoted since it started.
    #[serde(default)]
    pub last_failover: Option<FailoverReport>,
    /// Since when (Unix ms) a promoted primary acknowledges `replicated` without a standby
    /// (its old primary has not rejoined yet); 0 while protected.
    #[serde(default)]
    pub unprotected_since_ms: u64,
    /// A primary's standbys, each with its own streams (`--peer` given once per other node);
    /// `peer` and `logs` above are the first one's. Empty on a standby.
    #[serde(default)]
    pub standbys: Vec<StandbyStatus>,
    /// How many standbys must hold a record before `replicated` is acknowledged (`--replicas`;
    /// 0 from a daemon that predates it, which has one standby).
    #[serde(default)]
    pub replicas: u32,
    /// Replication sessions ended since start, by kind of end (`link`, `tls`, `protocol`,
    /// `refused`, `rejected`, `fenced`, `storage`, `stopped`): on a primary each failed attempt
    /// to reach a standby counts, on a standby each stream it ended or refused (refusals at its
    /// door too). Empty from a daemon that does not say.
    #[serde(default)]
    pub session_ends: std::collections::BTreeMap<String, u64>,
    /// On a standby: each log whose stream ended and is not up again, with how it ended (the
    /// logs up now are in `logs`, each with its previous end). Empty on a primary, whose
    /// streams stay in `logs` while they retry.
    #[serde(default)]
    pub ended_streams: Vec<EndedStream>,
}

/// A standby's log whose stream is down, and how it last ended.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct EndedStream {
    pub log: String,
    pub end: SessionEndReport,
}

/// How a replication session (one log's stream) last ended.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SessionEndReport {
    /// The kind of end, one of the keys of [`ReplicationStatus::session_ends`].
    pub kind: String,
    /// What the stream ended with (the line the daemon logged).
    pub message: String,
    /// How long ago it ended.
    pub ago_ms: u64,
}

/// One standby of a primary: its address, whether every log's stream to it is up, whether one
/// has heard nothing within the link's deadline, and each log's stream (what it acknowledged).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct StandbyStatus {
    pub peer: String,
    pub connected: bool,
    pub stalled: bool,
    pub logs: Vec<ReplicaStatus>,
}

/// The failover coordinator as a node sees it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CoordinatorStatus {
    /// "witness tcp://..." or "etcd http://... (cluster NAME)".
    pub describe: String,
    /// Whether its last answer came within the timeout. While unreachable, a healthy pair
    /// runs on; only failover is unavailable.
    pub reachable: bool,
    /// How long ago it last answered.
    pub last_answer_ms: u64,
    /// The epoch and holder it last reported.
    pub epoch: u64,
    pub holder: Option<String>,
}

/// A promotion: when, why, and how long from the suspicion to serving.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FailoverReport {
    pub at_unix_ms: u64,
    pub epoch: u64,
    pub reason: String,
    /// From the last message of the old primary to accepting clients.
    pub took_ms: u64,
}

/// One log's shipping, as its primary or its standby sees it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStatus {
    pub log: String,
    /// Whether the stream is up now.
    pub connected: bool,
    pub term: u64,
    /// The highest LSN the standby holds in memory, and on disk.
    pub received_lsn: u64,
    pub durable_lsn: u64,
    /// On the primary: records appended that the standby does not hold yet, and for how long it
    /// has acknowledged nothing while behind (0 when caught up).
    pub lag_records: u64,
    pub lag_ms: u64,
    /// On the primary: segment bytes (frames and headers) between what the standby has
    /// acknowledged and where the log's next record goes.
    #[serde(default)]
    pub lag_bytes: u64,
    /// Why the primary stopped shipping this log (a newer term, a diverged copy), if it did.
    pub stopped: Option<String>,
    /// On the primary: segment bytes shipped, and the bytes they took on the wire (lz4).
    #[serde(default)]
    pub shipped_bytes: u64,
    #[serde(default)]
    pub wire_bytes: u64,
    /// On the primary with `--degrade-after`: whether `replicated` commits are acknowledged
    /// without the standby now (it has been unreachable too long), and how many were.
    #[serde(default)]
    pub degraded: bool,
    #[serde(default)]
    pub degraded_acks: u64,
    /// On the primary with `--degrade-after`: the highest LSN acknowledged without the standby
    /// that way (0: none). Until `received_lsn` reaches it, those records are on the primary
    /// alone, though the stream is back and new commits wait for the standby again.
    #[serde(default)]
    pub degraded_through: u64,
    /// On a promoted primary: `replicated` acknowledgements given without a standby.
    #[serde(default)]
    pub unprotected_acks: u64,
    /// On the primary: the stream is up but the standby has acknowledged nothing (not even a
    /// heartbeat) for longer than the link's deadline: a black-holed or one-way link. The
    /// stream is then torn down and opened again; `stela status` exits 3 meanwhile.
    #[serde(default)]
    pub stalled: bool,
    /// On the primary: milliseconds since the standby's last acknowledgement of any kind
    /// (0: none yet in this run).
    #[serde(default)]
    pub last_ack_ms: u64,
    /// How this log's last session ended, if one ended since the daemon started (on a standby,
    /// a log whose stream is down is in [`ReplicationStatus::ended_streams`] instead).
    #[serde(default)]
    pub last_end: Option<SessionEndReport>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DirtyCap {
    pub bytes: u64,
    pub power_window_ms: u64,
    /// Sequential write rate measured at start (bytes per second, written and fdatasync'ed).
    pub measured_write_bytes_per_s: u64,
    /// How many bytes that rate writes in half the power window.
    pub window_bytes: u64,
    /// buffers x buffer_bytes.
    pub pool_bytes: u64,
    /// One sentence: cap = min(pool, rate x window / 2) with the numbers.
    pub derivation: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogStatus {
    pub name: String,
    pub codec: String,
    pub positions: Positions,
    pub dirty_bytes: u64,
    /// Set once a write or sync of this log failed (it then refuses writes).
    pub failure: Option<String>,
    /// Set while the log's next segment cannot be created for lack of space: it refuses new
    /// records and retries; what it already placed is written once space returns.
    #[serde(default)]
    pub waiting_for_space: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmergencyFlush {
    pub bytes: u64,
    pub micros: u64,
    pub budget_micros: u64,
    /// Unix time in milliseconds at the notice.
    pub at_unix_ms: u64,
    /// Set if some log could not be flushed (its records are lost on power loss).
    pub failures: Vec<String>,
}
