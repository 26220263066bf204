//! Checks (or, with `STELA_WRITE_SEEDS=1`, rewrites) the seeds of the `protocol_decode` target in
//! `fuzz/seeds/protocol_decode/`: one valid frame of every request kind, a pipelined stream of
//! several, and one of every response kind (the target reads every input both ways). A test
//! checks that every variant of `RequestBody` and `ResponseBody` has a seed: its `match`es list
//! every variant, so a new one does not compile here until it is named, and then fails until it
//! has a seed.
//!
//! `cargo test` inside `fuzz/` (with `RUSTC_BOOTSTRAP=1`, like every command here).

use std::collections::BTreeSet;
use stela_proto::frame;
use stela_proto::{
    Durability, EmergencyFlush, EndedStream, ErrorCode, HoldListing, LogFile, LogListing, Payload,
    Positions, ReplicaStatus, ReplicationStatus, Request, RequestBody, Response, ResponseBody,
    SessionEndReport, StatusReport, PROTOCOL_VERSION,
};

fn framed<M: serde::Serialize>(message: &M) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode(message, &mut out).expect("seed encodes");
    out
}

fn request(id: u64, body: RequestBody) -> Vec<u8> {
    framed(&Request { id, body })
}

/// Every request kind, as [`request_kind`] names them.
const REQUEST_KINDS: [&str; 19] = [
    "hello",
    "open",
    "append",
    "commit",
    "read",
    "truncate",
    "positions",
    "close",
    "map-ring",
    "status",
    "power-fail",
    "power-restore",
    "list-logs",
    "delete-log",
    "history",
    "release-hold",
    "switchover",
    "backup-log",
    "read-log-file",
];

/// The kind of a request (every variant: a new one must be named here).
fn request_kind(body: &RequestBody) -> &'static str {
    match body {
        RequestBody::Hello { .. } => "hello",
        RequestBody::Open { .. } => "open",
        RequestBody::Append { .. } => "append",
        RequestBody::Commit { .. } => "commit",
        RequestBody::Read { .. } => "read",
        RequestBody::Truncate { .. } => "truncate",
        RequestBody::Positions { .. } => "positions",
        RequestBody::Close { .. } => "close",
        RequestBody::MapRing { .. } => "map-ring",
        RequestBody::Status => "status",
        RequestBody::PowerFail => "power-fail",
        RequestBody::PowerRestore => "power-restore",
        RequestBody::ListLogs => "list-logs",
        RequestBody::DeleteLog { .. } => "delete-log",
        RequestBody::History { .. } => "history",
        RequestBody::ReleaseHold { .. } => "release-hold",
        RequestBody::Switchover { .. } => "switchover",
        RequestBody::BackupLog { .. } => "backup-log",
        RequestBody::ReadLogFile { .. } => "read-log-file",
    }
}

/// Every response kind, as [`response_kind`] names them.
const RESPONSE_KINDS: [&str; 20] = [
    "welcome",
    "opened",
    "appended",
    "committed",
    "records",
    "truncated",
    "positions",
    "closed",
    "ring-mapped",
    "status",
    "power-failed",
    "power-restored",
    "logs",
    "deleted",
    "history",
    "error",
    "hold-released",
    "switched-over",
    "backup-files",
    "file-chunk",
];

/// The kind of a response (every variant: a new one must be named here).
fn response_kind(body: &ResponseBody) -> &'static str {
    match body {
        ResponseBody::Welcome { .. } => "welcome",
        ResponseBody::Opened { .. } => "opened",
        ResponseBody::Appended { .. } => "appended",
        ResponseBody::Committed { .. } => "committed",
        ResponseBody::Records { .. } => "records",
        ResponseBody::Truncated { .. } => "truncated",
        ResponseBody::Positions(_) => "positions",
        ResponseBody::Closed => "closed",
        ResponseBody::RingMapped { .. } => "ring-mapped",
        ResponseBody::Status(_) => "status",
        ResponseBody::PowerFailed(_) => "power-failed",
        ResponseBody::PowerRestored => "power-restored",
        ResponseBody::Logs(_) => "logs",
        ResponseBody::Deleted { .. } => "deleted",
        ResponseBody::History { .. } => "history",
        ResponseBody::Error { .. } => "error",
        ResponseBody::HoldReleased { .. } => "hold-released",
        ResponseBody::SwitchedOver { .. } => "switched-over",
        ResponseBody::BackupFiles { .. } => "backup-files",
        ResponseBody::FileChunk { .. } => "file-chunk",
    }
}

