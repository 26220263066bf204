//! Every message survives encode/decode; every damaged frame is refused, never misread.

use proptest::prelude::*;
use stela_proto::frame::{self, FrameError};
use stela_proto::*;

fn durability() -> impl Strategy<Value = Durability> {
    prop_oneof![
        Just(Durability::Unsafe),
        Just(Durability::Buffered),
        Just(Durability::Disk),
        Just(Durability::Replicated),
        Just(Durability::All),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    let body = prop_oneof![
        (any::<u32>(), ".{0,20}", any::<bool>()).prop_map(|(version, client, admin)| {
            RequestBody::Hello {
                version,
                client,
                role: if admin { Role::Admin } else { Role::Client },
                token: None,
            }
        }),
        any::<u32>().prop_map(|data_bytes| RequestBody::MapRing { data_bytes }),
        any::<u32>().prop_map(|handle| RequestBody::Close { handle }),
        (".{0,20}", ".{0,8}", ".{0,20}", any::<bool>()).prop_map(
            |(log, codec, type_tag, create)| {
                RequestBody::Open {
                    log,
                    codec,
                    type_tag,
                    create,
                    durability: None,
                    schema: None,
                }
            }
        ),
        (
            any::<u32>(),
            durability(),
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..8)
        )
            .prop_map(|(handle, durability, records)| RequestBody::Append {
                handle,
                durability,
                records: records.into_iter().map(Payload).collect(),
            }),
        (any::<u32>(), any::<u64>(), durability()).prop_map(|(handle, lsn, durability)| {
            RequestBody::Commit {
                handle,
                lsn,
                durability,
            }
        }),
        (any::<u32>(), any::<u64>(), any::<u32>(), any::<u32>()).prop_map(
            |(handle, from, max_records, max_bytes)| RequestBody::Read {
                handle,
                from,
                max_records,
                max_bytes
            }
        ),
        Just(RequestBody::Status),
        Just(RequestBody::PowerFail),
    ];
    (any::<u64>(), body).prop_map(|(id, body)| Request { id, body })
}

proptest! {
    #[test]
    fn requests_round_trip(requests in prop::collection::vec(request(), 1..6)) {
        let mut wire = Vec::new();
        for r in &requests {
            frame::encode(r, &mut wire).unwrap();
        }
        let mut at = 0;
        for r in &requests {
            let (decoded, used) = frame::decode_from::<Request>(&wire[at..], MAX_FRAME_BYTES).unwrap().unwrap();
            prop_assert_eq!(&decoded, r);
            at += used;
        }
        prop_assert_eq!(at, wire.len());
    }

    #[test]
    fn a_flipped_bit_is_refused(r in request(), bit in any::<prop::sample::Index>()) {
        let mut wire = Vec::new();
        frame::encode(&r, &mut wire).unwrap();
        let bit = bit.index(wire.len() * 8);
        wire[bit / 8] ^= 1 << (bit % 8);
        match frame::decode_from::<Request>(&wire, MAX_FRAME_BYTES) {
            // A flip in the length can make the frame look incomplete or too large.
            Ok(None) | Err(_) => {}
            Ok(Some((decoded, _))) => prop_assert!(false, "flipped bit {} decoded as {:?}", bit, decoded),
        }
    }

    #[test]
    fn every_prefix_is_incomplete(r in request()) {
        let mut wire = Vec::new();
        frame::encode(&r, &mut wire).unwrap();
        for cut in 0..wire.len() {
            prop_assert!(frame::decode_from::<Request>(&wire[..cut], MAX_FRAME_BYTES).unwrap().is_none());
        }
    }
}

