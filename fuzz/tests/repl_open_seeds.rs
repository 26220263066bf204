//! Checks (or, with `STELA_WRITE_SEEDS=1`, rewrites) the seeds of the `repl_open` target in
//! `fuzz/seeds/repl_open/`: what a peer sends a standby's replication port first, each input a
//! piece-size byte and the bytes: a primary's `Open` (small, and with a token and a long term
//! history, in 1-byte and in large pieces), its proper prefix, another message first, a header
//! announcing more than the door's bound, and a damaged body. Each is also run through the
//! door's reader here, so the seeds say what the door decides.
//!
//! `cargo test` inside `fuzz/` (with `RUSTC_BOOTSTRAP=1`, like every command here).

use stela_proto::frame;
use stela_proto::repl::ReplMessage;
use stela_server::replication::standby::{whole_open, MAX_OPEN_BYTES};

fn framed(message: &ReplMessage) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode(message, &mut out).expect("seed encodes");
    out
}

fn open(token: Option<&str>, terms: u64) -> ReplMessage {
    ReplMessage::Open {
        term: 1 << 32 | terms,
        node: "a".into(),
        log: "ledger".into(),
        codec: "msgpack".into(),
        type_tag: "app::Entry".into(),
        token: token.map(str::to_owned),
        history: (1..=terms).map(|t| (1 << 32 | t, t * 100)).collect(),
    }
}

/// `(name, piece-size byte + the peer's bytes)`.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let with_piece = |piece: u8, bytes: &[u8]| [&[piece][..], bytes].concat();
    let small = framed(&open(None, 1));
    let long = framed(&open(Some("replication-admin-0123456789"), 200));
    let mut over = small.clone();
    over[..4].copy_from_slice(&(MAX_OPEN_BYTES as u32 + 1).to_le_bytes());
    let mut damaged = small.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 0x40;
    vec![
        ("open-whole", with_piece(255, &small)),
        ("open-byte-by-byte", with_piece(0, &small)),
        ("open-token-long-history", with_piece(3, &long)),
        ("open-prefix", with_piece(1, &small[..small.len() - 3])),
        (
            "heartbeat-first",
            with_piece(255, &framed(&ReplMessage::Heartbeat { term: 1 })),
        ),
        ("header-over-the-bound", with_piece(255, &over)),
        ("damaged-body", with_piece(255, &damaged)),
    ]
}

#[test]
fn repl_open_seeds_are_the_encoders_output_and_the_door_decides_them() {
    let decided: Vec<(&str, String)> = seeds()
        .iter()
        .map(|(name, input)| {
            let said = match whole_open(&input[1..]) {
                Ok(Some(_)) => "open".to_owned(),
                Ok(None) => "wait".to_owned(),
                Err(refused) => refused.kind().to_owned(),
            };
            (*name, said)
        })
        .collect();
    let expected = [
        ("open-whole", "open"),
        ("open-byte-by-byte", "open"),
        ("open-token-long-history", "open"),
        ("open-prefix", "wait"),
        ("heartbeat-first", "protocol"),
        ("header-over-the-bound", "protocol"),
        ("damaged-body", "protocol"),
    ];
    let expected: Vec<(&str, String)> = expected.iter().map(|(n, s)| (*n, s.to_string())).collect();
    assert_eq!(decided, expected);
    let total = stela_fuzz::check_or_write_target_seeds("repl_open", seeds());
    assert!(total < 16 << 10, "the repl_open seeds are {total} bytes");
}