fn requests() -> Vec<(&'static str, RequestBody)> {
    vec![
        (
            "hello",
            RequestBody::Hello {
                version: PROTOCOL_VERSION,
                client: "stela-client 0.1.0".into(),
                role: Default::default(),
                token: None,
            },
        ),
        (
            "open",
            RequestBody::Open {
                log: "ledger".into(),
                codec: "msgpack".into(),
                type_tag: "app::Entry".into(),
                create: true,
                durability: None,
                schema: None,
            },
        ),
        (
            "append-buffered",
            RequestBody::Append {
                handle: 0,
                durability: Durability::Buffered,
                records: vec![Payload(b"\x93\x01\x02\xa3abc".to_vec()), Payload(vec![])],
            },
        ),
        (
            "append-disk",
            RequestBody::Append {
                handle: 1,
                durability: Durability::Disk,
                records: vec![Payload(vec![0xff; 40])],
            },
        ),
        (
            "commit",
            RequestBody::Commit {
                handle: 0,
                lsn: 4096,
                durability: Durability::Disk,
            },
        ),
        (
            "read",
            RequestBody::Read {
                handle: 0,
                from: 1,
                max_records: 4096,
                max_bytes: 1 << 20,
            },
        ),
        (
            "truncate",
            RequestBody::Truncate {
                handle: 0,
                before: u64::MAX,
            },
        ),
        ("positions", RequestBody::Positions { handle: 7 }),
        ("close", RequestBody::Close { handle: 0 }),
        ("status", RequestBody::Status),
        ("power-fail", RequestBody::PowerFail),
        ("power-restore", RequestBody::PowerRestore),
        (
            "map-ring",
            RequestBody::MapRing {
                data_bytes: 1 << 20,
            },
        ),
        ("list-logs", RequestBody::ListLogs),
        (
            "delete-log",
            RequestBody::DeleteLog {
                log: "ledger".into(),
            },
        ),
        ("history", RequestBody::History { handle: 0 }),
        (
            "release-hold",
            RequestBody::ReleaseHold {
                log: "ledger".into(),
                holder: "backup-1".into(),
            },
        ),
        (
            "switchover",
            RequestBody::Switchover {
                to: "b".into(),
                within_ms: 5_000,
            },
        ),
        (
            "backup-log",
            RequestBody::BackupLog {
                log: "ledger".into(),
                holder: "backup-1".into(),
                last_in_files: true,
            },
        ),
        (
            "read-log-file",
            RequestBody::ReadLogFile {
                log: "ledger".into(),
                file: "00000000000000000001.seg".into(),
                offset: 4096,
                max_bytes: 1 << 20,
            },
        ),
    ]
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let requests = requests();
    let mut pipelined = Vec::new();
    for (i, (name, body)) in requests.into_iter().enumerate() {
        let bytes = request(i as u64 + 1, body);
        if i < 3 {
            pipelined.extend_from_slice(&bytes);
        }
        out.push((format!("request-{name}"), bytes));
    }
    out.push(("pipelined-hello-open-append".into(), pipelined));
    for (i, (name, body)) in responses().into_iter().enumerate() {
        out.push((
            format!("response-{name}"),
            framed(&Response {
                id: i as u64 + 1,
                body,
            }),
        ));
    }
    out
}