#[test]
fn a_hostile_length_is_refused_before_any_allocation() {
    let mut wire = vec![0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0];
    wire.extend_from_slice(b"x");
    match frame::decode_from::<Request>(&wire, 1 << 20) {
        Err(FrameError::TooLarge { len, limit }) => {
            assert_eq!(limit, 1 << 20);
            assert!(len > limit);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[test]
fn a_valid_frame_holding_the_wrong_message_is_a_clear_error() {
    let mut wire = Vec::new();
    frame::encode(
        &Response {
            id: 1,
            body: ResponseBody::Closed,
        },
        &mut wire,
    )
    .unwrap();
    let error = frame::decode_from::<Request>(&wire, MAX_FRAME_BYTES).unwrap_err();
    assert!(matches!(error, FrameError::BadMessage(_)), "{error}");
}

/// A revision-1 client's Hello has no role: it must still decode (as a client), so the daemon
/// can answer `UnsupportedVersion` instead of calling the frame bad.
#[test]
fn a_hello_without_a_role_decodes_as_a_client() {
    #[derive(serde::Serialize)]
    enum OldBody {
        Hello { version: u32, client: String },
    }
    #[derive(serde::Serialize)]
    struct OldRequest {
        id: u64,
        body: OldBody,
    }
    let mut wire = Vec::new();
    frame::encode(
        &OldRequest {
            id: 7,
            body: OldBody::Hello {
                version: 1,
                client: "old".into(),
            },
        },
        &mut wire,
    )
    .unwrap();
    let (request, _) = frame::decode_from::<Request>(&wire, MAX_FRAME_BYTES)
        .unwrap()
        .unwrap();
    assert_eq!(
        request.body,
        RequestBody::Hello {
            version: 1,
            client: "old".into(),
            role: Role::Client,
            token: None,
        }
    );
}

/// A status from a daemon that predates the session ends (`last_end`, `session_ends`,
/// `ended_streams`) still decodes, with none of them.
#[test]
fn a_replication_status_without_session_ends_decodes_with_none() {
    #[derive(serde::Serialize)]
    struct OldReplica {
        log: String,
        connected: bool,
        term: u64,
        received_lsn: u64,
        durable_lsn: u64,
        lag_records: u64,
        lag_ms: u64,
        lag_bytes: u64,
        stopped: Option<String>,
        shipped_bytes: u64,
        wire_bytes: u64,
        degraded: bool,
        degraded_acks: u64,
        degraded_through: u64,
        unprotected_acks: u64,
        stalled: bool,
        last_ack_ms: u64,
    }
    #[derive(serde::Serialize)]
    struct OldReplication {
        role: String,
        peer: String,
        logs: Vec<OldReplica>,
        epoch: u64,
        coordinator: Option<()>,
        last_failover: Option<()>,
        unprotected_since_ms: u64,
        standbys: Vec<()>,
        replicas: u32,
    }
    let old = OldReplication {
        role: "primary".into(),
        peer: "127.0.0.1:7000".into(),
        logs: vec![OldReplica {
            log: "ledger".into(),
            connected: true,
            term: 1,
            received_lsn: 9,
            durable_lsn: 9,
            lag_records: 0,
            lag_ms: 0,
            lag_bytes: 0,
            stopped: None,
            shipped_bytes: 0,
            wire_bytes: 0,
            degraded: false,
            degraded_acks: 0,
            degraded_through: 0,
            unprotected_acks: 0,
            stalled: false,
            last_ack_ms: 3,
        }],
        epoch: 2,
        coordinator: None,
        last_failover: None,
        unprotected_since_ms: 0,
        standbys: Vec::new(),
        replicas: 1,
    };
    let mut wire = Vec::new();
    frame::encode(&old, &mut wire).unwrap();
    let (status, _) = frame::decode_from::<ReplicationStatus>(&wire, MAX_FRAME_BYTES)
        .unwrap()
        .unwrap();
    assert_eq!((status.epoch, status.logs[0].last_ack_ms), (2, 3));
    assert_eq!(status.logs[0].last_end, None);
    assert!(status.session_ends.is_empty() && status.ended_streams.is_empty());
}
