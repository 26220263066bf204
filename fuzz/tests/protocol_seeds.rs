//! Checks (or, with `STELA_WRITE_SEEDS=1`, rewrites) the seeds of the `protocol_decode` target in
//! `fuzz/seeds/protocol_decode/`: one valid frame of every request kind, a pipelined stream of
//! several, and a few responses (the target reads every input both ways).
//!
//! `cargo test` inside `fuzz/` (with `RUSTC_BOOTSTRAP=1`, like every command here).

use stela_proto::frame;
use stela_proto::{
    Durability, EmergencyFlush, ErrorCode, Payload, Positions, Request, RequestBody, Response,
    ResponseBody, StatusReport, PROTOCOL_VERSION,
};

fn framed<M: serde::Serialize>(message: &M) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode(message, &mut out).expect("seed encodes");
    out
}

fn request(id: u64, body: RequestBody) -> Vec<u8> {
    framed(&Request { id, body })
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let requests: Vec<(&str, RequestBody)> = vec![
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
    ];
    let mut out = Vec::new();
    let mut pipelined = Vec::new();
    for (i, (name, body)) in requests.into_iter().enumerate() {
        let bytes = request(i as u64 + 1, body);
        if i < 3 {
            pipelined.extend_from_slice(&bytes);
        }
        out.push((format!("request-{name}"), bytes));
    }
    out.push(("pipelined-hello-open-append".into(), pipelined));

    let responses = vec![
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
    ];
    for (i, (name, body)) in responses.into_iter().enumerate() {
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

#[test]
fn protocol_decode_seeds_are_the_encoders_output() {
    let total = stela_fuzz::check_or_write_target_seeds("protocol_decode", seeds());
    assert!(total < 16 << 10, "the protocol seeds are {total} bytes");
}
