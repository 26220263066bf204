//! A client that pipelines requests whose answers exceed what the daemon buffers for one
//! connection, and reads nothing for a while: the daemon stops handling its requests at the
//! cap, and must take them up again once the answers are out (no new bytes arrive to prompt
//! it). Every answer arrives, in order. The same over TLS is in stela-cli's tests/security.rs.

mod common;

use common::{NoHang, RawClient};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;
use stela_proto::frame::{self, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
use stela_proto::{Durability, Request, RequestBody, Response, ResponseBody};
use stela_server::{DaemonConfig, Server};

#[test]
fn pipelined_reads_past_the_output_cap_are_all_answered() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DaemonConfig::new(dir.path());
    config.assume_write_rate = Some(500_000_000);
    let server = NoHang::new(Server::start(config).unwrap());
    let mut client = RawClient::connect(server.socket_path());
    let handle = client.open("big");
    // 8 MiB of records, appended in batches under the dirty cap.
    for batch in 0..16u64 {
        let records: Vec<_> = (0..8)
            .map(|i| common::rec(1, batch * 8 + i, 64 << 10))
            .collect();
        let (_, last) = client.append(handle, Durability::Disk, &records).unwrap();
        assert_eq!(last, (batch + 1) * 8);
    }
    drop(client);

    let mut stream = UnixStream::connect(server.socket_path()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    const READS: u64 = 6;
    let mut bodies = vec![
        RequestBody::Hello {
            version: stela_proto::PROTOCOL_VERSION,
            client: "slow reader".into(),
            role: stela_proto::Role::Client,
            token: None,
        },
        RequestBody::Open {
            log: "big".into(),
            codec: "msgpack".into(),
            type_tag: common::TYPE_TAG.into(),
            create: false,
            durability: None,
            schema: None,
        },
    ];
    bodies.extend((0..READS).map(|_| RequestBody::Read {
        handle: 0,
        from: 1,
        max_records: 1 << 20,
        max_bytes: 16 << 20,
    }));
    let mut out = Vec::new();
    for (id, body) in bodies.into_iter().enumerate() {
        frame::encode(
            &Request {
                id: id as u64 + 1,
                body,
            },
            &mut out,
        )
        .unwrap();
    }
    stream.write_all(&out).unwrap();
    // Nothing read meanwhile: the daemon fills the socket and reaches its output cap.
    std::thread::sleep(Duration::from_millis(300));
    for id in 1..=2 + READS {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        stream
            .read_exact(&mut header)
            .unwrap_or_else(|e| panic!("answer {id}: {e}"));
        let header = frame::parse_header(header, MAX_FRAME_BYTES).unwrap();
        let mut body = vec![0u8; header.body_len];
        stream.read_exact(&mut body).unwrap();
        let response: Response = frame::decode_body(header, &body).unwrap();
        assert_eq!(response.id, id);
        if id > 2 {
            match response.body {
                // A read answers with as many records as fit in 1 MiB (these are a little
                // over 64 KiB each once encoded).
                ResponseBody::Records { records, .. } => {
                    let each = records[0].1 .0.len();
                    assert_eq!(records.len(), (1 << 20) / each, "{each}-byte records");
                }
                other => panic!("answer {id}: {other:?}"),
            }
        }
    }
    server.shutdown().unwrap();
}