fn responses() -> Vec<(&'static str, ResponseBody)> {
    vec![
        (
            "welcome",
            ResponseBody::Welcome {
                version: PROTOCOL_VERSION,
                server: "stela 0.1.0".into(),
            },
        ),
        (
            "appended",
            ResponseBody::Appended {
                first_lsn: 1,
                last_lsn: 2,
            },
        ),
        (
            "records",
            ResponseBody::Records {
                records: vec![(1, Payload(b"one".to_vec())), (2, Payload(vec![]))],
                next: 3,
                at_end: true,
            },
        ),
        (
            "positions",
            ResponseBody::Positions(Positions {
                first_lsn: 1,
                last_lsn: 9,
                written_lsn: 5,
                durable_lsn: 5,
            }),
        ),
        (
            "power-failed",
            ResponseBody::PowerFailed(EmergencyFlush {
                bytes: 3 << 20,
                micros: 12_000,
                budget_micros: 25_000,
                at_unix_ms: 1_700_000_000_000,
                failures: vec!["l: sync failed".into()],
            }),
        ),
        (
            "status",
            ResponseBody::Status(Box::new(StatusReport {
                server: "stela 0.1.0".into(),
                buffers: 6,
                crash_semantics: vec!["client crash: loses nothing".into()],
                ..StatusReport::default()
            })),
        ),
        (
            "error-bad-frame",
            ResponseBody::Error {
                code: ErrorCode::BadFrame,
                message: "frame checksum mismatch; closing the connection".into(),
            },
        ),
        (
            "status-replication",
            ResponseBody::Status(Box::new(replicated_status())),
        ),
        (
            "opened",
            ResponseBody::Opened {
                handle: 3,
                positions: Positions {
                    first_lsn: 1,
                    last_lsn: 9,
                    written_lsn: 9,
                    durable_lsn: 8,
                },
                max_record_bytes: 1 << 20,
                term: 1 << 32 | 2,
            },
        ),
        ("committed", ResponseBody::Committed { lsn: 4096 }),
        ("truncated", ResponseBody::Truncated { segments: 2 }),
        ("closed", ResponseBody::Closed),
        (
            "ring-mapped",
            ResponseBody::RingMapped {
                data_bytes: 1 << 20,
                slots: 256,
            },
        ),
        ("power-restored", ResponseBody::PowerRestored),
        (
            "logs",
            ResponseBody::Logs(vec![LogListing {
                name: "ledger".into(),
                handles: 1,
                segments: 2,
                bytes_on_disk: 8 << 20,
                first_lsn: 1,
                last_lsn: Some(9),
                state: "open".into(),
                holds: vec![HoldListing {
                    lsn: 3,
                    holder: "backup-1".into(),
                    unreadable: None,
                }],
                durable_lsn: Some(8),
            }]),
        ),
        (
            "deleted",
            ResponseBody::Deleted {
                log: "ledger".into(),
                segments: 2,
                bytes: 8 << 20,
            },
        ),
        (
            "history",
            ResponseBody::History {
                entries: vec![(1, 1), (1 << 32 | 1, 7)],
                last_lsn: 9,
                log_end: Some(9),
            },
        ),
        (
            "hold-released",
            ResponseBody::HoldReleased {
                log: "ledger".into(),
                holder: "backup-1".into(),
                lsn: 3,
            },
        ),
        (
            "switched-over",
            ResponseBody::SwitchedOver {
                epoch: 3,
                to: "b".into(),
            },
        ),
        (
            "backup-files",
            ResponseBody::BackupFiles {
                log: "ledger".into(),
                holder: "backup-1".into(),
                held_from: 1,
                files: vec![LogFile {
                    name: "00000000000000000001.seg".into(),
                    bytes: 4 << 20,
                }],
                last_in_files: Some(9),
            },
        ),
        (
            "file-chunk",
            ResponseBody::FileChunk {
                offset: 4096,
                data: Payload(vec![7; 64]),
                zeros: 512,
                gone: false,
            },
        ),
    ]
}

/// A primary's status with a standby, each session-end field filled.
fn replicated_status() -> StatusReport {
    let end = SessionEndReport {
        kind: "link".into(),
        message: "connect 127.0.0.1:7601: refused".into(),
        ago_ms: 1_500,
    };
    let stream = ReplicaStatus {
        log: "ledger".into(),
        connected: true,
        term: 1,
        received_lsn: 9,
        durable_lsn: 8,
        lag_records: 0,
        lag_ms: 0,
        lag_bytes: 0,
        stopped: None,
        shipped_bytes: 4096,
        wire_bytes: 1024,
        degraded: false,
        degraded_acks: 0,
        degraded_through: 0,
        unprotected_acks: 0,
        stalled: false,
        last_ack_ms: 20,
        last_end: Some(end.clone()),
    };
    StatusReport {
        server: "stela 0.1.0".into(),
        replication: Some(ReplicationStatus {
            role: "primary".into(),
            peer: "127.0.0.1:7601".into(),
            logs: vec![stream],
            epoch: 0,
            coordinator: None,
            last_failover: None,
            unprotected_since_ms: 0,
            standbys: Vec::new(),
            replicas: 1,
            session_ends: [("link".to_owned(), 1), ("fenced".to_owned(), 0)].into(),
            ended_streams: vec![EndedStream {
                log: "orders".into(),
                end,
            }],
        }),
        ..StatusReport::default()
    }
}

#[test]
fn protocol_decode_seeds_are_the_encoders_output() {
    let total = stela_fuzz::check_or_write_target_seeds("protocol_decode", seeds());
    assert!(total < 16 << 10, "the protocol seeds are {total} bytes");
}

#[test]
fn every_request_and_response_kind_has_a_seed() {
    let requests: BTreeSet<&str> = requests().iter().map(|(_, b)| request_kind(b)).collect();
    let responses: BTreeSet<&str> = responses().iter().map(|(_, b)| response_kind(b)).collect();
    assert_eq!(requests, REQUEST_KINDS.into_iter().collect());
    assert_eq!(responses, RESPONSE_KINDS.into_iter().collect());
}
