//! Why each replication session ended, as an operator reads it (issue 56: one enum of ends that
//! the status and the metrics use): `stela status --json` gives each log's last end (its kind,
//! its message, how long ago) and the count of ends by kind; `/metrics` gives that count as
//! `stela_replication_session_ends_total{kind}`. Two different ends are provoked on a primary
//! `stela serve --standby` and a standby `stela serve --repl-listen` on loopback:
//! - a stale term: a peer the standby trusts (the daemon's own user on loopback) opens `orders`
//!   at term 1000 first, so the real primary's stream of `orders` is refused as stale: both
//!   sides say `fenced`;
//! - the standby SIGKILLed: the primary's stream of `ledger` ends with `link`.

mod common;

use common::cluster::{free_addr, wait_for};
use common::Daemon;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;
use stela_client::{Address, Connection};
use stela_proto::repl::ReplMessage;
use stela_proto::{Durability, Payload, RequestBody, ResponseBody};
use stela_wal::Codec;

const TYPE_TAG: &str = "session_ends::Rec";

/// The address `stela serve --metrics 127.0.0.1:0` printed.
fn metrics_addr(daemon: &Daemon) -> String {
    let output = daemon.output();
    output
        .lines()
        .find_map(|l| l.strip_prefix("stela serve: metrics on http://"))
        .and_then(|l| l.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address in:\n{output}"))
        .to_owned()
}

/// `stela_replication_session_ends_total{kind="KIND"}` in a scrape of `addr` (0 if absent).
fn ends_counted(addr: &str, kind: &str) -> u64 {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut scrape = String::new();
    stream.read_to_string(&mut scrape).unwrap();
    let name = format!("stela_replication_session_ends_total{{kind=\"{kind}\"}} ");
    let value = scrape.lines().find_map(|l| l.strip_prefix(&name));
    value.map_or(0, |v| v.trim().parse().unwrap())
}

/// The replication section of `stela status --json` on the daemon in `dir`, as the CLI prints
/// it (the protocol's field names).
fn status_json(dir: &Path) -> serde_json::Value {
    let shown = common::stela(&["status", "--dir", dir.to_str().unwrap(), "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", common::text(&shown)));
    json["replication"].clone()
}

/// `log`'s last end in a primary's status (`logs`) or a standby's (`ended_streams`).
fn last_end(replication: &serde_json::Value, log: &str) -> Option<serde_json::Value> {
    let up = replication["logs"].as_array().into_iter().flatten();
    let from_up = up
        .filter(|l| l["log"] == log)
        .map(|l| l["last_end"].clone());
    let ended = replication["ended_streams"]
        .as_array()
        .into_iter()
        .flatten();
    let from_ended = ended.filter(|l| l["log"] == log).map(|l| l["end"].clone());
    from_up.chain(from_ended).find(|end| !end.is_null())
}

/// Opens `orders` on the standby at a term above the primary's, as a primary of the standby's
/// own user would, and closes the stream once the standby answered.
fn open_at_a_newer_term(repl: &str, log: &str, term: u64) {
    let mut frame = Vec::new();
    let open = ReplMessage::Open {
        term,
        node: "earlier-primary".into(),
        log: log.into(),
        codec: "msgpack".into(),
        type_tag: TYPE_TAG.into(),
        token: None,
        history: vec![(term, 1)],
    };
    stela_proto::frame::encode(&open, &mut frame).unwrap();
    let mut socket = TcpStream::connect(repl).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    socket.write_all(&frame).unwrap();
    let mut header = [0u8; stela_proto::FRAME_HEADER_BYTES];
    socket.read_exact(&mut header).unwrap();
    let parsed = stela_proto::frame::parse_header(header, 1 << 20).unwrap();
    let mut body = vec![0u8; parsed.body_len];
    socket.read_exact(&mut body).unwrap();
    let answer: ReplMessage = stela_proto::frame::decode_body(parsed, &body).unwrap();
    assert!(
        matches!(answer, ReplMessage::Position { .. }),
        "the standby did not take the stream: {answer:?}"
    );
}

fn open(connection: &mut Connection, log: &str) -> u32 {
    match connection.request(RequestBody::Open {
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

/// The primary's status says `kind` for `log`, with a message and a recent time.
fn primary_says(dir: &Path, log: &str, kind: &str) -> bool {
    let replication = status_json(dir);
    last_end(&replication, log).is_some_and(|end| end["kind"] == kind)
}

#[test]
fn a_stale_term_and_a_killed_standby_each_show_their_kind_of_end() {
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (root.path().join("primary"), root.path().join("standby"));
    let repl = free_addr();
    let metrics = ["--metrics", "127.0.0.1:0"];
    let standby = Daemon::start(&s_dir, &[&["--repl-listen", &repl][..], &metrics].concat());
    open_at_a_newer_term(&repl, "orders", 1000);
    let primary = Daemon::start(&p_dir, &[&["--standby", &repl][..], &metrics].concat());
    let (p_metrics, s_metrics) = (metrics_addr(&primary), metrics_addr(&standby));

    let mut client = Connection::connect_admin(&Address::Unix(primary.socket())).unwrap();
    let ledger = open(&mut client, "ledger");
    let record = Payload(Codec::MessagePack.encode(&(1u32, "first")).unwrap());
    let appended = client.request(RequestBody::Append {
        handle: ledger,
        durability: Durability::Replicated,
        records: vec![record],
    });
    assert!(
        matches!(appended, Ok(ResponseBody::Appended { .. })),
        "{appended:?}"
    );
    open(&mut client, "orders");

    // The stale term: the primary's `orders` stream is refused and the log fenced.
    let within = Duration::from_secs(20);
    wait_for("the primary to show orders fenced", within, || {
        primary_says(&p_dir, "orders", "fenced")
    });
    let on_primary = status_json(&p_dir);
    let end = last_end(&on_primary, "orders").unwrap();
    let message = end["message"].as_str().unwrap();
    assert!(message.contains("term 1000"), "{on_primary}");
    assert!(end["ago_ms"].as_u64().unwrap() < 60_000, "{on_primary}");
    assert!(on_primary["session_ends"]["fenced"].as_u64() >= Some(1));
    assert!(ends_counted(&p_metrics, "fenced") >= 1);
    // The standby's side of the same end: its stream of `orders` is down, ended as fenced.
    let on_standby = status_json(&s_dir);
    let end = last_end(&on_standby, "orders").unwrap_or_else(|| panic!("{on_standby}"));
    assert_eq!(end["kind"], "fenced", "{on_standby}");
    assert!(end["message"].as_str().unwrap().contains("stale term"));
    assert!(on_standby["session_ends"]["fenced"].as_u64() >= Some(1));
    assert!(ends_counted(&s_metrics, "fenced") >= 1);
    let human = common::text(&common::stela(&[
        "status",
        "--dir",
        s_dir.to_str().unwrap(),
    ]));
    assert!(human.contains("ended: FENCED"), "{human}");
    assert_eq!(ends_counted(&p_metrics, "link"), 0, "no link broke yet");

    // The standby killed: the `ledger` stream breaks.
    standby.kill();
    wait_for("the primary to show ledger's link end", within, || {
        primary_says(&p_dir, "ledger", "link")
    });
    let on_primary = status_json(&p_dir);
    let end = last_end(&on_primary, "ledger").unwrap();
    assert!(!end["message"].as_str().unwrap().is_empty(), "{on_primary}");
    assert!(on_primary["session_ends"]["link"].as_u64() >= Some(1));
    assert!(ends_counted(&p_metrics, "link") >= 1);
    let human = common::text(&common::stela(&[
        "status",
        "--dir",
        p_dir.to_str().unwrap(),
    ]));
    assert!(human.contains("last session: LINK"), "{human}");
    assert!(human.contains("last session: FENCED"), "{human}");
    drop(client);
    primary.terminate();
}
