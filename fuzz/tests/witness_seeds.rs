//! Checks (or, with `STELA_WRITE_SEEDS=1`, rewrites) the seeds of the `witness_decode` target in
//! `fuzz/seeds/witness_decode/`: one valid frame of every request and answer.
//!
//! `cargo test` inside `fuzz/` (with `RUSTC_BOOTSTRAP=1`, like every command here).

use stela_proto::frame;
use stela_proto::witness::{WitnessRequest, WitnessResponse};

fn framed<M: serde::Serialize>(message: &M) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode(message, &mut out).expect("seed encodes");
    out
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let cluster = || "stela".to_owned();
    vec![
        (
            "renew",
            framed(&WitnessRequest::Renew {
                cluster: cluster(),
                node: "a".into(),
                epoch: 1,
            }),
        ),
        (
            "promote",
            framed(&WitnessRequest::Promote {
                cluster: cluster(),
                node: "b".into(),
                seen_epoch: 1,
            }),
        ),
        (
            "current",
            framed(&WitnessRequest::Current { cluster: cluster() }),
        ),
        ("renewed", framed(&WitnessResponse::Renewed { epoch: 1 })),
        (
            "superseded",
            framed(&WitnessResponse::Superseded {
                epoch: 2,
                holder: "b".into(),
            }),
        ),
        ("granted", framed(&WitnessResponse::Granted { epoch: 2 })),
        (
            "refused",
            framed(&WitnessResponse::Refused {
                epoch: 1,
                holder: Some("a".into()),
                reason: "the primary renewed 20 ms ago".into(),
            }),
        ),
        (
            "holder",
            framed(&WitnessResponse::Current {
                epoch: 2,
                holder: Some("b".into()),
            }),
        ),
        (
            "error",
            framed(&WitnessResponse::Error {
                message: "cannot write".into(),
            }),
        ),
    ]
}

#[test]
fn witness_decode_seeds_are_the_encoders_output() {
    stela_fuzz::check_or_write_target_seeds("witness_decode", seeds());
}
