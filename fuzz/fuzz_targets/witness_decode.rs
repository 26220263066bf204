//! Arbitrary bytes read as the witness protocol (`stela_proto::witness`): frames decoded as
//! requests (what the witness reads) and as answers (what a node reads), one after the other,
//! under the witness's small frame limit.
//!
//! Oracles: never panics, never allocates past the limit; a decoded message re-encodes to a
//! frame that decodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_proto::frame;
use stela_proto::witness::{WitnessRequest, WitnessResponse, MAX_WITNESS_FRAME_BYTES};

fn round_trip<M>(data: &[u8])
where
    M: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let mut at = 0;
    while let Ok(Some((message, used))) =
        frame::decode_from::<M>(&data[at..], MAX_WITNESS_FRAME_BYTES)
    {
        at += used;
        let mut again = Vec::new();
        frame::encode(&message, &mut again).expect("a decoded message encodes");
        let (back, _) = frame::decode_from::<M>(&again, usize::MAX)
            .expect("re-encoded frame decodes")
            .expect("whole");
        assert_eq!(back, message);
    }
}

fuzz_target!(|data: &[u8]| {
    round_trip::<WitnessRequest>(data);
    round_trip::<WitnessResponse>(data);
});
