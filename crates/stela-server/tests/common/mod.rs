//! Shared by the daemon's integration tests (`power.rs`, `backpressure.rs`): a minimal client
//! speaking the wire protocol with stela-proto (stela-client is not a dependency of this crate),
//! the records the tests write, and the embedded read-back of a log directory.
#![allow(dead_code)] // each test binary uses its own part

use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use stela_proto::frame::{self, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
use stela_proto::{
    Durability, ErrorCode, Payload, Positions, Request, RequestBody, Response, ResponseBody,
    PROTOCOL_VERSION,
};
use stela_server::Server;
use stela_wal::storage::Storage;
use stela_wal::{Codec, Wal, WalOptions};

/// A daemon that a panicking test leaks instead of shutting down: shutdown waits until every
/// buffer is written, which a broken daemon may never do, and a failing test must fail, not hang.
pub struct NoHang(Option<Server>);

impl NoHang {
    pub fn new(server: Server) -> NoHang {
        NoHang(Some(server))
    }

    pub fn shutdown(mut self) -> Result<(), stela_server::ShutdownError> {
        self.0.take().expect("running").shutdown()
    }
}

impl std::ops::Deref for NoHang {
    type Target = Server;

    fn deref(&self) -> &Server {
        self.0.as_ref().expect("running")
    }
}

impl Drop for NoHang {
    fn drop(&mut self) {
        if let Some(server) = self.0.take() {
            if std::thread::panicking() {
                std::mem::forget(server);
            }
        }
    }
}

/// The record every test writes: (writer, seq, filler derived from both).
pub type Rec = (u32, u64, String);

pub const TYPE_TAG: &str = "stela_server_tests::Rec";

pub fn rec(writer: u32, seq: u64, len: usize) -> Rec {
    let filler: String = (0..len)
        .map(|i| char::from(b'a' + ((writer as u64 * 7 + seq * 13 + i as u64) % 26) as u8))
        .collect();
    (writer, seq, filler)
}

pub fn encode(record: &Rec) -> Vec<u8> {
    Codec::MessagePack.encode(record).expect("a record encodes")
}

/// An error answer from the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub code: ErrorCode,
    pub message: String,
}

/// One handshaken connection.
pub struct RawClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
}

impl RawClient {
    pub fn connect(socket: &Path) -> RawClient {
        let stream = UnixStream::connect(socket).expect("connect to the daemon");
        let mut client = RawClient {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
            next_id: 1,
        };
        match client.request(RequestBody::Hello {
            version: PROTOCOL_VERSION,
            client: "stela-server tests".into(),
            role: stela_proto::Role::Client,
            token: None,
        }) {
            Ok(ResponseBody::Welcome { .. }) => client,
            other => panic!("hello answered with {other:?}"),
        }
    }

    pub fn request(&mut self, body: RequestBody) -> Result<ResponseBody, Refused> {
        let id = self.next_id;
        self.next_id += 1;
        let mut out = Vec::new();
        frame::encode(&Request { id, body }, &mut out).unwrap();
        self.writer.write_all(&out).expect("send a request");
        let mut header = [0u8; FRAME_HEADER_BYTES];
        self.reader.read_exact(&mut header).expect("read an answer");
        let header = frame::parse_header(header, MAX_FRAME_BYTES).unwrap();
        let mut body = vec![0u8; header.body_len];
        self.reader.read_exact(&mut body).expect("read an answer");
        let response: Response = frame::decode_body(header, &body).expect("a valid answer");
        assert_eq!(response.id, id, "answer to another request: {response:?}");
        match response.body {
            ResponseBody::Error { code, message } => Err(Refused { code, message }),
            other => Ok(other),
        }
    }

    /// Opens (creating) `log` with MessagePack and [`TYPE_TAG`]; returns the handle.
    pub fn open(&mut self, log: &str) -> u32 {
        match self.request(RequestBody::Open {
            log: log.into(),
            codec: "msgpack".into(),
            type_tag: TYPE_TAG.into(),
            create: true,
            durability: None,
            schema: None,
        }) {
            Ok(ResponseBody::Opened { handle, .. }) => handle,
            other => panic!("open {log}: {other:?}"),
        }
    }

    pub fn append(
        &mut self,
        handle: u32,
        durability: Durability,
        records: &[Rec],
    ) -> Result<(u64, u64), Refused> {
        let records = records.iter().map(|r| Payload(encode(r))).collect();
        match self.request(RequestBody::Append {
            handle,
            durability,
            records,
        })? {
            ResponseBody::Appended {
                first_lsn,
                last_lsn,
            } => Ok((first_lsn, last_lsn)),
            other => panic!("append answered with {other:?}"),
        }
    }

    pub fn commit(&mut self, handle: u32, lsn: u64, durability: Durability) -> Result<(), Refused> {
        self.request(RequestBody::Commit {
            handle,
            lsn,
            durability,
        })
        .map(|_| ())
    }

    pub fn positions(&mut self, handle: u32) -> Positions {
        match self.request(RequestBody::Positions { handle }) {
            Ok(ResponseBody::Positions(p)) => p,
            other => panic!("positions: {other:?}"),
        }
    }
}

/// Every record of the log directory `dir`, read embedded (the daemon must be stopped), in LSN
/// order, checking that the LSNs run from 1 without a gap.
pub fn read_back(dir: &Path, storage: Arc<dyn Storage>) -> Vec<Rec> {
    let (first, records) = read_back_from_first(dir, storage);
    assert_eq!(first, 1, "LSNs are not contiguous from 1");
    records
}

/// The first LSN of the log directory `dir` and every record from it on (a truncated log's),
/// checking that the LSNs run without a gap.
pub fn read_back_from_first(dir: &Path, storage: Arc<dyn Storage>) -> (u64, Vec<Rec>) {
    let wal: Wal<Rec> = Wal::open(
        dir,
        WalOptions::default()
            .codec(Codec::MessagePack)
            .type_tag(TYPE_TAG)
            .create_if_missing(false)
            .storage(storage),
    )
    .unwrap_or_else(|e| panic!("embedded open of {}: {e}", dir.display()));
    let mut out = Vec::new();
    let mut first = 1;
    for item in wal.iter().unwrap() {
        let (lsn, record) = item.unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        if out.is_empty() {
            first = lsn.get();
        }
        assert_eq!(
            lsn.get(),
            first + out.len() as u64,
            "LSNs are not contiguous"
        );
        out.push(record);
    }
    (first, out)
}

/// Checks the read-back log against acknowledgements `(first_lsn, records)`: every acknowledged
/// record is at its LSN; with `exact`, the log holds nothing else.
pub fn check_acked(log: &[Rec], acked: &[(u64, Vec<Rec>)], exact: bool) {
    let mut count = 0;
    for (first, records) in acked {
        for (i, record) in records.iter().enumerate() {
            let lsn = first + i as u64;
            let found = log.get(lsn as usize - 1);
            assert_eq!(
                found,
                Some(record),
                "acknowledged LSN {lsn} ({}, {}) is missing or different",
                record.0,
                record.1
            );
            count += 1;
        }
    }
    if exact {
        assert_eq!(
            log.len(),
            count,
            "the log holds records nobody had acknowledged"
        );
    }
}
